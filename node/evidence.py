"""The evidence about one claimed win, pooled from every peer's paired looks, and the sequential
test that turns it into a state: verified, refuted, void, misreported or open.

A look is one paired seed: a peer ran the claim's child and its parent on the same seed and
published the gain (parent minus child). Pure functions of the looks given: which looks count
(author, committee, harness, standing) is `consensus`'s to decide. No I/O, no clock.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ALPHA = 0.05  # false-verification rate for a claim of zero gain, however many looks it gets
MIXTURE = 1.0  # the test's prior on a real gain: half-normal, this many paired sigmas wide
FUTILITY = 0.5  # refuted: the evidence says the gain is below this many paired sigmas
PEER_CAP = 8  # seeds of one peer that weigh on one claim, at most: keys are cheap, runs are not
OUTLIER_Z = 4.0  # a peer whose mean gain lies this many standard errors off the others' median
ERRATIC = 4.0  # a peer whose own looks at a claim spread this many times the typical noise
PRIOR_DF = 2  # the profile's paired noise weighs as much as this many degrees of freedom
# A paired difference's noise grows with the size of the change: a profile's paired noise is
# measured on small changes, and a 1.35 bpb gain on the test profile varied by 0.05 between two
# seeds (4%). Outliers and overclaims are judged against the larger of the two, so that an honest
# large gain never looks like a lie; the test itself keeps the profile's noise.
RELATIVE_NOISE = 0.1
STATES = ("verified", "refuted", "void", "misreported", "open")


@dataclass(frozen=True)
class PeerLooks:
    """One peer's looks at one claim: its scored seeds, and what else it reported."""

    peer: str
    gains: tuple[float, ...] = ()  # parent minus child, one per distinct seed
    void: bool = False  # its harness refused to score the child's run
    replay: float | None = None  # the child's score on the author's seed, on its device class
    misreported: bool = False  # it said its replay of the author's seed gave other scores
    contradicted: bool = False  # most other reports on one of its seeds give other scores
    contested: bool = False  # one of its seeds has reports that disagree, and no majority

    @property
    def weight(self) -> int:
        return min(len(self.gains), PEER_CAP)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.gains)


@dataclass(frozen=True)
class Judgement:
    """What the pooled looks say about one claim, and why."""

    state: str  # one of STATES
    gain: float | None = None  # the pooled estimate of the gain (bpb; parent minus child)
    se: float | None = None  # its standard error
    seeds: int = 0  # the weight behind the estimate: seeds, each peer's capped at PEER_CAP
    sigma: float = 0.0  # the paired noise the test assumed
    peers: tuple[str, ...] = ()  # the peers whose looks the estimate pools
    outliers: tuple[str, ...] = ()  # peers whose looks lie far outside the others'
    disputed: bool = False  # no majority of peers agrees: nobody is an outlier, nobody trusted
    # the author's own claimed gain against the pooled estimate, in standard errors, with the
    # quorum - 1 peers least on its side left out; None with fewer peers
    author_z: float | None = None
    reason: str = ""
    contradicted: tuple[str, ...] = ()  # peers whose report of a seed the replays contradict
    contested: tuple[str, ...] = ()  # peers with a report that disagrees with another, no majority
    awaits_replay: bool = False  # open until a replay of its author's seed backs or denies it
    # The peers whose replays of the author's seed deny its signed scores: those that found it
    # misreported, or that it waits on another peer's replay against (`awaits_replay`), or
    # that too few denied a claim its looks refute.
    misreported_by: tuple[str, ...] = ()
    # The committee that judged it (`consensus.judge_claim`); None in an open campaign, and in a
    # ledger's kept judgements, which keep the ranking instead (`committees.seated` finds it).
    seats: tuple[str, ...] | None = None

    def as_dict(self) -> dict:
        return {"state": self.state, "gain": self.gain, "se": self.se, "seeds": self.seeds,
                "sigma": self.sigma, "peers": list(self.peers), "outliers": list(self.outliers),
                "disputed": self.disputed, "author_z": self.author_z,
                "contradicted": list(self.contradicted), "contested": list(self.contested),
                "awaits_replay": self.awaits_replay, "misreported_by": list(self.misreported_by),
                "reason": self.reason}  # fmt: skip


def _floats(value: Any) -> list[float]:
    """A list of scores as the facts carry it: a list, or the ledger's JSON text of one."""
    if isinstance(value, str):
        value = json.loads(value) if value else []
    return [float(x) for x in value or () if x is not None]


def claimed_gain(claim: Mapping[str, Any]) -> tuple[float, int] | None:
    """(the author's mean paired gain, its number of seeds) from a result row, None if unpaired."""
    child, parent = _floats(claim.get("child_scores")), _floats(claim.get("parent_scores"))
    gains = [p - c for c, p in zip(child, parent, strict=False) if math.isfinite(p - c)]
    return (statistics.fmean(gains), len(gains)) if gains else None


def claimed_first_score(claim: Mapping[str, Any]) -> float | None:
    """The child's score the author signed on its first seed: what a replay must reproduce."""
    child = _floats(claim.get("child_scores"))
    return child[0] if child else claim.get("val_bpb")


@dataclass(frozen=True)
class CrossCheck:
    """What the reports of several peers on one seed say about each other. A look reports two
    scores on its seed, the child's and the parent's; a run is a function of its seed (within
    the profile's replay tolerance, on one device class), so a peer that replays another's seed
    must get the same two scores. A look that no run stands behind is found by one replay."""

    contradicted: frozenset[str] = frozenset()  # a strict majority of a seed's reports differ
    contested: frozenset[str] = frozenset()  # reports that disagree, and no majority: a tie
    # seed -> the peers whose reports of it hold, by id: the seed weighs once, in the first of
    # them whose looks count, however many replayed it
    holders: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    agreed: frozenset[str] = frozenset()  # peers whose report on some seed another reproduced
    ties: frozenset[tuple[int, str]] = frozenset()  # (seed, device class) of the contested seeds


def cross_check(looks: Iterable[Mapping[str, Any]], tolerance: float) -> CrossCheck:
    """The reports of the looks given (author, seed, child_val_bpb, parent_val_bpb, device),
    compared seed by seed, within one device class: on a seed that several peers reported, a
    report agrees with another when both scores lie within `tolerance`; a report that a strict
    majority of the seed's reports agree with holds, and those that do not are contradicted;
    when none holds, every report on the seed is contested until another replay decides."""
    by_seed: dict[tuple[int, str], dict[str, tuple[float, float]]] = {}
    for v in looks:
        child, parent = v.get("child_val_bpb"), v.get("parent_val_bpb")
        if child is None or parent is None or not math.isfinite(child - parent):
            continue
        by_seed.setdefault((v["seed"], v.get("device") or ""), {}).setdefault(
            v["author"], (child, parent)
        )
    contradicted, contested, agreed, ties = set(), set(), set(), set()
    holders: dict[int, tuple[str, ...]] = {}
    for (seed, device), reports in by_seed.items():
        if len(reports) < 2:
            continue

        def agree(a: tuple[float, float], b: tuple[float, float]) -> bool:
            return abs(a[0] - b[0]) <= tolerance and abs(a[1] - b[1]) <= tolerance

        holds = sorted(
            peer for peer, r in reports.items()
            if 2 * sum(agree(r, o) for o in reports.values()) > len(reports)
        )  # fmt: skip
        if not holds:
            contested |= set(reports)
            ties.add((seed, device))
            continue
        contradicted |= set(reports) - set(holds)
        holders[seed] = tuple(holds)
        agreed |= set(holds)
    return CrossCheck(frozenset(contradicted), frozenset(contested - contradicted), holders,
                      frozenset(agreed), frozenset(ties))  # fmt: skip


def peer_looks(
    looks: Iterable[Mapping[str, Any]], device: str | None, checked: CrossCheck = CrossCheck()
) -> list[PeerLooks]:
    """Verification rows (author, verdict, delta, seed, replay_val_bpb, device) of one claim,
    grouped by peer, sorted by peer. A second look on the same seed is the same look: its gains
    are averaged, and a seed that another peer among `looks` reported too, in agreement, weighs
    in the first such peer's looks by id only (`checked`, the claim's `cross_check`). A void,
    or a refutation without a score (the child broke the policy), is a refusal; a crash counts
    neither way (a smaller machine may run out of memory). A replay counts only from the
    claim's own `device` class."""
    looks = list(looks)
    counted = {v["author"] for v in looks}
    by_peer: dict[str, dict[str, Any]] = {}
    for v in looks:
        first = next((p for p in checked.holders.get(v["seed"], ()) if p in counted), None)
        entry = by_peer.setdefault(
            v["author"], {"seeds": {}, "void": False, "replay": None, "misreported": False}
        )
        delta = v.get("delta")
        entry["misreported"] |= v["verdict"] == "misreported"
        # Void: its harness refused to score the child's run; a refutation without a score:
        # the child broke the train.py policy and never ran. Neither is noise.
        if v["verdict"] == "void" or (
            v["verdict"] == "refute" and v.get("child_val_bpb", delta) is None
        ):
            entry["void"] = True
        elif (
            isinstance(delta, (int, float)) and math.isfinite(delta)
            and first in (None, v["author"])
        ):  # fmt: skip
            entry["seeds"].setdefault(v["seed"], []).append(-delta)
        replay = v.get("replay_val_bpb")
        if replay is not None and device and v.get("device") == device:
            entry["replay"] = replay if entry["replay"] is None else min(entry["replay"], replay)
    return [
        PeerLooks(peer, tuple(statistics.fmean(g) for _, g in sorted(e["seeds"].items())),
                  e["void"], e["replay"], e["misreported"], peer in checked.contradicted,
                  peer in checked.contested)
        for peer, e in sorted(by_peer.items())
    ]  # fmt: skip


def seeds_to_replay(
    looks: Iterable[Mapping[str, Any]],
    me: str,
    author: str,
    device: str,
    tolerance: float,
    contested_only: bool = False,
    at_once: int | None = None,
) -> list[int]:
    """The seeds of other peers' reports on a claim that `me`, on `device`, could replay
    (`looks`: the claim's verification rows), the first to replay first: contested seeds,
    since one more report decides each; then (unless `contested_only`) seeds nobody replayed
    yet, of peers that no replay corroborated or contradicted on this claim so far: with
    `at_once`, only that many of them, the first in an order every node shares (a hash of the
    claim and the seed), so that a few replays settle whether the verdict holds without them
    instead of a replay of every look at once (`Researcher._replay_seed` lifts it once a replay
    of the claim disagreed). Within each, in the order of a hash of `me` and the seed: nodes
    that look at once replay different seeds, a peer's in proportion to its reports."""
    scored = ("child_val_bpb", "parent_val_bpb")
    looks = [v for v in looks if v["author"] != author
             and all(v.get(k) is not None for k in scored)]  # fmt: skip
    mine = {v["seed"] for v in looks if v["author"] == me}
    checked = cross_check(looks, tolerance)
    reporters: dict[int, set[str]] = {}  # by seed, as every node of the device sees them
    for v in looks:
        if (v.get("device") or "") == device:
            reporters.setdefault(v["seed"], set()).add(v["author"])
    contested = [seed for seed in reporters if (seed, device) in checked.ties]
    known = checked.contradicted | checked.agreed  # peers a replay already judged
    alone = [seed for seed, peers in reporters.items() if len(peers) == 1 and not peers & known]

    def order(seeds: list[int], by: str = me) -> list[int]:
        return sorted(seeds, key=lambda seed: hashlib.sha256(f"{by} {seed}".encode()).digest())

    if at_once is not None and looks:  # the same few for every node, before its own are left out
        alone = order(alone, looks[0]["result"])[:at_once]
    due = order(contested) + ([] if contested_only else order(alone))
    return [seed for seed in due if seed not in mine]


def log_evalue(total: float, n: float, sigma: float, scale: float = MIXTURE) -> float:
    """The log of the mixture likelihood ratio for "the gain is positive" against "it is zero",
    after gains summing to `total` over `n` paired seeds of noise `sigma`: the ratio of a real
    gain drawn from a half-normal of `scale` sigmas to no gain. Under no gain it is a
    nonnegative martingale, so it ever reaches 1/ALPHA with probability at most ALPHA (Ville's
    inequality): the false-verification rate holds however many looks come, in any order."""
    if n <= 0:
        return 0.0
    tau2 = (scale * sigma) ** 2
    width = sigma**2 + n * tau2
    x = math.sqrt(tau2) * total / (sigma * math.sqrt(width))
    tail = 0.5 * math.erfc(-x / math.sqrt(2))
    if tail <= 0.0:
        return -math.inf
    return math.log(2.0) - 0.5 * math.log(width / sigma**2) + x * x / 2 + math.log(tail)


def _noise(peers: Sequence[PeerLooks], prior: float) -> float:
    """The paired noise behind these looks: the spread of each peer's seeds around its own mean,
    pooled, with the profile's `prior` as PRIOR_DF degrees of freedom; never below the prior, so
    that a peer's looks can make the test slower and never less strict."""
    squares, df = PRIOR_DF * prior**2, PRIOR_DF
    for p in peers:
        if len(p.gains) >= 2:
            squares += sum((g - p.mean) ** 2 for g in p.gains)
            df += len(p.gains) - 1
    return max(prior, math.sqrt(squares / df))


def spread(sigma: float, gain: float) -> float:
    """The noise of one paired difference of a change of this `gain` (`RELATIVE_NOISE`)."""
    return math.hypot(sigma, RELATIVE_NOISE * gain)


def _pool(peers: Iterable[PeerLooks]) -> tuple[float, int]:
    total, n = 0.0, 0
    for p in peers:
        total += p.weight * p.mean
        n += p.weight
    return total, n


def _typical_noise(peers: Sequence[PeerLooks], prior: float) -> float:
    """The noise of one look as most peers see it: the lower median of the profile's paired
    noise and each peer's own spread over its seeds, one vote each, never below the prior; no
    minority of peers, however their looks scatter, moves it."""
    spreads = [statistics.stdev(p.gains) for p in peers if len(p.gains) >= 2]
    return max(prior, statistics.median_low([prior, *spreads]))


def _outliers(peers: Sequence[PeerLooks], sigma: float) -> tuple[tuple[str, ...], bool]:
    """(the peers far outside the rest, whether the looks are disputed), at the typical noise
    `sigma` (`_typical_noise`). The center is the median of the peers' mean gains, one vote
    each, so that seeds bought by one key do not move it; a peer is an outlier when its mean
    lies more than OUTLIER_Z standard errors from it, or its own looks spread more than ERRATIC
    times the noise (no run's noise scatters so: made-up looks that would stall every test),
    and only when a strict majority of the peers lies within: without one, nobody is. With
    fewer than three peers, a peer so erratic leaves the looks disputed."""
    erratic = {p.peer for p in peers if len(p.gains) >= 2
               and statistics.stdev(p.gains) > ERRATIC * spread(sigma, p.mean)}  # fmt: skip
    if len(peers) < 3:
        return (), bool(erratic)
    center = statistics.median(p.mean for p in peers)
    _, n = _pool(peers)
    noise = spread(sigma, center)
    far = tuple(
        p.peer for p in peers
        if p.peer in erratic
        or abs(p.mean - center) > OUTLIER_Z * noise * math.sqrt(1 / p.weight + 1 / n)
    )  # fmt: skip
    if 2 * (len(peers) - len(far)) > len(peers):
        return far, False
    return (), bool(far)


def _passes(peers: Sequence[PeerLooks], quorum: int, sigma: float, shift: float, sign: int) -> bool:
    """Whether the test passes with the quorum - 1 peers most on its side left out, so that
    quorum - 1 liars alone never decide it. `sign` +1 tests "gain above `shift`", -1 "below"."""
    if len(peers) < quorum:
        return False
    ranked = sorted(peers, key=lambda p: (sign * p.mean, p.peer), reverse=True)
    total, n = _pool(ranked[quorum - 1 :])
    return log_evalue(sign * (total - n * shift), n, sigma) >= math.log(1 / ALPHA)


def _replays(
    peers: Iterable[PeerLooks], signed: float | None, tolerance: float
) -> tuple[list[PeerLooks], list[str]]:
    """(the peers that replayed the author's seed, those of them whose replay denies the score
    it signed: another child score, or their word that the parent's differed)."""
    replays = [p for p in peers if p.misreported or (p.replay is not None and signed is not None)]
    off = [p.peer for p in replays if p.misreported or abs(p.replay - signed) > tolerance]
    return replays, off


def disqualifying(quorum: int) -> int:
    """The peers whose replays or runs must agree before a claim is found misreported or void:
    the quorum, and never one peer alone. Either verdict costs the author its standing at once,
    and nobody looks at such a claim again, so at quorum 1 one framer's key that signed a false
    replay or void of every honest claim would silence every author for good."""
    return max(quorum, 2)


def judge(
    claim: Mapping[str, Any],
    looks: Iterable[Mapping[str, Any]],
    *,
    quorum: int,
    sigma: float,
    tolerance: float,
    reports: Iterable[Mapping[str, Any]] | None = None,
    suspect: bool = False,
) -> Judgement:
    """The state of one claim (a result row: author, child_scores, parent_scores, device) from
    the looks that count (verification rows by peers other than its author):

    - misreported: at least `quorum` peers, and never one alone (`disqualifying`), replayed the
      author's own seed on its device class and got a child score more than `tolerance` from
      the one signed (or said the parent's was), more of them than got the signed scores. With
      fewer, refuted if its looks refute it, else open, `awaits_replay`: never verified;
    - void: as many peers' harnesses refused the child's run, more than scored it. With fewer,
      either waits for another peer's replay (`awaits_replay`) or run;
    - verified: the pooled gain passes the sequential test for a gain above zero (`log_evalue`,
      at ALPHA) with the quorum - 1 most favourable peers left out, at least `quorum` peers;
      but open, `awaits_replay`, while no replay of the author's seed gave its numbers and
      either the author's claimed gain lies more than OUTLIER_Z standard errors above the
      pooled estimate or the author is a `suspect`: replays found it signing scores no run of
      its stands behind, on another claim or look (`consensus.suspects`);
    - refuted: the same test says the gain is below FUTILITY sigmas, with the quorum - 1 least
      favourable peers left out;
    - open: neither yet, or disputed (no majority of the peers agrees: `_outliers`); and
      `awaits_replay` while no replay of the author's seed came and the author's claimed gain
      lies more than OUTLIER_Z standard errors above the pooled estimate. A state is the
      evidence's now: later looks can revoke it.

    The author's word is weighed (`Judgement.author_z`) against the looks with the quorum - 1
    peers least on its side left out (`_author_z`), as the tests are.

    Before any of it, the `reports` (the looks of every peer whose word counts, those that may
    not judge this claim included; None: `looks`) are cross-checked seed by seed
    (`cross_check`): the looks of a peer that the replays of its seed contradict, or that are
    contested, count for nothing here. `sigma` is the profile's paired noise (a floor: see
    `_noise`)."""
    if quorum < 1:
        raise ValueError("quorum must be at least 1: a result cannot verify itself")
    looks = list(looks)
    checked = cross_check(looks if reports is None else reports, tolerance)
    peers = [p for p in peer_looks(looks, claim.get("device"), checked)
             if not (p.contradicted or p.contested)]  # fmt: skip
    signed = claimed_first_score(claim)
    # A replay's child score is checked here; its parent score only the replaying peer saw, and
    # its word for it weighs as a replay: either way, a majority of at least the quorum, and
    # of two peers, decides (`disqualifying`).
    # A replay of the author's seed that most replays, and at least two peers', contradict is a
    # report no run stands behind, as a look on a seed that replays contradict: judged, as the
    # seeds are (`cross_check`), on every peer's report, those that do not count here too.
    every, denied_by = _replays(
        peer_looks(reports, claim.get("device")) if reports is not None else peers, signed,
        tolerance,
    )  # fmt: skip
    counted = {p.peer for p in peers}  # the replays that weigh on this claim's state
    replays = [p for p in every if p.peer in counted]
    off = [peer for peer in denied_by if peer in counted]
    backed = len(every) - len(denied_by)
    outvoted = (
        set(denied_by) if backed >= disqualifying(quorum) and 2 * backed > len(every) else set()
    )
    scored = [p for p in peers if p.gains]
    voids = [p.peer for p in peers if p.void and not p.gains]
    outliers, disputed = _outliers(scored, _typical_noise(scored, sigma))
    if replays and len(off) not in (0, len(replays)) and 2 * len(off) != len(replays):
        minority = set(off) if 2 * len(off) < len(replays) else {p.peer for p in replays} - set(off)
        outliers = tuple(sorted(set(outliers) | minority))
    pool = [p for p in scored if p.peer not in outliers]
    sigma = _noise(pool, sigma)  # the outliers' looks weigh neither on the gain nor the noise
    total, n = _pool(pool)
    gain = total / n if n else None
    se = sigma / math.sqrt(n) if n else None
    author_z = _author_z(pool, quorum, sigma, claimed_gain(claim))
    base = {"gain": gain, "se": se, "seeds": n, "sigma": sigma,
            "peers": tuple(p.peer for p in pool), "outliers": outliers, "disputed": disputed,
            "author_z": author_z, "contradicted": tuple(sorted(checked.contradicted | outvoted)),
            "contested": tuple(sorted(checked.contested))}  # fmt: skip
    denied = 2 * len(off) > len(replays)  # most replays of the author's seed deny its score
    differ = (f"{len(off)} of {len(replays)} replays of the author's seed differ from its signed "
              f"score by more than {tolerance:g}")  # fmt: skip
    if denied and len(off) >= disqualifying(quorum):
        return Judgement("misreported", **base, misreported_by=tuple(sorted(off)), reason=differ)
    refused = len(voids) > len(scored)  # most peers' harnesses refused to score its run
    if refused and len(voids) >= disqualifying(quorum):
        return Judgement("void", **base, reason=f"{len(voids)} peers' harnesses refused its run")
    if denied:  # on too few peers' word: it sinks no claim, nor lifts one its looks refute
        if not disputed and _passes(pool, quorum, sigma, FUTILITY * sigma, -1):
            return Judgement("refuted", **base, misreported_by=tuple(sorted(off)),
                             reason=f"{_summary(gain, se, n, len(pool), checked)}; {differ}")  # fmt: skip
        return Judgement("open", **base, awaits_replay=True, misreported_by=tuple(sorted(off)),
                         reason=f"{differ}: it waits for another peer's replay")  # fmt: skip
    if refused:
        return Judgement("open", **base, reason=f"{len(voids)} peer(s)' harnesses refused its "
                         "run: it waits for another peer's look")  # fmt: skip
    if disputed:
        return Judgement("open", **base, reason="disputed: no majority of its verifiers agree")
    if _passes(pool, quorum, sigma, 0.0, +1):
        overclaimed = author_z is not None and author_z > OUTLIER_Z
        if (overclaimed or suspect) and len(replays) == len(off):
            # The author signed a gain its verifiers' looks cannot explain, or replays caught it
            # signing scores no run stands behind elsewhere: its numbers are taken only once a
            # replay of its own seed gives them.
            why = (f"its author's claimed gain lies {author_z:.1f} standard errors above what "
                   f"its verifiers measured" if overclaimed else "replays found its author "
                   "signing scores no run stands behind, on another claim")  # fmt: skip
            return Judgement(
                "open", **base, awaits_replay=True,
                reason=f"{why}: it waits for a replay of the author's seed",
            )  # fmt: skip
        return Judgement("verified", **base, reason=_summary(gain, se, n, len(pool), checked))
    if _passes(pool, quorum, sigma, FUTILITY * sigma, -1):
        return Judgement("refuted", **base, reason=_summary(gain, se, n, len(pool), checked))
    if author_z is not None and author_z > OUTLIER_Z and not replays:
        # Too few looks to decide the change, enough to doubt its author's word: as a verified
        # claim's overclaim, it waits for a replay of the author's seed, and standing counts it.
        return Judgement(
            "open", **base, awaits_replay=True,
            reason=f"{_summary(gain, se, n, len(pool), checked)}; its author's claimed gain lies "
            f"{author_z:.1f} standard errors above it: it waits for a replay of the author's seed",
        )  # fmt: skip
    return Judgement("open", **base, reason=_summary(gain, se, n, len(pool), checked))


def _author_z(
    peers: Sequence[PeerLooks], quorum: int, sigma: float, claimed: tuple[float, int] | None
) -> float | None:
    """How many standard errors the author's `claimed` (gain, seeds) lies above the pooled gain
    of the looks with the quorum - 1 peers least on its side left out, so that quorum - 1
    framers alone never make an author's word look far above its looks (`_passes`); None with
    fewer than `quorum` peers or no claimed gain."""
    if claimed is None or len(peers) < quorum:
        return None
    total, n = _pool(sorted(peers, key=lambda p: (p.mean, p.peer))[quorum - 1 :])
    return (claimed[0] - total / n) / (spread(sigma, total / n) * math.sqrt(1 / claimed[1] + 1 / n))


def _summary(
    gain: float | None, se: float | None, n: int, peers: int, checked: CrossCheck = CrossCheck()
) -> str:
    said = "no scored looks yet" if gain is None or se is None else (
        f"gain {gain:+.4f} +- {se:.4f} over {n} seeds from {peers} peer(s)"
    )  # fmt: skip
    if checked.contradicted:
        said += f"; replays contradict the looks of {len(checked.contradicted)} peer(s)"
    if checked.contested:
        said += f"; {len(checked.contested)} peers' reports of a seed disagree, awaiting a replay"
    return said
