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


def seats_and_reserve(
    claim: Mapping[str, Any], rules: Any, out: Collection[str] = ()
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """`panel`'s seats (sorted), and the next as many members in rank after them (in rank
    order), the peers `out` left out: those who take the seats that contradicted members leave,
    first to last, so that a ledger that keeps them finds each heir without drawing the
    committee again. None in an open campaign."""
    members = rules.members_for(claim)
    if members is None:
        return None
    size = rules.committee_size
    order = ranked(draw_of(claim), claim["author"], members - set(out), 2 * size)
    return tuple(sorted(order[:size])), order[size:]


def moved(
    seats: Sequence[str], reserve: Sequence[str], out: Collection[str]
) -> tuple[list[str], list[str]] | None:
    """A committee's `seats` and `reserve` (as `seats_and_reserve` drew them) once the peers
    `out` hold no seat, each seat left to the first in the reserve: (its seats, its reserve),
    None when the reserve runs out (draw it again)."""
    gone, bench = [p for p in seats if p in out], [p for p in reserve if p not in out]
    if len(bench) < len(gone):
        return None
    kept = [p for p in seats if p not in out]
    return sorted(kept + bench[: len(gone)]), bench[len(gone) :]


def returned(
    claim: Mapping[str, Any], rules: Any, seats: Sequence[str], reserve: Sequence[str],
    peers: Collection[str],
) -> tuple[list[str], list[str]]:  # fmt: skip
    """`claim`'s `seats` and `reserve` (drawn while `peers` were held out) once `peers` may sit
    again: each takes its rank among them where it ranks before the last of them, or where the
    seats are fewer than the committee's size (the members ran out); one that ranks after the
    last stays out of the reserve, which is the ranking's head, not all of it."""
    members = rules.members_for(claim) or frozenset()
    listed = {*seats, *reserve}  # where a peer that came and left since was never taken out
    back = [p for p in peers if p in members and p != claim["author"] and p not in listed]
    if not back:
        return list(seats), list(reserve)
    draw, size = draw_of(claim), rules.committee_size
    rank = lambda m: hashlib.sha256(f"{draw}:{m}".encode()).digest()  # noqa: E731
    if len(seats) == size:  # what is listed is the ranking's head: behind its last, unknown
        last = rank(reserve[-1]) if reserve else max(map(rank, seats))  # (reserve: rank order)
        back = [p for p in back if rank(p) < last]
        if not back:
            return list(seats), list(reserve)
    order = sorted([*seats, *reserve, *back], key=rank)
    return sorted(order[:size]), order[size : 2 * size]


def panel(claim: Mapping[str, Any], rules: Any, out: Collection[str] = ()) -> frozenset[str] | None:
    """The committee that judges `claim` under `rules` (`consensus.Rules`), None in an open
    campaign: drawn from the members the claim is judged by, the peers `out` left out (those a
    replay contradicted: their looks count on no claim), so that the next member in rank takes
    a contradicted one's seat and a claim is never left to fewer honest lookers than its
    committee's size (one honest member, capped at `evidence.PEER_CAP` seeds, could never
    settle it)."""
    drawn = seats_and_reserve(claim, rules, out)
    return None if drawn is None else frozenset(drawn[0])


def look_draw(claim: Mapping[str, Any], members: Collection[str] | None) -> str:
    """What the peers who look at a claim are drawn by: in a campaign with `members`, what its
    committee is (`draw_of`); in an open one (None), where the draw only spreads the work and
    counts for nothing, the claim's id, so that one author's claims on one version go to
    different peers."""
    return draw_of(claim) if members is not None else claim["id"]
