"""Guards around py-libp2p 0.8.1 where it trusts what a stranger says; a host start installs them.

Each guard names the defect it covers. None changes what an honest peer sees; each turns what
would grow our memory without bound into an error the library already handles (a failed
negotiation: the stream or the connection is closed). Remove a guard once the pinned library
carries the fix.
"""

from __future__ import annotations

from libp2p.exceptions import ParseError
from libp2p.protocol_muxer import multiselect_communicator
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


def install() -> None:
    """Put the guards in place (idempotent)."""
    multiselect_communicator.read_delim = _read_delim_capped  # type: ignore[assignment]
