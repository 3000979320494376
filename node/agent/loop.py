"""One research step: from the node's head, a proposal, its checks, its paired runs (child and
head on the same seeds), the decision, and a signed `result` in the ledger for every experiment
that ran (discards, crashes and void runs too: a run the harness refused to score, because it
broke the measurement's rules, is never kept).

It never runs a change that failed its checks, and never touches the network: the caller
gossips the fact it returns.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from node import margins, wire
from node.agent.errors import AgentError, PatchError
from node.agent.patch import apply_diff, check_source, diff_hash, make_diff, normalise_diff
from node.agent.proposers import Proposal, Proposer, context_from_ledger
from node.identity import Identity
from node.ledger import Ledger
from node.trainer import Profile, RunResult, TokenData, harness_sha256, policy, run_experiment

if TYPE_CHECKING:
    from node.agent.crew import Crew

Check = Callable[[str], None]  # raises AgentError (or a subclass) when a train.py may not run
VERIFY_RUN = "verify "  # how the description of a verification's run begins in the ledger
# The measurement's identity, read once a process (the harness in use is the one imported).
_harness = functools.lru_cache(maxsize=16)(harness_sha256)


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
    run: RunResult | None = None  # the child's run on the first seed
    fact: wire.Fact | None = None
    pairs: tuple[tuple[int, float, float], ...] = ()  # (seed, child, head) of each paired run

    def summary(self) -> str:
        """One line for a person: the outcome, the change and its mean paired gain."""
        pairs = self.pairs
        gain = f" (gain {_gain(pairs):+.4f} over {len(pairs)} seed(s))" if pairs else ""
        return f"{self.outcome}: {self.description or self.reason}"[:200] + gain


def record_run(
    ledger: Ledger, result: RunResult, *, parent: str, child: str, outcome: str,
    description: str, started: int, fact_id: str | None = None, finished: int | None = None,
    selected: bool = False,
) -> int:  # fmt: skip
    """One of this node's runs in its ledger, with what pairing and its speed read of it (its
    row's id); `finished` (ms) defaults to now; `selected`: it ran only because the run before
    it looked like a win."""
    return ledger.record_run(
        started=started, finished=int(time.time() * 1000) if finished is None else finished,
        profile=result.profile,
        parent=parent, child=child, outcome=outcome,
        val_bpb=result.val_bpb if result.outcome == "ok" else None, description=description,
        log_path=str(Path(result.run_dir) / "log.txt"), fact_id=fact_id, seed=result.seed,
        harness=result.harness_sha256, speed=result.speed, device=result.device_name,
        selected=int(selected),
    )  # fmt: skip


def research_step(
    ledger: Ledger, me: Identity, proposer: Proposer, head: Head, sigma: float, profile: Profile,
    data: TokenData, work_dir: Path, *, seeds: Sequence[int],
    parent_score: Callable[[int], float | None], calibrating: bool = False, program: str = "",
    check: Check | None = policy_check, on_event: Callable[[dict], None] = lambda _: None,
    run: Callable[..., RunResult] = run_experiment, crew: Crew | None = None,
    margin: Callable[[int], float] | None = None, one_seed: Callable[[], bool] = lambda: False,
) -> Step:  # fmt: skip
    """Propose a change of `head`, check it, and run it paired with the head: on `seeds[0]`, and
    on `seeds[1]` too when the first pair looks like a win (or while `calibrating`, when the
    node still learns its noise: two seeds of one pair measure it), unless the first scored
    exactly as its parent did: a change the run does not see (a CPU replays a run bit for bit;
    a GPU's runs never tie so, and within its replay tolerance lie real gains), whose second
    seed would only teach the node a noise of zero. `parent_score(seed)` is this
    node's score of the head on a seed, measured when it has none. Keep the child only when its
    mean paired gain beats the margin for that many runs (`margins.margin_for` of `sigma`, the
    standard deviation of one paired difference; `margin(runs)` replaces it), and publish a signed
    result of the pairs. With a `crew`, a change that another worker of the node has in hand is
    refused. A proposal `one_seed()` is true for, asked once it is made, runs on `seeds[0]`
    alone (a merge of wins the swarm verified: its committee judges it)."""
    if margin is None:
        margin = functools.partial(margins.margin_for, sigma)
    context = context_from_ledger(
        ledger, head.source, profile.name, program, me=me.peer_id, parent_val_bpb=head.val_bpb
    )
    context = dataclasses.replace(context, sigma=sigma)
    if crew is not None:  # what the node's other workers are running now
        context = dataclasses.replace(context, history=crew.running(head.sha256) + context.history)
    try:
        proposal = _unsettled(ledger, head, profile, crew) or proposer.propose(context)
        diff = normalise_diff(make_diff(head.source, proposal.source))
        # The child is the head with the canonical diff applied: trailing spaces on added lines
        # are not part of a change, so two peers' spellings of one change give one version.
        proposal = dataclasses.replace(proposal, source=apply_diff(head.source, diff))
        check_source(proposal.source)
        key = ("try", head.sha256, diff_hash(diff))
        running = f"the change {key[2][:12]} is running on another worker of this node"
        if key[2] in {a.diff_hash for a in context.history if a.outcome == "running"}:
            raise PatchError(running)
        # Tried here already: run again only on purpose (`Proposal.rerun`), and never by a node
        # that ran it (its seeds would repeat its runs).
        ran_here = {a.diff_hash for a in context.history if a.by == "this node"}
        if key[2] in context.tried_hashes and (not proposal.rerun or key[2] in ran_here):
            raise PatchError(f"the change {key[2][:12]} was already tried on this head")
        if check is not None:
            check(proposal.source)
        if crew is not None and not crew.take(*key, what=proposal.description):
            raise PatchError(running)
    except AgentError as exc:
        return Step("refused", head, reason=str(exc))
    try:
        child = ledger.add_version(proposal.source.encode())
        parents = {seeds[0]: parent_score(seeds[0])}
        if parents[seeds[0]] is None:
            return Step("refused", head, reason=f"the head does not score on seed {seeds[0]} here")
        pairs: list[tuple[int, float, float]] = []
        runs: list[tuple[RunResult, int]] = []  # (run, its row in the ledger)
        for seed in seeds[: 1 if one_seed() else 2]:
            if pairs and not (calibrating or _gain(pairs) > margin(1)):
                break
            if pairs and pairs[0][1] == pairs[0][2]:
                break  # the run did not see the change: its score is the parent's, to the bit
            if seed not in parents:
                parents[seed] = parent_score(seed)
                if parents[seed] is None:
                    break
            on_event(
                {"event": "trying", "description": proposal.description, "seed": len(pairs) + 1}
            )
            ran = _run_before(ledger, head.sha256, child, seed, profile)
            if ran is None:  # recorded as it ends: a stop or a crash of the node loses no run
                started = int(time.time() * 1000)
                run_dir = Path(work_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{child[:12]}-s{seed}"
                run_dir.mkdir(parents=True, exist_ok=True)
                script = run_dir.with_suffix(".py")
                script.write_text(proposal.source)
                result = run(script, profile, data, run_dir, seed=seed, on_event=on_event)
                ran = result, record_run(
                    ledger, result, parent=head.sha256, child=child, outcome=result.outcome,
                    description=proposal.description, started=started,
                    selected=bool(runs) and not calibrating,
                )  # fmt: skip
            runs.append(ran)
            result = ran[0]
            if result.outcome != "ok" or result.val_bpb is None:
                break
            pairs.append((seed, result.val_bpb, parents[seed]))
        first = runs[0][0]
        last = runs[-1][0]
        if last.outcome == "void":  # the harness refused to score it: nothing to weigh
            outcome, pairs = "void", []
        elif last.outcome != "ok" or last.val_bpb is None:
            outcome, pairs = "crash", []
        else:
            outcome = "keep" if _gain(pairs) > margin(len(pairs)) else "discard"
        reported = last if outcome in ("void", "crash") else first  # the run that says why
        body = wire.result_body_from_run(
            reported.as_dict(), parent=head.sha256, diff=diff.encode(),
            description=proposal.description, keep=outcome == "keep", pairs=pairs,
        )  # fmt: skip
        fact = ledger.publish(me, "result", body)
        ledger.settle_runs([row for _, row in runs], outcome, fact.id)
    finally:
        if crew is not None:
            crew.drop(*key)
    score = statistics.fmean(c for _, c, _ in pairs) if pairs else None
    new_head = Head(proposal.source, score) if outcome == "keep" and score is not None else head
    return Step(
        outcome, new_head, proposal.description, reported.error or "", first, fact, tuple(pairs)
    )


def _unsettled_runs(ledger: Ledger, head: str, profile: Profile, where: str = "", args=()):
    """This node's research runs on `head` of experiments it never published (it stopped between
    the runs of one step), the latest first; `where`, `args`: more conditions."""
    return ledger.rows(
        "SELECT id, child, description, log_path FROM runs WHERE parent = ? AND child != parent "
        "AND profile = ? AND harness = ? AND fact_id IS NULL AND description NOT LIKE ?"
        f"{where} ORDER BY id DESC",
        (head, profile.name, _harness(profile), VERIFY_RUN + "%", *args),
    )


def _unsettled(ledger: Ledger, head: Head, profile: Profile, crew: Crew | None) -> Proposal | None:
    """The experiment on `head` this node began and never finished, unless another worker of
    the node has it in hand: resumed first, its runs so far reused (`_run_before`)."""
    for row in _unsettled_runs(ledger, head.sha256, profile):
        version = ledger.version(row["child"])
        if version is None:
            continue
        source = version.decode()
        try:  # a version this release's policy refuses is left alone
            check_source(source)
        except AgentError:
            continue
        diff = diff_hash(normalise_diff(make_diff(head.source, source)))
        if crew is None or not crew.has("try", head.sha256, diff):
            return Proposal(row["description"], source)
    return None


def _run_before(
    ledger: Ledger, head: str, child: str, seed: int, profile: Profile
) -> tuple[RunResult, int] | None:
    """This node's run of `child` on `seed` for an experiment on `head` it never finished, and
    its row: the runner's own record of it (result.json), else None."""
    for row in _unsettled_runs(ledger, head, profile, " AND child = ? AND seed = ?", (child, seed)):
        try:
            saved = json.loads((Path(row["log_path"]).parent / "result.json").read_text())
            return RunResult(**saved), row["id"]
        except (OSError, TypeError, ValueError):
            continue
    return None


def _gain(pairs: Sequence[tuple[int, float, float]]) -> float:
    """The mean paired gain: head minus child, over the seeds both ran on."""
    return statistics.fmean(parent - child for _, child, parent in pairs)
