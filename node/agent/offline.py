"""The offline proposer: steps of train.py's CAPITAL constants and known-good edits, in an
order the swarm's evidence moves.

It needs no network and no key, so a laptop without a model still contributes. Deterministic
for a seed, a parent and what the ledger holds; it proposes a change already tried on that
parent only when its runs there were a peer's discards (at most AGAIN_RUNS in all), first those
the evidence still favours (`again`), the rest once it tried everything else. It tries first
the changes measured better than noise there, together (`combination`), then the moves that
measured steps on it and on its lineage favour.
Its catalogue of changes is `node.agent.catalogue`'s.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from collections.abc import Iterator

from node.agent.beliefs import Beliefs, beliefs, sigma_of
from node.agent.catalogue import (
    MAX_PAIRS,
    Part,
    Step,
    combined,
    single_changes,
    with_lines,
)
from node.agent.errors import PatchError, ProposalRefused
from node.agent.patch import change_hash, check_source
from node.agent.proposers import Attempt, Context, Proposal


@functools.lru_cache(maxsize=4096)
def _change_hash(parent: str, child: str) -> str:
    return change_hash(parent, child)


def _constants(description: str) -> set[str]:
    """The constants a step's description names (`NAME[i] old -> new`; a pair: `...; ...`)."""
    return {part.split(" ", 1)[0] for part in description.split("; ") if " -> " in part}


def unread_constants(context: Context) -> set[str]:
    """Constants a run of this parent did not see: a single step of one scored exactly as the
    parent on every seed this node paired or looked at (a CPU replays a run bit for bit), so
    that every other step of that constant would be a run spent on nothing (a constant only
    another profile's recipe reads). A peer's own pairs are its word alone: one key that
    signed a step of every constant with no difference would have every node skip them all."""
    return {
        name for a in context.history
        if "; " not in a.description
        and (seen := (a.paired if a.by == "this node" else ()) + a.looked) and not any(seen)
        for name in _constants(a.description)
    }  # fmt: skip


AGAIN_RUNS = 3  # a single change discarded on a parent runs there at most this many times


def rerunnable(context: Context) -> dict[str, tuple[str, int]]:
    """{change hash: (its description, the times it ran on this parent)} for the single changes
    this node may run there again: every run of it a peer's discard or a claim found
    misreported (its author's numbers are no measure, and nobody adopts it), fewer than
    AGAIN_RUNS. Another node runs it, on its own seeds; one that ran it never does, its seeds
    would repeat its runs."""
    runs: dict[str, list[Attempt]] = {}
    for attempt in context.history:
        runs.setdefault(attempt.diff_hash, []).append(attempt)
    return {
        change: (attempts[0].description, len(attempts)) for change, attempts in runs.items()
        if "; " not in attempts[0].description and len(attempts) < AGAIN_RUNS
        and all(_unclaimed(a) and a.by not in ("this node", context.me) for a in attempts)
    }  # fmt: skip


def again(context: Context, known: Beliefs) -> dict[str, int]:
    """{change hash: the times it ran on this parent} for the `rerunnable` changes worth
    another run there before anything untried: those the evidence now says may gain more than
    a change of its kind nobody measured (`Belief.gain`). A real gain of one paired sigma is
    discarded by one research run seven times in eight (the margin is two): tried once and
    never again, a head's last wins are lost to noise and the swarm stalls there with them
    untried. The others run again once everything else was tried (`OfflineProposer.propose`)."""
    return {
        change: runs for change, (description, runs) in rerunnable(context).items()
        if known.of(description).gain > known.unmeasured(description).gain
    }  # fmt: skip


def _unclaimed(attempt: Attempt) -> bool:
    """Whether a run of a change leaves it nobody's win: a discard, or a claim found
    misreported."""
    return attempt.outcome == "discard" or (
        attempt.judged is not None and attempt.judged[0] == "misreported"
    )


SURE = 1.5  # a change joins a combination when its measurements beat no change by this many se


def combination(context: Context) -> tuple[str, str] | None:
    """(description, child source) of the single changes that measured better than no change
    on this parent and on the way here, beyond noise, all at once: what a planner runs after a
    round of single changes, so that wins found side by side move the head as one step.

    Each change's measurements that this node can trust, pooled by their weights: the paired
    differences of this node's own results and of its own looks at a peer's (sigma^2 each),
    and of a claim the swarm's rule verified, its looks' pooled gain and standard error; a
    change goes in when the pooled mean beats zero by more than SURE standard errors. A peer's
    numbers, and the other peers' looks at a claim not verified yet, count for nothing: any key
    can sign them, and colluders' made-up looks put their changes of no gain into honest
    combinations, verified as a whole on the real gains of the others. A change refuted or left
    unproven anywhere on the way stays out, whatever else was measured of it. Only changes
    measured as they stand (a step of a constant from its value here, an edit), the best first,
    one change of each constant; None unless two or more."""
    singles = single_changes(context.train_py, context.profile)
    sigma = sigma_of(context)
    looks: dict[str, list[tuple[float, float]]] = {}  # description: (value, its variance)
    out: set[str] = set()
    for attempt in (*context.history, *context.earlier):
        if attempt.description not in singles:
            continue
        state, gain, se = attempt.judged or ("", None, None)
        if state in ("refuted", "unproven"):
            out.add(attempt.description)
        elif state == "verified" and gain is not None and se:
            looks.setdefault(attempt.description, []).append((-gain, se**2))
        else:
            own = attempt.paired if attempt.by in ("this node", context.me) else ()
            looks.setdefault(attempt.description, []).extend(
                (v, sigma**2) for v in (*own, *attempt.looked)
            )
    pooled = {d: _pooled(measured) for d, measured in looks.items() if measured and d not in out}
    favoured = sorted((mean, d) for d, (mean, se) in pooled.items() if mean < -SURE * se)
    chosen: dict[str, Part] = {}
    for _, description in favoured:
        part = singles[description]
        if (isinstance(part, Step) and any(
            isinstance(p, Step) and p.name == part.name for p in chosen.values()
        )) or combined(context.train_py, [*chosen.values(), part]) is None:  # fmt: skip
            continue
        chosen[description] = part
    if len(chosen) < 2:
        return None
    return "; ".join(sorted(chosen)), combined(context.train_py, list(chosen.values()))


def _pooled(looks: list[tuple[float, float]]) -> tuple[float, float]:
    """The inverse-variance mean of measurements (value, variance) and its standard error."""
    weight = sum(1 / var for _, var in looks)
    return sum(v / var for v, var in looks) / weight, weight**-0.5


def share_of(change: str, peers: frozenset[str] | set[str]) -> str | None:
    """The peer whose share a change is: the one of `peers` that ranks it first by sha256 of
    its id and the change's hash (rendezvous hashing). Every node computes the same from the same
    peers, so nobody assigns work; when that peer goes quiet, the change is the next one's."""
    return max(peers, key=lambda p: share_rank(p, change), default=None)


def share_rank(peer: str, change: str) -> bytes:
    """A peer's rank for a change: the higher, the sooner the change is its to try."""
    return hashlib.sha256(f"{peer}:{change}".encode()).digest()


class OfflineProposer:
    """Changes that need no model: each call gives the next untried one on the parent.

    Its order depends only on the seed and the parent (a node seeds it with its key unless told
    a seed, so two nodes walk two orders). Given this node's peer id and the peers researching
    lately (`Context.me`, `.active`), it proposes first the changes that are its share
    (`share_of`), then, with its own share done, the others' (first those it would inherit next),
    each in that order: sixteen nodes try sixteen different changes at once, and a quiet node's
    share passes to the others. It remembers the changes of its share it passed over at its last
    proposal for a peer's discard alone (`hidden`), which the node replays (`node.agent.discards`).
    """

    kind = "learning"  # its name for `--proposer` and `swarm status`

    def __init__(self, seed: int | str = 0) -> None:
        self.seed = seed
        self._proposed: set[tuple[str, str]] = set()  # (parent, change hash) given out already
        # (parent, the changes of this node's share it passed over, in its order, for a peer's
        # discard alone) at its last proposal: what a made-up discard would hide from it
        self.hidden: tuple[str, tuple[str, ...]] = ("", ())

    def candidates(self, source: str, profile: str | None = None) -> Iterator[tuple[str, str]]:
        """(description, child source) in this seed's order for this parent; may not compile.
        With `profile`, the model size and batch of that profile's row are stepped too."""
        rng = random.Random(f"{self.seed}:{hashlib.sha256(source.encode()).hexdigest()}")
        known = single_changes(source, profile)
        singles = list(known.items())
        rng.shuffle(singles)
        for description, part in singles:
            yield description, combined(source, [part])
        steps = [part for part in known.values() if isinstance(part, Step)]
        pairs = [(a, b) for a, b in itertools.combinations(steps, 2) if a.name != b.name]
        rng.shuffle(pairs)
        for a, b in pairs[:MAX_PAIRS]:
            yield f"{a.description}; {b.description}", with_lines(source, (a, b))

    def _plan(self, context: Context) -> tuple[Iterator[tuple[str, str]], dict[str, int]]:
        """(the candidates in the order this node tries them, the tried ones among them worth
        another run: `again`).

        This node's share first when it knows itself and its peers, so that no two nodes start
        on one change (a node whose share holds no single step starts on its pairs, not on
        another node's single); single steps before pairs within each; then by the gain the
        swarm's evidence, with its uncertainty, says the change may bring (`beliefs`,
        `Belief.score`; a pair, its two moves' sum); ties (moves of one prior, unmeasured) in
        the seed's order. Another run of a change is the share of one of the peers that did not
        run it, drawn anew for each run. The combination of the changes measured better than
        noise (`combination`) is everyone's and placed as a single change by the sum of its
        parts, which puts it first."""
        known = beliefs(context)
        more = again(context, known)
        ran: dict[str, set[str]] = {}
        for attempt in context.history:
            ran.setdefault(attempt.diff_hash, set()).add(attempt.by)
        together = combination(context)
        candidates = [*([together] if together else []),
                      *self.candidates(context.train_py, context.profile)]  # fmt: skip
        peers = context.active | {context.me} if context.me else frozenset()

        def place(item: tuple[int, tuple[str, str]]) -> tuple[bool, bool, bool, float, int]:
            index, (description, child) = item
            score = known.of(description).score
            if index == 0 and together:  # everyone's: it changes as evidence comes in
                return False, False, False, score, index
            change = _change_hash(context.train_py, child)
            pool = peers
            if change in more:  # its next run: a draw of its own, among those that did not run it
                pool = peers - ran[change]
                change = f"{change}:{more[change]}"
            owner = share_of(change, pool) if pool else context.me
            # of another's share, first those this node would take should their owner go quiet
            # (the next by the same ranking): two nodes done with their own take different ones
            later = owner != context.me and share_of(change, pool - {owner}) != context.me
            return owner != context.me, "; " in description, later, score, index

        return (c for _, c in sorted(enumerate(candidates), key=place)), more

    def _ordered(self, context: Context) -> Iterator[tuple[str, str]]:
        """The candidates in the order this node tries them (`_plan`)."""
        return self._plan(context)[0]

    def propose(self, context: Context) -> Proposal:
        parent, tried = context.parent, context.tried_hashes
        unseen = unread_constants(context)
        seen: set[str] = set()
        ordered, more = self._plan(context)
        ordered = list(ordered)
        beyond = context.tried - {a.diff_hash for a in context.history}  # a queue's merges, say
        # Everything else tried, a peer's discard runs again here, in the same order: a peer's
        # discard is its word, and one key that signed a discard of every change would
        # otherwise leave every node nothing to try.
        rest = {change: runs for change, (_, runs) in rerunnable(context).items()}
        peers = context.active | {context.me} if context.me else frozenset()  # none: no share
        self.hidden = (parent, ())
        for allowed in (more, rest):
            for description, child in ordered:
                if child == context.train_py or unseen & _constants(description):
                    continue
                key = _change_hash(context.train_py, child)
                if (key in tried and (key not in allowed or key in beyond)) or key in seen or (
                    parent, key) in self._proposed:  # fmt: skip
                    hid = allowed is more and key in rest  # passed over for a peer's word
                    if hid and peers and share_of(key, peers) == context.me:  # of its share
                        self.hidden = (parent, (*self.hidden[1], key))
                    continue
                seen.add(key)
                try:
                    check_source(child)
                except PatchError:
                    continue
                self._proposed.add((parent, key))
                return Proposal(description, child, rerun=key in tried)
            seen = set()
        raise ProposalRefused(
            "the offline proposer has tried every change it knows on this train.py; "
            "adopt a newer head, or configure a model with --model"
        )


class FixedList(OfflineProposer):
    """The offline proposer without what it learns: its catalogue in its seeded order, single
    changes first, blind to the swarm's evidence and to its peers' shares. It still skips what
    was tried on the parent, until it has tried everything else. A control to measure the
    learning proposer against (`swarm join --proposer fixed`, `scripts/simulate.py --proposer
    fixed`)."""

    kind = "fixed"

    def _plan(self, context: Context) -> tuple[Iterator[tuple[str, str]], dict[str, int]]:
        return self.candidates(context.train_py, context.profile), {}


# `--proposer`: the offline proposers a node can run, by name
OFFLINE_PROPOSERS: dict[str, type[OfflineProposer]] = {
    p.kind: p for p in (OfflineProposer, FixedList)
}
