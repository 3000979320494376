"""Our request/response protocols on libp2p streams: sync (anti-entropy), peer exchange, fetch.

Each exchange is a few msgpack frames with limits on size, count and time. A handler never lets
a peer's mistake escape: anything unexpected ends that one stream and costs the peer points.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgpack
import multiaddr
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from node import wire
from node.gossip.frames import FrameError, MalformedFrame, read_frame, reset, write_frame

if TYPE_CHECKING:
    from node.gossip.peer import GossipNode

log = logging.getLogger("swarm.gossip")

SYNC = TProtocol("/research-swarm/sync/2")
PEERS = TProtocol("/research-swarm/peers/1")
FETCH = TProtocol("/research-swarm/fetch/1")
CHUNK = 1 << 20  # bytes per fetch response
_SYNC_BATCH = 256  # facts per sync frame
_MAX_PX = 32  # peers per peer-exchange answer
_MAX_REQUESTS = 64  # fetch requests on one stream
_FETCH_KINDS = ("version",)


def install(node: GossipNode, host: Any) -> None:
    """Register the handlers of our protocols on `host`."""
    for protocol, handler in ((SYNC, _serve_sync), (PEERS, _serve_peers), (FETCH, _serve_fetch)):
        host.set_stream_handler(protocol, _guarded(node, handler))


def _guarded(node: GossipNode, handler: Any) -> Any:
    async def run(stream: Any) -> None:
        peer = stream.muxed_conn.peer_id.to_base58()
        protocol = str(stream.get_protocol())
        if node.book.is_banned(peer):
            node.book.count_drop(peer, "stream_after_ban")
            await reset(stream)
            return
        if not node.book.open_stream(peer, protocol):
            node.refuse_stream(peer, protocol, node.limits.max_streams)  # too many of it
            await reset(stream)
            return
        try:
            await handler(node, stream, peer)
            await stream.close()
        except Exception as exc:  # one bad stream ends here; the node goes on
            log.info("%s from %s: %s", protocol, peer, exc)
            if isinstance(exc, FrameError):
                node._penalise(peer, node.limits.invalid_penalty, "protocol")
            await reset(stream)
        finally:
            node.book.close_stream(peer, protocol)

    return run


async def _open(node: GossipNode, peer: str, protocol: TProtocol) -> Any:
    with trio.fail_after(10):
        return await node.host.new_stream(ID.from_base58(peer), [protocol])


# ------------------------------------------------------------ sync: what do you have that I lack


def _valid_authors(value: Any) -> dict[bytes, int]:
    if not isinstance(value, dict) or len(value) > wire.MAX_HEAD_AUTHORS:
        raise FrameError("sync request: authors must be a map of at most 4096 entries")
    for key, seq in value.items():
        if not (isinstance(key, bytes) and len(key) == 32 and type(seq) is int and seq >= 0):
            raise FrameError("sync request: authors maps a 32-byte key to a seq")
    return value


def _valid_bins(value: Any) -> bytes:
    if not (isinstance(value, bytes) and len(value) == wire.HEAD_BINS * wire.BIN_BYTES):
        raise FrameError(f"sync request: bins must be {wire.HEAD_BINS * wire.BIN_BYTES} bytes")
    return value


def _valid_want(value: Any) -> list[int]:
    if not (isinstance(value, list) and len(value) <= wire.HEAD_BINS
            and all(type(i) is int and 0 <= i < wire.HEAD_BINS for i in value)):  # fmt: skip
        raise FrameError("sync answer: want must list bin numbers")
    return value


def _one_at_a_time(
    exchange: Callable[[GossipNode, str], Awaitable[int]],
) -> Callable[[GossipNode, str], Awaitable[int]]:
    """`exchange(node, peer)`, skipped (0) while one of its kind with `peer` is under way: a peer
    refuses a third stream of one protocol at once (`Limits.max_streams`) and counts it against
    us, and a stream we ended may still be closing on its side. Those we start are periodic (a
    resync, a peer exchange): a skipped one comes again."""

    @functools.wraps(exchange)
    async def run(node: GossipNode, peer: str) -> int:
        key = (peer, exchange.__name__)
        if key in node.asking:
            return 0
        node.asking.add(key)
        try:
            return await exchange(node, peer)
        finally:
            node.asking.discard(key)

    return run


@_one_at_a_time
async def sync_with(node: GossipNode, peer: str) -> int:
    """Ask `peer` for the facts we lack; returns how many were new. Our head goes in two
    rounds: its bin digests (`wire.head_bins`, 2 KB), then the per-author entries of the bins
    whose digests differ from the peer's, which it answers with the facts we lack there."""
    new = 0
    try:
        stream = await _open(node, peer, SYNC)
        holdings = node.facts.holdings()
        bins = wire.head_bins(holdings)
        await write_frame(stream, {"bins": bins, "campaign": node.config.campaign})
        answer = await read_frame(stream, timeout=node.limits.sync_seconds)
        if not isinstance(answer, dict):
            raise MalformedFrame("sync answer: expected a map")
        want = set(_valid_want(answer.get("want")))
        authors = {k: n for k, (n, _) in holdings.items() if wire.bin_of(k) in want}
        await write_frame(stream, {"authors": authors})
        received = 0
        with trio.move_on_after(node.limits.sync_seconds):
            while received < node.limits.max_sync_facts:
                batch = await read_frame(stream, timeout=node.limits.sync_seconds)
                if not isinstance(batch, list) or len(batch) > _SYNC_BATCH:
                    raise MalformedFrame("sync answer: expected a list of facts")
                if not batch:
                    break
                received += len(batch)
                verdicts = node.take_in(node.keep_standing(batch), peer)
                new += sum(isinstance(v, wire.Fact) for v in verdicts)
        await stream.close()
    except MalformedFrame as exc:
        node.bad_answer(peer, f"sync: {exc}")
    except Exception as exc:
        log.info("sync with %s: %s", peer, exc)
    node.counts["synced"] += new
    return new


def _campaign_of(raw: bytes) -> str | None:
    """The campaign a stored fact belongs to; a node that holds several sends only the asked one."""
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False).get("campaign")
    except Exception:
        return None


async def _serve_sync(node: GossipNode, stream: Any, peer: str) -> None:
    request = await read_frame(stream, limit=16 << 10)
    if not isinstance(request, dict):
        raise FrameError("sync request: expected a map")
    theirs = _valid_bins(request.get("bins"))
    want = []  # too soon after the last one: nothing this time
    if node.book.sync_due(peer):
        want = wire.differing_bins(wire.head_bins(node.facts.holdings()), theirs)
    await write_frame(stream, {"want": want})
    entries = await read_frame(stream, limit=wire.MAX_ANY_SIZE + 4096)
    if not isinstance(entries, dict):
        raise FrameError("sync request: expected a map")
    authors = _valid_authors(entries.get("authors"))
    # Collect first (bounded), then send: no cursor stays open while we wait on the peer.
    campaign = request.get("campaign")
    share = node.limits.max_sync_per_author  # one author's flood cannot fill the answer
    wanted = (raw for raw in node.facts.missing_from(authors, share, want)
              if campaign is None or _campaign_of(raw) == campaign)  # fmt: skip
    missing = list(itertools.islice(wanted, node.limits.max_sync_facts))
    sent = 0
    for start in range(0, len(missing), _SYNC_BATCH):
        batch = missing[start : start + _SYNC_BATCH]
        sent += sum(len(raw) for raw in batch)
        if sent > node.limits.max_sync_bytes:
            break
        await write_frame(stream, batch)
    await write_frame(stream, [])


# ------------------------------------------------------------ peer exchange: who else is there


def _clean_addrs(value: Any) -> list[str]:
    out = []
    for text in value if isinstance(value, list) else []:
        if isinstance(text, str) and len(text) < 256 and "/tcp/" in text:
            try:
                multiaddr.Multiaddr(text)
            except Exception:
                continue
            out.append(text.split("/p2p/")[0])
    return out[:8]


@_one_at_a_time
async def exchange_peers(node: GossipNode, peer: str) -> int:
    """Tell `peer` where we listen and learn the peers it is connected to; returns how many."""
    learned = 0
    try:
        stream = await _open(node, peer, PEERS)
        await write_frame(stream, {"addrs": [a.split("/p2p/")[0] for a in node.addrs]})
        answer = await read_frame(stream, limit=64 << 10)
        for entry in answer.get("peers", [])[:_MAX_PX] if isinstance(answer, dict) else []:
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str):
                try:
                    ID.from_base58(entry[0])
                except Exception:
                    continue
                if entry[0] != node.peer_id and (addrs := _clean_addrs(entry[1])):
                    node.book.add(entry[0], addrs)
                    learned += 1
        await stream.close()
    except Exception as exc:
        log.info("peer exchange with %s: %s", peer, exc)
    return learned


async def _serve_peers(node: GossipNode, stream: Any, peer: str) -> None:
    request = await read_frame(stream, limit=16 << 10)
    if not isinstance(request, dict):
        raise FrameError("peer exchange: expected a map")
    if addrs := _clean_addrs(request.get("addrs")):
        node.book.add(peer, addrs)
    connected = {p.to_base58() for p in node.host.get_connected_peers()} - {peer}
    entries = node.book.entries(connected)[:_MAX_PX]
    await write_frame(stream, {"peers": [[p, a] for p, a in entries]})


# ------------------------------------------------------------ fetch by hash, in chunks


def _lookup(node: GossipNode, kind: str, sha256: str) -> bytes | None:
    return node.facts.version(sha256) if kind == "version" else None


async def fetch(node: GossipNode, peer: str, kind: str, sha256: str) -> bytes | None:
    """The bytes whose sha256 is `sha256` (a train.py version), from `peer`, or None.

    Fetched in chunks of 1 MiB and checked against the hash before anyone sees them."""
    if kind not in _FETCH_KINDS:
        raise ValueError(f"fetch what? {kind!r} is not one of {_FETCH_KINDS}")
    try:
        stream = await _open(node, peer, FETCH)
        parts: list[bytes] = []
        size, offset = None, 0
        while size is None or offset < size:
            await write_frame(stream, {"kind": kind, "sha256": sha256, "offset": offset})
            answer = await read_frame(stream)
            answer = answer if isinstance(answer, dict) else {}
            if "error" in answer and "data" not in answer:
                break  # the peer has it not
            data, size = answer.get("data"), answer.get("size")
            if not (isinstance(data, bytes) and type(size) is int and 0 < len(data) <= CHUNK
                    and size <= node.limits.max_blob and offset + len(data) <= size):  # fmt: skip
                raise MalformedFrame("an answer out of bounds or of no known shape")
            parts.append(data)
            offset += len(data)
        await stream.close()
    except MalformedFrame as exc:  # not msgpack, over the limit, out of bounds: charged
        node.bad_fetch(peer, f"{kind} {sha256[:12]}: {exc}")
        await reset(stream)
        return None
    except Exception as exc:  # gone, stalled, refused: not held against it
        log.info("fetch %s %s from %s: %s", kind, sha256[:12], peer, exc)
        return None
    blob = b"".join(parts)
    if size is None:
        return None
    if hashlib.sha256(blob).hexdigest() != sha256:
        node.bad_fetch(peer, f"{kind} {sha256[:12]}: the bytes hash to something else")
        return None
    return blob


async def _serve_fetch(node: GossipNode, stream: Any, peer: str) -> None:
    for _ in range(_MAX_REQUESTS):
        try:
            request = await read_frame(stream, limit=4096, timeout=10)
        except FrameError:
            return  # the peer is done (EOF) or gone
        if not isinstance(request, dict) or request.get("kind") not in _FETCH_KINDS:
            raise FrameError("fetch request: expected {kind, sha256, offset}")
        sha256, offset = request.get("sha256"), request.get("offset")
        if not isinstance(sha256, str) or type(offset) is not int or offset < 0:
            raise FrameError("fetch request: bad sha256 or offset")
        data = _lookup(node, request["kind"], sha256)
        if data is None or offset >= max(len(data), 1):
            await write_frame(stream, {"error": "not found"})
            return
        await write_frame(stream, {"size": len(data), "data": data[offset : offset + CHUNK]})
