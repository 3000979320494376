"""Length-prefixed msgpack frames on libp2p streams, with hard limits on size and time.

Every read from a peer goes through `read_frame`: a claimed length above the limit, a frame that
is not msgpack, or a peer that stalls ends the exchange with `FrameError`, never a crash.
"""

from __future__ import annotations

from typing import Any

import msgpack
import trio
from libp2p.io.exceptions import MessageTooLarge
from libp2p.utils.varint import encode_uvarint, read_varint_prefixed_bytes_limited

MAX_FRAME = 2 << 20  # a fetch chunk (1 MiB) plus its envelope
_UNPACK_LIMITS = dict(max_str_len=MAX_FRAME, max_bin_len=MAX_FRAME, max_array_len=8192,
                      max_map_len=8192, max_ext_len=0)  # fmt: skip


class FrameError(Exception):
    """A peer's frame that is too large, truncated, late or not msgpack."""


class MalformedFrame(FrameError):
    """A frame no well-behaved peer sends (over the limit, not msgpack, not the expected shape),
    as against a peer that went away or stalled: the sender is charged for it."""


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, **_UNPACK_LIMITS)
    except Exception as exc:  # msgpack raises many types on junk; all mean the same here
        raise MalformedFrame(f"not msgpack: {type(exc).__name__}") from None


async def write_frame(stream: Any, value: Any, timeout: float = 10.0) -> None:
    data = pack(value)
    with trio.fail_after(timeout):
        await stream.write(encode_uvarint(len(data)) + data)


async def read_frame(stream: Any, limit: int = MAX_FRAME, timeout: float = 10.0) -> Any:
    """One frame from `stream`, decoded; FrameError on anything a well-behaved peer never sends."""
    try:
        with trio.fail_after(timeout):
            data = await read_varint_prefixed_bytes_limited(stream, limit)
    except trio.TooSlowError:
        raise FrameError(f"no frame within {timeout} s") from None
    except MessageTooLarge as exc:
        raise MalformedFrame(f"over {limit} bytes: {exc}"[:200]) from None
    except Exception as exc:  # too large, truncated, reset: the exchange is over either way
        raise FrameError(f"{type(exc).__name__}: {exc}"[:200]) from None
    return unpack(data)


async def reset(stream: Any) -> None:
    """End `stream` at once, whatever state it is in (already reset or closed: nothing to do)."""
    try:
        await stream.reset()
    except Exception:
        pass
