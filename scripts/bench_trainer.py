"""Benchmark a profile: val_bpb over seeds and budgets, throughput, MFU and overhead, per recipe.

Runs recipes through the real runner and prints one table. A recipe is a variant of the baseline
train.py (`--variants`, a few replacements in its text) or any train.py of your own
(`--train-py`, as often as you like), so that another recipe can stand beside ours on the same
budgets (`--budget`, in tokens, several allowed) and seeds. Runs go seed by seed, budget by
budget, every recipe in turn, so that a slow spell of the machine hits all recipes alike and a
session cut short leaves every recipe with the same seeds done. On CUDA
it first measures the device's bf16 matrix rate (the measured MFU's denominator; the table also
gives MFU against the 989 TFLOP/s datasheet rate of an H100/H200). A machine with no network can
take its data as a tarball of a built cache (`--data`, see docs/trainer.md), unpacked into
$SWARM_DATA, or as a built token folder (`--tokens`).

    python scripts/bench_trainer.py --profile cpu --variants baseline lr10x --seeds 0 1 2
    python scripts/bench_trainer.py --profile gpu --data gpu-data.tar.xz --seeds 0 1 2
    python scripts/bench_trainer.py --profile gpu --data gpu-data.tar.xz --train-py mine.py \\
        --budget 33554432 100663296 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch

from node.trainer import BASELINE_TRAIN_PY, TokenData, get_profile, prepare_data, run_experiment

DATASHEET_FLOPS = 989e12  # dense bf16 of an H100/H200 SXM, the rate MFU is usually quoted against

SHAPE = '"gpu": (4, 1024, 128, 64, 1)'  # the gpu recipe's (depth, width, head dim, sequences, micro-batches)
WHOLE = "    model.compile(dynamic=False, fullgraph=True)"  # how the gpu recipe compiles
# Each variant is a list of (old, new) replacements applied to the baseline train.py.
VARIANTS = {
    "baseline": [],
    "b18": [(SHAPE, '"gpu": (4, 1024, 128, 128, 1)')],  # 2^18 tokens a step
    # shapes (docs/trainer.md, "The model's shape"), (depth, width, head dim, sequences a step, 1):
    # bench each at the budget that gives it the baseline's FLOPs, not at the baseline's tokens
    "w512d8": [(SHAPE, '"gpu": (8, 512, 128, 128, 1)')],  # the recipe's shape before 2026-12-03
    "w512d8b17": [(SHAPE, '"gpu": (8, 512, 128, 64, 1)')],
    "w768d4": [(SHAPE, '"gpu": (4, 768, 128, 128, 1)')],
    "w768d6": [(SHAPE, '"gpu": (6, 768, 128, 128, 1)')],
    "w896d5": [(SHAPE, '"gpu": (5, 896, 128, 128, 1)')],
    "w1024d3": [(SHAPE, '"gpu": (3, 1024, 128, 128, 1)')],
    # how train.py compiles (docs/trainer.md, "Changes tried for MFU"): by region (each block and
    # the head apart, so that a new shape compiles one block), with CUDA graphs, or with
    # Inductor's autotuned Triton matrix templates
    "regions": [
        (
            WHOLE,
            "    for module in (*model.blocks, model.head):\n        module.compile(dynamic=False)",
        )
    ],
    "cudagraphs": [(WHOLE, WHOLE.replace(")", ', mode="reduce-overhead")'))],
    "autotune": [(WHOLE, WHOLE.replace(")", ', mode="max-autotune-no-cudagraphs")'))],
    # float8 in the blocks' products only, not in the logits' (as the 8 x 512 recipe had it)
    "fp8body": [("self.head(x, targets, FP8 and targets is not None)", "self.head(x, targets)")],
    "bf16": [
        ("FP8 = GPU and ", "FP8 = False and GPU and ")
    ],  # no float8 products (the recipe of 2026-12-02)
    "lr10x": [
        ("MATRIX_LR = 0.04 if GPU else 0.02 ", "MATRIX_LR = 0.4 if GPU else 0.2 ")
    ],  # a deliberately bad change
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


def write_variant(
    name: str, folder: Path, variants: dict = VARIANTS, prefix: str = "train_"
) -> Path:
    """The baseline train.py with the variant's replacements made, as FOLDER/PREFIXNAME.py."""
    text = BASELINE_TRAIN_PY.read_text()
    for old, new in variants[name]:
        if old not in text:
            raise SystemExit(f"variant {name}: {old!r} not found in train.py")
        text = text.replace(old, new)
    path = folder / f"{prefix}{name}.py"
    path.write_text(text)
    return path


def recipes(variants: list[str], files: list[Path], folder: Path) -> dict[str, Path]:
    """Name -> train.py: the baseline's variants, then each file named by its stem."""
    chosen = {name: write_variant(name, folder) for name in variants}
    for path in files:
        if not path.is_file():
            raise SystemExit(f"--train-py {path}: no such file")
        name = path.stem
        if name in chosen:
            raise SystemExit(
                f"--train-py {path}: a recipe named {name!r} is already on the list; rename the file"
            )
        chosen[name] = path
    return chosen


def print_table(rows: list[dict]) -> None:
    """One line per run, then the mean val_bpb of each recipe at each budget."""
    print()
    print(
        f"{'recipe':18} {'budget':>11} {'seed':>4} {'val_bpb':>8} {'tok/s':>10} {'MFU989':>6} {'MFU':>6} "
        f"{'peakGiB':>7} {'start':>6} {'train':>6} {'eval':>5} {'total':>6}"
    )
    for r in rows:
        head = f"{r['recipe']:18} {r['budget_tokens']:>11,} {r['seed']:>4}"
        if r["outcome"] != "ok":
            print(f"{head} {r['outcome']}: {r['error']}")
            continue
        mfu989, mfu = (
            (f"{'-':>6}",) * 2
            if r["mfu"] is None
            else (  # None: a CPU
                f"{r['flops_per_token'] * r['tokens_per_second'] / DATASHEET_FLOPS:6.1%}",
                f"{r['mfu']:6.1%}",
            )
        )
        print(
            f"{head} {r['val_bpb']:8.4f} {r['tokens_per_second']:10,.0f} {mfu989} {mfu} "
            f"{r['peak_memory_mb'] / 1024:7.1f} {r['startup_seconds']:6.1f} {r['train_seconds']:6.1f} "
            f"{r['eval_seconds']:5.1f} {r['total_seconds']:6.1f}"
        )
    print()
    print(
        f"{'recipe':18} {'budget':>11} {'runs':>4} {'mean':>8} {'stdev':>7} {'tok/s':>10} {'MFU989':>6}"
    )
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["recipe"], r["budget_tokens"]), []).append(r)
    for (recipe, budget), runs in groups.items():
        ok = [r for r in runs if r["outcome"] == "ok"]
        if not ok:
            print(f"{recipe:18} {budget:>11,} {0:>4} no run scored")
            continue
        scores = [r["val_bpb"] for r in ok]
        spread = f"{statistics.stdev(scores):7.4f}" if len(scores) > 1 else f"{'-':>7}"
        rate = statistics.mean(r["tokens_per_second"] for r in ok)
        mfu989 = (
            f"{'-':>6}"
            if ok[0]["mfu"] is None
            else f"{statistics.mean(r['flops_per_token'] * r['tokens_per_second'] for r in ok) / DATASHEET_FLOPS:6.1%}"
        )
        print(
            f"{recipe:18} {budget:>11,} {len(ok):>4} {statistics.mean(scores):8.4f} {spread} {rate:10,.0f} {mfu989}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="gpu", choices=["gpu", "cpu", "test"])
    parser.add_argument("--data", type=Path, help="tarball of a built data cache to unpack first")
    parser.add_argument(
        "--tokens", type=Path, help="a built token folder instead of the profile's data"
    )
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["baseline"],
        choices=sorted(VARIANTS),
        help="variants of the baseline train.py (none: only the --train-py files)",
    )
    parser.add_argument(
        "--train-py",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a train.py of your own to bench beside the variants (repeatable)",
    )
    parser.add_argument(
        "--budget",
        type=int,
        nargs="+",
        metavar="TOKENS",
        help="training budgets in tokens, instead of the profile's own",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    args = parser.parse_args()
    cache = Path(os.environ.setdefault("SWARM_DATA", "/tmp/swarm-data"))
    cache.mkdir(parents=True, exist_ok=True)
    if args.data and not (cache / "tokens").exists():  # any compression tar knows
        subprocess.run(["tar", "-xf", str(args.data.resolve()), "-C", str(cache)], check=True)
    args.out.mkdir(parents=True, exist_ok=True)
    scripts = recipes(args.variants, args.train_py, args.out)
    if not scripts:
        raise SystemExit("nothing to run: name --variants or --train-py")

    base = get_profile(args.profile, "embedded:default" if args.profile == "gpu" else None)
    rate = 0.0
    if base.device == "cuda":
        rate = matmul_rate()
        os.environ["SWARM_PEAK_FLOPS"] = str(rate)
        print(
            f"device {torch.cuda.get_device_name()}: bf16 matmul 8192^3 {rate / 1e12:.0f} TFLOP/s (MFU denominator)",
            flush=True,
        )
    if args.tokens:
        folder = args.tokens.resolve()  # the runs start in folders of their own
        data = TokenData(folder, json.loads((folder / "manifest.json").read_text()))
    else:
        data = prepare_data(base, cache, print)
    rows = []
    for seed in args.seeds:
        for budget in args.budget or [base.budget_tokens]:
            profile = dataclasses.replace(base, budget_tokens=budget)
            for name, script in scripts.items():
                began = time.time()
                result = run_experiment(
                    script,
                    profile,
                    data,
                    Path(f"/tmp/bench-runs/{name}-{budget}-{seed}-{int(began)}"),
                    seed=seed,
                    on_event=lambda e: (
                        e["event"] in ("started", "train_start", "eval_start", "result")
                        and print(f"  {e}", flush=True)
                    ),
                )
                row = {"recipe": name, "matmul_tflops": rate / 1e12, **result.as_dict()}
                rows.append(row)
                with (args.out / f"bench_{profile.name}.jsonl").open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(
                    f"{name} budget {budget:,} seed {seed}: {result.outcome} val_bpb={result.val_bpb} "
                    f"tokens/s={result.tokens_per_second} sandboxed={result.sandboxed} {result.error or ''}",
                    flush=True,
                )
                if result.error:
                    print(result.log_tail)
    print_table(rows)


if __name__ == "__main__":
    main()
