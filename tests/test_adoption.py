"""Adoption: the ledger's best verified head, merges of other verified wins, the queue of merges."""

from __future__ import annotations

import hashlib

import pytest
from conftest import CAMPAIGN, confirming_looks, make_result

from node import merges, wire
from node.agent import offline
from node.agent.adoption import QueuedProposer, best_head, bundles, merge_proposals
from node.agent.offline import OfflineProposer
from node.agent.patch import change_hash
from node.agent.proposers import Attempt, Context, Proposal
from node.identity import Identity
from node.ledger import Ledger
from node.trainer import BASELINE_TRAIN_PY

BASELINE = BASELINE_TRAIN_PY.read_text()
NARROW = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
WIDE = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 5 ")
FOUR_STEPS = BASELINE.replace("def orthogonalize(G, steps=5):", "def orthogonalize(G, steps=4):")
BOTH = NARROW.replace("def orthogonalize(G, steps=5):", "def orthogonalize(G, steps=4):")
HEAD_LR = ("HEAD_LR = 0.004 ", "HEAD_LR = 0.006 ")
SLOWER_HEAD = BASELINE.replace(*HEAD_LR)  # a third change, on another line


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def book(tmp_path):
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as ledger:
        for source in (BASELINE, NARROW, WIDE, FOUR_STEPS, SLOWER_HEAD):
            ledger.add_version(source.encode())
        yield ledger


def claim(book, who, seq, child, bpb, confirmers=(), gain=0.05):
    """A kept claim, looked at by each of `confirmers` with the looks the outlier hold asks of a
    profile's first win, each measuring `gain` (within the hold's factor of each other here)."""
    fact = make_result(who, seq, sha(BASELINE), sha(child), bpb, profile="test")
    assert book.ingest(fact.raw) == fact
    for peer in confirmers:
        for check in confirming_looks(peer, book.next_seq(peer.public_key), fact, delta=-gain):
            assert book.ingest(check.raw) == check
    return fact


def test_the_head_is_the_best_verified_win_and_other_wins_merge_onto_it(book, alice, bob, carol):
    claim(book, alice, 1, NARROW, 1.45, [carol], gain=0.08)  # claims less, measured more
    claim(book, bob, 1, FOUR_STEPS, 1.40, [carol], gain=0.05)
    head = best_head(book, "test", sha(BASELINE))
    assert head == sha(NARROW)
    merges = merge_proposals(book, head, "test")
    assert [m.source for m in merges] == [BOTH]
    assert merges[0].description.startswith(f"merge of {sha(FOUR_STEPS)[:12]}")


def test_several_wins_merge_onto_the_head_as_one_bundle_first_then_each_alone(
    book, alice, bob, carol
):
    claim(book, alice, 1, NARROW, 1.40, [carol], gain=0.08)
    claim(book, bob, 1, FOUR_STEPS, 1.42, [carol], gain=0.05)
    claim(book, bob, 2, SLOWER_HEAD, 1.43, [alice], gain=0.04)
    merges = merge_proposals(book, sha(NARROW), "test")
    every = BOTH.replace(*HEAD_LR)
    assert [m.source for m in merges] == [every, BOTH, NARROW.replace(*HEAD_LR)]
    assert merges[0].description == (
        f"bundle of 2: {sha(FOUR_STEPS)[:12]}, {sha(SLOWER_HEAD)[:12]}"  # largest gain first
    )


def test_a_bundle_is_followed_by_its_halves_down_to_pairs_and_changes_that_clash_make_none():
    from node.agent.proposers import Proposal

    head = "".join(f"v{i} = {i}\n\n" for i in range(10))  # a line between any two changes
    lines = head.splitlines(keepends=True)

    def change(i: int, new: str) -> tuple[str, Proposal]:
        text = "".join(new + "\n" if j == i else line for j, line in enumerate(lines))
        return f"{i:02d}" * 32, Proposal(f"merge of {i}", text)

    out = bundles(head, [change(i, f"v{i} = -1") for i in range(0, 10, 2)])  # 5 merges
    sizes = [int(p.description.split(":")[0].split()[-1]) for p in out]
    assert sizes == [5, 3, 2, 2]  # all, its halves (3 and 2), then the 3's (2; 1 makes none)
    assert all(f"v{i} = -1" in out[0].source for i in range(0, 10, 2))
    assert out[0].description.startswith("bundle of 5: 0000")
    assert bundles(head, [change(0, "v0 = 7"), change(0, "v0 = 8")]) == []  # the same line


def test_no_bundle_carries_more_versions_than_its_description_can_name():
    """Twenty wins to merge at once: a bundle of all would name them past a result's
    description (the versions cut off would carry nothing the rule reads), so its halves and
    theirs go instead, each naming every version it carries in full."""
    head = "".join(f"v{i} = {i}\n\n" for i in range(40))
    lines = head.splitlines(keepends=True)

    def change(i: int) -> tuple[str, Proposal]:
        text = "".join(f"v{i} = -1\n" if j == 2 * i else line for j, line in enumerate(lines))
        return f"{i:02x}" * 32, Proposal(f"merge of {i}", text)

    out = bundles(head, [change(i) for i in range(20)])
    sizes = [int(p.description.split(":")[0].split()[-1]) for p in out]
    assert sizes[:2] == [10, 10] and max(sizes) <= merges.MAX_BUNDLE
    for proposal in out:
        body = wire.result_body(
            parent="0" * 64, child="1" * 64, diff=b"d", description=proposal.description,
            profile="test", harness="2" * 64, seed=1, outcome="keep", metrics={"val_bpb": 1.0},
        )  # fmt: skip
        assert body["description"] == proposal.description  # not cut
        named = merges.carried(body["description"])
        assert len(named) == int(proposal.description.split(":")[0].split()[-1])
        assert all(f"v{int(v[:2], 16)} = -1" in proposal.source for v in named)


def test_unverified_refuted_and_conflicting_wins_are_not_merged(book, alice, bob, carol):
    claim(book, alice, 1, NARROW, 1.40, [carol])
    claim(book, bob, 1, FOUR_STEPS, 1.45)  # nobody confirmed it
    claim(book, bob, 2, WIDE, 1.42, [alice])  # touches the head's line differently
    assert merge_proposals(book, sha(NARROW), "test") == []
    assert best_head(book, "test", sha(BASELINE), quorum=2) == sha(BASELINE)


def test_queued_merges_come_first_then_the_inner_proposer():
    queue = QueuedProposer(OfflineProposer(0))
    queue.queue_for(NARROW, merge_proposals_stub())
    context = Context(NARROW)
    assert queue.propose(context).source == BOTH
    following = queue.propose(context)
    assert following.source not in (BOTH, NARROW)  # the offline proposer's turn


def test_a_queued_merge_is_dropped_when_the_head_moved_or_it_was_tried():
    queue = QueuedProposer(OfflineProposer(0))
    queue.queue_for(NARROW, merge_proposals_stub())
    assert queue.propose(Context(WIDE)).source != BOTH  # another head: the merge is stale
    queue.queue_for(NARROW, merge_proposals_stub())
    tried = frozenset({change_hash(NARROW, BOTH)})
    assert queue.propose(Context(NARROW, tried=tried)).source != BOTH


def test_a_merge_every_node_queues_is_run_by_the_two_first_in_rank_then_by_the_next_ones():
    """A shared merge (a verified win every node on the head queues alike) is not run by all of
    them: the two active peers that rank first take it at once; each other one only after it has
    made more proposals with the merge still untried than it has peers before it past those
    two (they went quiet, or build on another head). The node's own rebased keeps are its own."""
    peers = [Identity(bytes([i]) * 32).peer_id for i in range(6)]
    merge = merge_proposals_stub()
    ranked = sorted(peers, reverse=True,
                    key=lambda p: offline.share_rank(p, change_hash(NARROW, BOTH)))  # fmt: skip
    took = {}
    for me in peers:
        queue = QueuedProposer(OfflineProposer(0))
        queue.queue_for(NARROW, [], merge)
        context = Context(NARROW, me=me, active=frozenset(peers))
        took[me] = next(
            (n for n in range(len(peers)) if queue.propose(context).source == BOTH), None
        )
        assert queue.last_verified == (took[me] is not None)
    assert [took[me] for me in ranked] == [0, 0, 1, 2, 3, 4]
    own = QueuedProposer(OfflineProposer(0))
    own.queue_for(NARROW, merge)  # this node's own keep rebased: its own, whatever the ranks
    assert own.propose(Context(NARROW, me=ranked[-1], active=frozenset(peers))).source == BOTH
    assert not own.last_verified  # ...and not known to be verified
    own.queue_for(NARROW, merge)
    own.add_for(NARROW, merge, shared=True)  # it was verified since
    assert own.propose(Context(NARROW, me=ranked[-1], active=frozenset(peers))).source == BOTH
    assert own.last_verified


def test_a_change_a_peers_merge_waiting_here_brings_is_not_proposed_anew():
    """A node whose turn for a shared merge (a peer's verified win) has not come does not
    propose the same change itself: it would pay for it twice, and be credited with the peer's
    find. Other changes it proposes as before."""

    class Listed:  # proposes its sources in order, those tried on the parent left out
        def __init__(self, *sources: str) -> None:
            self.sources = sources

        def propose(self, context: Context) -> Proposal:
            return next(Proposal("listed", s) for s in self.sources
                        if change_hash(context.train_py, s) not in context.tried_hashes)  # fmt: skip

    peers = [Identity(bytes([i]) * 32).peer_id for i in range(6)]
    key = change_hash(NARROW, BOTH)
    last = min(peers, key=lambda p: offline.share_rank(p, key))  # its turn comes last
    queue = QueuedProposer(Listed(BOTH, WIDE))
    queue.add_for(NARROW, merge_proposals_stub(), shared=True)
    context = Context(NARROW, me=last, active=frozenset(peers))
    assert queue.propose(context).source == WIDE and not queue.last_queued
    alone = QueuedProposer(Listed(BOTH, WIDE))  # nothing queued: the change is its own to try
    assert alone.propose(context).source == BOTH


def test_a_bundle_that_went_through_takes_its_parts_out_of_every_queue_and_a_failed_one_not():
    """The shared merges after a bundle wait while it is untried; once a peer kept it, the merges
    it holds are dropped (it holds them); once it failed, they are tried."""
    head = BASELINE
    bundle = Proposal("bundle of 2", BOTH)
    parts = [Proposal("merge of narrow", NARROW), Proposal("merge of four steps", FOUR_STEPS)]
    me = Identity(bytes([9]) * 32).peer_id

    def queue_with(outcome):
        queue = QueuedProposer(OfflineProposer(0))
        queue.add_for(head, [bundle, *parts], shared=True)
        tried = Attempt("bundle of 2", outcome, -0.01, change_hash(head, BOTH), by="a peer")
        return queue, Context(head, me=me, history=(tried,))

    queue, context = queue_with("keep")
    assert queue.propose(context).source not in (NARROW, FOUR_STEPS, BOTH)
    assert not queue.last_queued and queue.queue == []
    queue, context = queue_with("discard")
    assert queue.propose(context).source in (NARROW, FOUR_STEPS)  # alone (no peers): its own
    assert queue.last_queued and queue.last_verified


def test_a_merge_waiting_behind_another_nodes_bundle_does_not_count_its_wait():
    """While a bundle waits for the peer whose turn it is, the merges behind it are not judged:
    once the bundle was tried, the next merge goes to the first in its own rank, not to as many
    nodes as proposals were made meanwhile."""
    peers = [Identity(bytes([i]) * 32).peer_id for i in range(6)]
    bundle = Proposal("bundle of 2", BOTH)
    part = Proposal("merge of narrow", NARROW)

    def rank(change: str) -> list[str]:
        key = change_hash(BASELINE, change)
        return sorted(peers, key=lambda p: offline.share_rank(p, key), reverse=True)

    me = next(p for p in peers if rank(BOTH).index(p) >= 5 and rank(NARROW).index(p) >= 2)
    queue = QueuedProposer(OfflineProposer(0))
    queue.add_for(BASELINE, [bundle, part], shared=True)
    context = Context(BASELINE, me=me, active=frozenset(peers))
    for _ in range(3):
        assert queue.propose(context).source not in (BOTH, NARROW)
    failed = Attempt("bundle of 2", "discard", 0.01, change_hash(BASELINE, BOTH))
    later = Context(BASELINE, me=me, active=frozenset(peers), history=(failed,))
    waited = rank(NARROW).index(me) - 1  # its own turn comes after this many proposals
    for _ in range(waited):
        assert queue.propose(later).source != NARROW
    assert queue.propose(later).source == NARROW


def merge_proposals_stub():
    return [Proposal("merge of four Newton-Schulz steps", BOTH)]


def test_a_node_that_runs_only_trusted_code_still_weighs_claims_against_every_verified_gain(
    book, alice, bob, carol
):
    claim(book, alice, 1, NARROW, 1.40, [carol], gain=0.06)  # the first win: it sets the scale
    own = make_result(bob, 1, sha(BASELINE), sha(FOUR_STEPS), 1.45, profile="test")
    book.ingest(own.raw)
    book.ingest(confirming_looks(carol, 10, own, looks=1)[0].raw)  # within the factor: one look
    trusts_bob = lambda peer: peer == bob.peer_id  # noqa: E731
    assert best_head(book, "test", sha(BASELINE), trusted=trusts_bob) == sha(FOUR_STEPS)
    assert best_head(book, "test", sha(BASELINE)) == sha(NARROW)
    merges = merge_proposals(book, sha(FOUR_STEPS), "test", trusted=trusts_bob)
    assert merges == []  # alice's win is verified, but not code this node runs
