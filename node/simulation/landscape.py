"""The surrogate trainer: a train.py "version" is a point in a small hyperparameter space, and its
val_bpb is a known smooth function of that point plus Gaussian noise of a known sd per run.

A version's text is canonical, so its sha256 is a real version hash. Pure functions of their
inputs (the noise comes from the caller's generator): no clock, no I/O.
"""

from __future__ import annotations

import difflib
import hashlib

import numpy as np

FLOOR = 0.900  # bpb at the optimum: nothing reaches below it
# The optimum per dimension, and how steeply val_bpb rises away from it (bpb per unit squared).
OPTIMUM = np.array([1.20, -0.90, 0.70, -0.50, 0.40, 1.50, -1.10, 0.30])
WEIGHTS = np.array([0.030, 0.025, 0.020, 0.016, 0.012, 0.008, 0.006, 0.004])
DIMS = len(OPTIMUM)
BASELINE = np.zeros(DIMS)  # the campaign's baseline train.py
NOISE_SD = 0.002  # bpb, one run's noise (the high end of the measured 0.0004 to 0.002)
STEP_SD = 0.25  # a proposal moves one dimension by a normal step of this sd
DECIMALS = 3  # coordinates are written with this many decimals, so a version is one text
TRAIN_SECONDS = 300.0  # the profile's training budget
RUN_SECONDS = 360.0  # one run on average: the budget plus start-up, evaluation, agent's turn
OVERHEAD_SPREAD = 30.0  # a run's overhead varies uniformly this much either side of its mean
HARNESS = hashlib.sha256(b"research-swarm surrogate harness v1").hexdigest()


def true_bpb(x: np.ndarray) -> float:
    """The noise-free val_bpb of a point: FLOOR + sum of WEIGHTS * (x - OPTIMUM) ** 2."""
    return float(FLOOR + np.dot(WEIGHTS, (x - OPTIMUM) ** 2))


def measure(x: np.ndarray, rng: np.random.Generator) -> float:
    """One run's val_bpb: the true value plus normal noise of sd NOISE_SD."""
    return true_bpb(x) + float(rng.normal(0.0, NOISE_SD))


def quantise(x: np.ndarray) -> np.ndarray:
    return np.round(x, DECIMALS) + 0.0  # + 0.0 turns -0.0 into 0.0


def source(x: np.ndarray) -> str:
    """The canonical train.py text of a point: one line per hyperparameter."""
    lines = ["# surrogate train.py: val_bpb is a known function of these knobs"]
    lines += [f"KNOB_{i} = {v:+.{DECIMALS}f}" for i, v in enumerate(quantise(x))]
    return "\n".join(lines) + "\n"


def parse(text: str) -> np.ndarray:
    """The point a train.py text names (the inverse of `source`, for merged texts too)."""
    x = BASELINE.copy()
    for line in text.splitlines():
        if line.startswith("KNOB_"):
            name, _, value = line.partition(" = ")
            x[int(name[5:])] = float(value)
    return quantise(x)


def version(x: np.ndarray) -> str:
    """sha256 of the point's canonical train.py text."""
    return hashlib.sha256(source(x).encode()).hexdigest()


def diff(parent: np.ndarray, child: np.ndarray) -> bytes:
    """The unified diff from the parent's train.py to the child's."""
    lines = difflib.unified_diff(
        source(parent).splitlines(True), source(child).splitlines(True), "a/train.py", "b/train.py"
    )
    return "".join(lines).encode()


def run_seconds(rng: np.random.Generator) -> float:
    """How long one run takes: RUN_SECONDS give or take OVERHEAD_SPREAD (uniform), so that
    nodes drift apart as real machines do rather than step in lockstep."""
    return RUN_SECONDS + float(rng.uniform(-OVERHEAD_SPREAD, OVERHEAD_SPREAD))


def propose(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random step from `x`: one dimension moved by a normal step of sd STEP_SD."""
    child = x.copy()
    child[rng.integers(DIMS)] += rng.normal(0.0, STEP_SD)
    return quantise(child)


def worse(x: np.ndarray, rng: np.random.Generator, by: float) -> np.ndarray:
    """A random step from `x` whose true val_bpb is at least `by` higher (a cheat's child)."""
    base = true_bpb(x)
    while True:
        child = x.copy()
        child[rng.integers(DIMS)] += rng.normal(0.0, 4 * STEP_SD)
        child = quantise(child)
        if true_bpb(child) >= base + by:
            return child
