"""What a node allows its peers: how many, how fast, how much, and the book of peers it knows.

Pure bookkeeping, no I/O: addresses learned, dial backoff, per-peer token buckets, penalty
points and bans. Every table here is bounded, so a hostile swarm cannot grow our memory.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Limits:
    target_peers: int = 8  # dial known peers while fewer than this are connected
    max_peers: int = 32  # connections above this are closed
    max_known: int = 1000  # peers remembered in the book
    max_addrs: int = 8  # addresses remembered per peer
    rate: float = 20.0  # gossip messages a second from one origin (a fact is an experiment)
    burst: float = 200.0  # and the burst above that rate
    invalid_penalty: float = 1.0  # a message that is not a valid fact of our campaign
    flood_penalty: float = 0.2  # a message over the rate
    junk_penalty: float = 20.0  # a frame that is not pubsub: Noise rules out corruption in transit
    ban_score: float = 20.0  # penalty points that get a peer banned
    penalty_half_life: float = 600.0  # seconds for penalty points to halve
    ban_seconds: float = 3600.0
    max_rpc_bytes: int = 512 << 10  # one pubsub frame; a fact is a few KB (heads up to 256 KB)
    max_wanted: int = 1000  # versions waiting to be fetched
    max_wanted_per_author: int = 64  # of those, named by one author's results: none fills it
    rewant_every: float = 30.0  # seconds: versions the ledger still lacks are asked for again
    rewant_after: float = 600.0  # seconds: but not one given up (12 tries) that recently
    max_sync_facts: int = 5000  # facts sent in one sync exchange (the next one continues)
    max_sync_per_author: int = 1000  # of those, by one author
    max_sync_bytes: int = 16 << 20
    sync_seconds: float = 30.0
    resync_every: float = 30.0  # anti-entropy with a random peer, for partitions that healed
    max_blob: int = 8 << 20  # a version or diff fetched by hash
    max_streams: int = 2  # streams a peer may have open to us at once, per protocol (GossipSub too)
    max_conn_streams: int = 32  # inbound streams open at once on one connection, all protocols
    stream_penalty: float = 1.0  # a stream over that cap (refused)
    # Inbound connections still in their handshake (TCP up, Noise and Yamux not yet done): the
    # library lets 250 of them wait 10 s each, so 260 silent sockets locked newcomers out.
    max_pending: int = 64  # at once, from all addresses; the rest of the 250 are for peers
    max_pending_per_ip: int = 16  # at once, from one address; more are refused
    handshake_seconds: float = 5.0  # a handshake not done by then is cut (Noise takes ms)
    max_conns_per_ip: int = 24  # connections up, with one remote address; its next is refused
    sync_gap: float = 2.0  # seconds between two syncs we serve to one peer (each costs a query)
    standing_every: float = 2.0  # seconds between two judgements of every peer's standing


@dataclass
class _Peer:
    addrs: list[str] = field(default_factory=list)
    bootstrap: bool = False
    next_dial: float = 0.0
    backoff: float = 1.0
    points: float = 0.0
    points_at: float = 0.0
    banned_until: float = 0.0
    tokens: float = 0.0
    tokens_at: float = 0.0
    synced_at: float = -1e9
    drops: dict[str, int] = field(default_factory=dict)  # messages dropped, by why
    bad_source: bool = False  # served bytes that failed their hash: never asked to fetch again
    delivered: int = 0  # valid facts it delivered to us (gossip), new to our ledger or not


class HandshakeGate:
    """Inbound connections in their handshake, oldest first, by remote address. One address may
    hold `max_pending_per_ip` of them: its next is refused. When all `max_pending` are taken,
    a newcomer is admitted and the oldest of the address that holds most is cut instead. Silent
    sockets thus crowd out only their own address, never a newcomer from another."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._pending: dict[int, str] = {}  # ticket -> remote address, in arrival order

    def admit(self, ticket: int, address: str) -> tuple[bool, list[int]]:
        """Whether `ticket` may start its handshake, and the tickets to cut to make room."""
        mine = sum(1 for a in self._pending.values() if a == address)
        if mine >= self.limits.max_pending_per_ip:
            return False, []
        cut = []
        if len(self._pending) >= self.limits.max_pending:
            held: dict[str, int] = {}
            for a in self._pending.values():
                held[a] = held.get(a, 0) + 1
            heaviest = max(held, key=held.__getitem__)  # the first to reach the most: oldest
            cut.append(next(t for t, a in self._pending.items() if a == heaviest))
            del self._pending[cut[0]]
        self._pending[ticket] = address
        return True, cut

    def done(self, ticket: int) -> None:
        self._pending.pop(ticket, None)

    def __len__(self) -> int:
        return len(self._pending)


class PeerBook:
    """Known peers (id -> addresses), dial backoff, rate buckets and penalties."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._peers: dict[str, _Peer] = {}
        self._streams: dict[tuple[str, str], int] = {}

    def open_stream(self, peer: str, protocol: str) -> bool:
        """Count a stream a peer opened to us; False (refuse it) over `max_streams` at once."""
        key = (peer, protocol)
        if self._streams.get(key, 0) >= self.limits.max_streams:
            return False
        if len(self._streams) >= self.limits.max_known and key not in self._streams:
            return False
        self._streams[key] = self._streams.get(key, 0) + 1
        return True

    def close_stream(self, peer: str, protocol: str) -> None:
        key = (peer, protocol)
        left = self._streams.get(key, 1) - 1
        if left > 0:
            self._streams[key] = left
        else:
            self._streams.pop(key, None)

    def sync_due(self, peer: str) -> bool:
        """True when `peer` may have another sync served now (at most one per `sync_gap`)."""
        entry, now = self._get(peer), time.monotonic()
        if now - entry.synced_at < self.limits.sync_gap:
            return False
        entry.synced_at = now
        return True

    def __len__(self) -> int:
        return len(self._peers)

    def _get(self, peer: str) -> _Peer:
        entry = self._peers.get(peer)
        if entry is None:
            if len(self._peers) >= self.limits.max_known:
                self._evict()
            entry = self._peers[peer] = _Peer(tokens=self.limits.burst, tokens_at=time.monotonic())
        return entry

    def _evict(self) -> None:
        # Forget one peer we know nothing good about: never a bootstrap or a banned one, and one
        # that served bad bytes only when no other is left (forgotten, it would be asked again).
        now = time.monotonic()
        known = [p for p, e in self._peers.items() if not e.bootstrap and e.banned_until < now]
        for peer in sorted(known, key=lambda p: self._peers[p].bad_source)[:1]:
            del self._peers[peer]

    def add(self, peer: str, addrs: list[str], bootstrap: bool = False) -> None:
        entry = self._get(peer)
        entry.bootstrap = entry.bootstrap or bootstrap
        for addr in addrs:
            if addr not in entry.addrs:
                entry.addrs.insert(0, addr)
        del entry.addrs[self.limits.max_addrs :]

    def addrs(self, peer: str) -> list[str]:
        entry = self._peers.get(peer)
        return list(entry.addrs) if entry else []

    def entries(self, peers: set[str]) -> list[tuple[str, list[str]]]:
        return [
            (p, list(self._peers[p].addrs))
            for p in peers
            if p in self._peers and self._peers[p].addrs
        ]

    def candidates(self, skip: set[str]) -> list[str]:
        """Peers worth dialing now: known addresses, not connected, not banned, backoff over."""
        now = time.monotonic()
        out = [p for p, e in self._peers.items() if p not in skip and e.addrs
               and e.next_dial <= now and e.banned_until <= now]  # fmt: skip
        random.shuffle(out)
        return out

    def dialed(self, peer: str, ok: bool) -> None:
        entry = self._get(peer)
        if ok:
            entry.backoff = 1.0
            entry.next_dial = 0.0
        else:
            entry.next_dial = time.monotonic() + entry.backoff * random.uniform(0.8, 1.2)
            # A bootstrap the user named is asked again within seconds once it comes up.
            entry.backoff = min(entry.backoff * 2, 10.0 if entry.bootstrap else 60.0)

    def allow_message(self, peer: str) -> bool:
        """Token bucket per origin peer: `rate` a second, `burst` at once."""
        entry, now = self._get(peer), time.monotonic()
        entry.tokens = min(
            self.limits.burst, entry.tokens + (now - entry.tokens_at) * self.limits.rate
        )
        entry.tokens_at = now
        if entry.tokens < 1:
            return False
        entry.tokens -= 1
        return True

    def penalise(self, peer: str, points: float) -> bool:
        """Add penalty points (they decay); True when this pushes the peer into a ban."""
        entry, now = self._get(peer), time.monotonic()
        if entry.banned_until > now:
            return False
        if now - entry.points_at >= 60:  # decay once a minute, so that a burst adds up exactly
            entry.points *= 0.5 ** ((now - entry.points_at) / self.limits.penalty_half_life)
            entry.points_at = now
        entry.points += points
        if entry.points >= self.limits.ban_score:
            entry.banned_until = now + self.limits.ban_seconds
            entry.points = 0.0
            return True
        return False

    def count_drop(self, peer: str, why: str) -> None:
        """One message from `peer` dropped (over its rate, after its ban, ...), kept by reason."""
        drops = self._get(peer).drops
        if why in drops or len(drops) < 8:
            drops[why] = drops.get(why, 0) + 1

    def drops(self, shown: int = 64) -> list[tuple[str, dict[str, int]]]:
        """The peers we dropped most messages from, most first: (peer, {why: count})."""
        ranked = sorted(((p, e.drops) for p, e in self._peers.items() if e.drops),
                        key=lambda pd: -sum(pd[1].values()))  # fmt: skip
        return [(p, dict(d)) for p, d in ranked[:shown]]

    def mark_bad_source(self, peer: str) -> None:
        self._get(peer).bad_source = True

    def bad_sources(self) -> list[str]:
        return sorted(p for p, e in self._peers.items() if e.bad_source)

    def is_bad_source(self, peer: str) -> bool:
        entry = self._peers.get(peer)
        return entry is not None and entry.bad_source

    def count_delivery(self, peer: str) -> None:
        self._get(peer).delivered += 1

    def to_disconnect(self, connected: set[str], keep: set[str]) -> str | None:
        """The connected peer to close now: a banned one, else while over `max_peers` the one
        that delivered the fewest valid facts, a peer in `keep` (a bootstrap) last."""
        banned = sorted(p for p in connected if self.is_banned(p))
        if banned:
            return banned[0]
        if len(connected) <= self.limits.max_peers:
            return None
        return min(sorted(connected), key=lambda p: (p in keep, self.mesh_score(p)))

    def mesh_score(self, peer: str) -> float:
        """What GossipSub's mesh ranks `peer` by: peers that deliver valid facts stay in the mesh
        (and are grafted into it) ahead of silent ones, however many fresh keys a stranger brings;
        a banned peer ranks last."""
        entry = self._peers.get(peer)
        if entry is None:
            return 0.0
        if entry.banned_until > time.monotonic():
            return -100.0
        return math.log2(1 + entry.delivered)

    def is_banned(self, peer: str) -> bool:
        entry = self._peers.get(peer)
        return entry is not None and entry.banned_until > time.monotonic()

    def banned(self) -> list[str]:
        now = time.monotonic()
        return sorted(p for p, e in self._peers.items() if e.banned_until > now)
