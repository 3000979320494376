"""The bootstrap's service: a gossiping peer with a stable key that answers sync and peer
exchange, relays a campaign's facts and, given its campaign file, serves that file to newcomers
by hash. It writes its full multiaddrs to HOME/address, one a line, for whoever hands them out."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from node import network
from node.campaign import Campaign
from node.gossip import GossipConfig
from node.ledger import Ledger, ledger_path

ADDRESS_FILE = "address"


def serve(
    listen: str,
    home: Path,
    campaign: Campaign | str | None = None,
    *,
    say: Callable[[str], None] = print,
    stop: threading.Event | None = None,
) -> None:
    """Run the bootstrap until `stop` is set. `campaign`: a loaded campaign file (its terms bind
    this peer's standing, and newcomers fetch it by hash), a campaign's name (relay its facts),
    or None (peer exchange and relay only). Its key lives in `home`, so its address is stable."""
    home = Path(home)
    if isinstance(campaign, Campaign):
        with Ledger(ledger_path(home), campaign=campaign.name) as ledger:
            ledger.set_terms(campaign.terms)  # its standing judges by the file's quorum and members
            ledger.ingest(campaign.fact.raw)
            ledger.add_version(campaign.to_bytes())  # served by hash, like a train.py
        say(
            f"serving campaign {campaign.name}: newcomers run swarm join --bootstrap <address "
            f"below> --campaign sha256:{campaign.sha256}"
        )
        campaign = campaign.name

    def ready(addrs: list[str]) -> None:
        (home / ADDRESS_FILE).write_text("".join(f"{addr}\n" for addr in addrs))
        for addr in addrs:
            print(addr, flush=True)

    network.run(
        GossipConfig(home=home, listen=listen, campaign=campaign), on_ready=ready, stop=stop
    )
