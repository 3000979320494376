"""The gossip network as a transport: libp2p hosts that carry signed facts between nodes, with
no coordinator. It knows no ledger and no policy: the node hands it a `Facts` (facts in, each
with a verdict; what it may serve), sends its own facts through `GossipNode.send`, and tells it
whose facts to drop (`set_standing`). `node/network.py` wires it to the ledger and to standing.

The face: `GossipConfig`, `GossipNode`, `Facts`, `run_peer(transport)` (blocks), `fetch_blob`,
`read_status(home)`, `topic_for(campaign)`, `GossipError`. Trio and libp2p stay in this package.

    peer.py       the transport: its host, topic, maintenance loops and status
    facts.py      the door to the node: `Facts`, and a verdict for each fact
    addresses.py  the topic, multiaddrs, a port in use, why a dial failed, a host's release
    admission.py  who may connect and open streams: gated handshakes, capped streams
    pubsub.py     GossipSub's Pubsub, charging the sender for junk, bad signatures and streams
    guards.py     patches of the library where it trusts a stranger's lengths and windows
    protocols.py  our own protocols: sync, peer exchange, fetch by hash
    wanted.py     the versions to fetch by hash: whom to ask, room for every author, asked again
    frames.py     length-prefixed msgpack frames, with limits on size and time
    limits.py     what a node allows its peers, and the book of the peers it knows
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from node.gossip.addresses import GossipError, check_port_free, topic_for
from node.gossip.facts import Facts, NoFacts, Verdict
from node.gossip.limits import Limits
from node.gossip.peer import STATUS_FILE, GossipConfig, GossipNode

__all__ = [
    "Facts",
    "GossipConfig",
    "GossipError",
    "GossipNode",
    "Limits",
    "Verdict",
    "fetch_blob",
    "read_status",
    "run_peer",
    "topic_for",
]


def run_peer(
    transport: GossipNode,
    on_ready: Callable[[list[str]], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Run the transport until interrupted or `stop` is set: listen, find peers, sync, relay.

    `on_ready` gets the node's full multiaddrs (with /p2p/<peer id>) once it listens. A daemon
    runs this in a thread of its own and sets `stop` to end it."""
    import trio

    logging.getLogger("libp2p").setLevel(logging.CRITICAL)  # we count and report what matters
    check_port_free(transport.config.listen)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(transport.run)
            await transport.printed.wait()
            (on_ready or _print_addrs)(transport.addrs)
            while stop is not None:
                if stop.is_set():
                    nursery.cancel_scope.cancel()
                    return
                await trio.sleep(0.2)

    try:
        trio.run(main)
    except Exception as exc:  # trio wraps errors in groups: show the user's, not a tree
        raise _first_gossip_error(exc) or exc from None


def fetch_blob(home: Path, peer_addr: str, sha256: str, timeout: float = 60.0) -> bytes:
    """The bytes whose sha256 is `sha256`, fetched once from the peer at `peer_addr` (a full
    multiaddr), e.g. a campaign file a bootstrap serves. Listens on loopback only while it asks;
    raises GossipError when the peer cannot be reached or does not hold them."""
    import trio

    from node.gossip import protocols
    from node.gossip.addresses import parse_multiaddr
    from node.identity import load_identity

    peer = parse_multiaddr(peer_addr, need_peer_id=True).get_peer_id()
    logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    config = GossipConfig(home=home, listen="/ip4/127.0.0.1/tcp/0", bootstrap=[peer_addr])
    node = GossipNode(config, load_identity(home), NoFacts())
    found: list[bytes] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node.run)
            asked = 0
            with trio.move_on_after(timeout):
                while not found and asked < 3:  # connected and asked: it does not hold them
                    connected = node.host is not None and any(
                        p.to_base58() == peer for p in node.host.get_connected_peers()
                    )
                    if connected:
                        asked += 1
                        data = await protocols.fetch(node, peer, "version", sha256)
                        if data is not None:
                            found.append(data)
                            break
                    await trio.sleep(0.5)
            nursery.cancel_scope.cancel()

    trio.run(main)
    if not found:
        raise GossipError(
            f"{peer_addr} did not serve {sha256[:16]}: check the address and the hash, and that "
            "the peer runs with that campaign file"
        )
    return found[0]


def _first_gossip_error(exc: BaseException) -> GossipError | None:
    if isinstance(exc, GossipError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        if found := _first_gossip_error(inner):
            return found
    return None


def _print_addrs(addrs: list[str]) -> None:
    for addr in addrs:
        print(addr, flush=True)
    sys.stdout.flush()


def read_status(home: Path) -> dict:
    """What a running node last wrote about itself (peers, counts); GossipError if none."""
    path = Path(home) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise GossipError(
            f"no gossip status in {home}: is `swarm peer --home {home}` running?"
        ) from None
