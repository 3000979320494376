"""Adoption: find the swarm's best verified head in the ledger, and turn other verified wins made
on older parents into three-way merges onto the head, queued as this node's next candidates.

The head comes from the ledger's `consensus` rule alone. This module never publishes and never
runs code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from node.agent.errors import PatchError
from node.agent.patch import change_hash, check_source, merge
from node.agent.proposers import Context, Proposal, Proposer
from node.evidence import Judgement
from node.ledger import Ledger

Trusted = Callable[[str], bool]  # may this node run code that this peer id made?
MERGE_PREFIX = "merge of "  # how a merge proposal's description starts
BUNDLE_PREFIX = "bundle of "  # "bundle of N: VERSION, VERSION, ...": several wins merged as one


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
    makes no bundle."""
    out, groups = [], [merges]
    while groups:
        group = groups.pop(0)
        if len(group) < 2:
            continue
        text: str | None = head_text
        for _, proposal in group:
            text = merge(head_text, text, proposal.source) if text is not None else None
        if text is not None and text != head_text and _passes(text):
            versions = ", ".join(child[:12] for child, _ in group)
            out.append(Proposal(f"{BUNDLE_PREFIX}{len(group)}: {versions}", text))
        half = (len(group) + 1) // 2
        groups += [group[:half], group[half:]]
    return out


class QueuedProposer:
    """Queued proposals for one parent (merges after an adoption) first, then the inner
    proposer's; a queued proposal is dropped once the parent moved or its change was tried."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.queue: list[tuple[str, Proposal]] = []
        self.last_queued = False  # whether the last proposal came from the queue (a merge)

    def queue_for(self, parent_source: str, proposals: list[Proposal]) -> None:
        parent = hashlib.sha256(parent_source.encode()).hexdigest()
        self.queue = [(parent, p) for p in proposals]

    def propose(self, context: Context) -> Proposal:
        self.last_queued = True
        while self.queue:
            parent, proposal = self.queue.pop(0)
            if parent == context.parent and (
                change_hash(context.train_py, proposal.source) not in context.tried_hashes
            ):
                return proposal
        self.last_queued = False
        return self.inner.propose(context)


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
