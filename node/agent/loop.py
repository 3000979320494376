"""One research step: from the node's head, a proposal, its checks, one run, the decision, and
a signed `result` in the ledger for every experiment that ran (discards, crashes and void runs
too: a run the harness refused to score, because it broke the measurement's rules, is never kept).

It never runs a change that failed its checks, and never touches the network: the caller
gossips the fact it returns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from node import consensus, wire
from node.agent.errors import AgentError, PatchError
from node.agent.patch import apply_diff, check_source, diff_hash, make_diff, normalise_diff
from node.agent.proposers import Proposal, Proposer, context_from_ledger
from node.identity import Identity
from node.ledger import Ledger
from node.trainer import Profile, RunResult, TokenData, policy, run_experiment

if TYPE_CHECKING:
    from node.agent.crew import Crew

Check = Callable[[str], None]  # raises AgentError (or a subclass) when a train.py may not run


def policy_check(source: str) -> None:
    """The trainer's static policy, as a check: raises PatchError listing what the source breaks."""
    violations = policy.check_source(source)
    if violations:
        shown = "; ".join(str(v) for v in violations[:5])
        raise PatchError(f"the train.py breaks the policy (see program.md): {shown}")


@dataclass(frozen=True)
class Head:
    """The train.py this node builds on, and its own score of it on the profile."""

    source: str
    val_bpb: float

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


@dataclass(frozen=True)
class Step:
    """What one step did. `outcome` is keep, discard, crash or void after a run; refused without
    one."""

    outcome: str
    head: Head  # the node's head after the step: the child on a keep, else unchanged
    description: str = ""
    reason: str = ""  # why it was refused, or the run's error
    run: RunResult | None = None
    fact: wire.Fact | None = None


def research_step(
    ledger: Ledger, me: Identity, proposer: Proposer, head: Head, margin: float, profile: Profile,
    data: TokenData, work_dir: Path, *, program: str = "", seed: int = 0,
    check: Check | None = policy_check, on_event: Callable[[dict], None] = lambda _: None,
    run: Callable[..., RunResult] = run_experiment, crew: Crew | None = None,
) -> Step:  # fmt: skip
    """Propose a change of `head`, check it, run it, keep it only when it beats the head's own
    score by more than `margin`, and publish a signed result of the run. With a `crew`, a change
    that another worker of the node has in hand is refused."""
    context = context_from_ledger(
        ledger, head.source, profile.name, program, me=me.peer_id, parent_val_bpb=head.val_bpb
    )
    if crew is not None:  # what the node's other workers are running now
        context = dataclasses.replace(context, history=crew.running(head.sha256) + context.history)
    try:
        proposal = proposer.propose(context)
        diff = normalise_diff(make_diff(head.source, proposal.source))
        # The child is the head with the canonical diff applied: trailing spaces on added lines
        # are not part of a change, so two peers' spellings of one change give one version.
        proposal = Proposal(proposal.description, apply_diff(head.source, diff))
        check_source(proposal.source)
        key = ("try", head.sha256, diff_hash(diff))
        running = f"the change {key[2][:12]} is running on another worker of this node"
        if key[2] in {a.diff_hash for a in context.history if a.outcome == "running"}:
            raise PatchError(running)
        if key[2] in context.tried_hashes:
            raise PatchError(f"the change {key[2][:12]} was already tried on this head")
        if check is not None:
            check(proposal.source)
        if crew is not None and not crew.take(*key, what=proposal.description):
            raise PatchError(running)
    except AgentError as exc:
        return Step("refused", head, reason=str(exc))
    try:
        child = ledger.add_version(proposal.source.encode())
        started = int(time.time() * 1000)
        run_dir = Path(work_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{child[:12]}-s{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        script = run_dir.with_suffix(".py")
        script.write_text(proposal.source)
        result = run(script, profile, data, run_dir, seed=seed, on_event=on_event)
        score = result.val_bpb if result.outcome == "ok" else None
        if result.outcome == "void":  # the harness refused to score it: nothing to weigh
            outcome = "void"
        else:
            outcome = consensus.keep_or_discard(score, head.val_bpb, margin)
        body = wire.result_body_from_run(
            result.as_dict(), parent=head.sha256, diff=diff.encode(),
            description=proposal.description, keep=outcome == "keep",
        )  # fmt: skip
        fact = ledger.publish(me, "result", body)
        ledger.record_run(
            started=started, finished=int(time.time() * 1000), profile=profile.name,
            parent=head.sha256, child=child, outcome=outcome, val_bpb=score,
            description=proposal.description, log_path=str(run_dir / "log.txt"), fact_id=fact.id,
        )  # fmt: skip
    finally:
        if crew is not None:
            crew.drop(*key)
    new_head = Head(proposal.source, score) if outcome == "keep" and score is not None else head
    return Step(outcome, new_head, proposal.description, result.error or "", result, fact)
