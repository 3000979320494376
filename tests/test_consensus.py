"""The adoption rule: verified children, the best head, the noise margin, keep and verdicts."""

from __future__ import annotations

import pytest
from conftest import BASELINE, HARNESS, make_result, make_verification
from hypothesis import given, settings
from hypothesis import strategies as st

from node import consensus
from node.consensus import (
    ConsensusError,
    best_head,
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


def vote(rid, author, verdict="confirm", profile="cpu", harness="h"):
    return {"result": rid, "author": author, "verdict": verdict, "profile": profile,
            "harness": harness}  # fmt: skip


def test_best_head_is_the_lowest_verified_version_reached_from_the_baseline():
    results = [
        result("r1", "a", BASELINE, V1, 1.50),
        result("r2", "b", V1, V2, 1.40),
        result("r3", "c", "ff" * 32, V3, 1.00),  # lower, but not descended from the baseline
    ]
    votes = [vote("r1", "b"), vote("r2", "c"), vote("r3", "a")]
    assert best_head(results, votes, "cpu", BASELINE) == V2
    assert best_head(results, votes[:1], "cpu", BASELINE) == V1  # r2 unverified
    assert best_head(results, [], "cpu", BASELINE) == BASELINE
    assert best_head(results, votes, "gpu", BASELINE) == BASELINE  # another profile


def test_a_child_of_an_unverified_parent_is_not_head():
    results = [result("r1", "a", BASELINE, V1, 1.5), result("r2", "b", V1, V2, 1.4)]
    assert best_head(results, [vote("r2", "c")], "cpu", BASELINE) == BASELINE


def test_ties_go_to_the_lower_hash_and_discards_never_lead():
    results = [
        result("r1", "a", BASELINE, V2, 1.4),
        result("r2", "b", BASELINE, V1, 1.4),
        result("r3", "c", BASELINE, V3, 1.0, outcome="discard"),
    ]
    votes = [vote("r1", "b"), vote("r2", "a"), vote("r3", "a")]
    assert best_head(results, votes, "cpu", BASELINE) == V1


def test_verifications_with_another_harness_or_profile_never_count():
    results = [result("r1", "a", BASELINE, V1, 1.5)]
    assert verified_children(results, [vote("r1", "b", harness="h2")]) == {}
    assert verified_children(results, [vote("r1", "b", profile="gpu")]) == {}
    assert best_head(results, [vote("r1", "b", harness="h2")], "cpu", BASELINE) == BASELINE
    assert best_head(results, [vote("r1", "b")], "cpu", BASELINE, harness="h2") == BASELINE


def test_a_claim_needs_more_confirmations_than_refutations():
    results = [result("r1", "a", BASELINE, V1, 1.5)]
    votes = [vote("r1", "b"), vote("r1", "c"), vote("r1", "d", "refute")]
    assert verified_children(results, votes, quorum=1) == {"r1": {"b", "c"}}
    assert verified_children(results, votes, quorum=2) == {"r1": {"b", "c"}}
    assert verified_children(results, votes, quorum=3) == {}
    tie = [*votes, vote("r1", "e", "refute")]
    assert verified_children(results, tie, quorum=1) == {}  # a tie waits for more verifiers
    assert refuted_claims(results, tie, quorum=2) == {"r1"}
    assert refuted_claims(results, votes, quorum=1) == set()  # outvoted refutation
    crash = [vote("r1", "b"), vote("r1", "c", "crash")]
    assert verified_children(results, crash) == {"r1": {"b"}}  # a crash is no refutation
    one_each = [vote("r1", "b"), vote("r1", "c", "refute")]
    assert verified_children(results, one_each) == {}
    assert refuted_claims(results, one_each) == {"r1"}


def test_signed_facts_flatten_into_rows_the_rule_reads(alice, bob):
    claim = make_result(alice, 1, BASELINE, V1, 1.42)
    check = make_verification(bob, 1, claim)
    results, verifications = rows_from_facts([claim, check])
    assert results[0]["val_bpb"] == 1.42 and results[0]["author"] == alice.peer_id
    assert verifications[0]["result"] == claim.id and verifications[0]["harness"] == HARNESS
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
    confirmed = [*unsure, vote("r1", "dave", "confirm")]
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
              st.sampled_from(["confirm", "confirm", "refute", "inconclusive", "crash"]), st.sampled_from(["h", "h2"])),
    max_size=30,
)  # fmt: skip


def swarm(claim_list, vote_list):
    results = [
        result(f"r{i}", author, VERSIONS[p], VERSIONS[c], None if outcome == "crash" else bpb,
               outcome=outcome, harness=harness)
        for i, (author, p, c, bpb, outcome, harness) in enumerate(claim_list)
    ]  # fmt: skip
    verifications = [
        vote(f"r{r % max(1, len(results))}", author, v, harness=h) for r, author, v, h in vote_list
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
            if r is not None and x["verdict"] == verdict and x["author"] != r["author"] and x["harness"] == r["harness"]:
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
