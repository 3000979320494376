"""The bootstrap peer: a long-lived node with a stable identity that newcomers dial first.

It runs no training. It relays gossip (when given a campaign), answers sync and peer exchange,
and prints the full multiaddr others pass to `--bootstrap`. Any node can play this part.
"""

from __future__ import annotations

import threading
from pathlib import Path

from node.gossip import GossipConfig, run_peer


def run_bootstrap(
    listen: str, home: Path, campaign: str | None = None, stop: threading.Event | None = None
) -> None:
    """Run the bootstrap peer until `stop` is set; its key lives in HOME, so its address is
    stable."""
    run_peer(GossipConfig(home=home, listen=listen, campaign=campaign), stop=stop)
