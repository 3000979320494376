"""The adoption rule's operating characteristics, by Monte Carlo of the rule itself: how often a
claim of a given true gain ends verified, refuted or unproven, and how many seeds that took.

Verifiers take turns, one paired seed a look, each look's gain drawn from a normal of the
claim's true gain and the profile's paired noise, and the claim is judged by
`consensus.judge_claims` after every look, as a node would, until the verifiers stop: verified,
refuted, void or unproven (its look budget spent: `Rules.look_budget`). A claim the outlier hold keeps
waiting counts as verified here: the hold is a rule on top of the test. Pure: the caller gives
the generator.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from node import consensus

STOP = frozenset({"verified", "refuted", consensus.UNPROVEN, *consensus.DISQUALIFYING})


@dataclass(frozen=True)
class Characteristic:
    gain: float  # the claims' true gain, in paired sigmas
    trials: int
    verified: float  # share of claims that ended verified
    refuted: float
    unproven: float
    seeds: float  # mean seeds the verifiers spent on a claim

    def interval(self) -> tuple[float, float]:
        """A 95% Wilson interval on the verified share."""
        n, p, z = self.trials, self.verified, 1.96
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
        return max(0.0, centre - half), min(1.0, centre + half)

    def as_dict(self) -> dict:
        low, high = self.interval()
        return {"gain_sigmas": self.gain, "trials": self.trials, "verified": self.verified,
                "verified_interval": [low, high], "refuted": self.refuted,
                "unproven": self.unproven, "mean_seeds": self.seeds}  # fmt: skip


def characteristic(
    gain: float,
    rng: random.Random,
    *,
    trials: int = 1000,
    quorum: int = 1,
    verifiers: int = 3,
    sigma: float = 0.002,
) -> Characteristic:
    """Judge `trials` claims of true gain `gain` sigmas, looked at by `verifiers` peers in turn."""
    rules = consensus.Rules(quorum, sigma, tolerance=sigma)
    claim = [{"id": "c", "author": "author", "profile": "p", "harness": "h", "parent": "a",
              "child": "b", "outcome": "keep", "device": "d"}]  # fmt: skip
    ends: list[str] = []
    spent: list[int] = []
    for _ in range(trials):
        looks: list[dict] = []
        state = "open"
        while state not in STOP:
            n = len(looks)
            looks.append({"result": "c", "author": f"v{n % verifiers}", "verdict": "confirm",
                          "profile": "p", "harness": "h", "seed": n,
                          "delta": -rng.gauss(gain * sigma, sigma)})  # fmt: skip
            state = consensus.judge_claims(claim, looks, rules)["c"].state
            if state == consensus.HELD:  # the test verified it; the outlier hold is another rule
                state = "verified"
            if state == "open" and len(looks) >= rules.look_budget * 4:
                state = consensus.UNPROVEN  # disputed for good: counted as unproven
        ends.append(state)
        spent.append(len(looks))
    share = lambda s: sum(e == s for e in ends) / trials  # noqa: E731
    return Characteristic(gain, trials, share("verified"), share("refuted"),
                          share(consensus.UNPROVEN), statistics.fmean(spent))  # fmt: skip
