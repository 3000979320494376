"""Benchmark a run's start-up with and without the node's store of compiled kernels, side by side.

Runs through the real runner (sandbox included where the machine has one), one after another:
the baseline into an empty store (cold: a trusted run, which fills it); the baseline again; a
hyperparameter change (same shapes); the model one head narrower (new shapes, not kept). For
each: start-up, its launch part (sandbox, interpreter, torch, device) and the rest (train.py up
to its first timed batch: mostly torch.compile), the training rate, what the store holds, and the
run's overhead (its time outside training) as a share of the profile's real budget.

    python scripts/bench_startup.py --profile gpu --budget 67108864 --data-cache DIR [--data embedded:default]
    python scripts/bench_startup.py --profile test --budget 65536 --compile
    python scripts/bench_startup.py --profile gpu --budget 67108864 --train-py OTHER.py   # another train.py
    python scripts/bench_startup.py --profile gpu --budget 67108864 --no-sandbox          # the sandbox's cost
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from node.trainer import BASELINE_TRAIN_PY, get_profile, prepare_data, run_experiment
from node.trainer.compile_cache import CompileCache
from node.trainer.sandbox import sandbox_available, sandbox_uid


def variants(source: str, profile: str) -> dict[str, str]:
    """The versions the bench runs: the baseline, a learning rate changed, one head fewer."""
    lr = source.replace("EMBED_LR = 0.6 if GPU else 0.3 ", "EMBED_LR = 1.2 if GPU else 0.6 ")
    row = re.search(rf'"{profile}": \((\d+), (\d+), (\d+),', source)
    if row is None or lr == source:
        raise SystemExit(f"the baseline has no {profile} row or no EMBED_LR: update the bench")
    depth, width, head = row.groups()  # one head fewer: the width stays a multiple of the head
    narrower = source.replace(
        row.group(0), f'"{profile}": ({depth}, {int(width) - int(head)}, {head},'
    )
    return {"baseline": source, "lr": lr, "width": narrower}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="gpu")
    parser.add_argument("--data", help="replace the profile's data, e.g. embedded:default")
    parser.add_argument("--budget", type=int, default=2**26, help="training tokens per run")
    parser.add_argument("--data-cache", default=os.environ.get("SWARM_DATA", "/tmp/swarmcache"))
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile on the CPU too (a check of the plumbing)",
    )
    parser.add_argument("--train-py", type=Path, help="bench this train.py instead of the baseline")
    parser.add_argument(
        "--no-sandbox", action="store_true", help="run without the sandbox (to measure its cost)"
    )
    args = parser.parse_args()
    real_budget = get_profile(args.profile, args.data).budget_tokens  # what a node's runs get
    profile = dataclasses.replace(
        get_profile(args.profile, args.data), budget_tokens=args.budget, startup_seconds=600
    )
    data = prepare_data(profile, Path(args.data_cache))
    source = (args.train_py or BASELINE_TRAIN_PY).read_text()
    if args.compile:
        source = source.replace('COMPILE = S.device.type == "cuda"', "COMPILE = True")
    versions = variants(source, profile.name)
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    sandboxed = sandbox_available() and not args.no_sandbox
    uid = sandbox_uid() if sandboxed else None
    print(
        f"{args.train_py or 'the baseline train.py'}: profile {profile.name}, budget {profile.budget_tokens} tokens, sandbox "
        f"{'yes' if sandboxed else 'no'}, store "
        f"{'lent as hard links (a uid of its own)' if uid is not None else 'lent as copies' if sandboxed else 'used in place'}"
        f"; work in {work}"
    )
    # (what is measured, version, the store lent (a fresh one for each new name), kept)
    plan = [
        ("cold (empty store)", "baseline", "whole", True),
        ("warm", "baseline", "whole", True),
        ("warm, EMBED_LR changed", "lr", "whole", True),
        ("warm, one head fewer", "width", "whole", False),
    ]
    stores = {}
    print(
        f"{'run':<24} {'start-up':>9} {'launch':>7} {'compile':>8} {'train':>6} {'eval':>6} "
        f"{'total':>7} {'val_bpb':>8} {'M tok/s':>8} {'peak GiB':>9} {'store MB':>9} {'files':>6}"
    )
    rows, overheads, speeds = {}, {}, []
    for index, (label, name, store_name, keep) in enumerate(plan):
        if store_name not in stores:
            stores[store_name] = CompileCache(work / f"store-{store_name}")
        store = stores[store_name]
        script = work / f"{index}-{name}.py"
        script.write_text(versions[name])
        began = time.monotonic()
        result = run_experiment(
            script,
            profile,
            data,
            work / f"run-{index}",
            sandbox=sandboxed,
            compile_cache=store,
            keep_compiled=keep,
        )
        wall = time.monotonic() - began
        if result.outcome != "ok":
            print(f"{label}: {result.outcome}: {result.error}\n{result.log_tail}")
            continue
        files = sum(len(names) for _, _, names in os.walk(store.root))
        startup, launch = result.startup_seconds or 0.0, result.launch_seconds or 0.0
        rows[label] = startup
        overheads[label] = wall - result.train_seconds
        speeds.append(result.tokens_per_second or 0.0)
        print(
            f"{label:<24} {startup:>8.1f}s {launch:>6.1f}s {startup - launch:>7.1f}s "
            f"{result.train_seconds:>5.0f}s {result.eval_seconds or 0:>5.1f}s {wall:>6.1f}s "
            f"{result.val_bpb:>8.4f} {(result.tokens_per_second or 0) / 1e6:>8.3f} "
            f"{(result.peak_memory_mb or 0) / 1024:>9.1f} "
            f"{store.size() / 2**20:>9.1f} {files:>6}"
        )
    cold = rows.get("cold (empty store)")
    for label in [label for label, *_ in plan[1:]]:
        if cold and label in rows:
            print(
                f"start-up {label}: {rows[label]:.1f} s = {rows[label] / cold:.2f} x the cold {cold:.1f} s"
            )
    # The profile's training time on this machine: its budget at the measured tokens per second.
    real_seconds = real_budget / max(speeds) if speeds and max(speeds) > 0 else None
    for (
        label,
        overhead,
    ) in overheads.items():  # the rest of an experiment (choosing, publishing) is under 1 s
        if real_seconds:
            print(
                f"overhead {label}: {overhead:.1f} s outside training = {overhead / real_seconds:.1%} "
                f"of the profile's {real_seconds:.0f} s of training ({real_budget} tokens) here"
            )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
