"""`swarm keys ...` and `swarm ledger ...`: a person's (and a program's) window on a node's state.

Thin commands: they open the key or the ledger (read-only), call one query and render it as a
rich table, or as JSON with `--json`. They never write to a ledger, and a user's mistake is a
one-line error (a SwarmError), never a traceback.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import textwrap
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from node import identity as ident
from node.claim_view import claim_view
from node.cli import app
from node.cli.shared import HomeOption, JsonOption, console
from node.errors import SwarmError
from node.home import resolve_home
from node.ledger import Ledger, LedgerError, ledger_path
from node.readable import bpb as _bpb
from node.readable import peer as _peer
from node.readable import when as _when
from node.safe_text import safe_text

WIDE = 120  # columns from which experiments and peers are tables; narrower: a record per row

keys_app = typer.Typer(
    help="This node's identity: its Ed25519 key and peer id.", no_args_is_help=True
)
ledger_app = typer.Typer(
    help="Inspect the ledger: the signed facts this node holds.", no_args_is_help=True
)
app.add_typer(keys_app, name="keys")
app.add_typer(ledger_app, name="ledger")

DbOption = Annotated[
    Path | None,
    typer.Option("--db", help="A ledger file to read instead of HOME/ledger.db."),
]


# ---------------------------------------------------------------- rendering helpers


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {(k.hex() if isinstance(k, bytes) else k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    return value


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(_jsonable(value), indent=2, sort_keys=True) + "\n")


def _short(sha: str | None) -> str:
    return (sha or "-")[:12]


def _open(home: Path | None, db: Path | None) -> Ledger:
    path = db if db is not None else ledger_path(resolve_home(home, create=False))
    if not path.exists():
        hint = "" if db is not None else " (no facts yet: run a node, or pass --db)"
        raise LedgerError(f"no ledger at {path}{hint}")
    return Ledger(path, readonly=True)


# ---------------------------------------------------------------- swarm keys


@keys_app.command("show")
def keys_show(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Print this node's peer id and public key (the key is created on first use).

    Example: swarm keys show --home ~/.research-swarm
    """
    home_dir = resolve_home(home)
    created = not ident.key_path(home_dir).exists()
    me = ident.load_identity(home_dir)
    info = {
        "peer_id": me.peer_id,
        "public_key": me.public_key.hex(),
        "key_file": str(ident.key_path(home_dir)),
        "created": created,
    }
    if as_json:
        _print_json(info)
        return
    if created:
        console.print(f"new key written to {info['key_file']}", highlight=False)
    console.print(f"peer id     {info['peer_id']}", highlight=False)
    console.print(f"public key  {info['public_key']}", highlight=False)


@keys_app.command("new")
def keys_new(
    home: HomeOption = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing key.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Create a new key; refuses to replace an existing one unless --force.

    Replacing the key gives this node a new peer id: peers will not connect it with the facts
    the old key signed. Example: swarm keys new --home /tmp/node2
    """
    home_dir = resolve_home(home)
    me = ident.new_identity(home_dir, force=force)
    if as_json:
        _print_json({"peer_id": me.peer_id, "public_key": me.public_key.hex()})
    else:
        console.print(f"peer id     {me.peer_id}", highlight=False)
        console.print(f"key file    {ident.key_path(home_dir)}", highlight=False)


# ---------------------------------------------------------------- swarm ledger


@ledger_app.command("summary")
def summary(home: HomeOption = None, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Counts: facts by kind, outcomes, verdicts, peers, versions, runs, rejections.

    Example: swarm ledger summary --db ~/.research-swarm/ledger.db
    """
    with _open(home, db) as ledger:
        info = ledger.summary()
    if as_json:
        _print_json(info)
        return
    table = Table(title="ledger", show_header=False)
    table.add_row("file", info["path"])
    table.add_row("schema", str(info["schema_version"]))
    table.add_row("campaigns", ", ".join(info["campaigns"]) or "-")
    table.add_row("facts", _counts(info["facts"]))
    table.add_row("outcomes", _counts(info["outcomes"]))
    table.add_row("verdicts", _counts(info["verdicts"]))
    table.add_row("peers", str(info["peers"]))
    table.add_row("versions", str(info["versions"]))
    table.add_row("own runs", str(info["runs"]))
    table.add_row("rejected", _counts(info["rejected"]))
    table.add_row("last received", _when(info["last_received"]))
    console.print(table)


def _print_record(first: str, more: list[str]) -> None:
    """A row for a narrow screen or a pipe: its key fields on one line, each further line
    indented and wrapped at words within the width, never inside a field or a hash."""
    console.print(first, highlight=False, markup=False, soft_wrap=True)
    width = max(console.width - 4, 20)
    for text in more:
        for line in textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False):
            console.print("    " + line, highlight=False, markup=False, soft_wrap=True)


def _counts(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"


class Outcome(str, Enum):
    keep = "keep"
    discard = "discard"
    crash = "crash"
    void = "void"


QuorumOption = Annotated[
    int | None,
    typer.Option(
        min=1, help="Confirmations needed from other peers (default: the campaign's, else 1)."
    ),
]


def _quorum(ledger: Ledger, quorum: int | None) -> int:
    """The quorum asked for, else the one of the campaign terms the node set, else 1."""
    return quorum if quorum is not None else ledger.quorum()


@ledger_app.command("experiments")
def experiments(
    home: HomeOption = None,
    db: DbOption = None,
    peer: Annotated[
        str | None,
        typer.Option(help="Only this author: a peer id, or its tail as tables show it."),
    ] = None,
    outcome: Annotated[
        Outcome | None,
        typer.Option(help="keep, discard, crash or void (the harness refused to score it)."),
    ] = None,
    profile: Annotated[str | None, typer.Option(help="Only this profile.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    quorum: QuorumOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every experiment published (failures too), newest first, with its verdicts: ✓ confirmed,
    ✗ refuted, ? inconclusive, ⊘ void (a verifier's harness refused to score its re-run). A claim
    held as an outlier for more looks says so under its description.

    Example: swarm ledger experiments --outcome keep --profile cpu --limit 20
    """
    with _open(home, db) as ledger:
        rows = ledger.experiments(
            peer, outcome.value if outcome else None, profile, limit, _quorum(ledger, quorum)
        )
    if as_json:
        _print_json(rows)
        return
    if console.width < WIDE:
        _experiment_records(rows)
        return
    table = Table(title=f"experiments ({len(rows)} shown, newest first)")
    columns = ("time", "peer", "profile", "outcome", "val_bpb", "child", "✓", "✗", "?", "⊘", "description")  # fmt: skip
    for name in columns:
        table.add_column(name, overflow="fold" if name == "description" else "ellipsis")
    for r in rows:
        described = safe_text(r["description"])
        if r["held"]:
            described += f"\n{safe_text(r['held'])}"
        table.add_row(
            _when(r["time"]), _peer(r["author"]), r["profile"], r["outcome"], _bpb(r["val_bpb"]),
            _short(r["child"]), str(r["confirmations"]), str(r["refutations"]),
            str(r["inconclusive"]), str(r["voids"]), described,
        )  # fmt: skip
    console.print(table)


def _experiment_records(rows: list[dict]) -> None:
    console.print(f"experiments ({len(rows)} shown, newest first; time in UTC)", highlight=False)
    console.print("looks: ✓ confirmed, ✗ refuted, ? inconclusive, ⊘ void", highlight=False)
    profile_width = max((len(r["profile"]) for r in rows), default=0)
    for r in rows:
        looks = (f"✓{r['confirmations']} ✗{r['refutations']} ?{r['inconclusive']} "
                 f"⊘{r['voids']}")  # fmt: skip
        first = "  ".join((
            _when(r["time"])[:16], _peer(r["author"]), r["profile"].ljust(profile_width),
            r["outcome"].ljust(7), _bpb(r["val_bpb"]).rjust(6), _short(r["child"]), looks,
        ))  # fmt: skip
        _print_record(
            first, [safe_text(r["description"]), *([safe_text(r["held"])] * bool(r["held"]))]
        )


@ledger_app.command("leaderboard")
def leaderboard(
    home: HomeOption = None,
    db: DbOption = None,
    quorum: QuorumOption = None,
    limit: Annotated[int, typer.Option(help="Versions shown per profile.")] = 10,
    as_json: JsonOption = False,
) -> None:
    """Per profile: the best train.py versions reached from the baseline through verified claims,
    who found and who verified them, and the claims held back as outliers for more looks.

    A version's score is minus the verified gains from the baseline (bpb, lower is better); a gain
    pools every look by peers other than its author with the same harness, and is verified by a
    sequential test that passes a change of no gain at most 5% of the time, with the QUORUM - 1 most
    favourable verifiers left out. The first row is the swarm's head. --json gives the versions;
    `swarm ledger experiments --json` gives every claim's state.
    Example: swarm ledger leaderboard --quorum 2
    """
    with _open(home, db) as ledger:
        quorum = _quorum(ledger, quorum)
        board = ledger.leaderboard(quorum, limit)
        held = {} if as_json else ledger.held(quorum)
    if as_json:
        _print_json(board)
        return
    if not board:
        console.print(f"no verified versions yet (quorum {quorum})")
    for profile in sorted(set(board) | set(held)):
        rows = board.get(profile, [])
        table = Table(title=f"profile {profile} (quorum {quorum})")
        for name in ("#", "score", "gain", "version", "found by", "verified by", "description"):
            table.add_column(name, overflow="fold" if name == "description" else "ellipsis")
        for rank, r in enumerate(rows, 1):
            table.add_row(
                str(rank), f"{r['score']:+.4f} ± {r['se']:.4f}", f"{r['gain']:.4f} ({r['seeds']} seeds)",
                _short(r["child"]), _peer(r["found_by"]), ", ".join(_peer(p) for p in r["verified_by"]),
                safe_text(r["description"]),
            )  # fmt: skip
        for r in held.get(profile, []):
            table.add_row(
                "held", "-", f"{r['gain']:.4f}", _short(r["child"]), _peer(r["author"]), "-",
                f"{safe_text(r['description'])}\n{safe_text(r['reason'])}",
            )  # fmt: skip
        console.print(table)


@ledger_app.command("lineage")
def lineage(
    version: Annotated[str, typer.Argument(help="sha256 of a train.py (or a unique prefix).")],
    home: HomeOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """The chain of versions from the baseline to VERSION, each step with its diff and delta.

    Example: swarm ledger lineage 3f2a9c
    """
    with _open(home, db) as ledger:
        steps = ledger.lineage(version)
        baselines = {r["baseline"] for r in ledger.rows("SELECT baseline FROM campaigns")}
    if as_json:
        _print_json(steps)
        return
    root = steps[0]["parent"]
    origin = "the campaign's baseline" if root in baselines else _short(root)
    table = Table(title=f"lineage of {_short(steps[-1]['child'])} from {origin}")
    for name in ("version", "val_bpb", "delta", "verified Δ", "✓", "diff", "peer", "description"):
        table.add_column(name, overflow="fold" if name == "description" else "ellipsis")
    for s in steps:
        table.add_row(
            _short(s["child"]), _bpb(s["val_bpb"]), _bpb(s["delta"], True),
            _bpb(s["verified_delta"], True), str(s["confirmations"]), f"{s['diff_size']} B",
            _peer(s["author"]), safe_text(s["description"]),
        )  # fmt: skip
    console.print(table)


@ledger_app.command("peers")
def peers(home: HomeOption = None, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Every peer heard from: what it published, how its claims fared, what was rejected.

    Example: swarm ledger peers --json
    """
    with _open(home, db) as ledger:
        rows = ledger.peers()
    if as_json:
        _print_json(rows)
        return
    if console.width < WIDE:  # the peer id stays whole: people paste it into --peer
        console.print(f"peers ({len(rows)})", highlight=False)
        for p in rows:
            _print_record(p["peer_id"], [
                f"first seen {_when(p['first_seen'])}, last seen {_when(p['last_seen'])}",
                f"{p['results']} results, {p['verifications']} verifications; its claims got "
                f"✓ {p['confirmations']} ✗ {p['refutations']} ⊘ {p['voids']}; replays of its "
                f"discards ✓ {p['discards_backed']} ✗ {p['discards_denied']}; "
                f"rejected: {_counts(p['rejected'])}",
            ])  # fmt: skip
        return
    table = Table(title=f"peers ({len(rows)})")
    table.add_column("peer", no_wrap=True, min_width=52)  # whole: people paste it into --peer
    columns = ("first seen", "last seen", "results", "verifs", "✓ got", "✗ got", "⊘ got",
               "discards replayed ✓ ✗", "rejected")  # fmt: skip
    for name in columns:
        table.add_column(name)
    for p in rows:
        table.add_row(
            p["peer_id"], _when(p["first_seen"]), _when(p["last_seen"]), str(p["results"]),
            str(p["verifications"]), str(p["confirmations"]), str(p["refutations"]),
            str(p["voids"]), f"{p['discards_backed']} {p['discards_denied']}",
            _counts(p["rejected"]),
        )  # fmt: skip
    console.print(table)


@ledger_app.command("show")
def show(
    fact_id: Annotated[
        str, typer.Argument(help="A fact id (sha256 of its signed bytes) or prefix.")
    ],
    home: HomeOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """One fact, decoded, with its signature checked again.

    Example: swarm ledger show 9db9f414
    """
    with _open(home, db) as ledger:
        info = ledger.fact(fact_id)
    if as_json:
        _print_json(info)
        return
    env = info["envelope"] or {}
    table = Table(title=f"fact {info['id']}", show_header=False)
    table.add_row("signature", info["status"])
    table.add_row("kind", str(env.get("kind")))
    table.add_row("campaign", str(env.get("campaign")))
    author = env.get("author")
    table.add_row("author", ident.peer_id_from_public_key(author) if author else "-")
    table.add_row("seq", str(env.get("seq")))
    table.add_row("time", _when(env.get("time")))
    table.add_row("received", _when(info["received"]))
    body = json.dumps(_jsonable(env.get("body")), indent=2, sort_keys=True, ensure_ascii=False)
    table.add_row("body", safe_text(body, keep="\n"))
    console.print(table)


@ledger_app.command("claim")
def claim(
    result_id: Annotated[str, typer.Argument(help="A kept result's fact id, or a prefix of it.")],
    home: HomeOption = None,
    db: DbOption = None,
    quorum: QuorumOption = None,
    as_json: JsonOption = False,
) -> None:
    """One claim as the rule judges it: its state, the gain its peers' looks pool to, who sat on
    its committee, and every look at it, with whether it counts and, if not, why.

    Example: swarm ledger claim 9db9f414
    """
    with _open(home, db) as ledger:
        info = claim_view(ledger, result_id, _quorum(ledger, quorum))
    if as_json:
        _print_json(info)
        return
    r = info["result"]
    gain = (
        "-" if info["gain"] is None
        else f"{info['gain']:+.4f} ± {info['gain_se']:.4f} bpb over {info['seeds']} seeds"
    )  # fmt: skip
    seats = info["seats"]
    table = Table(title=f"claim {r['id']}", show_header=False)
    for name, value in (
        ("author", r["author"]), ("profile", r["profile"]),
        ("change", f"{_short(r['parent'])} -> {_short(r['child'])}"),
        ("description", safe_text(r["description"])), ("claimed val_bpb", _bpb(r["val_bpb"])),
        ("state", str(info["state"])), ("pooled gain", gain), ("why", safe_text(info["why"])),
        ("committee", "none: an open campaign, any peer's look counts" if seats is None
         else ", ".join(_peer(p) for p in seats)),
    ):  # fmt: skip
        table.add_row(name, value)
    console.print(table)
    looks = Table(title=f"looks at it ({len(info['looks'])}, oldest first)")
    for name in ("time", "peer", "seed", "child - parent", "verdict", "counts", "note"):
        looks.add_column(name, overflow="fold" if name == "note" else "ellipsis")
    for v in info["looks"]:
        delta = "-" if v["delta"] is None else f"{v['delta']:+.4f}"
        looks.add_row(
            _when(v["time"]), _peer(v["author"]), str(v["seed"]), delta, v["verdict"],
            "yes" if v["counts"] else "no", v["note"],
        )  # fmt: skip
    console.print(looks)


class ExportFormat(str, Enum):
    csv = "csv"
    json = "json"


class ExportTable(str, Enum):
    results = "results"
    verifications = "verifications"
    campaigns = "campaigns"
    peers = "peers"
    runs = "runs"
    facts = "facts"


@ledger_app.command("export")
def export(
    home: HomeOption = None,
    db: DbOption = None,
    fmt: Annotated[ExportFormat, typer.Option("--format", help="csv or json.")] = ExportFormat.json,
    table: Annotated[ExportTable, typer.Option(help="Which table.")] = ExportTable.results,
    output: Annotated[Path | None, typer.Option(help="Write here, not stdout.")] = None,
) -> None:
    """Export a table; `facts` carries each fact's raw signed bytes as hex, re-checkable anywhere.

    Example: swarm ledger export --format csv --table results --output results.csv
    """
    with _open(home, db) as ledger:
        rows = ledger.rows(f"SELECT * FROM {table.value} ORDER BY rowid")
    rows = [_jsonable(r) for r in rows]
    if fmt is ExportFormat.json:
        text = json.dumps(rows, indent=2, sort_keys=True) + "\n"
    else:
        buf = io.StringIO()
        columns = list(rows[0]) if rows else []
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        text = buf.getvalue()
    if output is None:  # a terminal shows a peer's text, a pipe or a file gets it as it is
        sys.stdout.write(safe_text(text, markup=False, keep="\n") if sys.stdout.isatty() else text)
    else:
        try:
            output.write_text(text)
        except OSError as exc:
            raise SwarmError(f"cannot write {output}: {exc.strerror}") from None
        console.print(f"{len(rows)} {table.value} rows written to {output}", highlight=False)
