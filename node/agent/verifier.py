"""Verification: re-run other peers' most promising unverified claims on this machine, child and
parent paired on this node's own seed, replay the author's own run (its seed, on the same device
class), and publish a signed verdict: the gain measured on the fresh seed, void when this node's
harness refused to score the child (it broke the measurement's rules), misreported when the
replay does not give the score the author signed.

It never trusts a claimed number, never verifies its own claims (they would not count), and
never runs a stranger's train.py that fails the node's checks.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node import committees, consensus, evidence, margins, merges, wire
from node.agent.errors import AgentError
from node.agent.loop import VERIFY_RUN, Check, policy_check, record_run
from node.evidence import Judgement
from node.identity import Identity
from node.ledger import Ledger
from node.ledger_queries import LOOK_COLUMNS, RESULT_COLUMNS
from node.standing import ledger_standing, silenced
from node.trainer import Profile, RunResult, TokenData, run_experiment
from node.trainer.runner import TIMED_VOIDS

Run = Callable[..., RunResult]


MAX_WAITING_PER_AUTHOR = 16  # open claims of one author considered at once; the rest wait
WANTING = frozenset({"open", consensus.HELD})  # the states more looks can move


def claims_to_verify(
    results: Iterable[Mapping[str, Any]], verifications: Iterable[Mapping[str, Any]], me: str,
    profile: str, harness: str, rules: consensus.Rules, limit: int = 5,
    baseline: str | None = None, skip: Collection[str] = (),
    per_author: int = MAX_WAITING_PER_AUTHOR, judged: Mapping[str, Judgement] | None = None,
    head: str | None = None, out: Collection[str] | None = None,
) -> list[Mapping[str, Any]]:  # fmt: skip
    """Kept claims of other peers on `profile`, measured with this node's `harness`, whose
    looks can still move them (open, or held for more seeds: `consensus.judge_claims`), where
    this node's looks count (on the claim's committee, in a campaign with members), and that
    have fewer seeds behind them than the look budget (`Rules.look_budget`) and fewer than
    `evidence.PEER_CAP` of this node's; by authors not in `skip` (those that lost standing).

    Claims built on the `head` this node adopted first (each would be the next head), then the
    rest of the frontier: claims built on the `baseline` or on a verified child, since only
    those can become the head or be merged onto it (a win on an unverified parent waits for its
    parent); claims this node never looked at before those it did. Then round-robin across
    authors, the author this node has looked at least first, so that a flood of claims by one
    author cannot starve the others; each author's claims by largest claimed gain (the likeliest
    next heads), ties by id, at most `per_author` of them. `judged`: the claims' judgements
    under `rules`, when the caller keeps them (then `verifications` need only be this node's
    own); `out`: the peers a replay contradicted on any profile, whose committee seats go to
    the next in rank (None: those of `judged`). Pure: no I/O."""
    results = [r for r in results if r["profile"] == profile and r["outcome"] == "keep"]
    measured = [r for r in results if r["harness"] == harness]
    verifications = list(verifications)
    if judged is None:
        judged = consensus.judge_claims(measured, verifications, rules)
    by_id = {r["id"]: r for r in measured}
    frontier = {baseline} | {
        by_id[rid]["child"] for rid, j in judged.items() if j.state == "verified" and rid in by_id
    }
    mine = Counter(
        v["result"] for v in verifications if v["author"] == me and v["delta"] is not None
    )
    tried = {v["result"] for v in verifications if v["author"] == me}

    if out is None:  # the peers a replay contradicted: their seats go to the next in rank
        out = consensus.contradicted(judged)

    def wanted(r: Mapping[str, Any]) -> bool:
        j = judged.get(r["id"])
        return j is not None and (
            r["author"] != me and r["author"] not in skip and j.state in WANTING
            and not merges.waits_on_parts(j.reason)  # its parts' verdicts move it, not looks
            and j.seeds < rules.look_budget and mine[r["id"]] < evidence.PEER_CAP
            and not (r["id"] in tried and not mine[r["id"]])  # it crashed or was void here
            and ((seats := committees.panel(r, rules, out)) is None or me in seats)
        )  # fmt: skip

    def gain(r: Mapping[str, Any]) -> float:
        claimed = evidence.claimed_gain(r)
        return claimed[0] if claimed else 0.0

    queues: dict[tuple[int, str], list[Mapping[str, Any]]] = {}
    for r in sorted((r for r in by_id.values() if wanted(r)), key=lambda r: (-gain(r), r["id"])):
        tier = (0 if r["parent"] == head else 2 if r["parent"] in frontier else 4) + (
            r["id"] in tried
        )
        queue = queues.setdefault((tier, r["author"]), [])
        if len(queue) < per_author:
            queue.append(r)
    served = Counter(by_id[rid]["author"] for rid in tried if rid in by_id)
    ranked = sorted(
        ((tier, served[author] + turn, -gain(r), r["id"]), r)
        for (tier, author), queue in queues.items()
        for turn, r in enumerate(queue)
    )  # fmt: skip
    return [r for _, r in ranked[:limit]]


def ledger_claims_to_verify(
    ledger: Ledger, me: str, profile: str, harness: str, quorum: int | None = None,
    limit: int = 5, baseline: str | None = None, head: str | None = None,
) -> list[Mapping[str, Any]]:  # fmt: skip
    """`claims_to_verify` over the ledger's results and verifications on `profile`, under its
    campaign's rules, skipping the claims of peers that lost standing in this node's eyes
    (`node.standing`)."""
    _, judged, _ = ledger.standings(profile, quorum, harness, every=True)
    results = ledger.rows(
        f"SELECT {RESULT_COLUMNS} FROM results WHERE profile = ? AND outcome = 'keep'", (profile,)
    )
    mine = ledger.rows(
        f"SELECT {LOOK_COLUMNS} FROM verifications WHERE profile = ? AND author = ?", (profile, me)
    )
    skip = silenced(ledger_standing(ledger))
    return claims_to_verify(
        results, mine, me, profile, harness, ledger.rules(profile, quorum), limit,
        baseline or ledger.baseline(), skip=skip, judged=judged, head=head,
        out=ledger.contradicted(),
    )  # fmt: skip


def may_look(
    ledger: Ledger, me: str, claim: Mapping[str, Any], j: Judgement, rules: consensus.Rules,
    head: str | None, out: Collection[str],
) -> bool:  # fmt: skip
    """Whether `me` may look at `claim` (a kept result, judged `j`) again now: the bounds of
    `claims_to_verify` (its state, the look budget, this node's seeds, its committee)."""
    mine = ledger.rows(
        f"SELECT {LOOK_COLUMNS} FROM verifications WHERE result = ? AND author = ?",
        (claim["id"], me),
    )
    return bool(claims_to_verify([claim], mine, me, claim["profile"], claim["harness"], rules,
                                 judged={claim["id"]: j}, head=head, out=out))  # fmt: skip


@dataclass(frozen=True)
class Verified:
    """One verification: the verdict, this node's runs, and the signed fact it published."""

    verdict: str
    child_val_bpb: float | None
    parent_val_bpb: float | None
    fact: wire.Fact
    child_run: RunResult | None  # None when the child broke the policy and never ran
    replay_run: RunResult | None = None  # the child on the author's seed; None: not run now


def claimed_pairs(claim: Mapping[str, Any]) -> list[tuple[int, float, float]]:
    """(seed, child, parent) of each paired run the claim's author signed, from its ledger row
    (JSON lists) or its fact body (lists)."""

    def read(name: str) -> list:
        value = claim.get(name) or []
        return json.loads(value) if isinstance(value, str) else list(value)

    return list(zip(read("seeds"), read("child_scores"), read("parent_scores"), strict=True))


def verify_claim(
    ledger: Ledger, me: Identity, claim: Mapping[str, Any], margin: float, profile: Profile,
    data: TokenData, work_dir: Path, *, seed: int = 0,
    parent_score: Callable[[int], float | None] | None = None,
    check: Check | None = policy_check, run: Run = run_experiment, replay: bool = True,
) -> Verified:  # fmt: skip
    """Run the claim's child on `seed`, pair it with the parent on the same seed
    (`parent_score(seed)`: this node's score of the parent on a seed; where it gives none, the
    parent runs here), and publish a `verification` with the verdict of `margins.verdict`,
    which also weighs this node's earlier looks at the claim (their signed deltas):
    inconclusive ones, and confirming ones when the claim is held for more looks.

    Where `replay` is set, this node's device class is the author's and its look did not
    refute the claim, it also replays the author's first seed (or reads its earlier run of it):
    a child or parent score that differs from the signed one by more than the profile's replay
    tolerance is misreported. A child that fails `check` (the policy) never runs and is
    refuted: no honest node could have run it. A child whose run this node's harness voided is
    void: the author skipped the checks or cheated; a void on timing (training past the budget,
    more work than the budget counts) is run once more first.
    A parent run that crashes or is voided is this node's problem: no verdict, an AgentError."""
    if claim["author"] == me.peer_id:
        raise AgentError("a node cannot verify its own claim: its confirmation would not count")
    sources = {}
    for role in ("parent", "child"):
        source = ledger.version(claim[role])
        if source is None:
            raise AgentError(
                f"this node lacks the {role} train.py {claim[role][:12]} of claim "
                f"{claim['id'][:12]}: fetch it from a peer first"
            )
        sources[role] = source.decode()
    if check is not None:
        try:
            check(sources["child"])
        except AgentError:
            body = wire.verification_body(
                result=claim["id"], child_val_bpb=None, parent_val_bpb=None, seed=seed,
                profile=profile.name, harness=claim["harness"], verdict="refute",
            )  # fmt: skip
            fact = ledger.publish(me, "verification", body)
            return Verified("refute", None, None, fact, None)
    base = Path(work_dir) / f"verify-{time.strftime('%Y%m%d-%H%M%S')}-{claim['id'][:12]}"
    runs = _Runs(ledger, sources, claim, profile, data, base, run)

    def score_parent(seed: int) -> float | None:
        known = parent_score(seed) if parent_score is not None else None
        return known if known is not None else runs.parent(seed)

    child_run = runs.child(seed, "child")
    child_bpb = child_run.val_bpb if child_run.outcome == "ok" else None
    parent_bpb = replay_bpb = replay_run = None
    if child_run.outcome == "void":
        verdict = "void"
    else:
        parent_bpb = score_parent(seed)
        if parent_bpb is None:
            raise AgentError(
                f"this node's own run of the parent {claim['parent'][:12]} crashed or was voided "
                f"by its harness on seed {seed}: no verdict published; see {base}"
            )
        earlier = ledger.rows(
            "SELECT delta FROM verifications WHERE result = ? AND author = ? AND profile = ? "
            "AND harness = ? AND verdict IN ('inconclusive', 'confirm') AND delta IS NOT NULL",
            (claim["id"], me.peer_id, profile.name, child_run.harness_sha256),
        )
        gains = [-row["delta"] for row in earlier]
        verdict = margins.verdict(child_bpb, parent_bpb, margin, gains)
        pairs = claimed_pairs(claim)
        # A claim this look refutes counts for nothing already: only one that may still count
        # is replayed, on the author's device class, where a replay gives the author's numbers.
        replayable = child_run.device_name and child_run.device_name == claim.get("device")
        if replay and pairs and replayable and verdict in ("confirm", "inconclusive"):
            replay_run, replay_bpb, verdict = _replay(
                pairs[0], runs, score_parent, profile.replay_tolerance, verdict
            )
    body = wire.verification_body(
        result=claim["id"], child_val_bpb=child_bpb, parent_val_bpb=parent_bpb, seed=seed,
        profile=profile.name, harness=child_run.harness_sha256, verdict=verdict,
        replay_val_bpb=replay_bpb, device=child_run.device_name or "",
    )  # fmt: skip
    fact = ledger.publish(me, "verification", body)
    return Verified(verdict, child_bpb, parent_bpb, fact, child_run, replay_run)


def replay_discard(
    ledger: Ledger, me: Identity, discard: Mapping[str, Any], profile: Profile, data: TokenData,
    work_dir: Path, *, check: Check | None = policy_check, run: Run = run_experiment,
) -> Verified | None:  # fmt: skip
    """Replay a peer's discard (`node.agent.discards`): its child on the author's first seed
    (or this node's earlier run of it there), and publish a `verification` of it with the
    replayed score: "confirm" where it is the signed one within the profile's replay tolerance,
    "misreported" where not, or where the child fails `check` (under the discard's harness no
    honest node ran it). None, nothing published, where its run crashed here (that proves
    nothing) or a version is missing."""
    pairs = claimed_pairs(discard)
    source = ledger.version(discard["child"])
    if not pairs or source is None:
        return None
    seed, signed, _ = pairs[0]
    if check is not None:
        try:
            check(source.decode())
        except AgentError:
            body = wire.verification_body(
                result=discard["id"], child_val_bpb=None, parent_val_bpb=None, seed=seed,
                profile=profile.name, harness=discard["harness"], verdict="misreported",
                device=discard.get("device") or "",
            )  # fmt: skip
            return Verified("misreported", None, None, ledger.publish(me, "verification", body),
                            None)  # fmt: skip
    base = Path(work_dir) / f"replay-{time.strftime('%Y%m%d-%H%M%S')}-{discard['id'][:12]}"
    runs = _Runs(ledger, {"child": source.decode()}, discard, profile, data, base, run)
    replayed, child_run = runs.known("child", seed), None
    if replayed is None:
        child_run = runs.child(seed, "replay")
        if child_run.outcome != "ok" or child_run.val_bpb is None:
            return None
        replayed = child_run.val_bpb
    body = wire.verification_body(
        result=discard["id"], child_val_bpb=None, parent_val_bpb=None, seed=seed,
        profile=profile.name, harness=discard["harness"], replay_val_bpb=replayed,
        verdict="misreported" if abs(replayed - signed) > profile.replay_tolerance else "confirm",
        device=discard.get("device") or "",
    )  # fmt: skip
    fact = ledger.publish(me, "verification", body)
    return Verified(body["verdict"], None, None, fact, child_run, child_run)


def _replay(
    claimed: tuple[int, float, float], runs: _Runs, score_parent: Callable[[int], float | None],
    tolerance: float, verdict: str,
) -> tuple[RunResult | None, float | None, str]:  # fmt: skip
    """(the replay's run, None where an earlier run of the child on the author's seed stood in;
    the child's replayed score; the verdict): misreported when the child's or the parent's
    score on the author's seed is not the one the author signed."""
    seed, child, parent = claimed
    replay, replayed = None, runs.known("child", seed)  # a run is a function of its seed
    if replayed is None:
        replay = runs.child(seed, "replay")
        if replay.outcome == "void":  # its harness refused the author's own seed
            return replay, None, "void"
        if replay.outcome != "ok" or replay.val_bpb is None:  # a crash here proves nothing
            return replay, None, verdict
        replayed = replay.val_bpb
    if abs(replayed - child) > tolerance:
        return replay, replayed, "misreported"
    parent_here = score_parent(seed)
    if parent_here is not None and abs(parent_here - parent) > tolerance:
        return replay, replayed, "misreported"
    return replay, replayed, verdict


@dataclass
class _Runs:
    """This node's runs of one claim's versions, each recorded in its ledger."""

    ledger: Ledger
    sources: Mapping[str, str]
    claim: Mapping[str, Any]
    profile: Profile
    data: TokenData
    base: Path
    run: Run

    def child(self, seed: int, name: str) -> RunResult:
        result = self._run("child", seed, f"{name}-s{seed}")
        if result.outcome == "void" and any(v in (result.error or "") for v in TIMED_VOIDS):
            # A pause of this machine can look like training past the budget or like too much
            # work: a void costs the author its standing at once, so the run must show it twice.
            result = self._run("child", seed, f"{name}-again-s{seed}")
        return result

    def known(self, role: str, seed: int) -> float | None:
        """This node's score of the claim's `role` on `seed` from a run it made before, if any."""
        rows = self.ledger.rows(
            "SELECT val_bpb FROM runs WHERE child = ? AND seed = ? AND profile = ? "
            "AND harness = ? AND val_bpb IS NOT NULL ORDER BY id DESC LIMIT 1",
            (self.claim[role], seed, self.profile.name, self.claim["harness"]),
        )
        return rows[0]["val_bpb"] if rows else None

    def parent(self, seed: int) -> float | None:
        result = self._run("parent", seed, f"parent-s{seed}")
        return result.val_bpb if result.outcome == "ok" else None

    def _run(self, role: str, seed: int, name: str) -> RunResult:
        run_dir = self.base / name
        run_dir.mkdir(parents=True, exist_ok=True)
        script = self.base / f"{name}.py"
        script.write_text(self.sources[role])
        started = int(time.time() * 1000)
        result = self.run(script, self.profile, self.data, run_dir, seed=seed)
        version = self.claim[role]
        record_run(
            self.ledger, result, parent=self.claim["parent"] if role == "child" else version,
            child=version, outcome=result.outcome, started=started,
            description=f"{VERIFY_RUN}{self.claim['id'][:12]}: {name}",
        )  # fmt: skip
        return result
