"""The ledger: facts stored once, rejections counted, readers beside a writer, kill -9 safe."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    BASELINE,
    CAMPAIGN,
    HARNESS,
    T0,
    confirming_looks,
    make_result,
    make_verification,
    set_terms,
    vote_row,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_wire import _envelope, _resign, fuzz_wire

from node import committees, consensus, ledger, wire
from node.identity import Identity
from node.ledger import Ledger, LedgerError
from node.wire import Reason

V1, V2, V3 = "11" * 32, "22" * 32, "33" * 32


@pytest.fixture
def book(tmp_path) -> Ledger:
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as opened:
        set_terms(opened)
        yield opened


def _count(book: Ledger, table: str) -> int:
    return book.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def test_a_fact_is_stored_once_however_often_it_arrives(book, alice):
    fact = make_result(alice, 1, BASELINE, V1, 1.5)
    outs = book.ingest_many([fact.raw, fact.raw])
    assert outs == [fact, fact]
    assert book.ingest(fact.raw) == fact
    assert _count(book, "facts") == 1 and _count(book, "results") == 1
    assert book.rows("SELECT facts, results FROM peers") == [{"facts": 1, "results": 1}]
    assert book.conn.execute("SELECT raw FROM facts").fetchone()[0] == fact.raw


def test_an_acknowledged_fact_is_visible_to_another_connection(book, alice):
    fact = make_result(alice, 1, BASELINE, V1, 1.5)
    book.ingest(fact.raw)
    other = sqlite3.connect(book.path)
    assert other.execute("SELECT id FROM facts").fetchall() == [(fact.id,)]


def test_reusing_a_sequence_number_is_rejected_as_replay_and_charged_to_the_author(book, alice):
    book.ingest(make_result(alice, 1, BASELINE, V1, 1.5).raw)
    out = book.ingest(make_result(alice, 1, BASELINE, V2, 1.2).raw)
    assert out.reason is Reason.replay
    assert _count(book, "facts") == 1
    assert book.peers()[0]["rejected"] == {"replay": 1}


def test_facts_may_arrive_in_any_order(book, alice):
    late = make_result(alice, 2, V1, V2, 1.4)
    early = make_result(alice, 1, BASELINE, V1, 1.5)
    assert book.ingest_many([late.raw, early.raw]) == [late, early]
    assert book.next_seq(alice.public_key) == 3


def test_rejections_are_counted_against_the_peer_that_delivered_them(book, alice, bob):
    env = _envelope(make_result(alice, 1, BASELINE, V1, 1.5))
    env["body"]["metrics"]["val_bpb"] = 0.5
    forged = wire.canonical(env)
    assert book.ingest(forged, from_peer=bob.peer_id).reason is Reason.bad_signature
    assert book.ingest(forged).reason is Reason.bad_signature  # no courier known
    rejected = {p["peer_id"]: p["rejected"] for p in book.peers()}
    # The claimed author (alice) is not blamed for a forgery: anyone can claim to be alice.
    assert rejected == {bob.peer_id: {"bad_signature": 1}, "unknown": {"bad_signature": 1}}
    assert book.summary()["rejected"] == {"bad_signature": 2}


def test_foreign_campaign_facts_are_refused(book, alice):
    env = _envelope(make_result(alice, 1, BASELINE, V1, 1.5))
    env["campaign"] = "other"
    assert book.ingest(_resign(alice, env)).reason is Reason.foreign_campaign


def test_ten_thousand_mutants_leave_the_ledger_unchanged_and_are_all_counted(book):
    rng = random.Random(2)
    seeds = fuzz_wire.seed_facts(rng)
    book.campaign = fuzz_wire.CAMPAIGN
    assert all(
        isinstance(o, wire.Fact) for o in book.ingest_many([f.raw for f in seeds], now_ms=2_000_000)
    )
    before = {
        t: book.rows(f"SELECT * FROM {t}")
        for t in ("facts", "results", "verifications", "campaigns")
    }
    stream = fuzz_wire.mutants(rng, seeds)
    outs = []
    for _ in range(10):
        outs += book.ingest_many([next(stream) for _ in range(1000)], now_ms=2_000_000)
    assert len(outs) == 10_000
    assert all(isinstance(o, wire.Rejection) and isinstance(o.reason, Reason) for o in outs)
    assert not any(o.detail.startswith("decoder bug") for o in outs)
    after = {t: book.rows(f"SELECT * FROM {t}") for t in before}
    assert after == before
    assert sum(book.summary()["rejected"].values()) == 10_000


def test_a_reader_sees_committed_facts_while_a_writer_holds_a_transaction(book, alice):
    book.ingest(make_result(alice, 1, BASELINE, V1, 1.5).raw)
    writer = sqlite3.connect(book.path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO runs (profile, outcome) VALUES ('cpu', 'keep')")
    with Ledger(book.path, readonly=True) as reader:
        assert reader.summary()["facts"] == {"result": 1}
        assert reader.summary()["runs"] == 0
        writer.execute("COMMIT")
        assert reader.summary()["runs"] == 1
        with pytest.raises(LedgerError, match="read-only"):
            reader.add_version(b"x = 1\n")


def test_versions_are_stored_by_hash_and_checked(book):
    source = b"print('train')\n"
    digest = book.add_version(source)
    assert book.version(digest) == source and book.add_version(source, digest) == digest
    with pytest.raises(LedgerError, match="hash to"):
        book.add_version(source, "00" * 32)


def test_own_runs_are_recorded_with_their_log_paths(book):
    run_id = book.record_run(profile="cpu", outcome="keep", val_bpb=1.5, log_path="/runs/1/log")
    assert book.rows("SELECT id, log_path FROM runs") == [{"id": run_id, "log_path": "/runs/1/log"}]
    with pytest.raises(LedgerError, match="unknown run fields"):
        book.record_run(colour="red")


# ---------------------------------------------------------------- schema


def test_a_newer_schema_is_refused_rather_than_misread(tmp_path):
    Ledger(tmp_path / "l.db").close()
    sqlite3.connect(tmp_path / "l.db").execute("PRAGMA user_version = 99")
    with pytest.raises(LedgerError, match="upgrade"):
        Ledger(tmp_path / "l.db")


def test_files_that_are_not_ledgers_are_clear_errors(tmp_path):
    other = sqlite3.connect(tmp_path / "other.db")
    other.execute("CREATE TABLE t (x)")
    other.commit()
    with pytest.raises(LedgerError, match="not a research-swarm ledger"):
        Ledger(tmp_path / "other.db")
    (tmp_path / "junk.db").write_bytes(b"hello, this is not sqlite" * 100)
    with pytest.raises(LedgerError, match="cannot open"):
        Ledger(tmp_path / "junk.db")
    with pytest.raises(LedgerError, match="no ledger"):
        Ledger(tmp_path / "absent.db", readonly=True)
    (tmp_path / "new.db").write_bytes(b"")  # what a node opening its ledger has made so far
    with pytest.raises(LedgerError, match="no ledger yet: a node may be creating it"):
        Ledger(tmp_path / "new.db", readonly=True)
    with pytest.raises(LedgerError, match="not a research-swarm ledger"):
        Ledger(tmp_path / "other.db", readonly=True)


def test_migrations_run_once_in_order_from_release_one(tmp_path, monkeypatch, alice):
    monkeypatch.setattr(ledger, "MIGRATIONS", ledger.MIGRATIONS[:1])
    with Ledger(tmp_path / "l.db") as v1:  # a release-1 ledger, holding a result as it stored one
        assert v1.schema_version == 1
        v1.conn.execute(
            "INSERT INTO results (id, profile, outcome, val_bpb) VALUES ('r1', 'cpu', 'keep', 1.5)"
        )
    monkeypatch.undo()
    calls = []

    def step_next(db):
        calls.append("next")
        db["results"].add_column("note", str)

    monkeypatch.setattr(ledger, "MIGRATIONS", [*ledger.MIGRATIONS, step_next])
    with Ledger(tmp_path / "l.db") as v3:
        assert v3.schema_version == len(ledger.MIGRATIONS) and "terms" in v3.db.table_names()
        assert "contradicted" in v3.db["claims"].columns_dict
        assert {"seeds", "parent_scores", "device", "budget", "note"} <= set(
            v3.db["results"].columns_dict
        )
        assert {"seed", "harness", "speed"} <= set(v3.db["runs"].columns_dict)
        assert v3.rows("SELECT id, val_bpb, seeds FROM results") == [
            {"id": "r1", "val_bpb": 1.5, "seeds": None}
        ]
        v3.ingest(make_result(alice, 1, BASELINE, V1, 1.4).raw)  # a new fact in the old ledger
        assert _count(v3, "results") == 2
    Ledger(tmp_path / "l.db").close()
    assert calls == ["next"]


@pytest.mark.parametrize("release", [5, 6, 7])
def test_a_ledger_of_an_older_release_gets_each_claims_ranking_head_when_opened(
    tmp_path, alice, release
):
    """Release 8 keeps the head of each claim's committee ranking (`ranks`; release 6 kept its
    seats, release 7 its reserve and who sat where): a ledger of an older release has its claims
    judged once as it is opened, which fills them, so that no claim judged before is left
    without one, and what the older releases kept goes."""
    people = [Identity(bytes(range(k, k + 32))) for k in range(1, 7)]
    members = sorted({p.peer_id for p in people} | {alice.peer_id})
    r1 = make_result(alice, 1, BASELINE, V1, 1.40)
    with Ledger(tmp_path / "l.db", campaign=CAMPAIGN) as book:  # as that release left it:
        set_terms(book, members=members)
        book.ingest(r1.raw)
        book.conn.execute("DROP TABLE ranks")
        book.conn.execute("ALTER TABLE claims DROP COLUMN awaits_replay")  # release 10's
        book.conn.execute("DROP INDEX claims_misreported")  # release 9's
        book.conn.execute("ALTER TABLE claims DROP COLUMN misreported_by")
        if release == 7:
            book.conn.execute("ALTER TABLE claims ADD COLUMN seats TEXT")
            book.conn.execute("ALTER TABLE claims ADD COLUMN reserve TEXT")
            book.conn.execute("CREATE TABLE seats (member TEXT, claim TEXT, "
                              "PRIMARY KEY (member, claim)) WITHOUT ROWID")  # fmt: skip
        if release == 6:
            book.conn.execute("ALTER TABLE claims ADD COLUMN seats TEXT")
        if release == 5:
            book.conn.execute("DROP INDEX idx_verifications_author_result")
        book.conn.execute("DROP INDEX verifications_replays")  # release 12's
        book.conn.execute(f"PRAGMA user_version = {release}")
    with Ledger(tmp_path / "l.db", campaign=CAMPAIGN) as now:
        claim = {**r1.body, "author": alice.peer_id}
        order = committees.ranking(claim, now.rules("cpu"))
        head = now.rows("SELECT member FROM ranks WHERE claim = ? ORDER BY rank", (r1.id,))
        assert [r["member"] for r in head] == list(order) and len(order) == 6
        assert "seats" not in now.db["claims"].columns_dict and "seats" not in now.db.table_names()


# ---------------------------------------------------------------- leaderboard and lineage


OTHER = "cd" * 32  # another harness


def test_only_looks_by_other_peers_with_the_same_harness_verify(book, alice, bob, carol):
    win = make_result(alice, 1, BASELINE, V1, 1.40)
    book.ingest_many(
        [
            win.raw,
            *(f.raw for f in confirming_looks(alice, 2, win)),  # the author vouching for itself
            *(f.raw for f in confirming_looks(bob, 1, win, harness=OTHER)),  # measured differently
            make_verification(carol, 1, win, "refute", harness=OTHER, delta=0.05).raw,  # so is this
        ]
    )
    assert book.leaderboard() == {}
    book.ingest_many([f.raw for f in confirming_looks(bob, 4, win)])
    board = book.leaderboard()
    assert [e["child"] for e in board["cpu"]] == [V1]
    assert board["cpu"][0]["found_by"] == alice.peer_id
    assert board["cpu"][0]["verified_by"] == [bob.peer_id]
    assert board["cpu"][0]["gain"] == pytest.approx(0.05) and board["cpu"][0]["seeds"] == 3
    assert board["cpu"][0]["score"] == pytest.approx(-0.05)
    assert book.leaderboard(quorum=2) == {}


def test_looks_that_measure_no_gain_revoke_a_claim(book, alice, bob, carol):
    win = make_result(alice, 1, BASELINE, V1, 1.40)
    book.ingest_many([win.raw, *(f.raw for f in confirming_looks(bob, 1, win, delta=-0.03))])
    assert [e["child"] for e in book.leaderboard()["cpu"]] == [V1]
    book.ingest_many(
        [make_verification(carol, i, win, "refute", delta=0.02, seed=i).raw for i in range(1, 9)]
    )
    assert book.leaderboard() == {}  # the pooled gain is no longer verified: the head moves back
    assert book.head("cpu") == BASELINE


@pytest.mark.parametrize("replays_first", [False, True])
def test_a_peer_a_replay_contradicts_counts_on_no_claim_whatever_the_order(
    book, alice, bob, carol, replays_first
):
    """bob signs looks no run stands behind on two claims; carol and dave replay one of his
    seeds and get other scores. His looks then count on neither claim, in whatever order the
    facts arrive, and the ledger's kept judgements are the pure rule's."""
    dave = Identity(bytes(range(3, 35)))
    r1, r2 = make_result(alice, 1, BASELINE, V1, 1.40), make_result(alice, 2, V1, V2, 1.35)
    made_up = [make_verification(bob, 1 + k, r, delta=-0.05, seed=10 * n + k)
               for n, r in ((1, r1), (2, r2)) for k in range(3)]  # fmt: skip
    replays = [
        make_verification(who, 1, r1, "refute", delta=0.01, seed=10) for who in (carol, dave)
    ]
    facts = [r1, r2, *(replays + made_up if replays_first else made_up + replays)]
    for f in facts:
        book.ingest(f.raw)
    _, kept, _ = book.standings("cpu", every=True)
    assert kept[r1.id].contradicted == (bob.peer_id,)
    assert kept[r2.id].state == "open" and kept[r2.id].seeds == 0  # bob's looks: out here too
    assert book.head("cpu") == BASELINE
    results, looks = book.claim_rows("cpu")
    pure = consensus.judge_claims(results, looks, book.rules("cpu"))
    assert {rid: (j.state, j.seeds) for rid, j in pure.items()} == {
        rid: (j.state, j.seeds) for rid, j in kept.items()
    }


@pytest.mark.parametrize("caught_first", [False, True])
@pytest.mark.parametrize("then", ["backed", "cleared"])
def test_a_caught_authors_other_wins_wait_for_a_replay_whatever_the_order(
    book, alice, bob, carol, caught_first, then
):
    """bob's and dave's replays of alice's seed find her r1 misreported; her r2, which carol's
    looks alone would verify, then waits for a replay of its own seed, and the head leaves it,
    in whatever order the facts arrive (bob's replay alone leaves r2 be); a replay of r2's seed
    that gives her signed score brings it back, and so do three replays of r1's seed that give
    hers there (bob and dave are then outvoted, and their word counts on no claim). The ledger's kept judgements are the pure
    rule's."""
    r1 = make_result(alice, 1, BASELINE, V1, 1.40, device="cpu")
    r2 = make_result(alice, 2, BASELINE, V2, 1.35, device="cpu")
    dave = Identity(bytes(range(3, 35)))
    caught = make_verification(bob, 1, r1, "misreported", delta=0.0)
    seen = confirming_looks(carol, 1, r2)
    for f in [r1, r2, *([caught, *seen] if caught_first else [*seen, caught])]:
        book.ingest(f.raw)
    assert book.suspects() == set() and book.head("cpu") == V2  # one replay: maybe a framer's
    book.ingest(make_verification(dave, 1, r1, "misreported", delta=0.0).raw)
    _, kept, _ = book.standings("cpu", every=True)
    assert kept[r1.id].state == "misreported" and kept[r2.id].state == "open"
    assert book.suspects() == {alice.peer_id} and book.head("cpu") == BASELINE
    results, looks = book.claim_rows("cpu")
    pure = consensus.judge_claims(results, looks, book.rules("cpu"))
    assert {rid: j.state for rid, j in pure.items()} == {rid: j.state for rid, j in kept.items()}
    r, signed = (r2, 1.35) if then == "backed" else (r1, 1.40)
    others = [carol, *(Identity(bytes(range(k, k + 32))) for k in (4, 5))]
    for who in [bob] if then == "backed" else others:
        body = wire.verification_body(
            result=r.id, child_val_bpb=signed, parent_val_bpb=1.45, seed=r.body["seed"],
            profile="cpu", harness=HARNESS, verdict="confirm", replay_val_bpb=signed,
            device="cpu",
        )  # fmt: skip
        book.ingest(wire.sign(who, "verification", CAMPAIGN, 20, body, T0 + 600_000).raw)
    _, kept, _ = book.standings("cpu", every=True)
    assert kept[r2.id].state == "verified", kept[r2.id].reason
    assert kept[r1.id].state != "misreported" or then == "backed"
    outvoted = {bob.peer_id, dave.peer_id}  # their replays, against three: no run behind them
    assert book.suspects() == (outvoted if then == "cleared" else {alice.peer_id})
    results, looks = book.claim_rows("cpu")
    pure = consensus.judge_claims(results, looks, book.rules("cpu"))
    assert {rid: j.state for rid, j in pure.items()} == {rid: j.state for rid, j in kept.items()}


def test_a_ledger_of_release_8_has_a_caught_authors_wins_judged_again_when_opened(
    tmp_path, alice, bob, carol
):
    r1, r2 = make_result(alice, 1, BASELINE, V1, 1.40), make_result(alice, 2, BASELINE, V2, 1.35)
    dave = Identity(bytes(range(3, 35)))
    facts = [r1, r2, *(make_verification(p, 1, r1, "misreported", delta=0.0) for p in (bob, dave)),
             *confirming_looks(carol, 1, r2)]  # fmt: skip
    with Ledger(tmp_path / "l.db", campaign=CAMPAIGN) as book:  # as release 8 left it:
        set_terms(book)
        book.ingest_many([f.raw for f in facts])
        book.conn.execute("UPDATE claims SET state = 'verified' WHERE id = ?", (r2.id,))
        book.conn.execute("ALTER TABLE claims DROP COLUMN awaits_replay")
        book.conn.execute("DROP INDEX claims_misreported")
        book.conn.execute("ALTER TABLE claims DROP COLUMN misreported_by")
        book.conn.execute("DROP INDEX verifications_replays")  # release 12's
        book.conn.execute("PRAGMA user_version = 8")
    with Ledger(tmp_path / "l.db", campaign=CAMPAIGN) as now:
        assert now.rows("SELECT state FROM claims WHERE id = ?", (r2.id,)) == [{"state": "open"}]
        assert now.head("cpu") == BASELINE


def test_one_framers_replay_makes_an_honest_win_wait_and_a_release_9_verdict_is_undone(
    tmp_path, alice, bob, carol
):
    """At quorum 1 bob signs that his replay of alice's seed gave another score: her win waits
    for another peer's replay (release 9 found it misreported on bob's word alone, for good, and
    silenced her); dave's replay gives her signed score and the win is the head. A ledger that
    release 9 left with such a verdict has it judged again when opened."""
    from node.standing import ledger_standing, silenced

    r1 = make_result(alice, 1, BASELINE, V1, 1.40, device="cpu")
    framed = [r1, *confirming_looks(carol, 1, r1), make_verification(bob, 1, r1, "misreported")]
    with Ledger(tmp_path / "l.db", campaign=CAMPAIGN) as book:
        set_terms(book)
        book.ingest_many([f.raw for f in framed])
        _, kept, _ = book.standings("cpu", every=True)
        assert kept[r1.id].state == "open" and kept[r1.id].awaits_replay
        assert kept[r1.id].misreported_by == (bob.peer_id,)
        assert book.head("cpu") == BASELINE and book.suspects() == set()
        assert alice.peer_id not in silenced(ledger_standing(book))
        book.conn.execute(  # as release 9 judged it
            "UPDATE claims SET state = 'misreported', misreported_by = ? WHERE id = ?",
            (f'["{bob.peer_id}"]', r1.id),
        )
        book.conn.execute("ALTER TABLE claims DROP COLUMN awaits_replay")
        book.conn.execute("DROP INDEX verifications_replays")  # release 12's
        book.conn.execute("PRAGMA user_version = 9")
    with Ledger(tmp_path / "l.db", campaign=CAMPAIGN) as book:
        assert book.rows("SELECT state FROM claims WHERE id = ?", (r1.id,)) == [{"state": "open"}]
        body = wire.verification_body(
            result=r1.id, child_val_bpb=1.40, parent_val_bpb=1.45, seed=r1.body["seed"],
            profile="cpu", harness=HARNESS, verdict="confirm", replay_val_bpb=1.40, device="cpu",
        )  # fmt: skip
        dave = Identity(bytes(range(3, 35)))
        book.ingest(wire.sign(dave, "verification", CAMPAIGN, 1, body, T0 + 600_000).raw)
        _, kept, _ = book.standings("cpu", every=True)
        assert kept[r1.id].state == "verified", kept[r1.id].reason
        assert book.head("cpu") == V1


@pytest.mark.parametrize("contradiction_first", [False, True])
def test_a_contradicted_members_seat_goes_to_the_next_in_rank_whatever_the_order(
    book, alice, contradiction_first
):
    """In a campaign with members, bob sits on the committee of alice's claim r2 and replays
    contradict his looks at r1: his seat on r2 goes to the next member in rank, whose looks at
    r2 then count, though bob never looked at r2 (a committee left to one honest member, capped
    at PEER_CAP seeds, could never settle a claim); when later replays back bob instead, his
    seat is his again. The ledger's kept judgements are the pure rule's, whichever comes
    first."""
    people = {p.peer_id: p for p in (Identity(bytes(range(k, k + 32))) for k in range(1, 9))}
    ids = frozenset(people) | {alice.peer_id}
    set_terms(book, members=sorted(ids))
    r1, r2 = make_result(alice, 1, BASELINE, V1, 1.40), make_result(alice, 2, V1, V2, 1.35)
    seats = committees.panel({**r2.body, "author": alice.peer_id}, book.rules("cpu"))
    bob = people[min(seats)]
    (heir,) = committees.panel({**r2.body, "author": alice.peer_id}, book.rules("cpu"),
                               {bob.peer_id}) - seats  # fmt: skip
    heir = people[heir]
    replayers = [p for p in people.values() if p.peer_id not in seats and p is not heir][:2]
    made_up = [make_verification(bob, 1 + k, r1, delta=-0.05, seed=10 + k) for k in range(3)]
    replays = [make_verification(p, 1, r1, "refute", delta=0.01, seed=10) for p in replayers]
    heirs = confirming_looks(heir, 1, r2)
    for f in [r1, r2, *(made_up + replays if contradiction_first else heirs)]:
        book.ingest(f.raw)
    if not contradiction_first:
        assert book.standings("cpu", every=True)[1][r2.id].seeds == 0  # not on its committee
    for f in heirs if contradiction_first else made_up + replays:
        book.ingest(f.raw)
    _, kept, _ = book.standings("cpu", every=True)
    assert kept[r1.id].contradicted == (bob.peer_id,)
    assert kept[r2.id].state in ("verified", consensus.HELD) and kept[r2.id].peers == (
        heir.peer_id,
    )
    _same_as_the_pure_rule(book)
    if contradiction_first:
        return
    # More replays of bob's seed agree with him: the two that differ are out now, and bob is
    # back in; his seat on r2 is his again, and the heir's looks there count for nothing.
    backers = [p for p in people.values() if p not in (bob, heir, *replayers)][:3]
    for p in backers:
        book.ingest(make_verification(p, 1, r1, delta=-0.05, seed=10).raw)
    _, kept, _ = book.standings("cpu", every=True)
    assert bob.peer_id not in book.contradicted() and kept[r2.id].seeds == 0
    _same_as_the_pure_rule(book)


def _same_as_the_pure_rule(book) -> None:
    """The ledger's kept judgements are those of `consensus.judge_claims` over its rows, and the
    head of each claim's ranking it keeps finds the pure rule's committee: it is the head of the
    rule's own ranking, and holds a committee's worth of members not contradicted, or all."""
    _, kept, _ = book.standings("cpu", every=True)
    results, looks = book.claim_rows("cpu")
    rules = book.rules("cpu")
    pure = consensus.judge_claims(results, looks, rules)
    assert {rid: (j.state, j.seeds, j.peers) for rid, j in pure.items()} == {
        rid: (j.state, j.seeds, j.peers) for rid, j in kept.items()
    }
    out, size = book.contradicted(), rules.committee_size
    for claim in results:
        head = [r["member"] for r in book.rows(
            "SELECT member FROM ranks WHERE claim = ? ORDER BY rank", (claim["id"],))]  # fmt: skip
        order = committees.ranking(claim, rules)
        if order is None:
            assert head == []
            continue
        assert committees.holds(head, order, out, size)
        assert committees.seated(head, out, size) == pure[claim["id"]].seats


@pytest.mark.parametrize("seed", range(30))
def test_committees_stay_the_pure_rules_as_members_are_contradicted_and_backed(tmp_path, seed):
    """Ten members, claims on several versions, honest looks, and members whose made-up looks
    replays contradict, some of them later backed by more replays (so the replayers are out and
    they are back), all arriving in a random order: after every fact the ledger's judgements,
    committees and seats are the pure rule's (`_same_as_the_pure_rule`)."""
    rng = random.Random(seed)
    people = [Identity(bytes(range(k, k + 32))) for k in range(1, 11)]
    seq = {p.peer_id: 0 for p in people}

    def signed(make, who, *args, **kw):
        seq[who.peer_id] += 1
        return make(who, seq[who.peer_id], *args, **kw)

    claims = [signed(make_result, rng.choice(people), parent, f"{n + 1:064x}", 1.40)
              for n, parent in enumerate([BASELINE, BASELINE, V1, V1, V2, V3])]  # fmt: skip
    facts = list(claims)
    for claim in claims:
        for who in rng.sample(people, 4):
            facts.append(signed(make_verification, who, claim, delta=rng.choice((-0.05, -0.01)),
                                seed=rng.randrange(1000)))  # fmt: skip
    for episode in range(6):
        claim, seed_of = rng.choice(claims), 5000 + episode
        liar, *others = rng.sample([p for p in people if p.peer_id != claim.peer_id], 6)
        facts.append(signed(make_verification, liar, claim, delta=-0.05, seed=seed_of))
        facts += [signed(make_verification, p, claim, "refute", delta=0.01, seed=seed_of)
                  for p in others[:2]]  # fmt: skip
        if rng.random() < 0.7:  # replays that back the liar: the two before are out instead
            facts += [signed(make_verification, p, claim, delta=-0.05, seed=seed_of)
                      for p in others[2:]]  # fmt: skip
    rng.shuffle(facts)
    with Ledger(tmp_path / "l.db", campaign=CAMPAIGN) as book:
        set_terms(book, members=sorted(p.peer_id for p in people))
        for fact in facts:
            book.ingest(fact.raw)
            _same_as_the_pure_rule(book)
        set_terms(book)  # an open campaign now: no committees, nobody seated
        _same_as_the_pure_rule(book)
        assert _count(book, "ranks") == 0


def test_a_quorum_counts_distinct_peers(book, alice, bob, carol):
    win = make_result(alice, 1, BASELINE, V1, 1.40)
    book.ingest_many([win.raw, *(f.raw for f in confirming_looks(bob, 1, win, looks=4))])
    assert book.leaderboard(quorum=2) == {}  # four looks, one peer
    book.ingest_many([f.raw for f in confirming_looks(carol, 1, win)])
    assert book.leaderboard(quorum=2)["cpu"][0]["verified_by"] == sorted(
        [bob.peer_id, carol.peer_id]
    )


def test_the_campaign_terms_set_the_quorum_and_baseline_and_no_stranger_can(tmp_path, alice, bob):
    book = Ledger(tmp_path / "fresh.db", campaign=CAMPAIGN)
    assert book.terms() is None and book.quorum() == 1
    book.set_terms({"name": CAMPAIGN, "organiser": alice.peer_id, "baseline": BASELINE, "quorum": 2,
                    "members": None, "fact": None})  # fmt: skip
    assert book.quorum() == 2 and book.baseline() == BASELINE and book.rules("cpu").quorum == 2
    forged = wire.sign(bob, "campaign", CAMPAIGN, 1, wire.campaign_body(
        name=CAMPAIGN, organiser=bob.public_key, program=b"p", baseline=V1, profiles=["cpu"],
        quorum=64), T0 - 10**9)  # fmt: skip
    assert book.ingest(forged.raw).reason is Reason.impostor
    assert book.quorum() == 2 and book.baseline() == BASELINE
    own = wire.sign(alice, "campaign", CAMPAIGN, 1, wire.campaign_body(
        name=CAMPAIGN, organiser=alice.public_key, program=b"p", baseline=BASELINE,
        profiles=["cpu"], quorum=2), T0)  # fmt: skip
    assert book.ingest(own.raw) == own
    book.close()


def test_the_leaderboard_ranks_by_verified_gain_then_hash_and_ignores_arrival_order(
    tmp_path, alice, bob
):
    wins = [  # claimed val_bpb ranks nothing: the verifiers' gains do
        (make_result(alice, 1, BASELINE, V3, 1.00), -0.05),
        (make_result(alice, 2, BASELINE, V2, 1.40), -0.05),
        (make_result(alice, 3, BASELINE, V1, 1.45), -0.08),
        (make_result(alice, 4, BASELINE, "44" * 32, 1.10, outcome="discard"), -0.2),
        (make_result(alice, 5, BASELINE, "55" * 32, 1.00, profile="gpu"), -0.05),
    ]
    facts = [w.raw for w, _ in wins] + [
        f.raw for i, (w, d) in enumerate(wins) for f in confirming_looks(bob, 1 + 3 * i, w, delta=d)
    ]
    boards = []
    for order in range(3):
        random.Random(order).shuffle(facts)
        with Ledger(tmp_path / f"{order}.db", campaign=CAMPAIGN) as book:
            set_terms(book)
            book.ingest_many(facts)
            boards.append(book.leaderboard())
    assert boards[0] == boards[1] == boards[2]
    assert [e["child"] for e in boards[0]["cpu"]] == [V1, V2, V3]
    assert [e["child"] for e in boards[0]["gpu"]] == ["55" * 32]


def test_the_leaderboard_lists_only_versions_reached_from_the_baseline(book, alice, bob):
    """A verified child of an unverified parent is on no board: one rule for every "best"."""
    first = make_result(alice, 1, BASELINE, V1, 1.4)
    second = make_result(alice, 2, V1, V2, 1.3)
    book.ingest_many([first.raw, second.raw, *(f.raw for f in confirming_looks(bob, 1, second))])
    assert book.leaderboard() == {} and book.head("cpu") == BASELINE
    book.ingest_many([f.raw for f in confirming_looks(bob, 4, first)])
    assert [e["child"] for e in book.leaderboard()["cpu"]] == [V2, V1]
    assert book.head("cpu") == V2 == book.leaderboard()["cpu"][0]["child"]


def test_lineage_walks_back_to_the_baseline_with_deltas(book, alice, bob):
    steps = [
        make_result(alice, 1, BASELINE, V1, 1.50, description="wider MLP"),
        make_result(alice, 2, V1, V2, 1.45, description="lower lr"),
        make_result(bob, 1, V2, V3, 1.41, description="rotary base 20k"),
        make_result(bob, 2, V2, "44" * 32, 1.60, outcome="discard"),
    ]
    book.ingest_many(
        [s.raw for s in steps] + [make_verification(bob, 3, steps[1], delta=-0.04).raw]
    )
    chain = book.lineage(V3[:8])
    assert [s["child"] for s in chain] == [V1, V2, V3]
    assert [s["description"] for s in chain] == ["wider MLP", "lower lr", "rotary base 20k"]
    assert chain[0]["delta"] is None
    assert chain[1]["delta"] == pytest.approx(-0.05) and chain[2]["delta"] == pytest.approx(-0.04)
    assert chain[1]["verified_delta"] == pytest.approx(-0.04) and chain[1]["confirmations"] == 1
    assert all(s["diff_size"] > 0 for s in chain)
    with pytest.raises(LedgerError, match="matches"):
        book.lineage("ff" * 32)


def test_lineage_survives_parent_links_that_loop(book, alice):
    book.ingest_many(
        [make_result(alice, 1, V2, V1, 1.5).raw, make_result(alice, 2, V1, V2, 1.4).raw]
    )
    assert [s["child"] for s in book.lineage(V2)] == [V1, V2]


def test_show_rechecks_the_signature_of_a_stored_fact(book, alice):
    fact = make_result(alice, 1, BASELINE, V1, 1.5)
    book.ingest(fact.raw)
    assert book.fact(fact.id[:10])["status"] == "valid"
    tampered = fact.raw.replace(b"an experiment", b"AN EXPERIMENT")
    book.conn.execute("UPDATE facts SET raw = ? WHERE id = ?", (tampered, fact.id))
    assert book.fact(fact.id)["status"].startswith("bad_signature")
    with pytest.raises(LedgerError, match="not a sha256"):
        book.fact("xyz")


def test_the_head_summarises_what_the_ledger_holds(book, alice, bob):
    win = make_result(alice, 1, BASELINE, V1, 1.4)
    book.ingest_many([win.raw, *(f.raw for f in confirming_looks(bob, 1, win))])
    head = book.head_body()
    assert head["count"] == 4
    assert book.head_authors() == {alice.public_key: 1, bob.public_key: 3}
    assert head["bins"] == wire.head_bins({alice.public_key: (1, 1), bob.public_key: (3, 3)})
    assert head["best"] == {"cpu": V1}
    signed = wire.sign(alice, "head", CAMPAIGN, T0, head, T0)  # a head counts by the clock
    assert book.ingest(signed.raw, now_ms=T0) == signed
    assert book.ingest(signed.raw, now_ms=T0) == signed  # delivered twice: not a rejection
    older = wire.sign(alice, "head", CAMPAIGN, T0 - 1, wire.head_body([], {}, {}), T0)
    assert book.ingest(older.raw, now_ms=T0).reason is Reason.seq_backwards
    assert _count(book, "facts") == 4  # heads update the peer, they are not facts to keep
    assert book.rows("SELECT head_seq FROM peers WHERE head IS NOT NULL") == [{"head_seq": T0}]
    assert book.next_seq(alice.public_key) == 2


def test_two_ledgers_converge_by_exchanging_heads_even_with_gaps(tmp_path, alice, bob):
    chain = [make_result(alice, seq, BASELINE, f"{seq:064x}", 1.5) for seq in range(1, 7)]
    with (
        Ledger(tmp_path / "a.db", campaign=CAMPAIGN) as a,
        Ledger(tmp_path / "b.db", campaign=CAMPAIGN) as b,
    ):
        a.ingest_many([f.raw for f in chain[:4]])
        b.ingest_many(
            [chain[i].raw for i in (0, 1, 3, 5)] + [make_verification(bob, 1, chain[0]).raw]
        )
        assert b.head_authors()[alice.public_key] == 2  # holds 1, 2, 4, 6: complete to 2
        for sender, receiver in ((a, b), (b, a)):
            # as sync does it: the bins whose digests differ, then the entries of those bins
            bins = wire.differing_bins(wire.head_bins(sender.holdings()),
                                       receiver.head_body()["bins"])  # fmt: skip
            assert bins and set(bins) <= {
                wire.bin_of(alice.public_key),
                wire.bin_of(bob.public_key),
            }
            entries = {k: n for k, n in receiver.head_authors().items() if wire.bin_of(k) in bins}
            missing = list(sender.facts_missing_from(entries, bins=bins))
            assert all(isinstance(o, wire.Fact) for o in receiver.ingest_many(missing))
        assert a.head_body() == b.head_body()
        assert a.head_body()["count"] == 5 + 1 and a.head_authors()[alice.public_key] == 4
        assert list(a.facts_missing_from(b.head_authors())) == [chain[5].raw]  # above the gap at 5
        assert wire.differing_bins(a.head_body()["bins"], b.head_body()["bins"]) == []
        assert list(a.facts_missing_from({}, bins=[])) == []  # no bin differs: nothing to send


# ---------------------------------------------------------------- kill -9

WRITER = """
import random, sys
sys.path.insert(0, sys.argv[3])
from conftest import make_result, make_verification
from node.identity import Identity
from node.ledger import Ledger
book = Ledger(sys.argv[1], campaign="demo")
rng = random.Random(int(sys.argv[2]))
me, other = Identity(rng.randbytes(32)), Identity(rng.randbytes(32))
seq = 1
while True:
    batch = []
    for _ in range(rng.choice([1, 1, 5, 50])):
        r = make_result(me, seq, "00" * 32, rng.randbytes(32).hex(), rng.random())
        batch += [r.raw, make_verification(other, seq, r).raw]
        seq += 1
    for out in book.ingest_many(batch):
        print(out.id, flush=True)
"""


def test_kill_9_during_heavy_writes_loses_no_acknowledged_fact(tmp_path):
    path = tmp_path / "ledger.db"
    acknowledged: set[str] = set()
    for round_ in range(3):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(round_), str(Path(__file__).parent)],
            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent,
        )  # fmt: skip
        target, seen = random.Random(round_).randrange(500, 3000), 0
        for line in writer.stdout:  # kill it mid-stream, while it is still writing
            acknowledged.add(line.strip())
            seen += 1
            if seen >= target:
                break
        assert seen == target
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        assert writer.returncode == -signal.SIGKILL
        with Ledger(path, readonly=True) as reader:  # what `swarm ledger` sees right after
            assert acknowledged <= {r[0] for r in reader.conn.execute("SELECT id FROM facts")}
        with Ledger(path, campaign=CAMPAIGN) as book:
            assert book.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            stored = {r[0] for r in book.conn.execute("SELECT id FROM facts")}
            assert acknowledged <= stored
            assert _count(book, "results") + _count(book, "verifications") == len(stored)


def test_an_identity_seed_never_reaches_the_ledger(book, alice):
    book.ingest(make_result(alice, 1, BASELINE, V1, 1.5).raw)
    assert alice.seed not in Path(book.path).read_bytes()
    assert isinstance(Identity(alice.seed), Identity)


def test_an_empty_ledger_summarises_to_zeroes(book):
    info = book.summary()
    assert info["facts"] == {} and info["peers"] == 0 and info["last_received"] is None
    assert book.leaderboard() == {} and book.peers() == [] and book.experiments() == []


def test_the_leaderboard_passes_over_many_better_unverified_claims(book, alice, bob):
    claims = [make_result(alice, i, BASELINE, f"{i:064x}", 1.0 + i / 1000) for i in range(1, 40)]
    verified = make_result(alice, 40, BASELINE, V3, 1.3)
    looks = confirming_looks(bob, 1, verified)  # the profile's first win: the hold's looks
    book.ingest_many([c.raw for c in claims] + [verified.raw] + [f.raw for f in looks])
    assert [e["child"] for e in book.leaderboard(limit=1)["cpu"]] == [V3]


def test_a_node_publishes_its_own_facts_with_consecutive_seqs(book, alice, bob):
    first = book.publish(alice, "result", make_result(alice, 1, BASELINE, V1, 1.4).body, T0)
    second = book.publish(alice, "result", make_result(alice, 2, V1, V2, 1.3).body, T0 + 1)
    assert (first.seq, second.seq) == (1, 2)
    assert book.ingest(second.raw) == second  # gossip brings it back: already held
    head = book.publish(alice, "head", book.head_body(), T0 + 2)
    assert head.seq == T0 + 2 and book.next_seq(alice.public_key) == 3
    with Ledger(book.path) as any_campaign, pytest.raises(LedgerError, match="campaign"):
        any_campaign.publish(bob, "result", first.body)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4), st.sampled_from(["confirm", "refute", "void"]),
                       st.sampled_from(["h", "h2"]), st.integers(0, 2)), max_size=40),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
)  # fmt: skip
def test_verified_children_does_not_depend_on_the_order_of_facts(votes, quorum, order):
    results = [
        {"id": f"r{i}", "author": f"p{i % 3}", "profile": "cpu", "harness": "h", "parent": BASELINE,
         "child": f"{i:064x}", "outcome": "keep"} for i in range(6)
    ]  # fmt: skip
    verifications = [
        vote_row(f"r{r}", f"p{a}", v, harness=h, delta=-0.02 * (1 + r), seed=seed)
        for r, a, v, h, seed in votes
    ]
    rules = consensus.Rules(quorum, sigma=0.005)
    expected = consensus.verified_children(results, verifications, rules)
    order.shuffle(results)
    order.shuffle(verifications)
    assert consensus.verified_children(results, verifications, rules) == expected
    for rid, peers in expected.items():
        author = next(r["author"] for r in results if r["id"] == rid)
        assert len(peers) >= quorum and author not in peers
