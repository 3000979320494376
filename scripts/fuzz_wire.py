"""Fuzz the wire decoder: mutated and random envelopes in, a Rejection with a reason out, always.

    nice -n 19 python scripts/fuzz_wire.py --count 1000000

Prints counts by reason and the rate. Exits 1 if any input crashed the decoder, was accepted, or
hit the decoder's safety net. `mutants()` is shared with tests/test_wire.py (the short run).
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node import wire  # noqa: E402
from node.identity import Identity  # noqa: E402

CAMPAIGN = "fuzz"
HASH = "ab" * 32


def seed_facts(rng: random.Random) -> list[wire.Fact]:
    """Valid facts of every kind, the material the mutations start from."""
    me = Identity(rng.randbytes(32))
    metrics = {"val_bpb": 1.25, "steps": 10, "tokens": 1000, "train_seconds": 1.5,
               "total_seconds": 2.0, "peak_memory_mb": 100.0, "mfu": 0.5}  # fmt: skip
    result = wire.result_body(
        parent=HASH, child="cd" * 32, diff=b"-a\n+b\n", description="fuzz seed", profile="cpu",
        harness=HASH, seed=3, outcome="keep", metrics=metrics,
    )  # fmt: skip
    verification = wire.verification_body(
        result=HASH, child_val_bpb=1.2, parent_val_bpb=1.3, seed=4, profile="cpu", harness=HASH,
        verdict="confirm",
    )  # fmt: skip
    campaign = wire.campaign_body(
        name=CAMPAIGN, organiser=me.public_key, program=b"# program", baseline=HASH,
        profiles=["cpu", "gpu"], quorum=2, data={"tokenizer": HASH},
    )  # fmt: skip
    head = wire.head_body(["ef" * 32], {me.public_key: 3}, {"cpu": HASH})
    bodies = [("result", result), ("verification", verification), ("campaign", campaign),
              ("head", head)]  # fmt: skip
    return [
        wire.sign(me, kind, CAMPAIGN, i + 1, body, 1_000_000)
        for i, (kind, body) in enumerate(bodies)
    ]


def poisoned_facts(rng: random.Random) -> list[bytes]:
    """Validly signed facts that a node must still refuse: stamped in the future, or foreign."""
    me = Identity(rng.randbytes(32))
    body = wire.head_body([], {}, {})
    future = wire.sign(me, "head", CAMPAIGN, 1, body, 10**12)
    foreign = wire.sign(me, "head", "another-campaign", 2, body, 1_000_000)
    return [future.raw, foreign.raw]


_JUNK_VALUES = [None, True, -1, 2**64 - 1, 1.5, float("nan"), "", "x" * 300, b"", b"\0" * 32,
                [], {}, [1, 2], {"a": 1}, {b"k": 1}, 2**63, -(2**63)]  # fmt: skip


def _mutate_structure(rng: random.Random, env: dict) -> dict:
    """Change one thing in the decoded envelope (or its body), without re-signing."""
    env = dict(env)
    target = env
    if rng.random() < 0.5 and isinstance(env.get("body"), dict) and env["body"]:
        target = env["body"] = dict(env["body"])
    key = rng.choice(list(target))
    action = rng.randrange(4)
    if action == 0:
        del target[key]
    elif action == 1:
        target[rng.choice(["extra", "v2", "sig2", key + "_"])] = rng.choice(_JUNK_VALUES)
    else:
        target[key] = rng.choice(_JUNK_VALUES)
    return env


def _random_value(rng: random.Random, depth: int = 0):
    choice = rng.randrange(8 if depth < 4 else 5)
    if choice < 5:
        return rng.choice(_JUNK_VALUES)
    if choice == 5:
        return rng.randbytes(rng.randrange(40))
    if choice == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(rng.randrange(10)): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def mutants(rng: random.Random, facts: list[wire.Fact]) -> Iterator[bytes]:
    """An endless stream of inputs that must all be rejected, each different from every seed."""
    seeds = {f.raw for f in facts}
    poisoned = poisoned_facts(rng)
    envelopes = [msgpack.unpackb(f.raw, raw=False, strict_map_key=False) for f in facts]
    while True:
        raw = bytearray(rng.choice(facts).raw)
        kind = rng.randrange(13)
        if kind == 0:  # flip bits
            for _ in range(rng.randrange(1, 4)):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # overwrite bytes
            for _ in range(rng.randrange(1, 8)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        elif kind == 2:  # truncate
            del raw[rng.randrange(len(raw)) :]
        elif kind == 3:  # insert or delete a run
            at = rng.randrange(len(raw))
            if rng.random() < 0.5:
                raw[at:at] = rng.randbytes(rng.randrange(1, 16))
            else:
                del raw[at : at + rng.randrange(1, 16)]
        elif kind == 4:  # length headers that claim gigabytes
            raw = bytearray(rng.choice([b"\xdb", b"\xc6", b"\xdd", b"\xdf"]) + rng.randbytes(4))
            raw += rng.randbytes(rng.randrange(64))
        elif kind == 5:  # random bytes
            raw = bytearray(rng.randbytes(rng.randrange(0, 512)))
        elif kind == 6:  # a structural change, canonically re-encoded but not re-signed
            try:
                raw = bytearray(wire.canonical(_mutate_structure(rng, rng.choice(envelopes))))
            except (TypeError, ValueError):
                continue
        elif kind == 7:  # random msgpack values
            raw = bytearray(msgpack.packb(_random_value(rng), use_bin_type=True))
        elif kind == 8:  # deep nesting
            depth = rng.randrange(100, 5000)
            raw = bytearray(b"\x91" * depth + b"\xc0")
        elif kind == 9:  # a forged signature: flip one bit of it
            fact = rng.choice(facts)
            raw = bytearray(fact.raw)
            raw[fact.raw.find(fact.sig) + rng.randrange(64)] ^= 1 << rng.randrange(8)
        elif kind == 10:  # too big for its kind
            env = dict(rng.choice(envelopes))
            env["body"] = dict(env["body"], description="x" * rng.randrange(5000, 300000))
            raw = bytearray(wire.canonical(env))
        elif kind == 11:  # validly signed, but not acceptable here
            raw = bytearray(rng.choice(poisoned))
        else:  # a valid envelope, re-encoded non-canonically (float32, unsorted keys)
            env = dict(rng.choice(envelopes))
            env = dict(reversed(list(env.items())))
            raw = bytearray(msgpack.packb(env, use_bin_type=True, use_single_float=True))
        out = bytes(raw)
        if out not in seeds:
            yield out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    facts = seed_facts(rng)
    reasons: collections.Counter[str] = collections.Counter()
    failures = 0
    start = time.perf_counter()
    for i, raw in enumerate(mutants(rng, facts)):
        if i == args.count:
            break
        try:
            out = wire.decode(raw, CAMPAIGN, now_ms=2_000_000)
        except Exception as exc:  # the decoder must never raise; count and keep going
            failures += 1
            print(f"CRASH {type(exc).__name__}: {raw[:80].hex()}", file=sys.stderr)
            continue
        if isinstance(out, wire.Fact) or out.detail.startswith("decoder bug"):
            failures += 1
            print(f"NOT REJECTED ({out}): {raw[:80].hex()}", file=sys.stderr)
            continue
        reasons[out.reason.value] += 1
    seconds = time.perf_counter() - start
    total = sum(reasons.values()) + failures
    print(
        f"{total:,} inputs in {seconds:.1f} s: {total / seconds:,.0f} inputs/s, {failures} failures"
    )
    for reason, count in reasons.most_common():
        print(f"  {reason:<16} {count:>10,}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
