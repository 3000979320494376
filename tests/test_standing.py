"""Standing of peers: who this node stops listening to, from the facts and counts it holds."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys

import pytest
from conftest import (
    BASELINE,
    CAMPAIGN,
    HARNESS,
    T0,
    confirming_looks,
    make_result,
    make_verification,
)

from node import wire
from node.consensus import Rules
from node.ledger import Ledger
from node.standing import RECOVERY, ledger_standing, peer_standing, silenced

RULES = Rules(quorum=1, sigma=0.005, tolerance=1e-4)


def rules_for(quorum: int = 1):
    return lambda _profile: Rules(quorum=quorum, sigma=0.005, tolerance=1e-4)


def claim(rid, author, claimed=None, profile="test", harness="h"):
    row = {"id": rid, "author": author, "outcome": "keep", "profile": profile, "harness": harness,
           "parent": BASELINE, "child": rid.ljust(64, "0")[:64], "device": "cpu"}  # fmt: skip
    if claimed is not None:
        row.update(seeds=[1], child_scores=[1.5 - claimed], parent_scores=[1.5])
    return row


def look(rid, author, gain, seed=7, verdict="confirm", replay=None, profile="test", harness="h"):
    return {"result": rid, "author": author, "verdict": verdict, "profile": profile,
            "harness": harness, "delta": None if gain is None else -gain, "seed": seed,
            "replay_val_bpb": replay, "device": "cpu"}  # fmt: skip


def looks(rid, author, gains):
    return [look(rid, author, g, seed=100 + i) for i, g in enumerate(gains)]


def standing_of(results, votes, quorum=1, offences=()):
    return peer_standing(results, votes, rules_for(quorum), offences)


def test_chance_wins_refuted_never_cost_an_honest_author_its_standing():
    rng = random.Random(4)
    results = [claim(f"c{i}", "honest", claimed=0.012) for i in range(6)]
    votes = [
        x
        for r in results
        for p in ("v1", "v2")
        for x in looks(r["id"], p, [rng.gauss(0, 0.005) for _ in range(8)])
    ]
    s = standing_of(results, votes)["honest"]
    assert (s.claims, s.failed, s.status) == (6, 6, "good")


def test_looks_a_noisy_verifier_could_not_tell_from_noise_never_cost_standing():
    rng = random.Random(2)
    results = [claim(f"c{i}", "a") for i in range(10)]
    votes = [x for r in results for p in ("v1", "v2", "v3")
             for x in looks(r["id"], p, [0.03 + rng.gauss(0, 0.005) for _ in range(3)])]  # fmt: skip
    assert silenced(standing_of(results, votes)) == set()


def test_a_verifier_whose_looks_lie_far_outside_the_others_is_silenced_and_told_why():
    results = [claim(f"c{i}", "a") for i in range(3)]
    votes = []
    for r in results:
        votes += looks(r["id"], "v1", [0.03] * 3) + looks(r["id"], "v2", [0.03] * 3)
        votes += looks(r["id"], "framer", [-0.3] * 3)
    s = standing_of(results, votes)["framer"]
    assert s.silenced and s.outlying == 3
    assert "looked far outside the pooled estimate of the others" in s.reasons[0]
    assert standing_of(results, votes)["v1"].status == "good"


def test_an_author_that_claims_far_more_than_its_verifiers_measure_is_silenced():
    results = [claim(f"c{i}", "liar", claimed=0.08) for i in range(2)]  # measured: about 0.01
    votes = [x for r in results for p in ("v1", "v2") for x in looks(r["id"], p, [0.01] * 4)]
    s = standing_of(results, votes)["liar"]
    assert s.overclaimed == 2 and s.silenced
    assert "claimed a gain far above what its verifiers measured" in s.reasons[0]


def test_the_ledgers_standing_counts_an_overclaim_that_waits_for_a_replay_as_the_rule_does(
    tmp_path, alice, bob, carol
):
    """alice signs gains of 0.08 that bob's and carol's looks measure at 0.01: the looks would
    verify each claim, but it waits for a replay of her seed (`awaits_replay`), and standing
    counts the overclaim. The ledger keeps that wait with each claim, so its standing is the
    pure rule's (until release 10 it counted none of them)."""
    claims = []
    for seq in (1, 2):
        body = wire.result_body(
            parent=BASELINE, child=f"{seq:064x}", diff=b"d", description="far more", profile="cpu",
            harness=HARNESS, seed=seq, outcome="keep", metrics={"val_bpb": 1.42},
            pairs=[(seq, 1.42, 1.50)], device="cpu",
        )  # fmt: skip
        claims.append(wire.sign(alice, "result", CAMPAIGN, seq, body, T0 + seq))
    looks = [make_verification(who, 10 * k + i + 1, r, delta=-0.01, seed=100 + i)
             for k, r in enumerate(claims) for who in (bob, carol) for i in range(4)]  # fmt: skip
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        book.ingest_many([f.raw for f in claims + looks])
        _, kept, _ = book.standings("cpu", every=True)
        assert len(kept) == 2 and all(j.state == "open" and j.awaits_replay for j in kept.values())
        results, verifications = book.claim_rows("cpu")
        pure = peer_standing(results, verifications, lambda p: book.rules(p))
        kept_standing = ledger_standing(book)
        assert kept_standing[alice.peer_id].overclaimed == 2 and alice.peer_id in silenced(
            kept_standing
        )
        assert {p: s.as_dict() for p, s in kept_standing.items()} == {
            p: s.as_dict() for p, s in pure.items()
        }


def test_an_overclaim_too_close_to_decide_silences_its_author_and_a_release_10_ledger_agrees(
    tmp_path, alice, bob, carol
):
    """alice signs a gain of 0.08 that bob's and carol's looks measure at about nothing: too
    close to zero to refute the change, over ten standard errors below her word. The claim
    waits for a replay of her seed and standing counts the overclaim at once, so that nobody
    here runs her next claims first (release 10 held it plainly open and counted nothing: its
    ledger is judged again when opened)."""
    body = wire.result_body(
        parent=BASELINE, child="1" * 64, diff=b"d", description="far more", profile="cpu",
        harness=HARNESS, seed=1, outcome="keep", metrics={"val_bpb": 1.42},
        pairs=[(1, 1.42, 1.50)], device="cpu",
    )  # fmt: skip
    r1 = wire.sign(alice, "result", CAMPAIGN, 1, body, T0 + 1)
    looks = [make_verification(who, 1, r1, "inconclusive", delta=0.001) for who in (bob, carol)]
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        book.ingest_many([f.raw for f in (r1, *looks)])
        _, kept, _ = book.standings("cpu", every=True)
        assert (kept[r1.id].state, kept[r1.id].awaits_replay) == ("open", True)
        assert ledger_standing(book)[alice.peer_id].overclaimed == 1
        assert alice.peer_id in silenced(ledger_standing(book))
        book.conn.execute("UPDATE claims SET awaits_replay = 0")  # as release 10 judged it
        book.conn.execute("DROP INDEX verifications_replays")  # release 12's
        book.conn.execute("PRAGMA user_version = 10")
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        assert alice.peer_id in silenced(ledger_standing(book))


def test_standing_recovers_once_good_evidence_outweighs_the_bad():
    bad = [claim("bad", "a")]
    votes = (
        looks("bad", "v1", [0.03] * 3)
        + looks("bad", "v2", [0.03] * 3)
        + looks("bad", "x", [-0.3] * 3)
    )
    assert standing_of(bad, votes)["x"].silenced
    good = [claim(f"g{i}", "b") for i in range(RECOVERY)]
    for r in good:
        votes += looks(r["id"], "v1", [0.03] * 3) + looks(r["id"], "x", [0.03] * 3)
    s = standing_of(bad + good, votes)["x"]
    assert (s.outlying, s.looks, s.silenced) == (1, RECOVERY, False)


def test_colluders_two_against_two_silence_nobody():
    """Two framers against two honest verifiers at quorum 2: the claim stays open, disputed,
    and nobody loses standing for it: not the author, not the honest confirmers."""
    results = [claim(f"c{i}", "author", claimed=0.03) for i in range(3)]
    votes = []
    for r in results:
        for p in ("h1", "h2"):
            votes += looks(r["id"], p, [0.03] * 2)
        for p in ("x1", "x2"):
            votes += looks(r["id"], p, [-0.2] * 8)
    standing = standing_of(results, votes, quorum=2)
    assert silenced(standing) == set()
    assert standing["author"].failed == 0


CHEAT = "1a2b3c4d5e6f" + "0" * 52  # a result id


@pytest.mark.parametrize("quorum", [1, 2])
def test_a_claim_the_quorum_found_void_silences_its_author_one_framer_does_not(quorum):
    results = [claim(CHEAT, "cheat")]
    one = [look(CHEAT, "v1", None, verdict="void")]
    assert not standing_of(results, one, quorum=quorum)["cheat"].silenced
    both = [*one, look(CHEAT, "v2", None, verdict="void")]
    s = standing_of(results, both, quorum=quorum)["cheat"]
    assert s.silenced and s.voided == 1
    assert s.reasons[0].startswith(
        "1 claim(s) found void: its score broke the harness's rules (first 1a2b3c4d5e6f)"
    )
    outvoted = [*both, *looks(CHEAT, "v3", [0.03] * 3), *looks(CHEAT, "v4", [0.03] * 3),
                *looks(CHEAT, "v5", [0.03] * 3)]  # fmt: skip
    assert not standing_of(results, outvoted, quorum=quorum)["cheat"].silenced


def test_replays_that_differ_from_the_signed_score_silence_the_author():
    results = [claim(CHEAT, "liar", claimed=0.03)]  # signed child 1.47 on its seed
    # looks that agree with its gain: only the replays tell
    votes = [look(CHEAT, p, 0.03, replay=1.50) for p in ("v1", "v2")]
    assert not standing_of(results, votes[:1])["liar"].silenced  # one peer's word, at quorum 1
    s = standing_of(results, votes)["liar"]
    assert s.misreported == 1 and s.silenced


def test_an_overclaim_stays_held_against_its_author_once_one_replay_denies_its_score():
    """A claimed gain of 0.5 that one verifier's looks refute silences its author; the same
    verifier's replay of the author's seed, which also denies it, must not give it back."""
    results = [claim(CHEAT, "faker", claimed=0.5)]
    lost = looks(CHEAT, "v1", [-0.05] * 3)
    s = standing_of(results, lost)["faker"]
    assert s.silenced and s.overclaimed == 1
    replayed = [*lost, look(CHEAT, "v1", -0.05, seed=1, replay=1.55)]
    s = standing_of(results, replayed)["faker"]
    assert s.silenced and s.overclaimed == 1 and s.misreported == 0


@pytest.mark.parametrize("seen", [-0.05, 0.0])
def test_an_overclaim_the_looks_refute_or_cannot_yet_decide_stays_held_after_one_denial(seen):
    """As above, and where the verifier's look measures about nothing (too close to zero to
    refute the change, far below the signed gain): one denial of the author's seed leaves the
    overclaim held against it."""
    results = [claim(CHEAT, "faker", claimed=0.05)]
    first = [look(CHEAT, "v1", seen)]
    assert standing_of(results, first)["faker"].overclaimed == 1
    replayed = [*first, look(CHEAT, "v1", seen, seed=1, replay=1.5)]
    s = standing_of(results, replayed)["faker"]
    assert s.silenced and s.overclaimed == 1 and s.misreported == 0


def test_a_peers_own_void_results_cost_it_nothing(tmp_path, alice, bob, carol):
    """Its own node voided them before they could be claimed: that is the system working."""
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        for seq in range(1, 6):
            void = make_result(alice, seq, BASELINE, f"{seq:064x}", None, outcome="void")
            book.ingest(void.raw)
            book.ingest(make_verification(bob, seq, void, "void").raw)  # no claim: no verdict
        win = make_result(alice, 6, BASELINE, "66" * 32, 1.4)
        book.ingest_many([win.raw, *(f.raw for f in confirming_looks(carol, 1, win))])
        standing = ledger_standing(book)[alice.peer_id]
    assert (standing.status, standing.claims, standing.failed, standing.voided) == ("good", 1, 0, 0)


def test_refused_messages_weigh_by_kind_and_forgive_a_newer_protocol():
    offences = [
        {"peer_id": "forger", "reason": "bad_signature", "count": 12},
        {"peer_id": "forger", "reason": "replay", "count": 8},
        {"peer_id": "newer", "reason": "unknown_version", "count": 500},
        {"peer_id": "bursty", "reason": "flood", "count": 60},
        {"peer_id": "junker", "reason": "junk", "count": 1},
        {"peer_id": "unknown", "reason": "malformed", "count": 99},
    ]
    standing = standing_of([], [], offences=offences)
    assert silenced(standing) == {"forger", "junker"}
    assert standing["forger"].reasons == (
        "refused messages worth 20 points (bad_signature 12, replay 8)",
    )
    assert standing["bursty"].status == "watched" and standing["newer"].status == "good"
    assert "unknown" not in standing


def test_standing_does_not_depend_on_the_order_of_the_facts():
    results = [claim(f"c{i}", "a", claimed=0.05) for i in range(4)]
    votes = [x for r in results for p in ("v1", "v2", "x")
             for x in looks(r["id"], p, [-0.3 if p == "x" else 0.01] * 3)]  # fmt: skip
    votes += [look("c1", "a", 0.4)]  # its own look
    expected = {p: s.as_dict() for p, s in standing_of(results, votes).items()}
    assert expected["x"]["status"] == "silenced" and expected["a"]["overclaimed"] == 4
    rng = random.Random(5)
    for _ in range(20):
        rng.shuffle(results)
        rng.shuffle(votes)
        assert {p: s.as_dict() for p, s in standing_of(results, votes).items()} == expected


def test_the_ledger_charges_a_signed_replay_to_its_author_not_the_relay(
    tmp_path, alice, bob, carol
):
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        first = make_result(alice, 1, BASELINE, "11" * 32, 1.4)
        other = make_result(alice, 1, BASELINE, "22" * 32, 0.4)  # the same seq, signed again
        assert isinstance(book.ingest(first.raw, from_peer=bob.peer_id), wire.Fact)
        assert book.ingest(other.raw, from_peer=bob.peer_id).reason is wire.Reason.replay
        book.record_offences({(carol.peer_id, "flood"): 40, (carol.peer_id, "junk"): 1})
        book.record_offences({(carol.peer_id, "junk"): 1})
        refuted = make_result(bob, 1, BASELINE, "33" * 32, 0.3)
        book.ingest(refuted.raw)
        book.ingest(make_verification(carol, 1, refuted, "refute", delta=0.05).raw)
        standing = ledger_standing(book)
    assert standing[alice.peer_id].offences == {"replay": 1}
    assert bob.peer_id not in standing or not standing[bob.peer_id].offences
    assert standing[bob.peer_id].failed == 1 and not standing[bob.peer_id].silenced
    assert standing[carol.peer_id].offences == {"flood": 40, "junk": 2}
    assert standing[carol.peer_id].silenced  # two junk frames and a flood: 48 points


def test_refusals_a_busy_ledger_could_not_record_are_recorded_at_the_next_judgement(tmp_path):
    from node.gossip import GossipConfig, GossipNode
    from node.identity import Identity
    from node.network import LedgerFacts, judge

    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        node = GossipNode(GossipConfig(home=tmp_path, campaign=CAMPAIGN), Identity.generate(),
                          LedgerFacts(book))  # fmt: skip
        node._penalise("peer-a", 1.0, "junk")
        record, busy = book.record_offences, [sqlite3.OperationalError("database is locked")]

        def flaky(offences):
            if busy:
                raise busy.pop()
            record(offences)

        book.record_offences = flaky
        with pytest.raises(sqlite3.OperationalError):
            judge(book, node)
        node._penalise("peer-a", 1.0, "junk")
        judge(book, node)
        assert book.rows("SELECT peer_id, reason, count FROM rejections") == [
            {"peer_id": "peer-a", "reason": "junk", "count": 2}
        ]


def test_the_gossip_layer_hears_a_silenced_peer_and_drops_a_banned_one(tmp_path, alice, bob, carol):
    """A peer silenced by the evidence is still heard (its facts are how it recovers); one banned
    for refused messages is dropped, whoever relays it."""
    from types import SimpleNamespace

    from libp2p.peer.id import ID

    from node.gossip import GossipConfig, GossipNode
    from node.identity import Identity
    from node.network import LedgerFacts, judge

    def message(relay, fact):
        return SimpleNamespace(from_id=ID.from_base58(relay.peer_id).to_bytes(), data=fact.raw)

    dave, erin = Identity(bytes(range(3, 35))), Identity(bytes(range(4, 36)))
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        node = GossipNode(GossipConfig(home=tmp_path, campaign=CAMPAIGN), Identity.generate(),
                          LedgerFacts(book))  # fmt: skip
        fakes = [make_result(alice, seq, BASELINE, f"{seq:064x}", 0.2) for seq in (1, 2, 3)]
        votes = [make_verification(peer, seq, f, "void")  # void on the word of two peers
                 for peer in (carol, erin) for seq, f in enumerate(fakes, 1)]  # fmt: skip
        for fact in fakes + votes:
            assert node._validate(ID.from_base58(bob.peer_id), message(bob, fact))
        assert node.silenced == set()
        book.record_offences({(dave.peer_id, "junk"): 1})
        node.set_standing(judge(book, node))
        assert node.silenced == {alice.peer_id, dave.peer_id} and node.banned == {dave.peer_id}
        later = make_result(alice, 4, BASELINE, "44" * 32, 0.1)
        assert node._validate(ID.from_base58(bob.peer_id), message(bob, later))  # heard, stored
        assert book.rows("SELECT id FROM facts WHERE id = ?", (later.id,))
        junk = make_result(dave, 1, BASELINE, "66" * 32, 1.4)
        assert not node._validate(ID.from_base58(bob.peer_id), message(bob, junk))
        assert not node._validate(ID.from_base58(dave.peer_id), message(dave, junk))
        honest = make_result(bob, 1, BASELINE, "55" * 32, 1.4)
        assert node.keep_standing([junk.raw, honest.raw]) == [honest.raw]  # what sync stores
        assert node.counts["dropped"] == 3
        status = node.status()
        assert alice.peer_id in status["silenced"]
        why = next(s for s in status["standing"] if s["peer"] == alice.peer_id)["reasons"][0]
        assert why.startswith("3 claim(s) found void: its score broke the harness's rules")
        for _ in range(3):  # the gossip layer's own refusals outlive a restart: in the ledger
            node._penalise(bob.peer_id, 0.2, "flood")
        node.set_standing(judge(book, node))
        assert node.standing[bob.peer_id].offences == {"flood": 3}
        (tmp_path / "gossip.json").write_text(json.dumps(node.status()))
    shown = subprocess.run(
        [sys.executable, "-m", "node.cli", "peers", "--home", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    line = next(row for row in shown.stdout.splitlines() if alice.peer_id[-12:] in row)
    assert "silenced" in line and "3 claim(s) found void" in line
    assert "flood 3" in next(row for row in shown.stdout.splitlines() if bob.peer_id[-12:] in row)
    status = subprocess.run(
        [sys.executable, "-m", "node.cli", "status", "--home", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip
    assert f"silenced {alice.peer_id}: 3 claim(s) found void" in status.stdout, status
