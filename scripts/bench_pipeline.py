"""Benchmark a node's sequence of runs on one GPU: one after another, or taking turns.

A node runs experiment after experiment. Run one after another ("serial"), each run's start-up
(launch, compilation, warm-up batches) and evaluation leave the GPU idle. Taking turns
("turns", `runner.GpuTurns`), two workers share the GPU: the next run starts up while the one
before it trains, and trains once that one is scored. This script runs one sequence of
`train.py` versions (the baseline and changes of it, in order) both ways, each way with an empty
store of compiled kernels, as a node would (the store kept between its runs), and prints the
share of the wall clock spent training and the GPU's idle gap between two trainings.

    python scripts/bench_pipeline.py --profile gpu --data gpu-data.tar.xz --budget 50331648 \\
        --sequence baseline embed-lr dim768 dim768-embed-lr --modes turns serial
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

from bench_trainer import write_variant  # this script's folder is on the path

from node.trainer import get_profile, prepare_data, run_experiment
from node.trainer.compile_cache import CompileCache
from node.trainer.runner import GpuTurns

EMBED_LR = ("EMBED_LR = 0.6 if GPU else 0.3 ", "EMBED_LR = 0.9 if GPU else 0.3 ")
DIM768 = ('"gpu": (4, 1024, 128, 64, 1)', '"gpu": (4, 768, 128, 64, 1)')
# Changes of the baseline, by name: same shapes (a learning rate) or new ones (the width).
CHANGES = {
    "baseline": [],
    "embed-lr": [EMBED_LR],
    "dim768": [DIM768],
    "dim768-embed-lr": [DIM768, EMBED_LR],
}


def sequence(
    mode: str, scripts: list[Path], profile, data, root: Path, log: Path | None = None
) -> list[dict]:
    """Run `scripts` in order, serially or taking turns with two workers; one row per run.
    Every event goes to `log` as it comes (a call cut short keeps what it saw)."""
    shutil.rmtree(root, ignore_errors=True)
    cache = CompileCache(root / "compiled")
    turns = GpuTurns() if mode == "turns" else None
    rows: list[dict | None] = [None] * len(scripts)
    claim, next_index, log_lock = threading.Lock(), [0], threading.Lock()
    began = time.monotonic()

    def one(i: int) -> None:
        stamps: dict[str, float] = {}

        def stamp(event: dict) -> None:
            stamps.setdefault(event["event"], time.monotonic() - began)
            if log is not None:
                with log_lock, log.open("a") as f:
                    f.write(
                        json.dumps(
                            {"mode": mode, "index": i, "at": time.monotonic() - began, **event}
                        )
                        + "\n"
                    )
            if event["event"] in ("ready", "train_start", "eval_start", "done"):
                print(
                    f"  {mode} run {i} {scripts[i].stem}: {event['event']} "
                    f"at {time.monotonic() - began:.1f} s",
                    flush=True,
                )

        stamps["asked"] = time.monotonic() - began
        result = run_experiment(
            scripts[i], profile, data, root / f"run{i}", seed=0, on_event=stamp,
            compile_cache=cache, keep_compiled=True, turns=turns,
        )  # fmt: skip
        rows[i] = {
            "mode": mode,
            "index": i,
            "recipe": scripts[i].stem,
            "stamps": stamps,
            **result.as_dict(),
        }

    def worker() -> None:
        while True:
            with claim:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(scripts):
                return
            one(i)

    workers = [threading.Thread(target=worker) for _ in range(2 if turns else 1)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return [row for row in rows if row is not None]


def summary(mode: str, rows: list[dict]) -> dict:
    wall = max(r["stamps"].get("done", 0.0) for r in rows)
    train = sum(r["train_seconds"] for r in rows)
    gaps = [
        b["stamps"]["train_start"] - a["stamps"]["eval_start"]
        for a, b in zip(rows, rows[1:], strict=False)
        if "train_start" in b["stamps"] and "eval_start" in a["stamps"]
    ]
    # A cycle: from one run's training start to the next's. In a node's steady state (start-up
    # hidden) its share training is what the whole node's wall clock approaches.
    cycles = [
        (a["train_seconds"], b["stamps"]["train_start"] - a["stamps"]["train_start"])
        for a, b in zip(rows, rows[1:], strict=False)
        if "train_start" in b["stamps"] and "train_start" in a["stamps"]
    ]
    return {
        "mode": mode,
        "runs": len(rows),
        "wall": wall,
        "train": train,
        "share": train / wall if wall else 0.0,
        "gaps": gaps,
        "cycles": cycles,
    }


def print_rows(rows: list[dict]) -> None:
    print(
        f"{'mode':7} {'run':3} {'recipe':16} {'outcome':7} {'val_bpb':>8} {'tok/s':>10} "
        f"{'start':>6} {'held':>6} {'train':>6} {'eval':>5} {'train at':>8} {'done at':>8}"
    )
    for r in rows:
        s = r["stamps"]
        held = f"{r['held_seconds']:6.1f}" if r["held_seconds"] is not None else f"{'-':>6}"
        bpb = f"{r['val_bpb']:8.4f}" if r["val_bpb"] is not None else f"{'-':>8}"
        tps = f"{r['tokens_per_second']:10,.0f}" if r["tokens_per_second"] else f"{'-':>10}"
        print(
            f"{r['mode']:7} {r['index']:3} {r['recipe']:16} {r['outcome']:7} {bpb} {tps} "
            f"{r['startup_seconds'] or 0:6.1f} {held} {r['train_seconds']:6.1f} "
            f"{r['eval_seconds'] or 0:5.1f} {s.get('train_start', 0):8.1f} "
            f"{s.get('done', 0):8.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="gpu", choices=["gpu", "cpu", "test"])
    parser.add_argument("--data", type=Path, help="tarball of a built data cache to unpack first")
    parser.add_argument("--budget", type=int, help="training budget in tokens of every run")
    parser.add_argument("--sequence", nargs="+", default=list(CHANGES), choices=sorted(CHANGES))
    parser.add_argument(
        "--modes", nargs="+", default=["turns", "serial"], choices=["turns", "serial"]
    )
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    args = parser.parse_args()
    cache = Path(os.environ.setdefault("SWARM_DATA", "/tmp/swarm-data"))
    cache.mkdir(parents=True, exist_ok=True)
    if args.data and not (cache / "tokens").exists():
        subprocess.run(["tar", "-xf", str(args.data.resolve()), "-C", str(cache)], check=True)
    args.out.mkdir(parents=True, exist_ok=True)
    base = get_profile(args.profile, "embedded:default" if args.profile == "gpu" else None)
    profile = dataclasses.replace(base, budget_tokens=args.budget or base.budget_tokens)
    data = prepare_data(profile, cache, print)
    folder = Path("/tmp/bench-pipeline")
    folder.mkdir(parents=True, exist_ok=True)
    scripts = [write_variant(name, folder, CHANGES, prefix="") for name in args.sequence]
    summaries = []
    for mode in args.modes:
        rows = sequence(
            mode, scripts, profile, data, folder / mode, args.out / "bench_pipeline_events.jsonl"
        )
        with (args.out / "bench_pipeline.jsonl").open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print_rows(rows)
        summaries.append(summary(mode, rows))
    print()
    print(f"budget {profile.budget_tokens:,} tokens a run")
    for s in summaries:
        gaps = ", ".join(f"{g:.1f}" for g in s["gaps"])
        mean = statistics.fmean(s["gaps"]) if s["gaps"] else 0.0
        print(
            f"{s['mode']:7} {s['runs']} runs: wall {s['wall']:.1f} s, training {s['train']:.1f} s, "
            f"share {s['share']:.1%}; GPU idle between trainings: {gaps} s (mean {mean:.1f})"
        )
        for train, cycle in s["cycles"]:
            print(f"{'':7} a cycle: {train:.1f} s training of {cycle:.1f} s, {train / cycle:.1%}")


if __name__ == "__main__":
    main()
