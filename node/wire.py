"""The signed facts nodes exchange: canonical msgpack, decoding and validation, and building
and signing them (what each kind may hold is `node/wire_schema.py`'s).

`decode` is total: any bytes give either a valid `Fact` or a `Rejection` with a counted reason,
never an exception and never unbounded memory. Pure functions of their inputs: no I/O, no clock
unless the caller omits `now_ms`, no ledger (sequence checks take the ledger's state as arguments).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from node.errors import SwarmError
from node.identity import (
    Identity,
    peer_id_from_public_key,
    signature_problem,
    verify_signature,
)
from node.wire_schema import BIN_BYTES as BIN_BYTES

# The limits, the kinds' values and Reason are the schema's; callers read them as wire.X too.
from node.wire_schema import (
    BODIES,
    ENVELOPE,
    ENVELOPE_FIELDS,
    MAX_CLOCK_SKEW_MS,
    MAX_SIZE,
    VERSION,
    body_rules,
)
from node.wire_schema import CAMPAIGN_NAME as CAMPAIGN_NAME
from node.wire_schema import HEAD_BINS as HEAD_BINS
from node.wire_schema import MAX_ANY_SIZE as MAX_ANY_SIZE
from node.wire_schema import MAX_DESCRIPTION as MAX_DESCRIPTION
from node.wire_schema import MAX_DIFF_SIZE as MAX_DIFF_SIZE
from node.wire_schema import MAX_HEAD_AUTHORS as MAX_HEAD_AUTHORS
from node.wire_schema import MAX_MEMBERS as MAX_MEMBERS
from node.wire_schema import OUTCOMES as OUTCOMES
from node.wire_schema import VERDICTS as VERDICTS
from node.wire_schema import Reason as Reason

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
    for name, check in ENVELOPE.items():
        if problem := check(envelope[name], name):
            return Rejection(*problem, author)
    if campaign is not None and envelope["campaign"] != campaign:
        return Rejection(Reason.foreign_campaign, repr(envelope["campaign"]), author)
    body = envelope["body"]
    problem = BODIES[kind](body, "body") or body_rules(kind, body, author, envelope["campaign"])
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
        "description": line if len(line) <= MAX_DESCRIPTION else line[: MAX_DESCRIPTION - 1] + "…",
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
