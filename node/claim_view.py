"""One claim as a person reads it (`swarm ledger claim`): its judgement under the campaign's
rules, the committee that judges it, and every look at it, each with whether it counts and, if
not, why, as far as the look and the judgement say."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from node import committees
from node.evidence import Judgement
from node.ledger import Ledger, LedgerError


def claim_view(ledger: Ledger, result_id: str, quorum: int | None = None) -> dict:
    """One claim (a kept result: fact id or unique prefix) under the campaign's quorum (or
    `quorum`): the result row, its judgement (`state`, pooled `gain` and `gain_se` over `seeds`,
    `why`, the `counted` peers, its committee's `seats`, null in an open campaign, `outliers`,
    `contradicted`) and every look at it, oldest first, with `counts` and `note` (why not)."""
    fact_id = ledger.fact(result_id)["id"]
    rows = ledger.rows("SELECT * FROM results WHERE id = ?", (fact_id,))
    if not rows:
        raise LedgerError(
            f"fact {fact_id[:12]} is no result, so it claims nothing: "
            f"see it with 'swarm ledger show {fact_id[:12]}'"
        )
    row = rows[0]
    if row["outcome"] != "keep":
        raise LedgerError(
            f"result {fact_id[:12]} was not kept ({row['outcome']}), so it claims nothing: "
            f"see it with 'swarm ledger show {fact_id[:12]}'"
        )
    j = ledger.standings(row["profile"], quorum, every=True)[1].get(fact_id)
    silenced = ledger.contradicted()
    rules = ledger.rules(row["profile"], quorum)
    if j is not None and (order := committees.ranking(row, rules)) is not None:
        # its committee: the first in rank not contradicted (the ledger keeps no seats)
        j = dataclasses.replace(j, seats=committees.seated(order, silenced, rules.committee_size))
    looks = ledger.rows(
        "SELECT id, author, time, seed, delta, verdict, harness, profile FROM verifications "
        "WHERE result = ? ORDER BY time, id",
        (fact_id,),
    )
    for look in looks:
        look["note"] = why_not(row, look, j, silenced)
        look["counts"] = not look["note"]
    j = j or Judgement("not judged", reason="no judgement of it under this campaign's rules")
    judged = {"state": j.state, "gain": j.gain, "gain_se": j.se, "seeds": j.seeds,
              "why": j.reason, "counted": list(j.peers),
              "seats": None if j.seats is None else list(j.seats),
              "outliers": list(j.outliers), "contradicted": list(j.contradicted)}  # fmt: skip
    return {"result": row, **judged, "looks": looks}


def why_not(
    claim: Mapping[str, Any], look: Mapping[str, Any], j: Judgement | None,
    silenced: Collection[str] = (),
) -> str:  # fmt: skip
    """'' when a look at `claim` counts in its judgement `j`; else why not (`silenced`: the
    peers a replay contradicted on any claim)."""
    peer = look["author"]
    for fails, why in (
        (peer == claim["author"], "its author's own look"),
        (look["harness"] != claim["harness"], "run under another harness"),
        (look["delta"] is None, f"no score ({look['verdict']})"),
        (j is None, "the claim is not judged"),
    ):
        if fails:
            return why
    assert j is not None
    if peer in j.peers:
        return ""
    for fails, why in (
        (peer in j.contradicted, "contradicted by a replay of its seed"),
        (peer in silenced, "its peer was contradicted by a replay on another claim"),
        (j.seats is not None and peer not in j.seats, "not on its committee"),
        (peer in j.outliers, "an outlier: far outside the other looks"),
        (peer in j.contested, "contested by a replay, with no majority"),
        (j.disputed, "disputed: no majority of its peers agree"),
    ):
        if fails:
            return why
    return "not counted"
