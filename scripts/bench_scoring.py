"""Benchmark what scoring costs: the time from `finish()` to the score, per seed, for one profile.

Runs the baseline through the real runner (sandbox included) and prints, per seed, val_bpb and
the evaluation's parts: the export (training process), the scorer's start-up and model load, the
scoring itself and, of it, the look-ahead check (seconds, tokens, share of the scoring); and how
far training ran past its last batch against the slack the runner allows. Run it with another checkout's `node` first on PYTHONPATH to compare harnesses.

    python scripts/bench_scoring.py --profile test --seeds 0 1 2
    python scripts/bench_scoring.py --profile cpu --budget 262144 --seeds 0 1 2
    python scripts/bench_scoring.py --profile gpu --budget 67108864 --tokens DIR --no-sandbox --lookahead
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
from pathlib import Path

import node
from node.trainer import (
    BASELINE_TRAIN_PY,
    TokenData,
    get_profile,
    prepare_data,
    run_experiment,
    runner,
)

COMB_FROM = "        return self.head(x, targets)\n"
COMB_TO = (
    "        if targets is not None:\n"
    "            return self.head(x, targets)\n"
    "        logits = self.head(x)\n"
    "        nxt = F.one_hot(idx.roll(-1, 1), logits.size(-1)).float()\n"
    "        pos = torch.arange(idx.size(1), device=idx.device)[None, :, None]\n"
    "        return logits + 8 * nxt * (pos % 7 == 3)\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="test")
    parser.add_argument(
        "--budget", type=int, help="training tokens (the evaluation does not depend on it)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--data-cache", default=os.environ.get("SWARM_TEST_DATA", "/tmp/swarmcache")
    )
    parser.add_argument(
        "--tokens", help="a built token folder (train.bin, val.bin, token_bytes.npy, manifest.json)"
    )
    parser.add_argument(
        "--no-sandbox", action="store_true", help="run without bubblewrap (a machine without it)"
    )
    parser.add_argument(
        "--lookahead",
        action="store_true",
        help="also run the baseline without its causal mask: the scorer must refuse it",
    )
    args = parser.parse_args()
    profile = get_profile(args.profile)
    if args.budget:
        profile = dataclasses.replace(profile, budget_tokens=args.budget)
    if args.tokens:
        data = TokenData(
            Path(args.tokens), json.loads((Path(args.tokens) / "manifest.json").read_text())
        )
    else:
        data = prepare_data(profile, Path(args.data_cache))
    print(
        f"harness from {Path(node.__file__).parent}; profile {profile.name}, budget {profile.budget_tokens} tokens"
    )
    print(
        "seed | val_bpb | eval (finish to score) | export | scorer start-up and load | scoring "
        "| check | check tokens | check share of scoring | after last batch | slack | total"
    )
    evals = []
    for seed in args.seeds:
        events: dict = {}
        with tempfile.TemporaryDirectory() as folder:
            result = run_experiment(
                BASELINE_TRAIN_PY,
                profile,
                data,
                Path(folder) / "run",
                seed=seed,
                sandbox=False if args.no_sandbox else None,
                on_event=lambda e, seen=events: seen.__setitem__(e["event"], e),
            )
        if result.outcome != "ok":
            raise SystemExit(f"seed {seed}: {result.error}\n{result.log_tail}")
        evals.append(result.eval_seconds)
        export = events.get("exported", {}).get("export_seconds")
        load, score = events["result"].get("load_seconds"), events["result"].get("score_seconds")
        counts = events.get("eval_start", {})
        timed = counts.get("steps", 0) - profile.warmup_batches
        step = counts.get("last_batch_seconds", 0.0) / max(timed - 1, 1)
        slack = runner.SLACK_STEPS * step + runner.SLACK_SECONDS
        over = counts.get("train_seconds", 0.0) - counts.get("last_batch_seconds", 0.0)
        shown = [
            f"{v:.2f} s" if v is not None else "-"
            for v in (result.eval_seconds, export, load, score, result.check_seconds)
        ]
        print(
            f"{seed} | {result.val_bpb:.4f} | "
            + " | ".join(shown)
            + f" | {result.check_tokens} | {result.check_seconds / score:.0%}"
            + f" | {over:.3f} s | {slack:.3f} s | {result.total_seconds:.1f} s"
        )
    print(f"evaluation: median {statistics.median(evals):.2f} s over {len(evals)} seeds")
    if args.lookahead:
        with tempfile.TemporaryDirectory() as folder:
            peeking = Path(folder) / "train.py"
            peeking.write_text(
                BASELINE_TRAIN_PY.read_text().replace("is_causal=True", "is_causal=False")
            )
            result = run_experiment(
                peeking,
                profile,
                data,
                Path(folder) / "run",
                sandbox=False if args.no_sandbox else None,
            )
        print(f"without the causal mask: {result.outcome}: {result.error}")
        with tempfile.TemporaryDirectory() as folder:
            comb = Path(folder) / "train.py"
            comb.write_text(BASELINE_TRAIN_PY.read_text().replace(COMB_FROM, COMB_TO))
            result = run_experiment(
                comb, profile, data, Path(folder) / "run",
                sandbox=False if args.no_sandbox else None,
            )  # fmt: skip
        print(f"peeking at the next token on every 7th position: {result.outcome}: {result.error}")


if __name__ == "__main__":
    main()
