"""Byzantine peers in a real swarm: `swarm peer` processes on 127.0.0.1, hostile identities that
publish through the real wire protocol, and honest verifiers that re-run claims for real.

The honest side: a bootstrap that is also an honest author (its win really is better: the
campaign's baseline is a deliberately weakened train.py), and two verifier nodes whose verdicts
come from the node's own verifier code and the real trainer in its sandbox, driven from this
process and written into their homes' ledgers (a node gossips what its ledger holds under its
key). The campaign's quorum is 2. The hostile side: a faker that first signs the honest win as
its own with a lower child score than it measured (a liar), then kept claims that are worse than
their parent or crash or break the policy; a colluder (one confirmer, below the quorum) that
confirms them with made-up gains; a framer that signs large losses for the honest win and a
false replay of its author's seed; and a raw peer that forges a campaign fact and honest claims,
equivocates, signs facts from the future, replays honest facts and floods. A second test puts a real `swarm join` node (a campaign file,
quorum 1) in the verifier's seat. `python tests/test_byzantine.py publish FILE ADDR...` is the raw peer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import msgpack
import pytest
from conftest import wait_until, worker_builds_on
from test_gossip import Node

from node import wire
from node.identity import Identity, load_identity
from node.ledger import Ledger
from node.trainer import BASELINE_TRAIN_PY, get_profile, harness_sha256

pytestmark = pytest.mark.slow  # real swarms whose verifiers train: minutes
ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = "byzantine-test"
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
QUORUM = 2
MARGIN = 0.02  # the verifiers' noise margin, bpb (a node measures its own; fixed here)
# The test profile with a shorter budget: the same harness and data, fewer seconds per run, and
# generous limits on start-up and evaluation (a run killed on loaded cores would be a crash).
FAST = dataclasses.replace(get_profile("test"), budget_tokens=3 * 2**14, startup_seconds=180,
                           max_train_seconds=60, eval_seconds=180)  # fmt: skip

BASELINE = BASELINE_TRAIN_PY.read_text()
# The campaign's baseline: learning rates a hundred times too small, so that restoring them is a
# large, reliable win on two loaded cores (gains of real proposals are as small as the noise).
WEAK = (BASELINE.replace("else 0.02  # Muon", "else 0.0002  # Muon")
        .replace("else 0.3  # AdamW", "else 0.003  # AdamW").replace("HEAD_LR = 0.004 ", "HEAD_LR = 0.00004 "))  # fmt: skip
LOOP = "for micro, (x, y) in enumerate(S.batches(DEVICE_BATCH)):"
FAKES = {  # a large claimed gain for each; what the version really does
    "worse": WEAK.replace(LOOP, LOOP + "\n    continue"),  # never trains
    "crash": WEAK.replace("S = session()\n", "S = session()\nSCALE = 1 / 0\n"),
    "policy": WEAK.replace(
        "S = session()\n", "S = session()\nSECRET = open('/etc/hostname').read()\n"
    ),
    "worse again": WEAK.replace("else 0.0002  # Muon", "else 0.0  # Muon"),
    "worse still": WEAK.replace("else 0.003  # AdamW", "else 0.0  # AdamW"),
}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def rows(home: Path, sql: str, params: tuple = ()) -> list[tuple]:
    try:
        with sqlite3.connect(f"file:{home / 'ledger.db'}?mode=ro", uri=True, timeout=10) as conn:
            return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError:
        return []


def best_head(home: Path) -> str:
    """The consensus best head of the test profile, from the facts in HOME's ledger."""
    with Ledger(home / "ledger.db", readonly=True) as book:
        return book.head("test", QUORUM, baseline=sha(WEAK))


class Watch:
    """Every honest node's best head, sampled whenever the test waits: never a fake version."""

    def __init__(self, homes: list[Path]) -> None:
        self.homes, self.samples, self.heads = homes, 0, set()

    def check(self) -> None:
        for home in self.homes:
            head = best_head(home)
            self.samples += 1
            self.heads.add(head)
            assert head in (sha(WEAK), sha(BASELINE)), f"{home.name} adopted {head[:12]}"


def publish(home: Path, who: Identity, kind: str, body: dict, *versions: str) -> str:
    """Sign a fact as HOME's node and put it in HOME's ledger, with the versions it names."""
    with Ledger(home / "ledger.db", campaign=CAMPAIGN) as book:
        for source in versions:
            book.add_version(source.encode())
        return book.publish(who, kind, body).id


def result_body(
    child: str, val_bpb: float, description: str, outcome: str = "keep",
    pairs: tuple | None = None, device: str = "",
) -> dict:  # fmt: skip
    """A claim on the weakened baseline; by default paired on seed 1 with a parent 0.05 worse."""
    pairs = ((1, val_bpb, val_bpb + 0.05),) if pairs is None else pairs
    return wire.result_body(
        parent=sha(WEAK), child=sha(child), diff=f"{description}\n".encode(),
        description=description, profile="test", harness=harness_sha256(FAST), seed=pairs[0][0],
        outcome=outcome, metrics={"val_bpb": val_bpb, "steps": 100, "tokens": 100_000},
        pairs=pairs if outcome == "keep" else (), device=device,
    )  # fmt: skip


def holds(nodes: list[Node], fact_ids) -> bool:
    return all(set(fact_ids) <= {r[0] for r in rows(n.home, "SELECT id FROM facts")} for n in nodes)


def prepare_home(home: Path, campaign: wire.Fact) -> Identity:
    """A node's home before it starts, as `swarm join --campaign FILE` leaves it: its key, the
    campaign's terms and signed fact, and its baseline."""
    home.mkdir(parents=True, exist_ok=True)
    with Ledger(home / "ledger.db", campaign=CAMPAIGN) as book:
        book.set_terms({"name": CAMPAIGN, "organiser": campaign.peer_id, "baseline": sha(WEAK),
                        "quorum": QUORUM, "members": None, "fact": campaign.id})  # fmt: skip
        assert isinstance(book.ingest(campaign.raw), wire.Fact)
        book.add_version(WEAK.encode())
    return load_identity(home)


class Verifier:
    """An honest verifier node's research side: the node's own choice of claims and verdicts."""

    def __init__(self, node: Node) -> None:
        self.node, self.me = node, load_identity(node.home)
        self.parent_scores: dict[str, dict[int, float]] = {}  # by parent, by seed
        # Each look at a claim on a seed of its own, shared by the claims on one parent (whose
        # score on it is then known), as a node's own researcher chooses them.
        self.looks: dict[str, int] = {}

    def open_claims(self) -> list[dict]:
        from node.agent.verifier import ledger_claims_to_verify

        with Ledger(self.node.home / "ledger.db", campaign=CAMPAIGN) as book:
            return [dict(c) for c in ledger_claims_to_verify(
                book, self.me.peer_id, "test", harness_sha256(FAST), QUORUM, limit=10,
                baseline=sha(WEAK))]  # fmt: skip

    def has(self, version: str) -> bool:
        return bool(rows(self.node.home, "SELECT 1 FROM versions WHERE sha256 = ?", (version,)))

    def seed(self, claim: dict) -> int:
        """The seed of this verifier's latest look at `claim`: its own, as a node's seeds are
        (two verifiers on one seed would be one look, replayed)."""
        digest = hashlib.sha256(
            f"{self.me.peer_id} {claim['parent']} {self.looks[claim['id']]}".encode()
        )
        return int.from_bytes(digest.digest()[:4]) >> 1

    def start(self, pool: ProcessPoolExecutor, claim: dict, data) -> Future:
        self.looks[claim["id"]] = self.looks.get(claim["id"], 0) + 1
        known = self.parent_scores.setdefault(claim["parent"], {})
        return pool.submit(verify_in, self.node.home, claim, data, dict(known), self.seed(claim))

    def done(self, claim: dict, future: Future) -> str:
        fact_id, parent_val_bpb = future.result()
        if parent_val_bpb is not None:
            self.parent_scores[claim["parent"]][self.seed(claim)] = parent_val_bpb
        return fact_id


def verify_in(
    home: Path, claim: dict, data, parent_scores: dict[int, float], seed: int
) -> tuple[str, float | None]:
    """One verification by the node in HOME, in a process of its own (two verifiers run at once,
    and CPython's parser is not safe to call from two threads at once)."""
    from node.agent.verifier import verify_claim

    with Ledger(home / "ledger.db", campaign=CAMPAIGN) as book:
        done = verify_claim(book, load_identity(home), claim, MARGIN, FAST, data, home / "verify",
                            seed=seed, parent_score=parent_scores.get)  # fmt: skip
    return done.fact.id, done.parent_val_bpb


def honest_measurement(data, work: Path) -> dict:
    """The honest author measures its win as a node does: the child against its parent on its
    seed 7. Returns both scores and the device class."""
    from node.trainer import run_experiment

    scores = {}
    for name, source in (("parent", WEAK), ("child", BASELINE)):
        (work / name).mkdir(parents=True, exist_ok=True)
        (work / f"{name}.py").write_text(source)
        run = run_experiment(work / f"{name}.py", FAST, data, work / name, seed=7)
        assert run.outcome == "ok", run.error
        scores[name], scores["device"] = run.val_bpb, run.device_name
    assert scores["child"] < scores["parent"] - MARGIN, scores
    return scores


def win_body(measured: dict, description: str, lie: float = 0.0) -> dict:
    """The honest win, paired as measured; `lie` lowers the child's signed score by that much."""
    child = measured["child"] - lie
    return result_body(BASELINE, child, description, pairs=((7, child, measured["parent"]),),
                       device=measured["device"])  # fmt: skip


@pytest.fixture
def processes(tmp_path: Path):
    started: list = []
    yield started
    for proc in started:
        if isinstance(proc, Node):
            proc.stop()
        elif proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)


def campaign_fact() -> wire.Fact:
    """The campaign every node holds: quorum 2, on the weakened baseline."""
    organiser = Identity.generate()
    body = wire.campaign_body(
        name=CAMPAIGN, organiser=organiser.public_key, program=b"find a better train.py\n",
        baseline=sha(WEAK), profiles=["test"], quorum=QUORUM,
    )  # fmt: skip
    return wire.sign(organiser, "campaign", CAMPAIGN, 1, body)


def hostile_plan(raw: Identity, colluder: Identity, fakes: list[str], win_raw: bytes) -> dict:
    """What the raw hostile peer sends, signed here: a campaign fact of its own (quorum 64), an
    invitation of the colluder, the colluder's confirmations of the fakes, forgeries of an honest claim, equivocations, facts
    from the future, replays, then a flood."""
    now = int(time.time() * 1000)
    impostor = wire.sign(raw, "campaign", CAMPAIGN, 2, wire.campaign_body(
        name=CAMPAIGN, organiser=raw.public_key, program=b"anything\n", baseline=sha(FAKES["worse"]),
        profiles=["test"], quorum=64), now - 3_600_000)  # fmt: skip
    confirm = [
        wire.sign(colluder, "verification", CAMPAIGN, seq, wire.verification_body(
            result=fid, child_val_bpb=0.5, parent_val_bpb=3.0, seed=seq, profile="test",
            harness=harness_sha256(FAST), verdict="confirm")).raw
        for seq, fid in enumerate(fakes, 1)
    ]  # fmt: skip
    forged = []
    for i in range(6):  # the honest author's claim with a better number, its signature kept
        envelope = msgpack.unpackb(win_raw, raw=False)
        envelope["body"]["metrics"]["val_bpb"] = 0.1 + i / 100
        forged.append(wire.canonical(envelope))
    # Its own facts are discards: claims would only lengthen the verifiers' queue.
    body = result_body(FAKES["worse"], 0.4, "again", outcome="discard")
    equivocations = [wire.sign(raw, "result", CAMPAIGN, 1, {**body, "seed": s}) for s in range(6)]
    future = [wire.sign(raw, "result", CAMPAIGN, 10 + s, body, now + 3_600_000) for s in range(6)]
    flood = [wire.sign(raw, "result", CAMPAIGN, 100 + s, body).raw for s in range(600)]
    # An invitation of its colluder, which only the organiser may sign.
    invitation = wire.sign(raw, "invitation", CAMPAIGN, 3, {"member": colluder.public_key}, now)
    publish = (
        [impostor.raw, invitation.raw]
        + confirm
        + forged
        + [f.raw for f in equivocations + future]
        + [win_raw] * 3
    )
    return {"seed": raw.seed.hex(), "publish": [m.hex() for m in publish],
            "flood": [m.hex() for m in flood]}  # fmt: skip


def judge_together(verifiers: list[Verifier], honest: list[Node], watch: Watch, data) -> list[dict]:
    """The honest verifiers look at the open claims one at a time, both at once, each with its
    own runs, until none is open; between looks their verdicts reach every honest node by
    gossip. A claim comes again while more looks can move it (open, or held for more seeds: the
    profile's first win is), within its look budget."""
    judged: list[dict] = []
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        while claims := verifiers[0].open_claims():
            claim = claims[0]
            rounds = sum(c["id"] == claim["id"] for c in judged)
            assert rounds < 12, f"claim {claim['id'][:12]} came {rounds} times"
            wait_until(lambda c=claim: watch.check() or all(v.has(c["child"]) for v in verifiers),
                       f"both verifiers to fetch {claim['child'][:12]}", timeout=120)  # fmt: skip
            futures = [v.start(pool, claim, data) for v in verifiers]
            verdicts = [v.done(claim, f) for v, f in zip(verifiers, futures, strict=True)]
            wait_until(
                lambda o=verdicts: watch.check() or holds(honest, o), "the verdicts to spread"
            )
            judged.append(claim)
    return judged


def skip_if_harness_changed(at_start: str) -> None:
    """Claims name the harness they were measured with; when its files change while the test runs
    (someone editing the working tree), the claims published before no longer match the nodes'."""
    if harness_sha256(FAST) != at_start:
        pytest.skip("the trainer's harness files changed while the test ran: run it again")


def silenced_by(node: Node, peers: set[str]) -> bool:
    status = node.status()
    return bool(status) and peers <= set(status["silenced"])


@pytest.mark.sandbox  # verifiers run peers' code only in the sandbox
def test_byzantine_peers_lose_standing_and_adopt_nothing_while_honest_wins_are_adopted(
    tmp_path: Path, processes: list, small_data
) -> None:
    began, harness = time.monotonic(), harness_sha256(FAST)
    campaign = campaign_fact()
    homes = {name: tmp_path / name for name in ("boot", "v1", "v2", "faker", "framer", "late")}
    ids = {name: prepare_home(home, campaign) for name, home in homes.items()}
    colluder, raw = Identity.generate(), Identity.generate()
    measured: list[dict] = []  # the honest author measures its win while the nodes start
    author = threading.Thread(
        target=lambda: measured.append(honest_measurement(small_data, tmp_path / "author"))
    )
    author.start()

    def start(name: str, *args: str) -> Node:
        command = "bootstrap" if name == "boot" else "peer"
        node = Node(homes[name], [command, "--campaign", CAMPAIGN, "--listen", LOOPBACK, *args])
        processes.append(node)
        return node

    boot = start("boot")
    v1, v2, faker, framer = (
        start(n, "--bootstrap", boot.addr) for n in ("v1", "v2", "faker", "framer")
    )
    honest = [boot, v1, v2]
    watch = Watch([n.home for n in honest])
    wait_until(lambda: {v1.peer_id, v2.peer_id} <= faker.connected(), "the faker to meet them")
    author.join()
    assert measured, "the honest author's runs failed"
    # The faker's first claim is the honest win, signed with a child score 0.05 lower than it ran.
    lie = publish(faker.home, ids["faker"], "result",
                  win_body(measured[0], "restore the learning rates", lie=0.05), BASELINE)  # fmt: skip
    fake_ids = {
        name: publish(faker.home, ids["faker"], "result",
                      result_body(source, 0.50 + i / 100, f"faster: {name}"), source)
        for i, (name, source) in enumerate(FAKES.items())
    }  # fmt: skip
    win = publish(
        boot.home,
        ids["boot"],
        "result",
        win_body(measured[0], "restore the learning rates"),
        BASELINE,
    )
    wait_until(
        lambda: watch.check() or holds(honest, [lie, *fake_ids.values(), win]), "claims to spread"
    )
    framed = [  # the framer's looks at the honest win: large losses, four seeds
        publish(framer.home, ids["framer"], "verification", wire.verification_body(
            result=win, child_val_bpb=measured[0]["parent"] + 1.0, parent_val_bpb=measured[0]["parent"],
            seed=50 + i, profile="test", harness=harness, verdict="refute"))
        for i in range(4)
    ]  # fmt: skip
    framed.append(publish(  # and its word that a replay of the author's seed gave another score
        framer.home, ids["framer"], "verification", wire.verification_body(
            result=win, child_val_bpb=measured[0]["parent"] + 1.0,
            parent_val_bpb=measured[0]["parent"], seed=54, profile="test", harness=harness,
            verdict="misreported", replay_val_bpb=measured[0]["child"] + 0.05,
            device=measured[0]["device"])))  # fmt: skip
    wait_until(lambda: watch.check() or holds(honest, framed), "the framer's looks to spread")

    win_raw = rows(boot.home, "SELECT raw FROM facts WHERE id = ?", (win,))[0][0]
    plan = hostile_plan(raw, colluder, [lie, *fake_ids.values()], win_raw)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    log = open(tmp_path / "raw.log", "wb")  # noqa: SIM115  (closed with the process)
    hostile = subprocess.Popen(
        [sys.executable, __file__, "publish", str(tmp_path / "plan.json"), v1.addr, v2.addr, boot.addr],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
    )  # fmt: skip
    processes.append(hostile)
    wait_until(
        lambda: "published" in (tmp_path / "raw.log").read_text(), "the raw peer", timeout=120
    )
    judged = judge_together([Verifier(v1), Verifier(v2)], honest, watch, small_data)
    skip_if_harness_changed(harness)

    # The liar's claim is misreported (both replays of its seed give the score it did not sign),
    # and its author silenced: of its fakes, those after that point are never run.
    verdicts = rows(v1.home, "SELECT r.description, v.verdict FROM verifications v JOIN results r "
                    "ON r.id = v.result ORDER BY v.time")  # fmt: skip
    looked = {c["id"] for c in judged}
    assert {win, lie} <= looked and not looked - {win, lie, *fake_ids.values()}, verdicts
    assert set(fake_ids.values()) - looked, "every fake was run: its author kept its standing"
    with Ledger(v1.home / "ledger.db", readonly=True) as book:
        states = {c["id"]: c["state"] for c in book.rows("SELECT id, state FROM claims")}
        assert states[lie] == "misreported" and states[win] == "verified", states
        assert book.quorum() == QUORUM  # the raw peer's campaign fact changed nothing
        assert not book.rows("SELECT 1 FROM campaigns WHERE organiser = ?", (raw.peer_id,))
    for node in honest:
        wait_until(lambda n=node: watch.check()
                   or silenced_by(n, {ids["faker"].peer_id, colluder.peer_id, ids["framer"].peer_id}),
                   f"{node.home.name} to silence the liar, the colluder and the framer")  # fmt: skip
    wait_until(lambda: "done" in (tmp_path / "raw.log").read_text(), "the raw peer", timeout=120)
    for node in (v1, v2):  # the raw peer sent to these directly: refused, banned and silenced
        wait_until(lambda n=node: silenced_by(n, {raw.peer_id}), f"{node.home.name} to silence it")
        assert raw.peer_id in node.status()["banned"]
    standing = {s["peer"]: s for s in v1.status()["standing"]}
    assert "found misreported" in standing[ids["faker"].peer_id]["reasons"][0]
    assert standing[colluder.peer_id]["outlying"] >= 1
    # The framer's replay, against both verifiers' replays of the author's seed: contradicted,
    # so its looks count on no claim (one peer's word never sinks a claim, and two replays
    # that give the signed score outvote it: `evidence.disqualifying`).
    assert standing[ids["framer"].peer_id]["contradicted"] == 1
    assert "replays contradict" in standing[ids["framer"].peer_id]["reasons"][0]
    offences = standing[raw.peer_id]["offences"]
    assert all(
        offences.get(r) for r in ("impostor", "bad_signature", "replay", "future_time", "flood")
    ), offences
    assert offences["impostor"] >= 2, offences  # its campaign fact and its invitation
    for name in ("boot", "v1", "v2"):  # the forgeries used the honest author's name: no harm
        assert standing[ids[name].peer_id]["status"] == "good", standing[ids[name].peer_id]

    # The honest win is adopted everywhere, framed or not, and no fake ever was.
    wait_until(lambda: all(best_head(n.home) == sha(BASELINE) for n in honest), "the win adopted")
    watch.check()
    assert watch.heads <= {sha(WEAK), sha(BASELINE)} and watch.samples > 10

    # A silenced peer is still heard (its facts are how it would recover), and never verified.
    later = [publish(faker.home, ids["faker"], "result", result_body(FAKES["worse"], 0.3, f"later {i}"))
             for i in range(3)]  # fmt: skip
    wait_until(lambda: holds(honest, later), "the later claims to spread")
    assert not {c["id"] for c in Verifier(v1).open_claims()} & set(later)
    for node in honest:  # no invalid fact was stored, and the banned raw peer's only first ones
        assert all(isinstance(wire.decode(r[0], CAMPAIGN), wire.Fact)
                   for r in rows(node.home, "SELECT raw FROM facts"))  # fmt: skip
        own = rows(
            node.home, "SELECT seq FROM facts WHERE author = ? AND seq < 100", (raw.peer_id,)
        )
        assert own == [(1,)]  # one of the six equivocations; none from the future

    # Honest nodes keep serving: a late joiner syncs from a verifier, reaches the same head and,
    # from the facts alone, the same verdict on the liar, the colluder and the framer.
    late = start("late", "--bootstrap", v2.addr)
    wait_until(lambda: silenced_by(late, {ids["faker"].peer_id, colluder.peer_id, ids["framer"].peer_id}),
               "the late joiner to judge the same from the facts", timeout=120)  # fmt: skip
    assert best_head(late.home) == sha(BASELINE)
    assert all(n.proc.poll() is None for n in [*honest, late])
    counts = [n.status()["counts"] for n in honest]
    print(
        f"\nattack: a misreported claim, {len(FAKES)} fake claims ({len(looked) - 2} run), "
        f"{len(framed)} framing looks, the honest win looked at {sum(c['id'] == win for c in judged)} "
        f"times, {len(FAKES) + 1} collusive confirmations, a forged campaign fact, 6 forged claims, "
        f"6 equivocations, 6 from the future, 3 replays, 600 flooded; honest nodes: rejected "
        f"{sum(c['rejected'] for c in counts)}, rate-limited {sum(c['rate_limited'] for c in counts)}, "
        f"dropped {sum(c['dropped'] for c in counts)}; best head sampled {watch.samples} times; "
        f"{time.monotonic() - began:.0f} s"
    )  # fmt: skip


def gossip_status(home: Path) -> dict:
    try:
        return json.loads((home / "gossip.json").read_text())
    except (OSError, ValueError):  # being replaced: read it again
        return {"silenced": [], "counts": {"dropped": -1}}


def worker_status(home: Path) -> dict:
    try:
        return json.loads((home / "status" / "worker-0.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.sandbox  # a node runs peers' code only in the sandbox
def test_a_joined_node_refutes_fakes_skips_the_silenced_faker_and_adopts_the_honest_win(
    tmp_path: Path, processes: list, small_data, data_cache
) -> None:
    """`swarm join` on a campaign file (quorum 1, the weakened baseline), verifying at every step:
    the node's own researcher looks at the faker's claims and the honest win, silences the faker
    once its claimed gains prove far above what it measures, never runs its later claims, and
    adopts the win, never a fake."""
    from conftest import Process

    began, phases, harness = time.monotonic(), [], harness_sha256(FAST)
    env = {**os.environ, "SWARM_DATA": str(data_cache), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    (tmp_path / "weak.py").write_text(WEAK)
    made = subprocess.run(
        [sys.executable, "-m", "node.cli", "campaign", "new", CAMPAIGN, "--program",
         str(ROOT / "program.md"), "--profile", "test", "--quorum", "1", "--baseline",
         str(tmp_path / "weak.py"), "--budget", f"test={FAST.budget_tokens}",  # the claims' budget
         "--out", str(tmp_path / "c.json"), "--home",
         str(tmp_path / "organiser")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    ids = {name: load_identity(tmp_path / name) for name in ("boot", "faker")}
    measured: list[dict] = []  # the honest author measures its win while the nodes start
    author = threading.Thread(
        target=lambda: measured.append(honest_measurement(small_data, tmp_path / "author"))
    )
    author.start()
    boot = Node(tmp_path / "boot", ["bootstrap", "--campaign", CAMPAIGN, "--listen", LOOPBACK])
    processes.append(boot)
    faker = Node(tmp_path / "faker", ["peer", "--campaign", CAMPAIGN, "--listen", LOOPBACK,
                                      "--bootstrap", boot.addr])  # fmt: skip
    processes.append(faker)
    home = tmp_path / "joined"
    me = load_identity(home)  # the key the node will use
    joined = Process("join", "--campaign", str(tmp_path / "c.json"), "--profile", "test",
                     "--verify-every", "1", "--bootstrap", boot.addr, "--listen", LOOPBACK,
                     "--home", str(home), env=env)  # fmt: skip
    try:
        fakes = [name for name in FAKES if name != "worse still"]
        fake_ids = {
            name: publish(faker.home, ids["faker"], "result",
                          result_body(FAKES[name], 0.50 + i / 100, f"faster: {name}"), FAKES[name])
            for i, name in enumerate(fakes)
        }  # fmt: skip
        author.join()
        assert measured, "the honest author's runs failed"
        win = publish(boot.home, ids["boot"], "result", win_body(measured[0], "restore the learning rates"),
                      BASELINE)  # fmt: skip
        phases.append(f"win published {time.monotonic() - began:.0f} s")
        seen: set[str] = set()  # every head and adoption the node reported
        adopted: set[str] = set()  # every adoption alone
        doing: set[str] = set()  # and everything it said it was doing

        def judged() -> set[str]:
            """The claims the node has judged; on the way, what it builds on and adopted."""
            status = worker_status(home)
            seen.update(v for v in (status.get("head"), status.get("adopted")) if v)
            adopted.update(v for v in (status.get("adopted"),) if v)
            doing.add(status.get("doing") or "")
            assert joined.proc.poll() is None, "".join(joined.lines)[-3000:]
            sql = "SELECT result FROM verifications WHERE author = ?"
            return {r[0] for r in rows(home, sql, (me.peer_id,))}

        try:
            wait_until(lambda: win in judged() and judged() & set(fake_ids.values()),
                       "the joined node to look at the win and a fake", timeout=300)  # fmt: skip
            wait_until(lambda: ids["faker"].peer_id in gossip_status(home)["silenced"],
                       "the joined node's gossip layer to silence the faker", timeout=300)  # fmt: skip
        except AssertionError:
            skip_if_harness_changed(harness)
            raise
        phases.append(f"judged {time.monotonic() - began:.0f} s")
        wait_until(lambda: judged() and worker_status(home).get("adopted") == sha(BASELINE)
                   and worker_builds_on(home, sha(BASELINE)),
                   "the joined node to adopt the honest win and build on it", timeout=180)  # fmt: skip
        status = gossip_status(home)
        why = next(s for s in status["standing"] if s["peer"] == ids["faker"].peer_id)["reasons"][0]
        assert (
            "claimed a gain far above what its verifiers measured" in why or "found void" in why
        ), why
        # Its next steps would look at the faker's other claims if its author still had standing.
        looked = judged()
        steps = worker_status(home)["steps"]
        wait_until(lambda: judged() and worker_status(home)["steps"] > steps + 1
                   and worker_status(home)["doing"].startswith("research"),
                   "the joined node's next steps to research", timeout=240)  # fmt: skip
        phases.append(f"researching {time.monotonic() - began:.0f} s")
        unjudged = set(fake_ids.values()) - judged()
        assert unjudged and judged() & set(fake_ids.values()) <= looked  # skipped: no standing
        assert not any(rid[:12] in text for rid in unjudged for text in doing)
        # A fake is never adopted. Research may go ahead from a claim the looks favour while it
        # is judged: "worse again" turns off a rate already a hundredth of the baseline's, and
        # need not measure worse.
        assert sha(WEAK) in seen and not adopted & {sha(FAKES[n]) for n in FAKES}
        later = publish(
            faker.home, ids["faker"], "result", result_body(FAKES["worse"], 0.2, "later")
        )
        wait_until(lambda: rows(home, "SELECT 1 FROM facts WHERE id = ?", (later,)),
                   "the joined node to hear the silenced faker's later claim")  # fmt: skip
        steps = worker_status(home)["steps"]
        wait_until(lambda: worker_status(home)["steps"] > steps + 1, "two more steps", timeout=240)
        assert later not in judged()  # heard, never run
        print(f"\njoined node: {', '.join(phases)}; {time.monotonic() - began:.0f} s in all")
    finally:
        joined.stop()


# ---------------------------------------------------------------- the raw hostile peer


def _publish(plan_path: str, targets: list[str]) -> None:
    """Publish the plan's messages through pubsub, then flood: 100 messages to a frame, at once."""
    import multiaddr
    import trio
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
    from libp2p.pubsub.pb import rpc_pb2
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
    from libp2p.tools.anyio_service import background_trio_service
    from libp2p.utils.varint import encode_uvarint

    from node.gossip import topic_for

    plan = json.loads(Path(plan_path).read_text())
    key = create_new_key_pair(bytes.fromhex(plan["seed"]))
    topic = topic_for(CAMPAIGN)

    def signed(pubsub, data: bytes):
        msg = rpc_pb2.Message(
            data=data, topicIDs=[topic], from_id=pubsub.my_id.to_bytes(), seqno=os.urandom(8)
        )
        msg.signature = key.private_key.sign(
            PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString()
        )
        msg.key = key.public_key.serialize()
        return msg

    async def main() -> None:
        host = new_host(key_pair=key, muxer_preference="YAMUX")
        router = GossipSub(protocols=[PROTOCOL_ID_V11, PROTOCOL_ID], degree=6, degree_low=4, degree_high=12,
                           heartbeat_interval=1, adaptive_gossip_enabled=False, spam_protection_enabled=False,
                           max_messages_per_topic_per_second=10_000.0)  # fmt: skip
        pubsub = Pubsub(host, router, strict_signing=True)
        infos = [info_from_p2p_addr(multiaddr.Multiaddr(t)) for t in targets]
        async with host.run(listen_addrs=[multiaddr.Multiaddr(LOOPBACK)]):
            async with background_trio_service(pubsub), background_trio_service(router):
                await pubsub.wait_until_ready()
                for info in infos:
                    await host.connect(info)
                await pubsub.subscribe(topic)
                await trio.sleep(3)  # let the mesh form
                for data in plan["publish"]:
                    try:
                        await pubsub.publish(topic, bytes.fromhex(data))
                    except Exception as exc:
                        print("publish failed:", type(exc).__name__, flush=True)
                    await trio.sleep(0.05)
                print("published", flush=True)
                await trio.sleep(1)
                flood = [bytes.fromhex(f) for f in plan["flood"]]
                frames = [rpc_pb2.RPC(publish=[signed(pubsub, d) for d in flood[i : i + 100]]).SerializeToString()
                          for i in range(0, len(flood), 100)]  # fmt: skip
                for info in infos:
                    try:
                        stream = await host.new_stream(info.peer_id, [PROTOCOL_ID_V11])
                        for frame in frames:
                            await stream.write(encode_uvarint(len(frame)) + frame)
                    except Exception as exc:  # dropped mid-flood: the point
                        print("flood cut:", type(exc).__name__, flush=True)
                await trio.sleep(2)
                print("done", flush=True)
                await trio.sleep_forever()

    trio.run(main)


if __name__ == "__main__" and len(sys.argv) > 3 and sys.argv[1] == "publish":
    sys.path.insert(0, str(ROOT))
    _publish(sys.argv[2], sys.argv[3:])
