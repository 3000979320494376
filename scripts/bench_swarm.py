"""A local swarm against a node alone, side by side on this machine: both started at once with
`swarm local` (so every node gets the same share of the cores), then the best val_bpb of each
over time, read back from their ledgers.

For the swarm: the best *verified* head (the consensus rule over the facts known at that minute:
confirmed by the quorum of peers other than its author) and the best kept claim of any node. A
node alone has no peers to verify it, so only its best kept claim exists. Each val_bpb is the one
its author measured; the baseline is the mean of the node's own runs of the baseline, and its
noise the spread of its paired differences (docs/trainer.md).

    python scripts/bench_swarm.py --minutes 20 --profile cpu --nodes 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from node import consensus
from node.agent.adoption import swarm_rows
from node.ledger import Ledger, ledger_path
from node.local import campaign_terms
from node.trainer import get_profile, harness_sha256


def launch(root: Path, nodes: int, args: argparse.Namespace) -> subprocess.Popen:
    command = [sys.executable, "-m", "node.cli", "local", "--nodes", str(nodes), "--minutes", str(args.minutes),
               "--profile", args.profile, "--fresh", "--home", str(root), "--json"]  # fmt: skip
    if args.campaign:
        command += ["--campaign", args.campaign]
    root.mkdir(parents=True, exist_ok=True)
    log = open(root / "bench.log", "w")  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ)


def timeline(home: Path, profile: str, baseline: str, quorum: int, minutes: float, t0_ms: int) -> dict:
    """Per minute: the best verified head's val_bpb and the best kept claim, from one ledger."""
    with Ledger(ledger_path(home), readonly=True) as ledger:
        results, _ = swarm_rows(ledger, profile)
        verifications = ledger.rows(
            "SELECT result, author, verdict, profile, harness, delta, seed, time FROM verifications "
            "WHERE profile = ?",
            (profile,),
        )
        times = {r["id"]: r["time"] for r in ledger.rows("SELECT id, time FROM results")}
        own = [r["val_bpb"] for r in ledger.rows(
            "SELECT val_bpb FROM runs WHERE child = ? AND parent = child AND val_bpb IS NOT NULL",
            (baseline,))]  # fmt: skip
        sigma, df = consensus.paired_noise(
            ledger.paired_differences(profile), get_profile(profile).paired_noise
        )
        counts = {r["outcome"]: r["n"] for r in ledger.rows(
            "SELECT outcome, COUNT(*) AS n FROM results WHERE profile = ? GROUP BY outcome", (profile,))}  # fmt: skip
    harness = harness_sha256(get_profile(profile))
    rows = []
    for minute in range(1, int(minutes) + 1):
        cut = t0_ms + minute * 60_000
        known = [r for r in results if times[r["id"]] <= cut]
        votes = [v for v in verifications if v["time"] <= cut]
        head = consensus.best_head(known, votes, profile, baseline, quorum, harness)
        made = [r["val_bpb"] for r in known if r["child"] == head and r["outcome"] == "keep"]
        kept = [r["val_bpb"] for r in known if r["outcome"] == "keep" and r["val_bpb"] is not None]
        rows.append({"minute": minute, "verified": min(made) if made else None, "kept": min(kept) if kept else None})
    return {"baseline": statistics.fmean(own) if own else None, "baseline_runs": len(own),
            "sigma": sigma, "sigma_df": df, "outcomes": counts, "minutes": rows}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--campaign", help="a campaign file for both (default: the built-in baseline)")
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench-swarm"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    t0 = int(time.time() * 1000)
    swarm = launch(args.root / "swarm", args.nodes, args)
    alone = launch(args.root / "alone", 1, args)
    while swarm.poll() is None or alone.poll() is None:
        time.sleep(30)
        print(f"{(time.time() * 1000 - t0) / 60_000:5.1f} min", file=sys.stderr, flush=True)
    if swarm.returncode or alone.returncode:
        raise SystemExit(f"a local swarm failed: see {args.root}/*/bench.log")
    quorum, baseline = campaign_terms(args.campaign or "local")
    out = {
        "profile": args.profile, "minutes": args.minutes, "nodes": args.nodes, "quorum": quorum,
        "swarm": timeline(args.root / "swarm" / "local" / "node0", args.profile, baseline, quorum, args.minutes, t0),
        "alone": timeline(args.root / "alone" / "local" / "node0", args.profile, baseline, quorum, args.minutes, t0),
    }  # fmt: skip
    if args.json:
        print(json.dumps(out))
        return
    fmt = lambda v: f"{v:.4f}" if v is not None else "   -  "  # noqa: E731
    print(f"profile {args.profile}, {args.nodes} nodes against 1, {args.minutes:g} min, quorum {quorum}")
    for name in ("swarm", "alone"):
        part = out[name]
        print(f"{name}: baseline {fmt(part['baseline'])} ({part['baseline_runs']} runs), paired noise "
              f"{part['sigma']:.4f} ({part['sigma_df']} degrees of freedom), results {part['outcomes']}")
    print("minute  swarm verified  swarm best kept  alone best kept")
    for s, a in zip(out["swarm"]["minutes"], out["alone"]["minutes"], strict=True):
        print(f"{s['minute']:6d}  {fmt(s['verified']):>14}  {fmt(s['kept']):>15}  {fmt(a['kept']):>15}")


if __name__ == "__main__":
    main()
