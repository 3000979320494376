"""Verification: which claims a node re-runs, and the verdict it publishes from its own runs."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from conftest import CAMPAIGN, make_result, make_verification, set_terms, vote_row

from node import committees, consensus, evidence, wire
from node.agent.errors import AgentError
from node.agent.verifier import claims_to_verify, ledger_claims_to_verify, verify_claim
from node.identity import Identity
from node.ledger import Ledger
from node.standing import ledger_standing, silenced
from node.trainer import BASELINE_TRAIN_PY, RunResult, get_profile, harness_sha256, run_experiment
from node.trainer.runner import OVERRUN

BASELINE = BASELINE_TRAIN_PY.read_text()
LOOP = "for micro, (x, y) in enumerate(S.batches(DEVICE_BATCH)):"
UNTRAINED = BASELINE.replace(LOOP, LOOP + "\n    continue")  # a parent any trained child beats
FAST = dataclasses.replace(
    get_profile("test"),
    budget_tokens=3 * 2**14,
    startup_seconds=30,
    max_train_seconds=10,
    eval_seconds=30,
)
HARNESS = harness_sha256(FAST)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


RULES = consensus.Rules(quorum=1, sigma=0.005, tolerance=1e-4)


def rules(quorum=1, **kw):
    return consensus.Rules(quorum=quorum, sigma=0.005, tolerance=1e-4, **kw)


def row(rid, author, claimed=0.02, outcome="keep", profile="test", harness="h", parent="p"):
    """A kept claim; `claimed` the author's own paired gain on its seed."""
    return {"id": rid, "author": author, "val_bpb": 1.5 - claimed, "outcome": outcome,
            "profile": profile, "harness": harness, "parent": parent, "child": f"c{rid}",
            "seeds": [1], "child_scores": [1.5 - claimed], "parent_scores": [1.5],
            "device": "cpu"}  # fmt: skip


def look(rid, author, gain=0.03, seed=7, verdict="confirm"):
    return vote_row(
        rid, author, verdict, profile="test", delta=None if gain is None else -gain, seed=seed
    )


def looks(rid, author, gains):
    return [look(rid, author, g, seed=100 + i) for i, g in enumerate(gains)]


def picked(results, verifications, me="me", r=RULES, **kw):
    return [c["id"] for c in claims_to_verify(results, verifications, me, "test", "h", r, **kw)]


def test_a_node_verifies_open_claims_of_others_largest_claimed_gain_first():
    results = [
        row("r1", "alice", 0.01), row("r2", "bob", 0.03), row("r3", "me", 0.09),  # own: never
        row("r4", "bob", 0.05, outcome="discard"), row("r5", "bob", 0.08, harness="other"),
        row("r6", "carol", 0.02), row("r7", "carol", 0.025), row("r8", "alice", 0.04),
        row("r9", "carol", 0.005), row("r2", "bob", 0.03),  # a fact delivered twice
    ]  # fmt: skip
    verifications = [
        look("r6", "me", 0.004),  # looked at once by this node: after the new ones
        *looks("r7", "alice", [0.05] * 3),  # verified
        *looks("r8", "carol", [-0.02] * 3),  # refuted
        look("r9", "carol", 0.5),  # its author's own look: it counts for nothing
        look("r1", "me", None, verdict="crash"),  # it crashed here: not again
    ]
    assert picked(results, verifications) == ["r2", "r9", "r6"]  # carol's r6 after her r9


def test_a_flood_of_claims_by_one_author_does_not_starve_the_others():
    flood = [row(f"f{i:03d}", "flooder", 0.5 - i / 1000) for i in range(500)]  # "better" claims
    honest = [row("h1", "alice", 0.03), row("h2", "bob", 0.02), row("h3", "bob", 0.04)]
    assert picked(flood + honest, [], limit=4) == ["f000", "h3", "h1", "f001"]  # round-robin
    # Once this node has looked at a few of the flooder's claims, the others' come first.
    seen = [look(f"f{i:03d}", "me", None, verdict="crash") for i in range(3)]
    assert picked(flood + honest, seen, limit=3) == ["h3", "h1", "h2"]
    waiting = picked(flood, [], limit=100, per_author=8)
    assert len(waiting) == 8  # the rest of the flood waits: it is not even sorted into the queue


def test_claims_of_peers_that_lost_standing_are_not_verified():
    results = [row("r1", "faker", 0.4), row("r2", "alice", 0.02)]
    assert picked(results, [], skip={"faker"}) == ["r2"]


def test_claims_on_the_frontier_come_first_so_a_chain_can_be_adopted_from_the_baseline():
    results = [
        {**row("deep", "bob", 0.05), "parent": "v1", "child": "v2"},  # on an unverified win
        {**row("first", "bob", 0.02), "parent": "base", "child": "v1"},
        {**row("side", "carol", 0.01), "parent": "base", "child": "v3"},
    ]
    assert picked(results, [], baseline="base") == ["first", "side", "deep"]
    once_first_is_verified = picked(results, looks("first", "carol", [0.05] * 3), baseline="base")
    assert once_first_is_verified == ["deep", "side"]  # v1 is now on the frontier


def test_a_node_looks_again_until_the_claim_is_decided_or_it_has_given_its_share():
    results = [row("r1", "alice", 0.02)]
    assert picked(results, looks("r1", "me", [0.004] * 3)) == ["r1"]  # still open: again
    assert picked(results, looks("r1", "me", [0.004] * evidence.PEER_CAP)) == []  # its share
    assert picked(results, looks("r1", "me", [0.05] * 3)) == []  # verified: done
    budget = [x for i in range(4) for x in looks("r1", f"p{i}", [0.0] * 4)]  # the look budget
    assert consensus.judge_claims(results, budget, RULES)["r1"].state == consensus.UNPROVEN
    assert picked(results, budget) == []


def test_a_held_claim_comes_again():
    results = [row("r1", "alice", 0.3)]
    once = [look("r1", "me", 0.3)]  # the profile's first win: held for more seeds
    assert consensus.judge_claims(results, once, RULES)["r1"].state == consensus.HELD
    assert picked(results, once) == ["r1"]


def test_a_bundle_held_for_a_claim_it_carries_waits_on_that_claim_not_on_more_looks():
    """A verified bundle carrying an open claim is held until that claim is verified: looks at
    the bundle cannot move it, looks at the claim can, so only the claim is picked."""
    part = {**row("r2", "bob", 0.02), "child": "ab" * 32}
    bundle = {**row("r3", "carol", 0.04, parent="c1"), "description": f"bundle of 1: {'ab' * 6}"}
    results = [row("r1", "alice", 0.03), part, bundle]
    seen = [*looks("r1", "x", [0.03] * 4), *looks("r3", "x", [0.04] * 4)]
    judged = consensus.judge_claims(results, seen, RULES)
    assert [judged[r].state for r in ("r1", "r2", "r3")] == ["verified", "open", consensus.HELD]
    assert picked(results, seen) == ["r2"]
    verified = [*seen, *looks("r2", "y", [0.02] * 4)]
    assert consensus.judge_claims(results, verified, RULES)["r3"].state == "verified"


def test_a_node_verifies_only_claims_whose_committee_it_sits_on():
    members = frozenset({"alice", "me", "bob", "carol", "dave", "erin"})
    r = rules(1, members=members, committee=2)
    results = [row(f"r{i}", "alice", 0.02, parent=f"p{i // 2}") for i in range(12)]
    mine = picked(results, [], r=r, limit=20)
    on = [
        c["id"] for c in results
        if "me" in committees.committee(committees.draw_of(c), c["author"], members, 2)
    ]  # fmt: skip
    assert sorted(mine) == sorted(on) and 0 < len(on) < len(results)


def test_a_contradicted_members_seat_is_taken_by_the_next_in_rank():
    """A member that replays contradicted sits on no committee: the next member in rank looks
    at the claims whose committee it sat on."""
    members = frozenset({"alice", "me", "bob", "carol", "dave", "erin", "frank", "gina"})
    r = rules(1, members=members, committee=3)
    seats = lambda c, out=(): committees.panel(c, r, out)  # noqa: E731
    claim = next(c for c in (row("r2", "alice", parent=f"p{i}") for i in range(200))
                 if "me" not in seats(c) and "me" in seats(c, {min(seats(c))}))  # fmt: skip
    liar = min(seats(claim))
    other = row("r1", "alice", parent="q")

    def report(author, child):
        return {**look("r1", author, 1.52 - child, seed=10), "child_val_bpb": child,
                "parent_val_bpb": 1.52, "device": "cpu"}  # fmt: skip

    replayers = sorted(members - {"alice", "me", liar})[:2]
    made_up = [report(liar, 1.50), *(report(who, 1.531) for who in replayers)]
    assert picked([claim, other], [], r=r, limit=20) == []
    judged = consensus.judge_claims([claim, other], made_up, r)
    assert consensus.contradicted(judged) == {liar}
    assert picked([claim, other], made_up, r=r, limit=20) == ["r2"]


@pytest.fixture
def book(tmp_path):
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as ledger:
        set_terms(ledger, baseline=sha(BASELINE))
        yield ledger


def claim_in(book, author, parent: str, child: str, bpb: float = 1.4):
    book.add_version(parent.encode())
    book.add_version(child.encode())
    fact = make_result(author, 1, sha(parent), sha(child), bpb, profile="test", harness=HARNESS)
    book.ingest(fact.raw)
    return {"id": fact.id, "author": author.peer_id, **fact.body}


VOID = "void"  # a score of scripted_run's: the harness refused to score the run


def scripted_run(scores: dict[str, float | str | None]):
    """A runner that scores each train.py as told, without training (for verdict logic): a
    number, None (a crash) or VOID."""

    def run(script, profile, data, run_dir, seed=0):
        source = script.read_text()
        bpb = scores[source]
        outcome = "void" if bpb == VOID else "ok" if bpb is not None else "crash"
        error = {"ok": None, "crash": "train.py exited with code 1",
                 "void": "its predictions depend on later tokens"}[outcome]  # fmt: skip
        return RunResult(
            outcome=outcome, val_bpb=bpb if outcome == "ok" else None, steps=1, tokens=64,
            train_seconds=1.0, total_seconds=2.0, peak_memory_mb=None, mfu=None,
            train_py_sha256=sha(source), harness_sha256=HARNESS, profile=profile.name, seed=seed,
            data_sha256="d", error=error,
        )  # fmt: skip

    return run


@pytest.mark.parametrize(
    ("child_bpb", "parent_bpb", "expected"),
    [
        (1.40, 1.50, "confirm"),
        (1.499, 1.50, "inconclusive"),
        (1.51, 1.50, "refute"),
        (None, 1.50, "crash"),
        (VOID, 1.50, "void"),
    ],  # fmt: skip
)
def test_the_verdict_comes_from_this_nodes_own_runs(
    book, alice, bob, tmp_path, child_bpb, parent_bpb, expected
):
    child = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
    claimed = claim_in(book, alice, BASELINE, child, bpb=1.0)  # the claimed number is ignored
    run = scripted_run({child: child_bpb, BASELINE: parent_bpb})
    done = verify_claim(book, bob, claimed, 0.01, FAST, None, tmp_path, seed=9, run=run)
    assert done.verdict == expected
    # A void child has nothing to pair: its parent does not run.
    assert done.parent_val_bpb == (None if expected == "void" else parent_bpb)
    assert done.child_val_bpb == (child_bpb if isinstance(child_bpb, float) else None)
    body = done.fact.body
    assert (body["result"], body["verdict"], body["seed"]) == (claimed["id"], expected, 9)
    stored = book.rows("SELECT author, verdict FROM verifications")
    assert stored == [{"author": bob.peer_id, "verdict": expected}]
    runs = 1 if expected == "void" else 2  # child and parent, each recorded
    assert book.rows("SELECT seed FROM runs") == [{"seed": 9}] * runs


def test_an_earlier_own_score_of_the_parent_saves_its_run(book, alice, bob, tmp_path):
    child = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
    claimed = claim_in(book, alice, BASELINE, child)
    run = scripted_run({child: 1.45})  # the parent would raise KeyError if it ran
    done = verify_claim(
        book, bob, claimed, 0.01, FAST, None, tmp_path, seed=3, parent_score={3: 1.5}.get, run=run
    )
    assert done.verdict == "confirm" and done.parent_val_bpb == 1.5


def test_a_node_never_verifies_its_own_claim_nor_one_it_cannot_read(book, alice, bob, tmp_path):
    child = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
    claimed = claim_in(book, alice, BASELINE, child)
    with pytest.raises(AgentError, match="its own claim"):
        verify_claim(book, alice, claimed, 0.01, FAST, None, tmp_path, run=scripted_run({}))
    missing = {**claimed, "child": "ee" * 32}
    with pytest.raises(AgentError, match="lacks the child.*fetch it"):
        verify_claim(book, bob, missing, 0.01, FAST, None, tmp_path, run=scripted_run({}))
    assert book.rows("SELECT COUNT(*) AS n FROM verifications") == [{"n": 0}]


@pytest.mark.parametrize(("parent_bpb", "what"), [(None, "crashed"), (VOID, "was voided")])
def test_a_crashed_or_voided_parent_run_publishes_no_verdict(
    book, alice, bob, tmp_path, parent_bpb, what
):
    child = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
    claimed = claim_in(book, alice, BASELINE, child)
    with pytest.raises(AgentError, match="own run of the parent.*crashed or was voided"):
        verify_claim(book, bob, claimed, 0.01, FAST, None, tmp_path,
                     run=scripted_run({child: 1.4, BASELINE: parent_bpb}))  # fmt: skip
    assert book.rows("SELECT COUNT(*) AS n FROM verifications") == [{"n": 0}]


def test_a_void_for_training_past_the_budget_is_run_again_before_it_is_published(
    book, alice, bob, tmp_path
):
    """A pause of the verifier's machine at the budget's end looks like training past it; the
    verdict costs the author its standing at once, so the child is run a second time first."""
    child = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
    claimed = claim_in(book, alice, BASELINE, child, bpb=1.4)
    honest, calls = scripted_run({child: 1.4, BASELINE: 1.5}), []

    def paused_once(script, profile, data, run_dir, seed=0):
        result = honest(script, profile, data, run_dir, seed)
        calls.append(script.read_text() == child)
        if calls == [True]:
            return dataclasses.replace(result, outcome="void", val_bpb=None,
                                       error=f"training ran 2.60 s, {OVERRUN} of 2 s")  # fmt: skip
        return result

    done = verify_claim(book, bob, claimed, 0.01, FAST, None, tmp_path, seed=4, run=paused_once)
    assert calls == [True, True, False]  # the child twice, then the parent
    assert done.verdict == "confirm" and done.child_run.outcome == "ok"
    assert [r["outcome"] for r in book.rows("SELECT outcome FROM runs ORDER BY id")] == [
        "void", "ok", "ok"
    ]  # fmt: skip


def test_verifier_reports_void_when_the_childs_rerun_is_voided(book, alice, bob, carol, tmp_path):
    child = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
    claimed = claim_in(book, alice, BASELINE, child, bpb=0.5)  # a great score, by cheating
    run = scripted_run({child: VOID, BASELINE: 1.5})
    done = verify_claim(book, bob, claimed, 0.01, FAST, None, tmp_path, seed=4, run=run)
    assert done.verdict == "void" and done.child_run.outcome == "void"
    body = done.fact.body
    assert (body["verdict"], body["child_val_bpb"], body["parent_val_bpb"], body["delta"]) == (
        "void",
        None,
        None,  # nothing to pair with: the parent did not run
        None,
    )
    assert book.rows("SELECT verdict FROM verifications") == [{"verdict": "void"}]
    assert book.rows("SELECT outcome FROM runs ORDER BY id") == [{"outcome": "void"}]
    # One peer's void may be a framer's: the claim waits for another peer's run.
    assert [c["id"] for c in ledger_claims_to_verify(book, carol.peer_id, "test", HARNESS)] == [
        claimed["id"]
    ]
    assert alice.peer_id not in silenced(ledger_standing(book))
    again = verify_claim(book, carol, claimed, 0.01, FAST, None, tmp_path, seed=5, run=run)
    assert again.verdict == "void"
    assert ledger_claims_to_verify(book, carol.peer_id, "test", HARNESS) == []  # settled: failed
    assert alice.peer_id in silenced(ledger_standing(book))  # at once


@pytest.mark.slow
def test_a_real_win_is_confirmed_by_a_peer_and_becomes_verified(
    book, alice, bob, tmp_path, small_data
):
    claimed = claim_in(book, alice, UNTRAINED, BASELINE, bpb=3.0)
    assert [c["id"] for c in ledger_claims_to_verify(book, bob.peer_id, "test", HARNESS)] == [
        claimed["id"]
    ]
    assert ledger_claims_to_verify(book, alice.peer_id, "test", HARNESS) == []  # its own
    done = verify_claim(book, bob, claimed, 0.01, FAST, small_data, tmp_path, seed=3)
    assert done.verdict == "confirm", done.child_run.error
    assert done.child_val_bpb < done.parent_val_bpb - 0.3
    assert done.fact.body["harness"] == HARNESS
    # The profile's first verified win sets the outlier hold's scale: it needs more looks, and
    # this node gives them, each with a fresh seed, against its own score of the parent.
    assert book.held_claims().keys() == {claimed["id"]}
    for seed in range(4, 3 + consensus.HOLD_LOOKS):
        (again,) = ledger_claims_to_verify(book, bob.peer_id, "test", HARNESS)
        assert again["id"] == claimed["id"]
        look = verify_claim(book, bob, again, 0.01, FAST, small_data, tmp_path, seed=seed)
        assert look.verdict == "confirm", look.child_run.error
    assert book.head("test", baseline=sha(UNTRAINED)) == sha(BASELINE) and book.held_claims() == {}
    assert ledger_claims_to_verify(book, bob.peer_id, "test", HARNESS) == []  # judged now


def test_a_child_that_breaks_the_policy_is_refuted_without_running(book, alice, bob, tmp_path):
    sneaky = BASELINE.replace("S.finish(model)", "__import__('os').system('true')\nS.finish(model)")
    claimed = claim_in(book, alice, BASELINE, sneaky)
    done = verify_claim(book, bob, claimed, 0.01, FAST, None, tmp_path, run=scripted_run({}))
    assert (
        done.verdict == "refute"
        and done.child_run is None
        and done.fact.body["child_val_bpb"] is None
    )
    assert book.rows("SELECT COUNT(*) AS n FROM runs") == [{"n": 0}]


def test_a_node_stops_verifying_a_peer_that_lost_standing(book, alice, bob, carol):
    fakes = [make_result(alice, seq, sha(BASELINE), f"{seq:064x}", 0.5, profile="test",
                         harness=HARNESS) for seq in range(1, 5)]  # fmt: skip
    for fake in fakes:
        book.ingest(fake.raw)
    assert len(ledger_claims_to_verify(book, bob.peer_id, "test", HARNESS, limit=10)) == 4
    for seq, fake in enumerate(fakes[:2], 1):
        book.ingest(make_verification(carol, seq, fake, "refute", harness=HARNESS, delta=0.05).raw)
    assert len(ledger_claims_to_verify(book, bob.peer_id, "test", HARNESS, limit=10)) == 2  # noise
    book.ingest(make_verification(carol, 3, fakes[2], "void", harness=HARNESS).raw)
    assert alice.peer_id not in silenced(ledger_standing(book))  # one peer's word
    dave = Identity(bytes(range(3, 35)))
    book.ingest(make_verification(dave, 1, fakes[2], "void", harness=HARNESS).raw)
    assert alice.peer_id in silenced(ledger_standing(book))
    assert ledger_claims_to_verify(book, bob.peer_id, "test", HARNESS, limit=10) == []


def test_looks_add_up_a_gain_within_one_runs_noise_confirmed_and_none_refuted(
    book, alice, bob, tmp_path
):
    def look(claimed, child, child_bpb):
        run = scripted_run({child: child_bpb})
        return verify_claim(book, bob, claimed, 0.01, FAST, None, tmp_path, parent_score=lambda _: 1.5,
                            run=run).verdict  # fmt: skip

    small = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
    real = claim_in(book, alice, BASELINE, small)
    assert look(real, small, 1.494) == "inconclusive"  # a gain of 0.006, within the margin 0.01
    assert look(real, small, 1.4915) == "confirm"  # mean 0.00725 > 0.01 / sqrt(2)
    other = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 5 ")
    lucky = claim_in(book, alice, BASELINE, other)
    assert look(lucky, other, 1.494) == "inconclusive"
    assert look(lucky, other, 1.508) == "refute"  # mean -0.001: no gain
    mine = book.rows("SELECT result, verdict FROM verifications WHERE author = ? ORDER BY rowid",
                     (bob.peer_id,))  # fmt: skip
    assert [v["verdict"] for v in mine] == ["inconclusive", "confirm", "inconclusive", "refute"]


@pytest.mark.slow
def test_a_replay_of_the_authors_own_seed_finds_scores_edited_before_signing(
    book, alice, bob, carol, tmp_path, small_data
):
    """The author ran child and parent on its seed 5 and signed what it measured, then signed
    two claims more with edited numbers: a lower child, a higher parent. On the same device
    class the verifier replays seed 5: the honest claim replays to the bit, the edited ones are
    misreported, and their author loses its standing once a second peer's replay agrees."""
    parent, child = UNTRAINED, BASELINE  # a real win: the fresh look confirms it
    measured = {}
    for role, source in (("parent", parent), ("child", child)):
        (tmp_path / f"{role}.py").write_text(source)
        measured[role] = run_experiment(
            tmp_path / f"{role}.py", FAST, small_data, tmp_path / role, seed=5
        )
        assert measured[role].outcome == "ok", measured[role].error
    book.add_version(parent.encode())
    book.add_version(child.encode())
    c, p = measured["child"].val_bpb, measured["parent"].val_bpb
    parents = {5: p}  # this machine's score of the parent by seed, as a node keeps them

    def parent_at(seed: int) -> float:
        if seed not in parents:
            again = run_experiment(
                tmp_path / "parent.py", FAST, small_data, tmp_path / "p", seed=seed
            )
            parents[seed] = again.val_bpb
        return parents[seed]

    verdicts = {}
    claims = {
        "honest": (5, c, p),
        "child edited": (5, c - 0.05, p),
        "parent edited": (5, c, p + 0.05),
    }
    for what, pair in claims.items():
        body = wire.result_body(
            parent=sha(parent), child=sha(child), diff=b"d", description=what, profile="test",
            harness=HARNESS, seed=5, outcome="keep", metrics={"val_bpb": pair[1], "steps": 1, "tokens": 1},
            pairs=[pair], device=measured["child"].device_name, budget=FAST.budget_tokens,
        )  # fmt: skip
        fact = book.publish(alice, "result", body)
        (row,) = book.rows(
            "SELECT * FROM results WHERE id = ?", (fact.id,)
        )  # as the ledger holds it
        done = verify_claim(
            book, bob, row, 0.01, FAST, small_data, tmp_path / what, seed=11, parent_score=parent_at
        )
        verdicts[what] = done.verdict
        assert done.fact.body["replay_val_bpb"] == c  # the replay is the author's run, to the bit
        if what != "honest":  # one peer's replay may be a framer's: another peer's decides
            first = what == "child edited"
            assert (alice.peer_id in silenced(ledger_standing(book))) == (not first)
            again = verify_claim(book, carol, row, 0.01, FAST, small_data, tmp_path / f"{what} 2",
                                 seed=12, parent_score=parent_at)  # fmt: skip
            assert again.verdict == "misreported"
    assert verdicts["honest"] == "confirm"
    assert verdicts["child edited"] == verdicts["parent edited"] == "misreported"
    assert alice.peer_id in silenced(ledger_standing(book))
    (why,) = ledger_standing(book)[alice.peer_id].reasons
    assert why.startswith("2 claim(s) found misreported: replays of its seed gave other scores")
