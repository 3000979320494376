"""The swarm's adoption rule, as pure functions over facts: no I/O, no clock, no randomness.

Every node applies the same rule to the same facts, so two nodes that hold the same facts agree,
whatever order the facts arrived in. Never import anything with side effects here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from node.errors import SwarmError

DEFAULT_K = 2.0  # noise margin: this many standard deviations of the node's own baseline runs
DEFAULT_FLOOR = 0.001  # bpb; below this, a margin from few runs is luck, not a measurement
MAX_LOOKS = 3  # a verifier's runs of one claim while its verdict is inconclusive, at most


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


def _voters(
    results: Mapping[str, Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    verdict: str,
) -> dict[str, set[str]]:
    """{result id: distinct peers other than its author whose `verdict` counts for it}."""
    voters: dict[str, set[str]] = {}
    for v in verifications:
        r = results.get(v["result"])
        if (
            r is not None
            and v["verdict"] == verdict
            and v["author"] != r["author"]
            and v["harness"] == r["harness"]  # a different harness measures a different thing
            and v["profile"] == r["profile"]
        ):
            voters.setdefault(r["id"], set()).add(v["author"])
    return voters


def verified_children(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    quorum: int = 1,
) -> dict[str, set[str]]:
    """The results confirmed by at least `quorum` distinct peers other than their author, and by
    more such peers than refute them. A refutation says "no gain beyond my noise", so one noisy
    refutation does not outweigh two confirmations; a tie is not verified (it waits for more
    verifiers).

    `results` carry id, author, profile and harness; `verifications` carry result, author,
    verdict, profile and harness. A verdict counts only when measured with the same harness and
    profile as the result. A crash or an inconclusive verdict counts neither way. Returns {result id: the peers
    whose confirmations count}, for the verified results only.
    """
    if quorum < 1:
        raise ValueError("quorum must be at least 1: a result cannot verify itself")
    by_id = {r["id"]: r for r in results}
    verifications = list(verifications)
    confirmers = _voters(by_id, verifications, "confirm")
    refuters = _voters(by_id, verifications, "refute")
    return {
        rid: peers
        for rid, peers in confirmers.items()
        if len(peers) >= quorum and len(peers) > len(refuters.get(rid, ()))
    }


def refuted_claims(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    quorum: int = 1,
) -> set[str]:
    """The results refuted by at least `quorum` distinct peers other than their author, with
    the same harness and profile, and by at least as many of them as confirm: settled as no
    win (verifiers stop spending runs on them) until more confirmations come."""
    by_id = {r["id"]: r for r in results}
    verifications = list(verifications)
    confirmers = _voters(by_id, verifications, "confirm")
    refuters = _voters(by_id, verifications, "refute")
    return {
        rid
        for rid, peers in refuters.items()
        if len(peers) >= quorum and len(peers) >= len(confirmers.get(rid, ()))
    }


def best_head(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    profile: str,
    baseline: str,
    quorum: int = 1,
    harness: str | None = None,
) -> str:
    """The best train.py (sha256) of `profile`: the lowest verified val_bpb among the versions
    reached from the campaign's `baseline` through verified kept results only; ties go to the
    lower hash. The baseline itself while nothing verified descends from it.

    `harness`, when given, leaves out results measured with any other harness.
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
        if r["id"] in verified:
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


def noise_margin(
    baseline_runs: Sequence[float], k: float = DEFAULT_K, floor: float = DEFAULT_FLOOR
) -> float:
    """The smallest gain this node believes: `k` sample standard deviations of its own repeated
    baseline val_bpb on the profile, and never less than `floor`."""
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
    parent by more than the margin (never "lower by any amount"); crash when it has no score."""
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

    `earlier_gains` are the gains (parent minus child) of the verifier's earlier looks at the
    same claim, each with its own seed, all inconclusive. Then the verdict weighs the mean of
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
