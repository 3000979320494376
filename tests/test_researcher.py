"""The research loop: paired research from the start, verification of peers, adoption and resume.

Runs are scripted (a known landscape, no training) so that the loop's decisions are exact; the
real runner is exercised by test_loop.py and test_verifier.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import statistics
import threading
import time

import pytest
from conftest import CAMPAIGN, confirming_looks, make_result, set_terms

from node import committees, consensus, wire
from node.agent.adoption import best_head, swarm_rows
from node.agent.crew import Crew
from node.agent.errors import SpendingLimitReached
from node.agent.llm import Usage
from node.agent.loop import Step
from node.agent.offline import OfflineProposer
from node.agent.proposers import Context, Proposal
from node.agent.researcher import Researcher
from node.agent.verifier import Verified, verify_claim
from node.consensus import verified_children
from node.identity import Identity
from node.ledger import Ledger
from node.ledger_queries import LOOK_COLUMNS
from node.trainer import BASELINE_TRAIN_PY, RunCancelled, RunResult, get_profile, harness_sha256

BASELINE = BASELINE_TRAIN_PY.read_text()
NARROW = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
FOUR_STEPS = BASELINE.replace("def orthogonalize(G, steps=5):", "def orthogonalize(G, steps=4):")
BOTH = NARROW.replace("def orthogonalize(G, steps=5):", "def orthogonalize(G, steps=4):")
NARROW_SOFTCAP = NARROW.replace("LOGIT_SOFTCAP = 15.0 ", "LOGIT_SOFTCAP = 30.0 ")
SOFTCAP = BASELINE.replace("LOGIT_SOFTCAP = 15.0 ", "LOGIT_SOFTCAP = 30.0 ")
PROFILE = get_profile("test")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Landscape:
    """Scores train.py by what it contains, plus a little seed noise; counts every run."""

    def __init__(self, narrow: float = 0.05) -> None:
        self.runs: list[str] = []
        self.narrow = narrow  # NARROW's gain

    def __call__(self, script, profile, data, run_dir, seed=0, on_event=lambda _: None):
        source = script.read_text()
        self.runs.append(source)
        on_event({"event": "progress", "progress": 0.5})
        bpb = 1.5 + 0.0004 * (seed % 3)
        bpb -= self.narrow * ("MLP_RATIO = 3 " in source) + 0.03 * ("steps=4" in source)
        bpb += 0.02 * ("LOGIT_SOFTCAP = 30.0 " in source)
        return RunResult(
            outcome="ok", val_bpb=bpb, steps=10, tokens=640, train_seconds=1.0,
            total_seconds=2.0, peak_memory_mb=None, mfu=None, train_py_sha256=sha(source),
            harness_sha256=harness_sha256(PROFILE), profile=profile.name, seed=seed, data_sha256="d",
        )  # fmt: skip


class Scripted:
    def __init__(self, *sources: str) -> None:
        self.sources = list(sources)

    def propose(self, context: Context) -> Proposal:
        return Proposal(f"try {len(self.sources)}", self.sources.pop(0))


@pytest.fixture
def book(tmp_path):
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as ledger:
        yield ledger


def fails_on_narrow(landscape, outcome: str, error: str):
    """`landscape`, except that the narrow MLP (MLP_RATIO 3) ends as `outcome` with `error`."""

    def run(script, *args, **kwargs):
        result = landscape(script, *args, **kwargs)
        if "MLP_RATIO = 3 " in script.read_text():
            return dataclasses.replace(result, outcome=outcome, val_bpb=None, error=error)
        return result

    return run


def researcher(book, me, tmp_path, proposer, landscape, **kwargs) -> Researcher:
    published: list[wire.Fact] = []
    worker = Researcher(
        book, me, proposer, PROFILE, None, tmp_path / "runs", BASELINE, run=landscape,
        publish=published.append, status_path=tmp_path / "status.json", **kwargs,
    )  # fmt: skip
    worker.published = published
    return worker


def test_a_node_researches_at_once_and_its_paired_runs_measure_its_noise(book, alice, tmp_path):
    """No noise runs: the start scores the head once, on the first of this node's seeds for it,
    and the noise is the profile's prior until pairs on two seeds measure it; a restart
    measures nothing again."""
    landscape = Landscape()
    first = researcher(book, alice, tmp_path, Scripted(), landscape)
    first.start()
    assert landscape.runs == [BASELINE]
    assert (first.sigma, first.sigma_df) == (PROFILE.paired_noise, 0)
    assert first.margin == pytest.approx(2 * PROFILE.paired_noise)
    seeds = first.seeds()
    assert book.rows("SELECT seed, description FROM runs") == [
        {"seed": seeds[0], "description": "score"}
    ]
    again = researcher(book, alice, tmp_path, Scripted(), landscape)
    again.start()
    assert len(landscape.runs) == 1 and again.margin == first.margin
    # Two experiments while it calibrates: each child and the head on both seeds. The
    # landscape's seed noise is the same for child and head, so the pairs' spread is nil.
    changes = Scripted(SOFTCAP, SOFTCAP + "# a comment\n")
    worker = researcher(book, alice, tmp_path, changes, landscape, verify_every=0)
    for _ in range(2):
        assert worker.step().outcome == "discard"
    commented = SOFTCAP + "# a comment\n"
    assert landscape.runs == [BASELINE, SOFTCAP, BASELINE, SOFTCAP, commented, commented]
    assert worker.sigma_df == 1  # updated before each step: the second step's pair counts next
    worker._update_noise()
    assert worker.sigma_df == 2 and worker.sigma < PROFILE.paired_noise
    assert worker.sigma == pytest.approx(PROFILE.paired_noise * (2 / 4) ** 0.5)


def test_a_node_of_a_swarm_spends_no_run_on_its_noise_and_learns_it_from_its_peers_looks(
    book, alice, bob, carol, tmp_path
):
    """`calibrate=False` (a node with peers): a change that does not look like a win runs on one
    seed, and the noise is the profile's prior until peers' looks of the node's device class
    (never another's) measure it: the spread of one claim's looks on different seeds, each seed
    once however often it was replayed."""

    def on_device(name):
        def run(*args, **kwargs):
            return dataclasses.replace(Landscape()(*args, **kwargs), device_name=name)

        return run

    worker = researcher(book, alice, tmp_path, Scripted(SOFTCAP), on_device("cpu-a"),
                        verify_every=0, calibrate=False)  # fmt: skip
    assert worker.step().outcome == "discard"
    assert book.rows("SELECT child FROM runs WHERE seed = ?", (worker.seeds()[1],)) == []
    assert (worker.sigma, worker.sigma_df) == (PROFILE.paired_noise, 0)
    with ledger_of(tmp_path, "bob") as bobs:
        researcher(bobs, bob, tmp_path / "bob", Scripted(NARROW), Landscape(), verify_every=0,
                   calibrate=False).step()  # fmt: skip
        gossip(bobs, book)
    (claim,) = book.rows("SELECT id FROM results WHERE outcome = 'keep'")

    def look(who, delta, seed, device):
        body = wire.verification_body(
            result=claim["id"], child_val_bpb=1.5 + delta, parent_val_bpb=1.5, seed=seed,
            profile="test", harness=harness_sha256(PROFILE), verdict="confirm", device=device,
        )  # fmt: skip
        book.ingest(
            wire.sign(who, "verification", CAMPAIGN, book.next_seq(who.public_key), body).raw
        )

    look(carol, -0.050, 1, "cpu-a")
    look(DAVE, -0.050, 1, "cpu-a")  # a replay of seed 1: that seed counts once
    look(ERIN, -0.040, 2, "cpu-a")
    look(FRANK, -0.200, 3, "cpu-b")  # another class's noise is not this node's
    worker._update_noise()
    assert worker.sigma_df == 1
    prior = 2 * PROFILE.paired_noise**2  # the prior's two degrees of freedom
    expected = math.sqrt((prior + 2 * 0.005**2) / 3)
    assert worker.sigma == pytest.approx(expected)
    # A peer caught signing numbers off (it claimed far more than the looks at its claim found)
    # measures nobody's noise: its wild look on a third seed counts until then, not after.
    look(FRANK, 0.300, 4, "cpu-a")
    worker._update_noise()
    assert worker.sigma_df == 2 and worker.sigma > 2 * expected
    overclaim = _claim(book, FRANK, BASELINE, FOUR_STEPS, 0.05, "fewer steps")
    for seed in range(consensus.HOLD_LOOKS + 3):
        body = wire.verification_body(
            result=overclaim.id, child_val_bpb=1.52, parent_val_bpb=1.5, seed=300 + seed,
            profile="test", harness=harness_sha256(PROFILE), verdict="refute", device="cpu-b",
        )  # fmt: skip
        book.ingest(wire.sign(bob, "verification", CAMPAIGN, book.next_seq(bob.public_key),
                              body).raw)  # fmt: skip
    assert book.overclaimed("test") == {FRANK.peer_id}
    worker._update_noise()
    assert (worker.sigma, worker.sigma_df) == (pytest.approx(expected), 1)


def test_a_win_moves_the_head_a_loss_does_not_and_every_run_is_published(book, alice, tmp_path):
    landscape = Landscape()
    proposer = Scripted(NARROW, NARROW + "# only a comment\n")
    worker = researcher(book, alice, tmp_path, proposer, landscape, verify_every=0)
    win = worker.step()
    assert isinstance(win, Step) and win.outcome == "keep" and worker.head.sha256 == sha(NARROW)
    same = worker.step()  # a comment: no gain past the margin
    assert same.outcome == "discard" and worker.head.sha256 == sha(NARROW)
    assert [f.body["outcome"] for f in worker.published] == ["keep", "discard"]
    status = json.loads((tmp_path / "status.json").read_text())
    assert (
        status["head"] == sha(NARROW)
        and status["steps"] == 2
        and status["doing"].startswith("discard")
    )


def test_a_void_run_is_published_never_kept_and_the_status_says_why(book, alice, tmp_path):
    cheats_on_narrow = fails_on_narrow(Landscape(), "void", "it peeks")  # its model peeks
    worker = researcher(book, alice, tmp_path, Scripted(NARROW), cheats_on_narrow, verify_every=0)
    step = worker.step()
    assert step.outcome == "void" and worker.head.sha256 == sha(BASELINE)
    assert [f.body["outcome"] for f in worker.published] == ["void"]
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["doing"] == "void: try 1: it peeks"


def test_a_restarted_node_resumes_its_own_kept_chain(book, alice, tmp_path):
    landscape = Landscape()
    researcher(book, alice, tmp_path, Scripted(NARROW), landscape, verify_every=0).step()
    again = researcher(book, alice, tmp_path, Scripted(), landscape, verify_every=0)
    again.start()
    assert again.head.sha256 == sha(NARROW)


def gossip(source: Ledger, *targets: Ledger, versions: bool = True) -> None:
    """What the network layer does between nodes: every fact, and the versions they name."""
    raws = [r["raw"] for r in source.rows("SELECT raw FROM facts ORDER BY time, id")]
    versions = [r["source"] for r in source.rows("SELECT source FROM versions")] if versions else []
    for target in targets:
        target.ingest_many(raws)
        for version in versions:
            target.add_version(version)


def ledger_of(tmp_path, name: str) -> Ledger:
    return Ledger(tmp_path / name / "ledger.db", campaign=CAMPAIGN)


def test_a_node_drawn_for_a_claim_on_its_head_looks_at_it_at_the_next_step(
    book, alice, bob, tmp_path
):
    """The claim is on the head alice adopted and she is among the peers its hash draws (of the
    two active, she is the only one who is not its author): her next step is the look, whatever
    `verify_every` says, and research goes ahead from the claimed child once a look favours it
    (no gain was verified on the profile yet: its author's word alone is not enough)."""
    landscape = Landscape()
    with ledger_of(tmp_path, "bob") as bobs:
        researcher(bobs, bob, tmp_path / "bob", Scripted(NARROW), landscape, verify_every=0).step()
        gossip(bobs, book)
    (claim,) = book.rows("SELECT id FROM results WHERE outcome = 'keep'")
    worker = researcher(book, alice, tmp_path, Scripted(SOFTCAP), landscape, verify_every=8)
    checked = worker.step()
    assert isinstance(checked, Verified) and checked.verdict == "confirm"
    assert checked.fact.body["result"] == claim["id"]
    assert checked.fact.body["seed"] == worker.seeds()[0]
    assert worker.published[-1].kind == "verification"
    assert worker.head.sha256 == sha(BASELINE)
    worker._speculate()
    assert worker.head.sha256 == sha(NARROW)  # research goes ahead from the claim under judgement
    assert worker.adopted == sha(BASELINE)  # adoption waits for the evidence (the first win's hold)


def _look_at(book, who, result: str, gain: float, seed: int) -> None:
    """`who`'s signed look at the claim `result`: a gain of `gain` on `seed`, in `book`."""
    body = wire.verification_body(
        result=result, child_val_bpb=1.5 - gain, parent_val_bpb=1.5, seed=seed, profile="test",
        harness=harness_sha256(PROFILE), verdict="confirm" if gain > 0 else "refute",
    )  # fmt: skip
    book.ingest(wire.sign(who, "verification", CAMPAIGN, book.next_seq(who.public_key), body).raw)


def _alice_on_bobs_claim(
    book, alice, bob, tmp_path, verify_every: int, proposals=(SOFTCAP,), narrow: float = 0.05
):  # fmt: skip
    """bob's kept claim of NARROW (a gain of `narrow`) on the baseline in `book`, alice's worker
    started on it (her proposals: `proposals`), and a way to sign a peer's look at the claim:
    (worker, the claim's id, look(who, gain, seed))."""
    landscape = Landscape(narrow)
    with ledger_of(tmp_path, "bob") as bobs:
        researcher(bobs, bob, tmp_path / "bob", Scripted(NARROW), landscape, verify_every=0).step()
        gossip(bobs, book)
    worker = researcher(
        book, alice, tmp_path, Scripted(*proposals), landscape, verify_every=verify_every
    )
    worker.start()
    (claim,) = book.rows("SELECT id FROM results WHERE outcome = 'keep'")
    return worker, claim["id"], lambda who, gain, seed: _look_at(book, who, claim["id"], gain, seed)


def test_a_node_researches_ahead_from_a_favoured_claim_and_back_when_it_fails(
    book, alice, bob, carol, tmp_path
):
    """A claim on the adopted head that the looks favour is where research goes on while it is
    judged, after a look of the node's own (its first run of the child, on its own seed, is
    a look); once the looks refute it, the node is back on the adopted head."""
    worker, claim, look = _alice_on_bobs_claim(book, alice, bob, tmp_path, verify_every=0)
    worker.verify_every = 1
    worker._speculate()
    assert worker.head.sha256 == sha(BASELINE)  # no look yet, and no gain verified to size it
    look(carol, 0.05, 300)
    ahead = worker._speculate()  # favoured by a look: first a look of its own
    assert isinstance(ahead, Verified) and ahead.fact.body["seed"] == worker.seeds()[0]
    assert worker.head.sha256 == sha(BASELINE)
    assert worker._speculate() is None and worker.head.sha256 == sha(NARROW)  # its run serves
    for k in range(9):  # three peers against the two that found a gain (carol, and alice)
        look((DAVE, ERIN, FRANK)[k % 3], -0.05, 200 + k)
    assert book.standings("test", every=True)[1][claim].state == "refuted"
    worker._speculate()
    assert worker.head.sha256 == sha(BASELINE) == worker.adopted


def test_a_node_that_goes_back_takes_its_own_wins_ahead_with_it(book, alice, bob, carol, tmp_path):
    """Ahead on bob's claim, alice keeps a change of her own on it; the looks then refute bob's
    claim: back on the adopted head, her first proposal is her win rebased onto it."""
    worker, claim, look = _alice_on_bobs_claim(
        book, alice, bob, tmp_path, verify_every=1, proposals=(BOTH,)
    )
    look(carol, 0.05, 300)
    assert isinstance(worker._speculate(), Verified)  # its own look first
    assert worker._speculate() is None and worker.head.sha256 == sha(NARROW)
    step = worker._research(worker.head)  # its research from there (a step's last resort)
    worker.publish(step.fact)
    worker.head = step.head
    assert step.outcome == "keep" and worker.adopted == sha(BASELINE)
    assert worker.head.sha256 == sha(BOTH)
    for k in range(9):
        look((DAVE, ERIN, FRANK)[k % 3], -0.05, 200 + k)
    assert book.standings("test", every=True)[1][claim].state == "refuted"
    worker._speculate()
    assert worker.head.sha256 == sha(BASELINE) == worker.adopted
    (first, *_) = worker.proposer.queue
    assert first.proposal.description.startswith(f"merge of {sha(BOTH)[:12]}")
    assert first.proposal.source == FOUR_STEPS  # her change alone, onto the adopted head


def test_a_node_ahead_on_a_claim_the_looks_turned_against_goes_back_before_it_is_refuted(
    book, alice, bob, carol, tmp_path
):
    """A node stays ahead only on claims it would choose now: once the pooled looks show no gain,
    the claim still open (too few seeds to refute it), the node is back on the adopted head
    rather than building its research on a claim that may never be decided. (bob claims the
    gain of 0.01 his runs measured: looks near it never make his word doubted.)"""
    worker, claim, look = _alice_on_bobs_claim(
        book, alice, bob, tmp_path, verify_every=1, narrow=0.01
    )
    look(carol, 0.01, 300)
    assert isinstance(worker._speculate(), Verified)  # its own look first
    assert worker._speculate() is None and worker.head.sha256 == sha(NARROW)
    look(DAVE, -0.012, 301)
    look(ERIN, -0.012, 302)
    judged = book.standings("test", every=True)[1][claim]
    assert judged.state == "open" and judged.gain <= 0
    worker._speculate()
    assert worker.head.sha256 == sha(BASELINE) == worker.adopted
    look(FRANK, 0.02, 303)  # the looks favour it again: the node may go ahead from it again
    assert book.standings("test", every=True)[1][claim].gain > 0
    worker._speculate()
    assert worker.head.sha256 == sha(NARROW)


def test_a_node_goes_ahead_only_from_a_claim_the_looks_favour_beyond_noise(
    book, alice, bob, carol, tmp_path
):
    """A pooled gain within a standard error of zero is no reason to build on a claim: its looks
    may stop before they settle it, and the node would stay on it. The test profile's paired
    noise is 0.005: one look of +0.002 is within it, two that pool to +0.006 are beyond it (bob
    claims 0.01, near enough to both)."""
    worker, claim, look = _alice_on_bobs_claim(
        book, alice, bob, tmp_path, verify_every=1, narrow=0.01
    )
    look(carol, 0.002, 300)
    judged = book.standings("test", every=True)[1][claim]
    assert judged.state == "open" and 0 < judged.gain < PROFILE.paired_noise
    assert worker._speculate() is None and worker.head.sha256 == sha(BASELINE)
    look(DAVE, 0.01, 301)
    judged = book.standings("test", every=True)[1][claim]
    assert judged.state == "open" and judged.gain > PROFILE.paired_noise / 2**0.5
    assert isinstance(worker._speculate(), Verified)  # its own look first, then ahead
    assert worker._speculate() is None and worker.head.sha256 == sha(NARROW)


def test_a_node_ahead_on_a_claim_it_is_drawn_to_judge_looks_there_before_at_any_other(
    book, alice, bob, carol, tmp_path
):
    """Its research rests on the claim it is ahead from: drawn to judge it, the node looks at it
    again before it serves any other claim. Served in turn with a flood of claims it never
    looked at, the claim every node built on stayed at one look a judge for good."""
    worker, claim, look = _alice_on_bobs_claim(book, alice, bob, tmp_path, verify_every=1)
    look(carol, 0.05, 300)
    assert isinstance(worker._speculate(), Verified)  # its own look first
    assert worker._speculate() is None and worker.head.sha256 == sha(NARROW)
    harness = harness_sha256(PROFILE)
    for seq, child in enumerate((SOFTCAP, FOUR_STEPS), start=1):  # a flood, on the same head
        book.add_version(child.encode())
        book.ingest(make_result(FRANK, seq, sha(BASELINE), sha(child), 1.40, profile="test",
                                harness=harness).raw)  # fmt: skip
    flood = [c for c in worker.draws.drawn(worker._open_claims(limit=10)) if c["id"] != claim]
    assert flood and worker.draws.drawn([worker._claim_row(claim)])  # it judges both
    again = worker.step()
    assert isinstance(again, Verified) and again.fact.body["result"] == claim
    assert again.fact.body["seed"] == worker.seeds(2)[1]  # its second seed for the claim
    assert worker.head.sha256 == sha(NARROW)


def test_a_node_leaves_a_claim_whose_author_lost_standing_here(book, alice, bob, carol, tmp_path):
    """Nobody here looks again at the claims of a peer that lost standing, so the looks that
    favour its claim would hold it open, and the node on it, for good: the node goes back to
    the adopted head."""
    worker, claim, look = _alice_on_bobs_claim(book, alice, bob, tmp_path, verify_every=1)
    look(carol, 0.05, 300)
    assert isinstance(worker._speculate(), Verified)
    assert worker._speculate() is None and worker.head.sha256 == sha(NARROW)
    book.record_offences({(bob.peer_id, "junk"): 1})  # a junk frame costs a ban's worth
    assert book.standings("test", every=True)[1][claim].state in ("open", consensus.HELD)
    worker._speculate()
    assert worker.head.sha256 == sha(BASELINE) == worker.adopted


def two_verified_wins(book, bob, carol, tmp_path, landscape, bobs_runs=None, **bobs) -> None:
    """bob keeps NARROW and carol FOUR_STEPS, each verifies the other's, and `book` gets it all."""
    with ledger_of(tmp_path, "bob") as bobs_book, ledger_of(tmp_path, "carol") as carols:
        bob_worker = researcher(bobs_book, bob, tmp_path / "bob", Scripted(NARROW),
                                bobs_runs or landscape, verify_every=1, **bobs)  # fmt: skip
        carol_worker = researcher(
            carols, carol, tmp_path / "carol", Scripted(FOUR_STEPS), landscape, verify_every=1
        )
        assert bob_worker.step().outcome == carol_worker.step().outcome == "keep"
        gossip(bobs_book, carols)
        gossip(carols, bobs_book)
        # Each verifies the other's win (step 2 of each verifies, with verify_every=1).
        assert bob_worker.step().verdict == carol_worker.step().verdict == "confirm"
        # They are the profile's first wins, held for more looks: bob gives carol's its looks
        # (its gain then sets the scale, and bob's own, within HOLD_FACTOR of it, is verified).
        gossip(carols, bobs_book)
        for _ in range(consensus.HOLD_LOOKS - 1):
            assert bob_worker.step().verdict == "confirm"
        gossip(bobs_book, book)
        gossip(carols, book)


def test_a_verified_peer_win_is_adopted_and_other_verified_wins_merge_onto_it(
    book, alice, bob, carol, tmp_path
):
    landscape = Landscape()
    two_verified_wins(book, bob, carol, tmp_path, landscape)
    worker = researcher(book, alice, tmp_path, Scripted(), landscape, verify_every=0)
    merged = worker.step()
    assert worker.adopted == sha(NARROW)  # the best verified head
    assert merged.outcome == "keep" and worker.head.source == BOTH  # the queued merge came first
    assert merged.description.startswith(f"merge of {sha(FOUR_STEPS)[:12]}")


def test_a_win_verified_after_the_adoption_merges_onto_the_head_and_any_gain_keeps_it(
    book, alice, bob, carol, tmp_path
):
    """carol's win is verified only after alice adopted bob's: her next research merges it onto
    the head at once, not at the next adoption, and keeps the merge on a gain below her margin,
    on one seed: the looks at carol's claim measured the change, alice only checks that it
    survived, and the merge's own committee judges it."""
    harness = harness_sha256(PROFILE)
    claims = {}
    for who, child, bpb in ((bob, NARROW, 1.45), (carol, FOUR_STEPS, 1.47)):
        book.add_version(child.encode())
        claims[child] = make_result(who, 1, sha(BASELINE), sha(child), bpb, profile="test",
                                    harness=harness)  # fmt: skip
        book.ingest(claims[child].raw)
    for look in confirming_looks(DAVE, 1, claims[NARROW], harness=harness):
        book.ingest(look.raw)

    def run(script, *args, **kwargs):  # the two changes together gain 0.0005 on NARROW alone
        result = Landscape()(script, *args, **kwargs)
        bpb = result.val_bpb + (0.0295 if script.read_text() == BOTH else 0.0)
        return dataclasses.replace(result, val_bpb=bpb)

    worker = researcher(book, alice, tmp_path, OfflineProposer(0), run, verify_every=0,
                        calibrate=False)  # fmt: skip
    worker.start()
    assert worker.adopted == sha(NARROW) and worker.proposer.queue == []
    for look in confirming_looks(ERIN, 1, claims[FOUR_STEPS], harness=harness, delta=-0.03):
        book.ingest(look.raw)
    for _ in range(6):  # the peers that rank before her have their turn first
        merged = worker.step()
        if merged.description.startswith(f"merge of {sha(FOUR_STEPS)[:12]}"):
            break
    assert merged.outcome == "keep" and 0 < statistics.fmean(p - c for _, c, p in merged.pairs)
    assert statistics.fmean(p - c for _, c, p in merged.pairs) < worker.margin
    assert worker.head.source == BOTH and [s for s, _, _ in merged.pairs] == worker.seeds(1)
    ahead = worker.step()  # its own idea next: a win on the first seed runs the second too
    assert not ahead.description.startswith("merge of") and len(ahead.pairs) == 2


def test_a_head_whose_train_py_has_not_arrived_yet_is_adopted_once_it_has(
    book, alice, bob, carol, tmp_path
):
    landscape = Landscape()
    with ledger_of(tmp_path, "bob") as bobs, ledger_of(tmp_path, "carol") as carols:
        researcher(bobs, bob, tmp_path / "bob", Scripted(NARROW), landscape, verify_every=0).step()
        gossip(bobs, carols)
        verifier = researcher(carols, carol, tmp_path / "carol", Scripted(), landscape,
                              verify_every=1)  # fmt: skip
        for _ in range(consensus.HOLD_LOOKS):  # the profile's first win: held for more looks
            assert verifier.step().verdict == "confirm"
        gossip(bobs, book, versions=False)
        gossip(carols, book, versions=False)
        worker = researcher(book, alice, tmp_path, Scripted(SOFTCAP), landscape, verify_every=0)
        worker.start()
        assert worker.head.sha256 == sha(BASELINE) and worker.adopted is None
        book.add_version(NARROW.encode())  # fetched by hash
        worker.step()
        assert worker.adopted == sha(NARROW)


class Valley(Landscape):
    """A smooth landscape over two constants (best at HEAD_LR 0.006, LOGIT_SOFTCAP 30), with seed
    noise well under the noise floor: changes toward the valley win, everything else is flat."""

    def __call__(self, script, profile, data, run_dir, seed=0, on_event=lambda _: None):
        source = script.read_text()
        self.runs.append(source)
        lr = float(re.search(r"^HEAD_LR = ([0-9.e-]+)", source, re.M)[1])
        cap = float(re.search(r"^LOGIT_SOFTCAP = ([0-9.e-]+)", source, re.M)[1])
        bpb = 1.5 + 0.05 * math.log(lr / 0.006) ** 2 + 0.2 * (cap / 30 - 1) ** 2
        return dataclasses.replace(
            super().__call__(script, profile, data, run_dir, seed),
            val_bpb=bpb + 0.0003 * (seed % 2),
        )


def test_three_offline_nodes_converge_on_one_head_verified_by_the_quorum(
    tmp_path, alice, bob, carol
):
    valley = Valley()
    ledgers = [ledger_of(tmp_path, name) for name in ("a", "b", "c")]
    nodes = [
        researcher(
            book, me, tmp_path / str(i), OfflineProposer(i), valley, quorum=2, verify_every=2
        )
        for i, (book, me) in enumerate(zip(ledgers, (alice, bob, carol), strict=True))
    ]
    # A bounded time, in steps of every node: 2 to 12 rounds over 20 sets of proposer seeds.
    for rounds in range(1, 41):  # noqa: B007 (reported below)
        for node in nodes:
            node.step()
        for book in ledgers:
            gossip(book, *[other for other in ledgers if other is not book])
        heads = {best_head(book, "test", sha(BASELINE), quorum=2) for book in ledgers}
        if len(heads) == 1 and heads != {sha(BASELINE)}:
            break
    assert len(heads) == 1 and heads != {sha(BASELINE)}, (
        f"no verified common head after {rounds} rounds"
    )
    head = heads.pop()
    results, verifications = swarm_rows(ledgers[0], "test")
    verified = verified_children(results, verifications, ledgers[0].rules("test", 2))
    made = [r for r in results if r["child"] == head and r["id"] in verified]
    assert made and all(len(verified[r["id"]]) >= 2 for r in made)  # two peers besides the author
    assert min(r["val_bpb"] for r in made) < 1.5 + 0.05 * math.log(2 / 3) ** 2 + 0.2 * 0.25
    for node in nodes:
        node.step()
        assert node.adopted == head  # every node builds on the same verified head
    for book in ledgers:
        book.close()


def test_when_the_proposer_has_nothing_the_step_verifies_instead(book, alice, bob, tmp_path):
    landscape = Landscape()
    with ledger_of(tmp_path, "bob") as bobs:
        researcher(bobs, bob, tmp_path / "bob", Scripted(NARROW), landscape, verify_every=0).step()
        gossip(bobs, book)
    spent = SpendingLimitReached("this node has spent $5.0000 on model calls")
    worker = researcher(book, alice, tmp_path, Refusing(spent), landscape, verify_every=10)
    for _ in range(consensus.HOLD_LOOKS):  # a profile's first win is held for more looks
        done = worker.step()  # step 1 of 10 would research, but the proposer refuses
        assert isinstance(done, Verified) and done.verdict == "confirm"
    again = worker.step()  # nothing left to verify either: a refused step that ran nothing
    assert isinstance(again, Step) and again.outcome == "refused" and "spent" in again.reason


class Refusing:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def propose(self, context: Context) -> Proposal:
        raise self.error


def test_the_status_shows_the_models_tokens_and_dollars(book, alice, tmp_path):
    class Counted(Scripted):
        usage = Usage(calls=1, prompt_tokens=1000, completion_tokens=200, cost_usd=0.01)

    worker = researcher(book, alice, tmp_path, Counted(NARROW), Landscape(), verify_every=0)
    worker.step()
    status = json.loads((tmp_path / "status.json").read_text())
    assert (
        status["model_usage"]["prompt_tokens"] == 1000 and status["model_usage"]["cost_usd"] == 0.01
    )


def test_a_verified_head_that_crashes_here_is_not_adopted(book, alice, bob, carol, tmp_path):
    landscape = Landscape()
    with ledger_of(tmp_path, "bob") as bobs, ledger_of(tmp_path, "carol") as carols:
        researcher(bobs, bob, tmp_path / "bob", Scripted(NARROW), landscape, verify_every=0).step()
        gossip(bobs, carols)
        verifier = researcher(carols, carol, tmp_path / "carol", Scripted(), landscape,
                              verify_every=1)  # fmt: skip
        for _ in range(consensus.HOLD_LOOKS):  # the profile's first win: held for more looks
            assert verifier.step().verdict == "confirm"
        gossip(bobs, book)
        gossip(carols, book)

    crashes_on_narrow = fails_on_narrow(landscape, "crash", "killed")  # out of memory here
    worker = researcher(book, alice, tmp_path, Scripted(SOFTCAP), crashes_on_narrow, verify_every=0)
    step = worker.step()
    assert worker.head.sha256 == sha(BASELINE) and step.outcome == "discard"
    assert worker.adopted == sha(NARROW)  # it tried once, and does not try every step


def test_a_node_whose_own_chain_starts_from_the_new_head_keeps_building_on_its_chain(
    book, alice, bob, tmp_path
):
    landscape = Landscape()
    worker = researcher(book, alice, tmp_path, Scripted(NARROW, BOTH), landscape, verify_every=0)
    assert worker.step().outcome == "keep" and worker.step().outcome == "keep"
    assert worker.head.source == BOTH  # NARROW, then BOTH on top: neither verified yet
    with ledger_of(tmp_path, "bob") as bobs:
        gossip(book, bobs)
        verifier = researcher(bobs, bob, tmp_path / "bob", Scripted(), landscape, verify_every=1)
        verified = verifier.step()  # the frontier first: alice's NARROW, built on the baseline
        narrow = worker.published[0]
        assert verified.verdict == "confirm" and verified.fact.body["result"] == narrow.id
        # The profile's first win is held for more looks; bob gives them to NARROW alone, so
        # that BOTH, alice's own next keep, stays unverified.
        claim = bobs.rows("SELECT * FROM results WHERE id = ?", (narrow.id,))[0]
        for seed in range(100, 99 + consensus.HOLD_LOOKS):
            again = verify_claim(bobs, bob, claim, verifier.margin, PROFILE, None, tmp_path / "bob",
                                 seed=seed, parent_score=lambda s: verifier.score_at(BASELINE, s),
                                 run=landscape)  # fmt: skip
            assert again.verdict == "confirm"
        gossip(bobs, book)
    assert best_head(book, "test", sha(BASELINE), 1, harness_sha256(PROFILE)) == sha(NARROW)
    worker.proposer = type(worker.proposer)(Scripted(SOFTCAP))
    worker.step()
    assert worker.adopted == sha(NARROW)
    assert (
        worker.head.source == BOTH
    )  # its own better chain goes on; it did not fall back to NARROW


def test_without_a_sandbox_a_node_runs_only_its_own_code_and_that_of_peers_it_trusts(
    book, alice, bob, carol, tmp_path
):
    landscape = Landscape()
    with ledger_of(tmp_path, "bob") as bobs, ledger_of(tmp_path, "carol") as carols:
        bob_worker = researcher(
            bobs, bob, tmp_path / "bob", Scripted(NARROW), landscape, verify_every=0
        )
        assert bob_worker.step().outcome == "keep"
        gossip(bobs, carols)
        carol_worker = researcher(
            carols, carol, tmp_path / "carol", Scripted(), landscape, verify_every=1
        )
        for _ in range(consensus.HOLD_LOOKS):  # bob's win, verified by carol: the profile's first
            assert carol_worker.step().verdict == "confirm"
        gossip(bobs, book)
        gossip(carols, book)
    assert best_head(book, "test", sha(BASELINE), 1, harness_sha256(PROFILE)) == sha(NARROW)
    runs_before = len(landscape.runs)
    wary = researcher(book, alice, tmp_path / "wary", Scripted(FOUR_STEPS), landscape, verify_every=1,
                      trusted=lambda peer: False)  # fmt: skip
    wary.step()
    assert wary.adopted == sha(BASELINE)  # bob's verified win is bob's code: not run, not adopted
    assert sha(NARROW) not in {sha(s) for s in landscape.runs[runs_before:]}
    trusting = researcher(book, alice, tmp_path / "trusting", Scripted(), landscape, verify_every=0,
                          trusted=lambda peer: peer == bob.peer_id)  # fmt: skip
    trusting.start()
    assert trusting.adopted == sha(NARROW) and trusting.head.sha256 == sha(NARROW)


class Recording(Landscape):
    """The landscape, noting for each run whether it may add to the node's compiled kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.keeps: list[tuple[str, bool]] = []

    def __call__(self, script, *args, compile_cache=None, keep_compiled=False, **kwargs):
        assert compile_cache is not None  # every run is lent the store
        self.keeps.append((script.read_text(), keep_compiled))
        return super().__call__(script, *args, **kwargs)


def test_only_code_the_node_or_peers_it_trusts_wrote_adds_to_its_compiled_kernels(
    book, alice, bob, carol, tmp_path
):
    from node.identity import Identity
    from node.trainer.compile_cache import CompileCache

    bobs_runs = Recording()
    two_verified_wins(book, bob, carol, tmp_path, Landscape(), bobs_runs,
                      compile_cache=CompileCache(tmp_path / "bob" / "compiled"))  # fmt: skip
    # bob's runs of the baseline and of his own win (each on his two seeds) write; his runs of
    # carol's win (one a look, each on a seed of his) do not.
    assert bobs_runs.keeps == [(BASELINE, True), (NARROW, True), (BASELINE, True), (NARROW, True),
                               *[(FOUR_STEPS, False)] * consensus.HOLD_LOOKS,
                               (BASELINE, True)]  # fmt: skip

    trusting = Recording()
    worker = researcher(book, alice, tmp_path / "alice", Scripted(), trusting, verify_every=0,
                        trust=[bob.peer_id], compile_cache=CompileCache(tmp_path / "compiled"))  # fmt: skip
    merged = worker.step()
    assert worker.adopted == sha(NARROW) and merged.description.startswith("merge of")
    # bob's head is trusted by key; the merge carries carol's change, so it does not write.
    # on one seed, paired: a merge of verified wins, which its committee judges
    assert trusting.keeps == [(NARROW, True), (BOTH, False)]

    wary = Recording()
    with ledger_of(tmp_path, "dave") as daves:
        gossip(book, daves)
        dave = Identity(bytes(range(3, 35)))
        softer = NARROW.replace("LOGIT_SOFTCAP = 15.0 ", "LOGIT_SOFTCAP = 30.0 ")
        worker = researcher(daves, dave, tmp_path / "dave", Scripted(softer), wary, verify_every=0,
                            compile_cache=CompileCache(tmp_path / "dave" / "compiled"))  # fmt: skip
        worker.step()
    # A peer's head, and dave's own change of it, are not all dave's code: neither writes.
    assert wary.keeps == [(NARROW, False), (softer, False)] * 2


class Edits:
    """Proposes edits of the parent it is given, in order: (description, old, new)."""

    def __init__(self, *edits: tuple[str, str, str]) -> None:
        self.edits = list(edits)
        self.seen: list[Context] = []

    def propose(self, context: Context) -> Proposal:
        self.seen.append(context)
        what, old, new = self.edits.pop(0)
        assert old in context.train_py
        return Proposal(what, context.train_py.replace(old, new))


NARROWER = ("MLP_RATIO 4 -> 3", "MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
FEWER_STEPS = ("four Newton-Schulz steps", "steps=5)", "steps=4)")
SOFTER = ("LOGIT_SOFTCAP 15 -> 30", "LOGIT_SOFTCAP = 15.0 ", "LOGIT_SOFTCAP = 30.0 ")


class Meanwhile(Landscape):
    """During the first run of `source` (on `seed`, when set), `then()` happens: another
    worker's steps on another GPU."""

    def __init__(self, source: str, then, seed: int | None = None) -> None:
        super().__init__()
        self.source, self.then, self.seed = source, then, seed

    def __call__(self, script, *args, **kwargs):
        if (
            self.then is not None and script.read_text() == self.source
            and self.seed in (None, kwargs.get("seed"))
        ):  # fmt: skip
            then, self.then = self.then, None
            then()
        return super().__call__(script, *args, **kwargs)


def test_two_workers_of_a_node_never_run_one_change_twice_and_build_on_one_lineage(alice, tmp_path):
    crew = Crew()
    meanwhile: list[Step] = []
    landscape = Meanwhile(NARROW, lambda: meanwhile.extend([second.step(), second.step()]))
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as one, \
            Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as two:  # fmt: skip
        first = researcher(one, alice, tmp_path / "gpu0", Edits(NARROWER, SOFTER), landscape,
                           verify_every=0, crew=crew)  # fmt: skip
        second_edits = Edits(NARROWER, FEWER_STEPS)
        second = researcher(two, alice, tmp_path / "gpu1", second_edits, landscape,
                            verify_every=0, crew=crew)  # fmt: skip
        first.start()
        second.start()
        assert landscape.runs == [BASELINE]  # the node scores its head once, not once per worker

        # While the first worker runs NARROW, the second proposes it too: refused, it tries its next.
        assert first.step().outcome == "keep"
        assert [s.outcome for s in meanwhile] == ["refused", "keep"]
        assert "running on another worker of this node" in meanwhile[0].reason
        # What it was shown says so, so that a model proposes something else.
        assert [(a.outcome, a.description) for a in second_edits.seen[0].history] == [
            ("running", "MLP_RATIO 4 -> 3")
        ]
        assert (
            landscape.runs.count(NARROW) == 2 and meanwhile[1].head.source == FOUR_STEPS
        )  # two seeds

        # The first worker's keep is better: the second moves onto it and merges its own win in.
        merged = second.step()
        assert merged.outcome == "keep" and merged.head.source == BOTH
        assert merged.description.startswith(f"merge of {sha(FOUR_STEPS)[:12]}: four Newton-Schulz")

        # The first worker's next change builds on the merge, which already holds its own win.
        assert first.step().outcome == "discard"
        assert first.published[-1].body["parent"] == sha(BOTH)
        # Every experiment paired on two seeds (the node calibrates its noise), the same two
        # for every version: a kept child's runs are the next head's, so no head runs twice.
        softer = BOTH.replace(*SOFTER[1:])
        assert landscape.runs == [
            BASELINE, FOUR_STEPS, BASELINE, FOUR_STEPS, NARROW, NARROW, BOTH, BOTH, softer, softer,
        ]  # fmt: skip


class Gated(Landscape):
    """Landscape, except that the run of `source` on `seed` holds until `gate` is set: a run in
    flight on one worker while another worker goes on in another thread. `ran`: (source, seed)
    of every run, in the order they began."""

    def __init__(self, source: str, seed: int) -> None:
        super().__init__()
        self.key, self.ran = (source, seed), []
        self.entered, self.gate = threading.Event(), threading.Event()

    def __call__(self, script, *args, **kwargs):
        self.ran.append((script.read_text(), kwargs.get("seed")))
        if self.ran[-1] == self.key:
            self.entered.set()
            assert self.gate.wait(30)
        return super().__call__(script, *args, **kwargs)


def _worker_thread(tmp_path, me, name: str, landscape, crew: Crew, work) -> threading.Thread:
    """`work(researcher)` in a thread of its own with its own ledger connection, as a node's
    workers run."""

    def body() -> None:
        with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
            work(researcher(book, me, tmp_path / name, Scripted(), landscape, verify_every=0,
                            crew=crew))  # fmt: skip

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_workers_that_start_together_score_the_head_on_both_seeds_never_one_seed_twice(
    alice, tmp_path
):
    """Measured on an H200: both workers of a fresh node scored the baseline on the same seed
    at once, 260 s of GPU time for a run the node had in flight."""
    crew = Crew()
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        second = researcher(book, alice, tmp_path / "gpu1", Scripted(), None, verify_every=0,
                            crew=crew)  # fmt: skip
        seeds = second.seeds()
        landscape = Gated(BASELINE, seeds[0])
        second.run = landscape
        first = _worker_thread(tmp_path, alice, "gpu0", landscape, crew, Researcher.start)
        assert landscape.entered.wait(30)  # the first worker scores the head on the first seed
        second.start()  # meanwhile: the second scores it on the other seed, at once
        assert landscape.ran == [(BASELINE, seeds[0]), (BASELINE, seeds[1])]
        landscape.gate.set()
        first.join(30)
        assert not first.is_alive()
        rows = book.rows("SELECT seed, description FROM runs ORDER BY seed")
        assert sorted((r["seed"], r["description"]) for r in rows) == sorted(
            (seed, "score") for seed in seeds
        )
        # Its first experiment pairs with both runs of the head: none runs again.
        assert second.score_at(BASELINE, seeds[0]) == pytest.approx(1.5 + 0.0004 * (seeds[0] % 3))
        assert len(landscape.ran) == 2


def test_a_worker_waits_for_the_run_another_worker_of_its_node_has_in_flight(alice, tmp_path):
    crew = Crew()
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        seed = researcher(book, alice, tmp_path, Scripted(), None).seeds()[1]
    landscape = Gated(NARROW, seed)
    scores: list = []
    workers: list[Researcher] = []

    def score(worker: Researcher) -> None:
        workers.append(worker)
        scores.append(worker.score_at(NARROW, seed))

    first = _worker_thread(tmp_path, alice, "gpu0", landscape, crew, score)
    assert landscape.entered.wait(30)
    second = _worker_thread(tmp_path, alice, "gpu1", landscape, crew, score)
    deadline = time.monotonic() + 30
    while len(workers) < 2 or not workers[1].now.doing.startswith(
        "pair: waiting for another worker"
    ):
        assert time.monotonic() < deadline and second.is_alive()
        time.sleep(0.01)
    assert crew.has("run", sha(NARROW), str(seed)) and not scores
    landscape.gate.set()
    for thread in (first, second):
        thread.join(30)
        assert not thread.is_alive()
    assert scores == [pytest.approx(1.5 + 0.0004 * (seed % 3) - 0.05)] * 2
    assert landscape.ran == [(NARROW, seed)]  # one run, not one per worker
    assert not crew.has("run", sha(NARROW), str(seed))


class Stopped(Landscape):
    """Landscape that writes each run's result.json in its folder, as the runner does, and
    stops the node (RunCancelled, as Ctrl-C does) at the run of `source` on `seed`."""

    def __init__(self, source: str | None = None, seed: int | None = None) -> None:
        super().__init__()
        self.stop_at = (source, seed)

    def __call__(self, script, profile, data, run_dir, seed=0, on_event=lambda _: None):
        if (script.read_text(), seed) == self.stop_at:
            raise RunCancelled("stopped")
        result = super().__call__(script, profile, data, run_dir, seed=seed, on_event=on_event)
        result = dataclasses.replace(result, run_dir=str(run_dir))
        (run_dir / "result.json").write_text(json.dumps(result.as_dict()))
        return result


def test_a_node_stopped_inside_an_experiment_keeps_its_runs_and_resumes_it(book, alice, tmp_path):
    """On an H200 a stop between a step's runs left its finished 285 s run out of the ledger,
    and a restart would have run it again."""
    first = researcher(book, alice, tmp_path, Scripted(NARROW), Stopped())
    seeds = first.seeds()
    first.run = Stopped(BASELINE, seeds[1])  # stopped at the head's run on the second seed
    first.start()
    with pytest.raises(RunCancelled):
        first.step()
    assert book.rows("SELECT child, seed, fact_id FROM runs WHERE child != parent") == [
        {"child": sha(NARROW), "seed": seeds[0], "fact_id": None}
    ]  # the run is there at once: `swarm ledger` shows it
    assert not book.rows("SELECT id FROM results")

    landscape = Stopped()
    again = researcher(book, alice, tmp_path, Scripted(), landscape)  # it proposes nothing
    step = again.step()
    assert step.outcome == "keep" and step.description == "try 1"  # the change it had in hand
    assert landscape.runs == [BASELINE, NARROW]  # only what was missing, on the second seed
    fact = again.published[-1]
    assert fact.body["seeds"] == seeds
    rows = book.rows("SELECT seed, outcome, fact_id FROM runs WHERE child = ?", (sha(NARROW),))
    assert sorted(r["seed"] for r in rows) == sorted(seeds)
    assert {(r["outcome"], r["fact_id"]) for r in rows} == {("keep", fact.id)}


def test_two_workers_of_a_node_never_verify_one_claim_at_once(book, alice, bob, tmp_path):
    crew = Crew()
    with ledger_of(tmp_path, "bob") as bobs:
        researcher(
            bobs, bob, tmp_path / "bob", Scripted(NARROW), Landscape(), verify_every=0
        ).step()
        gossip(bobs, book)
    meanwhile: list = []
    landscape = Meanwhile(NARROW, lambda: meanwhile.append(second.step()))
    first = researcher(book, alice, tmp_path / "gpu0", Scripted(), landscape, verify_every=1,
                       crew=crew)  # fmt: skip
    second = researcher(book, alice, tmp_path / "gpu1", Edits(SOFTER), landscape, verify_every=1,
                        crew=crew)  # fmt: skip
    first.start()
    second.start()
    landscape.seed = first.seeds()[0]  # the first look's run of the child
    checked = first.step()  # verifies bob's claim; meanwhile the second worker researches instead
    assert isinstance(checked, Verified) and checked.verdict == "confirm"
    assert [type(s) for s in meanwhile] == [Step] and meanwhile[0].outcome == "discard"
    assert landscape.runs.count(NARROW) == 1
    assert [f.kind for f in first.published + second.published] == ["verification", "result"]


def test_the_nodes_speed_comes_from_its_own_runs_never_from_a_strangers_claim(
    book, alice, tmp_path
):
    """A claimed train.py that does no training runs at a huge counted speed: were it counted,
    the node's next honest runs would look like too much work and be voided."""
    worker = researcher(book, alice, tmp_path, Scripted(), Landscape())
    harness = harness_sha256(PROFILE)
    for description, speed in (("score", 2.0e10), ("pair", 2.2e10), ("verify abc: child-s1", 6e12)):
        book.record_run(profile="test", parent="p", child="c", outcome="ok", val_bpb=3.0,
                        description=description, harness=harness, speed=speed)  # fmt: skip
    assert worker.speed() == pytest.approx(2.1e10)


DAVE = Identity(bytes(range(3, 35)))
ERIN = Identity(bytes(range(4, 36)))
FRANK = Identity(bytes(range(5, 37)))


def _claim(book, author, parent: str, child: str, gain: float, description: str = "next"):
    """`author`'s kept claim of `child` on `parent`, signing a gain of `gain` on its one seed
    (the child at 1.5 - gain), stored in `book` with both versions."""
    for source in (parent, child):
        book.add_version(source.encode())
    body = wire.result_body(
        parent=sha(parent), child=sha(child), diff=b"d", description=description,
        profile="test", harness=harness_sha256(PROFILE), seed=1, outcome="keep",
        metrics={"val_bpb": 1.5 - gain, "steps": 1, "tokens": 1}, pairs=[(1, 1.5 - gain, 1.5)],
    )  # fmt: skip
    fact = wire.sign(author, "result", CAMPAIGN, book.next_seq(author.public_key), body)
    book.ingest(fact.raw)
    return fact


def _verified_claim(book, author, verifier, parent: str, child: str, gain: float = 0.05,
                    replayed_by: Identity | None = None, claimed: float = 0.05) -> wire.Fact:  # fmt: skip
    """`author`'s kept claim of `child` on `parent` (of a gain of `claimed`), with `verifier`'s
    looks enough to verify it, and `replayed_by`'s replays of the same seeds with the same
    scores, if given."""
    fact = _claim(book, author, parent, child, claimed, "a win")
    for who in (verifier, replayed_by) if replayed_by else (verifier,):
        for seed in range(consensus.HOLD_LOOKS):
            look = wire.verification_body(
                result=fact.id, child_val_bpb=1.5 - gain, parent_val_bpb=1.5, seed=100 + seed,
                profile="test", harness=harness_sha256(PROFILE), verdict="confirm",
            )  # fmt: skip
            book.ingest(
                wire.sign(who, "verification", CAMPAIGN, book.next_seq(who.public_key), look).raw
            )
    return fact


def test_a_node_re_measures_the_head_it_adopts_as_a_look_at_its_claim(
    book, alice, bob, carol, tmp_path
):
    """The look pairs the head on the first seed the node builds on it with: the head runs once,
    for the look and the research after it alike (its verifier's seeds were replayed already)."""
    claim = _verified_claim(book, alice, bob, BASELINE, NARROW, replayed_by=DAVE)
    landscape = Landscape()
    node = researcher(book, carol, tmp_path, Scripted(SOFTCAP), landscape, verify_every=4)
    node.start()
    assert node.adopted == sha(NARROW) and node.head.sha256 == sha(NARROW)
    looked = node.step()
    assert isinstance(looked, Verified) and looked.fact.body["result"] == claim.id
    assert looked.fact.body["seed"] == node.seeds()[0]
    assert looked.fact.body["delta"] == pytest.approx(-0.05)
    assert landscape.runs.count(NARROW) == 1  # the look's run of the head is the score it uses
    step = node.step()  # research from the head: its first pair needs no new run of the head
    assert isinstance(step, Step) and step.pairs[0][0] == node.seeds()[0]
    seeds = [r["seed"] for r in book.rows("SELECT seed FROM runs WHERE child = ?", (sha(NARROW),))]
    assert len(seeds) == len(set(seeds)) == landscape.runs.count(NARROW)  # never a seed twice


def test_before_any_look_an_author_is_taken_at_its_word_only_for_a_gain_of_the_verified_size(
    book, alice, bob, carol, tmp_path
):
    _verified_claim(book, alice, bob, BASELINE, NARROW, gain=0.05, replayed_by=DAVE)
    node = researcher(book, carol, tmp_path, Scripted(), Landscape(), verify_every=4)
    node.start()
    assert node.adopted == sha(NARROW)
    for source, claimed in ((BOTH, 0.5), (NARROW_SOFTCAP, 0.05)):
        fact = _claim(book, alice, NARROW, source, claimed)
        ahead = node._speculate()
        # ten times the largest verified gain: not at its word; the size of one: at its word,
        # the node's first run of it a look
        if source == BOTH:
            assert ahead is None and node.head.sha256 == sha(NARROW)
        else:
            assert isinstance(ahead, Verified) and ahead.fact.body["result"] == fact.id
            # its own look found the child worse: the evidence no longer favours it
            assert ahead.verdict == "refute" and node._speculate() is None
            assert node.head.sha256 == sha(NARROW)


def test_an_adopter_replays_a_seed_of_looks_nobody_replayed_and_a_made_up_one_is_out(
    book, alice, bob, carol, tmp_path
):
    """A win verified by one peer's looks that no run stands behind: the adopter, drawn as the
    only peer that neither made nor reported them, re-scores it on one of their seeds instead
    of its own, the scores differ, and the win is no longer verified: the head moves back to
    the baseline at once."""
    claim = _verified_claim(book, alice, bob, BASELINE, NARROW, gain=0.05)
    node = researcher(book, carol, tmp_path, Scripted(), Landscape(), verify_every=4)
    node.start()
    looked = node.rescored
    assert looked is not None and looked.fact.body["seed"] in range(100, 100 + consensus.HOLD_LOOKS)
    results, looks = book.claim_rows("test")
    judged = consensus.judge_claims(results, looks, book.rules("test"))[claim.id]
    assert judged.contested == tuple(sorted((bob.peer_id, carol.peer_id)))
    assert best_head(book, "test", sha(BASELINE)) == sha(BASELINE)


def test_nodes_auditing_at_once_replay_a_few_seeds_between_them(book, alice, bob, tmp_path):
    """A win verified by four peers' looks that nobody replayed, and every active peer but its
    author (the four lookers and eight more) on it, auditing the head's lineage at once, each
    unaware of the others: a committee's worth of seeds are replayed, one replayer a seed, while
    the replays agree; not one replay per look at once. Once a replay disagreed with a look,
    every such seed is due."""
    claim = _claim(book, alice, BASELINE, NARROW, 0.05, "a win")
    for k, who in enumerate((bob, DAVE, ERIN, FRANK)):
        for seed in range(100 * (k + 1), 100 * (k + 1) + consensus.HOLD_LOOKS):
            look = wire.verification_body(
                result=claim.id, child_val_bpb=1.45, parent_val_bpb=1.5, seed=seed,
                profile="test", harness=harness_sha256(PROFILE), verdict="confirm",
            )  # fmt: skip
            book.ingest(
                wire.sign(who, "verification", CAMPAIGN, book.next_seq(who.public_key), look).raw
            )
    auditors = [Identity(bytes(range(10 + k, 42 + k))) for k in range(8)]
    for who in auditors:  # active peers all: each ran an experiment of its own
        body = wire.result_body(
            parent=sha(BASELINE), child=sha(SOFTCAP), diff=b"d", description="softcap",
            profile="test", harness=harness_sha256(PROFILE), seed=1, outcome="discard",
            metrics={"val_bpb": 1.52, "steps": 1, "tokens": 1}, pairs=[(1, 1.52, 1.5)],
        )  # fmt: skip
        book.ingest(wire.sign(who, "result", CAMPAIGN, book.next_seq(who.public_key), body).raw)

    def replays(disagreed: bool, *more: Identity) -> list[int]:
        seeds = []  # the replayer drawn for a seed is always one of these nodes
        for k, who in enumerate([*auditors, bob, DAVE, ERIN, FRANK, *more]):
            with ledger_of(tmp_path, f"{disagreed}{k}") as theirs:
                gossip(book, theirs)
                node = researcher(theirs, who, tmp_path / f"{disagreed}{k}", Scripted(),
                                  Landscape(), verify_every=0)  # fmt: skip
                node.start()
                assert node.adopted == sha(NARROW)
                seed = node._replay_seed(node._claim_row(claim.id))
                if seed is not None:
                    seeds.append(seed)
        return seeds

    calm = replays(False)
    assert 1 <= len(calm) <= book.rules("test").committee_size == 3  # one seed a node at once
    assert len(set(calm)) == len(calm)
    # a replay by another peer that differs from one of bob's looks: every seed is due
    made_up = wire.verification_body(
        result=claim.id, child_val_bpb=1.5, parent_val_bpb=1.5, seed=100, profile="test",
        harness=harness_sha256(PROFILE), verdict="refute",
    )  # fmt: skip
    grace = Identity(bytes(range(6, 38)))
    book.ingest(wire.sign(grace, "verification", CAMPAIGN, book.next_seq(grace.public_key),
                          made_up).raw)  # fmt: skip
    due = replays(True, grace)  # each node its first seed drawn: a node drawn twice waits
    assert len(due) > len(calm) and len(set(due)) == len(due)


def test_looks_that_revoke_an_adopted_win_move_every_node_back(book, alice, bob, carol, tmp_path):
    """A win verified by lucky looks (two peers ran the same seeds): the adopter's re-score and
    later audits find no gain, the pooled evidence no longer verifies it, and the head moves
    back to the baseline."""
    _verified_claim(
        book, alice, bob, BASELINE, SOFTCAP, gain=0.03, replayed_by=DAVE, claimed=0.03
    )  # really +0.02
    node = researcher(book, carol, tmp_path, Scripted(), Landscape(), verify_every=1)
    node.start()  # adopts it, and re-scores it: one look
    assert node.adopted == sha(SOFTCAP) and node.rescored is not None
    audits = 0
    while best_head(book, "test", sha(BASELINE)) != sha(BASELINE) and audits < 8:
        assert node._audit() is not None  # a look on a fresh seed each time
        audits += 1
    assert best_head(book, "test", sha(BASELINE)) == sha(BASELINE) and 1 <= audits < 8
    node.step()
    assert node.adopted == sha(BASELINE)


def test_before_any_gain_is_verified_an_author_is_taken_at_its_word_for_a_gain_a_margin_lets_by(
    book, alice, carol, tmp_path
):
    """With no verified gain on the profile yet to size a claim by, a claim of a gain the size
    a keep margin lets through (consensus.PRIOR_GAIN_SIGMAS of the paired noise, times
    HOLD_FACTOR) is researched ahead from at once, its first run a look; a claim far past it
    waits for a peer's look."""
    node = researcher(book, carol, tmp_path, Scripted(), Landscape(), verify_every=4)
    node.start()
    assert node.adopted == sha(BASELINE)
    scale = consensus.HOLD_FACTOR * consensus.PRIOR_GAIN_SIGMAS * PROFILE.paired_noise
    for source, claimed in ((NARROW, 10 * scale), (SOFTCAP, scale / 2)):
        fact = _claim(book, alice, BASELINE, source, claimed)
        ahead = node._speculate()
        if source == NARROW:
            assert ahead is None and node.head.sha256 == sha(BASELINE)
        else:
            assert isinstance(ahead, Verified) and ahead.fact.body["result"] == fact.id


def test_with_members_only_a_claims_committee_takes_its_author_at_its_word(
    book, alice, bob, carol, tmp_path
):
    """In a campaign with members, before any look that counts a claim is researched ahead from
    on its author's word by its committee alone, whose looks count for every node; a member
    outside it waits for theirs (a flood of claims would cost every node a run each). A node's
    own look, which the committee does not count, still tells it where to research: one that
    found no gain stays on the adopted head."""
    who = {p.peer_id: p for p in (alice, carol, DAVE, ERIN, FRANK)}
    set_terms(book, baseline=sha(BASELINE), members=[bob.peer_id, *who])
    scale = consensus.PRIOR_GAIN_SIGMAS * PROFILE.paired_noise
    fact = _claim(book, bob, BASELINE, NARROW, scale / 2)
    drawn = committees.committee(committees.draw_of(fact.body | {"author": bob.peer_id}),
                                 bob.peer_id, [bob.peer_id, *who], 3)  # fmt: skip
    inside, outside, doubter = [who[p] for p in drawn[:1]] + [who[p] for p in who if p not in drawn]

    def node(me, runs):
        n = researcher(book, me, tmp_path / me.peer_id[-6:], Scripted(), runs, verify_every=4)
        n.start()
        return n

    def worse_narrow(script, *args, **kwargs):  # a node whose runs find the change a loss
        result = Landscape()(script, *args, **kwargs)
        if "MLP_RATIO = 3 " in script.read_text():
            return dataclasses.replace(result, val_bpb=result.val_bpb + 0.1)
        return result

    outsider, insider, doubting = node(outside, Landscape()), node(inside, Landscape()), node(
        doubter, worse_narrow)  # fmt: skip
    assert outsider._speculate() is None and outsider.head.sha256 == sha(BASELINE)
    assert isinstance(insider._speculate(), Verified)  # the committee's look, which counts
    assert book.standings("test", every=True)[1][fact.id].seeds == 1
    assert isinstance(outsider._speculate(), Verified)  # now the outsider goes ahead too
    assert outsider._speculate() is None and outsider.head.sha256 == sha(NARROW)
    assert isinstance(doubting._speculate(), Verified)  # its own look finds a loss
    assert doubting._speculate() is None and doubting.head.sha256 == sha(BASELINE)


def test_a_nodes_own_keep_that_the_adopted_head_lacks_is_rebased_onto_it_first(
    book, alice, bob, carol, tmp_path
):
    """alice keeps FOUR_STEPS while bob's NARROW, found beside it on the same parent, is
    verified: adopting NARROW, her next experiment is her own change merged onto it (BOTH),
    before anything her proposer has; so a win found beside the adopted one adds to it."""
    landscape = Landscape()
    worker = researcher(book, alice, tmp_path, Scripted(FOUR_STEPS, SOFTCAP), landscape,
                        verify_every=0)  # fmt: skip
    assert worker.step().outcome == "keep" and worker.head.source == FOUR_STEPS
    _verified_claim(book, bob, carol, BASELINE, NARROW, replayed_by=DAVE)
    rebased = worker.step()
    assert worker.adopted == sha(NARROW)
    assert rebased.outcome == "keep" and worker.head.source == BOTH
    assert rebased.description.startswith(f"merge of {sha(FOUR_STEPS)[:12]}")
    assert rebased.fact.body["parent"] == sha(NARROW)


def test_an_honest_win_refuted_by_made_up_losses_is_replayed_and_judged_again(
    book, alice, bob, carol, tmp_path
):
    """alice signs NARROW's real gain (0.05); dave refutes it with two looks no run stands
    behind. Its author's numbers contradict the refutation, so the node drawn for one of dave's
    seeds replays it: the seed is contested (one report against one), dave's looks count for
    nothing until a third report decides, and NARROW is refuted no more."""
    landscape = Landscape()
    claim = _verified_claim(book, alice, DAVE, BASELINE, NARROW, gain=-0.02)  # dave's losses
    assert book.standings("test", every=True)[1][claim.id].state == "refuted"
    replayed: dict[int, set[str]] = {}
    for _ in range(4):  # each replayer replays the seed it is drawn for, as often as drawn
        for who, name in ((bob, "bob"), (carol, "carol")):
            with ledger_of(tmp_path, name) as theirs:
                gossip(book, theirs)
                node = researcher(theirs, who, tmp_path / name, Scripted(), landscape)
                node.start()
                looked = node._recheck()
                if looked is not None:
                    assert looked.fact.body["seed"] in range(100, 100 + consensus.HOLD_LOOKS)
                    replayed.setdefault(looked.fact.body["seed"], set()).add(name)
                gossip(theirs, book)
        if book.standings("test", every=True)[1][claim.id].state != "refuted":
            break
    looks = book.rows(f"SELECT {LOOK_COLUMNS} FROM verifications WHERE result = ?", (claim.id,))
    row = book.rows("SELECT * FROM results WHERE id = ?", (claim.id,))[0]
    judged = consensus.judge_claim(row, looks, book.rules("test", 1))
    assert judged.state == "open" and DAVE.peer_id in judged.contested
    assert sum(len(names) for names in replayed.values()) == 1  # one replayer, drawn
