"""Standing of peers: who this node stops listening to, from the facts and counts it holds."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

from conftest import (
    BASELINE,
    CAMPAIGN,
    confirming_looks,
    looks_rows,
    make_result,
    make_verification,
    vote_row,
)

from node import wire
from node.ledger import Ledger
from node.standing import ledger_standing, peer_standing, silenced


def claim(rid, author, outcome="keep", profile="test", harness="h"):
    return {"id": rid, "author": author, "outcome": outcome, "profile": profile, "harness": harness}


def vote(rid, author, verdict, profile="test", harness="h", seed=7):
    delta = -0.01 if verdict in ("confirm", "inconclusive", "refute") else None
    return vote_row(rid, author, verdict, profile=profile, harness=harness, delta=delta, seed=seed)


def judged(author: str, verdicts: list[str], voter: str = "v1") -> tuple[list[dict], list[dict]]:
    """Claims by `author`, each judged by `voter` with the given verdict: once, or for a
    confirmation with the looks the outlier hold asks of a profile's first win."""
    results = [claim(f"{author}{i}", author) for i in range(len(verdicts))]
    votes = []
    for i, v in enumerate(verdicts):
        rid = f"{author}{i}"
        votes += looks_rows(rid, voter, profile="test") if v == "confirm" else [vote(rid, voter, v)]
    return results, votes


def test_one_refuted_claim_does_not_cost_an_honest_peer_its_standing():
    results, votes = judged("honest", ["refute", "confirm"])
    standing = peer_standing(results, votes)
    assert standing["honest"].status == "watched" and not standing["honest"].silenced
    assert (standing["honest"].claims, standing["honest"].failed) == (2, 1)


def test_claims_a_noisy_verifier_could_not_tell_from_noise_never_cost_standing():
    results, votes = judged("honest", ["inconclusive"] * 5)
    standing = peer_standing(results, votes)["honest"]
    assert (standing.claims, standing.failed, standing.status) == (0, 0, "good")


def test_a_peer_whose_claims_mostly_fail_is_silenced_and_told_why():
    results, votes = judged("faker", ["refute", "refute", "crash", "confirm"])
    standing = peer_standing(results, votes)["faker"]
    assert standing.silenced and standing.failed == 3 and standing.claims == 4
    assert standing.reasons == ("3 of its 4 settled claims failed",)


def test_a_rate_not_a_count_three_failures_among_many_wins_keep_standing():
    results, votes = judged("prolific", ["refute"] * 3 + ["confirm"] * 3)
    assert not peer_standing(results, votes)["prolific"].silenced  # 3 failed, 3 verified: not more
    results, votes = judged("prolific", ["refute"] * 4 + ["confirm"] * 3)
    assert peer_standing(results, votes)["prolific"].silenced


def test_a_claim_one_verifier_refutes_and_another_cannot_run_has_failed():
    results = [claim("c1", "faker")]
    split = [vote("c1", "v1", "refute"), vote("c1", "v2", "crash")]
    assert peer_standing(results, split, quorum=2)["faker"].failed == 1
    confirmed = [*split, vote("c1", "v3", "confirm"), vote("c1", "v4", "confirm")]
    assert peer_standing(results, confirmed, quorum=2)["faker"].failed == 0  # two against two


def test_failures_count_only_once_the_quorum_has_settled_them():
    results, votes = judged("faker", ["refute"] * 5)
    assert peer_standing(results, votes, quorum=2)["faker"].claims == 0  # one refuter is not two
    more = [vote(r["id"], "v2", "refute") for r in results]
    assert silenced(peer_standing(results, votes + more, quorum=2)) == {"faker"}


def test_colluders_that_confirm_failed_claims_lose_standing_honest_verifiers_do_not():
    results, votes = judged("faker", ["refute"] * 3, voter="honest")
    votes += [vote(r["id"], "crony", "confirm") for r in results]  # below the quorum of 2
    votes += [vote(r["id"], "honest2", "refute") for r in results]
    standing = peer_standing(results, votes, quorum=2)
    assert silenced(standing) == {"faker", "crony"}
    assert (
        standing["crony"].false_confirms == 3
        and "confirmed 3 claims that failed" in standing["crony"].reasons[0]
    )
    assert standing["honest"].status == "good"


def test_a_verifier_that_once_confirmed_a_refuted_claim_keeps_standing():
    good, good_votes = judged("a", ["confirm"] * 3, voter="noisy")
    bad, bad_votes = judged("b", ["refute"] * 3, voter="v1")
    bad_votes += [vote(r["id"], "v2", "refute") for r in bad]
    bad_votes += [vote(bad[0]["id"], "noisy", "confirm")]
    standing = peer_standing(good + bad, good_votes + bad_votes, quorum=2)
    assert standing["noisy"].false_confirms == 1 and not standing["noisy"].silenced


CHEAT = "1a2b3c4d5e6f" + "0" * 52  # a result id


def test_one_void_verdict_silences_the_author_at_once():
    results = [claim(CHEAT, "cheat"), *judged("cheat", ["confirm"] * 3)[0]]
    votes = [vote(CHEAT, "v1", "void"), *judged("cheat", ["confirm"] * 3)[1]]
    standing = peer_standing(results, votes)["cheat"]
    assert standing.silenced and (standing.claims, standing.failed, standing.voided) == (4, 1, 1)
    assert standing.reasons == (
        "its claim 1a2b3c4d5e6f was found void by 1 peer(s): its score broke the harness's rules",
    )  # no rate of failures needed: no noise voids a run
    assert not peer_standing(results, votes, quorum=2)["cheat"].silenced  # one void of two
    both = [*votes, vote(CHEAT, "v2", "void")]
    assert peer_standing(results, both, quorum=2)["cheat"].silenced
    outvoted = [*votes, *looks_rows(CHEAT, "v2", profile="test"), vote(CHEAT, "v3", "confirm")]
    assert not peer_standing(results, outvoted)["cheat"].silenced  # 2 confirm it, 1 found it void


def test_confirmers_of_a_claim_found_void_are_false_confirmers_unless_they_found_it_void():
    results = [claim(f"{i}{CHEAT[1:]}", "cheat") for i in range(3)]
    votes = []
    for r in results:
        votes += [
            vote(r["id"], "v1", "void"),
            vote(r["id"], "v2", "void"),
            vote(r["id"], "crony", "confirm"),
        ]
        votes += [vote(r["id"], "v3", "confirm"), vote(r["id"], "v3", "void", seed=8)]  # fmt: skip
    standing = peer_standing(results, votes, quorum=2)
    assert standing["crony"].false_confirms == 3 and standing["crony"].silenced
    assert standing["v3"].false_confirms == 0 and standing["v3"].status == "good"  # it saw it
    assert standing["cheat"].voided == 3 and standing["cheat"].reasons[0] == (
        "its claim 0a2b3c4d5e6f was found void by 3 peer(s): its score broke the harness's rules "
        "(and 2 more of its claims)"
    )


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
    standing = peer_standing([], [], offences)
    assert silenced(standing) == {"forger", "junker"}
    assert standing["forger"].reasons == (
        "refused messages worth 20 points (bad_signature 12, replay 8)",
    )
    assert standing["bursty"].status == "watched" and standing["newer"].status == "good"
    assert "unknown" not in standing


def test_standing_does_not_depend_on_the_order_of_the_facts():
    results, votes = judged("faker", ["refute", "refute", "crash", "confirm", "refute"])
    votes += [vote("faker1", "crony", "confirm"), vote("faker0", "faker", "confirm")]  # own vote
    expected = {p: s.as_dict() for p, s in peer_standing(results, votes).items()}
    rng = random.Random(5)
    for _ in range(20):
        rng.shuffle(results)
        rng.shuffle(votes)
        assert {p: s.as_dict() for p, s in peer_standing(results, votes).items()} == expected


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
        book.ingest(make_verification(carol, 1, refuted, "refute").raw)
        standing = ledger_standing(book)
    assert standing[alice.peer_id].offences == {"replay": 1}
    assert bob.peer_id not in standing or not standing[bob.peer_id].offences
    assert standing[bob.peer_id].failed == 1 and not standing[bob.peer_id].silenced
    assert standing[carol.peer_id].offences == {"flood": 40, "junk": 2}
    assert standing[carol.peer_id].silenced  # two junk frames and a flood: 48 points


def test_the_gossip_layer_drops_facts_of_a_peer_that_lost_standing(tmp_path, alice, bob, carol):
    from types import SimpleNamespace

    from libp2p.peer.id import ID

    from node.gossip import GossipConfig
    from node.gossip.peer import GossipNode
    from node.identity import Identity

    def message(relay, fact):
        return SimpleNamespace(from_id=ID.from_base58(relay.peer_id).to_bytes(), data=fact.raw)

    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        node = GossipNode(GossipConfig(home=tmp_path, campaign=CAMPAIGN), Identity.generate(), book)
        fakes = [make_result(alice, seq, BASELINE, f"{seq:064x}", 0.2) for seq in (1, 2, 3)]
        votes = [make_verification(carol, seq, f, "refute") for seq, f in enumerate(fakes, 1)]
        for fact in fakes + votes:
            assert node._validate(ID.from_base58(bob.peer_id), message(bob, fact))
        assert node.silenced == set()
        node.update_standing()
        assert node.silenced == {alice.peer_id}
        later = make_result(alice, 4, BASELINE, "44" * 32, 0.1)
        # Relayed by an honest peer or sent by alice herself: dropped either way, and not stored.
        assert not node._validate(ID.from_base58(bob.peer_id), message(bob, later))
        assert not node._validate(ID.from_base58(alice.peer_id), message(alice, later))
        honest = make_result(bob, 1, BASELINE, "55" * 32, 1.4)
        assert node._validate(ID.from_base58(bob.peer_id), message(bob, honest))
        assert node.keep_standing([later.raw, honest.raw]) == [honest.raw]  # what sync stores
        assert node.counts["dropped"] == 3
        assert not book.rows("SELECT id FROM facts WHERE id = ?", (later.id,))
        status = node.status()
        assert status["silenced"] == [alice.peer_id]
        assert status["standing"][0]["peer"] == alice.peer_id
        assert status["standing"][0]["reasons"] == ["3 of its 3 settled claims failed"]
        for _ in range(3):  # the gossip layer's own refusals outlive a restart: in the ledger
            node._penalise(bob.peer_id, 0.2, "flood")
        node.update_standing()
        assert node.standing[bob.peer_id].offences == {"flood": 3}
        (tmp_path / "gossip.json").write_text(json.dumps(node.status()))
    shown = subprocess.run(
        [sys.executable, "-m", "node.cli", "peers", "--home", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    line = next(row for row in shown.stdout.splitlines() if alice.peer_id[-12:] in row)
    assert "silenced" in line and "3 of its 3 settled claims failed" in line
    assert "flood 3" in next(row for row in shown.stdout.splitlines() if bob.peer_id[-12:] in row)
    status = subprocess.run(
        [sys.executable, "-m", "node.cli", "status", "--home", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip
    assert f"silenced {alice.peer_id}: 3 of its 3 settled claims failed" in status.stdout, status
