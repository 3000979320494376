"""Adoption: find the swarm's best verified head in the ledger, and turn other verified wins made
on older parents into three-way merges onto the head, queued as this node's next candidates;
and which claims still being judged a node researches ahead from (`worth_ahead`, `viable`).

The head comes from the ledger's `consensus` rule alone. This module never publishes and never
runs code.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from node import consensus
from node.agent import offline
from node.agent.errors import PatchError
from node.agent.patch import change_hash, check_source, merge
from node.agent.proposers import Context, Proposal, Proposer
from node.evidence import Judgement, claimed_gain
from node.ledger import Ledger
from node.merges import BUNDLE_PREFIX, MAX_BUNDLE, MERGE_PREFIX

if TYPE_CHECKING:
    from node.agent.loop import Head

Trusted = Callable[[str], bool]  # may this node run code that this peer id made?


def swarm_rows(ledger: Ledger, profile: str) -> tuple[list[dict], list[dict]]:
    """(kept results, verifications) of `profile` from the ledger, all of them, as `consensus`
    reads them. A node without a sandbox still reads every author's results, and reaches only
    through those it trusts (`reach`): the outlier hold weighs a claim against every verified
    gain of its profile, whoever made it."""
    return ledger.claim_rows(profile)


def reach_of(trusted: Trusted | None) -> Callable[[Mapping[str, Any]], bool] | None:
    """The results a head may be reached through: those of `trusted` authors (None: all)."""
    return None if trusted is None else (lambda r: trusted(r["author"]))


def best_head(
    ledger: Ledger, profile: str, baseline: str | None = None, quorum: int | None = None,
    harness: str | None = None, trusted: Trusted | None = None,
) -> str:  # fmt: skip
    """The sha256 of the best train.py of `profile` under the ledger's campaign rules
    (`Ledger.head`; `baseline` and `quorum` default to its terms), reached through `trusted`
    authors' results only, when given."""
    return ledger.head(profile, quorum, harness, reach_of(trusted), baseline)


def descends_from(version: str, ancestor: str, kept_parent: Callable[[str], str | None]) -> bool:
    """Whether `version` descends from `ancestor` through kept results; `kept_parent` gives the
    parent of the first kept result that made a version (None: none did). Parent links may loop."""
    seen = set()
    while version not in seen:
        if version == ancestor:
            return True
        seen.add(version)
        parent = kept_parent(version)
        if parent is None:
            return False
        version = parent
    return False


def _ancestors(results: list[Mapping[str, Any]], version: str) -> set[str]:
    """Every version some result made `version` from, transitively (parent links may loop)."""
    parents: dict[str, set[str]] = {}
    for r in results:
        parents.setdefault(r["child"], set()).add(r["parent"])
    seen, todo = {version}, [version]
    while todo:
        for parent in parents.get(todo.pop(), ()):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


AHEAD_SES = 1.0  # how far the looks must favour a claim to research ahead from it (`worth_ahead`)


def favour(claim: Mapping[str, Any], j: Judgement, own: Sequence[float] = ()) -> float:
    """How much a claim is worth researching ahead from: the pooled gain of its looks that count
    (`j`) and of this node's own that do not (`own`: its gains, one per seed, `own_gains`),
    weighed by their seeds; before any, the gain its author claimed."""
    if j.seeds or own:
        return ((j.gain or 0.0) * j.seeds + sum(own)) / (j.seeds + len(own))
    claimed = claimed_gain(claim)
    return claimed[0] if claimed else 0.0


def worth_ahead(
    claim: Mapping[str, Any], j: Judgement, scale: float, sigma: float, own: Sequence[float] = ()
) -> bool:
    """Whether an open (or held) claim is one to research ahead from: the looks favour it by at
    least AHEAD_SES standard errors of their mean (`favour`; `sigma`: the profile's paired
    noise, one seed's). A gain within noise of zero is no reason to build on a claim: its looks
    may stop long before they settle it (its committee busy with a flood of claims, say), and
    every node that went ahead would stay on it. Before any look, its author is taken at its
    word only for a gain of the size verified on the profile (`scale`, the hold's:
    `consensus.gain_scale`): a claim of a huge gain would draw every node onto a stranger's
    code."""
    gain, looks = favour(claim, j, own), j.seeds + len(own)
    if j.state not in ("open", consensus.HELD):
        return False
    if looks:
        return gain >= AHEAD_SES * sigma / math.sqrt(looks)
    return 0 < gain <= consensus.HOLD_FACTOR * scale


def own_gains(ledger: Ledger, me: str, judged: Mapping[str, Judgement]) -> dict[str, list[float]]:
    """{claim: the gains `me` measured on it, one per seed} for the claims whose judgement leaves
    its looks out for no fault of theirs (another committee's, in a campaign with members): what
    a node measured itself still tells it where to research (`favour`). Looks left out as far
    outside the others' or against a replay stay out."""
    gains: dict[str, dict[int, float]] = {}
    for v in ledger.rows(
        "SELECT result, seed, delta FROM verifications WHERE author = ? AND delta IS NOT NULL",
        (me,),
    ):  # fmt: skip
        j = judged.get(v["result"])
        if j is not None and me not in {*j.peers, *j.outliers, *j.contradicted, *j.contested}:
            gains.setdefault(v["result"], {})[v["seed"]] = -v["delta"]
    return {rid: list(by_seed.values()) for rid, by_seed in gains.items()}


def viable(
    ledger: Ledger, profile: str, me: str, version: str, adopted: str | None,
    results: list[dict], judged: Mapping[str, Judgement], worth: Callable[[dict], bool],
) -> bool:  # fmt: skip
    """Whether every claim from the `adopted` head to `version` (results: every kept one) is
    verified, or one `me` would still research ahead from (`worth`: `worth_ahead`; its own:
    still open or held). A claim the looks turned against (one verified until a replay
    contradicted its confirmers, say, and the other looks show no gain) takes the node back,
    refuted or not: it builds on nothing it would not choose now."""
    made = _first_made(results)
    seen = set()
    while version != adopted:
        r = made.get(version)
        if r is None or version in seen:
            return (
                r is None and adopted is not None and builds_on(ledger, profile, version, adopted)
            )
        seen.add(version)
        j = judged.get(r["id"])
        if not (j is None or j.state == "verified"
                or (j.state in ("open", consensus.HELD) if r["author"] == me else worth(r))):  # fmt: skip
            return False
        version = r["parent"]
    return True


def first_ahead(results: list[dict], version: str, adopted: str | None) -> dict | None:
    """The claim on the `adopted` head that `version` builds on through kept `results` (the
    first step of the chain a node researches ahead on); None when `version` is the head or
    does not build on it."""
    made = _first_made(results)
    seen = set()
    while (r := made.get(version)) is not None and version not in seen:
        if r["parent"] == adopted:
            return r
        seen.add(version)
        version = r["parent"]
    return None


def _first_made(results: list[dict]) -> dict[str, dict]:
    """{version: the first of `results` (kept ones) that made it}."""
    return {r["child"]: r for r in sorted(results, key=lambda r: r["time"], reverse=True)}


def made_by(ledger: Ledger, profile: str, child: str) -> dict | None:
    """The first kept result that made `child` on `profile`: its parent, author and description;
    None: none did."""
    rows = ledger.rows(
        "SELECT parent, author, description FROM results WHERE child = ? AND profile = ? "
        "AND outcome = 'keep' ORDER BY time LIMIT 1",
        (child, profile),
    )
    return rows[0] if rows else None


def builds_on(ledger: Ledger, profile: str, version: str, ancestor: str) -> bool:
    """Whether `version` descends from `ancestor` through kept results in the ledger."""
    return descends_from(
        version, ancestor, lambda child: (made_by(ledger, profile, child) or {}).get("parent")
    )


def rebase(ledger: Ledger, profile: str, me: str, mine: Head, onto: Head) -> Proposal | None:
    """The changes of node `me` in `mine` that `onto` lacks, as a three-way merge onto it: the
    kept results it made from where `mine` left the versions `onto` builds on (or from the first
    step another peer made). None when there are none, or they conflict with `onto`, or the
    merge fails the policy."""
    base: str | None = mine.sha256
    seen: set[str] = set()
    while base is not None and not builds_on(ledger, profile, onto.sha256, base):
        if base in seen:  # parent links may loop
            return None
        seen.add(base)
        made = made_by(ledger, profile, base)
        if made is None or made["author"] != me:
            break  # a peer's change: only this node's own go across
        base = made["parent"]
    source = ledger.version(base) if base not in (None, mine.sha256) else None
    merged = merge(source.decode(), onto.source, mine.source) if source is not None else None
    if merged is None or merged == onto.source or not _passes(merged):
        return None
    made = made_by(ledger, profile, mine.sha256)
    what = made["description"] if made else "this node's keep"
    return Proposal(f"{MERGE_PREFIX}{mine.sha256[:12]}: {what}", merged)


def merge_proposals(
    ledger: Ledger, head: str, profile: str, quorum: int | None = None,
    harness: str | None = None, trusted: Trusted | None = None,
) -> list[Proposal]:  # fmt: skip
    """Verified wins made on other parents than `head`, each merged three-way onto the head
    (its parent as the base), largest verified gain first. Wins already in the head's lineage,
    conflicting merges, and merges that do not compile are left out."""
    _, judged, results = ledger.standings(profile, quorum, harness)
    return merges_onto(head, results, judged, ledger.version, reach=reach_of(trusted))


def merges_onto(
    head: str, results: list[Mapping[str, Any]], judged: Mapping[str, Judgement],
    version: Callable[[str], bytes | None],
    reach: Callable[[Mapping[str, Any]], bool] | None = None,
) -> list[Proposal]:  # fmt: skip
    """`merge_proposals` over given rows and their judgements (`consensus.judge_claims`), with
    `version` giving a train.py's bytes by sha256 (None when not held); with `reach`, only the
    verified wins it accepts are merged. Several merges come first as bundles (`bundles`).
    Pure apart from what `version` does."""
    head_source = version(head)
    if head_source is None:
        return []
    head_text = head_source.decode()
    lineage = _ancestors(results, head)
    out: list[tuple[str, Proposal]] = []
    seen = set()
    wins = [
        r for r in results
        if (j := judged.get(r["id"])) is not None and j.state == "verified" and j.gain is not None
        and (reach is None or reach(r))
    ]  # fmt: skip
    for r in sorted(wins, key=lambda r: (-judged[r["id"]].gain, r["id"])):
        if r["child"] in lineage or r["parent"] == head:
            continue
        parent, child = version(r["parent"]), version(r["child"])
        if parent is None or child is None:
            continue
        merged = merge(parent.decode(), head_text, child.decode())
        if merged is None or merged == head_text:
            continue
        if not _passes(merged):
            continue
        key = change_hash(head_text, merged)
        if key not in seen:
            seen.add(key)
            proposal = Proposal(f"{MERGE_PREFIX}{r['child'][:12]}: {r['description']}", merged)
            out.append((r["child"], proposal))
    return bundles(head_text, out) + [proposal for _, proposal in out]


def bundles(head_text: str, merges: list[tuple[str, Proposal]]) -> list[Proposal]:
    """Merges onto one head (each with the version whose change it carries, largest verified
    gain first), merged together as one proposal, so that one verification moves the head by
    all of their steps at once; after it, its halves, their halves, down to pairs, so that a
    bundle that fails (one change spoils the others) is split until the culprit is left out,
    each half in the next proposal; the merges alone follow (`merges_onto`). A node moves on
    from the queue once a proposal of it is kept. A group whose changes touch the same lines
    makes no bundle, nor one of more than MAX_BUNDLE (its description could not name them all:
    its halves go instead)."""
    out, groups = [], [merges]
    while groups:
        group = groups.pop(0)
        if len(group) < 2:
            continue
        text: str | None = head_text if len(group) <= MAX_BUNDLE else None  # unnamable
        for _, proposal in group:
            text = merge(head_text, text, proposal.source) if text is not None else None
        if text is not None and text != head_text and _passes(text):
            versions = ", ".join(child[:12] for child, _ in group)
            out.append(Proposal(f"{BUNDLE_PREFIX}{len(group)}: {versions}", text))
        half = (len(group) + 1) // 2
        groups += [group[:half], group[half:]]
    return out


SHARED_AT_ONCE = 2  # peers that take up a shared proposal at once; one more per proposal after


@dataclass
class _Queued:
    parent: str  # sha256 of the train.py it is for
    proposal: Proposal
    shared: bool  # a merge of verified wins, which every node adopting the head queues alike
    verified: bool  # its changes are verified wins (a shared one, or this node's own verified)
    passed: int = 0  # proposals this node made while this one waited


class QueuedProposer:
    """Queued proposals for one parent (merges after an adoption) first, then the inner
    proposer's; a queued proposal is dropped once the parent moved or its change was tried.

    A `shared` proposal (a merge of verified wins, which every node on the head queues alike)
    is a few nodes' to run, not every node's: the active peers are ranked by the hash of each
    one's id and the change's (`offline.share_of`'s order); the first SHARED_AT_ONCE take it
    at once (two, so that one busy elsewhere delays it little), and one more in rank for each
    proposal this node made with it still untried (the peers before it went quiet, or build on
    another head). A node's own keeps rebased onto the head are its own, verified or not."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.kind = getattr(inner, "kind", type(inner).__name__)
        self.queue: list[_Queued] = []
        self.last_queued = False  # whether the last proposal came from the queue (a merge)
        self.last_verified = False  # whether its changes were verified wins (a merge of them)

    def queue_for(
        self, parent_source: str, own: list[Proposal], shared: Sequence[Proposal] = ()
    ) -> None:  # fmt: skip
        """Queue this node's `own` proposals, then the `shared` ones (above), for the parent, in
        place of any queue."""
        self.queue = []
        self.add_for(parent_source, own)
        self.add_for(parent_source, list(shared), shared=True)

    def add_for(self, parent_source: str, proposals: list[Proposal], shared: bool = False) -> None:
        """Queue `proposals` after what is queued for the same parent (another parent's queue
        is dropped), leaving out those queued already; one queued already as this node's own
        and offered now `shared` is a verified win too."""
        parent = hashlib.sha256(parent_source.encode()).hexdigest()
        self.queue = [q for q in self.queue if q.parent == parent]
        queued = {q.proposal.source: q for q in self.queue}
        for proposal in proposals:
            if proposal.source in queued:
                queued[proposal.source].verified |= shared
            else:
                self.queue.append(_Queued(parent, proposal, shared, shared))

    def propose(self, context: Context) -> Proposal:
        """The first queued proposal for this parent not tried yet that is this node's to run,
        else the inner proposer's. Shared ones go in their order (one waits while one before it
        is untried), and none is run whose changes one that was kept holds already (a bundle
        that went through holds its halves)."""
        self.last_queued = True
        peers = list(context.active | {context.me}) if context.me else []
        kept = {a.diff_hash for a in context.history if a.outcome == "keep"}
        queue, self.queue = self.queue, []
        through: list[str] = []  # shared proposals kept on this parent (by any node)
        waiting = False  # whether a shared one before is untried and not this node's yet
        for index, queued in enumerate(queue):
            proposal = queued.proposal
            if queued.parent != context.parent:
                continue
            if queued.shared and _within(context.train_py, proposal, through):
                continue
            key = change_hash(context.train_py, proposal.source)
            if key in context.tried_hashes:
                if queued.shared and key in kept:
                    through.append(proposal.source)
                continue
            if queued.shared and waiting:  # behind one not run yet: its turn is not judged
                self.queue.append(queued)
                continue
            if queued.shared and not _my_turn(key, peers, context.me, queued.passed):
                queued.passed += 1
                self.queue.append(queued)
                waiting = True
                continue
            self.queue += queue[index + 1 :]
            self.last_verified = queued.verified
            return proposal
        self.last_queued = self.last_verified = False
        # A change that a shared merge waiting here brings (a peer's verified win, not yet this
        # node's turn) is that merge's: proposed anew it would be paid for twice, and credited
        # to whichever node ran it first instead of the peer that found it.
        merging = {change_hash(context.train_py, q.proposal.source) for q in self.queue
                   if q.shared and q.parent == context.parent}  # fmt: skip
        return self.inner.propose(replace(context, tried=context.tried | merging))


def _my_turn(key: str, peers: list[str], me: str | None, passed: int) -> bool:
    """Whether a shared proposal of change `key` is this node's to run, having waited `passed`
    proposals: its rank among `peers` is within the ones whose turn has come."""
    if not peers or me is None:
        return True
    ranked = sorted(peers, key=lambda p: offline.share_rank(p, key), reverse=True)
    return ranked.index(me) < SHARED_AT_ONCE + passed


def _within(parent: str, proposal: Proposal, kept: list[str]) -> bool:
    """Whether a kept child of `parent` holds every change of `proposal` already (a bundle that
    went through holds its halves and its merges)."""
    return any(merge(parent, child, proposal.source) == child for child in kept)


def written_by(ledger: Ledger, version: str, baseline: str, authors: Trusted) -> bool:
    """Whether `version` is `baseline`, or is reached from it by results of `authors` alone,
    merges left out (a merge carries another author's change): code whose every line they wrote."""
    seen, todo = set(), [version]
    while todo:
        current = todo.pop()
        if current == baseline:
            return True
        if current in seen:
            continue
        seen.add(current)
        rows = ledger.rows(
            "SELECT parent, author, description FROM results WHERE child = ?", (current,)
        )
        todo += [
            r["parent"] for r in rows
            if authors(r["author"]) and not r["description"].startswith(MERGE_PREFIX)
        ]  # fmt: skip
    return False


def _passes(source: str) -> bool:
    try:
        check_source(source)
    except PatchError:
        return False
    return True
