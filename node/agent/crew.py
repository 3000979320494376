"""What the research workers of one node share (two workers per GPU, each in its own thread): the
experiments and runs in hand, so that no two of them run the same one at once, and the node's own
kept versions, so that they build on one lineage instead of one each.

A node's own keeps need no quorum among its workers: they are the node's own measurements on
identical devices. What the swarm adopts still needs peers other than the node.
"""

from __future__ import annotations

import threading

from node.agent.loop import Head
from node.agent.proposers import Attempt


class Crew:
    """Thread-safe; a node with one worker has a crew of one, and nothing changes for it."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._in_hand: dict[tuple[str, ...], str] = {}  # key -> what it is, in a line
        self._kept: dict[str, Head] = {}  # sha256 -> the version as its worker scored it

    def take(self, *key: str, what: str = "") -> bool:
        """Take an experiment in hand (a verification: ("verify", result id); a change: ("try",
        parent, diff hash); a run of a version: ("run", sha256, seed)); False when another worker
        has it in hand now."""
        with self._lock:
            if key in self._in_hand:
                return False
            self._in_hand[key] = what
            return True

    def drop(self, *key: str) -> None:
        """The experiment is over: its result, if any, is in the ledger."""
        with self._lock:
            self._in_hand.pop(key, None)
            self._lock.notify_all()

    def has(self, *key: str) -> bool:
        """Whether a worker has `key` in hand now."""
        with self._lock:
            return key in self._in_hand

    def wait(self, *key: str) -> None:
        """Until no worker has `key` in hand (`drop` always follows `take`, a stop too)."""
        with self._lock:
            self._lock.wait_for(lambda: key not in self._in_hand)

    def in_hand(self, kind: str) -> set[str]:
        """What the workers have in hand now of one kind: result ids for "verify"."""
        with self._lock:
            return {key[1] for key in self._in_hand if key[0] == kind}

    def running(self, parent: str) -> tuple[Attempt, ...]:
        """The changes of `parent` that workers are running now, as a proposer's history shows
        them: so that it proposes something else."""
        with self._lock:
            return tuple(
                Attempt(what, "running", None, key[2], by="this node, on another GPU")
                for key, what in self._in_hand.items() if key[:2] == ("try", parent)
            )  # fmt: skip

    def kept(self, head: Head) -> None:
        """A worker kept `head`: its siblings may build on it."""
        with self._lock:
            self._kept[head.sha256] = head

    def keeps(self) -> list[Head]:
        """The node's kept versions, the best (lowest own val_bpb) first, ties by hash."""
        with self._lock:
            return sorted(self._kept.values(), key=lambda h: (h.val_bpb, h.sha256))
