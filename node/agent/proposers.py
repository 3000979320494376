"""Proposers: where the next change of train.py comes from, behind one small interface.

A proposer reads a `Context` (the parent train.py, program.md, the profile, what was tried on
that parent) and returns a `Proposal`. It never runs code nor publishes anything, and never
proposes a change whose hash was already tried on the same parent. Implementations:
`node.agent.offline.OfflineProposer` (no network) and `node.agent.llm.LLMProposer` (litellm).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from node.ledger import Ledger

# ---------------------------------------------------------------------------------------------
# The interface


@dataclass(frozen=True)
class Attempt:
    """One experiment already made on the parent: by this node or a peer, with its outcome."""

    description: str
    outcome: str  # keep, discard, crash or void (the harness refused to score it), or running
    delta: float | None  # child minus parent val_bpb (negative is better); None if unknown
    diff_hash: str
    by: str = "a peer"  # "this node" or a peer id
    paired: tuple[float, ...] = ()  # child minus parent on each seed its author ran both on


@dataclass(frozen=True)
class Context:
    """What a proposer sees: the parent train.py, the strategy, the profile, recent history."""

    train_py: str
    program: str = ""
    profile: str = "test"
    history: tuple[Attempt, ...] = ()
    tried: frozenset[str] = frozenset()  # diff hashes tried on this parent, beyond `history`

    @property
    def parent(self) -> str:
        return hashlib.sha256(self.train_py.encode()).hexdigest()

    @property
    def tried_hashes(self) -> frozenset[str]:
        return self.tried | {a.diff_hash for a in self.history}


@dataclass(frozen=True)
class Proposal:
    description: str  # one line
    source: str  # the whole new train.py


class Proposer(Protocol):
    def propose(self, context: Context) -> Proposal: ...


def _paired(result: dict) -> tuple[float, ...]:
    """A result's paired differences, child minus parent on each seed (none if unreadable)."""
    try:
        child, parent = json.loads(result["child_scores"]), json.loads(result["parent_scores"])
        return tuple(float(c) - float(p) for c, p in zip(child, parent, strict=True))
    except (TypeError, ValueError):
        return ()


def context_from_ledger(
    ledger: Ledger, train_py: str, profile: str, program: str = "", me: str | None = None,
    parent_val_bpb: float | None = None, limit: int = 30,
) -> Context:  # fmt: skip
    """A Context for `train_py` from the ledger's results on it (this node's and peers').

    Deltas are against `parent_val_bpb`, else the best kept val_bpb the ledger holds for the
    parent. The published diff is the normalised one, so its sha256 is the change's hash.
    """
    parent = hashlib.sha256(train_py.encode()).hexdigest()
    rows = ledger.rows(
        "SELECT author, description, outcome, val_bpb, diff_sha256, child_scores, parent_scores "
        "FROM results "
        "WHERE parent = ? AND profile = ? ORDER BY time DESC, id",
        (parent, profile),
    )
    if parent_val_bpb is None:
        best = ledger.rows(
            "SELECT MIN(val_bpb) AS v FROM results WHERE child = ? AND profile = ? "
            "AND outcome = 'keep'",
            (parent, profile),
        )
        parent_val_bpb = best[0]["v"] if best else None
    history = tuple(
        Attempt(
            description=r["description"], outcome=r["outcome"], diff_hash=r["diff_sha256"],
            delta=None if r["val_bpb"] is None or parent_val_bpb is None
            else r["val_bpb"] - parent_val_bpb,
            by="this node" if r["author"] == me else r["author"], paired=_paired(r),
        )
        for r in rows[:limit]
    )  # fmt: skip
    tried = frozenset(r["diff_sha256"] for r in rows)
    return Context(train_py, program, profile, history, tried)
