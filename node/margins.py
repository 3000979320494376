"""A node's own rule for its runs, as pure functions: the spread of its paired differences (its
noise), the margin a mean gain must beat, its decision on its own experiment, and a verifier's
verdict from its own runs. What the swarm adopts from everyone's looks is `node.consensus`'s.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from node import evidence
from node.errors import SwarmError

DEFAULT_K = 2.0  # a node's own keep margin: this many standard errors of its paired mean gain
DEFAULT_FLOOR = 0.001  # bpb; below this, a margin from few runs is luck, not a measurement
PRIOR_DF = evidence.PRIOR_DF  # the profile's prior noise weighs as much as this many df


class MarginError(SwarmError):
    """A question the rule cannot answer from what it was given (too few runs, no parent score)."""


def paired_noise(
    differences: Mapping[Any, Sequence[float]], prior: float, prior_df: int = PRIOR_DF,
    inert: float = 0.0,
) -> tuple[float, int]:  # fmt: skip
    """(standard deviation of one paired difference, degrees of freedom behind it).

    `differences`: for each pair measured (a parent and a child), child minus parent on each
    seed both ran on. The spread of one pair's differences around their mean is noise alone
    (the change's true effect is the same on every seed), so the estimate pools those spreads
    over every pair with two seeds or more; `prior` (the profile's) weighs as `prior_df`
    degrees of freedom, so that the first few pairs move it and many pairs replace it. A pair
    whose every difference is within `inert` of zero (by default exactly zero: a change the run
    does not see, such as a constant only another profile reads) tells nothing of a change's
    noise and is left out: its zero spread would shrink the estimate."""
    squares, df = prior_df * prior**2, 0
    for diffs in differences.values():
        values = [d for d in diffs if d is not None and math.isfinite(d)]
        if all(abs(d) <= inert for d in values):
            continue
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
        raise MarginError(
            f"the noise margin needs at least 2 scored baseline runs on the profile, got "
            f"{len(runs)}: run the baseline again with another seed"
        )
    return max(floor, k * statistics.stdev(runs))


def _gain(child_bpb: float | None, parent_bpb: float | None) -> float | None:
    if parent_bpb is None or not math.isfinite(parent_bpb):
        raise MarginError(
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
    more looks (`consensus.HELD`). Then the verdict weighs the mean of
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
