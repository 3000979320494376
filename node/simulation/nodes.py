"""The simulated nodes. An honest node is the real `Researcher` on a real in-memory `Ledger`,
given a surrogate trainer for its runs and the landscape's proposer (`landscape.py`'s turns one
idea on or off; on `catalogue.py`'s it is the product's offline proposer): its research step,
verification, adoption, re-scores and audits are the product's own.

Adversaries: a liar is an honest node that signs its own children's scores lower than it
measured; a colluder runs nothing, claims a child of no real gain on the one seed of many that
flatters it, confirms its partners' claims with made-up looks and refutes honest ones; a framer
runs nothing and says of every honest claim that its replay of the author's seed gave another
score than the one signed; a jammer runs nothing and, on every head it sees, signs a discard of
every change the offline proposer knows there, each with a made-up loss of a paired sigma.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from node import consensus, evidence, wire
from node.agent import beliefs
from node.agent.loop import Head, Step, research_step
from node.agent.offline import OfflineProposer
from node.agent.patch import make_diff, normalise_diff
from node.agent.proposers import Attempt, Context, Proposal
from node.agent.researcher import Researcher
from node.evidence import Judgement
from node.identity import Identity
from node.ledger import Ledger
from node.simulation import landscape as land
from node.trainer import RunResult, harness_sha256

if TYPE_CHECKING:
    from node.simulation.swarm import Simulation

CAMPAIGN = "sim"
HARNESS = harness_sha256(land.PROFILE)
LIE = 0.05  # bpb: how much lower than measured a liar signs its own children's scores
FAST_OFFSET = -0.01  # bpb: every score on the fast device class reads this much lower
FAST_SPEED = 1.5  # the fast device class runs this many times as many experiments an hour
COLLUDER_TRIES = 20  # seeds a colluder tries to find the one that flatters its child most
COLLUDER_HARM = 0.001  # bpb: a colluder's child is worse than its parent by at most this much
MADE_UP_GAIN = 0.004  # bpb: the gain a colluder's made-up look shows (or, framing, the loss)
FRAMED_REPLAY = 0.01  # bpb: how far above the signed score a framer says its replay landed


class KeepIfLower(Researcher):
    """autoresearch's rule, for comparison: each change runs once, on the head's first seed,
    and is kept when its val_bpb is lower than the head's there."""

    def _research(self, head: Head) -> Step:
        return research_step(
            self.ledger, self.me, self.proposer, head, self.sigma, self.profile, self.data,
            self.work_dir, seeds=self.seeds(1),
            parent_score=lambda seed: self.score_at(head.source, seed), check=self.check,
            run=self._run, crew=self.crew, margin=lambda runs: 0.0,
        )  # fmt: skip


class Trusting(Researcher):
    """The same node adopting every claim unverified, for comparison: a version's score is its
    lineage of gains as their authors claimed them, and its proposer takes every claim as
    verified by its author's pairs (`as_trusted`)."""

    def best_head(self) -> str:
        results, _ = self.ledger.claim_rows(self.profile.name)
        kept = consensus.versions_of(results, self.profile.name, self.harness)
        judged = {}
        for r in kept:
            claimed = evidence.claimed_gain(r)
            if claimed is not None and claimed[0] > 0:
                judged[r["id"]] = Judgement("verified", gain=claimed[0], se=0.0, seeds=1)
        return consensus.head_of(consensus.lineage_scores(kept, judged, self.baseline))


def as_trusted(context: Context) -> Context:
    """What a proposer of a node that trusts every claim sees: each kept result judged verified
    by its author's own pairs (their mean gain, and its standard error at the node's noise), so
    that it combines the wins its peers claim as the swarm's rule combines verified ones."""
    sigma = beliefs.sigma_of(context)

    def trusted(attempt: Attempt) -> Attempt:
        if attempt.outcome != "keep" or not attempt.paired:
            return attempt
        gain = -statistics.fmean(attempt.paired)
        return dataclasses.replace(
            attempt, judged=("verified", gain, sigma / len(attempt.paired) ** 0.5)
        )

    return dataclasses.replace(
        context, history=tuple(map(trusted, context.history)),
        earlier=tuple(map(trusted, context.earlier)),
    )  # fmt: skip


class SimNode:
    """One node: its key, its ledger, its Researcher (or a colluder's script), its hardware."""

    def __init__(self, sim: Simulation, index: int, role: str, fast: bool = False) -> None:
        s = sim.settings
        self.sim, self.index, self.role, self.fast = sim, index, role, fast
        self.speed = FAST_SPEED if fast else 1.0
        self.device = land.DEVICE + (" (fast)" if fast else "")
        self.me = self.identity(s.seed, index)
        self.peer_id = self.me.peer_id
        self.rng = np.random.default_rng([s.seed, index, 1])
        self.ledger = Ledger(":memory:", campaign=CAMPAIGN, clock=sim.clock_ms)
        self.ledger.set_terms(sim.terms)
        self.ledger.add_version(sim.landscape.baseline.encode())
        self.rejected = 0
        self.token = 0  # bumped when the node leaves: a pending resume of the old life is void
        self.idle = 0  # its steps in a row that ran nothing (`Simulation._resume`)
        self.proposer = sim.landscape.proposer(self.rng, f"{s.seed}:{index}", s.proposer == "fixed")
        kind = {"keep-if-lower": KeepIfLower, "trusting": Trusting}.get(s.rule, Researcher)
        work = Path(sim.work_dir) / f"node{index}"
        self.researcher = kind(
            self.ledger, self.me, self.proposer, land.PROFILE, None, work, sim.landscape.baseline,
            quorum=s.quorum, verify_every=0 if s.rule == "trusting" else s.verify_every,
            check=None, publish=self._publish, run=self._run, calibrate=s.nodes == 1,
        )  # fmt: skip
        # sha256 of every child this node's research proposed: its ideas, and the merges queued
        # before them (a liar lies about all of them)
        self.proposed: set[str] = set()
        queued = self.researcher.proposer
        propose = queued.propose

        def proposing(context: Context) -> Proposal:
            proposal = propose(as_trusted(context) if s.rule == "trusting" else context)
            self.proposed.add(hashlib.sha256(proposal.source.encode()).hexdigest())
            return proposal

        queued.propose = proposing
        self.partners: list[SimNode] = []  # a colluder's
        self.framed: set[str] = set()
        self.jammed: set[str] = set()  # the heads a jammer jammed

    @staticmethod
    def identity(seed: int, index: int) -> Identity:
        """A key derived from the seed: the same run signs the same bytes (Ed25519 is
        deterministic)."""
        return Identity(hashlib.sha256(f"sim {seed} {index}".encode()).digest())

    # ------------------------------------------------------------ what the Researcher calls

    def _run(self, script: Path, profile, data, run_dir: Path, seed: int = 0, **_) -> RunResult:
        """One surrogate run: its virtual seconds pass on the simulation's clock."""
        text = Path(script).read_text()
        self.sim.clock += land.run_seconds(self.rng, self.speed)
        self.sim.count_run(self, text)
        bpb = self.sim.landscape.run(text, seed, self.rng) + (FAST_OFFSET if self.fast else 0)
        version = hashlib.sha256(text.encode()).hexdigest()
        if self.role == "liar" and version in self.proposed:
            bpb -= LIE
        return RunResult(
            outcome="ok", val_bpb=bpb, steps=1000, tokens=land.PROFILE.budget_tokens,
            train_seconds=land.RUN_SECONDS - 60, total_seconds=land.RUN_SECONDS,
            peak_memory_mb=None, mfu=None, train_py_sha256=version, harness_sha256=HARNESS,
            profile=land.PROFILE.name, seed=seed, data_sha256="0" * 64,
            device_name=self.device, run_dir=str(run_dir),
        )  # fmt: skip

    def _publish(self, fact: wire.Fact) -> None:
        self.sim.publish(self, fact)

    # ------------------------------------------------------------ the simulation calls

    def receive(self, raws: list[bytes], versions: list[bytes]) -> None:
        """Facts that gossip or sync brought, and the train.py versions they name (a live node
        fetches those by hash)."""
        for source in versions:
            self.ledger.add_version(source)
        out = self.ledger.ingest_many(raws)
        self.rejected += sum(isinstance(item, wire.Rejection) for item in out)

    def act(self) -> None:
        """One step of the node's life: a Researcher step (or, once research is over, only
        following the swarm's head: `Researcher.follow`); a colluder's or a framer's turn."""
        if self.role == "colluder":
            self._collude()
        elif self.role == "framer":
            self._frame()
        elif self.role == "jammer":
            self._jam()
        elif self.sim.research_open:
            self.researcher.step()
        else:
            self.researcher.follow()

    def adopted(self) -> str | None:
        return self.researcher.adopted

    def own_head(self) -> str | None:
        head = self.researcher.head
        return None if head is None else head.sha256

    # ------------------------------------------------------------ a colluder

    def _collude(self) -> None:
        """Claim a child of no real gain from the head, on the seed of COLLUDER_TRIES that
        flatters it most (its real runs there, so that a replay agrees), have partners confirm
        it with made-up looks, and refute every honest claim seen since the last turn."""
        self.sim.clock += land.run_seconds(self.rng, self.speed)
        head = self.researcher.best_head()
        world = self.sim.landscape
        parent = (self.ledger.version(head) or world.baseline.encode()).decode()
        mild = world.mild(parent, self.rng, COLLUDER_HARM)
        if mild:
            description, text = mild[int(self.rng.integers(len(mild)))]
            seeds = self.rng.integers(0, 2**31, COLLUDER_TRIES).tolist()
            runs = [(world.run(text, s, self.rng), world.run(parent, s, self.rng), s)
                    for s in seeds]  # fmt: skip
            c, p, seed = min(runs, key=lambda r: r[0] - r[1])
            self.ledger.add_version(text.encode())
            diff = normalise_diff(make_diff(parent, text))
            body = wire.result_body(
                parent=head, child=hashlib.sha256(text.encode()).hexdigest(), diff=diff.encode(),
                description=description, profile=land.PROFILE.name,
                harness=HARNESS, seed=seed, outcome="keep",
                metrics={"val_bpb": c, "steps": 1000, "tokens": land.PROFILE.budget_tokens,
                         "train_seconds": land.RUN_SECONDS - 60, "total_seconds": land.RUN_SECONDS},
                pairs=[(seed, c, p)], device=self.device,
            )  # fmt: skip
            fact = self.ledger.publish(self.me, "result", body)
            self._publish(fact)
            for partner in self.partners:
                self.sim.schedule_confirm(partner, fact, (seed, c, p))
        results, _ = self.ledger.claim_rows(land.PROFILE.name)
        for r in results:
            author = self.sim.role_of.get(r["author"])
            if author != "colluder" and r["id"] not in self.framed:
                self.framed.add(r["id"])
                self._made_up_look(r["id"], +MADE_UP_GAIN, "refute")

    def _frame(self) -> None:
        """Every honest claim seen since the last turn (a run length), framed at once with a
        made-up look that says a replay of the author's seed gave FRAMED_REPLAY more than the
        score it signed (misreported), on the author's device class, and no gain on a seed of
        its own."""
        self.sim.clock += land.run_seconds(self.rng, self.speed)
        results, _ = self.ledger.claim_rows(land.PROFILE.name)
        for r in results:
            signed = evidence.claimed_first_score(r)
            honest = self.sim.role_of.get(r["author"]) == "honest"
            if not honest or r["id"] in self.framed or signed is None:
                continue
            self.framed.add(r["id"])
            self._made_up_look(r["id"], 0.0, "misreported", replay=signed + FRAMED_REPLAY,
                               device=r.get("device") or self.device)  # fmt: skip

    def _jam(self) -> None:
        """Every change the offline proposer knows on the swarm's head, once per head: a discard
        signed with a made-up pair on a seed of its own, the child a paired sigma worse than the
        parent (a plausible loss, which the evidence does not favour running again), and the
        child's train.py given out, so that its discards count as evidence until a replay
        denies one (`node.agent.discards`). No run behind any of them."""
        self.sim.clock += land.run_seconds(self.rng, self.speed)
        head = self.researcher.best_head()
        if head in self.jammed:
            return
        self.jammed.add(head)
        parent = (self.ledger.version(head) or self.sim.landscape.baseline.encode()).decode()
        for description, text in OfflineProposer(seed=self.index).candidates(parent, land.PROFILE):
            seed = int(self.rng.integers(0, 2**31))
            parent_score = float(self.rng.normal(1.0, land.SEED_SD))
            child_score = parent_score + land.PAIRED_SD
            self.ledger.add_version(text.encode())
            body = wire.result_body(
                parent=head, child=hashlib.sha256(text.encode()).hexdigest(),
                diff=normalise_diff(make_diff(parent, text)).encode(), description=description,
                profile=land.PROFILE.name, harness=HARNESS, seed=seed, outcome="discard",
                metrics={"val_bpb": child_score, "steps": 1000,
                         "tokens": land.PROFILE.budget_tokens},
                pairs=[(seed, child_score, parent_score)], device=self.device,
            )  # fmt: skip
            self._publish(self.ledger.publish(self.me, "result", body))

    def confirm(self, fact: wire.Fact, claimed: tuple[int, float, float]) -> None:
        """A partner's claim, confirmed without a run: consensus.HOLD_LOOKS made-up looks on
        fresh seeds, the first with a replay of the author's seed that agrees."""
        child = claimed[1]
        for look in range(consensus.HOLD_LOOKS):
            self._made_up_look(
                fact.id, -MADE_UP_GAIN, "confirm", replay=child if look == 0 else None
            )

    def _made_up_look(
        self, result: str, delta: float, verdict: str, replay=None, device: str | None = None
    ) -> None:
        base = float(self.rng.normal(1.0, land.SEED_SD))
        body = wire.verification_body(
            result=result, child_val_bpb=base + delta, parent_val_bpb=base,
            seed=int(self.rng.integers(0, 2**31)), profile=land.PROFILE.name, harness=HARNESS,
            verdict=verdict, replay_val_bpb=replay, device=device or self.device,
        )  # fmt: skip
        self._publish(self.ledger.publish(self.me, "verification", body))
