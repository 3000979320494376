"""Benchmark a profile: val_bpb over seeds, throughput, MFU, memory and overhead, per train.py variant.

Runs train.py variants through the real runner and prints one table. On CUDA it first measures
the device's bf16 matrix rate (the MFU denominator). A machine with no network can take its data
as a tarball of a built cache (`--data`, see docs/trainer.md), unpacked into $SWARM_DATA.

    python scripts/bench_trainer.py --profile cpu --variants baseline lr10x --seeds 0 1 2
    python scripts/bench_trainer.py --profile gpu --data gpu-data.tar.xz --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

import torch

from node.trainer import BASELINE_TRAIN_PY, get_profile, prepare_data, run_experiment

# Each variant is a list of (old, new) replacements applied to the baseline train.py.
VARIANTS = {
    "baseline": [],
    "regional": [("step_model = torch.compile(model, dynamic=False) if COMPILE else model",
                  "for block in model.blocks:\n    block.compile(dynamic=False)\nstep_model = model")],
    "wide": [('"gpu": (8, 512, 128, 128, 2)', '"gpu": (8, 768, 128, 128, 2)')],
    "batch1": [('"gpu": (8, 512, 128, 128, 2)', '"gpu": (8, 512, 128, 256, 1)')],
    "lr10x": [("MATRIX_LR = 0.02 ", "MATRIX_LR = 0.2 ")],  # a deliberately bad change
    "cpu-b32": [('"cpu": (4, 128, 64, 16, 1)', '"cpu": (4, 128, 64, 32, 1)')],
    "cpu-d3": [('"cpu": (4, 128, 64, 16, 1)', '"cpu": (3, 128, 64, 16, 1)')],
    "cpu-w192": [('"cpu": (4, 128, 64, 16, 1)', '"cpu": (4, 192, 64, 16, 1)')],
}


def matmul_rate(n: int = 8192, repeats: int = 10) -> float:
    """Dense bf16 FLOP/s of one n x n x n product on random data: the median of `repeats`."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * n**3 / sorted(times)[len(times) // 2]


def write_variant(name: str, folder: Path) -> Path:
    text = BASELINE_TRAIN_PY.read_text()
    for old, new in VARIANTS[name]:
        if old not in text:
            raise SystemExit(f"variant {name}: {old!r} not found in train.py")
        text = text.replace(old, new)
    path = folder / f"train_{name}.py"
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="gpu", choices=["gpu", "cpu", "test"])
    parser.add_argument("--data", type=Path, help="tarball of a built data cache to unpack first")
    parser.add_argument("--variants", nargs="+", default=["baseline"], choices=sorted(VARIANTS))
    parser.add_argument("--budget", type=int, help="override the profile's training budget (tokens)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    args = parser.parse_args()
    cache = Path(os.environ.setdefault("SWARM_DATA", "/tmp/swarm-data"))
    cache.mkdir(parents=True, exist_ok=True)
    if args.data and not (cache / "tokens").exists():
        subprocess.run(["tar", "-xJf", str(args.data), "-C", str(cache)], check=True)
    args.out.mkdir(parents=True, exist_ok=True)

    profile = get_profile(args.profile, "embedded:default" if args.profile == "gpu" else None)
    if args.budget:
        profile = dataclasses.replace(profile, budget_tokens=args.budget)
    rate = 0.0
    if profile.device == "cuda":
        rate = matmul_rate()
        os.environ["SWARM_PEAK_FLOPS"] = str(rate)
        print(f"device {torch.cuda.get_device_name()}: bf16 matmul 8192^3 {rate / 1e12:.0f} TFLOP/s (MFU denominator)", flush=True)
    data = prepare_data(profile, cache, print)
    rows = []
    for name in args.variants:
        script = write_variant(name, args.out)
        for seed in args.seeds:
            began = time.time()
            result = run_experiment(script, profile, data, Path(f"/tmp/bench-runs/{name}-{seed}-{int(began)}"), seed=seed,
                                    on_event=lambda e: e["event"] in ("started", "train_start", "eval_start", "result") and print(f"  {e}", flush=True))
            row = {"variant": name, "matmul_tflops": rate / 1e12, **result.as_dict()}
            rows.append(row)
            with (args.out / f"bench_{profile.name}.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{name} seed {seed}: {result.outcome} val_bpb={result.val_bpb} sandboxed={result.sandboxed} "
                  f"{result.error or ''}", flush=True)
            if result.error:
                print(result.log_tail)
    print()
    print(f"{'variant':10} {'seed':>4} {'val_bpb':>8} {'tok/s':>10} {'MFU':>6} {'MFU989':>6} {'peakGiB':>7} "
          f"{'start':>6} {'train':>6} {'eval':>5} {'exit':>5} {'total':>6} {'train%':>6}")
    for r in rows:
        if r["outcome"] != "ok":
            print(f"{r['variant']:10} {r['seed']:>4} crash: {r['error']}")
            continue
        mfu989 = r["flops_per_token"] * r["tokens_per_second"] / 989e12
        exit_seconds = r["total_seconds"] - r["startup_seconds"] - r["train_seconds"] - r["eval_seconds"]
        print(f"{r['variant']:10} {r['seed']:>4} {r['val_bpb']:8.4f} {r['tokens_per_second']:10,.0f} {r['mfu'] or 0:6.1%} "
              f"{mfu989:6.1%} {r['peak_memory_mb'] / 1024:7.1f} {r['startup_seconds']:6.1f} {r['train_seconds']:6.1f} "
              f"{r['eval_seconds']:5.1f} {exit_seconds:5.1f} {r['total_seconds']:6.1f} {r['train_seconds'] / r['total_seconds']:6.1%}")


if __name__ == "__main__":
    main()
