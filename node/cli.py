"""`swarm`: the command line of a research-swarm node.

Commands stay thin: they parse arguments, call into the node's rooms and render what comes back.
A user's mistake ends in a one-line error and exit code 1, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from node.errors import SwarmError

app = typer.Typer(
    help="research-swarm: autonomous research agents that improve a training script together.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

HomeOption = Annotated[
    Path | None,
    typer.Option("--home", help="Node home (key, ledger, runs). Env SWARM_HOME; default ~/.research-swarm."),
]


from node.inspect import keys_app, ledger_app  # noqa: E402  (sub-apps register last)

app.add_typer(keys_app, name="keys")
app.add_typer(ledger_app, name="ledger")


def main() -> None:
    """Entry point of the `swarm` console script."""
    try:
        app()
    except SwarmError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
