"""The swarm's adoption rule, as pure functions over facts: which claims the pooled evidence
verifies (`node.evidence`), and the one head every "best" in the project means. No I/O, no
clock, no randomness: two nodes that hold the same facts agree, whatever order they came in.

A version's score is its parent's score minus its claim's verified gain, from the campaign's
baseline (score 0); a claimed val_bpb never ranks anything. Never import anything with side
effects here.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from node import committees, evidence, merges
from node.evidence import Judgement

# Seeds across the committee after which an open claim is left unproven: LOOK_BUDGET at quorum 1,
# and LOOK_BUDGET_PER_QUORUM more per extra peer the test must pass without.
LOOK_BUDGET = 16
LOOK_BUDGET_PER_QUORUM = 8
# A claim whose verified gain lies far outside what its profile has seen is held for extra
# seeds before anyone builds on it: a cheat that evades the harness reproduces under every
# re-run, but each re-run repeats the harness's randomized checks on fresh validation rows, so
# more looks give more chances to catch it, and a held claim is visible to people. Kept gains
# in autoresearch's measured history span 3x (0.15 to 0.45 sigma of seed noise), so a gain
# beyond 3x the largest ever verified on a profile lies outside that whole range; a false hold
# costs a few more looks, never a refusal.
HOLD_FACTOR = 3.0
HOLD_LOOKS = 3  # seeds, from peers not its author, that a held claim needs
# Before any gain is verified on a profile, the size of gain expected there, in paired sigmas:
# what a node's keep margin lets through (2 sigmas on one seed, 1.4 on the mean of two).
PRIOR_GAIN_SIGMAS = 2.0
HELD = "held"  # the state of a claim the evidence verifies but the hold keeps waiting
UNPROVEN = "unproven"  # an open claim with its look budget spent: nobody looks again
# Verdicts no noise explains: the harness refused the re-run, or the replay of the author's own
# run gave another score than it signed.
DISQUALIFYING = frozenset({"void", "misreported"})
_RESULT_COLUMNS = ("id", "author", "profile", "harness", "parent", "child", "outcome")
_LOOK_COLUMNS = ("result", "author", "verdict", "profile", "harness", "delta", "seed")


@dataclass(frozen=True)
class Rules:
    """What a campaign fixes for judging claims on one profile, the same on every node."""

    quorum: int = 1  # peers other than the author the test must pass without, plus one
    sigma: float = 0.002  # the profile's paired noise: the test's floor on the noise
    tolerance: float = 0.002  # how far a replay of the author's seed may land from its score
    members: frozenset[str] | None = None  # the campaign file's members; None: an open campaign
    committee: int = 0  # verifiers drawn per claim from the members; 0: 2 * quorum + 1, >= 3
    # Members the organiser invited after the file was made: (peer id, time of the invitation).
    invited: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.quorum < 1:
            raise ValueError("quorum must be at least 1: a result cannot verify itself")

    @classmethod
    def of(cls, profile: Any, quorum: int = 1, members: Collection[str] | None = None) -> Rules:
        """The rules for a trainer `Profile` (its paired noise and replay tolerance)."""
        return cls(quorum, profile.paired_noise, profile.replay_tolerance,
                   None if members is None else frozenset(members))  # fmt: skip

    def members_for(self, claim: Mapping[str, Any]) -> frozenset[str] | None:
        """The members a claim is judged by: the file's, and those invited before the claim was
        made (its signed time), so that an invitation never redraws the committee of a claim
        already made. None: an open campaign."""
        if self.members is None or not self.invited:
            return self.members
        return self.members | {peer for peer, since in self.invited if since <= claim["time"]}

    @property
    def committee_size(self) -> int:
        return self.committee or max(3, 2 * self.quorum + 1)

    @property
    def look_budget(self) -> int:
        """Seeds after which an open claim is left unproven (`UNPROVEN`)."""
        return LOOK_BUDGET + LOOK_BUDGET_PER_QUORUM * (self.quorum - 1)


@dataclass(frozen=True)
class Score:
    """A version reached from the baseline through verified claims."""

    version: str
    score: float  # minus the verified gains from the baseline to here (bpb); the baseline: 0
    se: float  # its standard error: the claims' errors, added in quadrature
    via: str | None = None  # the claim (result id) that made it; None for the baseline
    parent: str | None = None
    steps: int = 0  # verified claims from the baseline


def rows_from_facts(facts: Iterable[Any]) -> tuple[list[dict], list[dict]]:
    """(results, verifications) as the flat rows the functions here read, from `wire.Fact`s."""
    results, verifications = [], []
    for f in facts:
        row = {"id": f.id, "author": f.peer_id, "time": f.time, **f.body}
        if f.kind == "result":
            row["val_bpb"] = f.body["metrics"]["val_bpb"]
            results.append(row)
        elif f.kind == "verification":
            verifications.append(row)
    return results, verifications


def _check_columns(rows: list[Mapping[str, Any]], columns: Sequence[str], what: str) -> None:
    if rows:
        missing = [c for c in columns if c not in rows[0]]
        if missing:
            raise ValueError(f"a {what} row lacks the column(s) {', '.join(missing)}")


def judge_claim(
    claim: Mapping[str, Any], looks: Iterable[Mapping[str, Any]], rules: Rules,
    silenced: Collection[str] = (), order: Sequence[str] | None = None,
    suspects: Collection[str] = (),
) -> Judgement:  # fmt: skip
    """One claim's judgement from its own looks alone, those that count: by a peer other than
    its author and not `silenced`, with the same harness and profile (another harness measures
    another thing), and, in a campaign with members, by the claim's committee, its seats drawn
    without the `silenced` peers (`committees.panel`); every member's look, a silenced one's
    too, is cross-checked against the others' on its seed (`evidence.cross_check`), so that any
    member's replay can expose a look no run stands behind, and which peers it contradicts does
    not depend on `silenced`. The evidence's state (`evidence.judge`), UNPROVEN when it is open
    with `rules.look_budget` seeds behind it (a gain too small to tell from noise, if any: a
    change of no gain is refuted only after some 30 seeds, so verifiers stop before). What
    depends on other claims (the hold) is `settle`'s: a ledger can keep this per claim and
    update it at every look. `order`: the claim's `committees.ranking`, where the caller has it.
    A claim whose author is one of the `suspects` (`consensus.suspects`) verifies only once a
    replay of its author's seed backs its numbers."""
    members, size = rules.members_for(claim), rules.committee_size
    order = order if order is not None or members is None else committees.ranking(claim, rules)
    seats = None if order is None else committees.seated(order, silenced, size)
    reports = [
        v for v in looks
        if v["author"] != claim["author"]
        and v["harness"] == claim["harness"] and v["profile"] == claim["profile"]
        and (members is None or v["author"] in members)
    ]  # fmt: skip
    counted = [v for v in reports if v["author"] not in silenced
               and (seats is None or v["author"] in seats)]  # fmt: skip
    j = evidence.judge(claim, counted, quorum=rules.quorum, sigma=rules.sigma,
                       tolerance=rules.tolerance, reports=reports,
                       suspect=claim["author"] in suspects)  # fmt: skip
    if j.state == "open" and j.seeds >= rules.look_budget and not j.disputed:
        j = dataclasses.replace(j, state=UNPROVEN, reason=f"unproven: {j.reason}")
    return j if seats is None else dataclasses.replace(j, seats=seats)


def _side(state: str) -> int:
    """+1 for a win (verified or held), -1 for a loss (refuted), 0 for anything else."""
    return 1 if state in ("verified", HELD) else -1 if state == "refuted" else 0


def unchecked_side(
    claim: Mapping[str, Any],
    looks: Iterable[Mapping[str, Any]],
    rules: Rules,
    silenced: Collection[str] = (),
) -> int:
    """+1 when the looks verify (or hold) a claim that the looks of the peers a replay
    corroborated alone (`evidence.cross_check`) would not; -1 when they refute a claim that its
    author's signed gain contradicts (`Judgement.author_z` past `evidence.OUTLIER_Z`) and those
    looks alone would not; 0 otherwise. Then a replay of the seeds on that side is due: a look
    no run stands behind is found that way, whichever size of gain or loss it shows, whether it
    makes up a win or refutes an honest one. A refutation that its author's numbers do not
    contradict (most: a lucky seed of a change of no gain) needs no replay."""
    looks = list(looks)
    judged = judge_claim(claim, looks, rules, silenced)
    side = _side(judged.state)
    contradicts = judged.author_z is not None and judged.author_z > evidence.OUTLIER_Z
    if not side or (side < 0 and not contradicts):
        return 0
    reports = [v for v in looks if v["author"] != claim["author"]]
    agreed = evidence.cross_check(reports, rules.tolerance).agreed
    checked = [v for v in looks if v["author"] in agreed]
    return 0 if _side(judge_claim(claim, checked, rules, silenced).state) == side else side


def judge_claims(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    rules: Rules,
    silenced: Collection[str] = (),
) -> dict[str, Judgement]:
    """{result id: its judgement} for every kept result given (`judge_claim`, then `settle`),
    the looks of the peers a replay contradicted anywhere (`contradicted`) left out everywhere,
    and the claims of the peers replays caught anywhere (`suspects`) verified only once a
    replay of their own seed backs them.

    `results` carry id, author, profile, harness, parent, child, outcome (and child_scores,
    parent_scores, device for replays and the author's own look); `verifications` carry result,
    author, verdict, profile, harness, delta, seed (and replay_val_bpb, device)."""
    kept = [r for r in results if r["outcome"] == "keep"]
    looks = list(verifications)
    _check_columns(kept, _RESULT_COLUMNS, "result")
    _check_columns(looks, _LOOK_COLUMNS, "verification")
    by_id = {r["id"]: r for r in kept}
    per_claim: dict[str, list[Mapping[str, Any]]] = {rid: [] for rid in by_id}
    for v in looks:
        if v["result"] in per_claim:
            per_claim[v["result"]].append(v)
    judged = {
        rid: judge_claim(by_id[rid], per_claim[rid], rules, silenced) for rid in sorted(by_id)
    }
    out = contradicted(judged)
    if out - set(silenced):  # a contradicted peer's looks count on no claim, nor its seat
        silenced = frozenset(silenced) | out
        for rid in sorted(by_id):
            if any(v["author"] in out for v in per_claim[rid]) or (
                out & (committees.panel(by_id[rid], rules) or set())
            ):
                judged[rid] = judge_claim(by_id[rid], per_claim[rid], rules, silenced)
    caught = suspects(judged, by_id)  # judging again changes none of this set
    for rid in sorted(by_id):
        if by_id[rid]["author"] in caught and judged[rid].state == "verified":
            judged[rid] = judge_claim(by_id[rid], per_claim[rid], rules, silenced, None, caught)
    return settle(judged, by_id)


def contradicted(judged: Mapping[str, Judgement]) -> frozenset[str]:
    """The peers whose signed look a replay contradicted, on any claim: a look no run stands
    behind is no noise, so such a peer's looks count on no claim (`judge_claims`)."""
    return frozenset(peer for j in judged.values() for peer in j.contradicted)


def suspects(
    judged: Mapping[str, Judgement], by_id: Mapping[str, Mapping[str, Any]]
) -> frozenset[str]:
    """The peers that replays caught signing scores no run of theirs stands behind, on any
    claim: the peers whose looks were contradicted (`contradicted`: a majority of a seed's
    reports), and the authors of claims found misreported (by the replays of at least two
    peers: `evidence.disqualifying`). Their other claims' numbers are no longer taken at their
    word: each verifies only once a replay of its author's seed gives them, so that a liar's
    claims that nobody replayed yet fall with those that were."""
    caught = {by_id[rid]["author"] for rid, j in judged.items() if j.state == "misreported"}
    return contradicted(judged) | caught


def settle(
    judged: Mapping[str, Judgement], by_id: Mapping[str, Mapping[str, Any]]
) -> dict[str, Judgement]:
    """The claims' judgements with the outlier hold applied across them: a verified claim whose
    gain lies beyond HOLD_FACTOR times the largest verified on its profile and harness (or that
    would be its first) is HELD until HOLD_LOOKS seeds stand behind it; a merge or a bundle is
    HELD while a version it carries was made by no verified claim (`merges.unsupported`: one
    revoked after it was merged takes its merges out of the lineage). Only verified claims are
    read, so a caller may give those alone."""
    out = _hold(dict(judged), by_id)
    verified = {rid: by_id[rid] for rid, j in out.items() if j.state == "verified"}
    for rid, version in merges.unsupported(verified).items():
        out[rid] = dataclasses.replace(out[rid], state=HELD, reason=merges.held_reason(version))
    return out


def _hold(
    judged: dict[str, Judgement], by_id: Mapping[str, Mapping[str, Any]]
) -> dict[str, Judgement]:
    """Per profile and harness, the scale is the largest gain among the claims verified with
    HOLD_LOOKS seeds, raised by every verified gain within HOLD_FACTOR of it, in ascending order
    (a fixed point); a verified claim beyond it, with fewer seeds, is held."""
    groups: dict[tuple[str, str], list[str]] = {}
    for rid, j in judged.items():
        if j.state == "verified":
            groups.setdefault((by_id[rid]["profile"], by_id[rid]["harness"]), []).append(rid)
    for (profile, _), claims in groups.items():
        anchored = [judged[rid].gain for rid in claims if judged[rid].seeds >= HOLD_LOOKS]
        record = max((g for g in anchored if g is not None and g > 0), default=None)
        for gain in sorted(g for rid in claims if (g := judged[rid].gain) is not None):
            if record is not None and record < gain <= HOLD_FACTOR * record:
                record = gain
        for rid in claims:
            j = judged[rid]
            within = record is not None and j.gain is not None and j.gain <= HOLD_FACTOR * record
            if not (within or j.seeds >= HOLD_LOOKS):
                judged[rid] = dataclasses.replace(
                    j, state=HELD, reason=_held_reason(profile, j, record)
                )
    return judged


def gain_scale(judged: Mapping[str, Judgement], sigma: float) -> float:
    """The size of gain verified on a profile (`judged`: its claims' judgements): the largest
    verified, or PRIOR_GAIN_SIGMAS of its paired noise `sigma` before any."""
    return max(
        (j.gain for j in judged.values() if j.state == "verified" and j.gain),
        default=PRIOR_GAIN_SIGMAS * sigma,
    )


def _held_reason(profile: str, j: Judgement, record: float | None) -> str:
    needs = f"needs {HOLD_LOOKS} seeds from its verifiers, has {j.seeds}"
    if record is None:
        return f"held: gain {j.gain:.4f} is the first verified on {profile}, which sets the scale; {needs}"
    return (
        f"held: gain {j.gain:.4f} is {j.gain / record:.3g}x the largest verified on {profile} "
        f"({record:.4f}); {needs}"
    )


def _in_state(judged: Mapping[str, Judgement], *states: str) -> dict[str, Judgement]:
    return {rid: j for rid, j in judged.items() if j.state in states}


def verified_children(
    results: Iterable[Mapping[str, Any]], verifications: Iterable[Mapping[str, Any]], rules: Rules
) -> dict[str, set[str]]:
    """{result id: the peers whose looks verified it}, for the verified claims only."""
    judged = judge_claims(results, verifications, rules)
    return {rid: set(j.peers) for rid, j in _in_state(judged, "verified").items()}


def lineage_scores(
    results: Iterable[Mapping[str, Any]],
    judged: Mapping[str, Judgement],
    baseline: str,
    reach: Callable[[Mapping[str, Any]], bool] | None = None,
) -> dict[str, Score]:
    """{version: its score} for every version reached from `baseline` through verified claims
    (those `reach` accepts, when given): the lowest score over the paths that reach it, ties to
    the fewer steps and then the lower claim id. Parent links may loop: every verified gain is
    positive, so the lowest score is a shortest path."""
    edges: dict[str, list[tuple[Mapping[str, Any], Judgement]]] = {}
    for r in results:
        j = judged.get(r["id"])
        if (
            j is not None
            and j.state == "verified"
            and j.gain is not None
            and (reach is None or reach(r))
        ):
            edges.setdefault(r["parent"], []).append((r, j))
    best = {baseline: Score(baseline, 0.0, 0.0)}
    queue = [(0.0, 0, "", baseline)]
    done = set()
    while queue:
        _, _, _, version = heapq.heappop(queue)
        if version in done:
            continue
        done.add(version)
        here = best[version]
        for r, j in sorted(edges.get(version, ()), key=lambda e: e[0]["id"]):
            child = r["child"]
            step = Score(child, here.score - j.gain, math.hypot(here.se, j.se or 0.0), r["id"],
                         version, here.steps + 1)  # fmt: skip
            held = best.get(child)
            if child not in done and (
                held is None
                or (step.score, step.steps, step.via) < (held.score, held.steps, held.via or "")
            ):
                best[child] = step
                heapq.heappush(queue, (step.score, step.steps, step.via, child))
    return best


def head_of(scores: Mapping[str, Score]) -> str:
    """The best version: the lowest score, ties to the lower hash."""
    return min(scores.values(), key=lambda s: (s.score, s.version)).version


def versions_of(
    results: Iterable[Mapping[str, Any]], profile: str, harness: str | None = None
) -> list[Mapping[str, Any]]:
    """The kept results of `profile` measured with `harness` (None: any): all a head reads."""
    return [r for r in results if r["profile"] == profile and r["outcome"] == "keep"
            and (harness is None or r["harness"] == harness)]  # fmt: skip


def standings(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    profile: str,
    baseline: str,
    rules: Rules,
    harness: str | None = None,
    reach: Callable[[Mapping[str, Any]], bool] | None = None,
    silenced: Collection[str] = (),
) -> tuple[dict[str, Score], dict[str, Judgement]]:
    """(the scores of the versions reached, every claim's judgement) on `profile`. `reach`, when
    given, names the only results the head is reached through (a node without a sandbox: those
    of the authors it trusts); which claims are verified is still judged from all of them, so
    that the outlier hold weighs a claim against every verified gain of its profile."""
    kept = versions_of(results, profile, harness)
    judged = judge_claims(
        kept, [v for v in verifications if v["profile"] == profile], rules, silenced
    )
    return lineage_scores(kept, judged, baseline, reach), judged


def best_head(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    profile: str,
    baseline: str,
    rules: Rules,
    harness: str | None = None,
    reach: Callable[[Mapping[str, Any]], bool] | None = None,
    silenced: Collection[str] = (),
) -> str:
    """The best train.py (sha256) of `profile`: the lowest score among the versions reached from
    the campaign's `baseline` through verified claims; the baseline while nothing verified
    descends from it. See `standings`."""
    return head_of(
        standings(results, verifications, profile, baseline, rules, harness, reach, silenced)[0]
    )
