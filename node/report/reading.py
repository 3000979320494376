"""Reading the ledger for the report: one `Snapshot` of everything the page and the picture
show, read in one go, read-only."""

from __future__ import annotations

import difflib
import statistics
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from node import consensus
from node import noise as noise_of
from node.errors import SwarmError
from node.home import resolve_home
from node.ledger import MIGRATIONS, Ledger, LedgerError, ledger_path
from node.ledger_queries import LOOK_COLUMNS

BOARD_LIMIT = 10  # versions shown per profile on the leaderboard
COLOURED_PEERS = 10  # the most active peers get a colour each; the rest share grey
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#393b79"]  # fmt: skip
OTHER_COLOUR = "#b0b0b0"
HEAD_POINTS = 200  # looks at which the head is judged again for the plot, at most, per profile


class ReportError(SwarmError):
    """A report that cannot be written: no ledger, not a ledger, an output folder not writable."""


@dataclass
class Snapshot:
    """Everything the report shows, read from the ledger in one go."""

    path: str
    read_at: int  # ms since the epoch
    campaigns: list[str]
    quorum: int
    results: list[dict]  # every result, oldest first
    verified: dict[str, set[str]]  # result id -> the peers whose confirmations count
    refuted: set[str]  # result ids refuted by the quorum
    held: dict[str, str]  # result id -> why it is held as an outlier for more looks
    board: dict[str, list[dict]]  # ledger.leaderboard
    lineages: dict[str, list[dict]]  # profile -> steps to its best version, each with "diff"
    baselines: set[str]
    peers: list[dict]
    noise: dict[str, dict[tuple[str, str], list[float]]]  # profile -> its paired differences
    colours: dict[str, str]  # peer id -> colour in the plot and the peer table
    baseline_bpb: dict[str, float]  # profile -> the baseline's measured val_bpb (its median)
    heads: dict[str, list[tuple[int, float]]]  # profile -> (time, the head's score) as it moved


def open_ledger(home: Path | None, db: Path | None) -> Ledger:
    """The ledger at `db`, else in `home`, opened read-only; a ReportError when there is none."""
    path = db if db is not None else ledger_path(resolve_home(home, create=False))
    if not path.is_file():
        hint = "" if db is not None else " (no facts yet: run a node, or pass --db)"
        raise ReportError(f"no ledger at {path}{hint}")
    try:
        ledger = Ledger(path, readonly=True)
    except LedgerError as exc:
        raise ReportError(str(exc)) from None
    if ledger.schema_version < len(MIGRATIONS):  # read-only, it cannot be upgraded here
        ledger.close()
        raise ReportError(f"{path} is a ledger of schema {ledger.schema_version}, older than this "
                          f"version's {len(MIGRATIONS)}: start its node once with this version "
                          "(that upgrades the file), then ask again")  # fmt: skip
    return ledger


def read_snapshot(ledger: Ledger, quorum: int | None = None, now_ms: int | None = None) -> Snapshot:
    """Read what the report shows. `quorum` defaults to the campaign's, else 1."""
    read_at = int(datetime.now(timezone.utc).timestamp() * 1000) if now_ms is None else now_ms
    terms = ledger.terms()
    campaigns = [terms["name"]] if terms else [  # a bootstrap's ledger: the campaigns it holds
        r["campaign"] for r in ledger.rows(
            "SELECT campaign FROM results UNION SELECT campaign FROM verifications ORDER BY 1")
    ]  # fmt: skip
    quorum = quorum or ledger.quorum()
    results = ledger.rows(
        "SELECT id, author, time, profile, parent, child, harness, outcome, val_bpb, description "
        "FROM results ORDER BY time, id"
    )
    verifications = ledger.rows(
        "SELECT result, author, verdict, profile, harness, delta, seed FROM verifications"
    )
    judged: dict = {}
    for profile in sorted({r["profile"] for r in results if r["outcome"] == "keep"}):
        judged.update(ledger.standings(profile, quorum, every=True)[1])
    verified = {rid: set(j.peers) for rid, j in judged.items() if j.state == "verified"}
    refuted = {rid for rid, j in judged.items() if j.state in ("refuted", *consensus.DISQUALIFYING)}
    held = {rid: j.reason for rid, j in judged.items() if j.state == consensus.HELD}
    board = ledger.leaderboard(quorum, BOARD_LIMIT)
    baselines = {ledger.baseline()}
    lineages = {profile: _lineage(ledger, rows[0]["child"]) for profile, rows in board.items()}
    noise = {
        r["profile"]: noise_of.own_pairs(ledger, r["profile"])
        for r in ledger.rows("SELECT DISTINCT profile FROM runs WHERE profile IS NOT NULL")
    }
    peers = _peer_stats(results, verifications, verified, refuted)
    colours = {
        p["peer_id"]: PALETTE[i] if i < COLOURED_PEERS else OTHER_COLOUR
        for i, p in enumerate(peers)
    }
    profiles = sorted({r["profile"] for r in results})
    baseline_bpb = {p: bpb for p in profiles if (bpb := _baseline_bpb(ledger, p)) is not None}
    heads = {p: _head_over_time(ledger, p, quorum, board.get(p)) for p in profiles}
    return Snapshot(
        path=str(ledger.path), read_at=read_at, campaigns=campaigns,
        quorum=quorum, results=results, verified=verified, refuted=refuted, held=held, board=board,
        lineages=lineages, baselines=baselines, peers=peers, noise=dict(sorted(noise.items())),
        colours=colours, baseline_bpb=baseline_bpb, heads=heads,
    )  # fmt: skip


def _baseline_bpb(ledger: Ledger, profile: str) -> float | None:
    """The baseline's val_bpb on `profile`: the median of its paired runs, as the results built
    on it report them and as this node ran it; None when nothing measured it."""
    values = sorted(
        r["v"] for r in ledger.rows(
            "SELECT parent_val_bpb AS v FROM results WHERE profile = ? AND parent = ? "
            "AND parent_val_bpb IS NOT NULL UNION ALL SELECT val_bpb FROM runs WHERE profile = ? "
            "AND child = ? AND parent = child AND val_bpb IS NOT NULL",
            (profile, ledger.baseline(), profile, ledger.baseline()),
        )
    )  # fmt: skip
    return statistics.median(values) if values else None


def _head_over_time(
    ledger: Ledger, profile: str, quorum: int, board: list[dict] | None
) -> list[tuple[int, float]]:
    """(time, the head's score) from the first experiment on, a point each time it moved: the
    rule (`consensus.standings`) applied to the facts held at each look (HEAD_POINTS of them at
    most), and last the head this ledger holds now (`board`)."""
    results, _ = ledger.claim_rows(profile)
    looks = ledger.rows(
        f"SELECT {LOOK_COLUMNS}, time FROM verifications WHERE profile = ?", (profile,)
    )
    first = ledger.rows("SELECT MIN(time) AS t FROM results WHERE profile = ?", (profile,))[0]["t"]
    heads = [(first, 0.0)]
    times = sorted({v["time"] for v in looks})
    if len(times) > HEAD_POINTS:
        times = [times[round(i * (len(times) - 1) / (HEAD_POINTS - 1))] for i in range(HEAD_POINTS)]
    rules, baseline = ledger.rules(profile, quorum), ledger.baseline()
    for t in times:
        scores, _ = consensus.standings(
            [r for r in results if r["time"] <= t], [v for v in looks if v["time"] <= t],
            profile, baseline, rules,
        )  # fmt: skip
        score = scores[consensus.head_of(scores)].score if scores else 0.0
        if score != heads[-1][1]:
            heads.append((t, score))
    now = board[0]["score"] if board else 0.0
    if now != heads[-1][1]:  # the ledger's own judgement, when the replay above differs
        heads.append((max(times[-1:] or [first]), now))
    return heads


def _lineage(ledger: Ledger, child: str) -> list[dict]:
    """The chain to `child`, each step with the diff from its parent, or None when this ledger
    does not hold both versions (they travel by hash and may not have been fetched)."""
    steps = ledger.lineage(child)
    for step in steps:
        parent, made = ledger.version(step["parent"]), ledger.version(step["child"])
        step["missing"] = [
            name for name, src in (("parent", parent), ("child", made)) if src is None
        ]
        step["diff"] = None
        if parent is not None and made is not None:
            old = parent.decode("utf-8", "replace").splitlines(keepends=True)
            new = made.decode("utf-8", "replace").splitlines(keepends=True)
            step["diff"] = "".join(difflib.unified_diff(old, new, "a/train.py", "b/train.py"))
    return steps


def _peer_stats(
    results: list[dict], verifications: list[dict], verified: dict, refuted: set[str]
) -> list[dict]:
    """Per author of a result or a verification: what it tried and how its claims fared; the
    most active first."""
    stats: dict[str, Counter] = {}
    for r in results:
        s = stats.setdefault(r["author"], Counter())
        s["experiments"] += 1
        s[r["outcome"]] += 1
        s["verified"] += r["id"] in verified
        s["refuted"] += r["id"] in refuted
    for v in verifications:
        stats.setdefault(v["author"], Counter())["verifications"] += 1
    rows = [
        {"peer_id": peer, **{k: s[k] for k in ("experiments", "keep", "discard", "crash", "void",
                                               "verified", "refuted", "verifications")}}
        for peer, s in stats.items()
    ]  # fmt: skip
    return sorted(rows, key=lambda p: (-p["experiments"], -p["verifications"], p["peer_id"]))
