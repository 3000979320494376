"""A simulated node's research loop, step for step the Researcher's: measure its own noise, adopt
the best verified head, verify every `verify_every`-th step, else research from its head.

A loop is a generator that yields the virtual seconds each run takes; the simulation resumes it
when they have passed. A colluding node instead claims fake wins and confirms its partners'.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np

from node import consensus, wire
from node.agent import adoption
from node.identity import Identity
from node.simulation import landscape as land
from node.simulation.views import PROFILE, SharedView

if TYPE_CHECKING:
    from node.simulation.swarm import Simulation

Loop = Generator[float, None, None]
FAKE_GAIN = 0.010  # a cheat claims its child beats its parent by this much
FAKE_WORSE = 0.005  # while the child is truly worse than the parent by at least this much


class SimNode:
    """One node: its key, its view of the swarm's facts, its own runs, its head."""

    def __init__(self, sim: Simulation, index: int, view: SharedView, malicious: bool) -> None:
        self.sim, self.index, self.view, self.malicious = sim, index, view, malicious
        # A key derived from the seed: the same run signs the same bytes (Ed25519 is deterministic).
        self.me = Identity(hashlib.sha256(f"sim {sim.settings.seed} {index}".encode()).digest())
        self.peer_id = self.me.peer_id
        self.rng = np.random.default_rng([sim.settings.seed, index, 1])
        self.scores: dict[str, list[float]] = {}  # this node's own runs, by version
        self.looks: dict[str, list[float]] = {}  # gains of its inconclusive looks, by claim
        self.margin: float | None = None
        self.head = sim.baseline
        self.head_score = 0.0
        self.adopted: str | None = None
        self.queue: list[tuple[str, np.ndarray, str]] = []  # merges onto the adopted head
        self.steps = 0
        self.runs = 0
        self.token = 0  # bumped when the node leaves: a pending resume of the old loop is void

    # ------------------------------------------------------------ runs and facts

    def _run(self, version: str, why: str) -> Generator[float, None, float]:
        """One run of `version` (`run_seconds` of virtual time), recorded as this node's own;
        `why` (noise, research, verify, adopt) is counted for the figures."""
        yield land.run_seconds(self.rng)
        self.runs += 1
        self.sim.runs += 1
        self.sim.runs_by_purpose[why] += 1
        score = land.measure(self.sim.versions[version], self.rng)
        self.scores.setdefault(version, []).append(score)
        return score

    def _score(self, version: str, why: str) -> Generator[float, None, float]:
        """The Researcher's `score`: the mean of its own runs of a version, run now if none."""
        if version not in self.scores:
            yield from self._run(version, why)
        return statistics.fmean(self.scores[version])

    def _publish(self, kind: str, body: dict) -> wire.Fact:
        fact = self.view.sign(self.me, kind, body, self.sim.now)
        self.sim.publish(self, fact)
        return fact

    def _result(
        self, parent: str, child: str, outcome: str, val_bpb: float, what: str = "surrogate step"
    ) -> wire.Fact:
        body = wire.result_body(
            parent=parent, child=child,
            diff=land.diff(self.sim.versions[parent], self.sim.versions[child]),
            description=what, profile=PROFILE,
            harness=land.HARNESS, seed=self.runs, outcome=outcome,
            metrics={"val_bpb": val_bpb, "steps": 1000, "tokens": 524288 * 1000,
                     "train_seconds": land.TRAIN_SECONDS, "total_seconds": land.RUN_SECONDS},
        )  # fmt: skip
        return self._publish("result", body)

    def _verification(
        self, result: str, child: float, parent: float, verdict: str, seed: int | None = None
    ) -> None:
        body = wire.verification_body(
            result=result, child_val_bpb=child, parent_val_bpb=parent,
            seed=self.runs if seed is None else seed,
            profile=PROFILE, harness=land.HARNESS, verdict=verdict,
        )  # fmt: skip
        self._publish("verification", body)

    # ------------------------------------------------------------ the loop

    def loop(self) -> Loop:
        """The node's life from a (re)start; its runs and facts survive a restart."""
        if self.malicious:
            yield from self._cheat()
            return
        while len(self.scores.get(self.sim.baseline, [])) < self.sim.settings.noise_runs:
            yield from self._run(self.sim.baseline, "noise")
        self.margin = consensus.noise_margin(self.scores[self.sim.baseline])
        if self.head == self.sim.baseline:
            self.head_score = statistics.fmean(self.scores[self.sim.baseline])
        self.adopted = None  # a restarted node looks at the head afresh
        while True:
            yield from self._adopt()
            self.steps += 1
            every = self.sim.settings.verify_every
            if not self.sim.research_open:  # the swarm has stopped: keep the step's rhythm only
                yield land.run_seconds(self.rng)
                continue
            if every and self.steps % every == 0 and (yield from self._verify_one()):
                continue
            yield from self._research()

    def _adopt(self) -> Generator[float, None, None]:
        best = self.view.best_head()
        if best == self.adopted:
            return
        self.adopted = best
        if self._builds_on(self.head, best):  # its own kept chain starts from the new head
            self.sim.adopted(self, best)
            return
        if self.head != best:
            self.head_score = yield from self._score(best, "adopt")
            self.head = best
        self.sim.adopted(self, best)
        merges = self.view.merges(best, self.sim.source_of)
        self.queue = [(best, land.parse(p.source), p.description) for p in merges]

    def _builds_on(self, version: str, ancestor: str) -> bool:
        """The Researcher's `_builds_on`: `version` descends from `ancestor` by kept results."""
        return adoption.descends_from(version, ancestor, self.sim.kept_parent_of.get)

    def _research(self) -> Generator[float, None, None]:
        parent, child_x, what = self.head, None, "surrogate step"
        while self.queue and child_x is None:  # merges queued at adoption go first
            base, x, description = self.queue.pop(0)
            if base == parent:
                child_x, what = x, description
        if child_x is None:
            child_x = land.propose(self.sim.versions[parent], self.rng)
        child = self.sim.add_version(child_x)
        score = yield from self._run(child, "research")
        outcome = consensus.keep_or_discard(score, self.head_score, self.margin)
        self._result(parent, child, outcome, score, what)
        if outcome == "keep":
            self.head, self.head_score = child, score
            self.sim.reached(self, child)

    def _verify_one(self) -> Generator[float, None, bool]:
        """The Researcher's `_verify_one`: the first open claim, child then (unless already
        scored here) parent, and a verdict by `consensus.verdict` that weighs this node's earlier
        inconclusive (and, for a claim held for more looks, confirming) looks at the claim.
        False when none is open."""
        claims = self.view.claims(self.peer_id)
        if not claims:
            return False
        claim = claims[0]
        child = yield from self._run(claim["child"], "verify")
        parent = yield from self._score(claim["parent"], "verify")
        earlier = self.looks.setdefault(claim["id"], [])
        verdict = consensus.verdict(child, parent, self.margin, earlier)
        if verdict in ("inconclusive", "confirm"):
            earlier.append(parent - child)
        self._verification(claim["id"], child, parent, verdict)
        return True

    # ------------------------------------------------------------ a cheat

    def _cheat(self) -> Loop:
        """Adopt the head like anyone, then claim a child that is truly worse as a win, one run
        length apart, and have partners confirm it at once (they need not run anything)."""
        while True:
            best = self.view.best_head()
            if best != self.head:
                self.head = best
                self.head_score = land.true_bpb(self.sim.versions[best])
            child = self.sim.add_version(
                land.worse(self.sim.versions[self.head], self.rng, FAKE_WORSE)
            )
            yield land.run_seconds(self.rng)
            self.runs += 1
            fact = self._result(self.head, child, "keep", self.head_score - FAKE_GAIN)
            self.sim.fakes.add(child)
            self.sim.collude(self, fact)

    def confirm(self, fact: wire.Fact) -> None:
        """A partner's fake, confirmed without a run, with the numbers it claimed: as many looks
        as the outlier hold asks (`consensus.HOLD_LOOKS`, each on its own seed), since they cost
        a colluder nothing."""
        claimed = fact.body["metrics"]["val_bpb"]
        for look in range(consensus.HOLD_LOOKS):
            seed = self.runs * consensus.HOLD_LOOKS + look
            self._verification(fact.id, claimed, claimed + FAKE_GAIN, "confirm", seed)
