"""Guards around py-libp2p 0.8.1 where it trusts what a stranger says; a host start installs them.

Each guard names the defect it covers. None changes what an honest peer sees; each turns what
would grow our memory without bound into an error the library already handles (a failed
negotiation: the stream or the connection is closed). Remove a guard once the pinned library
carries the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libp2p.exceptions import ParseError
from libp2p.io.exceptions import MessageTooLarge
from libp2p.protocol_muxer import multiselect_communicator
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.stream_muxer.yamux import yamux
from libp2p.utils.varint import read_varint_prefixed_bytes_limited

# A multistream-select message is a protocol id and a newline, tens of bytes; go-libp2p and
# py-libp2p 0.8.2 allow 64 KiB. 0.8.1 reads whatever length the prefix claims before it checks
# anything (advisory GHSA-hmjq-g7pp-rw3x): a 1 GiB prefix made a node buffer every byte a
# stranger sent before any handshake (docs/gossip.md has the RSS measured with and without).
MAX_MULTISTREAM_MESSAGE = 64 << 10


async def _read_delim_capped(reader: object) -> bytes:
    """`libp2p.utils.read_delim` with the length prefix checked before any byte is buffered."""
    try:
        message = await read_varint_prefixed_bytes_limited(reader, MAX_MULTISTREAM_MESSAGE)
    except ParseError:
        raise
    except Exception as exc:  # MessageTooLarge, a short read: the negotiation fails, no more
        raise ParseError(f"multistream-select message refused: {exc}"[:200]) from None
    if not message or message[-1:] != b"\n":
        raise ParseError("multistream-select message not delimited by a newline")
    return message[:-1]


# Yamux: 0.8.1 counts a stream's receive window but, when a peer sends past it, only logs a
# warning and buffers the data anyway: one authenticated peer writing raw frames down a stream
# the node never reads (its own GossipSub stream to that peer) took RSS from 114 to 627 MiB.
# Bytes past the window we granted are refused (the stream reads as closed) and the peer is
# reported; the window itself grows to at most MAX_STREAM_WINDOW (0.8.1: 16 MiB), so that a
# connection's streams hold at most streams x window.
MAX_STREAM_WINDOW = 1 << 20
_WINDOW_SLACK = 64 << 10  # a frame in flight while our window update travels
# The hooks below are the process's: the node whose host started last gets them (a process runs
# one node; tests that run several in one process do not count these per node).
on_window_exceeded: Callable[[Any], None] | None = None  # the node counts it against the peer


class WindowExceeded(Exception):
    """A peer sent more on a Yamux stream than the window we granted it."""


class _WindowedBuffer(bytearray):
    """One stream's receive buffer that refuses bytes past the stream's granted window."""

    def __init__(self, muxer: Any, stream_id: int, data: bytes = b"") -> None:
        super().__init__(data)
        self._muxer, self._stream_id = muxer, stream_id

    def extend(self, data: Any) -> None:
        stream = self._muxer.streams.get(self._stream_id)
        window = stream.target_recv_window if stream is not None else yamux.DEFAULT_WINDOW_SIZE
        if len(self) + len(data) > window + _WINDOW_SLACK:
            if on_window_exceeded is not None:
                on_window_exceeded(self._muxer.peer_id)
            raise WindowExceeded(f"stream {self._stream_id}: past its window of {window} bytes")
        super().extend(data)


class _WindowedBuffers(dict):
    def __init__(self, muxer: Any) -> None:
        super().__init__()
        self._muxer = muxer

    def __setitem__(self, stream_id: int, buffer: bytearray) -> None:
        super().__setitem__(stream_id, _WindowedBuffer(self._muxer, stream_id, bytes(buffer)))


_yamux_init = yamux.Yamux.__init__


def _yamux_init_windowed(self: Any, *args: Any, **kwargs: Any) -> None:
    _yamux_init(self, *args, **kwargs)
    self.stream_buffers = _WindowedBuffers(self)


# GossipSub: a frame over `max_inbound_rpc_size` ends the stream, but 0.8.1 logs it and blames
# no one, so a peer could announce 1 GiB frames on stream after stream for free.
on_oversized_frame: Callable[[Any], None] | None = None  # the node counts it as junk


async def _read_rpc_counted(stream: Any, max_length: int) -> bytes:
    try:
        return await read_varint_prefixed_bytes_limited(stream, max_length)
    except MessageTooLarge:
        if on_oversized_frame is not None:
            on_oversized_frame(stream.muxed_conn.peer_id)
        raise


def install() -> None:
    """Put the guards in place (idempotent)."""
    pubsub_module.read_varint_prefixed_bytes_limited = _read_rpc_counted  # type: ignore[assignment]
    multiselect_communicator.read_delim = _read_delim_capped  # type: ignore[assignment]
    yamux.MAX_WINDOW_SIZE = MAX_STREAM_WINDOW
    yamux.Yamux.__init__ = _yamux_init_windowed  # type: ignore[method-assign]
