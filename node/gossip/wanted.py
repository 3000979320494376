"""The train.py versions a node wants fetched by hash: whom to ask, how many tries so far, room
for every author's (one key's flood of results naming files nobody serves would keep every
other version out), and the versions still missing asked for again from the ledger (`refill`).
Used on the transport's thread only."""

from __future__ import annotations

import collections
import logging
import time

from node.gossip.facts import Facts
from node.gossip.limits import Limits

log = logging.getLogger("swarm.gossip")
TRIES = 12  # fetches of one version before it is given up (asked for again after `rewant_after`)


class Wanted:
    def __init__(self, limits: Limits, facts: Facts) -> None:
        self.limits, self.facts = limits, facts
        self.queue: dict[str, tuple[list[str], int]] = {}  # sha256 -> (peers to ask, tries)
        self.gave_up: dict[str, float] = {}  # sha256 -> when its tries ran out (monotonic)
        self._author_of: dict[str, str] = {}  # sha256 -> the author of the result naming it
        self._by: collections.Counter[str] = collections.Counter()  # queued, by author
        self._refilled = time.monotonic()

    def want(self, sha256: str, author: str, peers: list[str]) -> None:
        """Queue a train.py to fetch, asking `peers` in turn, then anyone: unless it is held,
        queued already, the queue is full, or `author`'s results name max_wanted_per_author of
        the queue already."""
        if (sha256 in self.queue or len(self.queue) >= self.limits.max_wanted
                or self._by[author] >= self.limits.max_wanted_per_author
                or self.facts.version(sha256) is not None):  # fmt: skip
            return
        self.queue[sha256] = (peers, 0)
        self._author_of[sha256] = author
        self._by[author] += 1

    def failed(self, sha256: str) -> None:
        """One more fetch of it came back empty: given up after TRIES."""
        if sha256 not in self.queue:
            return
        peers, tries = self.queue[sha256]
        if tries + 1 < TRIES:
            self.queue[sha256] = (peers, tries + 1)
        else:
            self.drop(sha256)
            self.gave_up[sha256] = time.monotonic()

    def drop(self, sha256: str) -> None:
        """Take it off the queue (fetched, or given up)."""
        self.queue.pop(sha256, None)
        author = self._author_of.pop(sha256, None)
        if author is not None:
            self._by[author] -= 1
            if self._by[author] <= 0:
                del self._by[author]

    def tick(self) -> None:
        """`refill` once every `rewant_every` seconds. A ledger that cannot answer now (busy) is
        the node's problem, never a peer's: logged, and tried at the next."""
        if time.monotonic() - self._refilled < self.limits.rewant_every:
            return
        self._refilled = time.monotonic()
        try:
            self.refill()
        except Exception as exc:
            log.warning("could not read the versions still missing: %s", exc)

    def refill(self) -> None:
        """Queue again the versions recent results name that the ledger still lacks, the newest
        first: one left out while the queue was full, or whose author was away for all of its
        tries (not one given up in the last `rewant_after` seconds)."""
        now = time.monotonic()
        self.gave_up = {
            sha: at for sha, at in self.gave_up.items() if now - at < self.limits.rewant_after
        }
        room, fair = self.limits.max_wanted - len(self.queue), self.limits.max_wanted_per_author
        for sha256, author in self.facts.missing_versions(room, fair) if room > 0 else ():
            if sha256 not in self.gave_up:
                self.want(sha256, author, [author])
