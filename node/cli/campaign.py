"""`swarm campaign new|invite|show`, and how `swarm join` finds its campaign: a campaign file, a name
on the built-in baseline, or the hash of a file that a bootstrap serves (fetched once, then kept
in HOME/campaigns/)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from node.cli import app
from node.cli.shared import (
    DataOption,
    HomeOption,
    JsonOption,
    console,
    err_console,
    prepare,
    status_line,
)
from node.errors import SwarmError
from node.safe_text import safe_text


def campaign_from_peer(home: Path, peers: list[str], sha256: str):
    """The campaign file with this hash, fetched from the first --bootstrap that serves it, and
    kept in HOME/campaigns/ for the next start."""
    from node.campaign import load_campaign, parse_campaign
    from node.gossip import GossipError, fetch_blob

    kept = home / "campaigns" / f"{sha256}.campaign.json"
    if kept.is_file():
        return load_campaign(kept)
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise SwarmError(
            f"--campaign sha256:{sha256[:20]}...: expected 64 hex digits after sha256:"
        )
    if not peers:
        raise SwarmError(
            "--campaign sha256:HASH needs --bootstrap: the peer that serves the campaign file"
        )
    errors = []
    for peer in peers:
        status_line(f"asking {peer} for campaign sha256:{sha256[:16]}... (up to a minute)")
        try:
            raw = fetch_blob(home, peer, sha256)
        except GossipError as exc:
            errors.append(str(exc))
            continue
        campaign = parse_campaign(raw, f"campaign file from {peer}")
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_bytes(raw)
        status_line(
            f"campaign {campaign.name} from {peer}, organised by {campaign.organiser}; kept in {kept}"
        )
        return campaign
    raise SwarmError("; ".join(errors))


def campaign_or_name(value: str):
    """A loaded campaign file when `value` names one, else the campaign name itself."""
    from node.campaign import load_campaign

    if Path(value).is_file():
        return load_campaign(value)
    if "/" in value or value.endswith(".json"):
        raise SwarmError(
            f"no campaign file {value}: make one with `swarm campaign new`, or pass a campaign name"
        )
    return value


campaign_app = typer.Typer(
    help="Campaign files: what a group researches together, signed by its organiser.",
    no_args_is_help=True,
)
app.add_typer(campaign_app, name="campaign")


@campaign_app.command("new")
def campaign_new(
    name: Annotated[
        str, typer.Argument(help="The campaign's name: letters, digits, '-', '_' and '.'.")
    ],
    program: Annotated[
        Path,
        typer.Option("--program", help="The program.md the agents read (the research strategy)."),
    ],
    profiles: Annotated[
        list[str],
        typer.Option("--profile", "-p", help="A profile the campaign runs on (repeatable)."),
    ],
    quorum: Annotated[
        int,
        typer.Option(
            "--quorum", help="Distinct confirmers other than the author before a win is adopted."
        ),
    ] = 1,
    baseline: Annotated[
        Path | None,
        typer.Option(
            "--baseline", help="The train.py every lineage starts from (default: the built-in one)."
        ),
    ] = None,
    data: DataOption = None,
    budget: Annotated[
        list[str] | None,
        typer.Option(
            "--budget",
            help="PROFILE=TOKENS: another training budget for a profile (repeatable; default: the profile's).",
        ),
    ] = None,
    members: Annotated[
        Path | None,
        typer.Option(
            "--members",
            help="A file of member peer ids, one per line: only members verify, on committees drawn by hash (default: an open campaign, where any key counts).",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Where to write the campaign file (default: NAME.campaign.json)."
        ),
    ] = None,
    home: HomeOption = None,
) -> None:
    """Write a campaign file signed by this node's key: name, program.md, baseline train.py, data hashes, budgets, quorum.

    Builds (or finds) each profile's data to pin its hashes, and pins each profile's training budget (tokens), so that
    every member measures the same thing. Members join with `swarm join --campaign FILE`. With --members, the campaign
    resists Sybils: keys not on the list never verify (`swarm campaign invite` adds one later). An open campaign cannot
    tell one person's many keys apart.

    Example: swarm campaign new hack-nov --program program.md --profile cpu --quorum 2 --members team.txt
    """
    from node.campaign import budget_warning, campaign_body, data_pins, make_campaign
    from node.identity import load_identity
    from node.ledger import Ledger, ledger_path
    from node.trainer import BASELINE_TRAIN_PY
    from node.trainer.policy import check_source

    texts = {}
    listed = None
    if members is not None:
        try:
            lines = members.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise SwarmError(f"cannot read --members {members}: {exc}") from None
        listed = [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
    for label, path in (("program", program), ("baseline", baseline or BASELINE_TRAIN_PY)):
        try:
            texts[label] = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SwarmError(f"cannot read --{label} {path}: {exc}") from None
    broken = check_source(texts["baseline"])
    if broken:
        raise SwarmError(f"--baseline breaks the train.py policy: {broken[0]}; fix it first")
    budgets = {}
    for entry in budget or []:
        name_, _, tokens_ = entry.partition("=")
        if name_ not in profiles or not tokens_.isdigit() or int(tokens_) < 1:
            raise SwarmError(
                f"--budget {entry!r}: expected PROFILE=TOKENS for one of the --profile values, "
                "e.g. --budget cpu=393216"
            )
        budgets[name_] = int(tokens_)
    pins: dict[str, str] = {}
    for profile in dict.fromkeys(profiles):
        home_dir, prof, tokens = prepare(profile, data, home)
        pinned = budgets.get(prof.name, prof.budget_tokens)
        if warning := budget_warning(
            prof.name, pinned, tokens.manifest, f"--budget {prof.name}={{budget}}"
        ):
            err_console.print(f"[yellow]warning:[/] {warning}", highlight=False)
        pins.update(data_pins(prof.name, prof.data, tokens.manifest, pinned))
    me = load_identity(home_dir)
    body = campaign_body(
        me,
        name,
        texts["program"],
        texts["baseline"],
        list(dict.fromkeys(profiles)),
        quorum,
        pins,
        listed,
    )
    with Ledger(ledger_path(home_dir), campaign=name) as ledger:
        fact = ledger.publish(me, "campaign", body)
    campaign = make_campaign(fact, texts["program"], texts["baseline"])
    target = out or Path(f"{name}.campaign.json")
    target.write_bytes(campaign.to_bytes())
    console.print(
        f"campaign {name}: {target} (sha256 {campaign.sha256[:16]}), signed by {campaign.organiser}"
    )
    console.print(f"members join with: swarm join --campaign {target} --bootstrap ADDR")


def _invited(campaign, home: Path | None) -> list[str]:
    """The peers the organiser invited into `campaign`, in this home's ledger (none if it has none)."""
    from node.home import resolve_home
    from node.ledger import Ledger, ledger_path

    path = ledger_path(resolve_home(home, create=False))
    if not path.is_file():
        return []
    with Ledger(path, readonly=True) as ledger:
        return [member for member, _ in ledger.invited(campaign.name, campaign.organiser)]


@campaign_app.command("invite")
def campaign_invite(
    file: Annotated[Path, typer.Argument(help="The campaign file (one with members).")],
    peers: Annotated[
        list[str], typer.Argument(help="The peer ids to invite, as `swarm keys show` prints them.")
    ],
    home: HomeOption = None,
) -> None:
    """Make peers members of a campaign after its file was made: an invitation signed by the organiser's key.

    The invitation goes into this home's ledger, and its node gossips it (at once if it runs, else when it next starts);
    every node counts the peer as a member for claims made from then on, with the same file. Run it in the organiser's
    home. An open campaign needs no invitations.

    Example: swarm campaign invite hack-nov.campaign.json 12D3KooW...
    """
    from node.campaign import invite, load_campaign
    from node.home import resolve_home
    from node.identity import load_identity
    from node.ledger import Ledger, ledger_path

    campaign = load_campaign(file)
    home_dir = resolve_home(home, create=False)
    me = load_identity(home_dir, create=False)
    with Ledger(ledger_path(home_dir), campaign=campaign.name) as ledger:
        for peer in peers:
            fact = invite(ledger, me, campaign, peer)
            console.print(f"invited {peer} into {campaign.name} (invitation {fact.id[:16]})")


@campaign_app.command("show")
def campaign_show(
    file: Annotated[Path, typer.Argument(help="A campaign file.")],
    as_json: JsonOption = False,
    home: HomeOption = None,
) -> None:
    """Check a campaign file's signature and hashes, and show what it pins, with the members the organiser invited since
    as far as this home's ledger knows.

    Example: swarm campaign show hack-nov.campaign.json
    """
    from node.campaign import load_campaign

    campaign = load_campaign(file)
    info = {
        "name": campaign.name,
        "organiser": campaign.organiser,
        "quorum": campaign.quorum,
        "profiles": campaign.profiles,
        "baseline": campaign.baseline_sha256,
        "program_sha256": campaign.fact.body["program_sha256"],
        "data": campaign.fact.body["data"],
        "members": campaign.members if campaign.members is not None else "open: any key counts",
        **({} if campaign.members is None else {"invited": _invited(campaign, home)}),
        "sha256": campaign.sha256,
    }
    if as_json:
        print(json.dumps(info))
        return
    table = Table(
        title=f"campaign {campaign.name} (signature and hashes check out)", show_header=False
    )
    for key, value in info.items():
        shown = json.dumps(value) if isinstance(value, (list, dict)) else value
        table.add_row(key, safe_text(shown))  # an organiser's words, e.g. in `data`
    console.print(table)
