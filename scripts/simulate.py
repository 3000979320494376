"""Simulate a swarm on a virtual clock (node/simulation, docs/simulation.md) and print its figures:
the swarm against the same swarm trusting every claim and against a node alone under each lone
rule, over several seeds, with bootstrap intervals.

.venv/bin/python scripts/simulate.py --nodes 16 --seeds 32 --workers 2 --json
.venv/bin/python scripts/simulate.py --nodes 16 --seeds 32 --liars 1
.venv/bin/python scripts/simulate.py --nodes 16 --seeds 32 --colluders 0.3 --membership
.venv/bin/python scripts/simulate.py --nodes 16 --seeds 32 --framers 1
.venv/bin/python scripts/simulate.py --nodes 16 --seeds 32 --jammers 1 --landscape catalogue
.venv/bin/python scripts/simulate.py --nodes 16 --seeds 32 --fast-hardware 0.5
.venv/bin/python scripts/simulate.py --calibrate --quorum 2   # the rule's error rates and power
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.simulation import Settings  # noqa: E402
from node.simulation import landscape as land  # noqa: E402
from node.simulation.study import study  # noqa: E402


def _window(text: str) -> tuple[float, float]:
    start, _, end = text.partition(":")
    try:
        window = float(start), float(end)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END in hours, got {text!r}") from None
    if not 0 <= window[0] < window[1]:
        raise argparse.ArgumentTypeError(f"expected 0 <= START < END, got {text!r}")
    return window


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[16],
                   help="nodes in the swarm; several counts: each against the same lone nodes")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument("--seeds", type=int, default=8, help="run seeds SEED .. SEED+SEEDS-1")
    p.add_argument("--hours", type=float, default=200.0, help="virtual hours of research at most")
    p.add_argument("--quorum", type=int, default=1)
    p.add_argument("--liars", type=int, default=0, help="nodes signing lower scores than measured")
    p.add_argument("--colluders", type=float, default=0.0, help="share of colluding nodes")
    p.add_argument("--framers", type=int, default=0,
                   help="nodes signing a false replay of every honest claim")  # fmt: skip
    p.add_argument("--jammers", type=int, default=0,
                   help="nodes signing a discard of every change on each head, none run "
                        "(the catalogue)")  # fmt: skip
    p.add_argument("--membership", action="store_true",
                   help="the campaign lists its members: committees are drawn from them")  # fmt: skip
    p.add_argument("--fast-hardware", type=float, default=0.0,
                   help="share of nodes on a faster device class that reads lower")  # fmt: skip
    p.add_argument("--latency", type=float, default=0.1, help="mean seconds per gossip hop")
    p.add_argument("--loss", type=float, default=0.0, help="chance a fact misses a node")
    p.add_argument("--churn", type=float, default=0.0, help="leaves per node per hour")
    p.add_argument("--away", type=float, default=1.0, help="mean hours a leaver stays away")
    p.add_argument("--partition", type=_window, default=None, help="START:END hours, halves cut")
    p.add_argument("--target-gain", type=float, default=None,
                   help="true gain below the baseline to reach (bpb); default: the landscape's "
                        f"({land.TARGET_GAIN} on ideas, half the most it holds on the catalogue)")  # fmt: skip
    p.add_argument("--landscape", choices=("ideas", "catalogue"), default="ideas",
                   help="ideas on or off with a random proposer, or the real catalogue of "
                        "changes with the real offline proposer")  # fmt: skip
    p.add_argument("--proposer", choices=("learning", "fixed"), default="learning",
                   help="on the catalogue: the offline proposer as it is, or its catalogue in "
                        "its seeded order alone, blind to the evidence")  # fmt: skip
    p.add_argument("--verify-every", type=int, default=4)
    p.add_argument("--no-baselines", action="store_true",
                   help="the swarm alone: no trusting swarm, no lone nodes")  # fmt: skip
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes")
    p.add_argument("--json", action="store_true", help="print the figures as JSON only")
    p.add_argument("--calibrate", action="store_true",
                   help="print how often claims of 0, 0.5, 1 and 2 sigmas of true gain end verified")  # fmt: skip
    p.add_argument("--trials", type=int, default=2000, help="claims per gain, with --calibrate")
    args = p.parse_args()
    if args.calibrate:
        return _calibrate(args)
    if min(args.nodes) < 1 or args.quorum < 1 or args.seeds < 1 or not 0 <= args.colluders < 1:
        p.error("need --nodes, --quorum and --seeds >= 1, and 0 <= --colluders < 1")
    if any(args.liars + args.framers + args.jammers + round(args.colluders * n) >= n
           for n in args.nodes):  # fmt: skip
        p.error("leave at least one honest node: fewer --liars, --framers, --jammers or "
                "--colluders")  # fmt: skip
    if args.jammers and args.landscape != "catalogue":
        p.error("--jammers sign the offline proposer's changes: add --landscape catalogue")
    settings = Settings(
        nodes=args.nodes[0], hours=args.hours, quorum=args.quorum, liars=args.liars,
        colluders=args.colluders, framers=args.framers, jammers=args.jammers,
        membership=args.membership, fast_hardware=args.fast_hardware,
        latency=args.latency, loss=args.loss, churn=args.churn, away_hours=args.away,
        partition=args.partition, target_gain=args.target_gain, verify_every=args.verify_every,
        landscape=args.landscape, proposer=args.proposer,
    )  # fmt: skip
    seeds = range(args.seed, args.seed + args.seeds)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    out = study(settings, seeds, args.workers, baselines=not args.no_baselines, progress=say,
                nodes=args.nodes)  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print("\n".join(_text(one) for one in out.get("by_nodes", {0: out}).values()))
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


def _text(out: dict) -> str:
    """The figures for a person: hours, speed-ups with their intervals, what went wrong."""

    def hours(value: float | None) -> str:
        return "not reached" if value is None else f"{value:.1f} h"

    def ratio(r: dict | None) -> str:
        if not r or r["value"] is None:
            return "n/a"
        low = "?" if r["low"] is None else f"{r['low']:.2f}"
        high = "?" if r["high"] is None else f"{r['high']:.2f}"
        return f"{r['value']:.2f} (95% {low} to {high})"

    s = out["settings"]
    lines = [
        f"{s['nodes']} nodes, quorum {s['quorum']}, {out['seeds']} seeds, {s['landscape']} "
        f"landscape, target gain {out['target_gain_median'] or s['target_gain']:.4f} bpb (median); "
        f"liars {s['liars']}, framers {s['framers']}, jammers {s.get('jammers', 0)}, "
        f"colluders {s['colluders']:.0%}"
        f"{' (members listed)' if s['membership'] else ''}, fast hardware {s['fast_hardware']:.0%}",
        f"  median hours to the target: {hours(out['median_hours'])} "
        f"({out['seeds_reaching_target']} of {out['seeds']} seeds reached it)",
    ]
    if "trusting_median_hours" in out:
        lines += [
            f"  trusting every claim: {hours(out['trusting_median_hours'])}; verification costs "
            f"{ratio(out['verification_cost'])} of that time",
            f"  a node alone, keep-if-lower: {hours(out['lone_keep_if_lower_median_hours'])}; "
            f"speed-up {ratio(out['speedup_vs_keep_if_lower'])}",
            f"  a node alone, the swarm's rule: {hours(out['lone_swarm_rule_median_hours'])}; "
            f"speed-up {ratio(out['speedup_vs_lone_swarm_rule'])}",
        ]
    lines += [
        f"  final lineages: {out['lineage_steps']} verified steps, "
        f"{out['fakes_in_final_lineage']} by adversaries"
        f"{' (seeds ' + ', '.join(map(str, out['fake_seeds'])) + ')' if out['fake_seeds'] else ''}"
        f", {out['false_steps_in_final_lineage']} "
        f"of no true gain, {out['adversary_changes_in_final_lineage']} change(s) in them an "
        f"adversary measured first; mean final gain {out['final_head_gain']:.4f} bpb; "
        f"{out['targets_revoked']} head(s) at the target revoked, research went on",
        f"  honest nodes' time on a liar's head: {out['liar_head_share']['mean']:.1%} "
        f"(max {out['liar_head_share']['max']:.1%}); on a head with an adversary's claim in "
        f"its lineage: {out['fake_head_share']['mean']:.1%}",
    ]
    if "fast_share_of_lineage" in out:
        lines.append(
            f"  fast hardware authored {ratio(out['fast_share_of_lineage'])} of the lineage "
            f"steps ({ratio(out['fast_share_of_changes'])} of the changes in them, a merge "
            f"counted for the author of the change it carries, a combination's parts for who "
            f"measured each first), and ran "
            f"{out['fast_share_of_research_runs']:.1%} of the research runs"
        )
    lines.append(f"  runs: {out['runs_by_purpose']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
