"""What a merge or a bundle carries, as the rule reads it: the versions its description names
("merge of VERSION: ...", "bundle of N: VERSION, ..."), the merges that name a version no
verified claim made, and the reason such a merge is held. Pure: no I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from node.wire_schema import MAX_DESCRIPTION

MERGE_PREFIX = "merge of "  # "merge of VERSION: ...": another parent's win merged onto the head
BUNDLE_PREFIX = "bundle of "  # "bundle of N: VERSION, VERSION, ...": several wins merged as one
HELD_FOR = "held: it carries "  # the start of the reason of a merge held for what it carries
# The versions one bundle carries at most: its description names each (12 hex digits and ", ")
# within a result's MAX_DESCRIPTION characters, or the names cut off would carry nothing.
MAX_BUNDLE = (MAX_DESCRIPTION - len(f"{BUNDLE_PREFIX}99: ")) // len("0123456789ab, ")
# What `carried` adds for a bundle that names fewer versions than it counts: no claim makes it.
UNNAMED = "a version its description does not name"


def held_reason(version: str) -> str:
    """Why a verified merge or bundle is held: it carries `version`, which no verified claim made."""
    return f"{HELD_FOR}{version}, which no verified claim made (yet)"


def waits_on_parts(reason: str) -> bool:
    """Whether a claim's judgement (its `reason`) holds it for what it carries: more looks at it
    cannot move it, the verdicts on its parts can."""
    return reason.startswith(HELD_FOR)


def carried(description: str) -> list[str]:
    """The versions (the first 12 hex digits of their sha256) that a merge or a bundle says it
    carries; none for any other change. A bundle that names fewer than it counts ("bundle of
    N: ..." cut short) carries UNNAMED too, which no claim makes: it is held for good."""
    count = 0  # the versions it says it carries, where it says (a bundle)
    if description.startswith(MERGE_PREFIX):
        names = [description[len(MERGE_PREFIX) :].split(":", 1)[0]]
    elif description.startswith(BUNDLE_PREFIX) and ":" in description:
        counted, listed = description[len(BUNDLE_PREFIX) :].split(":", 1)
        names = listed.replace(",", " ").split()
        count = int(counted) if counted.strip().isdigit() else 0
    else:
        return []
    named = [n for n in names if re.fullmatch(r"[0-9a-f]{12}", n)]
    return named + [UNNAMED] if len(named) < count else named


def unsupported(verified: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """{id: a version it carries that no claim of the rest made} for the merges and bundles
    among `verified` (the verified claims' result rows, by id), to a fixed point: a merge of a
    merge stands on both."""
    named = {
        rid: names for rid, r in verified.items() if (names := carried(r.get("description") or ""))
    }
    makers: dict[str, set[str]] = {}  # version -> the claims that made it
    for rid, r in verified.items():
        makers.setdefault(r["child"][:12], set()).add(rid)
    out: dict[str, str] = {}
    while True:
        new = {
            rid: missing[0] for rid, names in named.items() if rid not in out
            and (missing := [v for v in names if makers.get(v, set()) <= out.keys()])
        }  # fmt: skip
        if not new:
            return out
        out.update(new)
