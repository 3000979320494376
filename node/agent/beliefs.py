"""What the swarm's evidence says each move of train.py does on a parent: one belief a move
(a constant up or down, a known edit), a distribution on a grid of effects in paired sigmas,
from every peer's measured steps on the parent and on the way to it, on an empirical-Bayes
prior of its kind (`beliefs`). The offline proposer (`node.agent.offline`) orders its changes
by it. Pure functions of a `Context`.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass

import numpy as np

from node.agent.catalogue import rows_of
from node.agent.proposers import Attempt, Context
from node.trainer.profiles import PROFILES, Profile

_MOVE = re.compile(
    r"^(?P<name>.+?) (?P<old>[-+.0-9e]+) -> (?P<new>[-+.0-9e]+)(?: on the \w+ profile)?$"
)
# What a single change does to val_bpb (negative is better), in paired sigmas of the node
# (`Context.sigma`), on a grid: fine about no effect, sparse far out where losses run.
GRID = np.concatenate([np.linspace(-10.0, 10.0, 81), np.geomspace(10.5, 400.0, 30)])
_WIDTH = np.gradient(GRID)
# Before the swarm measured changes of a kind, one is expected to do N(0, EFFECT_SD sigmas),
# and that guess weighs as much as PRIOR_WEIGHT measured changes (`_prior`).
EFFECT_SD = 1.0
PRIOR_WEIGHT = 4
FIT_ROUNDS = 40
TAIL = 1e-9  # so that no measured value, however far out, is impossible
DRIFT = 1.0  # sigmas: how far a move's effect here may be from its effect on the way here
# Of a measured move's effect, the opposite move is expected to have minus this share.
OPPOSITE_SHARE = 0.5


def move(description: str) -> tuple[str, int] | None:
    """(the constant, +1 up or -1 down) a single step's description names; None for a pair, an
    edit, or a description of some other form (an LLM's)."""
    found = _MOVE.match(description)
    if not found:
        return None
    try:  # a peer's description is its to write: "- -> e" matches and is no number
        old, new = float(found["old"]), float(found["new"])
    except ValueError:
        return None
    return (found["name"], 1 if new > old else -1) if new != old else None


def evidence_key(description: str) -> tuple[str, int] | None:
    """What the evidence about a single change is kept under: its move (`move`), or for an edit
    (a known edit, an LLM's change) its description with no way (0); None for a pair."""
    if "; " in description:
        return None
    return move(description) or (description, 0)


@dataclass(frozen=True)
class Belief:
    """What a move is expected to do to val_bpb on the parent (negative is better): its mean,
    its sd, and the gain it may bring (`of_grid`)."""

    mean: float
    sd: float
    gain: float

    @classmethod
    def of_grid(cls, weights: np.ndarray, sigma: float, shift: float = 0.0) -> Belief:
        """The belief that the effect is GRID + shift (sigmas) with these weights. Its gain is
        the expected improvement: the mean of the part of it below no effect, made positive."""
        x = GRID + shift
        mean = float(weights @ x)
        sd = float(weights @ (x - mean) ** 2) ** 0.5
        return cls(mean * sigma, sd * sigma, float(weights @ np.maximum(-x, 0.0)) * sigma)

    @classmethod
    def normal(cls, mean: float, sd: float, sigma: float) -> Belief:
        """A normal belief (bpb), on GRID (one centred past its ends, on the nearest end)."""
        sd = max(sd / sigma, float(_WIDTH.min()))
        log = -0.5 * ((GRID - mean / sigma) / sd) ** 2 + np.log(_WIDTH)
        weights = np.exp(log - log.max())
        return cls.of_grid(weights / weights.sum(), sigma)

    @property
    def score(self) -> float:
        """Where the move is placed, lowest first: minus the gain it may bring. A move nobody
        measured may be any of its kind's (mostly losses, a few gains); one measured a little
        better than its parent is less likely one of the large losses, and comes first; one
        measured inside the noise of no effect, with less room to surprise, after."""
        return -self.gain


def sigma_of(context: Context) -> float:
    """The paired noise the evidence is weighed with: the node's, else its profile's prior."""
    if context.sigma:
        return context.sigma
    profile = PROFILES.get(context.profile)
    return profile.paired_noise if profile else Profile.paired_noise


Look = tuple[float, float]  # a measurement of a move's effect: (value, its variance), in bpb


@dataclass(frozen=True)
class Beliefs:
    """What the evidence says of each move on a parent (`beliefs`)."""

    known: dict[tuple[str, int], Belief]
    sigma: float
    prior: dict[bool, Belief]  # an unmeasured move's, by whether it steps the model-size row
    wide: frozenset[str]  # the constants of the profile's model-size row

    @property
    def spread(self) -> dict[bool, float]:
        """An unmeasured move's sd, by kind."""
        return {kind: belief.sd for kind, belief in self.prior.items()}

    def of(self, description: str) -> Belief:
        """The belief about a change: a single one's, or of a pair, the normal of its two
        moves' sum."""
        parts = [self._one(evidence_key(part)) for part in description.split("; ")]
        if len(parts) == 1:
            return parts[0]
        return Belief.normal(
            sum(b.mean for b in parts), math.hypot(*(b.sd for b in parts)), self.sigma
        )

    def unmeasured(self, description: str) -> Belief:
        """The belief about a single change of this kind that nobody measured."""
        return self._prior_of(evidence_key(description))

    def _one(self, m: tuple[str, int] | None) -> Belief:
        return self.known.get(m) or self._prior_of(m)

    def _prior_of(self, m: tuple[str, int] | None) -> Belief:
        return self.prior[bool(m) and m[0] in self.wide]


def beliefs(context: Context) -> Beliefs:
    """What the swarm's evidence says each move (a constant, up or down; an edit,
    `evidence_key`) does on this parent: a distribution on GRID per move.

    A move starts from what the single steps of its kind (the constants of the profile's
    model-size row, or the others) measured on this parent and the way's earlier versions did,
    their noise taken out (`_prior`): most changes lose, some by far, a few gain. The steps
    verified or refuted on the way here (their pooled gain and standard error) and those
    measured on the way's earlier versions (mean paired difference, sigma^2 / seeds) tell what
    the move did there, a look at what it does here with DRIFT's variance added; every single
    step measured on this parent, by this node or a peer (`measured`: a claim's looks, else its
    pairs with this node's looks at it), moves it last (one with no pairs by its unpaired
    difference, 2 sigma^2). A move none of
    these measured, whose opposite they did, starts from its kind's prior moved by minus
    OPPOSITE_SHARE of the opposite's mean (a constant near its best sits in a valley: when down
    is worse, up is the way); an edit has no opposite."""
    sigma = sigma_of(context)
    wide = frozenset(n for names, _ in rows_of(context.train_py, context.profile) for n in names)
    before: dict[tuple[str, int], list[Look]] = {}
    here: dict[tuple[str, int], list[Look]] = {}
    for judged in (*context.lineage, *context.refuted):
        if (m := evidence_key(judged.description)) is not None:
            var = judged.se**2 if judged.se > 0 else sigma**2 / max(1, judged.seeds)
            before.setdefault(m, []).append((-judged.gain, var))
    of_kind: dict[bool, list[Look]] = {False: [], True: []}
    for attempts, into in ((context.earlier, before), (context.history, here)):
        for attempt in attempts:
            if (m := evidence_key(attempt.description)) is None:
                continue
            look = measured(attempt, sigma)
            if look is None and attempt.delta is not None and into is here:
                look = (attempt.delta, 2 * sigma**2)
            if look is None:
                continue
            into.setdefault(m, []).append(look)
            of_kind[m[0] in wide].append(look)
    prior = {kind: _prior(looks, sigma) for kind, looks in of_kind.items()}
    out: dict[tuple[str, int], Belief] = {}
    for m in before.keys() | here.keys():
        kind = m[0] in wide
        looks = [(v / sigma, var / sigma**2 + DRIFT**2) for v, var in before.get(m, [])]
        looks += [(v / sigma, var / sigma**2) for v, var in here.get(m, [])]
        out[m] = Belief.of_grid(_posterior(prior[kind], looks), sigma)
    for (name, way), belief in list(out.items()):
        if way and (name, -way) not in out:
            shift = -OPPOSITE_SHARE * belief.mean / sigma
            out[(name, -way)] = Belief.of_grid(prior[name in wide], sigma, shift)
    return Beliefs(out, sigma, {kind: Belief.of_grid(w, sigma) for kind, w in prior.items()}, wide)


def measured(attempt: Attempt, sigma: float) -> Look | None:
    """What an experiment measured of its change (child minus parent, bpb, with its variance):
    of a claim that looks count on, their pooled gain and its standard error (other peers' runs;
    its author's own numbers are any key's to make up, and a liar's would steer every node's
    proposals toward its fakes); else its pairs with this node's looks at it; None unpaired."""
    if attempt.judged is not None and attempt.judged[1] is not None:
        _, gain, se = attempt.judged
        return -gain, se**2 if se else sigma**2
    if values := (*attempt.paired, *attempt.looked):
        return statistics.fmean(values), sigma**2 / len(values)
    return None


def _log_likelihood(looks: list[Look]) -> np.ndarray:
    """Each look's log likelihood at each point of GRID (looks in sigmas), up to a constant
    of the look: one row a look."""
    value = np.array([v for v, _ in looks])[:, None]
    var = np.array([var for _, var in looks])[:, None]
    return -0.5 * (value - GRID) ** 2 / var


def _posterior(weights: np.ndarray, looks: list[Look]) -> np.ndarray:
    """Weights on GRID moved by looks (in sigmas): the prior times their likelihoods."""
    if not looks:
        return weights
    log = np.log(np.maximum(weights, 1e-300)) + _log_likelihood(looks).sum(axis=0)
    out = np.exp(log - log.max())
    return out / out.sum()


def _prior(looks: list[Look], sigma: float) -> np.ndarray:
    """What changes of one kind do, as weights on GRID, from their measurements (value, its
    variance, in bpb): the distribution that best explains them once their noise is added
    (fitted by expectation-maximisation, the nonparametric maximum likelihood of empirical
    Bayes), with PRIOR_WEIGHT measurements' worth of N(0, EFFECT_SD) mixed in."""
    base = (np.exp(-0.5 * (GRID / EFFECT_SD) ** 2) + TAIL) * _WIDTH
    base /= base.sum()
    if not looks:
        return base
    log = _log_likelihood([(v / sigma, var / sigma**2) for v, var in looks])
    log -= log.max(axis=1, keepdims=True)
    likely = np.exp(log)
    weights = base
    for _ in range(FIT_ROUNDS):
        share = likely * weights
        share /= share.sum(axis=1, keepdims=True)
        weights = (PRIOR_WEIGHT * base + share.sum(axis=0)) / (PRIOR_WEIGHT + len(looks))
    return weights
