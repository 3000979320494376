"""The gossip node without a swarm: supervision, addresses, and one-line errors for bad settings."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import trio
from conftest import BASELINE, CAMPAIGN, make_result
from libp2p.peer.id import ID

from node.gossip import GossipConfig, GossipError, GossipNode, read_status
from node.gossip.addresses import check_port_free, dialable_addrs
from node.gossip.limits import Limits
from node.identity import Identity
from node.ledger import Ledger
from node.network import LedgerFacts
from node.network import run as run_network

ROOT = Path(__file__).resolve().parents[1]
PEER = "12D3KooWQizHGzpUEhtfYvotZT3KSMG6GDcgsYpj6FaDjifC6y3y"


def test_a_host_that_dies_is_restarted_with_the_same_ledger_and_peer_book(tmp_path: Path) -> None:
    # A real host on loopback whose first life dies of an error nobody caught, after it learned
    # a peer and stored a fact; the supervisor starts a second, real host, which must listen
    # where the first did and start from what the first knew.
    learned = PEER
    with Ledger(tmp_path / "ledger.db", campaign="c") as ledger:
        node = GossipNode(GossipConfig(home=tmp_path, listen="/ip4/127.0.0.1/tcp/0"),
                          Identity.generate(), LedgerFacts(ledger))  # fmt: skip
        lives: list[dict] = []

        async def main() -> None:
            with trio.move_on_after(60) as scope:

                async def maintain() -> None:  # started by each life once its host listens
                    lives.append({"host": node.host, "addrs": list(node.addrs),
                                  "knows": node.book.addrs(learned), "ledger": node.facts.ledger,
                                  "fact": node.facts.version(hashlib.sha256(b"fact").hexdigest())})  # fmt: skip
                    if len(lives) == 1:
                        node.book.add(learned, ["/ip4/127.0.0.1/tcp/7"])
                        node.facts.add_version(b"fact", hashlib.sha256(b"fact").hexdigest())
                        raise RuntimeError("DecodeError escaped somewhere")
                    scope.cancel()

                node._maintain = maintain  # type: ignore[method-assign]
                await node.run()

        trio.run(main)
    first, second = lives
    assert node.counts["restarts"] == 1
    assert second["host"] is not first["host"] and second["addrs"] == first["addrs"]
    assert first["knows"] == [] and second["knows"] == ["/ip4/127.0.0.1/tcp/7"]
    assert first["fact"] is None and second["fact"] == b"fact" and second["ledger"] is ledger


def test_a_host_that_never_comes_up_is_a_gossip_error(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.db", campaign="c") as ledger:
        node = GossipNode(GossipConfig(home=tmp_path), Identity.generate(), LedgerFacts(ledger))

        async def host_that_cannot_listen() -> None:
            raise OSError("cannot assign requested address")

        node._run_host = host_that_cannot_listen  # type: ignore[method-assign]
        try:
            trio.run(node.run)
        except GossipError as exc:
            assert "cannot listen" in str(exc)
        else:
            raise AssertionError("no GossipError")


def test_a_port_another_process_holds_is_refused_despite_reuseport() -> None:
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        try:
            check_port_free(f"/ip4/127.0.0.1/tcp/{port}")
        except GossipError as exc:
            assert "in use" in str(exc)
        else:
            raise AssertionError("no GossipError")
    check_port_free("/ip4/127.0.0.1/tcp/0")


def test_wildcard_listen_addresses_are_announced_as_dialable_ones() -> None:
    addrs = dialable_addrs(["/ip4/0.0.0.0/tcp/4001"], PEER)
    assert f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}" in addrs
    assert not any("0.0.0.0" in a for a in addrs)
    assert dialable_addrs([f"/ip4/10.0.0.2/tcp/5/p2p/{PEER}"], PEER) == [
        f"/ip4/10.0.0.2/tcp/5/p2p/{PEER}"
    ]


def _swarm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)  # fmt: skip


def test_bad_addresses_are_one_line_errors(tmp_path: Path) -> None:
    bad_listen = _swarm(
        "bootstrap", "--listen", "/ip4/127.0.0.1/tcp/notaport", "--home", str(tmp_path)
    )
    no_peer_id = _swarm("peer", "--campaign", "c", "--bootstrap", "/ip4/127.0.0.1/tcp/1",
                        "--listen", "/ip4/127.0.0.1/tcp/0", "--home", str(tmp_path))  # fmt: skip
    bad_campaign = _swarm("peer", "--campaign", "two words", "--listen", "/ip4/127.0.0.1/tcp/0",
                          "--home", str(tmp_path))  # fmt: skip
    for run, words in ((bad_listen, "not a multiaddr"), (no_peer_id, "lacks /p2p/"),
                       (bad_campaign, "not a campaign name")):  # fmt: skip
        assert run.returncode == 1, run.stderr
        assert words in run.stderr and "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) <= 2  # rich may wrap one long line


def test_peers_without_a_running_node_says_what_to_run(tmp_path: Path) -> None:
    run = _swarm("peers", "--home", str(tmp_path))
    assert run.returncode == 1 and "swarm peer --home" in run.stderr


def test_a_node_runs_in_a_thread_and_stops_when_asked(tmp_path: Path) -> None:
    stop, ready = threading.Event(), []
    config = GossipConfig(home=tmp_path, listen="/ip4/127.0.0.1/tcp/0", campaign="c")
    thread = threading.Thread(target=run_network, args=(config, ready.extend, stop), daemon=True)
    thread.start()
    end = time.monotonic() + 60
    while not (ready and (tmp_path / "gossip.json").exists()) and time.monotonic() < end:
        time.sleep(0.1)
    assert ready[0].startswith("/ip4/127.0.0.1/tcp/") and "/p2p/12D3KooW" in ready[0]
    assert read_status(tmp_path)["addrs"] == ready
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()


def _listening_sockets(port: int) -> int:
    """TCP sockets in LISTEN on `port` in this machine's /proc/net/tcp (SO_REUSEPORT stacks)."""
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return sum(1 for row in rows if int(row[1].split(":")[1], 16) == port and row[3] == "0A")


def _connected(node: GossipNode) -> set[str]:
    return {p.to_base58() for p in node.host.get_connected_peers()} if node.host else set()


def test_a_host_that_dies_comes_back_on_the_printed_address_with_one_listener(
    tmp_path: Path,
) -> None:
    a_home, b_home = tmp_path / "a", tmp_path / "b"
    with Ledger(a_home / "ledger.db", campaign="c") as a_ledger, \
            Ledger(b_home / "ledger.db", campaign="c") as b_ledger:  # fmt: skip
        a = GossipNode(
            GossipConfig(home=a_home, campaign="c"), Identity.generate(), LedgerFacts(a_ledger)
        )
        seen: dict = {}

        async def crash() -> None:
            raise RuntimeError("a library task failed")

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.run)
                await a.printed.wait()
                seen["printed"], first = list(a.addrs), a.host
                a.pubsub.manager.run_task(crash)  # what the KeyError of a teardown race did
                with trio.fail_after(60):
                    while a.host is first or not a.counts["restarts"]:
                        await trio.sleep(0.1)
                    await a.pubsub.wait_until_ready()
                    seen["again"] = list(a.addrs)
                    port = int(seen["printed"][0].split("/tcp/")[1].split("/")[0])
                    seen["listeners"] = _listening_sockets(port)
                    config = GossipConfig(home=b_home, campaign="c", bootstrap=seen["printed"][:1])
                    b = GossipNode(config, Identity.generate(), LedgerFacts(b_ledger))
                    nursery.start_soon(b.run)
                    while a.peer_id not in _connected(b):
                        await trio.sleep(0.1)
                    seen["dialed"] = True
                nursery.cancel_scope.cancel()

        trio.run(main)
    assert a.counts["restarts"] == 1
    assert seen["again"] == seen["printed"]
    assert seen["listeners"] == 1
    assert seen["dialed"]


def _node_with(limits: Limits, homes: list[Path]) -> tuple[GossipNode, list[Ledger]]:
    """A node in the first of `homes` that allows its peers `limits`, and a ledger in each."""
    ledgers = [Ledger(home / "ledger.db", campaign="c") for home in homes]
    config = GossipConfig(home=homes[0], campaign="c", limits=limits)
    return GossipNode(config, Identity.generate(), LedgerFacts(ledgers[0])), ledgers


def _dialer(home: Path, ledger: Ledger, to: GossipNode) -> GossipNode:
    """A node in `home` that dials `to` first."""
    config = GossipConfig(home=home, campaign="c", bootstrap=to.addrs[:1])
    return GossipNode(config, Identity.generate(), LedgerFacts(ledger))


async def _met(home: Path, ledger: Ledger, a: GossipNode, nursery: trio.Nursery) -> GossipNode:
    """A node in `home`, started in `nursery`, once `a` holds it connected and their first
    exchanges are over."""
    b = _dialer(home, ledger, a)
    nursery.start_soon(b.run)
    with trio.fail_after(30):
        while b.peer_id not in _connected(a) or not a.counts["streams_open_most"]:
            await trio.sleep(0.1)
    await trio.sleep(1)
    return b


def _run_beside(a: GossipNode, ledgers: list[Ledger], body: Any) -> None:
    """Run node `a` and, once it printed its address, `await body(nursery)`; then stop them and
    close the `ledgers`."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.run)
            await a.printed.wait()
            await body(nursery)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        for ledger in ledgers:
            ledger.close()


def test_connections_from_one_address_over_the_cap_are_refused(tmp_path: Path) -> None:
    homes = [tmp_path / name for name in "abcd"]
    # a dials no one: all are inbound
    a, ledgers = _node_with(Limits(max_conns_per_ip=2, target_peers=0), homes)
    seen: dict = {}

    async def dial(nursery: trio.Nursery) -> None:
        dialers = []
        for home, ledger in zip(homes[1:], ledgers[1:], strict=True):
            dialers.append(_dialer(home, ledger, a))
            nursery.start_soon(dialers[-1].run)
        with trio.move_on_after(30):
            while a.counts["connections_refused"] < 1 or len(_connected(a)) < 2:
                await trio.sleep(0.1)
        await trio.sleep(2)  # the refused one keeps trying, with backoff
        seen["connected"] = _connected(a)
        seen["dialers"] = {d.peer_id for d in dialers}

    _run_beside(a, ledgers, dial)
    assert a.counts["connections_refused"] >= 1, (a.counts, seen)
    assert len(seen["connected"]) == 2 and seen["connected"] < seen["dialers"]


def test_streams_over_the_connection_cap_are_refused_whatever_their_protocol(
    tmp_path: Path, caplog
) -> None:
    """Every protocol caps a peer at 2 streams of its own (`Limits.max_streams`), so a
    connection never reaches the default cap of 32: here it is 5, and the peer holds 2 streams
    of each of fetch, peer exchange and sync beside its GossipSub stream and whatever its node
    has open besides (an honest start held 4 at once; with the default cap, 6 were open with
    four of the streams below)."""
    from node.gossip.protocols import FETCH, PEERS, SYNC

    caplog.set_level(logging.INFO, logger="swarm.gossip")
    homes = [tmp_path / "a", tmp_path / "b"]
    a, ledgers = _node_with(Limits(max_conn_streams=5, target_peers=0), homes)
    seen: dict = {}

    async def hold_streams(nursery: trio.Nursery) -> None:
        b = await _met(homes[1], ledgers[1], a, nursery)
        seen["before"] = dict(a.counts)
        streams = []
        for protocol in (FETCH, FETCH, PEERS, PEERS, SYNC, SYNC):  # opened, never written to
            with contextlib.suppress(Exception):  # reset by `a` as it agreed the protocol
                streams.append(await b.host.new_stream(ID.from_base58(a.peer_id), [protocol]))
        await trio.sleep(1)
        seen["after"] = dict(a.counts)
        for stream in streams:
            await stream.reset()

    _run_beside(a, ledgers, hold_streams)
    before, after = seen["before"], seen["after"]
    assert after["streams_open_most"] == 5, after  # reached, never passed
    assert after["streams_refused"] > before["streams_refused"], (before, after)
    # its log says which cap, and how many streams it allows
    assert "over the cap of 5 streams open at once (one connection)" in caplog.text


def test_a_node_asking_a_peer_many_times_at_once_opens_one_stream_a_kind_and_is_never_refused(
    tmp_path: Path,
) -> None:
    """A busy peer answers slowly, so the syncs and peer exchanges a node starts on a timer can
    overlap; a third stream of one protocol at once is refused and counted against the asker
    (an honest verifier was once "watched" for it). Asked eight times at once, each kind goes
    once and the rest wait for the next round (without that, 12 of the 16 were refused)."""
    from node.gossip import protocols

    homes = [tmp_path / "a", tmp_path / "b"]
    a, ledgers = _node_with(Limits(target_peers=0), homes)
    seen: dict = {}

    async def ask_at_once(nursery: trio.Nursery) -> None:
        b = await _met(homes[1], ledgers[1], a, nursery)
        seen["before"] = dict(a.counts)
        async with trio.open_nursery() as asks:
            for exchange in [protocols.sync_with, protocols.exchange_peers] * 8:
                asks.start_soon(exchange, b, a.peer_id)
        seen["after"], seen["left"] = dict(a.counts), set(b.asking)

    _run_beside(a, ledgers, ask_at_once)
    before, after = seen["before"], seen["after"]
    assert after["streams_refused"] == before["streams_refused"] == 0, (before, after)
    assert not seen["left"]


def test_one_authors_flood_of_results_leaves_room_for_others_and_missing_versions_are_asked_again(
    tmp_path: Path,
) -> None:
    """A key floods results whose train.py nobody serves: at most `max_wanted_per_author` of
    them wait to be fetched, and another author's version is still asked for. A version left
    out, or given up after its tries, is asked for again from the ledger (`Wanted.refill`), the
    newest first, unless it ran out of tries within `rewant_after`."""
    flooder, honest = Identity.generate(), Identity.generate()
    limits = Limits(max_wanted=100, max_wanted_per_author=8, rewant_every=60.0, rewant_after=3600.0)
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as ledger:
        node = GossipNode(GossipConfig(home=tmp_path, campaign=CAMPAIGN, limits=limits),
                          Identity.generate(), LedgerFacts(ledger))  # fmt: skip
        sources = [f"train.py {k}".encode() for k in range(1, 41)]
        flood = [make_result(flooder, k, BASELINE, hashlib.sha256(source).hexdigest(), 1.4)
                 for k, source in enumerate(sources, 1)]  # fmt: skip
        win = make_result(honest, 1, BASELINE, "ab" * 32, 1.3)
        node.take_in([f.raw for f in [*flood, win]], PEER)
        assert set(node.wanted.queue) == {f.body["child"] for f in flood[:8]} | {"ab" * 32}
        fetched, given_up = flood[0].body["child"], flood[1].body["child"]
        ledger.add_version(sources[0], fetched)
        node.wanted.drop(fetched)
        node.wanted.drop(given_up)
        node.wanted.gave_up[given_up] = time.monotonic()
        node.wanted.refill()  # the flooder's next newest take the two places; the given-up one waits
        wanted = {f.body["child"] for f in flood[2:8]} | {"ab" * 32}
        assert set(node.wanted.queue) == wanted | {f.body["child"] for f in flood[-2:]}
        assert node.wanted.queue[flood[-1].body["child"]] == ([flooder.peer_id], 0)
        assert fetched not in node.wanted.queue and given_up not in node.wanted.queue
        for source, f in zip(sources[2:], flood[2:], strict=True):  # the others arrive
            ledger.add_version(source, f.body["child"])
            node.wanted.drop(f.body["child"])
        node.wanted.refill()
        assert set(node.wanted.queue) == {"ab" * 32}  # room, but the given-up one waits its time
        node.wanted.gave_up[given_up] -= limits.rewant_after
        node.wanted.tick()  # the transport's: not again until rewant_every has passed
        assert given_up not in node.wanted.queue
        node.wanted._refilled -= limits.rewant_every
        node.wanted.tick()
        assert set(node.wanted.queue) == {"ab" * 32, given_up}


def test_the_versions_still_missing_leave_room_for_every_authors(tmp_path: Path) -> None:
    """The ledger's answer to what is still missing, newest first, holds at most `per_author`
    of one author's: a key that floods results after an honest one does not push it out."""
    flooder, honest = Identity.generate(), Identity.generate()
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as ledger:
        win = make_result(honest, 1, BASELINE, "ab" * 32, 1.3)
        flood = [make_result(flooder, k, BASELINE, f"{k:064x}", 1.4) for k in range(1, 21)]
        list(ledger.ingest_many([f.raw for f in [win, *flood]], from_peer=PEER))
        missing = LedgerFacts(ledger).missing_versions(limit=5, per_author=3)
        assert missing == [*((f.body["child"], flooder.peer_id) for f in flood[:-4:-1]),
                           ("ab" * 32, honest.peer_id)]  # fmt: skip
        assert len(LedgerFacts(ledger).missing_versions(limit=2, per_author=3)) == 2
