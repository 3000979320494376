"""The gossip network with real libp2p hosts, each in its own process, on 127.0.0.1 only.

Every wait polls with a generous deadline (two loaded cores); every process is killed at the end,
even when a test fails. `python tests/test_gossip.py hostile ...` runs the hostile peer.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import wait_until

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = "gossip-test"
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
DEADLINE = 60.0  # seconds for anything that takes one or two on an idle machine


def publish_into(home: Path, n: int) -> str:
    """Sign a synthetic result with HOME's key and store it in HOME's ledger; returns its id."""
    from synthetic import publish_synthetic

    return publish_synthetic(home, CAMPAIGN, n)


class Node:
    """One `swarm peer` / `swarm bootstrap` process and its home."""

    def __init__(self, home: Path, args: list[str]) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        (home / "gossip.json").unlink(missing_ok=True)
        self.log = open(home / "node.log", "ab")  # noqa: SIM115  (closed in stop)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "node.cli", *args, "--home", str(home)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)  # fmt: skip
        self.addr = wait_until(self._addr, f"{home.name} to listen")
        self.peer_id = self.addr.rsplit("/", 1)[1]

    def _addr(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.home.name} exited: {(self.home / 'node.log').read_text()[-2000:]}"
            )
        status = self.status()
        return status["addrs"][0] if status and status["addrs"] else None

    def status(self) -> dict | None:
        try:
            return json.loads((self.home / "gossip.json").read_text())
        except (OSError, ValueError):
            return None

    def connected(self) -> set[str]:
        status = self.status()
        return set(status["connected"]) if status else set()

    def results(self) -> set[str]:
        with sqlite3.connect(f"file:{self.home / 'ledger.db'}?mode=ro", uri=True) as conn:
            return {row[0] for row in conn.execute("SELECT id FROM facts WHERE kind = 'result'")}

    def raws(self) -> list[bytes]:
        with sqlite3.connect(f"file:{self.home / 'ledger.db'}?mode=ro", uri=True) as conn:
            return [row[0] for row in conn.execute("SELECT raw FROM facts")]

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def publish(self, n: int) -> str:
        """Write a fact into this node's ledger under its key, as the agent will; it gossips it."""
        return publish_into(self.home, n)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def start(name: str, *args: str, peer: bool = True) -> Node:
        command = (
            ["peer", "--campaign", CAMPAIGN] if peer else ["bootstrap", "--campaign", CAMPAIGN]
        )
        node = Node(tmp_path / name, [*command, "--listen", LOOPBACK, *args])
        nodes.append(node)
        return node

    try:
        yield start
    finally:
        for node in nodes:
            node.stop()


def _missing_versions(node: Node) -> int:
    with sqlite3.connect(f"file:{node.home / 'ledger.db'}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT COUNT(*) FROM results r LEFT JOIN versions v "
                            "ON v.sha256 = r.child WHERE v.sha256 IS NULL").fetchone()[0]  # fmt: skip


def _all_hold(nodes: list[Node], facts: set[str]) -> bool:
    return all(facts <= node.results() for node in nodes)


@pytest.mark.slow
def test_every_fact_published_by_any_node_reaches_every_ledger(swarm) -> None:
    boot = swarm("boot", peer=False)
    nodes = [swarm(f"n{i}", "--bootstrap", boot.addr) for i in range(5)]
    everyone = [boot, *nodes]
    wait_until(lambda: all(boot.peer_id in n.connected() for n in nodes), "nodes to reach boot")
    for n in (1, 2, 3):  # each node's worker publishes into its ledger; its network gossips
        for node in nodes:
            node.publish(n)
    wait_until(lambda: all(len(n.results()) >= 15 for n in everyone), "15 results in every ledger")
    published = set().union(*(n.results() for n in everyone))
    assert len(published) == 15 and all(n.results() == published for n in everyone)
    # The train.py each result names travels by hash: every node fetched every version.
    wait_until(lambda: not any(_missing_versions(n) for n in nodes), "versions fetched by hash")
    # Peer exchange: each node found the others, not only the bootstrap.
    peer_ids = {n.peer_id for n in nodes}
    wait_until(
        lambda: all(len(n.connected() & peer_ids) >= 3 for n in nodes), "peers beyond the bootstrap"
    )
    for node in everyone:
        assert node.status()["counts"]["rejected"] == 0


@pytest.mark.slow
def test_bootstrap_can_vanish_and_a_restarted_node_rejoins_through_any_peer(swarm) -> None:
    boot = swarm("boot", peer=False)
    a, b, c = (swarm(name, "--bootstrap", boot.addr) for name in "abc")
    ids = {a.peer_id, b.peer_id, c.peer_id}
    wait_until(lambda: all(ids - {n.peer_id} <= n.connected() for n in (a, b, c)), "peers to meet")
    boot.stop()
    first = {a.publish(1), b.publish(1)}
    wait_until(lambda: _all_hold([a, b, c], first), "facts to flow without the bootstrap")

    c.stop()
    while_down = {a.publish(2)}
    c_again = swarm("c", "--bootstrap", b.addr)  # the same home: same key, same ledger
    assert c_again.peer_id == c.peer_id
    wait_until(
        lambda: {a.peer_id, b.peer_id} <= c_again.connected(), "the restarted node to rejoin"
    )
    after = {b.publish(2)}
    wait_until(lambda: _all_hold([a, b, c_again], first | while_down | after),
               "the restarted node to catch up and hear new facts")  # fmt: skip


@pytest.mark.slow
def test_a_late_joiner_holds_every_earlier_fact_after_sync(swarm, tmp_path: Path) -> None:
    # Facts stored before e0 started were never gossiped: only sync can carry them.
    offline = {publish_into(tmp_path / "e0", n) for n in (1, 2, 3)}
    boot = swarm("boot", peer=False)
    early = [swarm(f"e{i}", "--bootstrap", boot.addr) for i in range(2)]
    wait_until(lambda: all(boot.peer_id in n.connected() for n in early), "nodes to reach boot")
    for n in (4, 5, 6):
        for node in early:
            node.publish(n)
    wait_until(
        lambda: all(len(n.results()) >= 9 for n in early), "the early nodes to exchange 9 results"
    )
    before = set().union(*(n.results() for n in early))
    assert offline < before
    late = swarm("late", "--bootstrap", early[1].addr)
    wait_until(lambda: before <= late.results(), "the late joiner to sync every earlier fact")
    wait_until(
        lambda: late.status()["counts"]["synced"] >= len(offline), "the count of synced facts"
    )


def test_a_large_version_is_fetched_by_hash_in_chunks_after_sync(swarm, tmp_path: Path) -> None:
    from node import wire
    from node.identity import load_identity
    from node.ledger import Ledger

    big = b"".join(b"# line %d of a large train.py\n" % i for i in range(100_000))  # ~3 MB
    assert len(big) > 2 * (1 << 20)
    home = tmp_path / "a"
    home.mkdir()
    with Ledger(home / "ledger.db", campaign=CAMPAIGN) as ledger:
        child = ledger.add_version(big)
        body = wire.result_body(parent="0" * 64, child=child, diff=b"big", description="big",
                                profile="test", harness="1" * 64, seed=1, outcome="discard",
                                metrics={"val_bpb": 1.0})  # fmt: skip
        ledger.publish(load_identity(home), "result", body)
    a = swarm("a")
    b = swarm("b", "--bootstrap", a.addr)

    def fetched() -> bytes | None:
        with sqlite3.connect(f"file:{b.home / 'ledger.db'}?mode=ro", uri=True) as conn:
            row = conn.execute("SELECT source FROM versions WHERE sha256 = ?", (child,)).fetchone()
        return row[0] if row else None

    assert wait_until(fetched, "the 3 MB version to arrive") == big


@pytest.mark.slow
def test_a_hostile_peer_is_dropped_and_harms_no_one(swarm, tmp_path: Path) -> None:
    boot = swarm("boot", peer=False)
    a, b = (swarm(name, "--bootstrap", boot.addr) for name in "ab")
    wait_until(lambda: {b.peer_id} <= a.connected(), "a and b to meet")
    good = {a.publish(1)}
    wait_until(lambda: _all_hold([boot, a, b], good), "a first fact to spread")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = open(tmp_path / "hostile.log", "wb")  # noqa: SIM115
    hostile = subprocess.Popen([sys.executable, __file__, "hostile", CAMPAIGN, a.addr, b.addr],
                               stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)  # fmt: skip
    try:
        out = tmp_path / "hostile.log"
        hostile_id = wait_until(lambda: _hostile_line(out, "peer "), "the hostile peer to start")
        junker_id = wait_until(lambda: _hostile_line(out, "junker "), "the junk sender to start")
        wait_until(lambda: _hostile_line(out, "done"), "the hostile peer to finish", timeout=120)
        for node in (a, b):
            wait_until(lambda n=node: {hostile_id, junker_id} <= set(n.status()["banned"]),
                       f"{node.home.name} to ban both")  # fmt: skip
            wait_until(
                lambda n=node: hostile_id not in n.connected(), f"{node.home.name} to drop it"
            )
            assert node.proc.poll() is None
            counts = node.status()["counts"]
            assert counts["junk"] >= 1 and counts["rejected"] >= 1
            assert node.rss_mib() < 400
        # The flood arrives at once on a stream of its own: over the rate wherever it lands.
        assert sum(n.status()["counts"]["rate_limited"] for n in (a, b)) >= 1
        assert sum(n.status()["counts"]["rejected"] for n in (a, b)) >= 13
        after = {a.publish(2), b.publish(2)}
        wait_until(lambda: _all_hold([boot, a, b], good | after), "facts to flow after the attack")
        from node import wire

        for node in (boot, a, b):  # nothing invalid was stored, whoever sent it
            assert all(isinstance(wire.decode(raw, CAMPAIGN), wire.Fact) for raw in node.raws())
    finally:
        hostile.send_signal(signal.SIGKILL)
        hostile.wait(timeout=10)
        log.close()


def _hostile_line(path: Path, prefix: str) -> str | None:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip() or "yes"
    return None


# ---------------------------------------------------------------- the hostile peer (own process)


def _hostile(campaign: str, targets: list[str]) -> None:
    """Junk frames (from a second key), forged signatures, oversized messages, then a flood."""
    import multiaddr
    import trio
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
    from libp2p.pubsub.pb import rpc_pb2
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
    from libp2p.tools.anyio_service import background_trio_service
    from libp2p.utils.varint import encode_uvarint
    from synthetic import synthetic_result

    from node import wire
    from node.gossip import topic_for
    from node.identity import Identity

    me = Identity.generate()
    topic = topic_for(campaign)

    async def main() -> None:
        host = new_host(key_pair=create_new_key_pair(me.seed), muxer_preference="YAMUX")
        router = GossipSub(protocols=[PROTOCOL_ID_V11, PROTOCOL_ID], degree=6, degree_low=4,
                           degree_high=12, heartbeat_interval=1, adaptive_gossip_enabled=False,
                           spam_protection_enabled=False)  # fmt: skip
        pubsub = Pubsub(host, router, strict_signing=True)
        infos = [info_from_p2p_addr(multiaddr.Multiaddr(t)) for t in targets]
        async with host.run(listen_addrs=[multiaddr.Multiaddr(LOOPBACK)]):
            async with background_trio_service(pubsub), background_trio_service(router):
                await pubsub.wait_until_ready()
                print("peer", me.peer_id, flush=True)
                await junker()
                for info in infos:
                    await host.connect(info)
                await pubsub.subscribe(topic)
                await trio.sleep(3)  # let the mesh form
                for seq in range(1, 6):  # forged: the signature does not match the fact
                    fact = wire.sign(me, "result", campaign, seq, synthetic_result(seq)[0])
                    forged = fact.raw.replace(fact.sig, bytes([fact.sig[0] ^ 1]) + fact.sig[1:])
                    await _try(pubsub.publish(topic, forged))
                for _ in range(5):  # the libp2p signature of the message itself is wrong
                    msg = rpc_pb2.Message(data=b"x", topicIDs=[topic], from_id=pubsub.my_id.to_bytes(),
                                          seqno=os.urandom(8), signature=os.urandom(64))  # fmt: skip
                    await _try(router.publish(pubsub.my_id, msg))
                for _ in range(3):  # oversized
                    await _try(pubsub.publish(topic, b"\x00" * (300 << 10)))
                # A flood of valid, properly signed facts, 100 to a frame on a stream of our
                # own: they arrive at once however slow the machine is, far over any fair rate.
                key = create_new_key_pair(me.seed)
                facts = [wire.sign(me, "result", campaign, seq, synthetic_result(seq)[0]).raw
                         for seq in range(6, 606)]  # fmt: skip
                frames = [rpc_pb2.RPC(publish=[_signed_msg(key, pubsub, topic, raw)
                                               for raw in facts[i : i + 100]]).SerializeToString()
                          for i in range(0, len(facts), 100)]  # fmt: skip
                for info in infos:
                    stream = await host.new_stream(info.peer_id, [PROTOCOL_ID_V11])
                    for frame in frames:
                        await _try(stream.write(encode_uvarint(len(frame)) + frame))
                await trio.sleep(2)
                print("done", flush=True)
                await trio.sleep_forever()

    def _signed_msg(key, pubsub, topic: str, data: bytes):
        msg = rpc_pb2.Message(data=data, topicIDs=[topic], from_id=pubsub.my_id.to_bytes(),
                              seqno=os.urandom(8))  # fmt: skip
        msg.signature = key.private_key.sign(
            PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString()
        )
        msg.key = key.public_key.serialize()
        return msg

    async def junker() -> None:
        """A second peer that sends frames which are not protobuf (DecodeError in 0.8.1)."""
        other = Identity.generate()
        host = new_host(key_pair=create_new_key_pair(other.seed), muxer_preference="YAMUX")
        async with host.run(listen_addrs=[multiaddr.Multiaddr(LOOPBACK)]):
            print("junker", other.peer_id, flush=True)
            for info in [info_from_p2p_addr(multiaddr.Multiaddr(t)) for t in targets]:
                await _try(host.connect(info))
                huge = os.urandom(600 << 10)  # over the node's 512 KiB frame limit
                await _try(_send_raw(host, info.peer_id, PROTOCOL_ID_V11, huge))
                for _ in range(2):
                    junk = b"\x0a\xff\xff\xff\xff\x0f" + os.urandom(64)
                    await _try(_send_raw(host, info.peer_id, PROTOCOL_ID_V11, junk))
            await trio.sleep(1)

    async def _send_raw(host, peer_id, protocol, data: bytes) -> None:
        stream = await host.new_stream(peer_id, [protocol])
        await stream.write(encode_uvarint(len(data)) + data)

    async def _try(coro) -> None:
        try:
            await coro
        except Exception as exc:  # the node may drop us at any point: that is the point
            print("send failed:", type(exc).__name__, flush=True)

    trio.run(main)


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "hostile":
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
    _hostile(sys.argv[2], sys.argv[3:])
