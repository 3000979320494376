"""Who looks at what, as one node reads its ledger: the claims it is drawn to judge, the
seeds it is drawn to replay, whether an author's seed still wants a replay, and the peers'
discards it is drawn to replay (`node.agent.discards`). The draws themselves are hashes of
public values (`node.committees`): nobody picks them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from node import committees, consensus, evidence, noise
from node.agent import discards
from node.identity import Identity
from node.ledger import Ledger
from node.trainer import Profile

ACTIVE_MS = 3_600_000  # a peer that published in the last hour is active: it may be drawn to look
# The chance that a node drawn to replay the discards on a head of a peer whose discards replays
# backed before does so: a coin only this node can toss (its signature), so that a peer cannot
# tell on which heads it may sign discards no run stands behind unseen.
AUDIT_SHARE = 0.25


@dataclass(frozen=True)
class Draws:
    """The draws of the node `identity` on `profile` under `quorum`."""

    ledger: Ledger
    identity: Identity
    profile: Profile
    quorum: int
    harness: str

    @property
    def me(self) -> str:
        return self.identity.peer_id

    def drawn(self, claims: list, rules: consensus.Rules | None = None, out=None) -> list:
        """The claims this node is drawn to judge at once (`committees`, from the members or
        `active`): nobody picks them, and they look in parallel at the next step. `rules`,
        `out` (the contradicted peers): the ledger's, when the caller read them already."""
        if not claims:
            return claims
        rules = rules or self.ledger.rules(self.profile.name, self.quorum)
        if rules.members is not None:  # the committee, a contradicted member's seat made good
            out = self.ledger.contradicted() if out is None else out
            return [c for c in claims if self.me in committees.panel(c, rules, out)]
        active = self.active()  # one query for them all
        return [c for c in claims if self.me in committees.committee(
            committees.look_draw(c, None), c["author"], active, rules.committee_size)]  # fmt: skip

    def replayer(self, claim: dict, seed: int | None = None) -> bool:
        """Whether this node is drawn to replay a seed of `claim`, its author's (None) or that
        of other peers' looks: the first of those drawn for the seed (`committees`, from the
        members or `active`, less the peers that reported it), and one more every ACTIVE_MS
        since the claim was made, so that another steps in when that one left."""
        rules = self.ledger.rules(self.profile.name, self.quorum)
        waited = max(0, self.ledger.clock() - claim["time"]) // ACTIVE_MS
        pool = rules.members_for(claim) or self.active()
        key = committees.look_draw(claim, rules.members)
        if seed is not None:
            key = f"{key}:{seed}"
            reported = self.ledger.rows(
                "SELECT author FROM verifications WHERE result = ? AND seed = ?",
                (claim["id"], seed),
            )
            pool = pool - {r["author"] for r in reported}
        ranked = committees.committee(key, claim["author"], pool, rules.committee_size)
        return self.me in ranked[: 1 + waited]

    def looked_at(self, rid: str) -> bool:
        """Whether this node published a look at the claim `rid`."""
        return bool(self.ledger.rows(
            "SELECT 1 FROM verifications WHERE result = ? AND author = ? LIMIT 1", (rid, self.me)
        ))  # fmt: skip

    def active(self) -> frozenset[str]:
        """Whom the lookers at a claim are drawn from in an open campaign (else the members):
        the peers active in the last ACTIVE_MS and this one, so that a peer that left drops out
        of the draw within that time and the next in rank takes its place."""
        rows = self.ledger.rows(
            "SELECT peer_id FROM peers WHERE last_seen >= ?", (self.ledger.clock() - ACTIVE_MS,)
        )
        return frozenset(r["peer_id"] for r in rows) | {self.me}

    def replays_due(self, claim: dict) -> bool:
        """Whether the author's seed of `claim` should still be replayed: until one
        peer's replay gave the signed score, with none differing; once replays differ, until as
        many peers replayed as sit on a committee (`consensus.Rules.committee_size`), whose
        majority then decides (`evidence.judge`). More replays of one seed tell nothing new."""
        rules = self.ledger.rules(self.profile.name, self.quorum)
        rows = self.ledger.rows(
            "SELECT author, replay_val_bpb, verdict FROM verifications WHERE result = ? "
            "AND (replay_val_bpb IS NOT NULL OR verdict = 'misreported')",
            (claim["id"],),
        )
        signed = evidence.claimed_first_score(claim)
        off = {r["author"] for r in rows if r["verdict"] == "misreported" or signed is None
               or abs(r["replay_val_bpb"] - signed) > self.profile.replay_tolerance}  # fmt: skip
        agree = {r["author"] for r in rows} - off
        return not agree if not off else len(agree | off) < rules.committee_size

    def discard(self, parent: str | None, hiding: tuple[str, ...] = ()) -> dict | None:
        """A peer's discard on `parent` this node is drawn to replay (`discards.to_replay`):
        from the members, else the active peers; on this node's device class; of a peer whose
        discards replays backed before, on AUDIT_SHARE of the heads. `hiding`: one of a peer's
        discards of these changes, which this node would try next but for them, drawn or not."""
        device = noise.device_of(self.ledger, self.profile.name)
        if parent is None or not device:
            return None
        rules = self.ledger.rules(self.profile.name, self.quorum)
        pool = self.active() if rules.members is None else rules.members

        def audit(author: str) -> bool:
            coin = hashlib.sha256(self.identity.sign(f"discards:{parent}:{author}".encode()))
            return int.from_bytes(coin.digest()[:8]) < AUDIT_SHARE * 2**64

        return discards.to_replay(self.ledger, self.me, self.profile.name, self.harness, parent,
                                  device, pool, ACTIVE_MS, audit, hiding)  # fmt: skip
