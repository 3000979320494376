"""The adoption rule: pooled evidence per claim, its sequential test, committees, the one head."""

from __future__ import annotations

import random

import pytest
from conftest import BASELINE, HARNESS, confirming_looks, make_result
from hypothesis import given, settings
from hypothesis import strategies as st

from node import consensus, evidence, merges, wire
from node.committees import committee, draw_of, holds, kept_head, panel, ranked, ranking, seated
from node.consensus import (
    HELD,
    HOLD_LOOKS,
    Rules,
    best_head,
    judge_claims,
    lineage_scores,
    rows_from_facts,
    verified_children,
)

V1, V2, V3 = "11" * 32, "22" * 32, "33" * 32
SIGMA = 0.005  # the paired noise these tests judge by
RULES = Rules(quorum=1, sigma=SIGMA, tolerance=1e-4)


def rules(quorum: int = 1, **kw) -> Rules:
    return Rules(quorum=quorum, sigma=SIGMA, tolerance=1e-4, **kw)


def result(rid, author, parent, child, val_bpb=1.4, outcome="keep", profile="cpu", harness="h",
           claimed=None, device="cpu"):  # fmt: skip
    """A result row; `claimed` the author's paired gain on its one seed (child 1.5 - gain)."""
    row = {"id": rid, "author": author, "parent": parent, "child": child, "val_bpb": val_bpb,
           "outcome": outcome, "profile": profile, "harness": harness, "device": device}  # fmt: skip
    if claimed is not None:
        row.update(seeds=[1], child_scores=[1.5 - claimed], parent_scores=[1.5])
    return row


def look(rid, author, gain=0.03, seed=7, verdict="confirm", profile="cpu", harness="h",
         replay=None, device="cpu"):  # fmt: skip
    """One paired look: `gain` is parent minus child on `seed` (None: no score)."""
    return {"result": rid, "author": author, "verdict": verdict, "profile": profile,
            "harness": harness, "delta": None if gain is None else -gain, "seed": seed,
            "replay_val_bpb": replay, "device": device}  # fmt: skip


def looks(rid, author, gains, **kw):
    return [look(rid, author, g, seed=100 + i, **kw) for i, g in enumerate(gains)]


def state(results, verifications, r=RULES, rid="r1"):
    return judge_claims(results, verifications, r)[rid].state


# ---------------------------------------------------------------------------------------------
# The sequential test


def test_a_clear_win_is_verified_by_one_look_and_a_loss_is_refuted():
    results = [result("r1", "a", BASELINE, V1)]
    assert state(results, [look("r1", "b", gain=0.03)]) in ("verified", HELD)
    assert state(results, looks("r1", "b", [-0.01] * 3)) == "refuted"
    assert state(results, [look("r1", "b", gain=0.004)]) == "open"  # within one look's noise


def test_a_small_real_gain_is_verified_as_looks_add_up():
    results = [result("r1", "a", BASELINE, V1)]
    rng = random.Random(3)
    gains = [0.005 + rng.gauss(0, SIGMA) for _ in range(16)]
    states = [state(results, looks("r1", "b", gains[:n])) for n in range(1, 17)]
    assert states[0] == "open" and "verified" in states


def test_the_false_verification_rate_of_a_zero_gain_claim_is_at_most_alpha():
    """Monte Carlo: a claim of no gain, looked at one seed at a time up to the look budget by
    three verifiers, judged after every look; verified if any judgement verified it."""
    rng = random.Random(11)
    results, trials, verified = [result("r1", "a", BASELINE, V1)], 600, 0
    for _ in range(trials):
        rows = []
        for n in range(consensus.LOOK_BUDGET):
            rows.append(look("r1", f"p{n % 3}", rng.gauss(0, SIGMA), seed=n))
            s = state(results, rows)
            if s in ("verified", HELD, "refuted"):
                verified += s != "refuted"
                break
    assert verified / trials <= evidence.ALPHA


def test_the_noise_is_never_taken_below_the_profiles_but_a_noisier_machine_raises_it():
    results = [result("r1", "a", BASELINE, V1)]
    quiet = judge_claims(results, looks("r1", "b", [0.01, 0.0100001]), RULES)["r1"]
    loud = judge_claims(results, looks("r1", "b", [0.05, -0.03, 0.04, -0.02]), RULES)["r1"]
    assert quiet.sigma == SIGMA and loud.sigma > SIGMA


def test_a_peers_seeds_weigh_at_most_the_peer_cap():
    results = [result("r1", "a", BASELINE, V1)]
    many = looks("r1", "b", [0.004] * (evidence.PEER_CAP + 20))
    assert judge_claims(results, many, RULES)["r1"].seeds == evidence.PEER_CAP


def test_a_look_again_on_the_same_seed_is_the_same_look():
    results = [result("r1", "a", BASELINE, V1)]
    again = [look("r1", "b", 0.03, seed=1), look("r1", "b", 0.01, seed=1)]
    judged = judge_claims(results, again, RULES)["r1"]
    assert judged.seeds == 1 and judged.gain == pytest.approx(0.02)


def test_a_verdict_is_never_final_later_looks_revoke_it():
    results = [result("r1", "a", BASELINE, V1), result("r2", "a", V1, V2)]
    lucky = [look("r1", "b", 0.02), *looks("r1", "c", [0.02] * 3), *looks("r2", "b", [0.03] * 3)]
    assert best_head(results, lucky, "cpu", BASELINE, RULES) == V2
    audits = [look("r1", f"auditor{i}", -0.01, seed=i) for i in range(8)]
    assert state(results, lucky + audits) != "verified"
    assert best_head(results, lucky + audits, "cpu", BASELINE, RULES) == BASELINE


# ---------------------------------------------------------------------------------------------
# Who counts: the author never, liars not alone, committees


def test_the_authors_own_looks_never_count():
    results = [result("r1", "a", BASELINE, V1)]
    assert state(results, looks("r1", "a", [0.05] * 5)) == "open"


@pytest.mark.parametrize("quorum", [2, 3])
def test_quorum_minus_one_liars_alone_never_verify_a_claim(quorum):
    """The test passes only with the quorum - 1 most favourable verifiers left out."""
    results = [result("r1", "a", BASELINE, V1)]
    liars = [x for i in range(quorum - 1) for x in looks("r1", f"liar{i}", [0.5] * 8)]
    honest = looks("r1", "honest", [0.0, 0.001, -0.001])
    assert state(results, liars + honest, rules(quorum)) != "verified"
    real = [x for i in range(quorum) for x in looks("r1", f"h{i}", [0.03] * 3)]
    assert state(results, real, rules(quorum)) in ("verified", HELD)


def test_a_liar_outvoted_by_agreeing_verifiers_is_an_outlier_and_left_out():
    results = [result("r1", "a", BASELINE, V1)]
    rows = [
        *looks("r1", "b", [0.03] * 2),
        *looks("r1", "c", [0.03] * 2),
        *looks("r1", "liar", [-0.4] * 8),
    ]
    judged = judge_claims(results, rows, rules(2))["r1"]
    assert judged.outliers == ("liar",) and judged.state in ("verified", HELD)
    assert judged.gain == pytest.approx(0.03)


def test_two_against_two_decides_nothing_and_nobody_is_an_outlier():
    results = [result("r1", "a", BASELINE, V1)]
    rows = [*looks("r1", "b", [0.03] * 2), *looks("r1", "c", [0.03] * 2),
            *looks("r1", "x", [-0.2] * 8), *looks("r1", "y", [-0.2] * 8)]  # fmt: skip
    judged = judge_claims(results, rows, rules(2))["r1"]
    assert judged.state == "open" and judged.disputed and judged.outliers == ()


def test_a_committee_is_drawn_by_hash_without_the_author_and_nobody_else_counts():
    members = frozenset({"a", "b", "c", "d", "e", "f", "g"})
    results = [result("r1", "a", BASELINE, V1)]
    panel = committee(draw_of(results[0]), "a", members, 3)
    assert len(panel) == 3 and "a" not in panel
    assert panel == committee(draw_of(results[0]), "a", set(members), 3)
    outsider = next(m for m in sorted(members - {"a"}) if m not in panel)
    r = rules(1, members=members, committee=3)
    assert state(results, looks("r1", outsider, [0.05] * 4), r) == "open"
    assert state(results, looks("r1", "stranger", [0.05] * 4), r) == "open"
    assert state(results, looks("r1", panel[0], [0.05] * 4), r) in ("verified", HELD)


def test_a_kept_head_of_the_ranking_finds_the_committee_while_members_come_and_go():
    """A ledger keeps the head of a claim's ranking up to its second committee's worth of members
    not out (`kept_head`); the committee is the first in it not out (`seated`), the same as the
    whole ranking's (`panel`) whoever is out, as long as the head `holds` a committee of them;
    when it does not, or it is no longer that ranking's head, it must be drawn again."""
    members = frozenset("abcdefghijkl")
    claim = result("r1", "a", BASELINE, V1)
    r = rules(1, members=members, committee=3)
    order = ranking(claim, r)
    assert order == ranked(draw_of(claim), "a", members, 99) and "a" not in order
    head = kept_head(order, {order[1]}, 3)  # order[1] was out when it was kept
    assert head == order[:7]
    for out in [(), {order[1]}, {order[0], order[2], order[5]}, set(order[1:4])]:
        assert holds(head, order, out, 3)
        assert seated(head, out, 3) == tuple(sorted(panel(claim, r, out)))
    # Four of its seven out: three left, still a committee; five out: drawn again, deeper.
    assert holds(head, None, set(order[:4]), 3) and not holds(head, None, set(order[:5]), 3)
    deeper = kept_head(order, set(order[:5]), 3)
    assert deeper == order[:11] and seated(deeper, set(order[:5]), 3) == tuple(sorted(order[5:8]))
    assert not holds(head, order[1:], (), 3)  # another ranking (the members changed)
    # Members run out: the whole ranking holds whatever is out.
    assert kept_head(order, set(order), 3) == order and holds(order, order, set(order[:10]), 3)
    assert seated(order, set(order[:10]), 3) == (order[10],)


def test_an_author_cannot_redraw_its_committee_by_making_claims_anew():
    """A claim's id is the author's to vary (a new signed time, a comment in the child): fifty
    claims of one author on one version draw one committee, whose looks alone count for each;
    another version or another author draws another."""
    members = frozenset("abcdefghijk")
    claims = [result(f"r{i}", "a", BASELINE, f"{i:064x}") for i in range(50)]
    (panel,) = {committee(draw_of(c), "a", members, 3) for c in claims}
    r = rules(1, members=members, committee=3)
    friend = min(members - {"a"} - set(panel))
    for claim in claims[:5]:  # a friend's looks count for none of them
        assert state(claims, looks(claim["id"], friend, [0.05] * 6), r, claim["id"]) == "open"
    assert len({committee(draw_of(result("r", "a", f"{i:064x}", V1)), "a", members, 3)
                for i in range(30)}) > 1  # fmt: skip
    assert len({committee(draw_of(result("r", who, BASELINE, V1)), who, members, 3)
                for who in members}) > 1  # fmt: skip


def test_a_win_whose_author_claimed_far_more_waits_for_a_replay_of_the_authors_seed():
    """The looks verify a gain, but the author signed one far above it: not verified until a
    replay of the author's seed gives the signed numbers, misreported when replays do not."""
    results = [result("r1", "a", BASELINE, V1, claimed=0.5)]  # 50 times what its peers see
    seen = looks("r1", "b", [0.01] * 4) + looks("r1", "c", [0.01] * 4)
    honest = [result("r1", "a", BASELINE, V1, claimed=0.01)]
    assert state(honest, seen) in ("verified", HELD)
    judged = judge_claims(results, seen, RULES)["r1"]
    assert judged.state == "open" and judged.awaits_replay and "replay" in judged.reason
    backed = [*seen, look("r1", "d", 0.01, seed=200, replay=1.5 - 0.5)]  # the signed score
    assert state(results, backed) in ("verified", HELD)
    denied = [*seen, look("r1", "d", 0.01, seed=200, replay=1.49)]  # what a run of it gives
    once = judge_claims(results, denied, RULES)["r1"]  # one peer's word, perhaps a framer's
    assert once.state == "open" and once.awaits_replay and "another peer's replay" in once.reason
    twice = [*denied, look("r1", "e", 0.01, seed=201, replay=1.49)]
    assert state(results, twice) == "misreported"


def report(rid, author, seed, child, parent, device="cpu"):
    """A look that signs both of its scores, as a node's does: child and parent on `seed`."""
    verdict = "confirm" if parent > child else "refute"
    return {**look(rid, author, parent - child, seed=seed, verdict=verdict, device=device),
            "child_val_bpb": child, "parent_val_bpb": parent}  # fmt: skip


def test_a_look_no_run_stands_behind_is_contradicted_by_two_replays_of_its_seed():
    made_up = [report("r1", "c", 10 + k, 1.50, 1.52) for k in range(3)]  # a 4-sigma gain, thrice
    results = [result("r1", "a", BASELINE, V1)]
    assert state(results, made_up) in ("verified", HELD)
    one = [*made_up, report("r1", "h1", 10, 1.531, 1.530)]  # the seed's real scores: no gain
    judged = judge_claims(results, one, RULES)["r1"]
    assert judged.contested == ("c", "h1") and judged.state == "open"  # one against one
    two = [*one, report("r1", "h2", 10, 1.53105, 1.53002)]  # a second replay agrees with the first
    judged = judge_claims(results, two, RULES)["r1"]
    assert judged.contradicted == ("c",) and judged.contested == ()
    assert judged.state != "verified" and judged.peers == ("h1",)  # the seed weighs once
    # on another device class, a replay proves nothing: scores differ between classes
    other = [*made_up, *(report("r1", h, 10, 1.531, 1.530, device="gpu") for h in ("h1", "h2"))]
    assert judge_claims(results, other, RULES)["r1"].contradicted == ()


def test_a_committee_members_replay_of_an_outsiders_seed_weighs_in_its_own_looks():
    members = frozenset("abcdefgh")
    panel = committee(draw_of(result("r1", "a", BASELINE, V1)), "a", members, 3)
    outsider = min(m for m in members - {"a"} if m not in panel)
    judge = max(panel)  # a later id than the outsider's: the seed must still weigh for it
    assert outsider < judge
    r = rules(1, members=members, committee=3)
    rows = [report("r1", who, 10, 1.50, 1.52) for who in (outsider, judge)]
    judged = judge_claims([result("r1", "a", BASELINE, V1)], rows, r)["r1"]
    assert judged.peers == (judge,) and judged.seeds == 1 and judged.contradicted == ()


def test_a_contradicted_peer_counts_on_no_claim():
    results = [result("r1", "a", BASELINE, V1), result("r2", "a", V1, V2)]
    rows = [
        *(report("r1", "c", 10 + k, 1.50, 1.52) for k in range(3)),
        *(report("r1", h, 10, 1.531, 1.530) for h in ("h1", "h2")),
        *(report("r2", "c", 20 + k, 1.50, 1.52) for k in range(3)),  # nobody replayed these
    ]
    judged = judge_claims(results, rows, RULES)
    assert judged["r1"].contradicted == ("c",)
    assert judged["r2"].state == "open" and judged["r2"].seeds == 0  # c's looks count nowhere
    assert consensus.contradicted(judged) == {"c"}
    assert state(results, [r for r in rows if r["result"] == "r2"], rid="r2") in ("verified", HELD)


def test_a_replay_is_due_while_a_verdict_rests_on_looks_nobody_replayed():
    results = [result("r1", "a", BASELINE, V1)]
    made_up = [report("r1", "c", 10 + k, 1.50, 1.52) for k in range(3)]
    assert consensus.unchecked_side(results[0], made_up, RULES) == 1
    seeds = evidence.seeds_to_replay(made_up, "h1", "a", "cpu", RULES.tolerance)
    assert sorted(seeds) == [10, 11, 12]
    firsts = {evidence.seeds_to_replay(made_up, f"h{k}", "a", "cpu", RULES.tolerance)[0]
              for k in range(12)}  # fmt: skip
    assert firsts == {10, 11, 12}  # nodes that replay at once start from different seeds
    # a few at a time: the same few seeds on every node, whoever asks
    few = [evidence.seeds_to_replay(made_up, f"h{k}", "a", "cpu", RULES.tolerance, at_once=2)
           for k in range(12)]  # fmt: skip
    assert all(len(s) == 2 for s in few) and len({seed for s in few for seed in s}) == 2
    # the lookers replaying at once too: each leaves out its own seeds after the few are drawn
    lookers = [*made_up, *(report("r1", f"c{j}", 10 * j + k, 1.50, 1.52)
                           for j in (2, 3, 4) for k in range(3))]  # fmt: skip
    few = [evidence.seeds_to_replay(lookers, who, "a", "cpu", RULES.tolerance, at_once=2)
           for who in ("c", "c2", "c3", "c4", *(f"h{k}" for k in range(12)))]  # fmt: skip
    assert len({seed for s in few for seed in s}) == 2 and all(1 <= len(s) <= 2 for s in few)
    assert evidence.seeds_to_replay(made_up, "h1", "a", "cpu", RULES.tolerance, True) == []
    assert evidence.seeds_to_replay(made_up, "h1", "a", "gpu", RULES.tolerance) == []
    tie = [*made_up, report("r1", "h1", 11, 1.531, 1.530)]
    assert evidence.seeds_to_replay(tie, "h2", "a", "cpu", RULES.tolerance, True) == [11]
    honest = [report("r1", "b", 10 + k, 1.50, 1.52) for k in range(3)]
    replayed = [*honest, report("r1", "h1", 10, 1.5001, 1.5201)]  # it reproduces: b ran them
    assert consensus.unchecked_side(results[0], replayed, RULES) == 0
    assert evidence.seeds_to_replay(replayed, "h2", "a", "cpu", RULES.tolerance) == []


def test_a_refutation_its_authors_numbers_contradict_waits_on_a_replay_of_its_losses():
    """An honest win framed by made-up losses: the author signed a gain of 0.03, two looks
    nobody replayed say 0.02 worse. The refutation rests on them, so their seeds are due for a
    replay; once two replays give the seeds' real scores, the losses are contradicted and the
    claim is judged without them. A refutation the author's numbers agree with needs none."""
    framed = [result("r1", "a", BASELINE, V1, claimed=0.03)]
    losses = [report("r1", "c", 10 + k, 1.52, 1.50) for k in range(2)]
    assert state(framed, losses) == "refuted"
    assert consensus.unchecked_side(framed[0], losses, RULES) == -1
    seeds = evidence.seeds_to_replay(losses, "h1", "a", "cpu", RULES.tolerance)
    assert sorted(seeds) == [10, 11]
    replays = [report("r1", h, 10 + k, 1.47, 1.50) for k in range(2) for h in ("h1", "h2")]
    judged = judge_claims(framed, [*losses, *replays], RULES)["r1"]
    assert judged.contradicted == ("c",) and judged.state != "refuted"
    lucky = [result("r1", "a", BASELINE, V1, claimed=0.004)]  # a lucky seed, honestly refuted
    assert state(lucky, losses) == "refuted"
    assert consensus.unchecked_side(lucky[0], losses, RULES) == 0


# ---------------------------------------------------------------------------------------------
# Void and misreported: what no noise explains, decided by a majority of at least the quorum


@pytest.mark.parametrize("quorum", [1, 2])
def test_a_claim_is_void_when_the_quorum_and_a_majority_found_it_void_never_one_peer(quorum):
    """One peer may be a framer: at quorum 1 its void makes the claim wait for another peer's
    run, which decides it; more peers that scored it outvote the voids."""
    results = [result("r1", "a", BASELINE, V1)]
    voids = [look("r1", p, None, verdict="void") for p in ("b", "c")]
    assert state(results, voids, rules(quorum)) == "void"
    waiting = judge_claims(results, voids[:-1], rules(quorum))["r1"]
    assert waiting.state == "open" and "another peer's look" in waiting.reason
    honest = [v for p in ("e", "f", "g") for v in looks("r1", p, [0.03] * 3)]
    assert state(results, voids + honest, rules(quorum)) in ("verified", HELD)


@pytest.mark.parametrize("quorum", [1, 2])
def test_a_claim_is_misreported_when_the_quorum_of_replays_deny_its_score_never_one(quorum):
    """Replays of the author's seed that give another child score than it signed: one alone
    makes the claim wait for another peer's replay, two (at quorum 1 or 2) find it
    misreported; replays that give the signed score, or replays on another device class, do
    not."""
    results = [result("r1", "a", BASELINE, V1, claimed=0.03)]  # signed child 1.47 on its seed
    peers = ("b", "c")
    true = [look("r1", p, 0.0, replay=1.50) for p in peers]
    judged = judge_claims(results, true, rules(quorum))["r1"]
    assert judged.state == "misreported" and judged.misreported_by == peers
    waiting = judge_claims(results, true[:-1], rules(quorum))["r1"]
    assert waiting.state == "open" and waiting.awaits_replay
    matching = [look("r1", p, 0.03, replay=1.47) for p in peers]
    assert state(results, matching, rules(quorum)) != "misreported"
    other_device = [look("r1", p, 0.0, replay=1.50, device="NVIDIA H200") for p in peers]
    assert (
        state(results, other_device, rules(quorum)) != "misreported"
    )  # a replay elsewhere proves nothing


@pytest.mark.parametrize("quorum", [1, 2])
def test_one_replay_that_denies_a_claim_its_looks_refute_leaves_it_refuted_not_waiting(quorum):
    """The author signed a gain of 0.5; the quorum's looks measure a loss and one replay of the
    author's seed denies the signed score. One denial sinks nothing, but neither does it lift
    the claim out of what its looks decide: refuted, the denier kept; a second denial finds it
    misreported."""
    results = [result("r1", "a", BASELINE, V1, claimed=0.5)]
    lost = [*(v for p in ("d", "b")[-quorum:] for v in looks("r1", p, [-0.05] * 3)),
            look("r1", "b", -0.05, seed=1, replay=1.55)]  # fmt: skip
    judged = judge_claims(results, lost[:-1], rules(quorum))["r1"]
    assert judged.state == "refuted" and judged.author_z > evidence.OUTLIER_Z
    denied = judge_claims(results, lost, rules(quorum))["r1"]
    assert (denied.state, denied.misreported_by, denied.awaits_replay) == ("refuted", ("b",), False)
    assert "1 of 1 replays of the author's seed differ" in denied.reason
    second = [*lost, *looks("r1", "c", [-0.05] * 3), look("r1", "c", -0.05, seed=1, replay=1.55)]
    assert state(results, second, rules(quorum)) == "misreported"


@pytest.mark.parametrize("quorum", [1, 2])
def test_a_look_too_close_to_decide_but_far_below_the_authors_word_waits_for_its_seed(quorum):
    """The author signed a gain of 0.05; the quorum's looks measure about nothing, too close to
    zero to refute the change but ten standard errors below the signed gain: open, waiting for a
    replay of the author's seed, as a verified claim's overclaim waits. Fewer peers than the
    quorum, or one framer's loss beside an honest look, leave it plainly open."""
    results = [result("r1", "a", BASELINE, V1, claimed=0.05)]
    near = [look("r1", p, -0.0015) for p in ("b", "c")[:quorum]]
    judged = judge_claims(results, near, rules(quorum))["r1"]
    assert (judged.state, judged.awaits_replay) == ("open", True)
    assert "standard errors above it" in judged.reason and judged.author_z > evidence.OUTLIER_Z
    backed = judge_claims(results, [*near, look("r1", "d", -0.0015, seed=1, replay=1.45)],
                          rules(quorum))["r1"]  # fmt: skip
    assert (backed.state, backed.awaits_replay) == ("open", False)  # its seed gave its numbers
    if quorum == 2:
        alone = judge_claims(results, near[:1], rules(2))["r1"]
        assert (alone.state, alone.awaits_replay) == ("open", False)
        framed = [look("r1", "b", 0.045), look("r1", "framer", -0.2)]
        assert not judge_claims(results, framed, rules(2))["r1"].awaits_replay


def test_one_framers_replay_is_outvoted_by_the_next_replay_and_its_claim_verifies():
    """At quorum 1 a single key that signs a false replay of an honest claim's seed sinks
    nothing: the claim waits for another peer's replay, which gives the signed score, and the
    looks verify it; its author keeps its standing. Once two peers' replays outvote it, the
    framer's word counts on no claim."""
    results = [result("r1", "a", BASELINE, V1, claimed=0.03)]
    seen = looks("r1", "b", [0.03] * 4)
    framed = [*seen, look("r1", "framer", 0.0, seed=300, replay=1.60)]
    j = judge_claims(results, framed, RULES)["r1"]
    assert j.state == "open" and j.awaits_replay and j.misreported_by == ("framer",)
    backed = [*framed, look("r1", "c", 0.03, seed=301, replay=1.47)]
    assert state(results, backed) in ("verified", HELD)
    assert consensus.suspects(judge_claims(results, framed, RULES), {"r1": results[0]}) == set()
    # A second replay that gives the signed score: two against one, the framer's replay is a
    # report no run stands behind, and its denial of another claim counts for nothing.
    results += [result("r2", "a", BASELINE, V2, claimed=0.03)]
    denial = [*looks("r2", "b", [0.03] * 4), look("r2", "framer", 0.0, seed=302, replay=1.60)]
    assert judge_claims(results, [*backed, *denial], RULES)["r2"].awaits_replay
    outvoted = [*backed, look("r1", "d", 0.03, seed=303, replay=1.47), *denial]
    judged = judge_claims(results, outvoted, RULES)
    assert judged["r1"].contradicted == ("framer",)
    assert judged["r2"].state in ("verified", HELD) and "framer" not in judged["r2"].peers
    assert consensus.suspects(judged, {r["id"]: r for r in results}) == {"framer"}


def test_a_peer_replays_caught_has_its_other_wins_wait_for_replays_of_their_own():
    """Two peers' replays found author a's scores on r1 made up: its win r2, which looks alone
    verify (a real gain, its numbers off only where a replay shows it), now waits for a replay
    of its own seed, and so does r3 by d, whose look at another claim replays contradicted. A
    replay that gives the signed score verifies it again; one that does not finds it
    misreported too. One peer's replay alone, which may be a framer's, decides nothing."""
    caught = [result("r1", "a", BASELINE, V1, claimed=0.03)]  # signed child 1.47
    caught += [result("r2", "a", BASELINE, V2, claimed=0.02), result("r3", "d", BASELINE, V3)]
    seen = [*looks("r2", "b", [0.02] * 4), *looks("r3", "b", [0.02] * 4)]
    framed = judge_claims(caught, [look("r1", "b", 0.0, replay=1.50), *seen], RULES)
    assert framed["r1"].state == "open" and framed["r1"].awaits_replay
    assert framed["r2"].state in ("verified", HELD)
    seen += [look("r1", p, 0.0, replay=1.50) for p in ("b", "c")]
    judged = judge_claims(caught, seen, RULES)
    assert judged["r1"].state == "misreported" and judged["r1"].misreported_by == ("b", "c")
    assert judged["r2"].state == "open" and judged["r2"].awaits_replay
    assert "another claim" in judged["r2"].reason
    assert judged["r3"].state in ("verified", HELD)  # d has done nothing yet
    by_id = {r["id"]: r for r in caught}
    assert consensus.suspects(judged, by_id) == {"a"}
    made_up = [report("r1", "d", 50 + k, 1.40, 1.45) for k in range(2)]  # d's looks at r1...
    replays = [report("r1", h, 50, 1.50, 1.50) for h in ("h1", "h2")]  # ...that replays deny
    judged = judge_claims(caught, [*seen, *made_up, *replays], RULES)
    assert judged["r1"].contradicted == ("d",) and judged["r3"].awaits_replay
    backed = [*seen, look("r2", "c", 0.02, seed=200, replay=1.48)]  # the signed child score
    assert state(caught, backed, rid="r2") in ("verified", HELD)
    denied = [*seen, *(look("r2", p, 0.02, seed=200, replay=1.53) for p in ("c", "e"))]
    assert state(caught, denied, rid="r2") == "misreported"
    honest = [result("r2", "a", BASELINE, V2, claimed=0.02)]  # without r1: taken at its word
    assert state(honest, seen, rid="r2") in ("verified", HELD)


def test_a_framers_scattered_looks_stall_no_claim():
    """One key's looks that average no gain but scatter by 0.5 bpb, eight seeds of them: they
    once raised the claim's noise estimate a hundredfold, so that two honest verifiers' clear
    win ended unproven, and nobody looked again. The typical noise is the lower median of the
    peers' own spreads and the profile's: the framer is an outlier and the win verifies;
    against one honest peer alone the looks are disputed, and the claim waits for more."""
    results = [result("r1", "a", BASELINE, V1)]
    honest = looks("r1", "b", [0.03] * 4) + looks("r1", "c", [0.03, 0.028, 0.031, 0.029])
    scattered = [look("r1", "framer", g, seed=100 + i) for i, g in enumerate([0.5, -0.5] * 4)]
    j = judge_claims(results, honest + scattered, RULES)["r1"]
    assert j.state in ("verified", HELD) and j.outliers == ("framer",)
    assert j.sigma == RULES.sigma  # its spread weighs on nobody's noise
    alone = judge_claims(results, honest[:4] + scattered, RULES)["r1"]
    assert alone.state == "open" and alone.disputed
    big = [result("r2", "a", BASELINE, V2)]  # an honest gain of 1.35 spreads 4% between seeds
    wide = looks("r2", "b", [1.35, 1.30, 1.40]) + looks("r2", "c", [1.33, 1.38])
    assert state(big, wide, rid="r2") in ("verified", HELD)
    assert not judge_claims(big, wide, RULES)["r2"].outliers


def test_a_framers_replay_against_agreeing_replays_is_an_outlier():
    results = [result("r1", "a", BASELINE, V1, claimed=0.03)]
    rows = [look("r1", "b", 0.03, replay=1.47), look("r1", "c", 0.03, replay=1.47),
            look("r1", "framer", 0.03, replay=1.60)]  # fmt: skip
    judged = judge_claims(results, rows, rules(1))["r1"]
    assert judged.state != "misreported" and judged.contradicted == ("framer",)
    assert "framer" not in judged.peers


# ---------------------------------------------------------------------------------------------
# One head: scores from the baseline, claimed val_bpb ranks nothing


def test_the_head_is_the_version_with_the_most_verified_gain_from_the_baseline():
    results = [
        result("r1", "a", BASELINE, V1, val_bpb=1.00),  # claims the lowest val_bpb
        result("r2", "b", BASELINE, V2, val_bpb=1.45),
        result("r3", "c", "ff" * 32, V3, val_bpb=0.5),  # not descended from the baseline
    ]
    rows = [
        *looks("r1", "x", [0.01] * 8),
        *looks("r2", "x", [0.03] * 8),
        *looks("r3", "x", [0.1] * 8),
    ]
    assert best_head(results, rows, "cpu", BASELINE, RULES) == V2
    assert best_head(results, [], "cpu", BASELINE, RULES) == BASELINE
    assert best_head(results, rows, "gpu", BASELINE, RULES) == BASELINE  # another profile


def test_a_versions_score_adds_its_lineages_verified_gains_with_their_errors():
    results = [result("r1", "a", BASELINE, V1), result("r2", "b", V1, V2)]
    rows = [*looks("r1", "c", [0.02] * 4), *looks("r2", "c", [0.01] * 4)]
    judged = judge_claims(results, rows, RULES)
    scores = lineage_scores(results, judged, BASELINE)
    assert scores[V2].score == pytest.approx(-0.03) and scores[V2].steps == 2
    assert scores[V2].se == pytest.approx((judged["r1"].se ** 2 + judged["r2"].se ** 2) ** 0.5)
    assert scores[V2].via == "r2" and scores[BASELINE].score == 0.0


def test_a_child_of_an_unverified_parent_is_not_head():
    results = [result("r1", "a", BASELINE, V1), result("r2", "b", V1, V2)]
    assert best_head(results, looks("r2", "c", [0.05] * 4), "cpu", BASELINE, RULES) == BASELINE


def test_a_merge_or_a_bundle_stands_only_while_every_claim_it_carries_is_verified():
    """An honest node's bundle of two wins (V1 and V2, each a claim on the baseline), merged
    onto V1, verified by its own looks, counts only while both carried claims are verified:
    when made-up looks that verified V2 are contradicted by a replay, the bundle goes with it
    (held), and so does a merge of the bundle."""
    v4, v5 = "44" * 32, "55" * 32
    results = [
        result("r1", "a", BASELINE, V1), result("r2", "colluder", BASELINE, V2),
        {**result("r3", "b", V1, V3), "description": f"bundle of 1: {V2[:12]}"},
        {**result("r4", "c", V3, v4), "description": f"merge of {V3[:12]}: bundle of 1"},
        {**result("r5", "d", v4, v5), "description": "merge of the two: not a version's name"},
    ]  # fmt: skip
    rows = [*looks("r1", "x", [0.03] * 4), *looks("r3", "x", [0.04] * 4),
            *looks("r4", "y", [0.02] * 4), *looks("r5", "y", [0.02] * 4)]  # fmt: skip
    made_up = looks("r2", "partner", [0.03] * 4)
    judged = judge_claims(results, [*rows, *made_up], RULES)
    assert {rid: j.state for rid, j in judged.items()} == dict.fromkeys(judged, "verified")
    assert best_head(results, [*rows, *made_up], "cpu", BASELINE, RULES) == v5
    judged = judge_claims(results, rows, RULES)  # V2's looks are out: it is open again
    assert [judged[r].state for r in ("r1", "r2", "r3", "r4")] == ["verified", "open", HELD, HELD]
    assert judged["r3"].reason == f"held: it carries {V2[:12]}, which no verified claim made (yet)"
    assert best_head(results, rows, "cpu", BASELINE, RULES) == V1
    assert merges.carried(f"bundle of 2: {V1[:12]}, {V2[:12]}") == [V1[:12], V2[:12]]
    assert merges.carried("merge of ideas: lower learning rate") == []


def test_a_bundle_whose_description_names_fewer_versions_than_it_counts_is_held_for_good():
    """A bundle's description cut short (a fact holds MAX_DESCRIPTION characters) would leave
    the versions past the cut carried by nothing the rule reads: it counts as carrying one no
    claim makes, and stays held however many looks verify it and its named parts."""
    many = [f"{k:02d}" * 6 for k in range(14)]  # fourteen names do not fit a description
    cut = wire.result_body(
        parent=V1, child=V3, diff=b"d", description=f"bundle of 14: {', '.join(many)}",
        profile="cpu", harness="h" * 64, seed=1, outcome="keep", metrics={"val_bpb": 1.0},
    )["description"]  # fmt: skip
    assert len(cut) == wire.MAX_DESCRIPTION and cut.endswith("…")
    assert merges.carried(cut) == [*many[: merges.MAX_BUNDLE], merges.UNNAMED]
    assert merges.UNNAMED not in merges.carried(f"bundle of 1: {V2[:12]}")
    results = [
        result("r1", "a", BASELINE, V1), result("r2", "b", BASELINE, V2),
        {**result("r3", "c", V1, V3), "description": f"bundle of 2: {V2[:12]}, 0123456…"},
    ]  # fmt: skip
    rows = [*looks("r1", "x", [0.03] * 4), *looks("r2", "y", [0.03] * 4),
            *looks("r3", "x", [0.04] * 8)]  # fmt: skip
    judged = judge_claims(results, rows, RULES)
    assert [judged[r].state for r in ("r1", "r2", "r3")] == ["verified", "verified", HELD]
    assert merges.UNNAMED in judged["r3"].reason
    assert best_head(results, rows, "cpu", BASELINE, RULES) == V1


def test_ties_go_to_the_lower_hash_and_discards_never_lead():
    results = [
        result("r1", "a", BASELINE, V2), result("r2", "b", BASELINE, V1),
        result("r3", "c", BASELINE, V3, outcome="discard"),
    ]  # fmt: skip
    rows = [
        *looks("r1", "c", [0.03] * 4),
        *looks("r2", "c", [0.03] * 4),
        *looks("r3", "a", [0.1] * 4),
    ]
    assert best_head(results, rows, "cpu", BASELINE, RULES) == V1


def test_verifications_with_another_harness_or_profile_never_count():
    results = [result("r1", "a", BASELINE, V1)]
    assert (
        best_head(results, looks("r1", "b", [0.05] * 4, harness="h2"), "cpu", BASELINE, RULES)
        == BASELINE
    )
    assert (
        best_head(results, looks("r1", "b", [0.05] * 4), "cpu", BASELINE, RULES, harness="h2")
        == BASELINE
    )
    assert best_head(results, looks("r1", "b", [0.05] * 4), "cpu", BASELINE, RULES) == V1


def test_signed_facts_flatten_into_rows_the_rule_reads(alice, bob):
    fact = make_result(alice, 1, BASELINE, V1, 1.4)
    results, verifications = rows_from_facts([fact, *confirming_looks(bob, 1, fact)])
    assert results[0]["author"] == alice.peer_id and results[0]["val_bpb"] == 1.4
    assert best_head(results, verifications, "cpu", BASELINE, RULES, HARNESS) == V1


# ---------------------------------------------------------------------------------------------
# The outlier hold


def test_the_first_verified_win_of_a_profile_needs_hold_looks_seeds():
    results = [result("r1", "a", BASELINE, V1)]
    assert state(results, [look("r1", "b", 0.05)]) == HELD
    assert state(results, looks("r1", "b", [0.05] * HOLD_LOOKS)) == "verified"


def test_a_gain_far_beyond_the_largest_verified_is_held_an_ordinary_one_is_not():
    results = [
        result("r1", "a", BASELINE, V1),
        result("r2", "b", V1, V2),
        result("r3", "c", V1, V3),
    ]
    rows = [*looks("r1", "x", [0.03] * HOLD_LOOKS), look("r2", "x", 0.5), look("r3", "x", 0.05)]
    judged = judge_claims(results, rows, RULES)
    assert judged["r2"].state == HELD and "the largest verified" in judged["r2"].reason
    assert judged["r3"].state == "verified"


# ---------------------------------------------------------------------------------------------
# Properties over random swarms of claims and looks

PEERS = ["p0", "p1", "p2", "p3"]
VERSIONS = [BASELINE, V1, V2, V3, "44" * 32, "55" * 32]

claims = st.lists(
    st.tuples(st.sampled_from(PEERS), st.integers(0, 4), st.integers(1, 5),
              st.sampled_from(["keep", "keep", "discard", "crash"]), st.sampled_from(["h", "h", "h2"])),
    max_size=10,
)  # fmt: skip
votes = st.lists(
    st.tuples(st.integers(0, 9), st.sampled_from(PEERS),
              st.sampled_from(["confirm", "confirm", "refute", "inconclusive", "crash", "void"]),
              st.sampled_from(["h", "h2"]), st.sampled_from([0.03, 0.004, -0.01, 0.08, None]),
              st.integers(0, 3)),
    max_size=30,
)  # fmt: skip


def swarm(claim_list, vote_list):
    results = [
        result(f"r{i}", author, VERSIONS[p], VERSIONS[c], outcome=outcome, harness=harness)
        for i, (author, p, c, outcome, harness) in enumerate(claim_list)
    ]
    verifications = [
        look(f"r{r % max(1, len(results))}", author, g, seed=seed, verdict=v, harness=h)
        for r, author, v, h, g, seed in vote_list
    ]
    return results, verifications


@settings(max_examples=200, deadline=None)
@given(claims, votes, st.integers(1, 3), st.randoms(use_true_random=False))
def test_the_head_does_not_depend_on_the_order_facts_arrive_in(c, v, quorum, order):
    results, verifications = swarm(c, v)
    expected = best_head(results, verifications, "cpu", BASELINE, rules(quorum))
    twice = results + results[: len(results) // 2]  # a fact delivered twice changes nothing
    order.shuffle(twice)
    order.shuffle(verifications)
    assert best_head(twice, verifications, "cpu", BASELINE, rules(quorum)) == expected


@settings(max_examples=200, deadline=None)
@given(claims, votes, st.integers(1, 3))
def test_a_claim_looked_at_only_by_its_author_is_never_verified_nor_head(c, v, quorum):
    results, verifications = swarm(c, v)
    authors = {r["id"]: r["author"] for r in results}
    own = [x for x in verifications if x["author"] == authors.get(x["result"])]
    assert verified_children(results, own, rules(quorum)) == {}
    assert best_head(results, own, "cpu", BASELINE, rules(quorum)) == BASELINE


@settings(max_examples=200, deadline=None)
@given(claims, votes, st.integers(1, 3))
def test_the_head_is_reached_only_through_claims_verified_by_quorum_peers(c, v, quorum):
    results, verifications = swarm(c, v)
    judged = judge_claims(results, verifications, rules(quorum))
    head = best_head(results, verifications, "cpu", BASELINE, rules(quorum))
    if head != BASELINE:
        makers = [r for r in results if r["child"] == head and judged.get(r["id"])]
        assert any(judged[r["id"]].state == "verified" and len(judged[r["id"]].peers) >= quorum
                   and r["author"] not in judged[r["id"]].peers for r in makers)  # fmt: skip
