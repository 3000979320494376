"""The signed facts nodes exchange: kinds, canonical msgpack, size limits and validation.

`decode` is total: any bytes give either a valid `Fact` or a `Rejection` with a counted reason,
never an exception and never unbounded memory. Pure functions of their inputs: no I/O, no clock
unless the caller omits `now_ms`, no ledger (sequence checks take the ledger's state as arguments).
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgpack

from node.errors import SwarmError
from node.identity import (
    Identity,
    peer_id_from_public_key,
    point_problem,
    signature_problem,
    verify_signature,
)

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
MAX_MEMBERS = 400  # member keys a campaign lists: 35 bytes each, within a campaign's size

_UINT_MAX = (1 << 63) - 1
_HEX = frozenset("0123456789abcdef")
_PROFILE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}\Z")
CAMPAIGN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")  # a campaign's name, everywhere
# msgpack's own guards: no container or string larger than one fact can hold.
_UNPACK_LIMITS = dict(
    max_str_len=MAX_ANY_SIZE,
    max_bin_len=MAX_ANY_SIZE,
    max_array_len=MAX_HEAD_AUTHORS,
    max_map_len=MAX_HEAD_AUTHORS,
    max_ext_len=0,
)


class WireError(SwarmError):
    """A fact this node tried to build is not valid (a bug in the caller, not a peer's fault)."""


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


@dataclass(frozen=True)
class Rejection:
    reason: Reason
    detail: str
    author: bytes | None = None  # the claimed author, when the envelope got that far


@dataclass(frozen=True)
class Fact:
    """A validated, signed fact. `raw` is its canonical signed bytes; `id` is their sha256."""

    id: str
    raw: bytes = field(repr=False)
    kind: str
    campaign: str
    author: bytes = field(repr=False)
    seq: int
    time: int  # milliseconds since the Unix epoch, the author's clock
    body: dict = field(repr=False)
    sig: bytes = field(repr=False)

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.author)


# ---------------------------------------------------------------- canonical encoding


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_sorted(v) for v in value]
    return value


def canonical(value: Any) -> bytes:
    """The one msgpack encoding of `value`: map keys sorted, minimal ints, floats as float64."""
    return msgpack.packb(_sorted(value), use_bin_type=True, use_single_float=False)


def fact_id(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def content_ref(data: bytes) -> tuple[str, int]:
    """(sha256 hex, size) of a blob that travels by hash: a diff or a train.py."""
    return hashlib.sha256(data).hexdigest(), len(data)


# ---------------------------------------------------------------- schemas
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
            "description": _text(200),
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

_ENVELOPE = {
    "author": _key32,
    "campaign": _text(64, CAMPAIGN_NAME),
    "seq": _uint(_UINT_MAX, low=1),
    "time": _uint(),
    "sig": lambda v, w: None if isinstance(v, bytes) and len(v) == 64 else _bad(w, "64-byte sig"),
}


def _body_rules(kind: str, body: dict, author: bytes, campaign: str) -> Problem | None:
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


# ---------------------------------------------------------------- decode


def decode(raw: Any, campaign: str | None = None, now_ms: int | None = None) -> Fact | Rejection:
    """Validate a message from the wire: a Fact, or a Rejection saying why not. Never raises.

    `campaign`: the only campaign accepted (None accepts any). `now_ms`: our clock, for the
    future-time check (None reads the system clock).
    """
    try:
        return _decode(raw, campaign, now_ms)
    except Exception as exc:  # a safety net: the fuzz tests hold this branch at zero
        return Rejection(Reason.malformed, f"decoder bug: {type(exc).__name__}")


def _decode(raw: Any, campaign: str | None, now_ms: int | None) -> Fact | Rejection:
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        return Rejection(Reason.malformed, "not bytes")
    raw = bytes(raw)
    if len(raw) > MAX_ANY_SIZE:
        return Rejection(Reason.oversized, f"{len(raw)} bytes > {MAX_ANY_SIZE}")
    try:
        envelope = msgpack.unpackb(raw, raw=False, strict_map_key=False, **_UNPACK_LIMITS)
    except Exception as exc:  # msgpack raises many types on junk; all mean the same here
        return Rejection(Reason.malformed, f"not msgpack: {type(exc).__name__}")
    if not isinstance(envelope, dict):
        return Rejection(Reason.malformed, "not a map")
    if "v" not in envelope:
        return Rejection(Reason.missing_field, "v")
    if type(envelope["v"]) is not int:
        return Rejection(Reason.bad_type, "v: expected an integer")
    if envelope["v"] != VERSION:
        return Rejection(Reason.unknown_version, f"v={envelope['v']}")
    author = envelope.get("author")
    author = author if isinstance(author, bytes) and len(author) == 32 else None
    for name in ENVELOPE_FIELDS:
        if name not in envelope:
            return Rejection(Reason.missing_field, name, author)
    if len(envelope) != len(ENVELOPE_FIELDS):
        extra = next(str(k)[:40] for k in envelope if k not in ENVELOPE_FIELDS)
        return Rejection(Reason.extra_field, repr(extra), author)
    kind = envelope["kind"]
    if not isinstance(kind, str):
        return Rejection(Reason.bad_type, "kind: expected a string", author)
    if kind not in BODIES:
        return Rejection(Reason.unknown_kind, repr(kind[:40]), author)
    if len(raw) > MAX_SIZE[kind]:
        return Rejection(Reason.oversized, f"{kind} of {len(raw)} bytes > {MAX_SIZE[kind]}", author)
    for name, check in _ENVELOPE.items():
        if problem := check(envelope[name], name):
            return Rejection(*problem, author)
    if campaign is not None and envelope["campaign"] != campaign:
        return Rejection(Reason.foreign_campaign, repr(envelope["campaign"]), author)
    body = envelope["body"]
    problem = BODIES[kind](body, "body") or _body_rules(kind, body, author, envelope["campaign"])
    if problem:
        return Rejection(*problem, author)
    if canonical(envelope) != raw:
        return Rejection(Reason.malformed, "not canonical msgpack", author)
    sig = envelope.pop("sig")
    if problem := signature_problem(sig):
        return Rejection(Reason.bad_signature, problem, author)
    if not verify_signature(author, sig, canonical(envelope)):
        return Rejection(
            Reason.bad_signature, f"not signed by {peer_id_from_public_key(author)}", author
        )
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if envelope["time"] > now + MAX_CLOCK_SKEW_MS:
        return Rejection(Reason.future_time, f"{envelope['time'] - now} ms ahead", author)
    return Fact(
        id=fact_id(raw), raw=raw, kind=kind, campaign=envelope["campaign"], author=author,
        seq=envelope["seq"], time=envelope["time"], body=body, sig=sig,
    )  # fmt: skip


def check_sequence(
    fact: Fact, held_at_seq: str | None, last_head_seq: int | None
) -> Rejection | None:
    """The state-dependent checks, given what the ledger holds for the fact's author.

    `held_at_seq`: id of the fact this author already signed with the same seq, if any. Another
    fact there is a replay (a reused sequence number). Facts may arrive in any order (gossip,
    sync), so a lower seq than the highest seen is fine: the set of facts, not their arrival
    order, decides what a node believes. A `head` is not kept: it supersedes the author's
    previous head, and its seq is a counter of its own (nodes use their clock in ms), so one
    not newer than `last_head_seq` is stale: seq_backwards.
    """
    if held_at_seq is not None and held_at_seq != fact.id:
        return Rejection(
            Reason.replay, f"seq {fact.seq} already used by {held_at_seq[:12]}", fact.author
        )
    if fact.kind == "head" and last_head_seq is not None and fact.seq <= last_head_seq:
        return Rejection(
            Reason.seq_backwards, f"head seq {fact.seq} <= {last_head_seq}", fact.author
        )
    return None


# ---------------------------------------------------------------- building facts


def sign(
    identity: Identity, kind: str, campaign: str, seq: int, body: dict, time_ms: int | None = None
) -> Fact:
    """Sign a fact as `identity`; raises WireError if it would not pass `decode`."""
    envelope = {
        "v": VERSION, "kind": kind, "campaign": campaign, "author": identity.public_key,
        "seq": seq, "time": int(time.time() * 1000) if time_ms is None else time_ms, "body": body,
    }  # fmt: skip
    try:
        envelope["sig"] = identity.sign(canonical(envelope))
        raw = canonical(envelope)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode this {kind}: {exc}") from None
    fact = decode(raw, campaign, now_ms=envelope["time"])
    if isinstance(fact, Rejection):
        raise WireError(f"cannot sign this {kind}: {fact.reason.value}: {fact.detail}")
    return fact


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def result_body(
    *, parent: str, child: str, diff: bytes, description: str, profile: str, harness: str,
    seed: int, outcome: str, metrics: Mapping[str, Any],
    pairs: Sequence[tuple[int, float, float]] = (), device: str = "", budget: int = 0,
) -> dict:  # fmt: skip
    """The body of a `result`, from the trainer's result fields (extra fields are ignored).
    `pairs`: (seed, child val_bpb, parent val_bpb) of each paired run behind the result."""
    diff_sha256, diff_size = content_ref(diff)
    line = " ".join(description.split())
    return {
        "parent": parent, "child": child, "diff_sha256": diff_sha256, "diff_size": diff_size,
        "description": line if len(line) <= 200 else line[:199] + "…",
        "profile": profile, "harness": harness, "seed": int(seed), "outcome": outcome,
        "seeds": [int(s) for s, _, _ in pairs],
        "child_scores": [float(c) for _, c, _ in pairs],
        "parent_scores": [float(p) for _, _, p in pairs],
        "device": device[:64], "budget": int(budget),
        "metrics": {
            "val_bpb": _float(metrics.get("val_bpb")),
            "steps": int(metrics.get("steps") or 0),
            "tokens": int(metrics.get("tokens") or 0),
            "train_seconds": _float(metrics.get("train_seconds")),
            "total_seconds": _float(metrics.get("total_seconds")),
            "peak_memory_mb": _float(metrics.get("peak_memory_mb")),
            "mfu": _float(metrics.get("mfu")),
        },
    }  # fmt: skip


def result_body_from_run(
    run: Mapping[str, Any], *, parent: str, diff: bytes, description: str, keep: bool,
    pairs: Sequence[tuple[int, float, float]] = (),
) -> dict:  # fmt: skip
    """The body of a `result` from the trainer's `RunResult.as_dict()` (outcome ok, crash or
    void) of the child's first seed; `keep` is the agent's decision for a scored run (a void
    run is never kept); `pairs` the paired runs behind it (their mean is its val_bpb)."""
    if run["outcome"] == "void":
        outcome = "void"
    elif run["outcome"] == "crash" or run.get("val_bpb") is None:
        outcome = "crash"
    else:
        outcome = "keep" if keep else "discard"
    metrics = dict(run)
    if pairs and outcome in ("keep", "discard"):
        metrics["val_bpb"] = sum(c for _, c, _ in pairs) / len(pairs)
    return result_body(
        parent=parent, child=run["train_py_sha256"], diff=diff, description=description,
        profile=run["profile"], harness=run["harness_sha256"], seed=run["seed"],
        outcome=outcome, metrics=metrics, pairs=pairs, device=run.get("device_name") or "",
        budget=run.get("budget_tokens") or 0,
    )  # fmt: skip


def verification_body(
    *, result: str, child_val_bpb: float | None, parent_val_bpb: float | None, seed: int,
    profile: str, harness: str, verdict: str, replay_val_bpb: float | None = None,
    device: str = "",
) -> dict:  # fmt: skip
    """The body of a `verification` of the result fact `result`; delta is child minus parent,
    on the verifier's own seed; `replay_val_bpb` the child's score on the author's first seed."""
    child, parent = _float(child_val_bpb), _float(parent_val_bpb)
    delta = None if child is None or parent is None else child - parent
    if delta is not None and not math.isfinite(delta):  # two huge scores: no difference to sign
        delta = None
    return {
        "result": result, "child_val_bpb": child, "parent_val_bpb": parent, "delta": delta,
        "seed": int(seed), "profile": profile, "harness": harness, "verdict": verdict,
        "replay_val_bpb": _float(replay_val_bpb), "device": device[:64],
    }  # fmt: skip


def campaign_body(
    *, name: str, organiser: bytes, program: bytes, baseline: str, profiles: list[str],
    quorum: int = 1, data: Mapping[str, str] | None = None,
    members: Sequence[bytes] | None = None,
) -> dict:  # fmt: skip
    """The body of a `campaign`: `program` is the program.md bytes the agents read; `members`
    the member public keys (None: an open campaign)."""
    body = {
        "name": name, "organiser": organiser, "program_sha256": content_ref(program)[0],
        "baseline": baseline, "profiles": list(profiles), "quorum": int(quorum),
        "data": dict(data or {}),
    }  # fmt: skip
    if members is not None:
        body["members"] = sorted(set(members))
    return body


def head_body(
    fact_ids: list[str], authors: Mapping[bytes, int | tuple[int, ...]], best: Mapping[str, str]
) -> dict:
    """The body of a `head`: a node's summary of the facts it holds, its `authors` (the seq up
    to which it holds each one's facts, and the highest it holds) as bin digests (`head_bins`)."""
    digest = hashlib.sha256("".join(sorted(fact_ids)).encode()).hexdigest()
    return {
        "count": len(fact_ids),
        "digest": digest,
        "bins": head_bins(authors),
        "best": dict(best),
    }


def bin_of(key: bytes) -> int:
    """The head bin of an author's public key."""
    return key[0] % HEAD_BINS


def head_bins(authors: Mapping[bytes, int | tuple[int, ...]]) -> bytes:
    """HEAD_BINS digests of `authors` ({public key: the seq up to which its facts are held, or
    that and the highest seq held}), one per bin of keys (`bin_of`): BIN_BYTES of the sha256 of
    the bin's entries, sorted; zeros for an empty bin. Two nodes whose digests of a bin agree
    hold the same facts of its authors."""
    bins: list[list[bytes]] = [[] for _ in range(HEAD_BINS)]
    for key, held in authors.items():
        seqs = held if isinstance(held, tuple) else (held,)
        bins[bin_of(key)].append(key + b"".join(int(n).to_bytes(8, "big") for n in seqs))
    return b"".join(
        hashlib.sha256(b"".join(sorted(entries))).digest()[:BIN_BYTES]
        if entries
        else bytes(BIN_BYTES)
        for entries in bins
    )


def differing_bins(mine: bytes, theirs: bytes) -> list[int]:
    """The bins whose digests differ between two `head_bins`."""
    return [
        i for i in range(HEAD_BINS)
        if mine[i * BIN_BYTES : (i + 1) * BIN_BYTES] != theirs[i * BIN_BYTES : (i + 1) * BIN_BYTES]
    ]  # fmt: skip
