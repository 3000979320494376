"""Who looks at a claim: the committee that judges it in a campaign with members, and the peers
drawn to look at it or replay its seeds anywhere. Pure: a draw is a hash of public values, the
same on every node, and nobody chooses it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any


def draw_of(claim: Mapping[str, Any]) -> str:
    """What a claim's committee is drawn by: the version it claims on and its author. An author
    can make a claim's id anew as often as it likes without running anything (another signed
    time, another comment in the child), so a committee drawn by id could be ground until it was
    the author's friends; the version and the author it cannot change but by claiming elsewhere
    or being another peer. All the claims of one author on one version share one committee."""
    return f"{claim['parent']}:{claim['author']}"


def ranked(draw: str, author: str, members: Collection[str], count: int) -> tuple[str, ...]:
    """The first `count` of `members` in their rank for `draw` (`draw_of`): by sha256 of it and
    their own id, the author left out. Nobody chooses it."""
    order = sorted(
        (m for m in members if m != author),
        key=lambda m: hashlib.sha256(f"{draw}:{m}".encode()).digest(),
    )
    return tuple(order[:count])


def committee(draw: str, author: str, members: Collection[str], size: int) -> tuple[str, ...]:
    """The members who judge the claims of `draw` (`draw_of`): the first `size` in rank."""
    return ranked(draw, author, members, size)


def ranking(claim: Mapping[str, Any], rules: Any) -> tuple[str, ...] | None:
    """Every member that may judge `claim` (`Rules.members_for`, its author left out) in rank for
    its draw: its committee is the first `committee_size` of them that are not out (`seated`).
    None in an open campaign."""
    members = rules.members_for(claim)
    if members is None:
        return None
    return ranked(draw_of(claim), claim["author"], members, len(members))


def seated(order: Sequence[str], out: Collection[str], size: int) -> tuple[str, ...]:
    """The seats (sorted) of a committee of `size` drawn from the ranking `order`, or a head of
    it that holds `size` members not `out`: the first `size` of them, the peers `out` left out."""
    return tuple(sorted([p for p in order if p not in out][:size]))


def kept_head(order: Sequence[str], out: Collection[str], size: int) -> tuple[str, ...]:
    """The head of a claim's ranking `order` that a ledger keeps: up to its `2 * size`-th member
    not `out` (all of it when shorter), so that its committee is found in it while up to `size`
    more of its members are out, and a member back in takes back its seat where it ranks."""
    kept, free = [], 0
    for peer in order:
        if free == 2 * size:
            break
        kept.append(peer)
        free += peer not in out
    return tuple(kept)


def holds(
    head: Sequence[str], order: Sequence[str] | None, out: Collection[str], size: int
) -> bool:
    """Whether `head` (a ranking's head a ledger kept) still finds the committee: it holds `size`
    members not `out`, or it is the whole ranking; and, given the `order` it was drawn from, it is
    that order's head."""
    if order is not None and tuple(head) != tuple(order[: len(head)]):
        return False
    free = sum(p not in out for p in head)
    return free >= size or (order is not None and len(head) == len(order))


def panel(claim: Mapping[str, Any], rules: Any, out: Collection[str] = ()) -> frozenset[str] | None:
    """The committee that judges `claim` under `rules` (`consensus.Rules`), None in an open
    campaign: drawn from the members the claim is judged by, the peers `out` left out (those a
    replay contradicted: their looks count on no claim), so that the next member in rank takes
    a contradicted one's seat and a claim is never left to fewer honest lookers than its
    committee's size (one honest member, capped at `evidence.PEER_CAP` seeds, could never
    settle it)."""
    order = ranking(claim, rules)
    return None if order is None else frozenset(seated(order, out, rules.committee_size))


def look_draw(claim: Mapping[str, Any], members: Collection[str] | None) -> str:
    """What the peers who look at a claim are drawn by: in a campaign with `members`, what its
    committee is (`draw_of`); in an open one (None), where the draw only spreads the work and
    counts for nothing, the claim's id, so that one author's claims on one version go to
    different peers."""
    return draw_of(claim) if members is not None else claim["id"]
