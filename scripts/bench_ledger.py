"""Benchmark the ledger: facts verified and stored per second, and queries on a large ledger.

    nice -n 19 python scripts/bench_ledger.py --facts 100000

Pins itself to one core. Ingest counts decoding, signature checks and the SQLite commit; the
authors' signing is done beforehand (it is their cost, not the receiver's). Prints the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack  # noqa: E402

from node import committees, wire  # noqa: E402
from node.identity import Identity  # noqa: E402
from node.ledger import Ledger  # noqa: E402

CAMPAIGN = "bench"
PROFILES = ("cpu", "gpu", "test")
BASELINE = "00" * 32


def synthetic_facts(count: int, peers: int, seed: int = 0) -> list[bytes]:
    """A campaign's worth of signed facts: about 70% results (a quarter kept, some crashes),
    30% verifications of kept results by other peers; kept versions form deep lineages."""
    rng = random.Random(seed)
    people = [Identity(rng.randbytes(32)) for _ in range(peers)]
    seqs = [0] * peers
    harness = rng.randbytes(32).hex()
    recent: dict[str, list[tuple[str, float]]] = {p: [(BASELINE, 1.6)] for p in PROFILES}
    kept: list[tuple[wire.Fact, int]] = []
    facts: list[bytes] = []
    now = 1_790_000_000_000
    while len(facts) < count:
        now += rng.randrange(50, 2000)
        who = rng.randrange(peers)
        seqs[who] += 1
        if kept and rng.random() < 0.3:
            result, author = rng.choice(kept[-2000:])
            if author == who:
                seqs[who] -= 1
                continue
            verdict = rng.choices(["confirm", "refute", "crash"], [80, 15, 5])[0]
            body = wire.verification_body(
                result=result.id, child_val_bpb=result.body["metrics"]["val_bpb"] + 0.001,
                parent_val_bpb=result.body["metrics"]["val_bpb"] + 0.004, seed=rng.randrange(100), profile=result.body["profile"],
                harness=harness, verdict=verdict,
            )  # fmt: skip
            facts.append(wire.sign(people[who], "verification", CAMPAIGN, seqs[who], body, now).raw)
            continue
        profile = rng.choice(PROFILES)
        parent, parent_bpb = rng.choice(recent[profile][-20:])
        outcome = rng.choices(["keep", "discard", "crash"], [25, 65, 10])[0]
        val_bpb = (
            None
            if outcome == "crash"
            else parent_bpb + rng.gauss(0.0 if outcome == "keep" else 0.01, 0.005)
        )
        if outcome == "keep":
            val_bpb = min(val_bpb, parent_bpb - 1e-5)
        child = rng.randbytes(32).hex()
        metrics = {"val_bpb": val_bpb, "steps": 900, "tokens": 460_800, "train_seconds": 120.0,
                   "total_seconds": 141.2, "peak_memory_mb": 812.5, "mfu": 0.031}  # fmt: skip
        body = wire.result_body(
            parent=parent, child=child, diff=rng.randbytes(rng.randrange(200, 3000)),
            description=f"experiment {len(facts)}: try something", profile=profile,
            harness=harness, seed=rng.randrange(100), outcome=outcome, metrics=metrics,
        )  # fmt: skip
        fact = wire.sign(people[who], "result", CAMPAIGN, seqs[who], body, now)
        facts.append(fact.raw)
        if outcome == "keep":
            kept.append((fact, who))
            recent[profile].append((child, val_bpb))
    return facts


def timed(fn, repeat: int = 7) -> tuple[float, object]:
    """Median wall time in milliseconds over `repeat` calls, and the last value returned."""
    times, value = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), value


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--facts", type=int, default=100_000, help="size of the large ledger")
    parser.add_argument("--ingest", type=int, default=10_000, help="facts in the ingest runs")
    parser.add_argument("--peers", type=int, default=64)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    workdir = Path(tempfile.mkdtemp(prefix="bench-ledger-"))

    start = time.perf_counter()
    facts = synthetic_facts(args.facts, args.peers)
    print(f"signed {len(facts):,} synthetic facts in {time.perf_counter() - start:.1f} s "
          f"(not counted below)")  # fmt: skip

    sample = facts[: args.ingest]
    runs = [("one fact per commit", 1, False), ("100 facts per commit", 100, False),
            ("one per commit, fsync", 1, True)]  # fmt: skip
    for label, batch, durable in runs:
        with Ledger(
            workdir / f"ingest-{batch}-{durable}.db", campaign=CAMPAIGN, durable=durable
        ) as book:
            start = time.perf_counter()
            for i in range(0, len(sample), batch):
                outs = book.ingest_many(sample[i : i + batch], now_ms=2**62)
                assert all(isinstance(o, wire.Fact) for o in outs)
            seconds = time.perf_counter() - start
        print(f"ingest, {label:<22} {len(sample) / seconds:8,.0f} facts/s  ({len(sample):,} facts)")
    decode_start = time.perf_counter()
    for raw in sample:
        wire.decode(raw, CAMPAIGN, now_ms=2**62)
    print(
        f"decode + verify only            {len(sample) / (time.perf_counter() - decode_start):8,.0f} facts/s"
    )

    path = workdir / "large.db"
    with Ledger(path, campaign=CAMPAIGN) as book:
        book.set_terms({"name": CAMPAIGN, "baseline": BASELINE, "quorum": 1})
        start = time.perf_counter()
        for i in range(0, len(facts), 1000):
            book.ingest_many(facts[i : i + 1000], now_ms=2**62)
        print(f"built a {len(facts):,}-fact ledger in {time.perf_counter() - start:.1f} s "
              f"({path.stat().st_size / 2**20:.0f} MiB)")  # fmt: skip
    with Ledger(path, campaign=CAMPAIGN) as book:
        # Looks arriving one per commit, each for a kept claim already held: the claim is
        # judged again from its own looks, nothing else.
        kept = book.rows("SELECT id, author, profile FROM results WHERE outcome = 'keep' "
                         "ORDER BY time DESC LIMIT 200")  # fmt: skip
        late = Identity(bytes(32))
        looks = [wire.sign(late, "verification", CAMPAIGN, i + 1, wire.verification_body(
            result=r["id"], child_val_bpb=1.5, parent_val_bpb=1.503, seed=1000 + i,
            profile=r["profile"], harness=book.rows("SELECT harness FROM results WHERE id = ?",
                                                    (r["id"],))[0]["harness"], verdict="confirm"),
            2**40).raw for i, r in enumerate(kept)]  # fmt: skip
        per_look = []
        for raw in looks:
            start = time.perf_counter()
            assert isinstance(book.ingest(raw, now_ms=2**62), wire.Fact)
            per_look.append((time.perf_counter() - start) * 1000)
        print(f"ingest of one look, one commit   {statistics.median(per_look):7.2f} ms median, "
              f"{sorted(per_look)[int(0.95 * len(per_look))]:.2f} ms 95th percentile "
              f"({len(per_look)} looks, the claim judged again)")  # fmt: skip
        for profile in PROFILES:
            ms, head = timed(lambda p=profile: book.head(p))
            print(f"head, {profile:<4}                        {ms:7.1f} ms  ({head[:12]})")
        ms, body = timed(lambda: book.head_body(), repeat=3)
        size = len(msgpack.packb(body, use_bin_type=True))
        print(f"head fact body                   {ms:7.1f} ms  ({size:,} bytes, "
              f"{len(book.head_authors())} authors in its bins)")  # fmt: skip
    with Ledger(path, readonly=True) as book:
        print(f"  {book.summary()['facts']}")
        ms, board = timed(lambda: book.leaderboard(quorum=1))
        print(
            f"leaderboard, quorum 1            {ms:7.1f} ms  ({sum(map(len, board.values()))} rows)"
        )
        ms, _ = timed(lambda: book.leaderboard(quorum=2))
        print(f"leaderboard, quorum 2            {ms:7.1f} ms")
        shown, rows = max(board.items(), key=lambda item: len(item[1]))  # the deepest board
        best = rows[0]["child"]
        ms, chain = timed(lambda: book.lineage(best))
        print(f"lineage of the {shown} head       {ms:7.1f} ms  ({len(chain)} steps)")
        deepest = book.rows(
            "SELECT child FROM results WHERE outcome = 'keep' ORDER BY time DESC LIMIT 1"
        )
        ms, chain = timed(lambda: book.lineage(deepest[0]["child"]))
        print(f"lineage of the newest version    {ms:7.1f} ms  ({len(chain)} steps)")
        ms, _ = timed(lambda: book.experiments(outcome="keep", profile="gpu"))
        print(f"experiments (keep, gpu, 50)      {ms:7.1f} ms")
        ms, _ = timed(lambda: book.summary())
        print(f"summary                          {ms:7.1f} ms")
        ms, _ = timed(lambda: book.peers(), repeat=3)
        print(f"peers                            {ms:7.1f} ms")
    contradiction(path, workdir / "members.db", args.peers)
    return 0


def contradiction(large: Path, path: Path, peers: int) -> None:
    """The same ledger in a campaign whose members are its peers: a look that a replay of its seed
    contradicts makes its author hold no seat on any committee: the ledger finds the claims whose
    committee it sat on in the head of each claim's ranking it keeps, and judges again those where
    a look changes sides."""
    shutil.copy(large, path)
    rng = random.Random(0)  # synthetic_facts' keys
    members = [Identity(rng.randbytes(32)) for _ in range(peers)]
    with Ledger(path, campaign=CAMPAIGN) as book:
        start = time.perf_counter()
        book.set_terms({"name": CAMPAIGN, "baseline": BASELINE, "quorum": 1,
                        "members": sorted(m.peer_id for m in members)})  # fmt: skip
        print(f"terms with {peers} members, every claim judged again  "
              f"{time.perf_counter() - start:5.1f} s")  # fmt: skip
        claim = book.rows("SELECT id, author, profile, harness FROM results "
                          "WHERE outcome = 'keep' ORDER BY time LIMIT 1")[0]  # fmt: skip
        liar, first, second = [m for m in members if m.peer_id != claim["author"]][:3]

        def look(who: Identity, child: float, seed: int) -> float:
            body = wire.verification_body(
                result=claim["id"], child_val_bpb=child, parent_val_bpb=1.5, seed=seed,
                profile=claim["profile"], harness=claim["harness"], verdict="confirm",
            )  # fmt: skip
            raw = wire.sign(who, "verification", CAMPAIGN, book.next_seq(who.public_key), body,
                            2**40).raw  # fmt: skip
            start = time.perf_counter()
            assert isinstance(book.ingest(raw, now_ms=2**62), wire.Fact)
            return (time.perf_counter() - start) * 1000

        look(liar, 1.45, 5000)  # a look no run stands behind
        look(first, 1.51, 5000)  # a replay of its seed: contested
        seated = sum(liar.peer_id in seats for seats in committees_of(book, liar.peer_id))
        ms = look(second, 1.5101, 5000)  # a second replay: contradicted
        assert liar.peer_id in book.contradicted()
        print(f"ingest of the look that contradicts a member  {ms:7.1f} ms  "
              f"({seated:,} claims whose committee it sat on)")  # fmt: skip
        # Three more replays back the member: the two that differ are out, and it is back.
        backers = [m for m in members if m.peer_id != claim["author"]][3:6]
        ms = max(look(who, 1.45, 5000) for who in backers)
        assert liar.peer_id not in book.contradicted()
        print(f"ingest of the look that backs it again  {ms:7.1f} ms  (the slowest of three)")


def committees_of(book: Ledger, peer: str) -> list[tuple[str, ...]]:
    """The committees of the claims whose kept ranking head lists `peer`."""
    heads: dict[str, tuple[str, list[str]]] = {}
    for cid, profile, member in book.conn.execute(
        "SELECT claim, profile, member FROM ranks JOIN claims ON claims.id = claim WHERE claim IN "
        "(SELECT claim FROM ranks WHERE member = ?) ORDER BY claim, rank", (peer,),
    ):  # fmt: skip
        heads.setdefault(cid, (profile, []))[1].append(member)
    out = book.contradicted()
    return [committees.seated(head, out, book.rules(profile).committee_size)
            for profile, head in heads.values()]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
