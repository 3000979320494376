"""`swarm`: the command line of a research-swarm node, one file per group of commands.

    shared.py    options, consoles and helpers every command uses
    run.py       swarm data build, swarm run, swarm report
    nodes.py     swarm peer, swarm join, swarm local: commands that start nodes
    status.py    swarm status, swarm peers: what a running node is doing
    campaign.py  swarm campaign new|invite|show
    ledger.py    swarm keys ..., swarm ledger ...: the identity and the local ledger

`swarm bootstrap` is the bootstrap package's: packages built on the node add commands through the
entry points of group `research_swarm.commands` (pyproject.toml), so the node never imports them.

Commands stay thin: they parse arguments, call into the node's rooms and render what comes back.
A user's mistake ends in a one-line error and exit code 1, never a traceback.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import typer

# typer 0.29 vendors click and exports neither exception: an upgrade that moves them fails every
# test of the command line at this import.
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from node.cli.shared import console, err_console
from node.errors import SwarmError
from node.safe_text import install_safe_logging, safe_text

app = typer.Typer(
    help="research-swarm: autonomous research agents that improve a training script together.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module registers its commands on `app` as it is imported (`--help` lists them in this order,
# groups of commands after the commands).
from node.cli import ledger, run, nodes, status, campaign  # noqa: E402, F401, I001

for _command in entry_points(group="research_swarm.commands"):
    app.command(_command.name)(_command.load())


def main() -> None:
    """Entry point of the `swarm` console script."""
    install_safe_logging()
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:
        console.print(exc.ctx.get_help())
        sys.exit(0)
    except UsageError as exc:  # a mistyped command or option: one line, not a box
        where = f"`{exc.ctx.command_path} --help`" if exc.ctx else "`swarm --help`"
        err_console.print(
            f"[bold red]error:[/] {exc.format_message()} (see {where})", highlight=False
        )
        sys.exit(2)
    except typer.Abort:
        err_console.print("interrupted")
        sys.exit(130)
    except SwarmError as exc:
        err_console.print(f"[bold red]error:[/] {safe_text(exc)}", highlight=False)
        sys.exit(1)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
