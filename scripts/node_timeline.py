"""A node's timeline from its home: each run's phases, the head's val_bpb over time, and the overhead.

Reads the ledger's runs and each run folder's config.json and result.json (the runner's own
clock), so it also works on a copy of a home brought back from another machine. Standard library
only. Where the ledger has no start or end (baseline runs), the run folder's file times stand in.

    python scripts/node_timeline.py --home ~/.research-swarm
    python scripts/node_timeline.py --home copied-home --t0 1796025298 --json
    python scripts/node_timeline.py --home copied-home --t0 START RESTART   # a node stopped and resumed

With restarts, times are node time: from each (re)start to the node's stop (its last write), with
the time it was down left out; the first run after a restart counts from the restart.

Per run: `before` is the time from the previous run's record (or the node's start, --t0) to this
run's start: choosing the change, checking it, writing it. `startup` is the runner's start-up
(process, imports, compilation, warm-up batches), then `train`, `eval`, `exit` (the rest of the
runner's total) and `after` (scoring against the head, signing and recording the result).
`overhead` is the cycle minus the training seconds; the summary gives it as a share of the
profile's budget.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
from pathlib import Path

BASELINE_KINDS = ("noise", "score")


def _connect(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise SystemExit(f"no ledger at {path}: pass the node's home with --home")
    try:
        conn = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)
        conn.execute("SELECT COUNT(*) FROM runs")
    except sqlite3.OperationalError:  # a copy on a read-only disk: read it as immutable
        conn = sqlite3.connect(f"file:{path.resolve()}?immutable=1", uri=True)
    conn.row_factory = sqlite3.Row
    return conn


def _run_dir(home: Path, log_path: str | None) -> Path | None:
    """The run folder, also when the home was copied from another machine (another prefix)."""
    if not log_path:
        return None
    folder = Path(log_path).parent
    if folder.is_dir():
        return folder
    parts = folder.parts
    if "runs" in parts:
        local = home.joinpath(*parts[len(parts) - parts[::-1].index("runs") - 1 :])
        if local.is_dir():
            return local
    return None


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _kind(description: str) -> str:
    if description in BASELINE_KINDS:
        return "baseline"
    return "verify" if description.startswith("verify") else "research"


def timeline(home: Path, t0: float | list[float] | None = None) -> dict:
    """Every run of the node in `home`, in order, with its phases; and the summary. `t0`: the
    node's start, or its start and each restart."""
    home = Path(home)
    with _connect(home / "ledger.db") as conn:
        rows = [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY id")]
    runs, seen_dirs = [], set()
    for row in rows:
        folder = _run_dir(home, row.get("log_path"))
        result = _json(folder / "result.json") if folder else {}
        config = _json(folder / "config.json") if folder else {}
        if folder:
            seen_dirs.add(folder.resolve())
        start = (
            row["started"] / 1000
            if row.get("started")
            else (_mtime(folder / "config.json") if folder else None)
        )
        runner_end = _mtime(folder / "result.json") if folder else None
        end = row["finished"] / 1000 if row.get("finished") else runner_end
        runs.append({
            "id": row["id"], "kind": _kind(row.get("description") or ""),
            "description": row.get("description") or "", "outcome": row["outcome"], "val_bpb": row["val_bpb"],
            "start": start, "end": end, "runner_end": runner_end,
            # a wall-clock budget (runs of older harnesses), else what the run trained for
            "budget": (config.get("profile") or {}).get("budget_seconds") or result.get("train_seconds"),
            **{k: result.get(k) for k in ("startup_seconds", "train_seconds", "eval_seconds", "total_seconds",
                                          "tokens_per_second", "mfu", "steps", "tokens", "sandboxed", "error")},
        })  # fmt: skip
    # Run folders with no ledger row: runs stopped from outside (a stop ends the run with no result).
    cancelled = []
    for folder in sorted((home / "runs").glob("*/*")):
        if (
            folder.is_dir()
            and folder.resolve() not in seen_dirs
            and (folder / "config.json").exists()
        ):
            cancelled.append(
                {
                    "folder": folder.name,
                    "start": _mtime(folder / "config.json"),
                    "last_write": max(
                        filter(None, (_mtime(p) for p in folder.rglob("*"))), default=None
                    ),
                }
            )
    runs.sort(key=lambda r: (r["end"] is None, r["end"] or 0))
    starts = sorted([t0] if isinstance(t0, (int, float)) else t0 or [])
    starts = starts or [min((r["start"] for r in runs if r["start"]), default=0.0)]
    node_time = _node_clock(starts, [r["end"] for r in runs] + [c["last_write"] for c in cancelled])
    previous, head, baseline_scores, researched = starts[0], None, [], False
    for r in runs:
        restart = max(
            (s for s in starts if r["start"] is not None and s <= r["start"]), default=starts[0]
        )
        previous = max(previous, restart)  # the node was down in between: not a cycle of its own
        total, train = r["total_seconds"], r["train_seconds"]
        r["cycle"] = r["end"] - previous if r["end"] is not None else None
        r["before"] = r["start"] - previous if r["start"] is not None else None
        r["after"] = (
            r["end"] - r["start"] - total if None not in (r["end"], r["start"], total) else None
        )
        r["exit"] = (
            total - r["startup_seconds"] - train - r["eval_seconds"]
            if None not in (total, r["startup_seconds"], train, r["eval_seconds"])
            else None
        )
        r["overhead"] = r["cycle"] - train if None not in (r["cycle"], train) else None
        if r["kind"] == "baseline" and r["val_bpb"] is not None:
            if r["description"] == "noise" and not researched:  # the head is their mean
                baseline_scores.append(r["val_bpb"])
                head = statistics.fmean(baseline_scores)
            elif r["description"] != "noise":  # a head adopted from the swarm, scored here
                head = r["val_bpb"]
        elif r["outcome"] == "keep" and r["val_bpb"] is not None:
            head = r["val_bpb"]
        researched = researched or r["kind"] == "research"
        r["head_val_bpb"] = head
        r["at"] = node_time(r["end"])
        previous = r["end"] if r["end"] is not None else previous
    for c in cancelled:
        c["at"] = node_time(c["start"])
    return {
        "home": str(home),
        "t0": starts[0],
        "restarts_at": [node_time(t) for t in starts[1:]],
        "runs": runs,
        "cancelled": cancelled,
        "summary": summarise(runs),
    }


def _node_clock(starts: list[float], events: list[float | None]):
    """Unix time -> seconds the node had been running: each stretch from a (re)start to the
    last event before the next restart, the stretches laid end to end."""
    offsets, offset = [], 0.0
    for i, start in enumerate(starts):
        offsets.append(offset)
        nxt = starts[i + 1] if i + 1 < len(starts) else None
        inside = [e for e in events if e is not None and start <= e and (nxt is None or e < nxt)]
        offset += max(inside, default=start) - start

    def clock(t: float | None) -> float | None:
        if t is None:
            return None
        i = max((i for i, s in enumerate(starts) if s <= t), default=0)
        return offsets[i] + t - starts[i]

    return clock


def summarise(runs: list[dict]) -> dict:
    research = [r for r in runs if r["kind"] == "research"]
    outcomes: dict[str, int] = {}
    for r in research:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    timed = [r for r in runs if r["overhead"] is not None and r["train_seconds"]]

    def mean(key: str, rs: list[dict]) -> float | None:
        return statistics.fmean([r[key] for r in rs if r[key] is not None]) if rs else None

    budgets = [r["budget"] for r in runs if r["budget"]]
    budget = statistics.fmean(budgets) if budgets else None
    summary = {
        "runs": len(runs),
        "baseline_runs": sum(r["kind"] == "baseline" for r in runs),
        "verify_runs": sum(r["kind"] == "verify" for r in runs),
        "research": outcomes,
        "budget_seconds": budget,
        "timed_runs": len(timed),
    }
    for key in (
        "cycle",
        "before",
        "startup_seconds",
        "train_seconds",
        "eval_seconds",
        "exit",
        "after",
        "overhead",
    ):
        summary[f"mean_{key}"] = mean(key, timed)
    if timed and budget:
        summary["overhead_share_of_budget"] = summary["mean_overhead"] / budget
        summary["training_share_of_wall"] = sum(r["train_seconds"] for r in timed) / sum(
            r["cycle"] for r in timed
        )
        summary["experiments_per_hour"] = 3600 / summary["mean_cycle"]
    heads = [(r["at"], r["head_val_bpb"]) for r in runs if r["head_val_bpb"] is not None]
    summary["head"] = [h for i, h in enumerate(heads) if i == 0 or h[1] != heads[i - 1][1]]
    return summary


def _f(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--home", type=Path, required=True, help="the node's home (or a copy of it)"
    )
    parser.add_argument(
        "--t0",
        type=float,
        nargs="+",
        help="the node's start, then each restart (Unix seconds); default: the first run's start",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    data = timeline(args.home, args.t0)
    if args.json:
        print(json.dumps(data, indent=1))
        return
    print(
        f"{'id':>3} {'at s':>6} {'kind':8} {'outcome':8} {'val_bpb':>7} {'head':>7} {'cycle':>6} {'before':>6} "
        f"{'start':>6} {'train':>6} {'eval':>5} {'exit':>5} {'after':>5} {'ovh':>5}  description"
    )
    for r in data["runs"]:
        print(
            f"{r['id']:>3} {_f(r['at'], '.0f'):>6} {r['kind']:8} {r['outcome']:8} {_f(r['val_bpb'], '.4f'):>7} "
            f"{_f(r['head_val_bpb'], '.4f'):>7} {_f(r['cycle']):>6} {_f(r['before']):>6} {_f(r['startup_seconds']):>6} "
            f"{_f(r['train_seconds']):>6} {_f(r['eval_seconds']):>5} {_f(r['exit']):>5} {_f(r['after']):>5} "
            f"{_f(r['overhead']):>5}  {r['description'][:60]}"
        )
    for c in data["cancelled"]:
        print(f"  -  {_f(c['at'], '.0f'):>6} stopped with no result: {c['folder']}")
    for at in data["restarts_at"]:
        print(f"  -  {at:>6.0f} the node restarted (node time: the time it was down is left out)")
    s = data["summary"]
    print(
        f"\nruns {s['runs']} (baseline {s['baseline_runs']}, verify {s['verify_runs']}); research outcomes "
        f"{s['research'] or '{}'}"
    )
    if s.get("experiments_per_hour"):
        print(
            f"per run (mean of {s['timed_runs']}): cycle {s['mean_cycle']:.1f} s = before {s['mean_before']:.1f} "
            f"+ start-up {s['mean_startup_seconds']:.1f} + train {s['mean_train_seconds']:.1f} + eval "
            f"{s['mean_eval_seconds']:.1f} + exit {s['mean_exit']:.1f} + after {s['mean_after']:.1f}"
        )
        print(
            f"overhead {s['mean_overhead']:.1f} s = {s['overhead_share_of_budget']:.1%} of the "
            f"{s['budget_seconds']:.0f} s budget; training {s['training_share_of_wall']:.1%} of the wall time; "
            f"{s['experiments_per_hour']:.1f} experiments an hour"
        )
    print("head val_bpb over time: " + ", ".join(f"{at:.0f} s {v:.4f}" for at, v in s["head"]))


if __name__ == "__main__":
    sys.exit(main())
