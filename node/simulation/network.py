"""The simulated network: one shared store of signed facts, and an in-memory transport that
delivers them to nodes with latency, loss, churn and partitions on a virtual clock.

Every fact is signed with `wire.sign` (which decodes it: its signature is checked once, when it
is made). Delivery is decided when a fact is sent; a node takes what has arrived when it acts.
It never opens a socket and never reads the wall clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from node import consensus, wire

GOSSIP_DEGREE = 6  # GossipSub's mesh degree: a fact crosses about log_6(nodes) hops


@dataclass
class FactStore:
    """Every fact any node made, in the order made: the fact, its consensus row, when and by whom.

    `held` is a bitmap per node of the facts it holds (rows: nodes, columns: facts)."""

    nodes: int
    facts: list[wire.Fact] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    made: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    held: np.ndarray = field(init=False)
    merges: dict = field(default_factory=dict)  # (head, verified wins) -> merge proposals

    def __post_init__(self) -> None:
        self.held = np.zeros((self.nodes, 1024), dtype=bool)

    def add(self, fact: wire.Fact, now: float) -> int:
        results, verifications = consensus.rows_from_facts([fact])
        index = len(self.facts)
        self.facts.append(fact)
        self.rows.append((results or verifications)[0])
        self.made.append(now)
        self.sizes.append(len(fact.raw))
        if index >= self.held.shape[1]:
            grown = np.zeros((self.nodes, 2 * self.held.shape[1]), dtype=bool)
            grown[:, : self.held.shape[1]] = self.held
            self.held = grown
        return index

    def missing(self, holder: int, lacker: int, now: float) -> list[int]:
        """Facts made by `now` that `holder` has and `lacker` lacks, in the order made."""
        n = len(self.facts)
        made = np.asarray(self.made) <= now
        return np.flatnonzero(self.held[holder, :n] & ~self.held[lacker, :n] & made).tolist()

    def rows_for(self, profile: str) -> tuple[list[dict], list[dict]]:
        """(kept results, verifications) of `profile` among every fact made, as `consensus`
        reads them."""
        results = [r for r in self.rows if "verdict" not in r and r["outcome"] == "keep"
                   and r["profile"] == profile]  # fmt: skip
        return results, [r for r in self.rows if "verdict" in r and r["profile"] == profile]


@dataclass
class Transport:
    """Delivery rules. `latency`: mean seconds per gossip hop (exponential per hop); `loss`:
    chance that a fact never reaches a given node by gossip (sync may bring it later);
    `partition`: (start, end) virtual seconds during which the two halves of the swarm
    (even and odd node numbers) cannot reach each other."""

    nodes: int
    rng: np.random.Generator
    latency: float = 0.1
    loss: float = 0.0
    partition: tuple[float, float] | None = None
    online: np.ndarray = field(init=False)
    inbox: list[list[tuple[float, int]]] = field(init=False)
    received: np.ndarray = field(init=False)  # messages per node
    received_bytes: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.hops = max(1, math.ceil(math.log(max(self.nodes, 2)) / math.log(GOSSIP_DEGREE)))
        self.online = np.ones(self.nodes, dtype=bool)
        self.side = np.arange(self.nodes) % 2
        self.inbox = [[] for _ in range(self.nodes)]
        self.received = np.zeros(self.nodes, dtype=np.int64)
        self.received_bytes = np.zeros(self.nodes, dtype=np.int64)

    def split(self, now: float) -> bool:
        return self.partition is not None and self.partition[0] <= now < self.partition[1]

    def reachable(self, a: int, b: int, now: float) -> bool:
        return bool(self.online[b]) and (not self.split(now) or self.side[a] == self.side[b])

    def send(self, index: int, author: int, now: float) -> None:
        """Gossip fact `index` from `author`: each other node online now (and on the author's
        side of a partition) gets it after a gamma(hops, latency) delay, unless it is lost."""
        ok = self.online & (self.rng.random(self.nodes) >= self.loss)
        ok[author] = False
        if self.split(now):
            ok &= self.side == self.side[author]
        delays = self.rng.gamma(self.hops, self.latency, self.nodes) if self.latency > 0 else None
        for node in np.flatnonzero(ok).tolist():
            arrival = now + (float(delays[node]) if delays is not None else 0.0)
            self.inbox[node].append((arrival, index))

    def arrived(self, node: int, now: float) -> list[int]:
        """Facts that have reached `node` by `now`, in order of arrival; the rest wait."""
        box = self.inbox[node]
        if not box:
            return []
        ready = sorted(item for item in box if item[0] <= now)
        if ready:
            self.inbox[node] = [item for item in box if item[0] > now]
        return [index for _, index in ready]

    def drop_inbox(self, node: int) -> None:
        """A node that leaves loses what was still on its way to it."""
        self.inbox[node] = []


def head_size(authors: int) -> int:
    """Bytes of a real signed `head` fact of `authors` authors (the bins sync sends first: the
    same size however many)."""
    from node.identity import Identity

    me = Identity(bytes(32))
    keys = {i.to_bytes(32, "big"): 1_000 + i for i in range(authors)}
    body = wire.head_body([], keys, {"sim": "0" * 64})
    return len(wire.sign(me, "head", "sim", 1, body, time_ms=0).raw)
