"""The surrogate trainer: a train.py "version" is a set of ideas, each on or off, and its val_bpb
a known function of that set, measured with the noise a real run has.

Calibrated to autoresearch's measured history (docs/simulation.md): about 17% of the changes
one can make improve the model, an improving change alone gains 0.15 to 0.45 of the seed noise
(the spread of one version's val_bpb across seeds), and changes interact: a pair of ideas can
help or hurt together beyond their sum.

A run's val_bpb is `true_bpb` plus three terms: the seed's own luck, common to every version on
that seed (what pairing child and parent on one seed cancels); the version's interaction with
the seed (what pairing leaves: the paired noise); and the run's own nondeterminism (what a
replay of the same version and seed still shows). Pure functions of their inputs: no clock, no
I/O; the landscape is drawn from its seed, the noise from the caller's generator.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from node.agent.errors import ProposalRefused
from node.agent.patch import diff_hash, make_diff, normalise_diff
from node.agent.proposers import Context, Proposal
from node.trainer.profiles import get_profile

PROFILE = get_profile("gpu")  # the profile the simulated nodes research on
BASELINE_BPB = 1.0000  # the baseline's true val_bpb
IDEAS = 1000  # the changes one can make: each idea is a line of train.py when it is on
IMPROVING = 0.17  # the share of ideas that improve the baseline on their own
GAIN_SEEDS = (0.15, 0.45)  # an improving idea's gain, uniform in this range of SEED_SD
# The noise of one run. PAIRED_SD (bpb) is the gpu profile's paired noise, the sd of a paired
# difference (child minus parent on one seed) and the rule's floor. Pairing cancels SEED_SD,
# the seed's luck, common to every version on a seed: on the H200 two seeds of the baseline
# differ by 0.006 (a run's sd about 0.0042) while three runs of one seed spread 0.0008 (what
# no pairing cancels: a paired sd of about 0.0006), a ratio of about 7 (13.6 on the cpu
# profile), so the gains, which autoresearch measured in seed noise, are 1 to 3 paired sds.
# REPLAY_SD is a run's own nondeterminism (a replay of a version on a seed differs by about
# 1.4 times it), the H200's; the version's own luck on a seed makes up the paired noise.
PAIRED_SD = PROFILE.paired_noise
SEED_SD = 7 * PAIRED_SD
REPLAY_SD = 0.0004
VERSION_SEED_SD = float(np.sqrt(PAIRED_SD**2 / 2 - REPLAY_SD**2))
HARM_MEAN = 2 * PAIRED_SD  # a harmful idea's mean loss (exponential: most are mild, some awful)
INTERACTING = 0.03  # the share of pairs of ideas that interact
INTERACTION_SD = 0.5 * PAIRED_SD  # the sd of such a pair's extra effect, when both are on
TARGET_GAIN = 0.02  # bpb below the baseline's true val_bpb: the research goal
RUN_SECONDS = 360.0  # one run on average: the budget's 300 s plus start-up and evaluation
OVERHEAD_SPREAD = 30.0  # a run's length varies uniformly this much either side of its mean
DEVICE = "NVIDIA H200"  # every simulated node's device class: replays apply


@dataclass(frozen=True)
class Landscape:
    """The ideas' effects, drawn from `seed`: `effects[k]` is idea k's gain alone (negative:
    a loss), `pairs` the interactions {(j, k): extra loss when both are on}."""

    seed: int
    effects: np.ndarray = field(init=False, repr=False)
    pairs: dict[tuple[int, int], float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, 7])
        improving = rng.random(IDEAS) < IMPROVING
        gains = rng.uniform(*GAIN_SEEDS, IDEAS) * SEED_SD
        losses = rng.exponential(HARM_MEAN, IDEAS)
        object.__setattr__(self, "effects", np.where(improving, gains, -losses))
        count = rng.binomial(IDEAS * (IDEAS - 1) // 2, INTERACTING)
        pairs: dict[tuple[int, int], float] = {}
        while len(pairs) < count:
            j, k = sorted(rng.choice(IDEAS, 2, replace=False).tolist())
            pairs[(j, k)] = float(rng.normal(0.0, INTERACTION_SD))
        object.__setattr__(self, "pairs", pairs)

    # What the simulation asks of a landscape (`catalogue.CatalogueLandscape` answers the same):
    # versions are train.py texts.

    @property
    def baseline(self) -> str:
        return BASELINE_SOURCE

    def bpb(self, text: str) -> float:
        """The noise-free val_bpb of a version."""
        return self.true_bpb(parse(text))

    def run(self, text: str, seed: int, rng: np.random.Generator) -> float:
        """One run's val_bpb on `seed`."""
        return self.measure(parse(text), seed, rng)

    def target_gain(self) -> float:
        return TARGET_GAIN

    def proposer(self, rng: np.random.Generator, name: str, fixed: bool = False) -> SimProposer:
        return SimProposer(rng)  # a random order: it learns nothing either way

    def mild(self, text: str, rng: np.random.Generator, harm: float) -> list[tuple[str, str]]:
        """Changes of `text` (of 64 ideas drawn) that cost at most `harm` and gain nothing."""
        parent, base = parse(text), self.bpb(text)
        ideas = [k for k in rng.choice(IDEAS, 64, replace=False).tolist() if k not in parent]
        return [(f"idea {k} on", source(parent | {k})) for k in ideas
                if 0 <= self.true_bpb(parent | {k}) - base <= harm]  # fmt: skip

    def true_bpb(self, ideas: frozenset[int]) -> float:
        """The noise-free val_bpb of a version: the baseline's, less the gains of its ideas,
        plus their interactions."""
        on = sorted(ideas)
        extra = sum(self.pairs.get((j, k), 0.0) for a, j in enumerate(on) for k in on[a + 1 :])
        return BASELINE_BPB - float(self.effects[on].sum()) + extra

    def measure(self, ideas: frozenset[int], seed: int, rng: np.random.Generator) -> float:
        """One run's val_bpb on `seed`: the seed's luck and the version's luck on it (fixed by
        seed and version: a replay gets them again), plus the run's own noise from `rng`."""
        luck = np.random.default_rng([self.seed, 1, seed]).normal(0.0, SEED_SD)
        mine = np.random.default_rng([self.seed, 2, seed, *_words(ideas)]).normal(
            0.0, VERSION_SEED_SD
        )
        return self.true_bpb(ideas) + float(luck + mine + rng.normal(0.0, REPLAY_SD))


def _words(ideas: frozenset[int]) -> list[int]:
    digest = hashlib.sha256(",".join(map(str, sorted(ideas))).encode()).digest()
    return [int.from_bytes(digest[i : i + 4], "big") for i in range(0, 16, 4)]


HEADER = "# surrogate train.py: one line per idea, 1 when it is on\n"


def source(ideas: frozenset[int]) -> str:
    """The canonical train.py text of a version: a line per idea, in order, 1 when it is on and
    0 when off. Every idea has its own line, as every constant of a real train.py has, so that
    two changes of different ideas merge three-way as two changes of different lines do."""
    return HEADER + "".join(f"IDEA_{k:04d} = {int(k in ideas)}\n" for k in range(IDEAS))


BASELINE_SOURCE = source(frozenset())


def parse(text: str) -> frozenset[int]:
    """The ideas a train.py text turns on (the inverse of `source`, for merged texts too)."""
    on = set()
    for line in text.splitlines():
        if line.startswith("IDEA_"):
            name, _, value = line.partition(" = ")
            if value.strip() == "1":
                on.add(int(name[5:]))
    return frozenset(on)


def version(ideas: frozenset[int]) -> str:
    """sha256 of the version's canonical train.py text."""
    return hashlib.sha256(source(ideas).encode()).hexdigest()


class SimProposer:
    """A proposer over the ideas: turn one idea on or off, never a change already tried on the
    parent (by this node or a peer: the context's tried hashes)."""

    kind = "ideas"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.tried: dict[str, set[int]] = {}  # parent -> ideas known tried on it

    def propose(self, context: Context) -> Proposal:
        ideas = parse(context.train_py)
        tried, known = context.tried_hashes, self.tried.setdefault(context.parent, set())
        for k in self.rng.permutation(IDEAS).tolist():
            if k in known:
                continue
            known.add(k)
            text = source(ideas ^ {k})
            if diff_hash(normalise_diff(make_diff(context.train_py, text))) not in tried:
                return Proposal(f"idea {k} {'off' if k in ideas else 'on'}", text)
        raise ProposalRefused("every idea was tried on this parent")


def run_seconds(rng: np.random.Generator, speed: float = 1.0) -> float:
    """How long one run takes on hardware `speed` times the reference: RUN_SECONDS give or take
    OVERHEAD_SPREAD (uniform), so that nodes drift apart as real machines do."""
    return (RUN_SECONDS + float(rng.uniform(-OVERHEAD_SPREAD, OVERHEAD_SPREAD))) / speed
