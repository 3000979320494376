"""What a compute budget measures: speed, replays of one seed, seed noise unpaired and paired.

Runs the baseline on each seed (and again on the first seeds, to replay them), and a child of
it (MATRIX_LR x1.5 by default: 0.02 -> 0.03 on the CPU profiles, 0.04 -> 0.06 on the gpu
profile) on the same seeds, then prints per profile the training time, tokens per second and
experiments an hour, the replay spread (the same seed twice), the spread of the baseline over
seeds (unpaired noise) and of child minus baseline on each seed (paired noise), with their
ratio. `--load N` keeps N busy processes running meanwhile (on a CPU the scores must not move);
`--deterministic` trains with torch's deterministic algorithms (GPU).

    python scripts/bench_budget.py --profile test --seeds 1 2 3 4 --replays 2
    python scripts/bench_budget.py --profile cpu --seeds 1 2 --replays 1 --load 1
    python scripts/bench_budget.py --profile gpu --tokens DIR --no-sandbox --budget 67108864 \\
        --seeds 0 1 2 --replays 2 [--deterministic]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from node.trainer import BASELINE_TRAIN_PY, TokenData, get_profile, prepare_data, run_experiment
from node.trainer.compile_cache import CompileCache

CHILD = ("MATRIX_LR = 0.04 if GPU else 0.02 ", "MATRIX_LR = 0.06 if GPU else 0.03 ")
SPIN = "while True:\n    pass\n"


def spread(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) >= 2 else None


def shown(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="test")
    parser.add_argument("--budget", type=int, help="training tokens (default: the profile's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--replays", type=int, default=1, help="seeds run twice, from the first")
    parser.add_argument("--load", type=int, default=0, help="busy processes meanwhile")
    parser.add_argument("--threads", type=int, help="override the profile's CPU threads")
    parser.add_argument("--deterministic", action="store_true", help="deterministic algorithms")
    parser.add_argument(
        "--data-cache", default=os.environ.get("SWARM_TEST_DATA", "/tmp/swarmcache")
    )
    parser.add_argument("--tokens", help="a built token folder instead of --data-cache")
    parser.add_argument("--no-sandbox", action="store_true", help="a machine without bubblewrap")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args()

    profile = get_profile(args.profile)
    changes = {"deterministic": args.deterministic}
    if args.budget:
        changes["budget_tokens"] = args.budget
    if args.threads is not None:
        changes["threads"] = args.threads
    profile = dataclasses.replace(profile, **changes)
    if args.tokens:
        folder = Path(args.tokens)
        data = TokenData(folder, json.loads((folder / "manifest.json").read_text()))
    else:
        data = prepare_data(profile, Path(args.data_cache))
    baseline = BASELINE_TRAIN_PY.read_text()
    child = baseline.replace(*CHILD)
    work = Path(tempfile.mkdtemp(prefix="bench-budget-"))
    (work / "baseline.py").write_text(baseline)
    (work / "child.py").write_text(child)
    cache = CompileCache(work / "compiled") if profile.device == "cuda" else None
    plan = [("baseline", s) for s in args.seeds] + [
        ("baseline", s) for s in args.seeds[: args.replays]
    ]
    plan += [("child", s) for s in args.seeds]
    print(
        f"profile {profile.name}: budget {profile.budget_tokens} tokens, threads {profile.threads}, "
        f"deterministic {profile.deterministic}, load {args.load}; {len(plan)} runs"
    )
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.load)]
    runs = []
    try:
        for index, (name, seed) in enumerate(plan):
            result = run_experiment(
                work / f"{name}.py", profile, data, work / f"run-{index}", seed=seed,
                sandbox=False if args.no_sandbox else None, compile_cache=cache,
                keep_compiled=cache is not None,
            )  # fmt: skip
            if result.outcome != "ok":
                raise SystemExit(
                    f"{name} seed {seed}: {result.outcome}: {result.error}\n{result.log_tail}"
                )
            runs.append({"name": name, **result.as_dict()})
            print(
                f"{name:8} seed {seed:3} | val_bpb {result.val_bpb:.6f} | train {result.train_seconds:7.2f} s "
                f"| {result.tokens_per_second / 1e3:9.1f} k tokens/s | start-up {result.startup_seconds or 0:5.1f} s "
                f"| eval {result.eval_seconds or 0:5.1f} s (check {result.check_seconds or 0:4.1f} s) "
                f"| total {result.total_seconds:7.1f} s | {result.device_name}",
                flush=True,
            )
    finally:
        for spinner in spinners:
            spinner.kill()
    first: dict[int, float] = {}
    for r in runs:
        if r["name"] == "baseline":
            first.setdefault(r["seed"], r["val_bpb"])
    again = [r for r in runs if r["name"] == "baseline"][len(args.seeds) :]
    replay = [abs(r["val_bpb"] - first[r["seed"]]) for r in again]
    base = [first[s] for s in args.seeds]
    diffs = [r["val_bpb"] - first[r["seed"]] for r in runs if r["name"] == "child"]
    unpaired, paired = spread(base), spread(diffs)
    totals = [r["total_seconds"] for r in runs]
    print(f"training: median {statistics.median(r['train_seconds'] for r in runs):.2f} s, "
          f"{statistics.median(r['tokens_per_second'] for r in runs) / 1e3:.1f} k tokens/s; "
          f"a run {statistics.median(totals):.1f} s in all: {3600 / statistics.median(totals):.1f} runs an hour")  # fmt: skip
    print(
        f"replays of one seed: largest difference {shown(max(replay) if replay else None, 8)} over {len(replay)}"
    )
    print(f"baseline over {len(base)} seeds: stdev {shown(unpaired)} (unpaired noise)")
    print(f"child - baseline per seed: {', '.join(f'{d:+.4f}' for d in diffs)}; mean {statistics.fmean(diffs):+.4f}, "
          f"stdev {shown(paired)} (paired noise)")  # fmt: skip
    if unpaired and paired:
        print(f"pairing cuts the noise {unpaired / paired:.1f} times")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
