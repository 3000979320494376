"""Peers' discards, checked (node/agent/discards.py): a replay of a discard's seed that denies its
signed score takes its author out of every proposer's evidence; a backing replay undoes a lone
denial; one peer drawn by hash replays each author's discards on a head."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from conftest import CAMPAIGN, T0
from test_loop import fixed_run

from node import wire
from node.agent import discards
from node.agent.errors import AgentError
from node.agent.offline import OfflineProposer, share_of
from node.agent.patch import change_hash, make_diff, normalise_diff
from node.agent.proposers import context_from_ledger
from node.agent.researcher import Researcher
from node.agent.verifier import replay_discard
from node.ledger import Ledger
from node.trainer import BASELINE_TRAIN_PY, get_profile, harness_sha256

BASELINE = BASELINE_TRAIN_PY.read_text()
PARENT = hashlib.sha256(BASELINE.encode()).hexdigest()
DEVICE = "cpu AVX2"  # what `fixed_run` reports
TEST = get_profile("test")
HOUR = 3_600_000
H = "ab" * 32  # the harness `fixed_run` reports


def child(n: int) -> str:
    return BASELINE.replace("MLP_RATIO = 4 ", f"MLP_RATIO = {n} ")


@pytest.fixture
def now():
    return [T0 + 10_000]


@pytest.fixture
def book(tmp_path, now):
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN, clock=lambda: now[0]) as ledger:
        ledger.add_version(BASELINE.encode())
        yield ledger


def discard(book, who, seq, n, signed, *, seed=9, given_out=True, on=BASELINE,
            change=None, harness=H) -> wire.Fact:  # fmt: skip
    """`who`'s discard of MLP_RATIO -> n on `on` (the baseline), or of `change` (its description
    and child): the child `signed` on `seed`, the parent 3.0 there; its train.py given out (the
    ledger holds it) unless not `given_out`."""
    description, text = change or (f"MLP_RATIO 4 -> {n}",
                                   on.replace("MLP_RATIO = 4 ", f"MLP_RATIO = {n} "))  # fmt: skip
    body = wire.result_body(
        parent=hashlib.sha256(on.encode()).hexdigest(),
        child=hashlib.sha256(text.encode()).hexdigest(),
        diff=normalise_diff(make_diff(on, text)).encode(),
        description=description, profile="test", harness=harness, seed=seed,
        outcome="discard", metrics={"val_bpb": signed, "steps": 1, "tokens": 64},
        pairs=[(seed, signed, 3.0)], device=DEVICE,
    )  # fmt: skip
    if given_out:
        book.add_version(text.encode())
    fact = wire.sign(who, "result", CAMPAIGN, seq, body, T0 + seq)
    assert book.ingest(fact.raw) == fact
    return fact


def replay(book, who, seq, of: wire.Fact, score, device=DEVICE) -> None:
    verdict = "confirm" if abs(score - of.body["child_scores"][0]) <= 1e-4 else "misreported"
    body = wire.verification_body(
        result=of.id, child_val_bpb=None, parent_val_bpb=None, seed=of.body["seeds"][0],
        profile="test", harness=H, verdict=verdict, replay_val_bpb=score, device=device,
    )  # fmt: skip
    fact = wire.sign(who, "verification", CAMPAIGN, seq, body, T0 + 1000 + seq)
    assert book.ingest(fact.raw) == fact


def seen(book, me) -> tuple[set[str], set[str]]:
    """(the authors of the results a proposer of `me` sees on the baseline, its active peers)."""
    context = context_from_ledger(book, BASELINE, "test", me=me.peer_id)
    return {a.by for a in context.history}, set(context.active)


def test_a_discard_a_replay_denies_takes_its_author_out_of_every_proposers_evidence(
    book, alice, bob, carol, dave, mallory
):
    honest = discard(book, bob, 1, 3, 3.01)
    made_up = discard(book, mallory, 1, 5, 3.02)
    discard(book, mallory, 2, 6, 3.02)
    assert seen(book, alice) == ({bob.peer_id, mallory.peer_id},
                                 {alice.peer_id, bob.peer_id, mallory.peer_id})  # fmt: skip
    replay(book, carol, 1, honest, 3.01)  # backs bob's
    replay(book, carol, 2, made_up, 2.95)  # the child's real score on mallory's seed
    assert discards.denied(book) == {mallory.peer_id}
    assert seen(book, alice) == ({bob.peer_id}, {alice.peer_id, bob.peer_id})
    tried = context_from_ledger(book, BASELINE, "test", me=alice.peer_id).tried
    assert honest.body["diff_sha256"] in tried and made_up.body["diff_sha256"] not in tried
    # A replay on another device class proves nothing either way.
    replay(book, dave, 1, honest, 2.90, device="NVIDIA H100")
    assert discards.denied(book) == {mallory.peer_id}
    # One denial against one backing: a lone framer's word takes nobody out.
    replay(book, dave, 2, made_up, 3.02)
    assert discards.denied(book) == set()
    assert mallory.peer_id in seen(book, alice)[0]


def test_a_discard_whose_train_py_nobody_gave_out_is_no_evidence(book, alice, bob):
    """Nobody can replay it; the gossip layer fetches every result's child, so an honest one's
    is held within seconds."""
    hidden = discard(book, bob, 1, 3, 3.01, given_out=False)
    assert seen(book, alice)[0] == set()
    book.add_version(child(3).encode())  # fetched
    assert seen(book, alice)[0] == {bob.peer_id}
    assert hidden.body["diff_sha256"] in context_from_ledger(book, BASELINE, "test").tried


def test_one_peer_drawn_by_hash_replays_each_authors_discards_on_a_head(
    book, alice, bob, carol, dave, mallory, now
):
    pool = {p.peer_id for p in (alice, bob, carol, dave, mallory)}
    discard(book, bob, 1, 3, 3.01)
    discard(book, bob, 2, 6, 3.03)
    discard(book, mallory, 1, 5, 3.02)

    def picks() -> dict[str, str]:
        out = {}
        for me in sorted(pool):
            pick = discards.to_replay(book, me, "test", H, PARENT, DEVICE, pool, HOUR)
            if pick is not None:
                assert pick["author"] != me and me not in out
                out[me] = pick["author"]
        return out

    first = picks()
    assert sorted(first.values()) == sorted([bob.peer_id, mallory.peer_id])  # one each
    assert discards.to_replay(book, carol.peer_id, "test", H, PARENT, "NVIDIA H100", pool,
                              HOUR) is None  # fmt: skip  # another class replays nothing
    # bob's, backed by its drawn replayer, is done; mallory's, denied by one, waits an hour for
    # a second replay (the next in rank), so that one replay alone does not settle it.
    replayers = {who.peer_id: who for who in (alice, bob, carol, dave, mallory)}
    for me, author in first.items():
        pick = discards.to_replay(book, me, "test", H, PARENT, DEVICE, pool, HOUR)
        honest = author == bob.peer_id
        body = wire.verification_body(
            result=pick["id"], child_val_bpb=None, parent_val_bpb=None, seed=9, profile="test",
            harness=H, verdict="confirm" if honest else "misreported",
            replay_val_bpb=pick["val_bpb"] if honest else 2.90, device=DEVICE,
        )  # fmt: skip
        book.publish(replayers[me], "verification", body)
    assert discards.denied(book) == {mallory.peer_id}
    assert picks() == {}
    now[0] += HOUR
    again = picks()
    assert list(again.values()) == [mallory.peer_id] and set(again) & set(first) == set()
    # On the next head, a peer whose discards replays backed is replayed only where the node
    # drawn for it chooses to audit (a coin only it can toss); one never backed, always.
    head = BASELINE.replace("ROPE_BASE = 10000.0", "ROPE_BASE = 20000.0")
    book.add_version(head.encode())
    discard(book, bob, 10, 3, 3.01, on=head)
    discard(book, dave, 10, 3, 3.01, on=head)
    parent = hashlib.sha256(head.encode()).hexdigest()
    for audit, authors in ((lambda a: False, {dave.peer_id}),
                           (lambda a: True, {bob.peer_id, dave.peer_id})):  # fmt: skip
        found = {pick["author"] for me in pool if (pick := discards.to_replay(
            book, me, "test", H, parent, DEVICE, pool, HOUR, audit))}  # fmt: skip
        assert found == authors


def test_a_discard_that_hides_a_change_of_a_nodes_share_is_replayed_by_that_node(
    book, alice, bob, carol, mallory
):
    """A node's proposer passes over a change of its own share that a peer discarded (a peer's
    word): it remembers which (`OfflineProposer.hidden`), and the node replays that discard,
    drawn for it or not. Not a peer's discard of that peer's own share, nor a denied peer's."""
    peers = {p.peer_id: p for p in (alice, bob, carol, mallory)}
    context = context_from_ledger(book, BASELINE, "test", me=alice.peer_id)
    context = dataclasses.replace(context, active=frozenset(peers))
    ordered = [(d, c) for d, c in OfflineProposer(0)._ordered(context) if "; " not in d]

    def owner(change: tuple[str, str]) -> str:
        return share_of(change_hash(BASELINE, change[1]), frozenset(peers))

    mine = [c for c in ordered if owner(c) == alice.peer_id]
    bobs = next(c for c in ordered if owner(c) == bob.peer_id)
    made_up = {(f := discard(book, mallory, i, 0, 3.02, change=c)).body["diff_sha256"]: f
               for i, c in enumerate(mine, 1)}  # fmt: skip
    honest = discard(book, bob, 1, 0, 3.01, change=bobs)

    def propose() -> tuple[OfflineProposer, str]:
        proposer = OfflineProposer(0)
        context = context_from_ledger(book, BASELINE, "test", me=alice.peer_id)
        context = dataclasses.replace(context, active=frozenset(peers))
        return proposer, proposer.propose(context).description

    proposer, proposed = propose()  # its share all discarded: another's
    assert proposed not in dict(mine) and proposer.hidden[0] == PARENT
    assert set(proposer.hidden[1]) == set(made_up)  # not bob's discard of bob's own share
    anyone = OfflineProposer(0)  # a proposer that knows no share of its own passes over none
    anyone.propose(context_from_ledger(book, BASELINE, "test"))
    assert anyone.hidden == (PARENT, ())
    first = made_up[proposer.hidden[1][0]]
    for me in peers:  # whoever a discard hides a change from replays it, drawn or not
        pick = discards.to_replay(book, me, "test", H, PARENT, DEVICE, set(peers), HOUR,
                                  hiding=proposer.hidden[1])  # fmt: skip
        assert (pick or {}).get("id") == (None if me == mallory.peer_id else first.id)
    replay(book, carol, 1, first, 2.95)  # denied: mallory's discards are no evidence
    proposer, proposed = propose()
    assert proposed in dict(mine) and proposer.hidden == (PARENT, ())
    assert discards.to_replay(book, alice.peer_id, "test", H, PARENT, DEVICE, set(peers), HOUR,
                              hiding=tuple(made_up)) is None  # fmt: skip
    # A peer whose discard on this parent a replay backed is not replayed there again.
    hid = (honest.body["diff_sha256"],)
    assert discards.to_replay(book, alice.peer_id, "test", H, PARENT, DEVICE, set(peers), HOUR,
                              hiding=hid)["id"] == honest.id  # fmt: skip
    replay(book, carol, 2, honest, 3.01)
    assert discards.to_replay(book, alice.peer_id, "test", H, PARENT, DEVICE, set(peers), HOUR,
                              hiding=hid) is None  # fmt: skip


def test_a_node_whose_share_a_peer_discarded_replays_it_at_its_next_step(
    book, alice, mallory, tmp_path
):
    """The loop: a key signs a discard of every single change on the head, none run. The node's
    first step researches what is left (a pair); its next replays the discard that hid the first
    change of its share, though it is not drawn for anything (no verification slot comes in
    this test), and finds it misreported; its step after researches that change."""
    harness = harness_sha256(TEST)
    singles = [c for c in OfflineProposer(0).candidates(BASELINE, "test") if "; " not in c[0]]
    for i, change in enumerate(singles, 1):
        discard(book, mallory, i, 0, 3.02, change=change, harness=harness)

    def run(script, profile, data, run_dir, seed=0, on_event=None):  # 3.0 whatever it runs
        ran = fixed_run(lambda s: 3.0)(script, profile, data, run_dir, seed)
        return dataclasses.replace(ran, harness_sha256=harness)

    published: list[wire.Fact] = []
    worker = Researcher(book, alice, OfflineProposer(0), TEST, None, tmp_path / "runs", BASELINE,
                        verify_every=1000, check=None, publish=published.append, run=run)  # fmt: skip
    first = worker.step()
    assert "; " in first.description  # every single change of the head was discarded
    parent, hidden = worker.proposer.inner.hidden
    assert parent == PARENT and len(hidden) > 1
    replayed = worker.step()
    assert replayed.verdict == "misreported" and published[-1].kind == "verification"
    denied = book.rows("SELECT * FROM results WHERE id = ?", (published[-1].body["result"],))
    assert denied[0]["author"] == mallory.peer_id and denied[0]["diff_sha256"] == hidden[0]
    assert discards.denied(book) == {mallory.peer_id}
    after = worker.step()
    assert after.description in {d for d, _ in singles} and worker.proposer.inner.hidden[1] == ()


def test_a_replay_of_a_discard_publishes_what_the_authors_seed_gave(book, alice, bob, mallory,
                                                                     tmp_path):  # fmt: skip
    honest = discard(book, bob, 1, 3, 3.01)
    made_up = discard(book, mallory, 1, 5, 3.02)
    row = {r["id"]: r for r in book.rows("SELECT * FROM results")}
    backed = replay_discard(book, alice, row[honest.id], TEST, None, tmp_path,
                            check=None, run=fixed_run({9: 3.01}.get))  # fmt: skip
    denied = replay_discard(book, alice, row[made_up.id], TEST, None, tmp_path,
                            check=None, run=fixed_run({9: 2.95}.get))  # fmt: skip
    assert (backed.verdict, denied.verdict) == ("confirm", "misreported")
    assert denied.fact.body["replay_val_bpb"] == 2.95 and denied.fact.body["seed"] == 9
    assert discards.denied(book) == {mallory.peer_id}


def test_a_discard_of_a_child_no_honest_node_runs_is_misreported_and_a_crash_proves_nothing(
    book, alice, bob, carol, tmp_path
):  # fmt: skip
    refused = discard(book, bob, 1, 3, 3.01)
    crashed = discard(book, carol, 1, 5, 3.02)
    row = {r["id"]: r for r in book.rows("SELECT * FROM results")}

    def refuse(source):  # the node's checks refuse the child: under that harness nobody ran it
        raise AgentError("refused")

    def crash(script, profile, data, run_dir, seed=0, on_event=None):
        return dataclasses.replace(fixed_run(lambda s: None)(script, profile, data, run_dir, seed),
                                   outcome="crash")  # fmt: skip

    out = replay_discard(book, alice, row[refused.id], TEST, None, tmp_path, check=refuse,
                         run=fixed_run({9: 2.95}.get))  # fmt: skip
    assert out.verdict == "misreported" and out.child_run is None
    assert discards.denied(book) == {bob.peer_id}
    who = {p.peer_id: p for p in (alice, bob, carol)}

    def picks() -> dict[str, str]:  # the peer drawn for each author's discards: its pick
        found = {me: discards.to_replay(book, me, "test", H, PARENT, DEVICE, set(who), HOUR)
                 for me in who}  # fmt: skip
        return {pick["author"]: me for me, pick in found.items() if pick}

    replayer = picks()[carol.peer_id]
    assert replay_discard(book, who[replayer], row[crashed.id], TEST, None, tmp_path / "x",
                          check=None, run=crash) is None  # fmt: skip
    # nothing published, and the replay that crashed there is not picked again
    assert carol.peer_id not in picks() and not book.rows(
        "SELECT 1 FROM verifications WHERE result = ?", (crashed.id,)
    )


def test_a_local_swarm_says_what_a_replay_of_a_discard_gave(tmp_path, alice, bob, mallory):
    from types import SimpleNamespace

    from node.ledger import ledger_path
    from node.local import Events

    (tmp_path / "node1").mkdir()
    with Ledger(ledger_path(tmp_path / "node1"), campaign=CAMPAIGN) as book:
        book.add_version(BASELINE.encode())
        honest, made_up = discard(book, bob, 1, 3, 3.01), discard(book, mallory, 1, 5, 3.02)
        replay(book, alice, 1, honest, 3.01)
        replay(book, alice, 2, made_up, 2.95)
    swarm = SimpleNamespace(root=tmp_path, names={bob.peer_id: "node2", mallory.peer_id: "node3"})
    lines = Events(swarm).poll([{"node": "node1", "peer_id": alice.peer_id}])
    assert lines == [
        "node1 replayed node2's 'MLP_RATIO 4 -> 3' discard: the signed score",
        "node1 replayed node3's 'MLP_RATIO 4 -> 5' discard: not the signed score",
    ]


def test_the_ledgers_peers_count_the_replays_of_their_discards_apart_from_their_claims(
    book, bob, carol, dave, mallory
):
    honest = discard(book, bob, 1, 3, 3.01)
    made_up = discard(book, mallory, 1, 5, 3.02)
    replay(book, carol, 1, honest, 3.01)
    replay(book, carol, 2, made_up, 2.95)
    replay(book, dave, 1, made_up, 2.95)
    peers = {p["peer_id"]: p for p in book.peers()}
    counts = ("confirmations", "refutations", "voids", "discards_backed", "discards_denied")
    assert [peers[bob.peer_id][k] for k in counts] == [0, 0, 0, 1, 0]
    assert [peers[mallory.peer_id][k] for k in counts] == [0, 0, 0, 0, 2]
