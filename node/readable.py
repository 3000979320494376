"""How a person reads the ledger's values, in the command line and in the report alike: a time,
a peer, a score. Plain text only; the report escapes what it puts in HTML.
"""

from __future__ import annotations

from datetime import datetime, timezone


def utc(ms: int) -> datetime:
    """A fact's time (ms since the epoch) as a datetime in UTC."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def when(ms: int | None) -> str:
    """A fact's time (ms since the epoch) in UTC, to the second; "-" when there is none."""
    if ms is None:
        return "-"
    return utc(ms).strftime("%Y-%m-%d %H:%M:%S UTC")


def peer(peer_id: str | None) -> str:
    """Peer ids all start 12D3KooW; their tail tells them apart."""
    if not peer_id:
        return "-"
    return "…" + peer_id[-8:] if peer_id.startswith("12D3") else peer_id


def bpb(value: float | None, signed: bool = False) -> str:
    """A val_bpb (or with `signed`, a change of one) to four decimals; "-" when there is none."""
    return "-" if value is None else (f"{value:+.4f}" if signed else f"{value:.4f}")


def count(n: int, thing: str) -> str:
    """ "1 thing", "2 things"."""
    return f"{n} {thing}{'s' * (n != 1)}"
