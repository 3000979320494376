"""GossipSub's Pubsub with py-libp2p 0.8.1's trust in strangers taken out: a junk frame, a wrong
signature, a banned peer's message (sent or relayed) and a peer's streams past the cap each
cost their sender and are counted, instead of killing the service or passing unseen. It
overrides and calls private members of the library (checked by name: test_gossip_limits).
"""

from __future__ import annotations

from typing import Any

import msgpack
from libp2p.peer.id import ID
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.validators import signature_validator

from node.gossip.frames import reset
from node.identity import peer_id_from_public_key


def origin_id(msg: Any) -> ID | None:
    try:
        return ID(msg.from_id)
    except Exception:
        return None


def origin_of(msg: Any) -> str:
    """The peer id of a message's origin as text, "?" when it names none."""
    origin = origin_id(msg)
    return "?" if origin is None else origin.to_base58()


def author_of(raw: Any) -> str | None:
    """The peer id a fact claims as its author, unchecked: enough to drop it, never to trust it."""
    try:
        envelope = msgpack.unpackb(bytes(raw), raw=False, strict_map_key=False, max_bin_len=1 << 20,
                                   max_str_len=1 << 20, max_array_len=8192, max_map_len=8192)  # fmt: skip
        author = envelope.get("author") if isinstance(envelope, dict) else None
        if isinstance(author, bytes) and len(author) == 32:
            return peer_id_from_public_key(author)
    except Exception:
        pass
    return None


def _signed(msg: Any) -> bool:
    try:
        return signature_validator(msg)
    except Exception:
        return False


class GuardedPubsub(Pubsub):
    """Pubsub whose junk costs the sender, not the node (on library internals: test_gossip_limits)."""

    on_junk: Any = None
    on_invalid: Any = None
    on_dropped: Any = None  # a message from a blacklisted (banned) peer, dropped by the library
    on_stream_refused: Any = None  # a peer's GossipSub stream over `max_peer_streams`

    def __init__(self, *args: Any, max_peer_streams: int = 2, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # An honest peer sends on one stream (two while it reconnects); the library reads every
        # stream a peer opens, each holding a frame of up to `max_inbound_rpc_size` as it
        # arrives: 20 fresh keys of 31 such streams each took a node from 114 to 464 MiB.
        self.max_peer_streams = max_peer_streams
        self._inbound: dict[ID, int] = {}  # peer -> its GossipSub streams to us open now

    async def stream_handler(self, stream: Any) -> None:
        peer_id = stream.muxed_conn.peer_id
        if self._inbound.get(peer_id, 0) >= self.max_peer_streams:
            if self.on_stream_refused is not None:
                self.on_stream_refused(peer_id)
            await reset(stream)
            return
        self._inbound[peer_id] = self._inbound.get(peer_id, 0) + 1
        try:
            await super().stream_handler(stream)
        except Exception as exc:  # DecodeError on junk killed unguarded 0.8.1 nodes
            if self.on_junk is not None:
                self.on_junk(peer_id, exc)
            await reset(stream)
            self._handle_dead_peer(peer_id)
        finally:
            self._inbound[peer_id] -= 1
            if not self._inbound[peer_id]:
                del self._inbound[peer_id]

    async def _teardown_if_connected(self, peer_id: ID) -> None:
        # The library's version (run when we blacklist a peer) deletes `peers[peer_id]` after an
        # await, by which time `stream_handler` above may have removed it: the KeyError killed
        # the whole pubsub service, and with it the host. Remove only what is still there.
        stream = self.peers.get(peer_id)
        if stream is not None:
            await reset(stream)
            if self.peers.get(peer_id) is stream:
                del self.peers[peer_id]
        self._forget_all_subscriptions(peer_id)

    async def push_msg(self, msg_forwarder: ID, msg: Any) -> None:
        # The library drops a message whose libp2p signature is wrong, silently; we also charge
        # the peer that sent it (checked once per message: seen ones are skipped).
        if msg_forwarder != self.my_id and self.is_peer_blacklisted(msg_forwarder):
            if self.on_dropped is not None:  # the library drops it without a word: we count it
                self.on_dropped(msg_forwarder, "after_ban")
            return
        originator = origin_id(msg)
        if (
            originator is not None
            and originator != self.my_id
            and self.is_peer_blacklisted(originator)
        ):
            # A banned peer's message relayed by another: the library drops it without a word
            # too. Counted against its originator; the relay did nothing wrong.
            if self.on_dropped is not None:
                self.on_dropped(originator, "relayed_after_ban")
            return
        if (msg_forwarder != self.my_id and not self._is_msg_seen(msg)
                and not _signed(msg)):  # fmt: skip
            if self.on_invalid is not None:
                self.on_invalid(msg_forwarder)
            return
        try:
            await super().push_msg(msg_forwarder, msg)
        except Exception as exc:  # maybe a library bug on an odd but signed message: no ban
            if self.on_junk is not None:
                self.on_junk(msg_forwarder, exc, serious=False)
