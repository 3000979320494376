"""Addresses and the host's life: the campaign's topic, multiaddrs a user typed or a host bound,
a port another process holds, why a dial failed, and a finished host's release."""

from __future__ import annotations

import socket
from typing import Any

import multiaddr

from node.errors import SwarmError


class GossipError(SwarmError):
    """A gossip setting that cannot work: a bad multiaddr, a port in use, a missing campaign."""


def topic_for(campaign: str) -> str:
    """The GossipSub topic that carries one campaign's facts."""
    return f"/research-swarm/{campaign}/facts/1"


def parse_multiaddr(text: str, need_peer_id: bool = False) -> multiaddr.Multiaddr:
    try:
        addr = multiaddr.Multiaddr(text)
    except Exception as exc:
        raise GossipError(
            f"{text!r} is not a multiaddr ({exc}); e.g. /ip4/127.0.0.1/tcp/4001"
        ) from None
    if need_peer_id and "/p2p/" not in text:
        raise GossipError(f"{text!r} lacks /p2p/<peer id>: copy the full address the peer printed")
    return addr


def check_port_free(listen: str) -> None:
    """GossipError if another process listens on this TCP port. libp2p sets SO_REUSEPORT, so a
    second node on the same port would silently take half of the first one's connections."""
    addr = parse_multiaddr(listen)
    try:
        port = int(addr.value_for_protocol("tcp"))
        ip = addr.value_for_protocol("ip4")
    except Exception:
        return  # not ip4/tcp: let libp2p judge it
    if not port:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((ip, port))
        except OSError as exc:
            raise GossipError(
                f"cannot listen on {listen}: {exc.strerror}; pick another port"
            ) from None


def dialable_addrs(addrs: list[str], peer_id: str) -> list[str]:
    """Full multiaddrs others can dial: 0.0.0.0 becomes loopback and this host's own IPv4s."""
    ips = ["127.0.0.1"]
    try:
        ips += [ip for ip in socket.gethostbyname_ex(socket.gethostname())[2] if ip not in ips]
    except OSError:
        pass
    out: list[str] = []
    for addr in addrs:
        base = addr.split("/p2p/")[0]
        for concrete in ([base.replace("/ip4/0.0.0.0/", f"/ip4/{ip}/") for ip in ips]
                         if "/ip4/0.0.0.0/" in base else [base]):  # fmt: skip
            if f"{concrete}/p2p/{peer_id}" not in out:
                out.append(f"{concrete}/p2p/{peer_id}")
    return out


def dial_failure(exc: BaseException) -> str:
    """Why a dial failed, in a user's words: nothing there, or a peer other than the one named."""
    seen, todo = [], [exc]
    while todo:  # libp2p nests the causes in groups
        e = todo.pop()
        seen.append(str(e))
        todo += [*getattr(e, "exceptions", ()), *([e.__cause__] if e.__cause__ else [])]
    if any("upgrade security" in text or "handshake" in text for text in seen):
        return "a peer answers there, but not with the peer id after /p2p/"
    return "nothing answers there"


def bound_to(listen: multiaddr.Multiaddr, bound: Any) -> multiaddr.Multiaddr:
    """`listen` with the port the system gave it when it asked for port 0."""
    try:
        if int(listen.value_for_protocol("tcp")) != 0:
            return listen
        for addr in bound:
            port = int(multiaddr.Multiaddr(str(addr).split("/p2p/")[0]).value_for_protocol("tcp"))
            return multiaddr.Multiaddr(str(listen).replace("/tcp/0", f"/tcp/{port}", 1))
    except Exception:
        pass
    return listen


async def release(host: Any) -> None:
    """Close a finished host's listeners and connections. The library's own shutdown awaits
    inside a cancelled scope and stops at its first await, leaving the listener open: the
    printed address then accepted dials that went nowhere, and a host started on the same port
    stacked a second listener beside it (SO_REUSEPORT)."""
    network = host.get_network()
    for listener in list(network.listeners.values()):
        try:
            await listener.close()
        except Exception:
            pass
    network.listeners.clear()
    for conns in list(network.connections.values()):
        for conn in list(conns) if isinstance(conns, list) else [conns]:
            try:
                await conn.close()
            except Exception:
                pass
