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

from node import consensus, wire
from node.agent.errors import AgentError
from node.agent.loop import Check, policy_check, record_run
from node.identity import Identity
from node.ledger import Ledger
from node.standing import ledger_standing, silenced
from node.trainer import Profile, RunResult, TokenData, run_experiment
from node.trainer.runner import TIMED_VOIDS

Run = Callable[..., RunResult]


MAX_WAITING_PER_AUTHOR = 16  # open claims of one author considered at once; the rest wait
VERIFY_RUN = "verify "  # how the description of a verification's run begins in the ledger


def claims_to_verify(
    results: Iterable[Mapping[str, Any]], verifications: Iterable[Mapping[str, Any]], me: str,
    profile: str, harness: str, quorum: int = 1, limit: int = 5, baseline: str | None = None,
    skip: Collection[str] = (), per_author: int = MAX_WAITING_PER_AUTHOR,
) -> list[Mapping[str, Any]]:  # fmt: skip
    """Kept claims of other peers on `profile`, measured with this node's `harness`, that this
    node has not judged yet and the quorum has neither verified nor refuted, by authors not in
    `skip` (those that lost standing). The frontier first: claims built on the `baseline` or on a
    verified child, since only those can become the head (a win on an unverified parent waits
    for its parent). Then round-robin across authors, the author this node has judged least
    first, so that a flood of claims by one author cannot starve the others; each author's
    claims by lowest claimed val_bpb (the likeliest next heads), ties by id, at most
    `per_author` of them. Claims this node found inconclusive come after all others, for
    another look, until it has looked `consensus.MAX_LOOKS` times. Claims this node confirmed
    that need more looks (held as outliers, `consensus.held_claims`, or found void by another
    peer and not settled) come again, each look on a fresh seed, until the claim is settled or
    this node has given it MAX_LOOKS inconclusive looks (or MAX_LOOKS + HOLD_LOOKS in all):
    right after the new claims on the frontier when on it (the likeliest next heads: a stream
    of new claims off the frontier must not starve them), else after all others. Pure: no I/O."""
    results = [r for r in results if r["profile"] == profile and r["outcome"] == "keep"]
    claims = [
        r
        for r in results
        if r["harness"] == harness and r["author"] != me and r["val_bpb"] is not None
    ]  # fmt: skip
    verifications = list(verifications)
    measured = [r for r in results if r["harness"] == harness]
    settled = set(consensus.verified_children(measured, verifications, quorum))
    by_id = {r["id"]: r for r in results}
    frontier = {baseline} | {by_id[rid]["child"] for rid in settled}
    mine = [v for v in verifications if v["author"] == me]
    looks = Counter(v["result"] for v in mine)
    unsure = Counter(v["result"] for v in mine if v["verdict"] == "inconclusive")
    looked = set(unsure)
    judged = {v["result"] for v in mine if v["verdict"] != "inconclusive"} | {
        rid for rid, n in looks.items() if n >= consensus.MAX_LOOKS
    }
    refuted = consensus.refuted_claims(claims, verifications, quorum)
    # Claims this node confirmed that need more looks, its own verdict still a confirmation.
    votes = consensus.peer_verdicts(measured, verifications)
    contested = {rid for rid, by in votes.items() if consensus.DISQUALIFYING & set(by.values())}
    again = {
        rid
        for rid in set(consensus.held_claims(measured, verifications, quorum)) | contested
        if votes.get(rid, {}).get(me) == "confirm"
        and unsure[rid] < consensus.MAX_LOOKS
        and looks[rid] < consensus.MAX_LOOKS + consensus.HOLD_LOOKS
    }
    open_claims = {
        r["id"]: r
        for r in claims
        if r["id"] not in (judged - again) | settled | refuted and r["author"] not in skip
    }  # one per id, whatever the order of arrival
    served = Counter(by_id[rid]["author"] for rid in judged | looked if rid in by_id)

    def tier(r: Mapping[str, Any]) -> int:
        on = r["parent"] in frontier
        if r["id"] in again:
            return 1 if on else 5
        return (3 if on else 4) if r["id"] in looked else (0 if on else 2)

    queues: dict[tuple[int, str], list[Mapping[str, Any]]] = {}
    for r in sorted(open_claims.values(), key=lambda r: (r["val_bpb"], r["id"])):
        queue = queues.setdefault((tier(r), r["author"]), [])
        if len(queue) < per_author:
            queue.append(r)
    ranked = sorted(
        ((rank, served[author] + turn, r["val_bpb"], r["id"]), r)
        for (rank, author), queue in queues.items()
        for turn, r in enumerate(queue)
    )  # fmt: skip
    return [r for _, r in ranked[:limit]]


def ledger_claims_to_verify(
    ledger: Ledger, me: str, profile: str, harness: str, quorum: int = 1, limit: int = 5,
    baseline: str | None = None,
) -> list[Mapping[str, Any]]:  # fmt: skip
    """`claims_to_verify` over the ledger's results and verifications on `profile`, skipping the
    claims of peers that lost standing in this node's eyes (`node.standing`)."""
    results = ledger.rows(
        "SELECT id, author, profile, parent, child, harness, outcome, val_bpb, description, "
        "seeds, child_scores, parent_scores, device FROM results "
        "WHERE profile = ? AND outcome = 'keep'",
        (profile,),
    )
    verifications = ledger.rows(
        "SELECT result, author, verdict, profile, harness, delta, seed FROM verifications "
        "WHERE profile = ?",
        (profile,),
    )
    skip = silenced(ledger_standing(ledger, quorum))
    return claims_to_verify(
        results, verifications, me, profile, harness, quorum, limit, baseline, skip=skip
    )


@dataclass(frozen=True)
class Verified:
    """One verification: the verdict, this node's runs, and the signed fact it published."""

    verdict: str
    child_val_bpb: float | None
    parent_val_bpb: float | None
    fact: wire.Fact
    child_run: RunResult | None  # None when the child broke the policy and never ran
    replay_run: RunResult | None = None  # the child on the author's seed; None: not replayed


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
    check: Check | None = policy_check, run: Run = run_experiment,
) -> Verified:  # fmt: skip
    """Run the claim's child on `seed`, pair it with the parent on the same seed
    (`parent_score(seed)`: this node's score of the parent on a seed; where it gives none, the
    parent runs here), and publish a `verification` with the verdict of `consensus.verdict`,
    which also weighs this node's earlier looks at the claim (their signed deltas):
    inconclusive ones, and confirming ones when the claim is held for more looks.

    Where this node's device class is the author's and its look did not refute the claim, it
    also replays the author's first seed: a child or parent score that differs from the signed
    one by more than the profile's replay tolerance is misreported. A child that fails `check`
    (the policy) never runs and is refuted: no honest node could have run it. A child whose run
    this node's harness voided is void: the author skipped the checks or cheated; a void on
    timing (training past the budget, more work than the budget counts) is run once more first.
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
        verdict = consensus.verdict(child_bpb, parent_bpb, margin, gains)
        pairs = claimed_pairs(claim)
        # A claim this look refutes counts for nothing already: only one that may still count
        # is replayed, on the author's device class, where a replay gives the author's numbers.
        replayable = child_run.device_name and child_run.device_name == claim.get("device")
        if pairs and replayable and verdict in ("confirm", "inconclusive"):
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


def _replay(
    claimed: tuple[int, float, float], runs: _Runs, score_parent: Callable[[int], float | None],
    tolerance: float, verdict: str,
) -> tuple[RunResult, float | None, str]:  # fmt: skip
    """(the replay's run, the child's replayed score, the verdict): misreported when the child's
    or the parent's score on the author's seed is not the one the author signed."""
    seed, child, parent = claimed
    replay = runs.child(seed, "replay")
    if replay.outcome == "void":  # its harness refused the author's own seed
        return replay, None, "void"
    if replay.outcome != "ok" or replay.val_bpb is None:  # a crash here proves nothing
        return replay, None, verdict
    if abs(replay.val_bpb - child) > tolerance:
        return replay, replay.val_bpb, "misreported"
    parent_here = score_parent(seed)
    if parent_here is not None and abs(parent_here - parent) > tolerance:
        return replay, replay.val_bpb, "misreported"
    return replay, replay.val_bpb, verdict


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
