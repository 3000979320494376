#!/usr/bin/env python3
"""Simulate a swarm on a virtual clock (node/simulation, docs/simulation.md) and print its figures.

.venv/bin/python scripts/simulate.py --nodes 16 --seed 0
.venv/bin/python scripts/simulate.py --nodes 1000 --hours 12 --json
.venv/bin/python scripts/simulate.py --nodes 16 --malicious 0.3 --quorum 2
.venv/bin/python scripts/simulate.py --calibrate --quorum 2   # the rule's error rates and power
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.simulation import TARGET, Settings, Simulation  # noqa: E402


def _window(text: str) -> tuple[float, float]:
    start, _, end = text.partition(":")
    try:
        window = float(start), float(end)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END in hours, got {text!r}") from None
    if not 0 <= window[0] < window[1]:
        raise argparse.ArgumentTypeError(f"expected 0 <= START < END, got {text!r}")
    return window


def _hours(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.2f} h"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1, help="run seeds SEED .. SEED+SEEDS-1")
    p.add_argument("--hours", type=float, default=48.0, help="virtual hours of research at most")
    p.add_argument("--malicious", type=float, default=0.0, help="share of colluding cheats")
    p.add_argument("--quorum", type=int, default=1)
    p.add_argument("--latency", type=float, default=0.1, help="mean seconds per gossip hop")
    p.add_argument("--loss", type=float, default=0.0, help="chance a fact misses a node")
    p.add_argument("--churn", type=float, default=0.0, help="leaves per node per hour")
    p.add_argument("--away", type=float, default=1.0, help="mean hours a leaver stays away")
    p.add_argument("--partition", type=_window, default=None, help="START:END hours, halves cut")
    p.add_argument("--target", type=float, default=TARGET, help="true val_bpb to reach")
    p.add_argument("--verify-every", type=int, default=4)
    p.add_argument("--ledger", choices=("auto", "sqlite", "shared"), default="auto")
    p.add_argument("--keep-going", action="store_true", help="research the whole --hours")
    p.add_argument("--baseline-hours", type=float, default=None,
                   help="one node's hours to the target, for the speed-up (else it is simulated)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the summary as JSON only")
    p.add_argument("--calibrate", action="store_true",
                   help="print how often claims of 0, 0.5, 1 and 2 sigmas of true gain end verified")  # fmt: skip
    p.add_argument("--trials", type=int, default=2000, help="claims per gain, with --calibrate")
    args = p.parse_args()
    if args.calibrate:
        return _calibrate(args)
    if args.nodes < 1 or args.quorum < 1 or args.seeds < 1 or not 0 <= args.malicious < 1:
        p.error("need --nodes, --quorum and --seeds >= 1, and 0 <= --malicious < 1")
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    summaries = [_simulate(args, seed, say) for seed in range(args.seed, args.seed + args.seeds)]
    if args.json:
        out = summaries[0] if len(summaries) == 1 else {"seeds": summaries, **_means(summaries)}
        print(json.dumps(out, indent=2))
        return 0
    for summary in summaries:
        _print(args, summary)
    if len(summaries) > 1:
        print(f"\nover {len(summaries)} seeds: " + ", ".join(
            f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in _means(summaries).items()
        ))  # fmt: skip
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    """The adoption rule's false-verification rate and power (node/simulation/calibration.py)."""
    from node import evidence
    from node.simulation.calibration import characteristic

    verifiers = max(3, args.quorum)
    rows = [characteristic(gain, random.Random(args.seed + i), trials=args.trials,
                           quorum=args.quorum, verifiers=verifiers)
            for i, gain in enumerate((0.0, 0.5, 1.0, 2.0))]  # fmt: skip
    if args.json:
        print(json.dumps({"quorum": args.quorum, "verifiers": verifiers, "alpha": evidence.ALPHA,
                          "gains": [r.as_dict() for r in rows]}, indent=2))  # fmt: skip
        return 0
    print(f"quorum {args.quorum}, {verifiers} verifiers taking turns, one paired seed a look, "
          f"{args.trials} claims per gain (stated false-verification rate {evidence.ALPHA:.0%})")  # fmt: skip
    print("true gain   verified (95% interval)   refuted   unproven   seeds spent")
    for r in rows:
        low, high = r.interval()
        print(f"{r.gain:5.1f} sd   {r.verified:7.1%} ({low:5.1%} to {high:5.1%})   "
              f"{r.refuted:7.1%}   {r.unproven:8.1%}   {r.seeds:11.1f}")  # fmt: skip
    return 0


def _simulate(args: argparse.Namespace, seed: int, say) -> dict:
    settings = Settings(
        nodes=args.nodes, seed=seed, hours=args.hours, malicious=args.malicious,
        quorum=args.quorum, latency=args.latency, loss=args.loss, churn=args.churn,
        away_hours=args.away, partition=args.partition, target=args.target,
        verify_every=args.verify_every, ledger=args.ledger, stop_at_target=not args.keep_going,
    )  # fmt: skip
    sim = Simulation(settings, progress=say)
    summary = sim.run()
    sim.close()
    one = args.baseline_hours
    if one is None and args.nodes > 1:
        alone = Settings(nodes=1, seed=seed, hours=max(args.hours, 200.0), target=args.target)
        one = Simulation(alone).run()["hours_to_target_local"]
    elif one is None:
        one = summary["hours_to_target_local"]
    swarm = summary["hours_to_target_verified"] or (
        summary["hours_to_target_local"] if args.nodes == 1 else None
    )
    summary["one_node_hours_to_target"] = one
    summary["speed_up"] = one / swarm if one and swarm else None
    return summary


MEANS = (
    "hours_to_target_verified", "hours_to_target_local", "one_node_hours_to_target",
    "messages_per_node_per_run", "bytes_per_node_per_run", "seconds_to_agree_after_last_win",
    "final_head_true_bpb", "fakes_adopted",
)  # fmt: skip


def _means(summaries: list[dict]) -> dict:
    """Means over seeds (of the seeds where a figure exists), medians of the hours to the
    target and the speed-up as their ratio, and how many seeds reached the target, agreed, or
    adopted something wrong."""
    out: dict = {}
    for key in MEANS:
        values = [s[key] for s in summaries if s[key] is not None]
        out[f"mean_{key}"] = statistics.fmean(values) if values else None
    # Medians count a seed that never reached the target as slower than any that did.
    for key in ("hours_to_target_verified", "one_node_hours_to_target"):
        values = [math.inf if s[key] is None else s[key] for s in summaries]
        if key == "hours_to_target_verified" and summaries[0]["settings"]["nodes"] == 1:
            values = [math.inf if s["hours_to_target_local"] is None else s["hours_to_target_local"]
                      for s in summaries]  # fmt: skip
        median = statistics.median(values)
        out[f"median_{key}"] = None if math.isinf(median) else median
    one, swarm = out["median_one_node_hours_to_target"], out["median_hours_to_target_verified"]
    out["speed_up_of_medians"] = one / swarm if one and swarm else None
    alone = summaries[0]["settings"]["nodes"] == 1
    out["per_seed_hours_to_target"] = [
        s["hours_to_target_local" if alone else "hours_to_target_verified"] for s in summaries
    ]
    out["per_seed_one_node_hours"] = [s["one_node_hours_to_target"] for s in summaries]
    out["seeds_reaching_target"] = sum(s["speed_up"] is not None for s in summaries)
    out["seeds_all_agree"] = sum(s["all_agree"] for s in summaries)
    out["seeds_with_wrong_adoption"] = sum(s["wrong_adopted"] for s in summaries)
    return out


def _print(args: argparse.Namespace, summary: dict) -> None:
    agree = summary["seconds_to_agree_after_last_win"]
    speed = "n/a" if summary["speed_up"] is None else f"{summary['speed_up']:.1f}x"
    purposes = ", ".join(f"{k} {v}" for k, v in summary["runs_by_purpose"].items())
    print(
        f"\n{args.nodes} nodes ({summary['settings']['path']} views), seed "
        f"{summary['settings']['seed']}, quorum {args.quorum}, {summary['malicious_nodes']} "
        f"malicious, target {args.target}\n"
        f"  time to target, verified head: {_hours(summary['hours_to_target_verified'])}\n"
        f"  time to target, a node's own head: {_hours(summary['hours_to_target_local'])}\n"
        f"  one node alone: {_hours(summary['one_node_hours_to_target'])}; speed-up: {speed}\n"
        f"  final head: {summary['final_head'][:12]}, true val_bpb "
        f"{summary['final_head_true_bpb']:.4f}\n"
        f"  per node per run: {summary['messages_per_node_per_run']:.1f} messages, "
        f"{summary['bytes_per_node_per_run'] / 1024:.1f} KiB "
        f"({100 * summary['sync_share_of_bytes']:.0f}% of bytes by sync)\n"
        f"  all online nodes agree: {summary['all_agree']}; after the last win in "
        f"{'n/a' if agree is None else f'{agree:.0f} s'}\n"
        f"  fake claims: {summary['fake_claims']}, fakes adopted: {summary['fakes_adopted']}, "
        f"adoptions with a fake in the lineage: {summary['adoptions_with_fake_in_lineage']} "
        f"(anything wrong adopted: {summary['wrong_adopted']})\n"
        f"  runs: {purposes}; {summary['facts']} facts; {summary['wall_seconds']:.1f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
