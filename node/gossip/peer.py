"""The transport: a libp2p host, GossipSub on the campaign's topic, and our own protocols.

Facts come in through the node's `Facts.accept`, which gives each a verdict before it is
forwarded; facts go out through `send`. Peers that send invalid facts, junk frames or floods are
penalised, then banned; the refusals are handed to the node (`take_offences`), which judges its
peers and says whose facts to drop for good (`set_standing`). A peer silenced by the evidence is
still heard: its facts are how it recovers. A crash of the host restarts it with the same key,
facts and address book. Trio stays inside this package.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.score import ScoreParams
from libp2p.tools.anyio_service import background_trio_service

from node import wire
from node.gossip import admission, guards, protocols
from node.gossip.addresses import (
    GossipError,
    bound_to,
    dial_failure,
    dialable_addrs,
    parse_multiaddr,
    release,
    topic_for,
)
from node.gossip.facts import Facts, PeerStanding, Verdict
from node.gossip.limits import HandshakeGate, Limits, PeerBook
from node.gossip.pubsub import GuardedPubsub, author_of, origin_of
from node.gossip.wanted import Wanted
from node.identity import Identity, peer_id_from_public_key

log = logging.getLogger("swarm.gossip")
STATUS_FILE = "gossip.json"  # inside the node's home: what `swarm peers` shows
_SIGNED_REASONS = (wire.Reason.replay, wire.Reason.seq_backwards, wire.Reason.future_time)
# What the transport refuses before the node's facts see it; handed to the node (`take_offences`),
# which records it, so that standing, unlike a ban, survives a restart.
_OFFENCES = frozenset(
    ("flood", "junk", "libp2p_signature", "protocol", "streams", "window", "after_ban", "bad_fetch")
)
_MAX_STANDING_SHOWN = 64  # peers listed in the status file, silenced ones first


@dataclass
class GossipConfig:
    """What a node needs to gossip: where to listen, whom to ask first, which campaign."""

    home: Path
    listen: str = "/ip4/127.0.0.1/tcp/0"
    bootstrap: list[str] = field(default_factory=list)
    campaign: str | None = None  # None: discovery and sync only (a bare bootstrap)
    limits: Limits = field(default_factory=Limits)


class GossipNode:
    """The node's side of the swarm; `run()` blocks (inside trio) until cancelled.

    Thread-safe for the node: `send`, `take_offences`, `set_standing`."""

    def __init__(self, config: GossipConfig, identity: Identity, facts: Facts) -> None:
        self.config = config
        self.identity = identity
        self.peer_id = identity.peer_id
        self.facts = facts
        self.limits = config.limits
        self.book = PeerBook(config.limits)
        self.gate = HandshakeGate(config.limits)
        self.bootstraps: dict[str, str] = {}  # peer id -> the address the user gave
        self.reached: dict[str, bool] = {}  # bootstrap -> connected, as last said
        self.say: Callable[[str], None] = lambda line: None  # a line for the user, as it happens
        for text in config.bootstrap:
            info = info_from_p2p_addr(parse_multiaddr(text, need_peer_id=True))
            self.book.add(info.peer_id.to_base58(), [str(a) for a in info.addrs], bootstrap=True)
            self.bootstraps[info.peer_id.to_base58()] = text
        if config.campaign is not None and not wire.CAMPAIGN_NAME.match(config.campaign):
            raise GossipError(f"{config.campaign!r} is not a campaign name: letters, digits, "
                              "'.', '_' or '-', at most 64, starting with a letter or digit")  # fmt: skip
        self.listen = parse_multiaddr(config.listen)
        self.topic = topic_for(config.campaign) if config.campaign else None
        self.counts = dict.fromkeys(("accepted", "rejected", "published", "synced", "fetched",
                                     "rate_limited", "junk", "dropped", "restarts", "dials_failed",
                                     "streams_refused", "window_exceeded", "bad_fetches", "bad_answers",
                                     "handshakes_refused", "handshakes_cut",
                                     "handshakes_timed_out", "connections_refused",
                                     "streams_open_most"), 0)  # fmt: skip
        self.standing: Mapping[str, PeerStanding] = {}  # as the node last judged its peers
        self.silenced: set[str] = set()  # peers that lost standing
        self.banned: set[str] = set()  # of those, banned for refused messages: facts dropped
        self._offences: dict[tuple[str, str], int] = {}  # not yet taken by the node
        self._offences_lock = threading.Lock()
        # (peer, exchange) under way from us: `protocols` starts one of each at a time with a peer
        self.asking: set[tuple[str, str]] = set()
        self._outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()  # this node's own facts
        self.addrs: list[str] = []
        self.host: Any = None
        self.pubsub: Any = None
        self.started = time.monotonic()
        self.first_peer_s: float | None = None  # from this object's birth (imports excluded)
        self.first_peer_at: float | None = None  # wall clock, for benchmarks across processes
        self._synced: set[str] = set()
        self._dialing: set[str] = set()
        self.wanted = Wanted(config.limits, facts)  # versions to fetch by hash
        self.printed = trio.Event()

    # -------------------------------------------------------- supervision

    async def run(self) -> None:
        """Run the host; if it dies, start it again with the same state, after a backoff."""
        backoff = 1.0
        while True:
            began = time.monotonic()
            try:
                await self._run_host()
                return
            except (GossipError, KeyboardInterrupt):
                raise
            except Exception as exc:
                if not self.addrs:  # never came up: a bad address or a port in use
                    raise GossipError(f"cannot listen on {self.config.listen}: {exc}") from None
                self.counts["restarts"] += 1
                log.warning("gossip host failed (%s: %s); restarting", type(exc).__name__, exc)
            backoff = 1.0 if time.monotonic() - began > 60 else min(backoff * 2, 30.0)
            await trio.sleep(backoff)

    async def _run_host(self) -> None:
        guards.install()
        guards.on_window_exceeded = self._on_window_exceeded
        guards.on_oversized_frame = self._on_oversized_frame
        host = new_host(key_pair=create_new_key_pair(self.identity.seed), muxer_preference="YAMUX",
                        listen_addrs=[self.listen])  # fmt: skip
        network = host.get_network()
        network.set_stream_handler(admission.capped_streams(self, network.common_stream_handler))
        network.upgrade_inbound_raw_conn = admission.gated_handshakes(self, network)
        router = GossipSub(
            protocols=[PROTOCOL_ID_V11, PROTOCOL_ID], degree=6, degree_low=4, degree_high=12,
            heartbeat_interval=1, adaptive_gossip_enabled=False, spam_protection_enabled=False,
            max_messages_per_topic_per_second=10_000.0,  # we rate-limit per peer ourselves
            # The mesh keeps the peers that deliver valid facts: fresh keys that only connect
            # cannot prune an honest peer out of it (before, 40 of them cut one off for a minute).
            score_params=ScoreParams(p6_appl_slack_weight=1.0, app_specific_score_fn=self._mesh_score),
        )  # fmt: skip
        pubsub = GuardedPubsub(host, router, strict_signing=True, cache_size=1024,
                               max_inbound_rpc_size=self.limits.max_rpc_bytes,
                               max_peer_streams=self.limits.max_streams)  # fmt: skip
        pubsub.on_junk = self._on_junk
        pubsub.on_invalid = self._on_bad_signature
        pubsub.on_dropped = lambda peer_id, why: self.drop(peer_id.to_base58(), why)
        pubsub.on_stream_refused = lambda p: self.refuse_stream(
            p.to_base58(), "GossipSub", self.limits.max_streams
        )
        self.host, self.pubsub = host, pubsub
        try:
            await self._serve(host, router, pubsub)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await release(host)

    async def _serve(self, host: Any, router: Any, pubsub: Any) -> None:
        async with host.run(listen_addrs=[self.listen]), trio.open_nursery() as nursery:
            async with background_trio_service(pubsub), background_trio_service(router):
                await pubsub.wait_until_ready()
                if not self.addrs:
                    # A host that replaces a dead one listens where the first one did, so the
                    # address we printed stays the node's: pin a port the system picked.
                    self.listen = bound_to(self.listen, host.get_addrs())
                self.addrs = dialable_addrs([str(a) for a in host.get_addrs()], self.peer_id)
                protocols.install(self, host)
                if self.topic:
                    pubsub.set_topic_validator(self.topic, self._validate, False)
                    subscription = await pubsub.subscribe(self.topic)
                    nursery.start_soon(self._drain, subscription)
                self.printed.set()
                nursery.start_soon(self._maintain)
                nursery.start_soon(self._status_loop)
                nursery.start_soon(self._fetch_loop)
                if self.topic:
                    nursery.start_soon(self._send_loop)
                await trio.sleep_forever()

    # -------------------------------------------------------- accepting facts

    def _mesh_score(self, peer: ID) -> float:
        return self.book.mesh_score(peer.to_base58())

    def _validate(self, forwarder: ID, msg: Any) -> bool:
        """GossipSub's validator: only a fact the node takes is delivered or forwarded."""
        peer = forwarder.to_base58()
        if peer == self.peer_id:
            return True  # our own, held already
        if self.book.is_banned(peer):
            self.drop(peer, "after_ban")
            return False
        origin = origin_of(msg)
        if self.banned and (origin in self.banned or author_of(msg.data) in self.banned):
            # Neither stored nor forwarded; counted against its author, who lost standing, but
            # no penalty for the relay: the fact is valid.
            self.drop(origin if origin in self.banned else author_of(msg.data), "silenced_author")
            return False
        if not self.book.allow_message(origin):
            # Drop the flood at every hop; blame only its source, not honest relays.
            self.counts["rate_limited"] += 1
            self.book.count_drop(origin, "flood")
            if origin == peer:
                self._penalise(peer, self.limits.flood_penalty, "flood")
            return False
        (verdict,) = self.take_in([bytes(msg.data)], peer)
        if isinstance(verdict, wire.Fact):
            self.book.count_delivery(peer)
            return True
        return False

    def take_in(self, raws: list[bytes], peer: str) -> list[Verdict]:
        """Hand facts `peer` delivered to the node, and act on its verdicts: count the taken
        ones and want the train.py they name, charge the refused ones to whoever is to blame."""
        try:
            verdicts = self.facts.accept(raws, peer)
        except Exception as exc:  # the node's problem (a busy ledger), never the peer's
            log.warning("the node took no facts: %s", exc)
            return [None] * len(raws)
        for verdict in verdicts:
            if isinstance(verdict, wire.Fact):
                self.counts["accepted"] += 1
                self._want_content(verdict, peer)
            elif isinstance(verdict, wire.Rejection):
                self.reject(verdict, peer)
        return verdicts

    def _want_content(self, fact: wire.Fact, peer: str) -> None:
        if fact.kind == "result":  # ask who sent it, then who made it
            self.wanted.want(fact.body["child"], fact.peer_id, [peer, fact.peer_id])

    async def _drain(self, subscription: Any) -> None:
        while True:  # delivered messages were taken already (validator); empty the queue
            await subscription.get()

    def drop(self, peer: str, why: str) -> None:
        """Count one message from `peer` dropped unread: after its ban it is also an offence
        (recorded, so that standing sees it), never silently ignored."""
        self.counts["dropped"] += 1
        self.book.count_drop(peer, why)
        if why == "after_ban":
            self._penalise(peer, 0.0, why)

    def bad_fetch(self, peer: str, what: str) -> None:
        """`peer` served bytes that fail their hash (or a malformed answer): charged, and never
        asked to fetch anything again."""
        self.counts["bad_fetches"] += 1
        log.info("bad fetch from %s: %s", peer, what)
        self.book.mark_bad_source(peer)
        self.book.count_drop(peer, "bad_fetch")
        self._penalise(peer, self.limits.invalid_penalty, "bad_fetch")

    def bad_answer(self, peer: str, what: str) -> None:
        """`peer` answered one of our requests (a sync) with a frame no honest peer sends."""
        self.counts["bad_answers"] += 1
        log.info("bad answer from %s: %s", peer, what)
        self.book.count_drop(peer, "bad_answer")
        self._penalise(peer, self.limits.invalid_penalty, "protocol")

    def refuse_stream(self, peer: str, what: str, cap: int) -> None:
        """`peer` opened a stream over a cap of `cap` open at once (`what`: "one connection",
        or a protocol's name)."""
        self.counts["streams_refused"] += 1
        log.info("refused a stream from %s: over the cap of %d streams open at once (%s)",
                 peer, cap, what)  # fmt: skip
        self._penalise(peer, self.limits.stream_penalty, "streams")

    def _on_junk(self, peer_id: ID, exc: Exception, serious: bool = True) -> None:
        self.counts["junk"] += 1
        log.info("junk from %s: %s", peer_id, type(exc).__name__)
        if serious:
            self._penalise(peer_id.to_base58(), self.limits.junk_penalty, "junk")
        else:  # maybe the library's own bug: a point, but not held against its standing
            self._penalise(peer_id.to_base58(), self.limits.invalid_penalty, "odd message")

    def _on_oversized_frame(self, peer_id: ID) -> None:
        self._on_junk(peer_id, ValueError("a GossipSub frame over the size limit"))

    def _on_window_exceeded(self, peer_id: ID) -> None:
        self.counts["window_exceeded"] += 1
        self._penalise(peer_id.to_base58(), self.limits.junk_penalty, "window")

    def reject(self, rejection: wire.Rejection, deliverer: str) -> None:
        """Count a refused fact and charge whoever is to blame for it."""
        self.counts["rejected"] += 1
        blame = deliverer
        if rejection.reason in _SIGNED_REASONS and rejection.author:
            # The author signed it (a reused seq, a stale head, a clock far ahead): an honest
            # relay cannot tell, so the author pays, not the peer that passed it on.
            blame = peer_id_from_public_key(rejection.author)
        self._penalise(blame, self.limits.invalid_penalty, rejection.reason.value)

    def _on_bad_signature(self, peer_id: ID) -> None:
        self.counts["rejected"] += 1
        self._penalise(peer_id.to_base58(), self.limits.invalid_penalty, "libp2p_signature")

    def _penalise(self, peer: str, points: float, why: str) -> None:
        key = (peer, why)
        room = key in self._offences or len(self._offences) < self.limits.max_known
        if why in _OFFENCES and room:
            with self._offences_lock:
                self._offences[key] = self._offences.get(key, 0) + 1
        if self.book.penalise(peer, points):
            log.warning("banning %s (%s)", peer, why)
            try:
                self.pubsub.add_to_blacklist(ID.from_base58(peer))
            except Exception:
                pass

    # -------------------------------------------------------- what the node says and sends

    def take_offences(self) -> dict[tuple[str, str], int]:
        """The refusals counted since the last call, by (peer, reason), for the node to record."""
        with self._offences_lock:
            offences, self._offences = self._offences, {}
        return offences

    def untake_offences(self, offences: Mapping[tuple[str, str], int]) -> None:
        """Count again refusals the node took and could not record (its ledger was busy)."""
        with self._offences_lock:
            for key, n in offences.items():
                self._offences[key] = self._offences.get(key, 0) + n

    def set_standing(self, judged: Mapping[str, PeerStanding]) -> None:
        """The node's judgement of its peers: the banned ones' facts are dropped from now on,
        whoever relays them; the silenced ones' are still heard."""
        self.standing = judged
        self.silenced = {peer for peer, s in judged.items() if s.silenced}
        self.banned = {peer for peer, s in judged.items() if s.banned}

    def keep_standing(self, raws: list[bytes]) -> list[bytes]:
        """The facts of `raws` whose authors are not banned; the others are counted and dropped."""
        if not self.banned:
            return raws
        kept = []
        for raw in raws:
            author = author_of(raw)
            if author in self.banned:
                self.drop(author, "silenced_author")
            else:
                kept.append(raw)
        return kept

    def send(self, raw: bytes) -> None:
        """Gossip one of this node's own facts (from any thread); sent once the topic is up."""
        self._outbox.put(raw)

    async def _send_loop(self) -> None:
        while True:
            try:
                raw = self._outbox.get_nowait()
            except queue.Empty:
                await trio.sleep(0.05)
                continue
            try:
                await self.pubsub.publish(self.topic, raw)
                self.counts["published"] += 1
            except Exception as exc:
                log.warning("publish failed: %s", exc)

    # -------------------------------------------------------- peers: dial, sync, exchange

    async def _maintain(self) -> None:
        last_px = last_resync = 0.0
        async with trio.open_nursery() as nursery:
            while True:
                now = time.monotonic()
                connected = {p.to_base58() for p in self.host.get_connected_peers()}
                if connected and self.first_peer_s is None:
                    self.first_peer_s = now - self.started
                    self.first_peer_at = time.time()
                for peer in connected & self.bootstraps.keys():
                    if not self.reached.get(peer):
                        self.reached[peer] = True
                        self.say(f"connected to the bootstrap {self.bootstraps[peer]}")
                closing = self.book.to_disconnect(connected, keep=set(self.bootstraps))
                if closing is not None:  # one a tick
                    nursery.start_soon(self._disconnect, closing)
                    connected.discard(closing)
                for peer in connected - self._synced:
                    self._synced.add(peer)
                    nursery.start_soon(protocols.sync_with, self, peer)
                self._synced &= connected
                if len(connected) < self.limits.target_peers:
                    for peer in self.book.candidates(connected | self._dialing | {self.peer_id}):
                        if len(self._dialing) >= 4:
                            break
                        self._dialing.add(peer)
                        nursery.start_soon(self._dial, peer)
                px_every = 1.0 if now - self.started < 30 else 10.0
                if connected and now - last_px > px_every:
                    last_px = now
                    nursery.start_soon(
                        protocols.exchange_peers, self, random.choice(sorted(connected))
                    )
                if connected and now - last_resync > self.limits.resync_every:
                    last_resync = now
                    nursery.start_soon(protocols.sync_with, self, random.choice(sorted(connected)))
                await trio.sleep(0.25)

    async def _dial(self, peer: str) -> None:
        try:
            addrs = [multiaddr.Multiaddr(a) for a in self.book.addrs(peer)]
            if peer in self.bootstraps:  # libp2p refuses a peer for a minute once a dial failed
                self.host.get_network().unblock_peer(ID.from_base58(peer))
            with trio.fail_after(5):
                await self.host.connect(PeerInfo(ID.from_base58(peer), addrs))
            self.book.dialed(peer, ok=True)
        except Exception as exc:
            self.counts["dials_failed"] += 1
            self.book.dialed(peer, ok=False)
            if peer in self.bootstraps and self.reached.get(peer, True):
                self.reached[peer] = False  # said once, until it connects
                why = dial_failure(exc)
                self.say(f"cannot reach the bootstrap {self.bootstraps[peer]}: {why}; retrying "
                         "(check the address, and that the bootstrap runs)")  # fmt: skip
        finally:
            self._dialing.discard(peer)

    async def _disconnect(self, peer: str) -> None:
        try:
            with trio.move_on_after(5):
                await self.host.disconnect(ID.from_base58(peer))
        except Exception:
            pass

    async def _fetch_loop(self) -> None:
        while True:
            await trio.sleep(0.5)
            self.wanted.tick()
            connected = sorted(p.to_base58() for p in self.host.get_connected_peers())
            sources = [p for p in connected if not self.book.is_bad_source(p)]
            for sha256, (peers, tries) in list(self.wanted.queue.items())[:8]:
                # The sender may still be fetching it itself: ask the author, then anyone.
                peer = peers[tries] if tries < len(peers) else random.choice(sources or peers)
                data = None
                if peer in sources:
                    data = await protocols.fetch(self, peer, "version", sha256)
                if data is not None:
                    self.facts.add_version(data, sha256)
                    self.counts["fetched"] += 1
                    self.wanted.drop(sha256)
                else:
                    self.wanted.failed(sha256)

    # -------------------------------------------------------- status

    def status(self) -> dict:
        connected = (
            sorted(p.to_base58() for p in self.host.get_connected_peers()) if self.host else []
        )
        facts = self.facts.count()
        mesh = self.pubsub.router.mesh.get(self.topic, ()) if self.pubsub else ()
        return {
            "peer_id": self.peer_id, "addrs": self.addrs, "campaign": self.config.campaign,
            "topic": self.topic, "pid": os.getpid(), "time": time.time(),
            "connected": connected, "mesh": sorted(p.to_base58() for p in mesh),
            "known": len(self.book), "banned": self.book.banned(),
            "silenced": sorted(self.silenced), "standing": self._standing_shown(),
            "facts": facts, "first_peer_s": self.first_peer_s, "first_peer_at": self.first_peer_at, "counts": dict(self.counts),
            "drops": [{"peer": p, "counts": d} for p, d in self.book.drops()],
            "bad_sources": self.book.bad_sources(),
        }  # fmt: skip

    def _standing_shown(self) -> list[dict]:
        order = {"silenced": 0, "watched": 1, "good": 2}
        ranked = sorted(self.standing.values(), key=lambda s: (order[s.status], -s.claims, s.peer))
        return [s.as_dict() for s in ranked[:_MAX_STANDING_SHOWN]]

    async def _status_loop(self) -> None:
        path = Path(self.config.home) / STATUS_FILE
        while True:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(self.status()))
            os.replace(tmp, path)
            await trio.sleep(1.0)
