"""The adoption rule: verified children, the best head, the noise margin, keep and verdicts."""

from __future__ import annotations

import pytest
from conftest import BASELINE, HARNESS, confirming_looks, looks_rows, make_result, vote_row
from hypothesis import given, settings
from hypothesis import strategies as st

from node import consensus
from node.consensus import (
    HOLD_FACTOR,
    HOLD_LOOKS,
    ConsensusError,
    best_head,
    held_claims,
    keep_or_discard,
    noise_margin,
    refuted_claims,
    rows_from_facts,
    verdict,
    verified_children,
)

V1, V2, V3 = "11" * 32, "22" * 32, "33" * 32


def result(rid, author, parent, child, val_bpb, outcome="keep", profile="cpu", harness="h"):
    return {"id": rid, "author": author, "parent": parent, "child": child, "val_bpb": val_bpb,
            "outcome": outcome, "profile": profile, "harness": harness}  # fmt: skip


def vote(rid, author, verdict="confirm", profile="cpu", harness="h", delta=-0.01, seed=7):
    return vote_row(rid, author, verdict, profile=profile, harness=harness, delta=delta, seed=seed)


# The first verified win of a profile sets the outlier hold's scale, so it needs HOLD_LOOKS
# confirming looks (`looks_rows`); later claims within HOLD_FACTOR of it need the quorum alone.


def test_best_head_is_the_lowest_verified_version_reached_from_the_baseline():
    results = [
        result("r1", "a", BASELINE, V1, 1.50),
        result("r2", "b", V1, V2, 1.40),
        result("r3", "c", "ff" * 32, V3, 1.00),  # lower, but not descended from the baseline
    ]
    first = looks_rows("r1", "b")
    votes = [*first, vote("r2", "c"), vote("r3", "a")]
    assert best_head(results, votes, "cpu", BASELINE) == V2
    assert best_head(results, first, "cpu", BASELINE) == V1  # r2 unverified
    assert best_head(results, [], "cpu", BASELINE) == BASELINE
    assert best_head(results, votes, "gpu", BASELINE) == BASELINE  # another profile


def test_a_child_of_an_unverified_parent_is_not_head():
    results = [result("r1", "a", BASELINE, V1, 1.5), result("r2", "b", V1, V2, 1.4)]
    assert best_head(results, looks_rows("r2", "c"), "cpu", BASELINE) == BASELINE


def test_ties_go_to_the_lower_hash_and_discards_never_lead():
    results = [
        result("r1", "a", BASELINE, V2, 1.4),
        result("r2", "b", BASELINE, V1, 1.4),
        result("r3", "c", BASELINE, V3, 1.0, outcome="discard"),
    ]
    votes = [*looks_rows("r1", "b"), vote("r2", "a"), *looks_rows("r3", "a")]
    assert best_head(results, votes, "cpu", BASELINE) == V1


def test_verifications_with_another_harness_or_profile_never_count():
    results = [result("r1", "a", BASELINE, V1, 1.5)]
    assert verified_children(results, looks_rows("r1", "b", harness="h2")) == {}
    assert verified_children(results, looks_rows("r1", "b", profile="gpu")) == {}
    assert best_head(results, looks_rows("r1", "b", harness="h2"), "cpu", BASELINE) == BASELINE
    assert best_head(results, looks_rows("r1", "b"), "cpu", BASELINE, harness="h2") == BASELINE
    assert best_head(results, looks_rows("r1", "b"), "cpu", BASELINE) == V1


def test_a_claim_needs_more_confirmations_than_refutations():
    results = [result("r1", "a", BASELINE, V1, 1.5)]
    votes = [*looks_rows("r1", "b", HOLD_LOOKS - 1), vote("r1", "c"), vote("r1", "d", "refute")]
    assert verified_children(results, votes, quorum=1) == {"r1": {"b", "c"}}
    assert verified_children(results, votes, quorum=2) == {"r1": {"b", "c"}}
    assert verified_children(results, votes, quorum=3) == {}
    tie = [*votes, vote("r1", "e", "refute")]
    assert verified_children(results, tie, quorum=1) == {}  # a tie waits for more verifiers
    assert refuted_claims(results, tie, quorum=2) == {"r1"}
    assert refuted_claims(results, votes, quorum=1) == set()  # outvoted refutation
    crash = [*looks_rows("r1", "b"), vote("r1", "c", "crash")]
    assert verified_children(results, crash) == {"r1": {"b"}}  # a crash is no refutation
    one_each = [*looks_rows("r1", "b"), vote("r1", "c", "refute")]
    assert verified_children(results, one_each) == {}
    assert refuted_claims(results, one_each) == {"r1"}


def test_signed_facts_flatten_into_rows_the_rule_reads(alice, bob):
    claim = make_result(alice, 1, BASELINE, V1, 1.42)
    checks = confirming_looks(bob, 1, claim)
    results, verifications = rows_from_facts([claim, *checks])
    assert results[0]["val_bpb"] == 1.42 and results[0]["author"] == alice.peer_id
    assert verifications[0]["result"] == claim.id and verifications[0]["harness"] == HARNESS
    assert verifications[0]["delta"] == pytest.approx(-0.01) and verifications[0]["seed"] == 7
    assert best_head(results, verifications, "cpu", BASELINE) == V1


def test_noise_margin_is_k_standard_deviations_with_a_floor():
    assert noise_margin([1.500, 1.510, 1.520], k=2) == pytest.approx(0.02)
    assert noise_margin([1.5, 1.5, 1.5]) == consensus.DEFAULT_FLOOR
    with pytest.raises(ConsensusError, match="at least 2"):
        noise_margin([1.5, None])


def test_keep_needs_a_gain_larger_than_the_margin():
    assert keep_or_discard(1.489, 1.500, margin=0.01) == "keep"
    assert keep_or_discard(1.495, 1.500, margin=0.01) == "discard"  # lower, but within noise
    assert keep_or_discard(1.25, 1.5, margin=0.25) == "discard"  # exactly the margin: not more
    assert keep_or_discard(None, 1.500, margin=0.01) == "crash"
    assert keep_or_discard(float("nan"), 1.500, margin=0.01) == "crash"
    with pytest.raises(ConsensusError, match="run the parent"):
        keep_or_discard(1.4, None, margin=0.01)


def test_a_verifier_confirms_refutes_or_reports_a_crash_from_its_own_runs():
    assert verdict(1.45, 1.50, margin=0.01) == "confirm"
    assert verdict(1.499, 1.50, margin=0.01) == "inconclusive"  # a gain within its noise
    assert verdict(1.25, 1.5, margin=0.25) == "inconclusive"  # exactly the margin: not more
    assert verdict(1.50, 1.50, margin=0.01) == "refute"  # no gain at all
    assert verdict(1.60, 1.50, margin=0.01) == "refute"
    assert verdict(None, 1.50, margin=0.01) == "crash"
    assert verdict(float("nan"), 1.50, margin=0.01) == "crash"


def test_looks_at_one_claim_weigh_their_mean_against_a_margin_shrunk_by_their_number():
    assert verdict(1.43, 1.5, margin=0.1) == "inconclusive"  # one look: 0.07 < 0.1
    assert verdict(1.43, 1.5, margin=0.1, earlier_gains=[0.06, 0.08]) == "confirm"  # > 0.1/sqrt(3)
    assert verdict(1.55, 1.5, margin=0.1, earlier_gains=[0.02]) == "refute"  # mean -0.015
    assert verdict(1.46, 1.5, margin=0.1, earlier_gains=[0.02]) == "inconclusive"  # 0.03 < 0.0707
    assert verdict(None, 1.5, margin=0.1, earlier_gains=[0.09, 0.09]) == "crash"


def test_an_inconclusive_verdict_counts_neither_way():
    results = [result("r1", "alice", BASELINE, V1, 1.4)]
    unsure = [vote("r1", "bob", "inconclusive"), vote("r1", "carol", "inconclusive")]
    assert verified_children(results, unsure) == {}
    assert refuted_claims(results, unsure) == set()
    confirmed = [*unsure, *looks_rows("r1", "dave")]
    assert verified_children(results, confirmed) == {"r1": {"dave"}}  # 1 confirms, 0 refute
    assert best_head(results, confirmed, "cpu", BASELINE) == V1


# ---------------------------------------------------------------------------------------------
# Properties over random swarms of claims and votes

PEERS = ["p0", "p1", "p2", "p3"]
VERSIONS = [BASELINE, V1, V2, V3, "44" * 32, "55" * 32]

claims = st.lists(
    st.tuples(
        st.sampled_from(PEERS), st.integers(0, 4), st.integers(1, 5),
        st.sampled_from([1.2, 1.3, 1.4, 1.5]), st.sampled_from(["keep", "keep", "discard", "crash"]),
        st.sampled_from(["h", "h", "h2"]),
    ),
    max_size=10,
)  # fmt: skip
votes = st.lists(
    st.tuples(st.integers(0, 9), st.sampled_from(PEERS),
              st.sampled_from(["confirm", "confirm", "confirm", "refute", "inconclusive", "crash", "void"]),
              st.sampled_from(["h", "h2"]), st.sampled_from([-0.01, -0.002, -0.05, None]), st.integers(0, 2)),
    max_size=30,
)  # fmt: skip


def swarm(claim_list, vote_list):
    results = [
        result(f"r{i}", author, VERSIONS[p], VERSIONS[c], None if outcome == "crash" else bpb,
               outcome=outcome, harness=harness)
        for i, (author, p, c, bpb, outcome, harness) in enumerate(claim_list)
    ]  # fmt: skip
    verifications = [
        vote(f"r{r % max(1, len(results))}", author, v, harness=h, delta=d, seed=seed)
        for r, author, v, h, d, seed in vote_list
    ]
    return results, verifications


@settings(max_examples=300, deadline=None)
@given(claims, votes, st.integers(1, 3), st.randoms(use_true_random=False))
def test_best_head_does_not_depend_on_the_order_facts_arrive_in(c, v, quorum, order):
    results, verifications = swarm(c, v)
    expected = best_head(results, verifications, "cpu", BASELINE, quorum)
    twice = results + results[: len(results) // 2]  # a fact delivered twice changes nothing
    order.shuffle(twice)
    order.shuffle(verifications)
    assert best_head(twice, verifications, "cpu", BASELINE, quorum) == expected


@settings(max_examples=300, deadline=None)
@given(claims, votes, st.integers(1, 3))
def test_a_claim_confirmed_only_by_its_author_is_never_verified_nor_head(c, v, quorum):
    results, verifications = swarm(c, v)
    authors = {r["id"]: r["author"] for r in results}
    own = [x for x in verifications if x["author"] == authors.get(x["result"])]
    assert verified_children(results, own, quorum) == {}
    assert best_head(results, own, "cpu", BASELINE, quorum) == BASELINE


@settings(max_examples=300, deadline=None)
@given(claims, votes, st.integers(1, 3))
def test_a_refuted_claim_never_becomes_head(c, v, quorum):
    results, verifications = swarm(c, v)
    head = best_head(results, verifications, "cpu", BASELINE, quorum)
    by_id = {r["id"]: r for r in results}

    def voters(verdict: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for x in verifications:
            r = by_id.get(x["result"])
            if (
                r is not None
                and x["verdict"] == verdict
                and x["author"] != r["author"]
                and x["harness"] == r["harness"]
            ):
                out.setdefault(r["id"], set()).add(x["author"])
        return out

    refuters, confirmers = voters("refute"), voters("confirm")
    makers = [r for r in results if r["child"] == head and r["outcome"] == "keep"]
    if head != BASELINE:
        # The head is made by at least one claim confirmed by the quorum and by more peers than refute it.
        assert any(
            len(confirmers.get(r["id"], ())) >= quorum
            and len(confirmers.get(r["id"], ())) > len(refuters.get(r["id"], ()))
            for r in makers
        )
    verified = verified_children(results, verifications, quorum)
    assert not set(verified) & refuted_claims(results, verifications, quorum)
    for rid, peers in refuters.items():
        if len(peers) >= len(confirmers.get(rid, ())):
            assert rid not in verified


# ---------------------------------------------------------------------------------------------
# Void verdicts, and the hold on outlier claims


def test_a_void_claim_is_never_verified():
    results = [result("r1", "a", BASELINE, V1, 1.4)]
    confirmed = [*looks_rows("r1", "c"), *looks_rows("r1", "d"), *looks_rows("r1", "e")]
    found_void = [*confirmed, vote("r1", "b", "void", delta=None)]
    assert set(verified_children(results, confirmed)) == {"r1"}
    assert verified_children(results, found_void) == {}  # confirmations never outvote a void
    assert best_head(results, found_void, "cpu", BASELINE) == BASELINE
    assert refuted_claims(results, found_void) == set()  # 1 against 3: open for more verifiers
    assert set(verified_children(results, found_void, quorum=2)) == {"r1"}  # 1 void of 2 needed
    one_each = [*looks_rows("r1", "c"), vote("r1", "b", "void", delta=None)]
    assert refuted_claims(results, one_each) == {"r1"}  # void counts against it like a refute
    assert refuted_claims(results, [vote("r1", "b", "void"), vote("r1", "c", "refute")], 2) == {
        "r1"
    }
    own = [*confirmed, vote("r1", "a", "void")]  # its author's word counts neither way
    assert set(verified_children(results, own)) == {"r1"}


def test_a_peer_that_confirmed_then_found_the_claim_void_counts_as_finding_it_void():
    results = [result("r1", "a", BASELINE, V1, 1.4)]
    votes = [*looks_rows("r1", "b"), vote("r1", "b", "void", delta=None, seed=11)]
    assert consensus.peer_verdicts(results, votes) == {"r1": {"b": "void"}}
    assert verified_children(results, votes) == {} and refuted_claims(results, votes) == {"r1"}
    crashed_later = [*looks_rows("r1", "b"), vote("r1", "b", "crash", delta=None, seed=11)]
    assert set(verified_children(results, crashed_later)) == {"r1"}  # a crash undoes nothing


def test_the_first_verified_win_of_a_profile_needs_the_extra_looks():
    results = [result("r1", "a", BASELINE, V1, 1.4)]
    short = looks_rows("r1", "b", HOLD_LOOKS - 1)
    assert verified_children(results, short) == {} and refuted_claims(results, short) == set()
    assert held_claims(results, short) == {
        "r1": "held: gain 0.0100 is the first verified on cpu, which sets the scale; "
        f"needs {HOLD_LOOKS} confirming looks, has {HOLD_LOOKS - 1}"
    }
    assert best_head(results, short, "cpu", BASELINE) == BASELINE
    enough = looks_rows("r1", "b")
    assert (
        verified_children(results, enough) == {"r1": {"b"}} and held_claims(results, enough) == {}
    )
    assert best_head(results, enough, "cpu", BASELINE) == V1
    again = [*short, vote("r1", "b", seed=7)]  # a look again on a seed it used is the same look
    assert verified_children(results, again) == {}


def test_an_outlier_claim_is_held_until_it_has_hold_looks_confirming_looks():
    results = [result("small", "a", BASELINE, V1, 1.49), result("huge", "b", V1, V2, 1.2)]
    scale = looks_rows("small", "c", delta=-0.03)  # the largest gain verified on cpu: 0.03
    once = [*scale, vote("huge", "c", delta=-0.81)]  # 27 times that
    assert set(verified_children(results, once)) == {"small"}
    assert held_claims(results, once) == {
        "huge": "held: gain 0.8100 is 27x the largest verified on cpu (0.0300); "
        "needs 3 confirming looks, has 1"
    }
    assert refuted_claims(results, once) == set()  # held, not refuted
    assert best_head(results, once, "cpu", BASELINE) == V1  # nobody builds on it yet
    more = [*once, vote("huge", "c", delta=-0.80, seed=8), vote("huge", "d", delta=-0.82)]
    assert set(verified_children(results, more)) == {"small", "huge"}
    assert held_claims(results, more) == {}
    assert best_head(results, more, "cpu", BASELINE) == V2


def test_an_ordinary_claim_within_the_factor_is_verified_by_the_quorum_alone():
    results = [result("r1", "a", BASELINE, V1, 1.49), result("r2", "b", V1, V2, 1.4)]
    scale = looks_rows("r1", "c", delta=-0.03)
    within = [*scale, vote("r2", "c", delta=-0.03 * HOLD_FACTOR)]  # exactly the factor: within
    assert set(verified_children(results, within)) == {"r1", "r2"}
    beyond = [*scale, vote("r2", "c", delta=-0.03 * HOLD_FACTOR - 0.001)]
    assert set(verified_children(results, beyond)) == {"r1"}
    other = [result("g1", "b", BASELINE, V3, 1.0, profile="gpu"), *results]
    gpu = [*scale, vote("g1", "c", profile="gpu", delta=-0.03)]  # each profile has its own scale
    assert set(verified_children(other, gpu)) == {"r1"} and set(held_claims(other, gpu)) == {"g1"}


def test_a_claim_below_the_scale_is_verified_whatever_its_id_or_number_of_looks():
    results = [result("a", "x", BASELINE, V1, 1.49), result("b", "y", BASELINE, V2, 1.48)]
    votes = [vote("a", "c", delta=-0.01), *looks_rows("b", "c", delta=-0.02)]
    assert set(verified_children(results, votes)) == {"a", "b"}  # 0.01 is within 3 x 0.02


def test_a_claims_gain_is_the_median_of_its_verifiers_so_one_verifier_cannot_unhold_it():
    results = [result("r1", "a", BASELINE, V1, 1.49), result("r2", "b", V1, V2, 1.2)]
    scale = looks_rows("r1", "c", delta=-0.03)
    votes = [*scale, vote("r2", "c", delta=-0.8), vote("r2", "e", delta=-0.001)]  # a friend's
    assert held_claims(results, votes)["r2"].startswith("held: gain 0.4005 is 13.4x")
    assert set(verified_children(results, votes)) == {"r1"}


def test_a_verification_row_without_delta_is_a_clear_error():
    results = [result("r1", "a", BASELINE, V1, 1.4)]
    row = {"result": "r1", "author": "b", "verdict": "confirm", "profile": "cpu", "harness": "h"}
    with pytest.raises(ValueError, match="delta, seed"):
        verified_children(results, [row])
    with pytest.raises(ValueError, match="seed"):
        best_head(results, [{**row, "delta": -0.01}], "cpu", BASELINE)


gains = st.lists(
    st.tuples(st.sampled_from([0.001, 0.01, 0.02, 0.05, 0.3]), st.integers(1, 4),
              st.sampled_from(["cpu", "gpu"])),
    min_size=1, max_size=8,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(gains, st.integers(1, 2), st.randoms(use_true_random=False))
def test_the_hold_does_not_depend_on_the_order_of_the_facts(claim_list, quorum, order):
    results = [
        result(f"r{i}", "a", BASELINE, f"{i:064x}", 1.4, profile=profile)
        for i, (_, _, profile) in enumerate(claim_list)
    ]
    verifications = [
        vote(f"r{i}", peer, profile=profile, delta=-gain, seed=look)
        for i, (gain, looks, profile) in enumerate(claim_list)
        for peer in ("b", "c")[:quorum]
        for look in range(looks)
    ]
    verified = verified_children(results, verifications, quorum)
    held = held_claims(results, verifications, quorum)
    assert not set(verified) & set(held) and not set(held) & refuted_claims(results, verifications)
    assert set(verified) | set(held) == {r["id"] for r in results}  # each meets the quorum's rule
    order.shuffle(results)
    order.shuffle(verifications)
    assert verified_children(results, verifications, quorum) == verified
    assert held_claims(results, verifications, quorum) == held


def test_paired_noise_pools_the_spread_of_each_pair_around_its_own_mean():
    """A pair's true effect is the same on every seed: only its spread around its mean is noise,
    however large the effect; a pair on one seed says nothing about noise."""
    pairs = {
        ("p", "a"): [-0.100, -0.104],  # a large effect, spread 0.004 (0.002 from the mean)
        ("p", "b"): [0.010, 0.012, 0.014],  # another, spread around 0.012
        ("p", "c"): [0.5],  # one seed: no degree of freedom
    }
    squares = 2 * 0.002**2 + 2 * 0.002**2
    sigma, df = consensus.paired_noise(pairs, prior=0.01, prior_df=0)
    assert df == 3 and sigma == pytest.approx((squares / 3) ** 0.5)
    with_prior, _ = consensus.paired_noise(pairs, prior=0.01, prior_df=2)
    assert with_prior == pytest.approx(((2 * 0.01**2 + squares) / 5) ** 0.5)
    assert consensus.paired_noise({}, prior=0.01) == (0.01, 0)  # nothing measured: the prior
    assert consensus.paired_noise({("p", "c"): [0.5]}, prior=0.0, prior_df=0) == (0.0, 0)


def test_the_margin_shrinks_with_the_runs_behind_a_mean_and_has_a_floor():
    assert consensus.margin_for(0.01) == pytest.approx(0.02)
    assert consensus.margin_for(0.01, runs=4) == pytest.approx(0.01)
    assert consensus.margin_for(0.0001) == consensus.DEFAULT_FLOOR
