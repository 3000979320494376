"""What one simulated node holds and believes: its facts, its best head, the claims it would verify.

Two honest implementations of one face. `LedgerView` is a real `Ledger` per node (in memory):
every fact it receives passes `wire.decode` (signature included) and SQLite, and the head and
claims come from `adoption.best_head` and `verifier.ledger_claims_to_verify`, as in a live node.
`SharedView` is the view at scale: the set of facts the node holds of one shared store whose
facts were each checked once when signed, fed to the same `consensus` and `verifier` functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from node import consensus, standing, wire
from node.agent import adoption, verifier
from node.agent.proposers import Proposal
from node.identity import Identity
from node.ledger import Ledger
from node.simulation.landscape import HARNESS
from node.simulation.network import FactStore

CAMPAIGN = "sim"
PROFILE = "gpu"
EPOCH_MS = 1_800_000_000_000  # virtual second 0, as a fact's time in ms (fixed: determinism)
CLAIMS_PER_LOOK = 3  # the Researcher looks at this many open claims per verification step


def time_ms(now: float) -> int:
    return EPOCH_MS + int(round(now * 1000))


class SharedView:
    """A node's view over the shared store: the facts it holds (a row of `store.held`), and the
    kept results and verifications among them, which are all `consensus.best_head` and
    `verifier.claims_to_verify` read (both leave every other result out first).

    `best_head` is given only the kept results that hold a look in the view, with their
    verifications: a result no peer looked at is never verified, whatever the quorum, so the
    head is the same as from all facts, for far less work at a thousand nodes."""

    def __init__(self, store: FactStore, node: int, baseline: str, rules: consensus.Rules) -> None:
        self.store, self.node, self.baseline, self.rules = store, node, baseline, rules
        self.kept: list[dict] = []
        self.verifications: list[dict] = []
        self.checks_of: dict[str, list[dict]] = {}  # result id -> its verifications here
        self.kept_by_id: dict[str, dict] = {}
        self.confirmed: dict[str, dict] = {}  # kept results with a look here
        self.seq = 0
        self._best: tuple[Any, str] = (None, baseline)
        self._claims: tuple[Any, list] = (None, [])

    def add(self, indices: Iterable[int], now: float) -> int:
        """Take facts into the view (those already held are skipped); returns how many were new."""
        held, rows, new = self.store.held, self.store.rows, 0
        for i in indices:
            if held[self.node, i]:
                continue
            held[self.node, i] = True
            new += 1
            row = rows[i]
            if "verdict" in row:
                self.verifications.append(row)
                self.checks_of.setdefault(row["result"], []).append(row)
                kept = self.kept_by_id.get(row["result"])
                if kept is not None:
                    self.confirmed[row["result"]] = kept
            elif row["outcome"] == "keep":
                self.kept.append(row)
                self.kept_by_id[row["id"]] = row
                if self.checks_of.get(row["id"]):
                    self.confirmed[row["id"]] = row
        return new

    def _key(self) -> tuple[int, int]:
        return len(self.kept), len(self.verifications)

    def best_head(self) -> str:
        if self._best[0] != self._key():  # a pure function of the view: same view, same head
            checks = [v for rid in self.confirmed for v in self.checks_of[rid]]
            head = consensus.best_head(
                list(self.confirmed.values()), checks, PROFILE, self.baseline, self.rules,
                HARNESS,
            )  # fmt: skip
            self._best = (self._key(), head)
        return self._best[1]

    def merges(self, head: str, version: Callable[[str], bytes | None]) -> list[Proposal]:
        """`adoption.merges_onto` the head: the other verified wins, merged three-way onto it.
        Its answer depends on the head and on which wins are verified only, so nodes share it
        (`store.merges`): a thousand nodes adopting one head merge once. At this scale the
        head's lineage is walked through the verified results."""
        confirmed = list(self.confirmed.values())
        checks = [v for rid in self.confirmed for v in self.checks_of[rid]]
        judged = consensus.judge_claims(confirmed, checks, self.rules)
        verified = {rid: j for rid, j in judged.items() if j.state == "verified"}
        key = (head, frozenset(verified))
        if key not in self.store.merges:
            rows = [self.confirmed[rid] for rid in verified]
            self.store.merges[key] = adoption.merges_onto(head, rows, verified, version)
        return self.store.merges[key]

    def claims(self, me: str) -> list[Mapping[str, Any]]:
        if self._claims[0] != self._key():
            # As `ledger_claims_to_verify`: claims of peers that lost standing are skipped.
            skip = standing.silenced(
                standing.peer_standing(self.kept, self.verifications, lambda _: self.rules)
            )
            found = verifier.claims_to_verify(
                self.kept, self.verifications, me, PROFILE, HARNESS, self.rules,
                limit=CLAIMS_PER_LOOK, baseline=self.baseline, skip=skip,
            )  # fmt: skip
            self._claims = (self._key(), found)
        return self._claims[1]

    def sign(self, me: Identity, kind: str, body: dict, now: float) -> wire.Fact:
        self.seq += 1
        return wire.sign(me, kind, CAMPAIGN, self.seq, body, time_ms(now))

    def own(self, index: int, now: float) -> None:
        """Take this node's own fact, once the store holds it as `index`."""
        self.add([index], now)

    def close(self) -> None:
        pass


class LedgerView(SharedView):
    """A real in-memory `Ledger` per node: every received fact is decoded, its signature checked
    and stored again by this node, as a live node does."""

    def __init__(self, store: FactStore, node: int, baseline: str, rules: consensus.Rules) -> None:
        super().__init__(store, node, baseline, rules)
        self.ledger = Ledger(":memory:", campaign=CAMPAIGN)
        self.facts = 0
        self.rejected = 0

    def add(self, indices: Iterable[int], now: float) -> int:
        held = self.store.held
        new = [i for i in indices if not held[self.node, i]]
        if not new:
            return 0
        held[self.node, new] = True
        out = self.ledger.ingest_many([self.store.facts[i].raw for i in new], now_ms=time_ms(now))
        self.rejected += sum(isinstance(item, wire.Rejection) for item in out)
        self.facts += len(new)
        return len(new)

    def _key(self) -> tuple[int, int]:
        return self.facts, 0

    def best_head(self) -> str:
        if self._best[0] != self._key():
            results, verifications = self.ledger.claim_rows(PROFILE)
            head = consensus.best_head(
                results, verifications, PROFILE, self.baseline, self.rules, HARNESS
            )
            self._best = (self._key(), head)
        return self._best[1]

    def merges(self, head: str, version: Callable[[str], bytes | None]) -> list[Proposal]:
        """`adoption.merges_onto` over this ledger's rows; versions come by hash from `version`
        (the gossip layer's fetch, in a live node)."""
        results, verifications = self.ledger.claim_rows(PROFILE)
        kept = consensus.versions_of(results, PROFILE, HARNESS)
        judged = consensus.judge_claims(kept, verifications, self.rules)
        return adoption.merges_onto(head, kept, judged, version)

    def claims(self, me: str) -> list[Mapping[str, Any]]:
        if self._claims[0] != self._key():
            # As `verifier.ledger_claims_to_verify`, under the simulation's rules.
            results, verifications = self.ledger.claim_rows(PROFILE)
            skip = standing.silenced(
                standing.peer_standing(results, verifications, lambda _: self.rules)
            )
            found = verifier.claims_to_verify(
                results, verifications, me, PROFILE, HARNESS, self.rules, limit=CLAIMS_PER_LOOK,
                baseline=self.baseline, skip=skip,
            )  # fmt: skip
            self._claims = (self._key(), found)
        return self._claims[1]

    def sign(self, me: Identity, kind: str, body: dict, now: float) -> wire.Fact:
        return self.ledger.publish(me, kind, body, time_ms(now))

    def own(self, index: int, now: float) -> None:
        self.store.held[self.node, index] = True  # `publish` stored it in the ledger already
        self.facts += 1

    def close(self) -> None:
        self.ledger.close()
