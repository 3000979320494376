"""Peers' discards, checked. A proposer never pays twice for what a peer measured: a change a
peer discarded on a parent counts as tried there, and its signed loss weighs in every node's
beliefs. So one key that signs discards with no run behind them (made-up losses of every change
on each head) would hide every win from every proposer, for the price of signatures.

A discard is a run on its author's seed, and a replay of that seed on the author's device class
gives the author's score within the profile's replay tolerance. A node replays a discard that
stands in its way: one of a change of its own share of the proposals, which its proposer passed
over for that discard alone (`OfflineProposer.hidden`, `to_replay`'s `hiding`). And on the head
it adopted, when it has no claim to verify, a node drawn for it (`drawn`: one a discarding peer
and head, by hash, one more for each hour nobody did) replays one discard of a peer nobody
checked there yet (of a peer that replays backed before, only where the node's own coin says so:
`Draws.discard`). Either publishes the replay as a `verification` of the discard: "confirm"
where it gave the signed score, "misreported" where it did not. A peer with a discard whose
replays deny it more often than they back it is no evidence to the proposers (`denied`): its
results are left out of every context (`proposers.context_from_ledger`), so its changes are
tried again. A replay that denied an honest discard is undone by the next one that backs it: a
drawn node replays again while a denial stands on one replay more than the backing ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from node import committees, evidence
from node.trainer.profiles import PROFILES, Profile

if TYPE_CHECKING:
    from node.ledger import Ledger

# Every replay of a discard's seed by another peer (the partial index of ledger release 12 holds
# them: verifications are read in its order, each joined to its result by id).
_REPLAYS = (
    "SELECT r.id, r.author, r.profile, r.child_scores, r.val_bpb, r.device AS signed_on, "
    "v.author AS by, v.replay_val_bpb AS replay, v.device, v.verdict FROM verifications v "
    "CROSS JOIN results r ON r.id = v.result "
    "WHERE (v.replay_val_bpb IS NOT NULL OR v.verdict = 'misreported') "
    "AND r.outcome = 'discard' AND v.author != r.author"
)


def tally(rows: Iterable[dict[str, Any]]) -> dict[str, tuple[set[str], set[str]]]:
    """Per discard id: (the peers whose replay backed its signed score, those whose denied it).
    A replay on another device class than the author's proves nothing either way."""
    out: dict[str, tuple[set[str], set[str]]] = {}
    for row in rows:
        backed, denied = out.setdefault(row["id"], (set(), set()))
        signed = evidence.claimed_first_score(row)
        tolerance = PROFILES.get(row["profile"], Profile).replay_tolerance
        if row["verdict"] == "misreported" or signed is None:
            denied.add(row["by"])
        elif row["device"] == row["signed_on"]:
            (denied if abs(row["replay"] - signed) > tolerance else backed).add(row["by"])
    return out


def denied(ledger: Ledger) -> frozenset[str]:
    """The peers with a discard whose replays deny it more often than they back it."""
    rows = ledger.rows(_REPLAYS)
    return _denied(tally(rows), {r["id"]: r["author"] for r in rows})


def _denied(looks: dict[str, tuple[set[str], set[str]]], authors: dict[str, str]) -> frozenset[str]:
    return frozenset(authors[rid] for rid, (backed, off) in looks.items() if len(off) > len(backed))


def drawn(me: str, author: str, parent: str, pool: Collection[str], waited: int) -> bool:
    """Whether `me` replays `author`'s discards on `parent`: the first of `pool` in rank for the
    two (`committees.ranked`), one more for each hour (`waited`) nobody did."""
    return me in committees.ranked(f"discards:{parent}:{author}", author, pool, 1 + waited)


def to_replay(
    ledger: Ledger, me: str, profile: str, harness: str, parent: str, device: str,
    pool: Collection[str], hour_ms: int, audit: Callable[[str], bool] = lambda author: True,
    hiding: Sequence[str] = (),
) -> dict[str, Any] | None:  # fmt: skip
    """A peer's discard on `parent` that this node, on `device`, is drawn to replay: of a peer
    none of whose discards there a replay backed, nor one of this node's, and, where replays
    backed its discards elsewhere, that this node chooses to `audit`; its discard the first by
    hash, or one whose denial stands on one replay more than backs it. None: none.

    `hiding`: the changes (hashes) this node would try next on `parent` but for a peer's
    discard (`OfflineProposer.hidden`). Then the discard is one of those, the first in that
    order, and nobody is drawn: the node it stands in the way of replays it."""
    order = {change: i for i, change in enumerate(hiding)}
    rows = [r for r in ledger.rows(
        "SELECT * FROM results WHERE parent = ? AND profile = ? AND harness = ? AND device = ? "
        "AND outcome = 'discard' AND author != ? ORDER BY id",
        (parent, profile, harness, device, me),
    ) if not hiding or r["diff_sha256"] in order]  # fmt: skip
    if not rows:
        return None
    everywhere = ledger.rows(_REPLAYS)
    every_look, authors = tally(everywhere), {r["id"]: r["author"] for r in everywhere}
    looks = {r["id"]: every_look[r["id"]] for r in rows if r["id"] in every_look}
    backed_before = {authors[rid] for rid, (backed, _) in every_look.items()
                     if backed and rid not in looks}  # fmt: skip
    gone = _denied(every_look, authors)
    by_author: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_author.setdefault(r["author"], []).append(r)
    now = ledger.clock()
    picks = []  # (where it stands in this node's way, its author, the discard)
    for author, theirs in sorted(by_author.items()):
        replayed = [looks[r["id"]] for r in theirs if r["id"] in looks]
        if any(me in backed | off for backed, off in replayed) or (hiding and author in gone):
            continue  # (a denied peer's discards hide nothing: they are no evidence)
        close = [r for r in theirs if r["id"] in looks
                 and len(looks[r["id"]][1]) == len(looks[r["id"]][0]) + 1]  # fmt: skip
        if not close and (author in gone or any(backed for backed, _ in replayed)
                          or (author in backed_before and not audit(author))):  # fmt: skip
            continue
        if hiding:
            pick = min(close or theirs, key=lambda r: order[r["diff_sha256"]])
        else:
            pick = (
                close[0]
                if close
                else min(
                    theirs, key=lambda r: hashlib.sha256(f"{r['id']}:{parent}".encode()).digest()
                )
            )
            waited = max(0, now - min(r["time"] for r in theirs)) // hour_ms
            if not drawn(me, author, parent, pool, waited):
                continue
        picks.append((order.get(pick["diff_sha256"], 0), author, pick))
    for _, _, pick in sorted(picks, key=lambda p: p[:2]):
        if ledger.version(pick["child"]) is None:
            continue
        if not ledger.rows(  # a replay that crashed here is not tried again
            "SELECT 1 FROM runs WHERE child = ? AND seed = ? AND harness = ? LIMIT 1",
            (pick["child"], pick["seed"], harness),
        ):
            return pick
    return None
