"""Verification: re-run other peers' most promising unverified claims on this machine, with this
node's own seed, and publish a signed verdict measured against its own run of the parent (void
when this node's harness refused to score the child: it broke the measurement's rules).

It never trusts a claimed number, never verifies its own claims (they would not count), and
never runs a stranger's train.py that fails the node's checks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node import consensus, wire
from node.agent.errors import AgentError
from node.agent.loop import Check, policy_check
from node.identity import Identity
from node.ledger import Ledger
from node.standing import ledger_standing, silenced
from node.trainer import Profile, RunResult, TokenData, run_experiment
from node.trainer.runner import OVERRUN

Run = Callable[..., RunResult]


MAX_WAITING_PER_AUTHOR = 16  # open claims of one author considered at once; the rest wait


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
    contested = {rid for rid, by in votes.items() if "void" in by.values()}
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
        "SELECT id, author, profile, parent, child, harness, outcome, val_bpb, description "
        "FROM results WHERE profile = ? AND outcome = 'keep'",
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
    parent_run: RunResult | None  # None when not run (an earlier own score, or no child run)


def verify_claim(
    ledger: Ledger, me: Identity, claim: Mapping[str, Any], margin: float, profile: Profile,
    data: TokenData, work_dir: Path, *, seed: int = 0, parent_val_bpb: float | None = None,
    check: Check | None = policy_check, run: Run = run_experiment,
) -> Verified:  # fmt: skip
    """Run the claim's child (and its parent, unless `parent_val_bpb` is this node's own earlier
    score of it) and publish a `verification` with the verdict of `consensus.verdict`, which
    also weighs this node's earlier looks at the claim (their signed deltas): inconclusive
    ones, and confirming ones when the claim is held for more looks. A child that fails `check`
    (the policy) never runs and is refuted: no honest node could have run it. A child whose run
    this node's harness voided is void: the author skipped the checks or cheated; a void for
    training past the budget is run once more first. A parent run
    that crashes or is voided is this node's problem: no verdict, an AgentError."""
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
                result=claim["id"], child_val_bpb=None, parent_val_bpb=parent_val_bpb, seed=seed,
                profile=profile.name, harness=claim["harness"], verdict="refute",
            )  # fmt: skip
            fact = ledger.publish(me, "verification", body)
            return Verified("refute", None, parent_val_bpb, fact, None, None)
    base = Path(work_dir) / f"verify-{time.strftime('%Y%m%d-%H%M%S')}-{claim['id'][:12]}"
    child_run = _run(ledger, sources["child"], "child", claim, profile, data, base, seed, run)
    if child_run.outcome == "void" and OVERRUN in (child_run.error or ""):
        # A pause of this machine at the budget's end can look like training past it: a void
        # costs the author its standing at once, so the run must show it twice.
        child_run = _run(ledger, sources["child"], "child", claim, profile, data, base, seed,
                         run, again=True)  # fmt: skip
    parent_run = None
    if parent_val_bpb is None:
        parent_run = _run(
            ledger, sources["parent"], "parent", claim, profile, data, base, seed, run
        )
        if parent_run.outcome != "ok" or parent_run.val_bpb is None:
            what = "was voided by its harness" if parent_run.outcome == "void" else "crashed"
            raise AgentError(
                f"this node's own run of the parent {claim['parent'][:12]} {what} "
                f"({parent_run.error}): no verdict published; see {parent_run.run_dir}"
            )
        parent_val_bpb = parent_run.val_bpb
    child_bpb = child_run.val_bpb if child_run.outcome == "ok" else None
    if child_run.outcome == "void":
        verdict = "void"
    else:
        earlier = ledger.rows(
            "SELECT delta FROM verifications WHERE result = ? AND author = ? AND profile = ? "
            "AND harness = ? AND verdict IN ('inconclusive', 'confirm') AND delta IS NOT NULL",
            (claim["id"], me.peer_id, profile.name, child_run.harness_sha256),
        )
        gains = [-row["delta"] for row in earlier]
        verdict = consensus.verdict(child_bpb, parent_val_bpb, margin, gains)
    body = wire.verification_body(
        result=claim["id"], child_val_bpb=child_bpb, parent_val_bpb=parent_val_bpb, seed=seed,
        profile=profile.name, harness=child_run.harness_sha256, verdict=verdict,
    )  # fmt: skip
    fact = ledger.publish(me, "verification", body)
    return Verified(verdict, child_bpb, parent_val_bpb, fact, child_run, parent_run)


def _run(
    ledger: Ledger, source: str, role: str, claim: Mapping[str, Any], profile: Profile,
    data: TokenData, base: Path, seed: int, run: Run, again: bool = False,
) -> RunResult:  # fmt: skip
    name = f"{role}-again" if again else role
    run_dir = base / name
    run_dir.mkdir(parents=True, exist_ok=True)
    script = base / f"{name}.py"
    script.write_text(source)
    started = int(time.time() * 1000)
    result = run(script, profile, data, run_dir, seed=seed)
    ledger.record_run(
        started=started, finished=int(time.time() * 1000), profile=profile.name,
        parent=claim["parent"], child=claim[role], outcome=result.outcome, val_bpb=result.val_bpb,
        description=f"verify {claim['id'][:12]}: {role}", log_path=str(run_dir / "log.txt"),
    )  # fmt: skip
    return result
