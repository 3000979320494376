"""One research step on the `test` profile: a real run, the keep/discard rule, a signed result."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from conftest import CAMPAIGN

from node.agent.errors import PatchError, ProposalRefused
from node.agent.loop import Head, research_step
from node.agent.offline import OfflineProposer
from node.agent.patch import change_hash
from node.agent.proposers import Context, Proposal, context_from_ledger
from node.ledger import Ledger
from node.trainer import BASELINE_TRAIN_PY, RunResult, get_profile

BASELINE = BASELINE_TRAIN_PY.read_text()
FAST = dataclasses.replace(
    get_profile("test"), budget_seconds=2, startup_seconds=30, grace_seconds=5, eval_seconds=30
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


def test_a_win_is_kept_published_signed_and_becomes_the_head(book, alice, tmp_path, small_data):
    head = Head(BASELINE, val_bpb=99.0)  # any trained model beats this by more than the margin
    step = research_step(book, alice, OfflineProposer(1), head, 0.01, FAST, small_data, tmp_path)
    assert step.outcome == "keep", step.reason
    child = step.head.sha256
    assert child != head.sha256 and step.head.val_bpb == step.run.val_bpb
    body = step.fact.body
    assert step.fact.kind == "result" and step.fact.author == alice.public_key
    assert (body["parent"], body["child"], body["outcome"]) == (head.sha256, child, "keep")
    assert body["diff_sha256"] == change_hash(BASELINE, step.head.source)  # the change's name
    assert book.version(child) == step.head.source.encode()
    assert book.rows("SELECT outcome, fact_id FROM runs") == [
        {"outcome": "keep", "fact_id": step.fact.id}
    ]
    # The next proposal on the same parent knows this change was tried, by this node.
    context = context_from_ledger(book, BASELINE, "test", me=alice.peer_id)
    assert body["diff_sha256"] in context.tried_hashes
    assert context.history[0].by == "this node" and context.history[0].outcome == "keep"
    again = OfflineProposer(1).propose(context)
    assert change_hash(BASELINE, again.source) != body["diff_sha256"]


def test_a_gain_within_the_margin_is_discarded_but_still_published(
    book, alice, tmp_path, small_data
):
    head = Head(BASELINE, val_bpb=0.5)  # no run on this profile gets near it
    step = research_step(book, alice, OfflineProposer(2), head, 0.01, FAST, small_data, tmp_path)
    assert step.outcome == "discard" and step.head == head
    assert step.fact.body["outcome"] == "discard" and step.fact.body["metrics"]["val_bpb"] > 0.5


def test_a_crashing_change_is_published_as_a_crash(book, alice, tmp_path, small_data):
    broken = BASELINE.replace("S = session()\n", "S = session()\nraise RuntimeError('boom')\n")
    proposer = Scripted(Proposal("a change that crashes", broken))
    step = research_step(
        book, alice, proposer, Head(BASELINE, 3.0), 0.01, FAST, small_data, tmp_path
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
        book, alice, Scripted(answer), Head(BASELINE, 3.0), 0.01, FAST, None, tmp_path, check=policy
    )
    assert step.outcome == "refused" and reason in step.reason and step.run is None
    assert book.rows("SELECT COUNT(*) AS n FROM results") == [{"n": 0}]


def test_a_proposal_that_breaks_the_policy_never_runs(book, alice, tmp_path):
    sneaky = BASELINE.replace("S.finish(model)", "open('/etc/passwd')\nS.finish(model)")
    step = research_step(
        book, alice, Scripted(Proposal("read a file", sneaky)), Head(BASELINE, 3.0), 0.01, FAST,
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
        book, alice, Scripted(Proposal("narrower", spaced)), Head(BASELINE, 3.0), 0.01, FAST,
        None, tmp_path, run=run,
    )  # fmt: skip
    assert ran == [clean] and step.head.source == clean
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
        book, alice, Scripted(Proposal("looks ahead", better)), head, 0.01, FAST, None, tmp_path,
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
