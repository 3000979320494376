"""What the `swarm` commands share: the consoles, the common options, the checks of what a user
typed (made before anything is built or written), and the data a command needs before it runs
(built on first use)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from node.errors import SwarmError

# Lines are never broken at the console's width (80 columns in a log file or a pipe): addresses,
# hashes and commands in them must stay whole to be copied. Tables still fit the width.
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

HomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home", help="Node home (key, ledger, runs). Env SWARM_HOME; default ~/.research-swarm."
    ),
]

ProfileOption = Annotated[
    str,
    typer.Option(
        "--profile",
        "-p",
        help="test (seconds), demo (about 20 s of training), cpu (about 2 minutes), gpu (about 250 s on one CUDA GPU).",
    ),
]
DataOption = Annotated[
    str | None,
    typer.Option(
        "--data",
        help="Replace the profile's data: embedded:default, embedded:small, web:fineweb-edu or urls:FILE.",
    ),
]
ProposerOption = Annotated[
    str,
    typer.Option(
        "--proposer",
        help="Without --model: learning (the offline proposer, ordered by the swarm's evidence) or fixed (its catalogue in a seeded order, blind to the evidence: a control to measure it against).",
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON instead of tables, for programs.")
]


def status_line(message: str) -> None:
    """One dim line on stderr: what a command is doing, out of the way of its output."""
    err_console.print(f"[dim]{message}[/]", highlight=False)


def prepare(profile_name: str, data: str | None, home: Path | None):
    """(home, profile, its data): the data built on first use, with progress on stderr."""
    from node.home import data_dir, resolve_home
    from node.trainer import get_profile, prepare_data

    home_dir = resolve_home(home)
    profile = get_profile(profile_name, data)
    return home_dir, profile, prepare_data(profile, data_dir(home_dir), status_line)


def bootstrap_addrs(values: list[str]) -> list[str]:
    """The --bootstrap addresses, each checked to be a peer's full multiaddr; a SwarmError that
    names the first one that is not."""
    from libp2p.peer.peerinfo import info_from_p2p_addr

    from node.gossip.addresses import GossipError, parse_multiaddr

    for value in values:
        try:
            info_from_p2p_addr(parse_multiaddr(value, need_peer_id=True))
        except GossipError as exc:
            why = "it lacks /p2p/<peer id>" if "lacks /p2p/" in str(exc) else "not a multiaddr"
        except Exception:
            why = "its /p2p/ part is not a peer id"
        else:
            continue
        raise SwarmError(f"--bootstrap {value[:80]}: {why}; pass the full address a bootstrap "
                         "prints, e.g. /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...")  # fmt: skip
    return values


def gpus_option(value: str) -> str:
    """--gpus: 'all' or a positive number of GPUs."""
    if value != "all" and not (value.isdigit() and int(value) >= 1):
        raise SwarmError(f"--gpus {value[:40]}: pass 'all' or how many GPUs to use, e.g. --gpus 2")
    return value


def proposer_option(value: str, model: str | None) -> str:
    """--proposer: one of the offline proposers (`OFFLINE_PROPOSERS`), and only without a model."""
    from node.agent.offline import OFFLINE_PROPOSERS

    if value not in OFFLINE_PROPOSERS:
        names = " or ".join(OFFLINE_PROPOSERS)
        raise SwarmError(f"--proposer {value[:40]}: pass {names}, e.g. --proposer fixed")
    if model and value != "learning":
        raise SwarmError(
            f"--proposer {value} orders the offline proposer: leave out --model {model[:40]}, "
            f"e.g. --proposer {value} --profile cpu"
        )
    return value


def date_of(seconds: float) -> str:
    """A time (seconds since the epoch) as people read it: a date and a time of day, in UTC."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def not_running_line(home: Path, stopped_at: float | None) -> str:
    """What `swarm status` and `swarm peers` say first of a node that has stopped."""
    when = f" (it stopped at {date_of(stopped_at)})" if stopped_at else ""
    return (f"the node in {home} is not running{when}: below is what it last wrote; "
            f"start it again with `swarm join --home {home} ...`")  # fmt: skip


def ago(seconds: float) -> str:
    """An age, in the unit a person would say it in."""
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago" if seconds < 7200 else f"{seconds / 3600:.1f} h ago"


ListenOption = Annotated[
    str,
    typer.Option(
        "--listen",
        help="Multiaddr to listen on, e.g. /ip4/0.0.0.0/tcp/4001 (tcp/0: any free port).",
    ),
]


def stop_on_signal():
    """An event that Ctrl-C or SIGTERM sets, so that a peer stops cleanly (exit code 0)."""
    import signal
    import threading

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop
