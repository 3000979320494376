"""The swarm's adoption rule, as pure functions over facts: no I/O, no clock, no randomness.

Every node applies the same rule to the same facts, so two nodes that hold the same facts agree,
whatever order the facts arrived in. Never import anything with side effects here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from node.errors import SwarmError

DEFAULT_K = 2.0  # noise margin: this many standard deviations of a paired difference
DEFAULT_FLOOR = 0.001  # bpb; below this, a margin from few runs is luck, not a measurement
PRIOR_DF = 2  # the profile's prior noise weighs as much as this many degrees of freedom
MAX_LOOKS = 3  # a verifier's runs of one claim while its verdict is inconclusive, at most


# A claim whose verified gain lies far outside what its profile has seen is held for extra
# looks before anyone builds on it: a cheat that evades the harness reproduces under every
# re-run, but each re-run repeats the harness's randomized checks on fresh validation rows, so
# more looks give more chances to catch it, and a held claim is visible to people. The
# simulator's landscape, calibrated to autoresearch's measured history, has kept gains of 0.15
# to 0.45 sigma of seed noise: 3x from the smallest real gain to the largest. A gain beyond 3x
# the largest ever verified on a profile lies outside that whole range; a false hold costs two
# more looks, never a refusal.
HOLD_FACTOR = 3.0
HOLD_LOOKS = 3  # confirming looks a held claim needs: by peers not its author, each a fresh seed
# When a peer gave several verdicts on one claim, the one that counts: the strongest against it.
# A verifier looks again at a claim it judged only after confirming it (a held claim), so a later
# void or refute revises that confirmation; a crash on a second look does not undo one.
_PRECEDENCE = {
    "misreported": 5,
    "void": 4,
    "refute": 3,
    "confirm": 2,
    "crash": 1,
    "inconclusive": 0,
}
# Verdicts no noise explains: the harness refused the re-run, or the replay of the author's own
# run gave another score than it signed.
DISQUALIFYING = frozenset({"void", "misreported"})
_LOOK_COLUMNS = ("delta", "seed")  # what the hold reads of each verification row


class ConsensusError(SwarmError):
    """A question the rule cannot answer from what it was given (too few runs, no parent score)."""


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


def _counted(
    results: Mapping[str, Mapping[str, Any]], verifications: Iterable[Mapping[str, Any]]
) -> Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(result, verification) for every verdict that counts: by a peer other than the result's
    author, measured with the same harness and profile (another harness measures another thing)."""
    for v in verifications:
        r = results.get(v["result"])
        if (
            r is not None
            and v["author"] != r["author"]
            and v["harness"] == r["harness"]
            and v["profile"] == r["profile"]
        ):
            yield r, v


def peer_verdicts(
    results: Iterable[Mapping[str, Any]], verifications: Iterable[Mapping[str, Any]]
) -> dict[str, dict[str, str]]:
    """{result id: {peer: its verdict}} over the verdicts that count, one per peer: of several,
    the strongest against the claim (void, refute, confirm, crash, inconclusive)."""
    by_id = {r["id"]: r for r in results}
    votes: dict[str, dict[str, str]] = {}
    for r, v in _counted(by_id, verifications):
        peers = votes.setdefault(r["id"], {})
        held = peers.get(v["author"])
        if held is None or _PRECEDENCE.get(v["verdict"], -1) > _PRECEDENCE.get(held, -1):
            peers[v["author"]] = v["verdict"]
    return votes


def _tally(peers: Mapping[str, str]) -> tuple[set[str], int, int]:
    """(confirmers, how many found no win: refute, void or misreported, how many found it void
    or misreported)."""
    confirmers = {p for p, v in peers.items() if v == "confirm"}
    disqualified = sum(v in DISQUALIFYING for v in peers.values())
    return confirmers, disqualified + sum(v == "refute" for v in peers.values()), disqualified


def _with_looks(verifications: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    rows = list(verifications)
    for v in rows:
        missing = [c for c in _LOOK_COLUMNS if c not in v]
        if missing:
            raise ValueError(
                f"a verification row lacks the column(s) {', '.join(missing)}: select delta and "
                "seed with every verdict, since the outlier hold weighs the gain each verifier "
                "measured on each of its looks"
            )
    return rows


def _judge(
    results: Iterable[Mapping[str, Any]], verifications: Iterable[Mapping[str, Any]], quorum: int
) -> tuple[dict[str, set[str]], dict[str, str]]:
    """(verified: {result id: its counted confirmers}, held: {result id: why it waits}).

    A claim meets the quorum's rule when at least `quorum` peers confirm it, more than find no
    win (refute or void), and fewer than `quorum` found it void. Of those, per profile and
    harness, a claim with HOLD_LOOKS confirming looks is verified, and so is any claim whose
    gain is at most HOLD_FACTOR times the largest gain verified (the fixed point: each claim
    verified may raise the scale); any other is held, the first win of a profile too (it sets
    the scale). A claim's gain is the median over its confirmers of each one's mean gain
    (-delta) on its confirming looks; a claim whose confirmations carry no delta has no known
    gain: it is verified by its looks alone and never sets the scale."""
    if quorum < 1:
        raise ValueError("quorum must be at least 1: a result cannot verify itself")
    by_id = {r["id"]: r for r in results}
    verifications = _with_looks(verifications)
    meets: dict[str, set[str]] = {}
    for rid, peers in peer_verdicts(by_id.values(), verifications).items():
        confirmers, against, void = _tally(peers)
        if len(confirmers) >= quorum and len(confirmers) > against and void < quorum:
            meets[rid] = confirmers
    looks: dict[str, dict[str, dict[int, float | None]]] = {}  # rid -> peer -> seed -> gain
    for r, v in _counted(by_id, verifications):
        if v["verdict"] == "confirm" and v["author"] in meets.get(r["id"], ()):
            delta = v["delta"]
            gain = -delta if isinstance(delta, (int, float)) and math.isfinite(delta) else None
            seen = looks.setdefault(r["id"], {}).setdefault(v["author"], {})
            old = seen.get(v["seed"])  # a look again on the same seed is the same look
            seen[v["seed"]] = gain if old is None or (gain is not None and gain > old) else old
    groups: dict[tuple[str, str], list[str]] = {}
    gains: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for rid in meets:
        means = [
            statistics.fmean(known)
            for seen in looks.get(rid, {}).values()
            if (known := [g for g in seen.values() if g is not None])
        ]
        gains[rid] = statistics.median(means) if means else None
        counts[rid] = sum(len(seen) for seen in looks.get(rid, {}).values())
        groups.setdefault((by_id[rid]["profile"], by_id[rid]["harness"]), []).append(rid)
    verified: dict[str, set[str]] = {}
    held: dict[str, str] = {}
    for (profile, _), claims in groups.items():
        # The scale: the largest positive gain among the claims verified by their looks, raised
        # by every known gain within HOLD_FACTOR of it, in ascending order (a fixed point).
        anchored = [gains[rid] for rid in claims if counts[rid] >= HOLD_LOOKS]
        record = max((g for g in anchored if g is not None and g > 0), default=None)
        for gain in sorted(g for rid in claims if (g := gains[rid]) is not None):
            if record is not None and record < gain <= HOLD_FACTOR * record:
                record = gain
        for rid in claims:
            gain = gains[rid]
            within = record is not None and gain is not None and gain <= HOLD_FACTOR * record
            if within or counts[rid] >= HOLD_LOOKS:
                verified[rid] = meets[rid]
            else:
                held[rid] = _held_reason(profile, gain, record, counts[rid])
    return verified, held


def _held_reason(profile: str, gain: float | None, record: float | None, looks: int) -> str:
    needs = f"needs {HOLD_LOOKS} confirming looks, has {looks}"
    if gain is None:
        return f"held: its confirmations carry no measured gain; {needs}"
    if record is None:
        return (
            f"held: gain {gain:.4f} is the first verified on {profile}, which sets the scale; "
            f"{needs}"
        )
    return (
        f"held: gain {gain:.4f} is {gain / record:.3g}x the largest verified on {profile} "
        f"({record:.4f}); {needs}"
    )


def verified_children(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    quorum: int = 1,
) -> dict[str, set[str]]:
    """The results confirmed by at least `quorum` distinct peers other than their author, by
    more such peers than find no win (refute or void), found void by fewer than `quorum`, and
    not held as outliers (see `held_claims`). A refutation says "no gain beyond my noise", so
    one noisy refutation does not outweigh two confirmations; a tie is not verified (it waits
    for more verifiers). A void says the harness refused the verifier's re-run of the child:
    confirmations never outvote a quorum of those.

    `results` carry id, author, profile and harness; `verifications` carry result, author,
    verdict, profile, harness, delta and seed (a ValueError names a missing column). A verdict
    counts only when measured with the same harness and profile as the result. A crash or an
    inconclusive verdict counts neither way. Returns {result id: the peers whose confirmations
    count}, for the verified results only.
    """
    return _judge(results, verifications, quorum)[0]


def held_claims(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    quorum: int = 1,
) -> dict[str, str]:
    """{result id: why it is held}: the claims that meet the quorum's rule but whose gain lies
    beyond HOLD_FACTOR times the largest verified on their profile (or that would be its first
    verified win), still short of HOLD_LOOKS confirming looks. Not verified, not refuted."""
    return _judge(results, verifications, quorum)[1]


def refuted_claims(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    quorum: int = 1,
) -> set[str]:
    """The results that at least `quorum` distinct peers other than the author found no win
    (refute, or void: the harness refused the re-run), with the same harness and profile, and
    at least as many of them as confirm: settled as no win (verifiers stop spending runs on
    them) until more confirmations come."""
    out = set()
    for rid, peers in peer_verdicts(results, verifications).items():
        confirmers, against, _ = _tally(peers)
        if against >= quorum and against >= len(confirmers):
            out.add(rid)
    return out


def best_head(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    profile: str,
    baseline: str,
    quorum: int = 1,
    harness: str | None = None,
    reach: Callable[[Mapping[str, Any]], bool] | None = None,
) -> str:
    """The best train.py (sha256) of `profile`: the lowest verified val_bpb among the versions
    reached from the campaign's `baseline` through verified kept results only; ties go to the
    lower hash. The baseline itself while nothing verified descends from it.

    `harness`, when given, leaves out results measured with any other harness. `reach`, when
    given, names the only results the head is reached through (a node without a sandbox: those
    of the authors it trusts); which results are verified is still judged from all of them, so
    that the outlier hold weighs a claim against every verified gain of its profile.
    """
    kept = [
        r
        for r in results
        if r["profile"] == profile
        and r["outcome"] == "keep"
        and r["val_bpb"] is not None
        and math.isfinite(r["val_bpb"])
        and (harness is None or r["harness"] == harness)
    ]
    verified = verified_children(kept, verifications, quorum)
    by_parent: dict[str, list[Mapping[str, Any]]] = {}
    for r in kept:
        if r["id"] in verified and (reach is None or reach(r)):
            by_parent.setdefault(r["parent"], []).append(r)
    reached, frontier = {baseline}, [baseline]
    while frontier:
        for r in by_parent.get(frontier.pop(), ()):
            if r["child"] not in reached:
                reached.add(r["child"])
                frontier.append(r["child"])
    candidates = [
        (r["val_bpb"], r["child"])
        for parent in reached
        for r in by_parent.get(parent, ())
        if r["child"] != baseline
    ]
    return min(candidates)[1] if candidates else baseline


def paired_noise(
    differences: Mapping[Any, Sequence[float]], prior: float, prior_df: int = PRIOR_DF
) -> tuple[float, int]:
    """(standard deviation of one paired difference, degrees of freedom behind it).

    `differences`: for each pair measured (a parent and a child), child minus parent on each
    seed both ran on. The spread of one pair's differences around their mean is noise alone
    (the change's true effect is the same on every seed), so the estimate pools those spreads
    over every pair with two seeds or more; `prior` (the profile's) weighs as `prior_df`
    degrees of freedom, so that the first few pairs move it and many pairs replace it."""
    squares, df = prior_df * prior**2, 0
    for diffs in differences.values():
        values = [d for d in diffs if d is not None and math.isfinite(d)]
        if len(values) >= 2:
            mean = statistics.fmean(values)
            squares += sum((d - mean) ** 2 for d in values)
            df += len(values) - 1
    return math.sqrt(squares / (prior_df + df)) if prior_df + df else prior, df


def margin_for(
    sigma: float, runs: int = 1, k: float = DEFAULT_K, floor: float = DEFAULT_FLOOR
) -> float:
    """The smallest mean gain over `runs` paired seeds this node believes: `k` standard errors
    of that mean, and never less than `floor`."""
    return max(floor, k * sigma / math.sqrt(max(runs, 1)))


def noise_margin(
    baseline_runs: Sequence[float], k: float = DEFAULT_K, floor: float = DEFAULT_FLOOR
) -> float:
    """The margin of the unpaired rule (the simulator's): `k` sample standard deviations of
    repeated baseline val_bpb, and never less than `floor`. Nodes pair their runs instead
    (`paired_noise`, `margin_for`)."""
    runs = [x for x in baseline_runs if x is not None and math.isfinite(x)]
    if len(runs) < 2:
        raise ConsensusError(
            f"the noise margin needs at least 2 scored baseline runs on the profile, got "
            f"{len(runs)}: run the baseline again with another seed"
        )
    return max(floor, k * statistics.stdev(runs))


def _gain(child_bpb: float | None, parent_bpb: float | None) -> float | None:
    if parent_bpb is None or not math.isfinite(parent_bpb):
        raise ConsensusError(
            "no score for the parent on this machine: run the parent before judging a child"
        )
    if child_bpb is None or not math.isfinite(child_bpb):
        return None
    return parent_bpb - child_bpb


def keep_or_discard(child_bpb: float | None, parent_bpb: float, margin: float) -> str:
    """A node's decision on its own experiment: keep only when the child is lower than the
    parent by more than the margin (never "lower by any amount"); crash when it has no score.
    A run its harness voided is the caller's to publish as void: it has no score to weigh."""
    gain = _gain(child_bpb, parent_bpb)
    if gain is None:
        return "crash"
    return "keep" if gain > margin else "discard"


def verdict(
    child_bpb: float | None, parent_bpb: float, margin: float, earlier_gains: Sequence[float] = ()
) -> str:
    """A verifier's verdict from its own runs of the child and the parent (its own seed):
    - confirm: the child beats the parent by more than the verifier's margin;
    - refute: the child is no better than the parent at all;
    - inconclusive: better, by no more than the margin, a gain this machine cannot tell from its
      noise. Evidence neither way: on a noisy machine, refuting it would cost an honest author
      its standing for the verifier's noise;
    - crash: the child did not score.
    (The verifier publishes void, never weighed here, when its harness voided the child's run.)

    `earlier_gains` are the gains (parent minus child) of the verifier's earlier looks at the
    same claim, each with its own seed: inconclusive, or confirming when the claim is held for
    more looks (`held_claims`). Then the verdict weighs the mean of
    every look's gain against the margin shrunk by the square root of their number (the noise
    of a mean of n runs), so a real gain smaller than one run's noise is confirmed after a few
    looks, and none is never."""
    gain = _gain(child_bpb, parent_bpb)
    if gain is None:
        return "crash"
    gains = [*earlier_gains, gain]
    mean = statistics.fmean(gains)
    if mean > margin / math.sqrt(len(gains)):
        return "confirm"
    return "refute" if mean <= 0 else "inconclusive"
