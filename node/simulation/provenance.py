"""Where a simulated run's versions came from, for its figures (`Simulation.summary`): the kept
results behind a version, the changes a merge or a bundle carries, and the honest nodes' time on
heads an adversary made or built into."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from node.merges import carried


def lineage(made_by: Mapping[str, dict], version: str) -> list[dict]:
    """The kept results from the baseline to `version` through the result that made each
    version (`made_by`: an honest node's where one made it too, since an adversary's claim of a
    version an honest node also found fakes nothing), oldest first."""
    chain, seen = [], set()
    while version in made_by and version not in seen:
        seen.add(version)
        chain.append(made_by[version])
        version = made_by[version]["parent"]
    return chain[::-1]


def origins(made_by: Mapping[str, dict], result: dict, seen: frozenset = frozenset()) -> list[dict]:
    """The kept results whose changes `result` carries: itself, or for a merge ("merge of
    VERSION: ...", a verified win of another parent's merged onto the head, or a node's own
    keep rebased onto it) the result that made the merged version, and for a bundle
    ("bundle of N: VERSION, ...") those of each version, followed back through merges of
    merges."""
    prefixes = carried(result["description"])
    if result["id"] in seen or not prefixes:
        return [result]
    found = []
    for prefix in prefixes:
        made = next((r for v, r in made_by.items() if v.startswith(prefix)), None)
        found += [result] if made is None else origins(made_by, made, seen | {result["id"]})
    return found


def finders(made_by: Mapping[str, dict], found_by: Mapping[str, str], result: dict) -> list[str]:
    """Who found each change `result` carries (`origins`): its author, but for a combination
    of single changes ("A; B; ..."), each to the node that first kept it alone, else to the
    first that measured it alone (`found_by`: description -> peer id), or to the combination's
    author if nobody did. A description cut at its last part ("...; HEAD_LR 0.0…": a fact
    holds 200 characters) names that part by its beginning."""
    out = []
    for origin in origins(made_by, result):
        parts = origin["description"].split("; ")
        if len(parts) == 1 or carried(origin["description"]):
            out.append(origin["author"])
            continue
        for part in parts:
            begun = part[:-1] if part.endswith("…") else None
            out.append(found_by.get(part) or next(
                (who for d, who in found_by.items() if begun and d.startswith(begun)),
                origin["author"],
            ))  # fmt: skip
    return out


def carries(made_by: Mapping[str, dict], result: dict, ids: Collection[str]) -> bool:
    """Whether `result` is one of the results `ids` (an adversary's claims, say) or carries one:
    a merge or a bundle of a version such a result made, however honest its own author."""
    return any(o["id"] in ids for o in origins(made_by, result))


def head_shares(
    made_by: Mapping[str, dict],
    held: Iterable[tuple[float, int, str | None]],
    adversaries: Collection[str],
    fakes: Collection[str],
) -> dict[str, float]:
    """Over the honest nodes' time from their first adoption to the end (`held`: (when, node,
    the head it adopted), then (the end, node, None) for each): the share spent on a head made
    by one of the `adversaries` (peer ids), and on one with one of their claims (`fakes`, result
    ids) in its lineage."""
    spans = {"adversary_made": 0.0, "adversary_in_lineage": 0.0, "total": 0.0}
    last: dict[int, tuple[float, str]] = {}
    for at, i, version in held:
        if i in last:
            since, head = last[i]
            span = at - since
            chain = lineage(made_by, head)
            spans["total"] += span
            if chain and chain[-1]["author"] in adversaries:
                spans["adversary_made"] += span
            if any(r["id"] in fakes for r in chain):
                spans["adversary_in_lineage"] += span
        if version is not None:
            last[i] = (at, version)
    total = spans.pop("total") or 1.0
    return {k: v / total for k, v in spans.items()}
