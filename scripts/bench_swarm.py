"""A local swarm against a node alone, or against the same swarm with the fixed list for its
proposer (`--against fixed`), side by side on this machine: both started at once with `swarm
local` (so every node gets the same share of the cores), then the best val_bpb of each over time,
read back from their ledgers, and how many experiments repeated a change a peer had measured.

For each: the head under the adoption rule over the facts known at that minute (its score is the
sum of the verified gains along its lineage, pooled from peers other than each claim's author:
docs/swarm.md) and the best kept claim of any node (the lowest val_bpb its author signed). A node
alone has no peers to verify it, so its head stays the baseline. The baseline val_bpb is the mean
of the node's own runs of it, and its noise the spread of its paired differences.

    python scripts/bench_swarm.py --minutes 20 --profile cpu --nodes 3
    python scripts/bench_swarm.py --minutes 30 --profile test --nodes 3 --against fixed
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from node import consensus, margins, noise
from node.agent.adoption import swarm_rows
from node.ledger import Ledger, ledger_path
from node.local import campaign_terms
from node.trainer import get_profile, harness_sha256


def launch(
    root: Path, nodes: int, args: argparse.Namespace, proposer: str = "learning"
) -> subprocess.Popen:
    command = [sys.executable, "-m", "node.cli", "local", "--nodes", str(nodes), "--minutes", str(args.minutes),
               "--profile", args.profile, "--proposer", proposer, "--seed", str(args.seed), "--fresh",
               "--home", str(root), "--json"]  # fmt: skip
    if args.campaign:
        command += ["--campaign", args.campaign]
    root.mkdir(parents=True, exist_ok=True)
    log = open(root / "bench.log", "w")  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ)


def timeline(
    home: Path, profile: str, baseline: str, quorum: int, minutes: float, t0_ms: int
) -> dict:
    """Per minute, from one ledger: the head under the adoption rule over the facts known by
    then (its score: the verified gains below the baseline, and the steps of its lineage) and
    the best kept claim (the lowest val_bpb any author signed); at the end, every claim's state
    and the verified ones."""
    with Ledger(ledger_path(home), readonly=True) as ledger:
        results, verifications = swarm_rows(ledger, profile)
        rules = ledger.rules(profile, quorum)
        times = {r["id"]: r["time"] for r in ledger.rows("SELECT id, time FROM results")}
        looked = {(v["result"], v["author"], v["seed"]): v["time"] for v in ledger.rows(
            "SELECT result, author, seed, time FROM verifications WHERE profile = ?", (profile,))}  # fmt: skip
        own = [r["val_bpb"] for r in ledger.rows(
            "SELECT val_bpb FROM runs WHERE child = ? AND parent = child AND val_bpb IS NOT NULL",
            (baseline,))]  # fmt: skip
        sigma, df = margins.paired_noise(
            noise.own_pairs(ledger, profile), get_profile(profile).paired_noise
        )
        counts = {r["outcome"]: r["n"] for r in ledger.rows(
            "SELECT outcome, COUNT(*) AS n FROM results WHERE profile = ? GROUP BY outcome", (profile,))}  # fmt: skip
        # an experiment whose change of its parent a peer's earlier experiment had measured
        repeats = ledger.rows(
            "SELECT COUNT(*) AS n FROM results r WHERE profile = ? AND EXISTS (SELECT 1 FROM "
            "results e WHERE e.profile = r.profile AND e.parent = r.parent AND e.child = r.child "
            "AND e.author != r.author AND e.time < r.time)", (profile,))[0]["n"]  # fmt: skip
    harness = harness_sha256(get_profile(profile))
    rows, judged = [], {}
    for minute in range(1, int(minutes) + 1):
        cut = t0_ms + minute * 60_000
        known = [r for r in results if times[r["id"]] <= cut]
        votes = [v for v in verifications if looked[(v["result"], v["author"], v["seed"])] <= cut]
        scores, judged = consensus.standings(known, votes, profile, baseline, rules, harness)
        head = scores[consensus.head_of(scores)]
        kept = [r["val_bpb"] for r in known if r["val_bpb"] is not None]
        rows.append({"minute": minute, "head_gain": 0.0 - head.score, "head_se": head.se,
                     "head_steps": head.steps, "kept": min(kept) if kept else None})  # fmt: skip
    by_id = {r["id"]: r for r in results}
    states = dict(collections.Counter(j.state for j in judged.values()))
    verified = [{"description": by_id[rid]["description"], "author": by_id[rid]["author"][:12],
                 "gain": j.gain, "se": j.se, "seeds": j.seeds, "peers": len(j.peers)}
                for rid, j in judged.items() if j.state == "verified"]  # fmt: skip
    return {"baseline": statistics.fmean(own) if own else None, "baseline_runs": len(own),
            "sigma": sigma, "sigma_df": df, "outcomes": counts, "repeats": repeats, "claims": states,
            "verified": verified, "minutes": rows}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument(
        "--against", choices=("alone", "fixed"), default="alone",
        help="alone: one node with the same proposer; fixed: as many nodes with the fixed list",
    )  # fmt: skip
    parser.add_argument(
        "--campaign", help="a campaign file for both (default: the built-in baseline)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="node i of either swarm orders its changes by SEED + i"
    )
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench-swarm"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    other = args.against  # its name in the output: "alone" or "fixed"
    t0 = int(time.time() * 1000)
    swarm = launch(args.root / "swarm", args.nodes, args)
    if other == "alone":
        control = launch(args.root / other, 1, args)
    else:
        control = launch(args.root / other, args.nodes, args, proposer="fixed")
    while swarm.poll() is None or control.poll() is None:
        time.sleep(30)
        print(f"{(time.time() * 1000 - t0) / 60_000:5.1f} min", file=sys.stderr, flush=True)
    if swarm.returncode or control.returncode:
        raise SystemExit(f"a local swarm failed: see {args.root}/*/bench.log")
    quorum, baseline = campaign_terms(args.campaign or "local")
    out = {
        "profile": args.profile, "minutes": args.minutes, "nodes": args.nodes, "quorum": quorum,
        "against": other,
        "swarm": timeline(args.root / "swarm" / "local" / "node0", args.profile, baseline, quorum, args.minutes, t0),
        other: timeline(args.root / other / "local" / "node0", args.profile, baseline, quorum, args.minutes, t0),
    }  # fmt: skip
    if args.json:
        print(json.dumps(out))
        return
    fmt = lambda v: f"{v:.4f}" if v is not None else "   -  "  # noqa: E731
    against = "1 node alone" if other == "alone" else f"{args.nodes} nodes with the fixed list"
    print(
        f"profile {args.profile}, {args.nodes} nodes against {against}, {args.minutes:g} min, "
        f"quorum {quorum}"
    )
    for name in ("swarm", other):
        part = out[name]
        print(
            f"{name}: baseline {fmt(part['baseline'])} ({part['baseline_runs']} runs), paired noise "
            f"{part['sigma']:.4f} ({part['sigma_df']} degrees of freedom), results {part['outcomes']}, "
            f"{part['repeats']} repeating a change a peer had measured"
        )
    if other == "alone":
        print("minute  swarm head gain (se, steps)  swarm best kept  alone best kept")
    else:
        print("minute  swarm head gain (se, steps)  fixed head gain (se, steps)")
    for s, a in zip(out["swarm"]["minutes"], out[other]["minutes"], strict=True):
        head = f"{s['head_gain']:.4f} ({s['head_se']:.4f}, {s['head_steps']})"
        if other == "alone":
            print(f"{s['minute']:6d}  {head:>28}  {fmt(s['kept']):>15}  {fmt(a['kept']):>15}")
        else:
            theirs = f"{a['head_gain']:.4f} ({a['head_se']:.4f}, {a['head_steps']})"
            print(f"{s['minute']:6d}  {head:>28}  {theirs:>27}")
    for name in ("swarm", other):
        print(f"{name}: claims {out[name]['claims']}")
        for v in out[name]["verified"]:
            print(
                f"  verified {v['gain']:+.4f} (se {v['se']:.4f}, {v['seeds']} seeds from "
                f"{v['peers']} peers) by {v['author']}: {v['description']}"
            )


if __name__ == "__main__":
    main()
