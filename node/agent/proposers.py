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

from node.agent import discards

if TYPE_CHECKING:
    from node.ledger import Ledger

ACTIVE_MS = 3_600_000  # a peer that published a result in the last hour researches: it has a share

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
    # a kept one's judgement so far: (state, the looks' pooled gain or None, its standard error)
    judged: tuple[str, float | None, float | None] | None = None
    # a peer's result this node looked at (verified, re-scored): child minus parent on each seed
    # of this node's looks, numbers it can trust as its own
    looked: tuple[float, ...] = ()


@dataclass(frozen=True)
class Judged:
    """A change the swarm judged on this train.py's lineage: its pooled gain (bpb, positive is
    better) with its standard error and the seeds behind it, and who made it."""

    description: str
    gain: float
    se: float
    seeds: int
    by: str


@dataclass(frozen=True)
class Context:
    """What a proposer sees: the parent train.py, the strategy, the profile, recent history,
    and what the swarm verified and refuted on the way to it."""

    train_py: str
    program: str = ""
    profile: str = "test"
    history: tuple[Attempt, ...] = ()
    tried: frozenset[str] = frozenset()  # diff hashes tried on this parent, beyond `history`
    lineage: tuple[Judged, ...] = ()  # the verified steps from the baseline here, first first
    refuted: tuple[Judged, ...] = ()  # changes refuted on the versions of that lineage
    me: str | None = None  # this node's peer id
    active: frozenset[str] = frozenset()  # peers that researched lately (published a result)
    earlier: tuple[Attempt, ...] = ()  # experiments on the lineage's earlier versions, paired
    sigma: float | None = None  # the node's paired noise (None: its profile's prior)

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
    # A change tried on this parent already, proposed again on purpose: a peer's discard (or a
    # claim found misreported) that the evidence favours (`offline.again`), or any such once
    # everything else was tried (`offline.rerunnable`), for this node's seeds.
    rerun: bool = False


class Proposer(Protocol):
    kind: str  # what it is, for a person: "learning", "fixed", "model NAME"

    def propose(self, context: Context) -> Proposal: ...


def _paired(result: dict) -> tuple[float, ...]:
    """A result's paired differences, child minus parent on each seed (none if unreadable)."""
    try:
        child, parent = json.loads(result["child_scores"]), json.loads(result["parent_scores"])
        return tuple(float(c) - float(p) for c, p in zip(child, parent, strict=True))
    except (TypeError, ValueError):
        return ()


# A result that is no claim counts where this node holds its child (the gossip layer fetches
# every result's): one whose author never gave out its train.py nobody can replay.
_CHECKABLE = "(r.outcome = 'keep' OR EXISTS (SELECT 1 FROM versions WHERE sha256 = r.child))"


def _attempts_from(ledger: Ledger) -> str:
    """The columns of a result an Attempt reads, with its claim's judgement (none before the
    ledger kept judgements, schema 3), and the tables: `SELECT {this} WHERE ...`."""
    columns = "r.author, r.description, r.outcome, r.diff_sha256, r.child_scores, r.parent_scores"
    if ledger.schema_version < 3:
        return f"{columns}, NULL AS judged_state FROM results r"
    return (f"{columns}, c.state AS judged_state, c.gain AS judged_gain, c.se AS judged_se, "
            "c.seeds AS judged_seeds FROM results r LEFT JOIN claims c ON c.id = r.id")  # fmt: skip


def _judgement(row: dict) -> tuple[str, float | None, float | None] | None:
    """A kept result's judgement as the ledger keeps it: (state, the looks' pooled gain, its
    standard error), the gain None before any look that counts; None for a result no claim."""
    if row["judged_state"] is None:
        return None
    looked = bool(row["judged_seeds"]) and row["judged_se"] is not None
    return (row["judged_state"], row["judged_gain"] if looked else None,
            row["judged_se"] if looked else None)  # fmt: skip


def context_from_ledger(
    ledger: Ledger, train_py: str, profile: str, program: str = "", me: str | None = None,
    parent_val_bpb: float | None = None, limit: int = 500,
) -> Context:  # fmt: skip
    """A Context for `train_py` from the ledger's results on it (this node's and peers').

    Deltas are against `parent_val_bpb`, else the best kept val_bpb the ledger holds for the
    parent. The published diff is the normalised one, so its sha256 is the change's hash. A
    peer a replay caught signing a discard no run stands behind (`discards.denied`) is left
    out: its results are no evidence, and it has no share of the proposals; so is a result
    that is no claim whose train.py this node does not hold (nobody gave it out to replay).
    """
    parent = hashlib.sha256(train_py.encode()).hexdigest()
    gone = sorted(discards.denied(ledger))  # peers whose discards replays denied: no evidence
    heard = f"AND {_CHECKABLE} AND r.author NOT IN ({', '.join('?' * len(gone))})"
    rows = ledger.rows(
        f"SELECT r.id, r.val_bpb, {_attempts_from(ledger)} "
        f"WHERE r.parent = ? AND r.profile = ? {heard} ORDER BY r.time DESC, r.id",
        (parent, profile, *gone),
    )
    if parent_val_bpb is None:
        best = ledger.rows(
            "SELECT MIN(val_bpb) AS v FROM results WHERE child = ? AND profile = ? "
            "AND outcome = 'keep'",
            (parent, profile),
        )
        parent_val_bpb = best[0]["v"] if best else None
    lineage, refuted, versions = judged_on_the_way(ledger, parent, profile)
    looked = _own_looks(ledger, me, profile, (parent, *versions)) if me else {}
    history = tuple(
        Attempt(
            description=r["description"], outcome=r["outcome"], diff_hash=r["diff_sha256"],
            delta=None if r["val_bpb"] is None or parent_val_bpb is None
            else r["val_bpb"] - parent_val_bpb,
            by="this node" if r["author"] == me else r["author"], paired=_paired(r),
            judged=_judgement(r), looked=looked.get(r["id"], ()),
        )
        for r in rows[:limit]
    )  # fmt: skip
    tried = frozenset(r["diff_sha256"] for r in rows)
    marks = ", ".join("?" * len(versions))
    earlier = tuple(
        Attempt(r["description"], r["outcome"], None, r["diff_sha256"], r["author"], paired,
                _judgement(r), looked.get(r["id"], ()))
        for r in ledger.rows(
            f"SELECT r.id, {_attempts_from(ledger)} "
            f"WHERE r.parent IN ({marks}) AND r.profile = ? {heard} ORDER BY r.time DESC, r.id "
            f"LIMIT {MAX_EARLIER}",
            (*versions, profile, *gone),
        ) if (paired := _paired(r))
    )  # fmt: skip
    active = frozenset(
        r["author"] for r in ledger.rows(
            "SELECT DISTINCT author FROM results WHERE profile = ? AND time >= ?",
            (profile, ledger.clock() - ACTIVE_MS),
        )
    ) - set(gone) | ({me} if me else set())  # fmt: skip
    return Context(train_py, program, profile, history, tried, lineage, refuted, me, active,
                   earlier)  # fmt: skip


def _own_looks(
    ledger: Ledger, me: str, profile: str, versions: tuple[str, ...]
) -> dict[str, tuple[float, ...]]:
    """This node's looks at the results made on `versions`, by result id: child minus parent on
    each seed it scored both (its verifications, re-scores and audits of them)."""
    marks = ", ".join("?" * len(versions))
    looks: dict[str, list[float]] = {}
    for row in ledger.rows(
        "SELECT v.result, v.delta FROM verifications v JOIN results r ON r.id = v.result "
        f"WHERE v.author = ? AND v.profile = ? AND v.delta IS NOT NULL AND r.parent IN ({marks}) "
        "ORDER BY v.time, v.id",
        (me, profile, *versions),
    ):
        looks.setdefault(row["result"], []).append(row["delta"])
    return {rid: tuple(deltas) for rid, deltas in looks.items()}


MAX_STEPS_SHOWN = 40  # verified steps a prompt carries, the latest
MAX_REFUTED_SHOWN = 20
MAX_EARLIER = 200  # experiments on the lineage's earlier versions a context carries, the latest


def judged_on_the_way(
    ledger: Ledger, version: str, profile: str
) -> tuple[tuple[Judged, ...], tuple[Judged, ...], tuple[str, ...]]:
    """(the verified claims that lead from the baseline to `version`, first first; the claims
    refuted on the versions of that way, best first; the way's versions before `version`,
    nearest first): the swarm's evidence a proposer learns from, each with its pooled gain and
    uncertainty, from the judgements the ledger keeps."""
    if ledger.schema_version < 3:
        return (), (), ()
    columns = "c.parent, c.gain, c.se, c.seeds, c.author, r.description"
    steps: list[Judged] = []
    versions, current = [version], version
    while len(steps) < MAX_STEPS_SHOWN:
        rows = ledger.rows(
            f"SELECT {columns} FROM claims c JOIN results r ON r.id = c.id WHERE c.child = ? "
            "AND c.profile = ? AND c.state = 'verified' ORDER BY c.gain DESC, c.id LIMIT 1",
            (current, profile),
        )
        if not rows and current == version:  # a claim being judged, researched ahead of: the
            ahead = ledger.rows(  # way goes on through its parent, with no step of its own
                "SELECT parent FROM claims WHERE child = ? AND profile = ? "
                "AND state IN ('open', 'held') ORDER BY id LIMIT 1",
                (current, profile),
            )
            if ahead and ahead[0]["parent"] not in versions:
                current = ahead[0]["parent"]
                versions.append(current)
                continue
        if not rows or rows[0]["parent"] in versions:  # the baseline, or a loop
            break
        steps.append(_judged(rows[0]))
        current = rows[0]["parent"]
        versions.append(current)
    marks = ", ".join("?" * len(versions))
    refuted = ledger.rows(
        f"SELECT {columns} FROM claims c JOIN results r ON r.id = c.id WHERE c.parent IN ({marks}) "
        f"AND c.profile = ? AND c.state = 'refuted' ORDER BY c.gain DESC, c.id LIMIT {MAX_REFUTED_SHOWN}",
        (*versions, profile),
    )  # fmt: skip
    return tuple(reversed(steps)), tuple(_judged(r) for r in refuted), tuple(versions[1:])


def _judged(row: dict) -> Judged:
    return Judged(row["description"], row["gain"] or 0.0, row["se"] or 0.0, row["seeds"] or 0,
                  row["author"])  # fmt: skip
