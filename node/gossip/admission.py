"""Who may connect and open streams: inbound handshakes gated by address, count and time, and a
cap on the streams one connection holds open at once (py-libp2p 0.8.1 has none of these)."""

from __future__ import annotations

import contextvars
import math
from typing import TYPE_CHECKING, Any

import trio
from libp2p.network.exceptions import SwarmException

from node.gossip import frames

if TYPE_CHECKING:
    from node.gossip.peer import GossipNode

# The inbound handshake running in this task, as a callback that ends it once authenticated.
_HANDSHAKE: contextvars.ContextVar[Any] = contextvars.ContextVar("handshake", default=None)


def remote_ip(conn: Any) -> str:
    """The remote IP address of a raw or muxed connection, "?" if it has none."""
    try:
        return str(conn.get_remote_address()[0])
    except Exception:
        return "?"


def capped_streams(node: GossipNode, handler: Any) -> Any:
    """The host's handler of inbound streams, refusing those over `max_conn_streams` open
    at once on one connection (0.8.1 has no such cap: one handshake bought 128 streams)."""
    open_streams: dict[int, int] = {}  # id of a muxed connection -> its streams open now

    async def run(stream: Any) -> None:
        conn = stream.muxed_conn
        key = id(conn)
        if open_streams.get(key, 0) >= node.limits.max_conn_streams:
            node.refuse_stream(
                conn.peer_id.to_base58(), "one connection", node.limits.max_conn_streams
            )
            await frames.reset(stream)
            return
        open_streams[key] = open_streams.get(key, 0) + 1
        most = node.counts["streams_open_most"]
        node.counts["streams_open_most"] = max(most, open_streams[key])
        try:
            await handler(stream)
        finally:
            open_streams[key] -= 1
            if not open_streams[key]:
                del open_streams[key]

    return run


def gated_handshakes(node: GossipNode, network: Any) -> Any:
    """The swarm's inbound handshake (Noise, then Yamux), refused when its address holds too
    many connections or handshakes, cut after `handshake_seconds` or when `HandshakeGate`
    makes room for a newcomer."""
    upgrade, add_conn = network.upgrade_inbound_raw_conn, network.add_conn
    scopes: dict[int, trio.CancelScope] = {}
    cut_by_gate: set[int] = set()

    async def add_authenticated(muxed_conn: Any, *args: Any, **kwargs: Any) -> Any:
        # Noise and Yamux are done: no longer a pending handshake, never cut as one.
        if (finish := _HANDSHAKE.get()) is not None:
            finish()
        return await add_conn(muxed_conn, *args, **kwargs)

    network.add_conn = add_authenticated

    def full(address: str, mine: Any = None) -> bool:
        # The swarm lists a connection before its upgrade returns, in order: `mine` counts
        # only those listed before it, so that of several at once the last ones go.
        up = 0
        for conn in network.get_connections():
            if conn.muxed_conn is mine:
                break
            up += remote_ip(conn.muxed_conn) == address
        if up < node.limits.max_conns_per_ip:
            return False
        node.counts["connections_refused"] += 1
        return True

    async def run(raw_conn: Any, maddr: Any) -> Any:
        address = remote_ip(raw_conn)
        if full(address):  # before the handshake's cost, and again once it is done
            raise SwarmException(f"{address} holds its share of connections already")
        scope = trio.CancelScope(deadline=trio.current_time() + node.limits.handshake_seconds)
        ticket = id(scope)
        admitted, cut = node.gate.admit(ticket, address)
        if not admitted:
            node.counts["handshakes_refused"] += 1
            raise SwarmException(f"{address} has too many inbound handshakes pending")
        for old in cut:
            node.counts["handshakes_cut"] += 1
            if (old_scope := scopes.pop(old, None)) is not None:
                cut_by_gate.add(old)
                old_scope.cancel()
        scopes[ticket] = scope

        def finish() -> None:
            scope.deadline = math.inf
            scopes.pop(ticket, None)
            node.gate.done(ticket)

        token = _HANDSHAKE.set(finish)
        try:
            with scope:
                muxed = await upgrade(raw_conn, maddr)
                if not full(address, mine=muxed):
                    return muxed
                await muxed.close()
                raise SwarmException(f"{address} holds its share of connections already")
        finally:
            _HANDSHAKE.reset(token)
            finish()
        if ticket in cut_by_gate:  # counted as cut when it was
            cut_by_gate.discard(ticket)
        else:
            node.counts["handshakes_timed_out"] += 1
        raise SwarmException(f"inbound handshake from {address} cut short")

    return run
