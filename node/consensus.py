"""The swarm's adoption rule, as pure functions over facts: no I/O, no clock, no randomness.

Every node applies the same rule to the same facts, so two nodes that hold the same facts agree,
whatever order the facts arrived in. Never import anything with side effects here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def verified_children(
    results: Iterable[Mapping[str, Any]],
    verifications: Iterable[Mapping[str, Any]],
    quorum: int = 1,
) -> dict[str, set[str]]:
    """The results confirmed by at least `quorum` distinct peers other than their author.

    `results` carry id, author, profile and harness; `verifications` carry result, author,
    verdict, profile and harness. A confirmation counts only when it was measured with the same
    harness and profile as the result: a different harness measures a different thing.
    Returns {result id: the peers whose confirmations count}, for the verified results only.
    """
    if quorum < 1:
        raise ValueError("quorum must be at least 1: a result cannot verify itself")
    by_id = {r["id"]: r for r in results}
    confirmers: dict[str, set[str]] = {}
    for v in verifications:
        r = by_id.get(v["result"])
        if (
            r is not None
            and v["verdict"] == "confirm"
            and v["author"] != r["author"]
            and v["harness"] == r["harness"]
            and v["profile"] == r["profile"]
        ):
            confirmers.setdefault(r["id"], set()).add(v["author"])
    return {rid: peers for rid, peers in confirmers.items() if len(peers) >= quorum}
