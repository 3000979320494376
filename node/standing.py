"""Standing of peers: whose looks and claims this node still counts, derived from what it holds.

Standing is earned by a verified history (claims the evidence verified, looks that agreed with
the pooled estimate) and lost for what noise does not explain: a look far outside the pooled
estimate of the others, a look that replays of its seed contradict, a claimed gain far above
what the verifiers measured, a claim found void or misreported. Honest noise (a chance win
refuted, an inconclusive look) costs nothing.
A peer recovers once its good evidence outweighs the bad again. Pure functions, except
`ledger_standing`, which reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from node import consensus, evidence

if TYPE_CHECKING:
    from node.ledger import Ledger

RECOVERY = 4  # good events (verified claims, agreeing looks) that outweigh one bad event
DECIDED = frozenset(
    {"verified", consensus.HELD, "refuted", consensus.UNPROVEN, *consensus.DISQUALIFYING}
)
# Refused messages cost the points the gossip layer charges for them (`gossip.Limits`: 1 for an
# invalid fact, 0.2 for a message over the rate, 20 for a junk frame), and a peer that earns a
# ban's worth in its lifetime is banned: the same scale as a ban, but without decay.
MAX_OFFENCE_POINTS = 20.0
OFFENCE_POINTS = {"flood": 0.2, "junk": 20.0}  # every other reason: 1
# Not held against a peer: a newer protocol (forward compatibility) and stale heads, which honest
# relays deliver out of order.
FORGIVEN = frozenset({"unknown_version", "unknown_kind", "seq_backwards"})
UNKNOWN = "unknown"  # the ledger's name for a courier it could not tell
RulesFor = Callable[[str], consensus.Rules]  # a profile's rules


@dataclass(frozen=True)
class Standing:
    """One peer's standing in this node's eyes, and the evidence behind it."""

    peer: str
    claims: int = 0  # its kept claims the evidence has decided
    verified: int = 0  # of those, verified (or verified and held for more looks)
    failed: int = 0  # of those, refuted, unproven, void or misreported
    voided: int = 0  # of those, found void: its score broke the harness's rules
    misreported: int = 0  # of those, found misreported: it signed other scores than it ran
    overclaimed: int = 0  # of those, a claimed gain far above what the verifiers measured
    looks: int = 0  # claims decided with its looks among the pooled ones
    outlying: int = 0  # claims where its looks lay far outside the others'
    contradicted: int = 0  # claims where replays of its seed gave other scores than it signed
    offences: Mapping[str, int] = field(default_factory=dict)  # refused messages by reason
    points: float = 0.0  # the offences, weighted
    reasons: tuple[str, ...] = ()  # why it lost standing; empty while it has it

    @property
    def silenced(self) -> bool:
        return bool(self.reasons)

    @property
    def banned(self) -> bool:
        """Its refused messages alone cost it standing: the transport drops what it sends."""
        return self.points >= MAX_OFFENCE_POINTS

    @property
    def bad(self) -> int:
        return self.voided + self.misreported + self.overclaimed + self.outlying + self.contradicted

    @property
    def good(self) -> int:
        return self.verified + self.looks

    @property
    def status(self) -> str:
        if self.silenced:
            return "silenced"
        return "watched" if self.bad or self.points else "good"

    def as_dict(self) -> dict:
        return {"peer": self.peer, "status": self.status, "claims": self.claims,
                "verified": self.verified, "failed": self.failed, "voided": self.voided,
                "misreported": self.misreported, "overclaimed": self.overclaimed,
                "looks": self.looks, "outlying": self.outlying,
                "contradicted": self.contradicted, "offences": dict(self.offences),
                "points": round(self.points, 2), "reasons": list(self.reasons)}  # fmt: skip


def offence_points(offences: Mapping[str, int]) -> float:
    return sum(OFFENCE_POINTS.get(reason, 1.0) * n for reason, n in offences.items()
               if reason not in FORGIVEN)  # fmt: skip


def _tally(
    results: Iterable[Mapping[str, Any]], judged: Mapping[str, evidence.Judgement]
) -> dict[str, dict[str, Any]]:
    """Per peer: its decided claims by state, and the claims its looks agreed or disagreed on."""
    tally: dict[str, dict[str, Any]] = {}

    def of(peer: str) -> dict[str, Any]:
        return tally.setdefault(peer, {"claims": 0, "verified": 0, "failed": 0, "void": [],
                                       "misreported": [], "overclaimed": [], "looks": 0,
                                       "outlying": [], "contradicted": []})  # fmt: skip

    for r in sorted(results, key=lambda r: r["id"]):
        j = judged.get(r["id"])
        author = of(r["author"])
        for peer in () if j is None else j.contradicted:  # whatever the claim's state
            of(peer)["contradicted"].append(r["id"])
        # A claim that waits for a replay of its author's seed (`awaits_replay`) because its
        # author's word lies far above its looks tells as much of its author as a decided one;
        # one that waits only because a replay denied its score tells nothing until another
        # agrees.
        far = j is not None and j.author_z is not None and j.author_z > evidence.OUTLIER_Z
        waits = j is not None and j.awaits_replay and (far or not j.misreported_by)
        if j is None or j.disputed or not (j.state in DECIDED or waits):
            continue
        author["claims"] += 1
        author["verified"] += j.state in ("verified", consensus.HELD)
        author["failed"] += j.state in DECIDED and j.state not in ("verified", consensus.HELD)
        if j.state in consensus.DISQUALIFYING:
            author[j.state].append(r["id"])
        elif far:
            author["overclaimed"].append(r["id"])
        for peer in j.peers:
            of(peer)["looks"] += 1
        for peer in j.outliers:
            of(peer)["outlying"].append(r["id"])
    return tally


def peer_standing(
    results: Iterable[Mapping[str, Any]], verifications: Iterable[Mapping[str, Any]],
    rules_for: RulesFor, offences: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Standing]:  # fmt: skip
    """Every peer's standing from the facts and counts this node holds. Same inputs, same answer.

    `results` carry what `consensus.judge_claims` reads (only kept ones are claims; a result its
    own node published as void was never claimed, and costs nothing); `verifications` likewise;
    `rules_for` gives each profile's rules; `offences` carry peer_id, reason and count (the
    ledger's `rejections`). Every look counts here, a silenced peer's too: that is how it
    recovers. A peer is silenced while its bad events (looks far outside the others', claims
    found void or misreported, claimed gains far above the measured) are not outweighed
    RECOVERY to one by good ones (claims verified, looks that agreed), or while the messages
    this node refused from it weigh MAX_OFFENCE_POINTS or more."""
    results, verifications = list(results), list(verifications)
    judged_by_profile = []
    for profile in sorted({r["profile"] for r in results}):
        mine = [r for r in results if r["profile"] == profile]
        judged_by_profile.append(
            (mine, consensus.judge_claims(mine, verifications, rules_for(profile)))
        )
    return standing_of(judged_by_profile, {v["author"] for v in verifications}, offences)


def standing_of(
    judged_by_profile: Iterable[tuple[Iterable[Mapping[str, Any]], Mapping[str, evidence.Judgement]]],
    verifiers: Iterable[str] = (), offences: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Standing]:  # fmt: skip
    """`peer_standing` from claims already judged: (result rows, their judgements) per profile,
    the peers that published looks, and the refused messages."""
    tally: dict[str, dict[str, Any]] = {}
    for results, judged in judged_by_profile:
        for peer, counts in _tally(results, judged).items():
            into = tally.setdefault(
                peer, {k: [] if isinstance(v, list) else 0 for k, v in counts.items()}
            )
            for k, v in counts.items():
                into[k] += v
    for peer in verifiers:
        tally.setdefault(peer, {})
    refused: dict[str, dict[str, int]] = {}
    for row in offences:
        if row["peer_id"] != UNKNOWN and row["count"]:
            counted = refused.setdefault(row["peer_id"], {})
            counted[row["reason"]] = counted.get(row["reason"], 0) + int(row["count"])
    return {peer: _judge(peer, tally.get(peer, {}), refused.get(peer, {}))
            for peer in sorted(set(tally) | set(refused))}  # fmt: skip


def _judge(peer: str, t: Mapping[str, Any], offences: Mapping[str, int]) -> Standing:
    s = Standing(
        peer, claims=t.get("claims", 0), verified=t.get("verified", 0), failed=t.get("failed", 0),
        voided=len(t.get("void", ())), misreported=len(t.get("misreported", ())),
        overclaimed=len(t.get("overclaimed", ())), looks=t.get("looks", 0),
        outlying=len(t.get("outlying", ())), contradicted=len(t.get("contradicted", ())),
        offences=dict(offences),
        points=offence_points(offences),
    )  # fmt: skip
    reasons = []
    if s.bad and s.good < RECOVERY * s.bad:
        events = [
            (t.get("void", ()), "found void: its score broke the harness's rules"),
            (t.get("misreported", ()), "found misreported: replays of its seed gave other scores"),
            (t.get("overclaimed", ()), "claimed a gain far above what its verifiers measured"),
            (t.get("outlying", ()), "looked far outside the pooled estimate of the others"),
            (
                t.get("contradicted", ()),
                "signed looks or replays that other peers' replays contradict",
            ),
        ]
        said = "; ".join(
            f"{len(ids)} claim(s) {why} (first {min(ids)[:12]})" for ids, why in events if ids
        )
        reasons.append(f"{said}; {s.good} good against {s.bad} bad, needs {RECOVERY} to 1")
    if s.banned:
        listed = ", ".join(f"{reason} {n}" for reason, n in sorted(offences.items()))
        reasons.append(f"refused messages worth {s.points:g} points ({listed})")
    return Standing(**{**s.__dict__, "reasons": tuple(reasons)})


def silenced(standing: Mapping[str, Standing]) -> set[str]:
    """The peers that lost standing."""
    return {peer for peer, s in standing.items() if s.silenced}


def banned(standing: Mapping[str, Standing]) -> set[str]:
    """The peers whose refused messages alone cost them standing."""
    return {peer for peer, s in standing.items() if s.banned}


def ledger_standing(ledger: Ledger) -> dict[str, Standing]:
    """`peer_standing` over everything the ledger holds, all profiles, from the judgements it
    keeps under its campaign's rules (`Ledger.standings`)."""
    judged = []
    for profile in ledger.profiles():
        _, claims, results = ledger.standings(profile, every=True)
        judged.append((results, claims))
    verifiers = [r["author"] for r in ledger.rows("SELECT DISTINCT author FROM verifications")]
    offences = ledger.rows("SELECT peer_id, reason, count FROM rejections")
    return standing_of(judged, verifiers, offences)
