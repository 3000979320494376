"""Standing of peers: whether this node still listens to a peer, derived from what it holds.

A peer loses standing through rates over enough evidence: its kept claims that the swarm
refuted (or could not run), its confirmations of such claims, and the messages this node
refused from it. One event suffices only where noise cannot explain it: a kept claim whose
re-runs the verifiers' harness voided (it broke the measurement's rules), or whose replays on
the author's own seed gave other scores than it signed (misreported). A peer that lost standing does not regain it: the
facts and counts behind the verdict stay. Pure functions, except `ledger_standing`, which reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from node import consensus

if TYPE_CHECKING:
    from node.ledger import Ledger

MIN_FAILED = 3  # failed claims before the share of failures counts: noise refutes honest wins too
MIN_FALSE_CONFIRMS = 3  # confirmations of failed claims before their share counts
# Refused messages cost the points the gossip layer charges for them (`gossip.Limits`: 1 for an
# invalid fact, 0.2 for a message over the rate, 20 for a junk frame), and a peer that earns a
# ban's worth in its lifetime loses its standing: the same scale as a ban, but without decay.
MAX_OFFENCE_POINTS = 20.0
OFFENCE_POINTS = {"flood": 0.2, "junk": 20.0}  # every other reason: 1
# Not held against a peer: a newer protocol (forward compatibility) and stale heads, which honest
# relays deliver out of order.
FORGIVEN = frozenset({"unknown_version", "unknown_kind", "seq_backwards"})
UNKNOWN = "unknown"  # the ledger's name for a courier it could not tell


@dataclass(frozen=True)
class Standing:
    """One peer's standing in this node's eyes, and the evidence behind it."""

    peer: str
    claims: int = 0  # its kept claims the swarm has settled: verified or failed
    failed: int = 0  # of those, refuted by the quorum, or not reproduced by it
    voided: int = 0  # of those, found void by the quorum: its score broke the harness's rules
    misreported: int = 0  # of those, found misreported by the quorum: it signed other scores
    confirms: int = 0  # its confirmations of other peers' settled claims
    false_confirms: int = 0  # of those, confirmations of claims that failed
    offences: Mapping[str, int] = field(default_factory=dict)  # refused messages by reason
    points: float = 0.0  # the offences, weighted
    reasons: tuple[str, ...] = ()  # why it lost standing; empty while it has it

    @property
    def silenced(self) -> bool:
        return bool(self.reasons)

    @property
    def status(self) -> str:
        if self.silenced:
            return "silenced"
        return "watched" if self.failed or self.false_confirms or self.points else "good"

    def as_dict(self) -> dict:
        return {"peer": self.peer, "status": self.status, "claims": self.claims,
                "failed": self.failed, "voided": self.voided, "misreported": self.misreported,
                "confirms": self.confirms,
                "false_confirms": self.false_confirms, "offences": dict(self.offences),
                "points": round(self.points, 2), "reasons": list(self.reasons)}  # fmt: skip


def unreproduced_claims(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    quorum: int = 1,
) -> set[str]:
    """Results that at least `quorum` distinct peers other than the author could not reproduce as
    a win, refuting it, finding that its child crashes or that their harness voids its run (same
    harness and profile), and more of them than confirm it. Consensus counts a crash neither way
    (a smaller GPU may run out of memory); here a claimed win that crashes for the quorum is a
    claim that failed."""
    failed = set()
    for rid, by in consensus.peer_verdicts(results, verifications).items():
        no_win = sum(v in ("refute", "crash", *consensus.DISQUALIFYING) for v in by.values())
        if no_win >= quorum and no_win > sum(v == "confirm" for v in by.values()):
            failed.add(rid)
    return failed


def void_claims(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    quorum: int = 1,
    verdict: str = "void",
) -> dict[str, int]:
    """{result id: how many peers found it void}: the results that at least `quorum` distinct
    peers other than the author found void (their harness refused to score their re-run of the
    child; same harness and profile), more of them than confirm it. No noise voids a run. With
    `verdict` "misreported": the claims whose replays gave other scores than the author signed
    (beyond the profile's replay tolerance, which bounds the noise of a replay)."""
    found = {}
    for rid, by in consensus.peer_verdicts(results, verifications).items():
        n = sum(v == verdict for v in by.values())
        if n >= quorum and n > sum(v == "confirm" for v in by.values()):
            found[rid] = n
    return found


def offence_points(offences: Mapping[str, int]) -> float:
    return sum(OFFENCE_POINTS.get(reason, 1.0) * n for reason, n in offences.items()
               if reason not in FORGIVEN)  # fmt: skip


def peer_standing(
    results: Iterable[Mapping[str, Any]], verifications: Iterable[Mapping[str, Any]],
    offences: Iterable[Mapping[str, Any]] = (), quorum: int = 1,
) -> dict[str, Standing]:  # fmt: skip
    """Every peer's standing from the facts and counts this node holds. Same inputs, same answer.

    `results` carry id, author, outcome, profile and harness (only kept ones are claims; a
    result its own node published as void was never claimed, and costs nothing);
    `verifications` carry result, author, verdict, profile, harness, delta and seed; `offences`
    carry peer_id, reason and count (the ledger's `rejections`). A peer is silenced when
    - one of its kept claims was found void or misreported by the quorum (`void_claims`): at
      once; or
    - at least MIN_FAILED of its kept claims failed (refuted by the quorum's rule, or not
      reproduced: `unreproduced_claims`)
      and more failed than were verified; or
    - at least MIN_FALSE_CONFIRMS of its confirmations went to claims that failed, and more than
      to claims that were verified; or
    - the messages this node refused from it weigh MAX_OFFENCE_POINTS or more.
    """
    kept = {r["id"]: r for r in results if r["outcome"] == "keep"}
    verifications = list(verifications)
    verified = set(consensus.verified_children(kept.values(), verifications, quorum))
    voided = void_claims(kept.values(), verifications, quorum)
    misreported = void_claims(kept.values(), verifications, quorum, "misreported")
    failed = (consensus.refuted_claims(kept.values(), verifications, quorum) | set(voided)
              | set(misreported)
              | unreproduced_claims(kept.values(), verifications, quorum)) - verified  # fmt: skip
    evidence: dict[str, dict[str, Any]] = {}

    def of(peer: str) -> dict[str, Any]:
        return evidence.setdefault(peer, {"claims": 0, "failed": 0, "void": {}, "misreported": {},
                                          "confirms": set(), "false": set(), "offences": {}})  # fmt: skip

    for r in kept.values():
        of(r["author"])
    for rid in verified | failed:
        entry = of(kept[rid]["author"])
        entry["claims"] += 1
        entry["failed"] += rid in failed
        if rid in voided:
            entry["void"][rid] = voided[rid]
        if rid in misreported:
            entry["misreported"][rid] = misreported[rid]
    for v in verifications:
        of(v["author"])
    for rid, by in consensus.peer_verdicts(kept.values(), verifications).items():
        # A peer's verdict is its strongest against the claim: one that confirmed a claim and
        # then found it void on a second look corrected itself, and is no false confirmer.
        for peer in (p for p, verdict in by.items() if verdict == "confirm"):
            if rid in verified:
                of(peer)["confirms"].add(rid)
            elif rid in failed:
                of(peer)["false"].add(rid)
    for row in offences:
        if row["peer_id"] != UNKNOWN and row["count"]:
            counted = of(row["peer_id"])["offences"]
            counted[row["reason"]] = counted.get(row["reason"], 0) + int(row["count"])
    return {peer: _judge(peer, e) for peer, e in evidence.items()}


def _judge(peer: str, e: dict[str, Any]) -> Standing:
    good, false = len(e["confirms"]), len(e["false"])
    points = offence_points(e["offences"])
    reasons = []
    for kind, why in (("void", "its score broke the harness's rules"),
                      ("misreported", "their replays of its own run gave other scores than it signed")):
        if e[kind]:
            rid, n = min(e[kind].items())
            more = f" (and {len(e[kind]) - 1} more of its claims)" if len(e[kind]) > 1 else ""
            reasons.append(f"its claim {rid[:12]} was found {kind} by {n} peer(s): {why}{more}")  # fmt: skip
    verified = e["claims"] - e["failed"]
    if e["failed"] >= MIN_FAILED and e["failed"] > verified:
        reasons.append(f"{e['failed']} of its {e['claims']} settled claims failed")
    if false >= MIN_FALSE_CONFIRMS and false > good:
        reasons.append(f"it confirmed {false} claims that failed (and {good} that held)")
    if points >= MAX_OFFENCE_POINTS:
        listed = ", ".join(f"{reason} {n}" for reason, n in sorted(e["offences"].items()))
        reasons.append(f"refused messages worth {points:g} points ({listed})")
    return Standing(peer, claims=e["claims"], failed=e["failed"], voided=len(e["void"]),
                    misreported=len(e["misreported"]),
                    confirms=good + false, false_confirms=false, offences=dict(e["offences"]),
                    points=points, reasons=tuple(reasons))  # fmt: skip


def silenced(standing: Mapping[str, Standing]) -> set[str]:
    """The peers that lost standing."""
    return {peer for peer, s in standing.items() if s.silenced}


def ledger_standing(ledger: Ledger, quorum: int = 1) -> dict[str, Standing]:
    """`peer_standing` over everything the ledger holds, all profiles."""
    results = ledger.rows(
        "SELECT id, author, outcome, profile, harness FROM results WHERE outcome = 'keep'"
    )
    verifications = ledger.rows(
        "SELECT result, author, verdict, profile, harness, delta, seed FROM verifications"
    )
    offences = ledger.rows("SELECT peer_id, reason, count FROM rejections")
    return peer_standing(results, verifications, offences, quorum)
