"""Who looks at a claim: the committee that judges it in a campaign with members, and the peers
drawn to look at it or replay its seeds anywhere. Pure: a draw is a hash of public values, the
same on every node, and nobody chooses it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from typing import Any


def draw_of(claim: Mapping[str, Any]) -> str:
    """What a claim's committee is drawn by: the version it claims on and its author. An author
    can make a claim's id anew as often as it likes without running anything (another signed
    time, another comment in the child), so a committee drawn by id could be ground until it was
    the author's friends; the version and the author it cannot change but by claiming elsewhere
    or being another peer. All the claims of one author on one version share one committee."""
    return f"{claim['parent']}:{claim['author']}"


def committee(draw: str, author: str, members: Collection[str], size: int) -> tuple[str, ...]:
    """The members who judge the claims of `draw` (`draw_of`): ranked by sha256 of it and their
    own id, the author left out, the first `size`. Nobody chooses them."""
    ranked = sorted(
        (m for m in members if m != author),
        key=lambda m: hashlib.sha256(f"{draw}:{m}".encode()).digest(),
    )
    return tuple(ranked[:size])


def panel(claim: Mapping[str, Any], rules: Any, out: Collection[str] = ()) -> frozenset[str] | None:
    """The committee that judges `claim` under `rules` (`consensus.Rules`), None in an open
    campaign: drawn from the members the claim is judged by, the peers `out` left out (those a
    replay contradicted: their looks count on no claim), so that the next member in rank takes
    a contradicted one's seat and a claim is never left to fewer honest lookers than its
    committee's size (one honest member, capped at `evidence.PEER_CAP` seeds, could never
    settle it)."""
    members = rules.members_for(claim)
    if members is None:
        return None
    seats = committee(draw_of(claim), claim["author"], members - set(out), rules.committee_size)
    return frozenset(seats)


def look_draw(claim: Mapping[str, Any], members: Collection[str] | None) -> str:
    """What the peers who look at a claim are drawn by: in a campaign with `members`, what its
    committee is (`draw_of`); in an open one (None), where the draw only spreads the work and
    counts for nothing, the claim's id, so that one author's claims on one version go to
    different peers."""
    return draw_of(claim) if members is not None else claim["id"]
