"""One research step on the `test` profile: real runs paired with the head's, the keep/discard
rule, a signed result."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from conftest import CAMPAIGN

from node import margins, noise
from node.agent import loop
from node.agent.errors import PatchError, ProposalRefused
from node.agent.loop import Head
from node.agent.offline import OfflineProposer
from node.agent.patch import change_hash
from node.agent.proposers import Context, Proposal, context_from_ledger
from node.ledger import Ledger
from node.trainer import BASELINE_TRAIN_PY, RunResult, get_profile

BASELINE = BASELINE_TRAIN_PY.read_text()
FAST = dataclasses.replace(
    get_profile("test"), startup_seconds=30, max_train_seconds=10, eval_seconds=30
)


SIGMA = 0.01  # the standard deviation of a paired difference: a margin of 0.02 on one seed


def research_step(book, me, proposer, head, sigma, profile, data, work_dir, **kwargs):
    """The loop's step on this node's seeds 1 and 2, its head scoring what `head` says on each."""
    kwargs.setdefault("parent_score", lambda seed: head.val_bpb)
    return loop.research_step(
        book, me, proposer, head, sigma, profile, data, work_dir, seeds=(1, 2), **kwargs
    )


class Scripted:
    """A proposer that returns what it is given (or raises it)."""

    def __init__(self, answer):
        self.answer = answer

    def propose(self, context: Context) -> Proposal:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.fixture
def book(tmp_path):
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as ledger:
        yield ledger


@pytest.mark.slow
def test_a_win_is_kept_published_signed_and_becomes_the_head(book, alice, tmp_path, small_data):
    head = Head(BASELINE, val_bpb=99.0)  # any trained model beats this by more than the margin
    step = research_step(book, alice, OfflineProposer(1), head, SIGMA, FAST, small_data, tmp_path)
    assert step.outcome == "keep", step.reason
    child = step.head.sha256
    assert child != head.sha256
    # A win on the first seed is run on the second before it is kept: its score is their mean.
    assert [seed for seed, _, _ in step.pairs] == [1, 2] and step.run.seed == 1
    assert step.head.val_bpb == pytest.approx(sum(c for _, c, _ in step.pairs) / 2)
    body = step.fact.body
    assert body["seeds"] == [1, 2] and body["parent_scores"] == [99.0, 99.0]
    assert body["child_scores"] == [c for _, c, _ in step.pairs]
    assert body["metrics"]["val_bpb"] == pytest.approx(step.head.val_bpb)
    assert body["budget"] == FAST.budget_tokens and body["device"].startswith("cpu ")
    assert step.fact.kind == "result" and step.fact.author == alice.public_key
    assert (body["parent"], body["child"], body["outcome"]) == (head.sha256, child, "keep")
    assert body["diff_sha256"] == change_hash(BASELINE, step.head.source)  # the change's name
    assert book.version(child) == step.head.source.encode()
    assert book.rows("SELECT outcome, fact_id, seed FROM runs") == [
        {"outcome": "keep", "fact_id": step.fact.id, "seed": seed} for seed in (1, 2)
    ]
    # The next proposal on the same parent knows this change was tried, by this node.
    context = context_from_ledger(book, BASELINE, "test", me=alice.peer_id)
    assert body["diff_sha256"] in context.tried_hashes
    assert context.history[0].by == "this node" and context.history[0].outcome == "keep"
    again = OfflineProposer(1).propose(context)
    assert change_hash(BASELINE, again.source) != body["diff_sha256"]


@pytest.mark.slow
def test_a_gain_within_the_margin_is_discarded_but_still_published(
    book, alice, tmp_path, small_data
):
    head = Head(BASELINE, val_bpb=0.5)  # no run on this profile gets near it
    step = research_step(book, alice, OfflineProposer(2), head, SIGMA, FAST, small_data, tmp_path)
    assert step.outcome == "discard" and step.head == head
    assert step.fact.body["outcome"] == "discard" and step.fact.body["metrics"]["val_bpb"] > 0.5


def test_a_crashing_change_is_published_as_a_crash(book, alice, tmp_path, small_data):
    broken = BASELINE.replace("S = session()\n", "S = session()\nraise RuntimeError('boom')\n")
    proposer = Scripted(Proposal("a change that crashes", broken))
    step = research_step(
        book, alice, proposer, Head(BASELINE, 3.0), SIGMA, FAST, small_data, tmp_path
    )
    assert step.outcome == "crash" and "exited with code 1" in step.reason
    assert step.fact.body["outcome"] == "crash" and step.fact.body["metrics"]["val_bpb"] is None


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (ProposalRefused("the reply holds no change"), "no change"),
        (Proposal("broken", BASELINE.replace("import math", "import math(")), "does not compile"),
        (Proposal("blocked", BASELINE + "\nimport os\n"), "policy says no"),
    ],
)
def test_a_refused_or_failing_proposal_never_runs_nor_publishes(
    book, alice, tmp_path, answer, reason
):
    def policy(source: str) -> None:
        if "import os" in source:
            raise PatchError("policy says no: os")

    step = research_step(
        book,
        alice,
        Scripted(answer),
        Head(BASELINE, 3.0),
        SIGMA,
        FAST,
        None,
        tmp_path,
        check=policy,
    )
    assert step.outcome == "refused" and reason in step.reason and step.run is None
    assert book.rows("SELECT COUNT(*) AS n FROM results") == [{"n": 0}]


def test_a_proposal_that_breaks_the_policy_never_runs(book, alice, tmp_path):
    sneaky = BASELINE.replace("S.finish(model)", "open('/etc/passwd')\nS.finish(model)")
    step = research_step(
        book, alice, Scripted(Proposal("read a file", sneaky)), Head(BASELINE, 3.0), SIGMA, FAST,
        None, tmp_path,
    )  # fmt: skip
    assert (
        step.outcome == "refused" and "breaks the policy" in step.reason and "open" in step.reason
    )
    assert book.rows("SELECT COUNT(*) AS n FROM runs") == [{"n": 0}]


def test_trailing_spaces_on_added_lines_are_not_part_of_the_change(book, alice, tmp_path):
    clean = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
    spaced = clean.replace("over the model width\n", "over the model width   \n")
    ran = []

    def run(script, profile, data, run_dir, seed=0, on_event=None):
        ran.append(script.read_text())
        child = hashlib.sha256(ran[-1].encode()).hexdigest()
        return RunResult(
            "ok", 1.0, 1, 64, 1.0, 2.0, None, None, child, "ab" * 32, "test", seed, "d"
        )

    step = research_step(
        book, alice, Scripted(Proposal("narrower", spaced)), Head(BASELINE, 3.0), SIGMA, FAST,
        None, tmp_path, run=run,
    )  # fmt: skip
    assert ran == [clean, clean] and step.head.source == clean  # a win: run on both seeds
    assert step.fact.body["child"] == hashlib.sha256(clean.encode()).hexdigest()
    assert step.fact.body["diff_sha256"] == change_hash(BASELINE, clean)


def test_void_run_is_published_and_never_kept(book, alice, tmp_path):
    better = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")

    def run(script, profile, data, run_dir, seed=0, on_event=None):
        child = hashlib.sha256(script.read_bytes()).hexdigest()
        return RunResult(
            "void", None, 1, 64, 1.0, 2.0, None, None, child, "ab" * 32, "test", seed, "d",
            error="its predictions depend on later tokens",
        )  # fmt: skip

    head = Head(BASELINE, 3.0)  # any score would beat this
    step = research_step(
        book, alice, Scripted(Proposal("looks ahead", better)), head, SIGMA, FAST, None, tmp_path,
        run=run,
    )  # fmt: skip
    assert step.outcome == "void" and step.reason == "its predictions depend on later tokens"
    assert step.head == head  # never kept: the head does not move
    body = step.fact.body
    assert body["outcome"] == "void" and body["metrics"]["val_bpb"] is None
    assert book.rows("SELECT outcome, val_bpb, fact_id FROM runs") == [
        {"outcome": "void", "val_bpb": None, "fact_id": step.fact.id}
    ]
    assert book.rows("SELECT outcome FROM results") == [{"outcome": "void"}]


def fixed_run(score):
    """A run that scores `score(seed)` without training."""

    def run(script, profile, data, run_dir, seed=0, on_event=None):
        child = hashlib.sha256(script.read_bytes()).hexdigest()
        return RunResult(
            "ok", score(seed), 1, 64, 1.0, 2.0, None, None, child, "ab" * 32, "test", seed, "d",
            run_dir=str(run_dir), device_name="cpu AVX2",
        )  # fmt: skip

    return run


def test_every_comparison_is_paired_and_a_second_seed_runs_only_where_it_tells(
    book, alice, tmp_path
):
    """Child and head on the same seeds: a first pair that is no win ends the step; while the
    node calibrates its noise, every experiment runs on both seeds."""
    heads = {1: 3.00, 2: 3.10}  # the head's score on each of this node's seeds
    children = {1: 3.001, 2: 3.107}
    change = Proposal("narrower", BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 "))
    step = research_step(
        book, alice, Scripted(change), Head(BASELINE, 3.05), SIGMA, FAST, None, tmp_path,
        parent_score=heads.get, run=fixed_run(children.get),
    )  # fmt: skip
    assert step.outcome == "discard" and step.pairs == ((1, 3.001, 3.00),)
    other = Proposal("wider", BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 5 "))
    step = research_step(
        book, alice, Scripted(other), Head(BASELINE, 3.05), SIGMA, FAST, None, tmp_path,
        parent_score=heads.get, run=fixed_run(children.get), calibrating=True,
    )  # fmt: skip
    assert step.outcome == "discard" and step.pairs == ((1, 3.001, 3.00), (2, 3.107, 3.10))
    assert step.fact.body["child_scores"] == [3.001, 3.107]
    assert step.fact.body["parent_scores"] == [3.00, 3.10]
    # Unpaired, this child (3.054 on average) would look 0.004 worse than a head of 3.05; paired,
    # its differences are +0.001 and +0.007.
    assert noise.own_pairs(book, "test", "ab" * 32) == {}  # the head's own runs are the caller's


def test_a_pair_whose_second_seed_ran_for_its_first_ones_luck_never_measures_the_noise(
    book, alice, tmp_path
):
    """After calibration a second seed runs only when the first looked like a win: the two
    differences of such a pair spread more than the noise (the first was chosen for its luck),
    so the node's noise estimate leaves the pair out; a calibration pair counts."""
    head = hashlib.sha256(BASELINE.encode()).hexdigest()
    for seed in (1, 2):  # the head's own runs, as the node records them
        book.record_run(started=0, finished=0, profile="test", parent=head, child=head,
                        outcome="ok", val_bpb=3.00, description="score", seed=seed,
                        harness="ab" * 32)  # fmt: skip
    scores = {1: 3.00, 2: 3.00}
    lucky = Proposal("lucky", BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 "))
    research_step(
        book, alice, Scripted(lucky), Head(BASELINE, 3.0), SIGMA, FAST, None, tmp_path,
        parent_score=scores.get, run=fixed_run({1: 2.97, 2: 3.02}.get),
    )  # fmt: skip
    assert noise.own_pairs(book, "test", "ab" * 32) == {}
    calibration = Proposal("wider", BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 5 "))
    research_step(
        book, alice, Scripted(calibration), Head(BASELINE, 3.0), SIGMA, FAST, None, tmp_path,
        parent_score=scores.get, run=fixed_run({1: 3.01, 2: 2.99}.get), calibrating=True,
    )  # fmt: skip
    (diffs,) = noise.own_pairs(book, "test", "ab" * 32).values()
    assert diffs == pytest.approx([0.01, -0.01])


def test_a_change_the_run_does_not_see_costs_one_run_even_while_calibrating(book, alice, tmp_path):
    """A child that scores as its parent did (a constant only another profile reads) ends the
    step after one seed: its second seed would add a difference of zero to the noise."""
    inert = Proposal("unread", BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 "))
    ran: list[int] = []

    def run(script, profile, data, run_dir, seed=0, on_event=None):
        ran.append(seed)
        return fixed_run({1: 3.00, 2: 3.10}.get)(script, profile, data, run_dir, seed, on_event)

    step = research_step(
        book, alice, Scripted(inert), Head(BASELINE, 3.05), SIGMA, FAST, None, tmp_path,
        parent_score={1: 3.00, 2: 3.10}.get, run=run, calibrating=True,
    )  # fmt: skip
    assert step.outcome == "discard" and ran == [1] and step.pairs == ((1, 3.00, 3.00),)


def test_pairs_of_an_unseen_change_never_shrink_the_noise():
    seen = {("p", "c"): [0.01, 0.03]}
    assert margins.paired_noise({**seen, ("p", "d"): [0.0, 0.0]}, 0.0, 0, inert=1e-4) == (
        margins.paired_noise(seen, 0.0, 0)
    )
    within = {**seen, ("p", "d"): [0.0, 0.00005]}  # a GPU's replay noise, say
    assert margins.paired_noise(within, 0.0, 0, inert=1e-4)[1] == 1
    assert margins.paired_noise(within, 0.0, 0)[1] == 2  # a difference: counted


def test_a_peers_discard_the_evidence_favours_runs_again_here_and_nowhere_it_ran(
    book, alice, bob, tmp_path
):
    """A real gain of one sigma fails a margin of two more often than not: the offline proposer
    proposes a peer's favoured discard again (`offline.again`), and the step runs it on this
    node's seeds and publishes the result. A change tried here that no proposer asked to run
    again, or one this node ran, is refused without a run."""
    from node.agent.patch import make_diff, normalise_diff
    from node.wire import result_body

    edit = "Four Newton-Schulz steps in Muon instead of five"
    child = dict(OfflineProposer(0).candidates(BASELINE, "test"))[edit]
    diff = normalise_diff(make_diff(BASELINE, child)).encode()
    parent = hashlib.sha256(BASELINE.encode()).hexdigest()
    body = result_body(
        parent=parent, child=hashlib.sha256(child.encode()).hexdigest(), diff=diff,
        description=edit, profile="test", harness=loop._harness(FAST), seed=9, outcome="discard",
        metrics={"val_bpb": 2.988, "steps": 1, "tokens": 64, "train_seconds": 1.0,
                 "total_seconds": 2.0},
        pairs=[(9, 2.988, 3.0)],  # 0.012 better: inside its margin, favoured by the evidence
    )  # fmt: skip
    book.publish(bob, "result", body)  # as a peer's fact arrives, and its train.py with it
    book.add_version(child.encode())
    head, scores = Head(BASELINE, 3.0), {1: 3.0, 2: 3.0}
    again = research_step(
        book, alice, OfflineProposer(0), head, SIGMA, FAST, None, tmp_path,
        parent_score=scores.get, run=fixed_run({1: 2.97, 2: 2.975}.get),
    )  # fmt: skip
    assert again.description == edit and again.outcome == "keep", again.reason
    assert again.fact.body["diff_sha256"] == change_hash(BASELINE, child)
    authors = {r["author"] for r in book.rows("SELECT author FROM results WHERE description = ?",
                                              (edit,))}  # fmt: skip
    assert authors == {alice.peer_id, bob.peer_id}
    for proposal in (Proposal(edit, child), Proposal(edit, child, rerun=True)):  # ran here
        step = research_step(book, alice, Scripted(proposal), head, SIGMA, FAST, None, tmp_path,
                             parent_score=scores.get, run=fixed_run(scores.get))  # fmt: skip
        assert step.outcome == "refused" and "already tried on this head" in step.reason


def test_a_win_on_one_seed_that_the_second_does_not_repeat_is_discarded(book, alice, tmp_path):
    heads = {1: 3.00, 2: 3.00}
    lucky = {1: 2.97, 2: 3.02}  # 0.03 better on seed 1 (a margin of 0.02), 0.02 worse on seed 2
    change = Proposal("lucky", BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 "))
    step = research_step(
        book, alice, Scripted(change), Head(BASELINE, 3.0), SIGMA, FAST, None, tmp_path,
        parent_score=heads.get, run=fixed_run(lucky.get),
    )  # fmt: skip
    # A mean gain of 0.005 over two seeds, against a margin of 2 x 0.01 / sqrt(2) = 0.014.
    assert step.outcome == "discard" and len(step.pairs) == 2
