"""A surrogate trainer over the real catalogue: a version is a real `train.py` text, as the
offline proposer writes it (its constants stepped, its known edits applied, merges of both), and
its val_bpb a hidden function of what those changes did to the baseline.

Each constant the proposer steps (`catalogue.constant_values`) sits in a valley of its own, on a
log scale where one unit is a step by a factor of 1.4 (for a share near 1, a momentum or a beta,
its distance from 1 halved or doubled). Most sit at the baseline's value, more or less: a step
either way costs what their curvature says. OFF_SHARE of them have their best value some steps
away, so that a step toward it gains and the next step on gains again, by less: what a proposer
that learns from the evidence can use and one that walks a fixed order cannot. A known edit is
an idea on or off, as in `landscape.py`. A share of the pairs of these interact. The same noise
as `landscape.py`: the seed's luck, the version's luck on the seed, the run's own.

Calibrated to autoresearch's history as `landscape.py` is: about 17% of the catalogue's single
changes of the baseline improve it, by 0.15 to 0.45 of the seed noise for most
(`calibration()` measures both for a landscape).
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from node.agent.catalogue import KNOWN_EDITS, constant_values
from node.agent.offline import FixedList, OfflineProposer
from node.simulation import landscape as land
from node.trainer import BASELINE_TRAIN_PY

BASELINE = BASELINE_TRAIN_PY.read_text()
PROFILE = land.PROFILE.name
UNIT = math.log(1.4)  # one step of a constant, on its log scale
OFF_SHARE = 0.3  # constants whose best value is away from the baseline's
OFF_STEPS = (1.0, 3.0)  # how far, in units, uniform
OFF_CURVE = (0.45, 0.9)  # their curvature, in paired sds a unit squared, uniform
ON_CURVE = 2.0  # the mean curvature of the others (exponential), in paired sds a unit squared
ON_SPREAD = 0.3  # the others' best value: normal about the baseline's, this sd in units
INTERACTION_SD = 0.25  # paired sds a unit squared, for a pair that interacts
TARGET_SHARE = 0.5  # the research target: this share of the most the catalogue can gain


def _position(value: float, base: float) -> float:
    """Where `value` sits against the baseline's `base`, in units (see the module's doc)."""
    if 0.5 < base < 1 and 0 < value < 1:  # a share near 1: its distance from 1
        return -math.log((1 - value) / (1 - base)) / math.log(2)
    return math.log(value / base) / UNIT if value > 0 and base > 0 else 0.0


@functools.lru_cache(maxsize=65536)
def features(text: str) -> tuple[tuple[str, float], ...]:
    """A version's coordinates: each constant's position in units and each known edit of code,
    1 when applied, as (name, value) pairs in a fixed order."""
    values, base = constant_values(text, PROFILE), _BASE_VALUES
    out = [(name, _position(values.get(name, b), b)) for name, b in base.items()]
    out += [(f"edit {i}", float(KNOWN_EDITS[i][2] in text)) for i in _EDITS]
    return tuple(out)


_BASE_VALUES = constant_values(BASELINE, PROFILE)
# The known edits of code the baseline takes: those that only step a constant are its steps.
_EDITS = tuple(
    i for i, (_, old, new) in enumerate(KNOWN_EDITS)
    if BASELINE.count(old) == 1
    and constant_values(BASELINE.replace(old, new), PROFILE) == _BASE_VALUES
)  # fmt: skip


@dataclass(frozen=True)
class CatalogueLandscape:
    """The hidden effects, drawn from `seed`: for each constant its best position and its
    curvature, for each edit its gain (negative: a loss), and the pairs that interact."""

    seed: int
    baseline: str = field(default=BASELINE, init=False)
    best: np.ndarray = field(init=False, repr=False)
    curve: np.ndarray = field(init=False, repr=False)
    edits: np.ndarray = field(init=False, repr=False)
    pairs: dict[tuple[int, int], float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, 11])
        sd = land.PAIRED_SD
        names = tuple(name for name, _ in features(BASELINE))
        constants = len(_BASE_VALUES)
        off = rng.random(constants) < OFF_SHARE
        away = rng.uniform(*OFF_STEPS, constants) * rng.choice((-1.0, 1.0), constants)
        best = np.where(off, away, rng.normal(0.0, ON_SPREAD, constants))
        curve = np.where(
            off, rng.uniform(*OFF_CURVE, constants), rng.exponential(ON_CURVE, constants)
        )
        improving = rng.random(len(_EDITS)) < land.IMPROVING
        gains = rng.uniform(*land.GAIN_SEEDS, len(_EDITS)) * land.SEED_SD
        edits = np.where(improving, gains, -rng.exponential(land.HARM_MEAN, len(_EDITS)))
        count = rng.binomial(len(names) * (len(names) - 1) // 2, land.INTERACTING)
        pairs: dict[tuple[int, int], float] = {}
        while len(pairs) < count:
            j, k = sorted(rng.choice(len(names), 2, replace=False).tolist())
            pairs[(j, k)] = float(rng.normal(0.0, INTERACTION_SD * sd))
        for key, value in (("best", best), ("curve", curve * sd),
                           ("edits", edits), ("pairs", pairs)):  # fmt: skip
            object.__setattr__(self, key, value)

    def bpb(self, text: str) -> float:
        """The noise-free val_bpb of a version."""
        x = np.array([v for _, v in features(text)])
        n = len(self.best)
        at, best = x[:n], self.best
        gain = float((self.curve * (best**2 - (at - best) ** 2)).sum())
        gain += float(self.edits @ x[n:])
        extra = sum(w * float(x[j] * x[k]) for (j, k), w in self.pairs.items())
        return float(land.BASELINE_BPB - gain + extra)

    def run(self, text: str, seed: int, rng: np.random.Generator) -> float:
        """One run's val_bpb on `seed` (see `landscape.Landscape.measure` for the noise)."""
        luck = np.random.default_rng([self.seed, 1, seed]).normal(0.0, land.SEED_SD)
        words = hashlib.sha256(text.encode()).digest()
        mine = np.random.default_rng(
            [self.seed, 2, seed, *(int.from_bytes(words[i : i + 4], "big") for i in (0, 4, 8))]
        ).normal(0.0, land.VERSION_SEED_SD)
        return self.bpb(text) + float(luck + mine + rng.normal(0.0, land.REPLAY_SD))

    def most(self) -> float:
        """The most the catalogue can gain, as an upper bound: every constant at its best
        position, every helpful edit applied, interactions left out."""
        return float((self.curve * self.best**2).sum() + np.clip(self.edits, 0, None).sum())

    def target_gain(self) -> float:
        return TARGET_SHARE * self.most()

    def proposer(self, rng: np.random.Generator, name: str, fixed: bool = False) -> OfflineProposer:
        """The node's proposer: the product's offline proposer, seeded per node; `fixed`: the
        same catalogue walked in its seeded order alone (`FixedList`), for comparison."""
        return (FixedList if fixed else OfflineProposer)(seed=name)

    def mild(self, text: str, rng: np.random.Generator, harm: float) -> list[tuple[str, str]]:
        """Changes of `text` from the catalogue that cost at most `harm` and gain nothing."""
        base = self.bpb(text)
        candidates = list(OfflineProposer(seed=int(rng.integers(2**31))).candidates(text, PROFILE))
        picked = rng.choice(len(candidates), min(64, len(candidates)), replace=False).tolist()
        return [candidates[i] for i in picked
                if 0 <= self.bpb(candidates[i][1]) - base <= harm]  # fmt: skip


def calibration(seeds: range = range(32)) -> dict:
    """Over landscapes of `seeds`: the share of the catalogue's single changes of the baseline
    that improve it, their gains in seed sds (quartiles), and the target's gain."""
    singles = [(d, t) for d, t in OfflineProposer(0).candidates(BASELINE, PROFILE) if "; " not in d]
    gains, shares, targets = [], [], []
    for seed in seeds:
        world = CatalogueLandscape(seed)
        deltas = np.array([land.BASELINE_BPB - world.bpb(t) for _, t in singles])
        shares.append(float((deltas > 0).mean()))
        gains += (deltas[deltas > 0] / land.SEED_SD).tolist()
        targets.append(world.target_gain())
    return {
        "single_changes": len(singles),
        "improving_share": round(float(np.mean(shares)), 3),
        "gain_seed_sds_quartiles": [
            round(float(q), 2) for q in np.quantile(gains, (0.25, 0.5, 0.75))
        ],
        "target_gain_median": round(float(np.median(targets)), 4),
    }
