"""`swarm run` and `swarm data` as a user runs them: a real process, real exit codes, real output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def swarm(*args: str, cache=None, home=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    if cache is not None:
        env["SWARM_DATA"] = str(cache)
    if home is not None:
        env["SWARM_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_help_lists_the_commands_and_each_command_shows_an_example():
    top = swarm("--help")
    assert top.returncode == 0
    for command in ("run", "data"):
        assert command in top.stdout
    for command in (["run"], ["data", "build"]):
        shown = swarm(*command, "--help")
        assert shown.returncode == 0 and "Example: swarm" in shown.stdout


@pytest.mark.slow
def test_a_user_mistake_is_one_line_and_a_nonzero_exit_code(tmp_path):
    import torch

    no_gpu = (
        [] if torch.cuda.is_available() else [(["run", "--profile", "gpu"], "needs a CUDA GPU", 1)]
    )
    for args, words, code in [
        *no_gpu,
        (["run", "--profile", "laptop"], "unknown profile 'laptop'", 1),
        (["run", "--profile", "test", "--train-py", str(tmp_path / "nope.py")], "is not a file", 1),
        (
            ["run", "--profile", "test", "--budget", "0"],
            "expected a positive number of training tokens",
            1,
        ),
        (["data", "build", "--data", "s3:bucket"], "unknown data", 1),
        (["run", "--seed", "abc"], "Invalid value for '--seed'", 2),
        (["trian"], "No such command 'trian'", 2),
    ]:
        done = swarm(*args, home=tmp_path)
        assert done.returncode == code, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in done.stderr


@pytest.mark.slow
def test_run_json_reports_the_documented_keys_of_a_run_on_the_budget_asked_for(
    tmp_path, small_data, data_cache
):
    done = swarm(
        "run",
        "--profile",
        "test",
        "--seed",
        "2",
        "--budget",
        "32768",
        "--json",
        cache=data_cache,
        home=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for key in (
        "outcome",
        "val_bpb",
        "steps",
        "tokens",
        "train_seconds",
        "peak_memory_mb",
        "profile",
        "train_py_sha256",
    ):
        assert key in result
    assert result["outcome"] == "ok" and result["profile"] == "test" and result["seed"] == 2
    assert (
        result["budget_tokens"] == 32768 and "reads the" not in done.stderr
    )  # 32,768 tokens read the data once
    assert 0 < result["val_bpb"] < 8
    assert (tmp_path / "runs").is_dir() and len(list((tmp_path / "runs").iterdir())) == 1


@pytest.mark.slow
def test_run_shows_a_result_table_and_a_crash_exits_two(tmp_path, small_data, data_cache):
    ok = swarm("run", "--profile", "test", cache=data_cache, home=tmp_path)
    assert (
        ok.returncode == 0
        and "val_bpb" in ok.stdout
        and "experiment on profile test: ok" in ok.stdout
    )
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('this train.py is broken')\n")
    crash = swarm(
        "run", "--profile", "test", "--train-py", str(broken), cache=data_cache, home=tmp_path
    )
    assert crash.returncode == 2
    assert "crash" in crash.stdout and "this train.py is broken" in crash.stderr


def test_run_on_a_budget_that_reads_its_data_more_than_four_times_says_so_in_one_line(
    tmp_path, small_data, data_cache
):
    train = small_data.manifest["train_tokens"]
    broken = tmp_path / "broken.py"  # the line comes before the run; this one ends at once
    broken.write_text("raise SystemExit('this train.py is broken')\n")
    done = swarm(
        "run",
        "--profile",
        "test",
        "--budget",
        str(5 * train),
        "--train-py",
        str(broken),
        cache=data_cache,
        home=tmp_path,
    )
    said = [line for line in done.stderr.splitlines() if "reads the" in line]
    assert len(said) == 1, done.stderr
    assert (
        f"a budget of {5 * train:,} tokens reads the {train:,} training tokens of embedded:small 5.0 times"
        in said[0]
    )
    assert (
        "more data (--data web:fineweb-edu, or urls:FILE)" in said[0]
        and f"--budget {4 * train}" in said[0]
    )


def test_data_build_reports_the_hashes_a_campaign_pins(tmp_path, small_data, data_cache):
    done = swarm("data", "build", "--profile", "test", "--json", cache=data_cache, home=tmp_path)
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    assert manifest["tokenizer_sha256"] == small_data.manifest["tokenizer_sha256"]
    assert manifest["sha256"] == small_data.sha256 and manifest["vocab_size"] == 512
