"""What the `swarm` commands share: the consoles, the common options, and the data a command
needs before it runs (built on first use)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

# Lines are never broken at the console's width (80 columns in a log file or a pipe): addresses,
# hashes and commands in them must stay whole to be copied. Tables still fit the width.
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

HomeOption = Annotated[
    Path | None,
    typer.Option("--home", help="Node home (key, ledger, runs). Env SWARM_HOME; default ~/.research-swarm."),
]

ProfileOption = Annotated[str, typer.Option("--profile", "-p", help="test (seconds), cpu (about 2 minutes), gpu (300 s on one CUDA GPU).")]
DataOption = Annotated[
    str | None,
    typer.Option("--data", help="Replace the profile's data: embedded:default, embedded:small, web:fineweb-edu or urls:FILE."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]


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
