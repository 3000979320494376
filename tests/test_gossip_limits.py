"""The gossip layer's own limits, without a network: rate buckets, penalties, bans, backoff, frames."""

from __future__ import annotations

import pytest
from conftest import BASELINE, CAMPAIGN, make_result
from libp2p.utils.varint import encode_uvarint

from node.gossip.frames import FrameError, pack, unpack
from node.gossip.limits import HandshakeGate, Limits, PeerBook
from node.ledger import Ledger


def test_a_peer_over_its_rate_is_refused_after_the_burst() -> None:
    book = PeerBook(Limits(rate=1.0, burst=5.0))
    allowed = [book.allow_message("flooder") for _ in range(20)]
    assert allowed[:5] == [True] * 5 and not any(allowed[6:])
    assert book.allow_message("someone-else")


def test_penalty_points_lead_to_a_ban_that_is_reported() -> None:
    book = PeerBook(Limits(ban_score=3.0))
    assert not book.penalise("bad", 1.0) and not book.penalise("bad", 1.0)
    assert book.penalise("bad", 1.0)
    assert book.is_banned("bad") and book.banned() == ["bad"]
    assert "bad" not in book.candidates(set())


def test_the_mesh_ranks_a_peer_that_delivered_valid_facts_over_fresh_keys_and_a_banned_one_last():
    book = PeerBook(Limits(ban_score=2.0))
    for _ in range(3):
        book.count_delivery("honest")
    book.count_delivery("banned")
    book.penalise("banned", 5.0)
    assert book.mesh_score("honest") == 2.0  # log2(1 + 3)
    assert book.mesh_score("fresh") == 0.0  # never heard of: no entry made for it either
    assert "fresh" not in book.banned() and len(book) == 2
    assert book.mesh_score("banned") < book.mesh_score("fresh") < book.mesh_score("honest")


def test_failed_dials_back_off_and_a_success_resets_the_backoff() -> None:
    book = PeerBook(Limits())
    book.add("p", ["/ip4/127.0.0.1/tcp/1"])
    assert book.candidates(set()) == ["p"]
    book.dialed("p", ok=False)
    assert book.candidates(set()) == []
    book.dialed("p", ok=True)
    assert book.candidates(set()) == ["p"]


def test_the_peer_book_stays_bounded_and_keeps_bootstraps() -> None:
    book = PeerBook(Limits(max_known=10, max_addrs=2))
    book.add("boot", ["/ip4/127.0.0.1/tcp/1"], bootstrap=True)
    for i in range(100):
        book.add(f"p{i}", [f"/ip4/127.0.0.1/tcp/{i}" for _ in range(5)] + ["/ip4/127.0.0.1/tcp/9"])
    assert len(book) <= 10 and book.addrs("boot")
    assert all(len(book.addrs(f"p{i}")) <= 2 for i in range(100))


def test_a_peer_may_hold_only_a_few_streams_and_syncs_are_spaced() -> None:
    book = PeerBook(Limits(max_streams=2, sync_gap=60.0))
    assert book.open_stream("p", "sync") and book.open_stream("p", "sync")
    assert not book.open_stream("p", "sync") and book.open_stream("p", "fetch")
    book.close_stream("p", "sync")
    assert book.open_stream("p", "sync")
    assert book.sync_due("p") and not book.sync_due("p") and book.sync_due("q")


@pytest.mark.parametrize("junk", [b"\xc1", b"\x92\x01", b"\xdb\xff\xff\xff\xff"])
def test_a_frame_that_is_not_msgpack_is_a_frame_error(junk: bytes) -> None:
    with pytest.raises(FrameError):
        unpack(junk)
    assert unpack(pack({"authors": {b"k" * 32: 3}})) == {"authors": {b"k" * 32: 3}}


def test_one_authors_many_facts_cannot_crowd_others_out_of_a_sync_answer(tmp_path, alice, bob):
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        book.ingest_many(
            [make_result(alice, seq, BASELINE, "11" * 32, 1.0).raw for seq in range(1, 51)]
        )
        honest = [make_result(bob, seq, BASELINE, "22" * 32, 1.0).raw for seq in (1, 2, 3)]
        book.ingest_many(honest)
        answer = list(book.facts_missing_from({}, per_author=10))
        assert len(answer) == 13 and set(honest) <= set(answer)
        # The peer asks again from where it holds everything: the flood continues, 10 at a time.
        again = list(book.facts_missing_from({alice.public_key: 10, bob.public_key: 3}, 10))
        assert len(again) == 10 and not set(again) & set(answer)


def test_the_handshake_gate_refuses_a_full_address_and_cuts_the_heaviest_for_a_newcomer() -> None:
    gate = HandshakeGate(Limits(max_pending=4, max_pending_per_ip=3))
    assert gate.admit(1, "honest") == (True, [])
    assert [gate.admit(t, "flood") for t in (2, 3, 4)] == [(True, [])] * 3
    assert gate.admit(5, "flood") == (False, [])  # its own address is full: refused
    assert gate.admit(6, "other") == (True, [2])  # all are full: the heaviest address pays
    assert gate.admit(7, "newcomer") == (True, [3])
    assert gate.admit(8, "flood") == (True, [1])  # now the heaviest is any; the oldest goes
    gate.done(4)
    gate.done(8)
    assert len(gate) == 2


def test_the_library_internals_the_gossip_guards_override_or_call_are_still_there():
    """`GuardedPubsub` overrides and calls private members of py-libp2p's Pubsub (the library
    offers no public hook for a junk frame, a banned peer's relayed message or a peer it tears
    down), and the node wraps its swarm's raw-connection upgrade: an upgrade of the library that
    renames one fails here, by name, before a node stops guarding silently."""
    import inspect

    from libp2p.network.swarm import Swarm
    from libp2p.pubsub.pubsub import Pubsub

    for name in ("_handle_dead_peer", "_is_msg_seen", "_forget_all_subscriptions",
                 "_teardown_if_connected", "stream_handler", "push_msg"):  # fmt: skip
        assert callable(getattr(Pubsub, name, None)), f"Pubsub.{name} is gone"
    assert list(inspect.signature(Pubsub.push_msg).parameters) == ["self", "msg_forwarder", "msg"]
    for name in ("upgrade_inbound_raw_conn", "set_stream_handler"):
        assert callable(getattr(Swarm, name, None)), f"Swarm.{name} is gone"
    assert "self.common_stream_handler" in inspect.getsource(Swarm.__init__)
    # node/gossip/guards.py replaces these module attributes: each must still be what is read
    from libp2p.protocol_muxer import multiselect_communicator
    from libp2p.pubsub import pubsub as pubsub_module
    from libp2p.stream_muxer.yamux import yamux

    assert "read_varint_prefixed_bytes_limited(" in inspect.getsource(pubsub_module)
    assert "read_delim(" in inspect.getsource(multiselect_communicator)
    assert "MAX_WINDOW_SIZE" in inspect.getsource(yamux.Yamux)


class _Stream:
    """A libp2p stream stand-in: reads serve `answer`, then end; writes are kept."""

    def __init__(self, answer: bytes) -> None:
        self.unread, self.written, self.was_reset = bytearray(answer), [], False

    async def read(self, n: int = -1) -> bytes:
        n = len(self.unread) if n < 0 else n
        chunk = bytes(self.unread[:n])
        del self.unread[:n]
        return chunk

    async def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    async def close(self) -> None:
        pass

    async def reset(self) -> None:
        self.was_reset = True


class _Asker:
    """What `protocols.fetch` and `protocols.sync_with` use of a node: its limits, its facts'
    holdings, its exchanges under way, and the two ways a peer's answer is charged."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.limits, self.charged, self.counts = Limits(), [], {"synced": 0}
        self.config = SimpleNamespace(campaign=CAMPAIGN)
        self.facts = SimpleNamespace(holdings=dict)
        self.asking: set[tuple[str, str]] = set()

    def bad_fetch(self, peer: str, what: str) -> None:
        self.charged.append(("bad_fetch", what))

    def bad_answer(self, peer: str, what: str) -> None:
        self.charged.append(("bad_answer", what))


def _frame(body: bytes) -> bytes:
    return encode_uvarint(len(body)) + body


@pytest.mark.parametrize(
    "answer, charged",
    [
        (_frame(b"\xc1\xc1 not msgpack"), True),
        (_frame(pack([1, 2, 3])), True),  # a list, not a map
        (_frame(pack({"size": 10})), True),  # a map of no known shape
        (_frame(pack({"data": b"x" * 10, "size": 1 << 40})), True),  # out of bounds
        (encode_uvarint(3 << 20), True),  # a frame announced over the 2 MiB limit
        (_frame(pack({"error": "not found"})), False),  # the peer has it not: no fault
        (b"", False),  # the peer went away
        (_frame(pack({"data": b"x" * 10, "size": 20})), False),  # cut short: gone, not lying
    ],
    ids=[
        "not-msgpack",
        "a-list",
        "no-shape",
        "out-of-bounds",
        "over-limit",
        "not-found",
        "gone",
        "cut-short",
    ],  # fmt: skip
)
def test_a_fetch_answer_no_honest_peer_sends_is_charged_and_one_that_ends_early_is_not(
    monkeypatch, answer, charged
) -> None:
    import trio

    from node.gossip import protocols

    node, stream = _Asker(), _Stream(answer)

    async def opened(*_):
        return stream

    monkeypatch.setattr(protocols, "_open", opened)
    assert trio.run(protocols.fetch, node, "peer", "version", "ab" * 32) is None
    assert [why for why, _ in node.charged] == (["bad_fetch"] if charged else [])


@pytest.mark.parametrize(
    "answer, charged",
    [
        (_frame(pack([1, 2])), True),  # the first answer must be a map
        (_frame(b"\xc1"), True),
        (_frame(pack({"want": []})) + _frame(pack({"not": "a list"})), True),
        (_frame(pack({"want": []})) + _frame(pack([])), False),  # nothing to send: fine
        (b"", False),
    ],
    ids=["a-list", "not-msgpack", "batch-not-a-list", "nothing-to-send", "gone"],
)
def test_a_sync_answer_no_honest_peer_sends_is_charged(monkeypatch, answer, charged) -> None:
    import trio

    from node.gossip import protocols

    node, stream = _Asker(), _Stream(answer)

    async def opened(*_):
        return stream

    monkeypatch.setattr(protocols, "_open", opened)
    assert trio.run(protocols.sync_with, node, "peer") == 0
    assert [why for why, _ in node.charged] == (["bad_answer"] if charged else [])


def test_over_the_peer_cap_the_node_closes_a_banned_peer_then_the_one_that_delivered_least():
    book = PeerBook(Limits(max_peers=3, ban_score=1.0))
    connected = {"bootstrap", "honest", "quiet-1", "quiet-2"}
    for _ in range(5):
        book.count_delivery("honest")
    # Before, the first peer of the set went, whoever it was: often the honest one.
    assert book.to_disconnect(connected, keep={"bootstrap"}) == "quiet-1"
    assert book.to_disconnect(connected - {"quiet-1"}, keep={"bootstrap"}) is None  # at the cap
    book.penalise("honest", 1.0)
    assert book.to_disconnect(connected - {"quiet-1"}, keep={"bootstrap"}) == "honest"  # banned
    assert book.to_disconnect({"bootstrap", "a", "b", "c"}, keep={"bootstrap"}) != "bootstrap"


def test_a_peer_that_served_bad_bytes_is_the_last_the_book_forgets():
    book = PeerBook(Limits(max_known=3))
    book.add("liar", ["/ip4/127.0.0.1/tcp/1"])
    book.mark_bad_source("liar")
    for n in range(10):  # each newcomer past 3 forgets one peer: never the liar while others last
        book.add(f"peer-{n}", [f"/ip4/127.0.0.1/tcp/{n + 2}"])
    assert book.is_bad_source("liar")
