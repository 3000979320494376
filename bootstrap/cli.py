"""`swarm bootstrap`: the node's command line finds it through this package's entry point
(`research_swarm.commands` in pyproject.toml)."""

from __future__ import annotations

from typing import Annotated

import typer

from node.cli.campaign import campaign_or_name
from node.cli.shared import HomeOption, ListenOption, status_line, stop_on_signal


def bootstrap(
    listen: ListenOption = "/ip4/0.0.0.0/tcp/4001",
    campaign: Annotated[
        str | None,
        typer.Option(
            "--campaign",
            help="Also relay and store this campaign's facts: its name, or its campaign file, which the bootstrap then serves to newcomers.",
        ),
    ] = None,
    home: HomeOption = None,
) -> None:
    """Run a bootstrap peer: a stable address that newcomers dial first. It trains nothing.

    Prints its full multiaddr (with /p2p/<peer id>) and writes it to HOME/address; pass that to
    `swarm join --bootstrap`. Deploying one: bootstrap/README.md.

    Example: swarm bootstrap --listen /ip4/0.0.0.0/tcp/4001 --home ~/.swarm-bootstrap
    """
    from bootstrap.service import serve
    from node.home import resolve_home

    spec = campaign_or_name(campaign) if campaign else None
    serve(listen, resolve_home(home), spec, say=status_line, stop=stop_on_signal())
