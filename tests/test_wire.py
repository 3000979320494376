"""The wire format: canonical bytes, total decoding, one counted reason for every rejection."""

from __future__ import annotations

import hashlib
import importlib.util
import random
from pathlib import Path

import msgpack
import pytest
from conftest import CAMPAIGN, HARNESS, T0, make_result
from hypothesis import given, settings
from hypothesis import strategies as st

from node import wire
from node.identity import GROUP_ORDER, Identity
from node.wire import Reason

_spec = importlib.util.spec_from_file_location(
    "fuzz_wire", Path(__file__).resolve().parent.parent / "scripts" / "fuzz_wire.py"
)
fuzz_wire = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_wire)

sha = st.binary(min_size=32, max_size=32).map(bytes.hex)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
maybe = st.one_of(st.none(), finite)
uint = st.integers(min_value=0, max_value=2**63 - 1)
metrics = st.fixed_dictionaries(
    {"val_bpb": finite, "steps": uint, "tokens": uint, "train_seconds": maybe,
     "total_seconds": maybe, "peak_memory_mb": maybe, "mfu": maybe}
)  # fmt: skip
result_bodies = st.builds(
    wire.result_body,
    parent=sha, child=sha, diff=st.binary(max_size=2000), harness=sha, seed=uint,
    description=st.text(max_size=300), profile=st.from_regex(r"[a-z0-9][a-z0-9_-]{0,31}", fullmatch=True),
    outcome=st.sampled_from(["keep", "discard"]), metrics=metrics,
)  # fmt: skip
seeds = st.binary(min_size=32, max_size=32)


def _envelope(fact: wire.Fact) -> dict:
    return msgpack.unpackb(fact.raw, raw=False, strict_map_key=False)


def _resign(who: Identity, env: dict) -> bytes:
    """Sign an envelope as given (even a bad one), as a peer with a modified client would."""
    env = {k: v for k, v in env.items() if k != "sig"}
    env["sig"] = who.sign(wire.canonical(env))
    return wire.canonical(env)


@settings(max_examples=200, deadline=None)
@given(seed=seeds, body=result_bodies, seq=st.integers(1, 2**63 - 1), t=st.integers(0, 2**53))
def test_a_signed_result_decodes_to_the_same_fact(seed, body, seq, t):
    fact = wire.sign(Identity(seed), "result", CAMPAIGN, seq, body, t)
    again = wire.decode(fact.raw, CAMPAIGN, now_ms=t)
    assert again == fact
    assert again.body == body and again.seq == seq and again.time == t
    assert again.id == wire.fact_id(fact.raw)


profiles = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,31}", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(
    seed=seeds, result=sha, child=maybe, parent=maybe, run_seed=uint, profile=profiles,
    harness=sha, verdict=st.sampled_from(wire.VERDICTS),
)  # fmt: skip
def test_a_signed_verification_decodes_to_the_same_fact(
    seed, result, child, parent, run_seed, profile, harness, verdict
):
    body = wire.verification_body(
        result=result, child_val_bpb=child, parent_val_bpb=parent, seed=run_seed,
        profile=profile, harness=harness, verdict=verdict,
    )  # fmt: skip
    fact = wire.sign(Identity(seed), "verification", CAMPAIGN, 1, body, T0)
    assert wire.decode(fact.raw, CAMPAIGN, now_ms=T0) == fact


@settings(max_examples=100, deadline=None)
@given(
    seed=seeds, program=st.binary(max_size=500), baseline=sha,
    profiles_=st.lists(profiles, min_size=1, max_size=16), quorum=st.integers(1, 64),
    data=st.dictionaries(st.text(max_size=32).filter(lambda t: "\n" not in t and "\r" not in t),
                         sha, max_size=16),
)  # fmt: skip
def test_a_signed_campaign_decodes_to_the_same_fact(
    seed, program, baseline, profiles_, quorum, data
):
    organiser = Identity(seed)
    body = wire.campaign_body(
        name=CAMPAIGN, organiser=organiser.public_key, program=program, baseline=baseline,
        profiles=profiles_, quorum=quorum, data=data,
    )  # fmt: skip
    fact = wire.sign(organiser, "campaign", CAMPAIGN, 1, body, T0)
    assert wire.decode(fact.raw, CAMPAIGN, now_ms=T0) == fact


@settings(max_examples=200, deadline=None)
@given(body=result_bodies, order=st.randoms(use_true_random=False))
def test_canonical_bytes_do_not_depend_on_key_order(body, order):
    def shuffled(value):
        if isinstance(value, dict):
            items = list(value.items())
            order.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        return value

    assert wire.canonical(shuffled(body)) == wire.canonical(body)
    assert wire.canonical(msgpack.unpackb(wire.canonical(body), raw=False)) == wire.canonical(body)


@settings(max_examples=100, deadline=None)
@given(
    seed=seeds,
    ids=st.lists(sha, max_size=20),
    authors=st.dictionaries(st.binary(min_size=32, max_size=32), uint, max_size=50),
    best=st.dictionaries(st.sampled_from(["cpu", "gpu", "test"]), sha),
)
def test_a_head_with_binary_keys_round_trips_canonically(seed, ids, authors, best):
    body = wire.head_body(ids, authors, best)
    fact = wire.sign(Identity(seed), "head", CAMPAIGN, 1, body, T0)
    assert wire.decode(fact.raw, CAMPAIGN, now_ms=T0) == fact
    reordered = dict(reversed(list(authors.items())))
    assert wire.canonical(wire.head_body(ids[::-1], reordered, best)) == wire.canonical(body)
    assert len(body["bins"]) == wire.HEAD_BINS * wire.BIN_BYTES  # however many authors
    if authors:  # one author more changes its own bin's digest and no other
        key = next(iter(authors))
        more = {**authors, key: authors[key] + 1}
        assert wire.differing_bins(wire.head_bins(more), body["bins"]) == [wire.bin_of(key)]


def test_a_head_is_the_same_small_size_however_many_authors_it_holds(alice):
    sizes = []
    for n in (1, 16, 1000, wire.MAX_HEAD_AUTHORS):
        authors = {i.to_bytes(32, "big"): (10_000 + i, 10_000 + i) for i in range(n)}
        body = wire.head_body(["ab" * 32] * 3, authors, {"gpu": "cd" * 32})
        sizes.append(len(wire.sign(alice, "head", CAMPAIGN, T0, body, T0).raw))
    assert len(set(sizes)) == 1 and sizes[0] < 2500  # was 37 KB at 1,000 authors, by name


def test_a_trainer_run_becomes_a_result_body(alice):
    from node.trainer.runner import RunResult  # the trainer's own record: the two never drift

    run = RunResult(
        outcome="ok", val_bpb=1.2345, steps=900, tokens=460_800, train_seconds=120.0,
        total_seconds=141, peak_memory_mb=None, mfu=None, train_py_sha256="11" * 32,
        harness_sha256=HARNESS, profile="cpu", seed=3, data_sha256="22" * 32,
    ).as_dict()  # fmt: skip
    body = wire.result_body_from_run(
        run, parent="00" * 32, diff=b"-a\n+b\n", description="x", keep=True
    )
    assert body["child"] == "11" * 32 and body["harness"] == HARNESS and body["outcome"] == "keep"
    assert body["metrics"]["total_seconds"] == 141.0 and body["metrics"]["val_bpb"] == 1.2345
    assert wire.sign(alice, "result", CAMPAIGN, 1, body, T0).body == body
    crashed = {**run, "outcome": "crash", "val_bpb": None}
    body = wire.result_body_from_run(
        crashed, parent="00" * 32, diff=b"", description="x", keep=True
    )
    assert body["outcome"] == "crash"
    discarded = wire.result_body_from_run(
        run, parent="00" * 32, diff=b"", description="x", keep=False
    )
    assert discarded["outcome"] == "discard"


def test_a_void_run_becomes_a_void_result_never_kept_and_needs_no_score(alice):
    from node.trainer.runner import RunResult

    run = RunResult(
        outcome="void", val_bpb=None, steps=900, tokens=460_800, train_seconds=120.0,
        total_seconds=141, peak_memory_mb=None, mfu=None, train_py_sha256="11" * 32,
        harness_sha256=HARNESS, profile="cpu", seed=3, data_sha256="22" * 32,
        error="its predictions depend on later tokens",
    ).as_dict()  # fmt: skip
    body = wire.result_body_from_run(run, parent="00" * 32, diff=b"", description="x", keep=True)
    assert body["outcome"] == "void" and body["metrics"]["val_bpb"] is None
    assert wire.sign(alice, "result", CAMPAIGN, 1, body, T0).body == body
    scored = {**run, "val_bpb": 0.5}  # whatever number came with it: never a keep
    assert wire.result_body_from_run(
        scored, parent="00" * 32, diff=b"", description="x", keep=True
    )["outcome"] == "void"  # fmt: skip
    unscored = {**body, "outcome": "discard"}
    with pytest.raises(wire.WireError, match="only a crash or a void run may lack val_bpb"):
        wire.sign(alice, "result", CAMPAIGN, 2, unscored, T0)


def test_a_verifier_can_sign_a_void_verdict(alice):
    claim = make_result(alice, 1, "00" * 32, "11" * 32, 1.5)
    body = wire.verification_body(
        result=claim.id, child_val_bpb=None, parent_val_bpb=1.5, seed=4, profile="cpu",
        harness=HARNESS, verdict="void",
    )  # fmt: skip
    fact = wire.sign(alice, "verification", CAMPAIGN, 2, body, T0)
    assert wire.decode(fact.raw, CAMPAIGN, now_ms=T0) == fact and fact.body["delta"] is None
    assert wire.OUTCOMES == ("keep", "discard", "crash", "void")
    assert wire.VERDICTS == ("confirm", "refute", "inconclusive", "crash", "void", "misreported")


def test_signing_twice_gives_the_same_bytes_and_id(alice):
    first = make_result(alice, 1, "00" * 32, "11" * 32, 1.5)
    second = make_result(alice, 1, "00" * 32, "11" * 32, 1.5)
    assert first.raw == second.raw and first.id == second.id


def test_forged_signature_is_rejected(alice, bob):
    fact = make_result(alice, 1, "00" * 32, "11" * 32, 1.5)
    env = _envelope(fact)
    env["sig"] = bob.sign(wire.canonical({k: v for k, v in env.items() if k != "sig"}))
    out = wire.decode(wire.canonical(env), CAMPAIGN, now_ms=T0)
    assert out.reason is Reason.bad_signature


def test_a_fact_by_the_identity_key_is_rejected_and_never_stored(alice, tmp_path):
    from node.ledger import Ledger

    identity_point = bytes([1]) + bytes(31)
    env = _envelope(make_result(alice, 1, "00" * 32, "11" * 32, 1.5))
    env.update(author=identity_point, sig=identity_point + bytes(32))  # R = identity, S = 0
    out = wire.decode(wire.canonical(env), CAMPAIGN, now_ms=T0)
    assert out.reason is Reason.weak_key and "small order" in out.detail
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as ledger:
        assert isinstance(ledger.ingest(wire.canonical(env), now_ms=T0), wire.Rejection)
        assert ledger.rows("SELECT COUNT(*) AS n FROM facts")[0]["n"] == 0


def test_a_weak_member_key_or_a_malleated_signature_is_rejected(alice):
    fact = make_result(alice, 1, "00" * 32, "11" * 32, 1.5)
    env = _envelope(fact)
    s = int.from_bytes(fact.sig[32:], "little") + GROUP_ORDER
    env["sig"] = fact.sig[:32] + s.to_bytes(32, "little")  # verifies under a lax check
    out = wire.decode(wire.canonical(env), CAMPAIGN, now_ms=T0)
    assert out.reason is Reason.bad_signature and "group order" in out.detail
    body = wire.campaign_body(
        name=CAMPAIGN, organiser=alice.public_key, program=b"# go", baseline="00" * 32,
        profiles=["cpu"], members=[alice.public_key, bytes(32)],  # (sqrt(-1), 0): order 4
    )  # fmt: skip
    with pytest.raises(wire.WireError, match="small order"):
        wire.sign(alice, "campaign", CAMPAIGN, 1, body, T0)


def test_changing_a_signed_number_breaks_the_signature(alice):
    env = _envelope(make_result(alice, 1, "00" * 32, "11" * 32, 1.5))
    env["body"]["metrics"]["val_bpb"] = 1.0  # a better score, claimed after signing
    assert wire.decode(wire.canonical(env), CAMPAIGN, now_ms=T0).reason is Reason.bad_signature


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda e: e.update(v=2), Reason.unknown_version),
        (lambda e: e.update(v="1"), Reason.bad_type),
        (lambda e: e.update(kind="gossip"), Reason.unknown_kind),
        (lambda e: e.pop("seq"), Reason.missing_field),
        (lambda e: e.update(extra=1), Reason.extra_field),
        (lambda e: e.update(seq=0), Reason.bad_type),
        (lambda e: e.update(seq=True), Reason.bad_type),
        (lambda e: e.update(time=-5), Reason.bad_type),
        (lambda e: e["body"].pop("seed"), Reason.missing_field),
        (lambda e: e["body"].update(note="hi"), Reason.extra_field),
        (lambda e: e["body"].update(child="XY" * 32), Reason.bad_type),
        (lambda e: e["body"].update(outcome="win"), Reason.bad_type),
        (lambda e: e["body"].update(description="two\nlines"), Reason.bad_type),
        (lambda e: e["body"]["metrics"].update(val_bpb=float("nan")), Reason.bad_type),
        (lambda e: e["body"]["metrics"].update(val_bpb=None), Reason.bad_type),  # keep w/o score
        (lambda e: e["body"]["metrics"].update(steps=1.0), Reason.bad_type),
        (lambda e: e["body"].update(description="x" * 5000), Reason.oversized),
        (lambda e: e.update(campaign="elsewhere"), Reason.foreign_campaign),
        (lambda e: e.update(time=T0 + 3_600_000), Reason.future_time),
    ],
)
def test_each_bad_envelope_is_rejected_with_its_reason(alice, change, reason):
    env = _envelope(make_result(alice, 1, "00" * 32, "11" * 32, 1.5, time_ms=T0))
    change(env)
    out = wire.decode(_resign(alice, env), CAMPAIGN, now_ms=T0)
    assert isinstance(out, wire.Rejection)
    assert out.reason is reason, out.detail


def test_non_canonical_encodings_of_a_valid_fact_are_malformed(alice):
    fact = make_result(alice, 1, "00" * 32, "11" * 32, 1.5)
    env = _envelope(fact)
    unsorted = msgpack.packb(dict(reversed(list(env.items()))), use_bin_type=True)
    float32 = msgpack.packb(env, use_bin_type=True, use_single_float=True)
    for raw in (unsorted, float32, fact.raw + b"\xc0"):
        out = wire.decode(raw, CAMPAIGN, now_ms=T0 + 10_000)
        assert out.reason is Reason.malformed


def test_oversized_input_is_refused_before_unpacking():
    huge = b"\xdb" + (50_000_000).to_bytes(4, "big") + b"x" * 300_000
    assert wire.decode(huge).reason is Reason.oversized
    claims_gigabytes = b"\xdd\xff\xff\xff\xff"  # an array header claiming 4 billion items
    assert wire.decode(claims_gigabytes).reason is Reason.malformed
    assert wire.decode("not bytes").reason is Reason.malformed


def test_a_campaign_must_be_signed_by_its_organiser(alice, bob):
    body = wire.campaign_body(
        name=CAMPAIGN, organiser=bob.public_key, program=b"# go", baseline="00" * 32,
        profiles=["cpu"], quorum=2, data={"tokenizer": HARNESS},
    )  # fmt: skip
    with pytest.raises(wire.WireError, match="organiser"):
        wire.sign(alice, "campaign", CAMPAIGN, 1, body, T0)
    assert wire.sign(bob, "campaign", CAMPAIGN, 1, body, T0).body["quorum"] == 2


def test_a_result_names_its_diff_by_hash_and_size(alice):
    diff = b"--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    sha256, size = wire.content_ref(diff)
    assert (sha256, size) == (hashlib.sha256(diff).hexdigest(), len(diff))
    body = wire.result_body(
        parent="00" * 32, child="11" * 32, diff=diff, description="x", profile="cpu",
        harness=HARNESS, seed=1, outcome="crash", metrics={"val_bpb": None},
    )  # fmt: skip
    assert (body["diff_sha256"], body["diff_size"]) == (sha256, size)
    assert wire.sign(alice, "result", CAMPAIGN, 1, body, T0).body["outcome"] == "crash"


def test_reusing_a_sequence_number_is_a_replay_and_old_heads_are_stale(alice):
    first = make_result(alice, 5, "00" * 32, "11" * 32, 1.5)
    other = make_result(alice, 5, "00" * 32, "22" * 32, 1.4)
    assert wire.check_sequence(first, None, None) is None
    assert wire.check_sequence(first, first.id, None) is None  # the same fact again
    assert wire.check_sequence(other, first.id, None).reason is Reason.replay
    head = wire.sign(alice, "head", CAMPAIGN, 3, wire.head_body([], {}, {}), T0)
    assert wire.check_sequence(head, None, 4).reason is Reason.seq_backwards
    assert wire.check_sequence(head, None, 2) is None


def test_ten_thousand_mutated_and_random_envelopes_are_all_rejected_with_a_reason():
    rng = random.Random(1)
    facts = fuzz_wire.seed_facts(rng)
    reasons = set()
    stream = fuzz_wire.mutants(rng, facts)
    for _ in range(10_000):
        out = wire.decode(next(stream), fuzz_wire.CAMPAIGN, now_ms=2_000_000)
        assert isinstance(out, wire.Rejection)
        assert isinstance(out.reason, Reason) and not out.detail.startswith("decoder bug")
        reasons.add(out.reason)
    assert {Reason.malformed, Reason.bad_signature, Reason.oversized, Reason.future_time} <= reasons


def test_a_result_carries_its_paired_runs_one_score_of_each_side_per_seed(alice):
    metrics = {"val_bpb": 1.49, "steps": 1, "tokens": 1}
    body = wire.result_body(
        parent="00" * 32, child="11" * 32, diff=b"d", description="paired", profile="cpu",
        harness=HARNESS, seed=4, outcome="keep", metrics=metrics,
        pairs=[(4, 1.48, 1.50), (9, 1.50, 1.51)], device="cpu AVX512", budget=786432,
    )  # fmt: skip
    fact = wire.sign(alice, "result", CAMPAIGN, 1, body, T0)
    decoded = wire.decode(fact.raw, CAMPAIGN, now_ms=T0)
    assert decoded == fact
    assert (decoded.body["seeds"], decoded.body["child_scores"]) == ([4, 9], [1.48, 1.50])
    assert decoded.body["parent_scores"] == [1.50, 1.51] and decoded.body["budget"] == 786432
    lopsided = {**body, "parent_scores": [1.50]}
    with pytest.raises(wire.WireError, match="one child score and one parent score for each seed"):
        wire.sign(alice, "result", CAMPAIGN, 2, lopsided, T0)
    with pytest.raises(wire.WireError, match="body.seeds: expected a list of 0 to 8 items"):
        wire.sign(alice, "result", CAMPAIGN, 3, {**body, "seeds": [1] * 9}, T0)
