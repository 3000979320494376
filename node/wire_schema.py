"""What a fact may hold: the limits of each kind, the reasons a message is refused, and the
schema of the envelope and of each kind's body, as checks that name what is wrong and where.
`node/wire.py` decodes with them; nothing here reads bytes or keys.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping
from enum import Enum
from typing import Any

from node.identity import point_problem

VERSION = 1
# One hard limit per kind, on the whole signed envelope. Gossip stays small (a few KB); the diff
# and train.py travel by hash and are fetched separately.
MAX_SIZE = {
    "result": 4096, "verification": 2048, "campaign": 16384, "invitation": 1024, "head": 262144,
}  # fmt: skip
MAX_ANY_SIZE = max(MAX_SIZE.values())
MAX_CLOCK_SKEW_MS = 5 * 60 * 1000  # a fact may be stamped this far ahead of our clock
MAX_DIFF_SIZE = 1 << 20  # a unified diff of train.py; larger changes are not one experiment
MAX_HEAD_AUTHORS = 4096
# A head's digest of what it holds, per author: the authors in HEAD_BINS bins by the first byte
# of their key, BIN_BYTES of sha256 each (2 KB however many authors). Sync sends the bins first
# and the per-author entries of the bins that differ only (`head_bins`).
HEAD_BINS = 256
BIN_BYTES = 8
ENVELOPE_FIELDS = ("author", "body", "campaign", "kind", "seq", "sig", "time", "v")
# void: the harness refused to score the run (it looked ahead, trained past its budget, or its
# metrics were inconsistent); for a verdict, the verifier's re-run of the child was voided.
OUTCOMES = ("keep", "discard", "crash", "void")
# misreported: the verifier replayed the author's own run (its seed, on the same device class)
# and got another score than the one claimed, by more than the profile's replay tolerance.
VERDICTS = ("confirm", "refute", "inconclusive", "crash", "void", "misreported")
MAX_SEEDS = 8  # paired seeds behind one result
MAX_DESCRIPTION = 200  # characters of a result's one-line description
MAX_MEMBERS = 400  # member keys a campaign lists: 35 bytes each, within a campaign's size

_UINT_MAX = (1 << 63) - 1
_HEX = frozenset("0123456789abcdef")
_PROFILE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}\Z")
CAMPAIGN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")  # a campaign's name, everywhere


class Reason(str, Enum):
    """Why a message was rejected; the ledger counts these per peer."""

    bad_signature = "bad_signature"
    unknown_version = "unknown_version"
    unknown_kind = "unknown_kind"
    bad_type = "bad_type"
    missing_field = "missing_field"
    extra_field = "extra_field"
    oversized = "oversized"
    foreign_campaign = "foreign_campaign"
    replay = "replay"
    seq_backwards = "seq_backwards"
    future_time = "future_time"
    malformed = "malformed"
    impostor = (
        "impostor"  # a campaign fact or invitation signed by another key than the organiser's
    )
    weak_key = "weak_key"  # a key of small order or not canonically encoded: it proves nothing


# A check returns None when the value is fine, else (reason, detail).

Problem = tuple[Reason, str]
Check = Callable[[Any, str], "Problem | None"]


def _bad(where: str, what: str) -> Problem:
    return Reason.bad_type, f"{where}: {what}"


def _hex64(value: Any, where: str) -> Problem | None:
    if isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value):
        return None
    return _bad(where, "expected sha256 as 64 lowercase hex digits")


def _uint(limit: int = _UINT_MAX, low: int = 0) -> Check:
    def check(value: Any, where: str) -> Problem | None:
        if type(value) is int and low <= value <= limit:
            return None
        return _bad(where, f"expected an integer in [{low}, {limit}]")

    return check


def _real(optional: bool = False) -> Check:
    def check(value: Any, where: str) -> Problem | None:
        if value is None and optional:
            return None
        if type(value) is float and math.isfinite(value):
            return None
        return _bad(where, "expected a finite float" + (" or nil" if optional else ""))

    return check


def _text(limit: int, pattern: re.Pattern | None = None) -> Check:
    def check(value: Any, where: str) -> Problem | None:
        if not isinstance(value, str) or len(value) > limit:
            return _bad(where, f"expected a string of at most {limit} characters")
        if "\n" in value or "\r" in value:
            return _bad(where, "expected one line")
        if pattern is not None and not pattern.match(value):
            return _bad(where, f"does not match {pattern.pattern}")
        return None

    return check


def _choice(*values: str) -> Check:
    def check(value: Any, where: str) -> Problem | None:
        return (
            None if value in values and isinstance(value, str) else _bad(where, f"one of {values}")
        )

    return check


def _key32(value: Any, where: str) -> Problem | None:
    if not (isinstance(value, bytes) and len(value) == 32):
        return _bad(where, "expected a 32-byte Ed25519 public key")
    if problem := point_problem(value):
        return Reason.weak_key, f"{where}: {problem}"
    return None


def _bins(value: Any, where: str) -> Problem | None:
    if isinstance(value, bytes) and len(value) == HEAD_BINS * BIN_BYTES:
        return None
    return _bad(where, f"expected {HEAD_BINS * BIN_BYTES} bytes of bin digests")


def _list_of(item: Check, low: int, high: int) -> Check:
    def check(value: Any, where: str) -> Problem | None:
        if not isinstance(value, list) or not low <= len(value) <= high:
            return _bad(where, f"expected a list of {low} to {high} items")
        for i, v in enumerate(value):
            if problem := item(v, f"{where}[{i}]"):
                return problem
        return None

    return check


def _map_of(key: Check, item: Check, high: int) -> Check:
    def check(value: Any, where: str) -> Problem | None:
        if not isinstance(value, dict) or len(value) > high:
            return _bad(where, f"expected a map of at most {high} entries")
        for k, v in value.items():
            if problem := key(k, f"{where} key") or item(v, f"{where}[{k!r}]"):
                return problem
        return None

    return check


def _record(fields: Mapping[str, Check], optional: Collection[str] = ()) -> Check:
    """A map with exactly `fields`, those named in `optional` allowed to be absent."""

    def check(value: Any, where: str) -> Problem | None:
        if not isinstance(value, dict):
            return _bad(where, "expected a map")
        for name in fields:
            if name not in value and name not in optional:
                return Reason.missing_field, f"{where}.{name}"
        for name in value:
            if name not in fields:
                return Reason.extra_field, f"{where}.{str(name)[:40]!r}"
        for name, field_check in fields.items():
            if name in value and (problem := field_check(value[name], f"{where}.{name}")):
                return problem
        return None

    return check


_profile = _text(32, _PROFILE)

BODIES: dict[str, Check] = {
    "result": _record(
        {
            "parent": _hex64,  # sha256 of the parent train.py
            "child": _hex64,  # sha256 of the child train.py
            "diff_sha256": _hex64,
            "diff_size": _uint(MAX_DIFF_SIZE),
            "description": _text(MAX_DESCRIPTION),
            "profile": _profile,
            "harness": _hex64,
            "seed": _uint(),
            "outcome": _choice(*OUTCOMES),
            # The paired measurement: child and parent on each seed, on the author's machine.
            "seeds": _list_of(_uint(), 0, MAX_SEEDS),
            "child_scores": _list_of(_real(), 0, MAX_SEEDS),
            "parent_scores": _list_of(_real(), 0, MAX_SEEDS),
            "device": _text(64),  # the device class: the GPU's name, or "cpu" and its kernels
            "budget": _uint(),  # the profile's training budget, in tokens
            "metrics": _record(
                {
                    "val_bpb": _real(optional=True),
                    "steps": _uint(),
                    "tokens": _uint(),
                    "train_seconds": _real(optional=True),
                    "total_seconds": _real(optional=True),
                    "peak_memory_mb": _real(optional=True),
                    "mfu": _real(optional=True),
                }
            ),
        }
    ),
    "verification": _record(
        {
            "result": _hex64,  # id of the result fact it checks
            "child_val_bpb": _real(optional=True),
            "parent_val_bpb": _real(optional=True),
            "delta": _real(optional=True),  # child - parent, on the verifier's machine
            "seed": _uint(),
            # The child's score on the author's first seed, replayed on the same device class
            # (nil: not replayed); `misreported` when it differs from the claim.
            "replay_val_bpb": _real(optional=True),
            "device": _text(64),
            "profile": _profile,
            "harness": _hex64,
            "verdict": _choice(*VERDICTS),
        }
    ),
    "campaign": _record(
        {
            "name": _text(64, CAMPAIGN_NAME),
            "organiser": _key32,
            "program_sha256": _hex64,
            "baseline": _hex64,  # sha256 of the baseline train.py
            "profiles": _list_of(_profile, 1, 16),
            "quorum": _uint(64, low=1),
            "data": _map_of(_text(32), _text(128), 16),  # e.g. tokenizer and corpus hashes
            # The member keys, for a campaign that wants Sybil resistance: only members verify,
            # on committees drawn by hash. Absent: an open campaign, where any key counts.
            "members": _list_of(_key32, 1, MAX_MEMBERS),
        },
        optional=("members",),
    ),
    # A member the organiser adds to a campaign with members, after its file was made: the
    # ledger keeps it only when the campaign's organiser signed it (`Ledger`, `Rules.members_for`).
    "invitation": _record({"member": _key32}),
    # What a node holds, so that a late joiner can ask for what it lacks (anti-entropy).
    "head": _record(
        {
            "count": _uint(),  # facts held in this campaign
            "digest": _hex64,  # sha256 of the sorted ids of those facts
            "bins": _bins,  # per bin of authors, a digest of the seqs up to which each is held
            "best": _map_of(_profile, _hex64, 16),  # best verified train.py per profile
        }
    ),
}

KINDS = tuple(BODIES)  # result, verification, campaign, invitation, head

ENVELOPE = {
    "author": _key32,
    "campaign": _text(64, CAMPAIGN_NAME),
    "seq": _uint(_UINT_MAX, low=1),
    "time": _uint(),
    "sig": lambda v, w: None if isinstance(v, bytes) and len(v) == 64 else _bad(w, "64-byte sig"),
}


def body_rules(kind: str, body: dict, author: bytes, campaign: str) -> Problem | None:
    """Rules across fields, after the types are right."""
    scored = kind == "result" and body["outcome"] not in ("crash", "void")
    if scored and body["metrics"]["val_bpb"] is None:
        return _bad("body.metrics.val_bpb", "only a crash or a void run may lack val_bpb")
    if kind == "result" and not (
        len(body["seeds"]) == len(body["child_scores"]) == len(body["parent_scores"])
    ):
        return _bad("body.seeds", "one child score and one parent score for each seed")
    if kind == "campaign":
        if body["organiser"] != author:
            return _bad("body.organiser", "a campaign is signed by its organiser")
        if body["name"] != campaign:
            return _bad("body.name", "must be the envelope's campaign")
    return None
