"""`swarm data build`, `swarm run` and `swarm report`: data, one experiment, the report."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from node.cli import app
from node.cli.shared import (
    DataOption,
    HomeOption,
    JsonOption,
    ProfileOption,
    console,
    err_console,
    prepare,
    status_line,
)
from node.errors import SwarmError

data_app = typer.Typer(
    help="The corpus, tokenizer and token shards a profile trains on (built once, then cached).",
    no_args_is_help=True,
)
app.add_typer(data_app, name="data")


@data_app.command("build")
def data_build(
    profile: ProfileOption = "cpu",
    data: DataOption = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Build (or find in the cache) the data a profile trains on.

    Example: swarm data build --profile cpu
    """
    _, prof, tokens = prepare(profile, data, home)
    if as_json:
        print(json.dumps({"profile": prof.name, "root": str(tokens.root), **tokens.manifest}))
        return
    table = Table(title=f"data for profile {prof.name}", show_header=False)
    table.add_row("folder", str(tokens.root))
    for key, value in tokens.manifest.items():
        table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    console.print(table)


@app.command("run")
def run(
    profile: ProfileOption = "cpu",
    train_py: Annotated[
        Path | None, typer.Option("--train-py", help="The train.py to run (default: the baseline).")
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed for the model's initialisation and the data order.")
    ] = 0,
    data: DataOption = None,
    budget: Annotated[
        int | None,
        typer.Option(
            "--budget",
            help="Training tokens instead of the profile's budget (a result at another budget compares with no other).",
        ),
    ] = None,
    sandbox: Annotated[
        bool | None,
        typer.Option(
            "--sandbox/--no-sandbox",
            help="Run train.py in bubblewrap (default: whenever it is installed).",
        ),
    ] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run one experiment: train on the profile's budget of tokens, then score val_bpb.

    Example: swarm run --profile cpu --train-py my_train.py --seed 1
    """
    if budget is not None and budget < 1:
        raise SwarmError(
            f"--budget {budget}: expected a positive number of training tokens, e.g. --budget 32768"
        )
    from node.campaign import budget_warning
    from node.home import compiled_dir
    from node.trainer import BASELINE_TRAIN_PY, run_experiment
    from node.trainer.compile_cache import CompileCache

    script = (train_py or BASELINE_TRAIN_PY).expanduser()
    if not script.is_file():
        raise SwarmError(f"{script} is not a file; pass the train.py to run with --train-py PATH")
    from node.trainer.sandbox import sandbox_available

    if sandbox is None and not sandbox_available():
        err_console.print(
            "[yellow]warning:[/] no sandbox (bubblewrap) on this machine: train.py runs "
            "unconfined; run only code you trust",
            highlight=False,
        )
    from node.trainer import get_profile
    from node.trainer.device import require_device

    require_device(get_profile(profile))  # before fetching gigabytes of data for a GPU run
    home_dir, prof, tokens = prepare(profile, data, home)
    if budget is not None:
        prof = dataclasses.replace(prof, budget_tokens=budget)
    if warning := budget_warning(
        prof.name, prof.budget_tokens, tokens.manifest, "--budget {budget}"
    ):
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    run_dir = home_dir / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{prof.name}-{os.getpid()}"
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task(f"{prof.name}: starting", total=1.0, info="")

        plain, last = not err_console.is_terminal, [0.0]  # piped or logged: a line every 10 s

        def show(event: dict) -> None:
            name = event["event"]
            if plain and name == "eval_start":
                status_line(f"{prof.name}: scoring")
            if name == "progress":
                info = f"step {event['steps']}  {event['tokens'] / 1e6:.2f} M tokens"
                bar.update(
                    task,
                    description=f"{prof.name}: training",
                    completed=event["progress"],
                    info=info,
                )
                if plain and time.monotonic() - last[0] >= 10:
                    last[0] = time.monotonic()
                    status_line(f"{prof.name}: training {event['progress']:.0%}, {info}")
            elif name == "train_start":
                bar.update(task, description=f"{prof.name}: training", completed=0)
            elif name == "eval_start":
                bar.update(task, description=f"{prof.name}: evaluating", completed=1.0, info="")

        # The node's compiled kernels are lent; only the node's own trusted runs add to them.
        result = run_experiment(
            script,
            prof,
            tokens,
            run_dir,
            seed=seed,
            on_event=show,
            sandbox=sandbox,
            compile_cache=CompileCache(compiled_dir(home_dir)),
        )
    if as_json:
        print(json.dumps(result.as_dict()))
    else:
        _print_result(result)
    if result.outcome != "ok":  # a crash or a void run fails a script's `swarm run` too
        raise typer.Exit(2)


def _print_result(result) -> None:
    table = Table(
        title=f"experiment on profile {result.profile}: {result.outcome}", show_header=False
    )
    rows = [
        ("val_bpb", f"{result.val_bpb:.4f}" if result.val_bpb is not None else "-"),
        ("steps", f"{result.steps:,}"),
        (
            "tokens",
            f"{result.tokens:,}"
            + (f" (budget {result.budget_tokens:,})" if result.budget_tokens else ""),
        ),
        ("tokens/s", f"{result.tokens_per_second:,.0f}" if result.tokens_per_second else "-"),
        ("train seconds", f"{result.train_seconds:.1f}"),
        ("total seconds", f"{result.total_seconds:.1f}"),
        ("peak memory", f"{result.peak_memory_mb:,.0f} MiB" if result.peak_memory_mb else "-"),
        ("MFU", f"{result.mfu:.1%}" if result.mfu else "-"),
        ("params", f"{result.params:,}" if result.params else "-"),
        ("seed", str(result.seed)),
        ("device", result.device_name or "-"),
        ("train.py", result.train_py_sha256[:16]),
        ("harness", result.harness_sha256[:16]),
        ("sandbox", "bubblewrap" if result.sandboxed else "none"),
        ("run folder", result.run_dir),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if result.error:  # void: the harness refused to score the run, it broke the rules
        label = "void" if result.outcome == "void" else "crash"
        err_console.print(f"[bold red]{label}:[/] {result.error}", highlight=False)
        err_console.print(result.log_tail, highlight=False, markup=False)


# ---------------------------------------------------------------- report


@app.command("report")
def report_cmd(
    out: Annotated[
        Path,
        typer.Option("--out", help="Folder for report.png and report.html (created if missing)."),
    ],
    home: HomeOption = None,
    db: Annotated[
        Path | None, typer.Option("--db", help="A ledger file to read instead of HOME/ledger.db.")
    ] = None,
    quorum: Annotated[
        int | None,
        typer.Option(
            "--quorum",
            min=1,
            help="Confirmations that verify a win (default: the campaign's, else 1).",
        ),
    ] = None,
) -> None:
    """Write a plot and a self-contained web page of what the swarm tried, from the ledger (read-only).

    report.png: val_bpb per experiment over time, with the baseline and the head as lines.
    report.html: the plot, the leaderboard, the lineage of the best version with its diffs, the
    peers and the noise margin; it fetches nothing.

    Example: swarm report --out report && xdg-open report/report.html
    """
    from node.report import open_ledger, write_report

    with open_ledger(home, db) as ledger:
        png, page = write_report(ledger, out, quorum)
    console.print(f"wrote {page} and {png}", highlight=False)


# ---------------------------------------------------------------- gossip: bootstrap, peer, peers
