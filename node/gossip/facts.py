"""The transport's one door to the node: facts in, each with a verdict, and what it may serve.

The node gives the transport a `Facts` (over its ledger, in `node/network.py`); the transport
never opens a ledger. Every call comes from the transport's own thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, Union

from node import wire

# What became of one fact: taken (the fact), refused (why, and whose fault), or not taken for a
# reason of the node's own (None: a busy ledger), which is never held against the peer.
Verdict = Union[wire.Fact, wire.Rejection, None]  # noqa: UP007  (a runtime alias)


class Facts(Protocol):
    def accept(self, raws: list[bytes], peer: str) -> list[Verdict]:
        """One verdict for each fact `peer` delivered, in order; taken ones are stored."""

    def holdings(self) -> dict[bytes, tuple[int, int]]:
        """Per author key: (facts held, highest seq), what sync compares."""

    def missing_from(
        self, authors: Mapping[bytes, int], share: int, bins: Iterable[int]
    ) -> Iterable[bytes]:
        """Facts of the authors in `bins` beyond what `authors` says the peer holds."""

    def version(self, sha256: str) -> bytes | None:
        """The train.py whose sha256 is `sha256`, if held."""

    def add_version(self, data: bytes, sha256: str) -> None:
        """Keep a train.py fetched by hash (already checked against it)."""

    def count(self) -> int:
        """How many facts are held."""

    def missing_versions(self, limit: int, per_author: int) -> list[tuple[str, str]]:
        """(sha256, the author's peer id) of the train.py versions that recent results name
        as their child and that are not held, the newest first, at most `limit` and at most
        `per_author` of one author's (a flood of one key's leaves room for the others')."""


class NoFacts:
    """Facts for a node that only asks (a fetch of one file): it holds and takes nothing."""

    def accept(self, raws: list[bytes], peer: str) -> list[Verdict]:
        return [None] * len(raws)

    def holdings(self) -> dict[bytes, tuple[int, int]]:
        return {}

    def missing_from(self, authors, share, bins) -> Iterable[bytes]:
        return ()

    def version(self, sha256: str) -> bytes | None:
        return None

    def add_version(self, data: bytes, sha256: str) -> None:
        return None

    def count(self) -> int:
        return 0

    def missing_versions(self, limit: int, per_author: int) -> list[tuple[str, str]]:
        return []


class PeerStanding(Protocol):
    """What the transport reads of the node's judgement of one peer (`set_standing`)."""

    peer: str
    claims: int

    @property
    def status(self) -> str:
        """ "good", "watched" or "silenced": the order peers are shown in."""

    @property
    def silenced(self) -> bool:
        """It lost standing: still heard, since its facts are how it recovers."""

    @property
    def banned(self) -> bool:
        """Its refused messages cost it standing: its facts are dropped, whoever relays them."""

    def as_dict(self) -> dict:
        """How it is shown in the status file."""
