"""The research loop of one node: step after step adopt the swarm's best verified head, verify a
share of other peers' claims, and otherwise research from the head, every comparison paired
(child and parent on the same seeds, on this machine). Its noise is the spread of its own paired
differences, learnt from its first experiments and kept up to date by every paired run.

Its state lives in the ledger (runs, facts, versions), so a restarted node resumes where it
stopped. It never talks to the network: `publish` hands each signed fact to the caller.
"""

from __future__ import annotations

import functools
import hashlib
import statistics
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Literal

from node import committees, consensus, evidence, margins, noise, wire
from node.agent import adoption, verifier
from node.agent.crew import Crew
from node.agent.doing import Doing
from node.agent.draws import ACTIVE_MS, Draws
from node.agent.errors import AgentError
from node.agent.loop import Check, Head, Step, policy_check, record_run, research_step
from node.agent.proposers import Proposal, Proposer
from node.agent.verifier import VERIFY_RUN, Verified, ledger_claims_to_verify, verify_claim
from node.identity import Identity
from node.ledger import Ledger
from node.ledger_queries import LOOK_COLUMNS
from node.standing import ledger_standing, silenced
from node.trainer import Profile, RunResult, TokenData, harness_sha256, run_experiment
from node.trainer.compile_cache import CompileCache

SPEED_RUNS = 20  # this node's latest runs behind its measured speed
AUDIT_EVERY = 10  # every this many steps, one look at an older verified step of the head's lineage
# Until its noise estimate has this many degrees of freedom, a node alone (`calibrate`) runs every
# experiment on two seeds: each such pair is one more degree of freedom (afterwards only apparent
# wins are). A node in a swarm does not: its peers' looks teach it its noise (`_update_noise`).
CALIBRATION_DF = 4


class Researcher:
    """One research worker on one profile. `verify_every`: every n-th step verifies a peer's
    claim when one is open (0: never). `crew`: what the node's other workers share with this
    one. `say`: a line for the person running the node each time what it does changes.
    `calibrate`: the node may have no peers to learn its noise from, so it spends runs on it
    (False: a node of a swarm, whose peers' looks teach it)."""

    def __init__(
        self, ledger: Ledger, me: Identity, proposer: Proposer, profile: Profile,
        data: TokenData, work_dir: Path, baseline_source: str, *, quorum: int = 1,
        program: str = "", verify_every: int = 4,
        check: Check | None = policy_check, publish: Callable[[wire.Fact], None] = lambda _: None,
        run: Callable[..., RunResult] = run_experiment, status_path: Path | None = None,
        trusted: Callable[[str], bool] | None = None, trust: Collection[str] = (),
        compile_cache: CompileCache | None = None, crew: Crew | None = None,
        say: Callable[[str], None] | None = None, calibrate: bool = True,
    ) -> None:  # fmt: skip
        self.ledger, self.me, self.profile, self.data = ledger, me, profile, data
        self.work_dir, self.quorum, self.program = Path(work_dir), quorum, program
        self.verify_every, self.calibrate = verify_every, calibrate
        self.check, self.publish, self.run = check, publish, run
        # Whose code this node may run: everyone (None) in a sandbox; without one, only its own
        # and that of the peers its user trusts by key.
        self.trusted = (
            None if trusted is None else (lambda peer: peer == me.peer_id or trusted(peer))
        )
        # Whose code may add to the node's compiled kernels: its own and that of peers trusted by key.
        self.writers = frozenset(trust) | {me.peer_id}
        self.compile_cache = compile_cache
        self.crew = crew or Crew()
        self._researching = False
        self.proposer = adoption.QueuedProposer(proposer)
        self.baseline_source = baseline_source
        self.baseline = ledger.add_version(baseline_source.encode())
        self.harness = harness_sha256(profile)
        self.draws = Draws(ledger, me, profile, quorum, self.harness)
        self.margin: float | None = None  # the smallest single-pair gain this node believes
        self.sigma: float | None = None  # the standard deviation of one paired difference
        self.sigma_df = 0  # degrees of freedom behind it (0: the profile's prior alone)
        self.head: Head | None = None
        self.adopted: str | None = None  # the last consensus head this node adopted
        self.rescored: Verified | None = None  # the look at the adopted head's claim, if any
        self._wins: frozenset[str] = frozenset()  # verified claims when merges were last queued
        self._merged_onto: str | None = None  # the head they were queued for
        self.steps = 0
        self.now = Doing(status_path, say, self.status)  # what it is doing, for its person
        self.pending: int | None = None  # open claims of other peers this node could verify

    # ------------------------------------------------------------ own measurements

    def own_scores(self, version: str) -> list[float]:
        """This node's scores of a train.py on the profile, from its recorded runs."""
        rows = self.ledger.rows(
            "SELECT val_bpb FROM runs WHERE child = ? AND profile = ? AND val_bpb IS NOT NULL "
            "AND (harness = ? OR harness IS NULL)",
            (version, self.profile.name, self.harness),
        )
        return [r["val_bpb"] for r in rows]

    def seeds(self, count: int = 2) -> list[int]:
        """This node's seeds, the same for every version it runs (its workers share them) and
        another node's differ: every comparison it makes is paired on them, so a version runs
        once per seed for everything it is compared with. The children of its head pair with
        the head's runs, a kept child's runs are the next head's, and the look at a claim on its
        head (a verification, the re-score when it adopts it) runs only the child: the parent's
        run on the seed is already there, and so is the run the node's research from the child
        pairs with. Its k-th look at one claim runs on its k-th seed."""
        return [
            int.from_bytes(hashlib.sha256(f"{self.me.peer_id} {k}".encode()).digest()[:4]) >> 1
            for k in range(count)
        ]

    def score_at(
        self, source: str, seed: int, why: str = "pair", wait: bool = True
    ) -> float | None | Literal[False]:
        """This node's score of `source` on `seed`: from its runs when it has one (a run is a
        function of its seed, within the profile's replay tolerance), else measured now, or,
        when another worker of the node is measuring it now, that worker's run once it ends
        (with `wait` False: False at once). None when it crashed or its harness voided it."""
        version = self.ledger.add_version(source.encode())
        key = ("run", version, str(seed))
        while (scored := self._scored(version, seed)) is False:
            if self.crew.take(*key, what=f"{why} of {version[:8]} on seed {seed}"):
                try:  # the other worker may have recorded it just before letting go
                    if (scored := self._scored(version, seed)) is False:
                        scored = self._score_run(source, version, seed, why)
                    return scored
                finally:
                    self.crew.drop(*key)
            if not wait:
                return False
            self.now.set(f"{why}: waiting for another worker's run of {version[:8]} on seed {seed}")
            self.crew.wait(*key)
        return scored

    def _scored(self, version: str, seed: int) -> float | None | Literal[False]:
        """The val_bpb of its last run of `version` on `seed`: None if it failed, False if none."""
        rows = self.ledger.rows(
            "SELECT val_bpb FROM runs WHERE child = ? AND seed = ? "
            "AND profile = ? AND harness = ? ORDER BY id DESC LIMIT 1",
            (version, seed, self.profile.name, self.harness),
        )
        return rows[0]["val_bpb"] if rows else False

    def _score_run(self, source: str, version: str, seed: int, why: str) -> float | None:
        self.now.set(f"{why}: run {version[:8]} on seed {seed}", self.now.change)
        run_dir = self.work_dir / f"{why}-{version[:12]}-s{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        script, started = run_dir.with_suffix(".py"), int(time.time() * 1000)
        script.write_text(source)
        result = self._run(
            script, self.profile, self.data, run_dir, seed=seed, on_event=self.now.event
        )
        record_run(self.ledger, result, parent=version, child=version, outcome=result.outcome,
                   description=why, started=started)  # fmt: skip
        return result.val_bpb if result.outcome == "ok" else None

    def score(self, source: str) -> float:
        """This node's own score of `source`: the mean of its runs, measured now if it has none,
        on its first seed (which its first child pairs with) or, while another worker of the node
        measures that, on the next: workers that start together measure the head on both seeds
        at once (the node's first experiments pair with both), not one of them twice."""
        version = self.ledger.add_version(source.encode())
        scores: list[float | None] = list(self.own_scores(version))
        if not scores:
            tries = (self.score_at(source, seed, "score", wait=False) for seed in self.seeds())
            scored = next((s for s in tries if s is not False), False)
            scores = [
                self.score_at(source, self.seeds()[0], "score") if scored is False else scored
            ]
        if scores[0] is None:
            raise AgentError(
                f"train.py {version[:12]} crashed or was voided on this node: it cannot build on it"
            )
        return statistics.fmean(scores)

    def _update_noise(self) -> None:
        """The paired noise of this node's class of device (`noise.estimate`). In a swarm no run
        is spent to calibrate it: a node's first experiments run a second seed only when the
        first looks like a win, as every later one does, and a change kept by chance on a prior
        that is too small is refuted by the looks at its claim, which teach the node its noise."""
        self.sigma, self.sigma_df = noise.estimate(
            self.ledger, self.profile.name, self.profile.paired_noise, self.harness
        )
        self.margin = margins.margin_for(self.sigma)

    def speed(self) -> float | None:
        """This node's training speed on the profile (counted FLOPs per second of training
        compute): the median of its last runs', None before its first. Runs of claims it
        verified do not count: a stranger's train.py that does no work would raise it, and then
        honest runs would look like too much work."""
        rows = self.ledger.rows(
            "SELECT speed FROM runs WHERE profile = ? AND harness = ? AND speed IS NOT NULL "
            "AND description NOT LIKE ? ORDER BY id DESC LIMIT ?",
            (self.profile.name, self.harness, VERIFY_RUN + "%", SPEED_RUNS),
        )
        return statistics.median(r["speed"] for r in rows) if rows else None

    # ------------------------------------------------------------ the loop

    def start(self) -> None:
        """Take the head to build on (resuming this node's own kept chain) and its noise so far.
        No noise runs first: the first experiments' paired runs measure it."""
        self._update_noise()
        self.adopt()
        assert self.head is not None  # adopt always leaves a head
        # Resume the node's own kept chain on top of the adopted head, if it has one.
        seen = {self.head.sha256}
        while True:
            rows = self.ledger.rows(
                "SELECT child FROM runs WHERE parent = ? AND profile = ? AND outcome = 'keep' "
                "ORDER BY id DESC LIMIT 1",
                (self.head.sha256, self.profile.name),
            )
            source = self.ledger.version(rows[0]["child"]) if rows else None
            if source is None or rows[0]["child"] in seen:
                break
            seen.add(rows[0]["child"])
            self.head = Head(source.decode(), self.score(source.decode()))
            self.crew.kept(self.head)
        self.now.set("ready")

    def best_head(self) -> str:
        """The head this node would adopt now: the campaign's best under the adoption rule,
        reached through the authors it trusts."""
        return adoption.best_head(
            self.ledger, self.profile.name, self.baseline, self.quorum, self.harness, self.trusted
        )

    def adopt(self) -> None:
        """Move to the best head when it changed (`best_head`): re-measure it (a look at the
        claim that made it), build on it, and queue the other verified wins merged onto it. A
        node that stopped researching still calls this to follow the swarm."""
        best = self.best_head()
        if best == self.adopted:
            return
        source = self.ledger.version(best)
        if source is None:  # the gossip layer fetches versions by hash; until then, keep going
            if self.head is None:
                self.head = Head(self.baseline_source, self.score(self.baseline_source))
            return
        self.adopted = best
        claim = self._claim_of(best)
        if (claim is not None and not self.draws.looked_at(claim) and self.margin is not None
                and self.verify_every):  # fmt: skip
            # A node that verifies re-measures the head it adopts, unless it looked at it already:
            # a look at the claim that made it, on its first seed: the look's run of the head is
            # the run its research from the head pairs with, and its run of the head's parent is
            # there already when it researched from that parent.
            self.rescored = self._look(self._claim_row(claim), "re-score")
        if self.head is not None and self._builds_on(self.head.sha256, best):
            return  # this node's own kept chain already starts from the new head: go on from it
        mine = self.head
        if self.head is None or self.head.sha256 != best:
            try:
                self.head = Head(source.decode(), self.score(source.decode()))
            except AgentError as exc:  # it crashes on this machine: keep building on ours
                if self.head is None:
                    self.head = Head(self.baseline_source, self.score(self.baseline_source))
                self.now.set(f"cannot adopt {best[:12]}: {exc}"[:200])
                return
        # Its own keeps the new head lacks go first, rebased onto it: a win found beside the
        # one the swarm adopted adds to it instead of being lost because it came second.
        rebased = [] if mine is None else [p for p in [self._rebase(mine, self.head)] if p]
        self._wins, self._merged_onto = self._verified(), self.head.sha256
        merges = adoption.merge_proposals(
            self.ledger, best, self.profile.name, self.quorum, self.harness, self.trusted
        )
        self.proposer.queue_for(self.head.source, rebased, merges)

    def _verified(self) -> frozenset[str]:
        """The ids of the claims verified on the profile now."""
        return frozenset(self.ledger.standings(self.profile.name, self.quorum, self.harness)[1])

    def _queue_new_merges(self) -> None:
        """The verified wins of other parents merged onto the head this node builds on, queued
        when that head changed (the node researches ahead, or kept a change) or a win was
        verified since it last queued them: a win verified after the adoption joins the head
        now, not at the next adoption."""
        if self.head is None:
            return
        wins = self._verified()
        if wins <= self._wins and self.head.sha256 == self._merged_onto:
            return
        self._wins, self._merged_onto = wins, self.head.sha256
        merges = adoption.merge_proposals(
            self.ledger, self.head.sha256, self.profile.name, self.quorum, self.harness,
            self.trusted,
        )  # fmt: skip
        self.proposer.add_for(self.head.source, merges, shared=True)

    def _speculate(self) -> Verified | None:
        """Research ahead of the evidence: from the adopted head, move to another peer's claim on
        it that the looks so far favour (`adoption.worth_ahead`), so that the next win is found
        while this one is being verified; a claim it would no longer choose (`adoption.viable`)
        takes the node back to the adopted head, its own keeps on that chain queued there as
        merges (`adoption.rebase`). Its own kept chain goes first. The node's
        first run of such a child, on its own first seed, is a look at the claim, returned as
        the step: the run its research pairs with is evidence for everyone, and adopting the
        claim later needs no re-score. Drawn to judge the claim it is ahead from, it looks there
        again first, while it may. Adoption, the head and every "best" read verified claims."""
        if self.head is None or self.adopted is None or not self.verify_every:
            return
        _, judged, results = self.ledger.standings(
            self.profile.name, self.quorum, self.harness, every=True
        )
        scale = consensus.gain_scale(judged, self.profile.paired_noise)
        mine = adoption.own_gains(self.ledger, self.me.peer_id, judged)
        rules = self.ledger.rules(self.profile.name, self.quorum)
        # standing costs a judgement of every claim: only once a claim is otherwise worth it
        lost = functools.cache(lambda: silenced(ledger_standing(self.ledger)))
        out = self.ledger.contradicted()  # their seats go to the next in rank

        def worth(r: dict) -> bool:
            j, own = judged[r["id"]], mine.get(r["id"], ())
            # Before any look that counts, in a campaign with members only the claim's committee
            # takes its author at its word: their looks count for all, anyone else's for itself.
            word = (bool(j.seeds or own) or rules.members is None
                    or self.me.peer_id in committees.panel(r, rules, out))  # fmt: skip
            # Nor a claim of a peer that lost standing here: nobody here looks at its claims
            # again (`verifier.ledger_claims_to_verify`), so a few lucky looks would hold it
            # open, and the node on it, for good.
            return (word and adoption.worth_ahead(r, j, scale, self.profile.paired_noise, own)
                    and r["author"] not in lost())  # fmt: skip

        if self.head.sha256 != self.adopted:
            if adoption.viable(self.ledger, self.profile.name, self.me.peer_id, self.head.sha256,
                               self.adopted, results, judged, worth):  # fmt: skip
                r = adoption.first_ahead(results, self.head.sha256, self.adopted) or {}
                j = judged.get(r.get("id"))
                if j and self.draws.drawn([r], rules, out) and verifier.may_look(
                        self.ledger, self.me.peer_id, r, j, rules, self.adopted, out):  # fmt: skip
                    return self._look(r, "verify")
                return
            source, left = self.ledger.version(self.adopted), self.head
            if source is None:
                return
            try:
                self.head = Head(source.decode(), self.score(source.decode()))
            except AgentError:  # adopt() said why; it keeps the head it had
                return
            # its own keeps on the chain it leaves go across first, as when it adopts (`adopt`)
            self.proposer.queue_for(
                self.head.source, [p for p in [self._rebase(left, self.head)] if p]
            )
        favoured = [
            r for r in results
            if r["parent"] == self.adopted and r["author"] != self.me.peer_id
            and r["id"] in judged and worth(r) and self.ledger.version(r["child"]) is not None
            and (self.trusted is None or self.trusted(r["author"]))
        ]  # fmt: skip
        if not favoured:
            return
        pick = max(
            favoured,
            key=lambda r: (adoption.favour(r, judged[r["id"]], mine.get(r["id"], ())), r["id"]),
        )
        if not self.draws.looked_at(pick["id"]):  # its first run of the child (own seed): a look
            return self._look(pick, "look ahead", find_replay=False)
        source = self.ledger.version(pick["child"]).decode()
        try:
            self.head = Head(source, self.score(source))
        except AgentError:  # it crashes here: stay on the adopted head
            return
        self.now.set(f"research ahead from {pick['child'][:12]}, a claim being verified")

    def follow(self) -> Verified | None:
        """A step of a node that stopped researching and follows the swarm: adopt the best head
        (its re-score is the step), else replay a look nobody replayed at a step of its lineage.
        None: nothing to run."""
        if self.margin is None:
            self.start()
        self.adopt()
        if self.rescored is not None:
            looked, self.rescored = self.rescored, None
            return looked
        return self._audit(replays_only=True) if self.verify_every else None

    def _lineage(self) -> list[dict]:
        """The verified claims from the baseline to the adopted head, oldest first."""
        scores, _, results = self.ledger.standings(
            self.profile.name, self.quorum, self.harness, adoption.reach_of(self.trusted),
            self.baseline,
        )  # fmt: skip
        by_id = {r["id"]: r for r in results}
        chain, version, seen = [], self.adopted, set()
        while version in scores and scores[version].via is not None and version not in seen:
            seen.add(version)
            chain.append(by_id[scores[version].via])
            version = scores[version].parent
        return chain[::-1]

    def _claim_of(self, version: str) -> str | None:
        """The verified claim that made `version` in the head's lineage, unless this node made it."""
        made = [r for r in self._lineage() if r["child"] == version]
        return made[0]["id"] if made and made[0]["author"] != self.me.peer_id else None

    def _audit(self, replays_only: bool = False) -> Verified | None:
        """A look at a verified step of the head's lineage that this node did not make and has
        looked at fewer than `evidence.PEER_CAP` times: one with another peer's report to
        replay first (`_replay_seed`), then (unless `replays_only`) the one with the fewest
        seeds behind it. A win adopted by mistake, or on looks no run stands behind, is revoked
        by such looks."""
        _, judged, _ = self.ledger.standings(self.profile.name, self.quorum, self.harness)
        mine = {r["result"]: r["n"] for r in self.ledger.rows(
            "SELECT result, COUNT(*) AS n FROM verifications WHERE author = ? GROUP BY result",
            (self.me.peer_id,))}  # fmt: skip
        steps = [r for r in self._lineage() if r["author"] != self.me.peer_id
                 and mine.get(r["id"], 0) < evidence.PEER_CAP and r["id"] in judged]  # fmt: skip
        replays = {r["id"]: self._replay_seed(r) for r in steps}
        due = [r for r in steps if replays[r["id"]] is not None]
        if not due:  # the author's own seed, which its claim's committee replays
            # a replay gives the author's numbers on its device class
            device = noise.device_of(self.ledger, self.profile.name)
            due = [r for r in steps if device and r.get("device") == device
                   and self.draws.replayer(r) and self.draws.replays_due(r)]  # fmt: skip
            if due:
                claim = min(due, key=lambda r: r["id"])
                return self._look(claim, "audit", author_seed=True)
        due = due or ([] if replays_only else steps)
        if not due:
            return None
        claim = min(due, key=lambda r: (judged[r["id"]].seeds, r["id"]))
        return self._look(claim, "audit", replays[claim["id"]])

    def _replay_seed(
        self, claim: dict, contested_only: bool = False, drawn: bool = True
    ) -> int | None:
        """The seed of another peer's look at `claim` to replay: a contested one, or (unless
        `contested_only`) one no replay corroborated, on the verdict's side while it rests on
        such looks (`consensus.unchecked_side`): the first of `evidence.seeds_to_replay`, or
        (`drawn`) the first this node is drawn for (`Draws.replayer`), one peer a seed, of a few at a
        time while every replay of the claim agreed (a committee's worth, +1 per ACTIVE_MS)."""
        looks = self.ledger.rows(
            f"SELECT {LOOK_COLUMNS} FROM verifications WHERE result = ?", (claim["id"],)
        )
        row = self._claim_row(claim["id"]) or claim
        rules = self.ledger.rules(self.profile.name, self.quorum)
        side = 0 if contested_only else consensus.unchecked_side(row, looks, rules)
        found = evidence.cross_check(looks, rules.tolerance)  # a look no run stands behind?
        waited = max(0, self.ledger.clock() - row["time"]) // ACTIVE_MS
        calm = drawn and not (found.contradicted or found.contested)
        few = rules.committee_size + waited if calm else None
        if side:
            looks = [v for v in looks if v["delta"] is not None and (side > 0) == (v["delta"] < 0)]
        seeds = evidence.seeds_to_replay(
            looks, self.me.peer_id, claim["author"], noise.device_of(self.ledger, self.profile.name),
            self.profile.replay_tolerance, not side, at_once=few,
        )  # fmt: skip
        return next((seed for seed in seeds if not drawn or self.draws.replayer(row, seed)), None)

    def _recheck(self) -> Verified | None:
        """A replay of a seed behind the refutation of a claim on the adopted head that its
        author's signed numbers contradict (`consensus.unchecked_side`), when this node is drawn
        for the seed: made-up losses are then contradicted, and the claim is judged again
        without them, so that a committee member cannot bury an honest win unseen."""
        _, judged, results = self.ledger.standings(
            self.profile.name, self.quorum, self.harness, every=True
        )
        assert self.head is not None
        refuted = [r for r in results if r["parent"] in (self.adopted, self.head.sha256)
                   and r["author"] != self.me.peer_id
                   and (j := judged.get(r["id"])) is not None and j.state == "refuted"
                   and j.author_z is not None and j.author_z > evidence.OUTLIER_Z]  # fmt: skip
        for claim in sorted(refuted, key=lambda r: r["id"]):
            seed = self._replay_seed(claim)
            if seed is not None:
                return self._look(claim, "verify", seed)
        return None

    def _replay_discard(self, hiding: bool = False) -> Verified | None:
        """A replay of a peer's discard nobody checked there: on the adopted head, one this node
        is drawn for (`Draws.discard`); `hiding`, one that hid a change of its share from its
        proposer at its last proposal on its head (`OfflineProposer.hidden`)."""
        hidden = getattr(self.proposer.inner, "hidden", ("", ()))
        parent, changes = hidden if hiding else (self.adopted, ())
        if hiding and (parent != self.head.sha256 or not changes):
            return None
        pick = self.draws.discard(parent, changes)
        if pick is None or not self.crew.take("verify", pick["id"]):
            return None
        self.now.set(f"audit discard {pick['id'][:12]} by {pick['author'][-6:]}",
                     pick["description"])  # fmt: skip
        try:
            replayed = verifier.replay_discard(self.ledger, self.me, pick, self.profile,
                                               self.data, self.work_dir, check=self.check,
                                               run=self._run)  # fmt: skip
        finally:
            self.crew.drop("verify", pick["id"])
        if replayed is not None:
            self.publish(replayed.fact)
        return replayed

    def _builds_on(self, version: str, ancestor: str) -> bool:
        return adoption.builds_on(self.ledger, self.profile.name, version, ancestor)

    def _follow_crew(self) -> None:
        """Move to another worker's keep when it beats this worker's head and builds on the head
        the node adopted. A keep of this worker's own that the new head lacks is queued as a
        three-way merge onto it, so that wins made side by side add up."""
        assert self.head is not None
        mine = self.head
        better = next(
            (k for k in self.crew.keeps() if k.val_bpb < mine.val_bpb
             and self._builds_on(k.sha256, self.adopted or self.baseline)
             and not self._builds_on(mine.sha256, k.sha256)),
            None,
        )  # fmt: skip
        if better is None:
            return
        self.head = better
        merged_in = self._rebase(mine, better)
        if merged_in is not None:
            self.proposer.queue_for(better.source, [merged_in])

    def _rebase(self, mine: Head, onto: Head) -> Proposal | None:
        return adoption.rebase(self.ledger, self.profile.name, self.me.peer_id, mine, onto)

    def step(self) -> Step | Verified:
        """One experiment: the look at a newly adopted head's claim (its re-score), else the
        look at a claim it is about to research ahead from or is ahead from and judges
        (`_speculate`), else a look at a
        claim on the adopted head, on the one it researches ahead from or on the adopted head's
        parent (a win beside it, to merge) this node was drawn to judge (`Draws.drawn`), else
        a replay it is drawn for at a step of the head's lineage (a look nobody replayed, or the
        author's seed), else every AUDIT_EVERY-th step an audit of the head's lineage,
        else every `verify_every`-th step a verification of a peer's claim, when one is open,
        or a replay of a peer's discard on the head it is drawn for (`Draws.discard`), else a
        replay of a peer's discard that hid a change of its share from its proposer, else a
        research step from the head, else (when the proposer has nothing, or its model
        failed or its budget is spent) a verification after all. Publishes what it signed. A
        refused step ran nothing: a caller that gets several in a row should wait."""
        if self.margin is None:
            self.start()
        assert self.head is not None and self.margin is not None
        self._update_noise()
        self.adopt()
        self._follow_crew()
        ahead = self._speculate()
        self._queue_new_merges()
        self.steps += 1
        claims = self._open_claims(limit=1000)
        self.pending = len(claims)
        if self.rescored is not None:  # adopting, it re-measured the head: that was the step
            looked, self.rescored = self.rescored, None
            return looked
        if ahead is not None:  # it looked at the claim it will research ahead from
            return ahead
        if self.verify_every:  # a claim on the adopted head this node was drawn to judge, or
            # on its parent: a win beside the one adopted, which merges onto it once verified
            made = claims and adoption.made_by(self.ledger, self.profile.name, self.adopted or "")
            near = {self.adopted, self.head.sha256} | ({made["parent"]} if made else set())
            on_head = [c for c in claims if c["parent"] in near]
            for claim in self.draws.drawn(on_head)[:1]:
                looked = self._look(claim, "verify")
                if looked is not None:
                    return looked
        if self.verify_every:  # a win on the head refuted by looks its author's numbers
            # contradict, that nobody replayed; then a step of the head's lineage resting on
            # looks nobody replayed; every AUDIT_EVERY-th step, an audit of any step
            audited = self._recheck() or self._audit(replays_only=self.steps % AUDIT_EVERY != 0)
            if audited is not None:
                return audited
        if self.verify_every:  # every verify_every-th step a verification, else a replay of
            # a discard it is drawn for; at any, a replay of one that hid a change of its share
            turn = self.steps % self.verify_every == 0
            verified = (self._verify_one() or self._replay_discard()) if turn else None
            verified = verified or self._replay_discard(hiding=True)
            if verified is not None:
                return verified
        self.now.set(f"research from {self.head.sha256[:12]}")
        self._researching = True
        try:
            step = self._research(self.head)
        finally:
            self._researching = False
        if step.fact is not None:
            self.publish(step.fact)
        if step.outcome == "keep":
            self.crew.kept(step.head)
        self.head = step.head
        if step.outcome == "void":  # the harness refused to score it: say why, as for a person
            self.now.set(f"void: {step.description}: {step.reason}"[:200])
        else:
            self.now.set(step.summary())
        if step.outcome == "refused" and self.verify_every:
            return self._verify_one() or step
        return step

    def _research(self, head: Head) -> Step:
        """One research step from `head`: a proposal run paired with the head on this node's
        seeds for it, kept by the node's margin (`research_step`)."""
        return research_step(
            self.ledger, self.me, self.proposer, head, self.sigma, self.profile, self.data,
            self.work_dir, seeds=self.seeds(),
            parent_score=lambda seed: self.score_at(head.source, seed),
            calibrating=self.calibrate and self.sigma_df < CALIBRATION_DF, program=self.program,
            check=self.check, one_seed=lambda: self.proposer.last_verified,
            on_event=self.now.event, run=self._run, crew=self.crew, margin=self._margin,
        )  # fmt: skip

    def _margin(self, runs: int) -> float:
        """The paired gain over `runs` seeds this node keeps a change at: its noise margin
        (`margins.margin_for`), or any gain on one seed for a merge of verified wins."""
        if self.proposer.last_verified:
            return 0.0
        return margins.margin_for(self.sigma, runs)

    def _open_claims(self, limit: int) -> list:
        """Other peers' claims this node may verify now, the most promising first. Without a
        sandbox, only trusted authors' claims on a parent it ran before (or the baseline)."""
        claims = ledger_claims_to_verify(
            self.ledger, self.me.peer_id, self.profile.name, self.harness, self.quorum,
            limit=limit if self.trusted is None else max(limit, 64), baseline=self.baseline,
            head=self.adopted,
        )  # fmt: skip
        if self.trusted is not None:
            claims = [
                c for c in claims
                if self.trusted(c["author"])
                and (c["parent"] == self.baseline or self.own_scores(c["parent"]))
            ]  # fmt: skip
        return claims[:limit]

    def _verify_one(self) -> Verified | None:
        busy = self.crew.in_hand("verify")  # claims another worker of this node is verifying
        for claim in [c for c in self._open_claims(limit=3 + len(busy)) if c["id"] not in busy][:3]:
            verified = self._look(claim, "verify")
            if verified is not None:
                return verified
        return None

    def _claim_row(self, rid: str) -> dict | None:
        rows = self.ledger.rows("SELECT * FROM results WHERE id = ?", (rid,))
        return rows[0] if rows else None

    def _look(
        self,
        claim: dict,
        why: str,
        replay: int | None = None,
        author_seed: bool = False,
        find_replay: bool = True,
    ) -> Verified | None:
        """One look at a claim (a verification, an adopter's re-score, a look ahead, an audit),
        published: the child on this node's next seed for it (its k-th look at the claim, its
        k-th seed), paired with its own score of the parent. A re-score or an audit runs instead
        on the seed of another peer's look that no replay corroborated yet, while the claim's
        verdict rests on such looks (every adopter re-scores, each on a seed spread by hash, so
        that a fake is out fast; an audit only when drawn for the seed: `_replay_seed`), and a
        verification on a contested seed: a look no run stands behind is then contradicted.
        `author_seed`: replay the author's first seed too (`verify_claim`), which the peer drawn
        for it does in an audit (`Draws.replays_due`), and a verification does when the claim awaits
        it (its author claimed a gain far above what its verifiers measured: `evidence.judge`).
        `replay`: the seed to replay, when the caller found it already; `find_replay` False:
        this node's own seed. None when another worker has it or it cannot run here."""
        claim = self._claim_row(claim["id"]) or claim  # the result as stored, its pairs with it
        if not self.crew.take("verify", claim["id"]):
            return None
        self.now.set(
            f"{why} {claim['id'][:12]} by {claim['author'][-6:]}", claim.get("description")
        )
        parent = self.ledger.version(claim["parent"])
        looks = self.ledger.rows(
            "SELECT COUNT(*) AS n FROM verifications WHERE result = ? AND author = ?",
            (claim["id"], self.me.peer_id),
        )[0]["n"]
        seed = self.seeds(looks + 1)[looks]
        if replay is None and find_replay:  # a verification decides a contested report
            # first; a re-score replays any, an audit one it is drawn for
            replay = self._replay_seed(claim, why == "verify", drawn=why != "re-score")
        seed = seed if replay is None else replay
        if why == "verify" and not author_seed:  # an author's word its verifiers doubt
            rows = self.ledger.rows(
                f"SELECT {LOOK_COLUMNS} FROM verifications WHERE result = ?", (claim["id"],)
            )
            rules = self.ledger.rules(self.profile.name, self.quorum)
            j = consensus.judge_claim(claim, rows, rules, suspects=self.ledger.suspects())
            author_seed = j.awaits_replay and self.draws.replays_due(claim)
        try:
            verified = verify_claim(
                self.ledger, self.me, claim, self.margin, self.profile, self.data,
                self.work_dir, seed=seed,
                parent_score=None if parent is None
                else functools.partial(self.score_at, parent.decode(), why=why),
                check=self.check, run=self._run,
                replay=author_seed,
            )  # fmt: skip
        except AgentError as exc:
            self.now.set(f"cannot {why} {claim['id'][:12]}: {exc}"[:200])
            return None
        finally:
            self.crew.drop("verify", claim["id"])
        self.publish(verified.fact)
        self.now.set(f"{why}: {verified.verdict}: {claim['id'][:12]} by {claim['author'][-6:]}")
        return verified

    # ------------------------------------------------------------ runs

    def _run(self, script: Path, *args, **kwargs) -> RunResult:
        """Every run of this worker: bounded by the node's measured speed, lent the node's
        compiled kernels, and adding to them only when this node trusts every line of the code."""
        if self.compile_cache is not None:
            kwargs.update(compile_cache=self.compile_cache, keep_compiled=self._trusts(script))
        speed = self.speed()
        if speed is not None:
            kwargs.update(speed=speed)
        return self.run(script, *args, **kwargs)

    def _trusts(self, script: Path) -> bool:
        """Whether the train.py about to run was written by this node and peers trusted by key
        alone: the research step's own proposal on such a head, or such a version."""
        writers = self.writers.__contains__
        version = hashlib.sha256(script.read_bytes()).hexdigest()
        if self._researching and self.head is not None and version != self.head.sha256:
            # the child has no result yet: judge its head, and the proposal
            return not self.proposer.last_queued and adoption.written_by(
                self.ledger, self.head.sha256, self.baseline, writers
            )
        return adoption.written_by(self.ledger, version, self.baseline, writers)

    # ------------------------------------------------------------ status

    def status(self) -> dict:
        """What this worker is doing now, for `swarm status`."""
        usage = getattr(self.proposer.inner, "usage", None)  # a model's tokens and dollars
        return {
            **self.now.fields(), "profile": self.profile.name, "harness": self.harness,
            "head": self.head.sha256 if self.head else None,
            "head_val_bpb": self.head.val_bpb if self.head else None,
            "adopted": self.adopted, "margin": self.margin, "sigma": self.sigma,
            "sigma_df": self.sigma_df, "steps": self.steps,
            "pending_verifications": self.pending, "proposer": self.proposer.kind,
            "model_usage": vars(usage) if usage is not None else None,
        }  # fmt: skip
