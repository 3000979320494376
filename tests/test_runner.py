"""The runner: a real run scores a finite val_bpb; crashes, hangs and NaNs end as `crash` in bounded time."""

from __future__ import annotations

import dataclasses
import math
import os
import select
import subprocess
import sys
import time

import pytest

from node.trainer import (
    BASELINE_TRAIN_PY,
    TrainerError,
    get_profile,
    harness_sha256,
    process,
    run_experiment,
)
from node.trainer.handoff import MODEL_FILE

FAST = dataclasses.replace(
    get_profile("test"), startup_seconds=20, max_train_seconds=5, eval_seconds=20
)

PRELUDE = "from node.trainer.harness import session\nS = session()\n"


def run_source(tmp_path, source: str, profile=FAST, data=None, seed: int = 0):
    script = tmp_path / "train.py"
    script.write_text(source)
    return run_experiment(script, profile, data, tmp_path / "run", seed=seed)


@pytest.mark.slow
def test_the_baseline_trains_and_the_harness_scores_a_finite_val_bpb(tmp_path, small_data):
    events = []
    result = run_experiment(
        BASELINE_TRAIN_PY,
        get_profile("test"),
        small_data,
        tmp_path / "run",
        seed=1,
        on_event=events.append,
    )
    assert result.outcome == "ok", result.log_tail
    assert math.isfinite(result.val_bpb) and 1.0 < result.val_bpb < 8.0
    profile = get_profile("test")
    batch = 16 * profile.seq_len  # the baseline's batch on the test profile
    assert result.steps == profile.warmup_batches + -(-profile.budget_tokens // batch)
    assert result.tokens == result.steps * batch  # the warm-up's and the budget's
    assert result.budget_tokens == profile.budget_tokens
    assert 0 < result.work_seconds and result.speed > 1e9  # counted FLOPs per second of work
    assert result.flops_per_token <= profile.max_flops_per_token
    assert result.device_name.startswith("cpu ")
    assert result.total_seconds > result.train_seconds
    assert result.peak_memory_mb and result.peak_memory_mb > 50
    assert result.eval_tokens == get_profile("test").eval_tokens
    assert result.harness_sha256 == harness_sha256(get_profile("test"))
    assert harness_sha256(FAST) == result.harness_sha256  # limits change no score
    shorter = dataclasses.replace(get_profile("test"), budget_tokens=2**15)
    assert harness_sha256(shorter) != result.harness_sha256  # a budget does
    assert result.profile == "test" and result.seed == 1 and len(result.train_py_sha256) == 64
    assert [e["event"] for e in events if e["event"] != "progress"] == [
        "started",
        "train_start",
        "train_end",
        "eval_start",
        "exported",
        "result",
        "done",
    ]
    assert (tmp_path / "run" / "result.json").exists() and (tmp_path / "run" / "log.txt").exists()
    assert not (tmp_path / "run" / MODEL_FILE).exists()  # scored: the export is deleted


@pytest.mark.slow
def test_an_untrained_model_scores_worse_than_a_trained_one(tmp_path, small_data):
    loop = "for micro, (x, y) in enumerate(S.batches(DEVICE_BATCH)):"
    untrained = BASELINE_TRAIN_PY.read_text().replace(loop, loop + "\n    continue")
    result = run_source(tmp_path, untrained, data=small_data)
    # the profile's own limits for the real training: FAST's 5 s cap is for runs that stop short,
    # and a busy machine (the suite's other worker) can take longer than that to train the baseline
    trained = run_experiment(BASELINE_TRAIN_PY, get_profile("test"), small_data, tmp_path / "tr")
    assert result.outcome == trained.outcome == "ok", (result.error, trained.error)
    assert result.val_bpb > trained.val_bpb + 0.5


def test_a_crashing_train_py_ends_as_crash_with_its_log_tail(tmp_path, small_data):
    result = run_source(
        tmp_path,
        PRELUDE + "print('about to fail')\nraise ValueError('boom in train.py')\n",
        data=small_data,
    )
    assert result.outcome == "crash" and result.val_bpb is None
    assert "exited with code 1" in result.error
    assert "ValueError: boom in train.py" in result.log_tail and "about to fail" in result.log_tail


@pytest.mark.slow
def test_a_train_py_that_hangs_before_training_is_killed_at_the_startup_limit(tmp_path, small_data):
    profile = dataclasses.replace(
        FAST, startup_seconds=8
    )  # importing torch takes 3 to 5 s on a busy machine
    began = time.monotonic()
    result = run_source(
        tmp_path,
        PRELUDE + "print('waiting', flush=True)\nwhile True:\n    pass\n",
        profile=profile,
        data=small_data,
    )
    assert time.monotonic() - began < 25
    assert result.outcome == "crash" and "startup ran past its limit" in result.error
    assert "waiting" in result.log_tail


@pytest.mark.slow
def test_a_train_py_that_trains_on_forever_is_killed_at_the_safety_cap(tmp_path, small_data):
    source = PRELUDE + (
        "import torch\nfor i, (x, y) in enumerate(S.batches(4)):\n"
        "    if i == 5:\n        while True:\n            torch.randn(64, 64) @ torch.randn(64, 64)\n"
    )
    began = time.monotonic()
    result = run_source(tmp_path, source, data=small_data)
    elapsed = time.monotonic() - began
    assert result.outcome == "crash" and "train ran past its limit" in result.error
    assert FAST.max_train_seconds <= elapsed < 30


def test_a_model_that_diverges_to_nan_ends_as_crash(tmp_path, small_data):
    source = PRELUDE + (
        "import torch\nclass NaNModel(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.w = torch.nn.Parameter(torch.zeros(1))\n"
        "    def forward(self, idx):\n"
        "        return torch.full((*idx.shape, S.vocab_size), float('nan')) * self.w\n"
        "for x, y in S.batches(4):\n    pass\nS.finish(NaNModel())\n"
    )
    result = run_source(tmp_path, source, data=small_data)
    assert result.outcome == "crash" and "nan" in result.error.lower() and result.val_bpb is None


def test_a_model_that_cannot_be_exported_ends_as_crash_with_the_reason(tmp_path, small_data):
    source = PRELUDE + (
        "import torch\nclass Branchy(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.table = torch.nn.Embedding(S.vocab_size, S.vocab_size)\n"
        "    def forward(self, idx):\n"
        "        if idx.max().item() > 0:  # a branch on the data: no single graph holds it\n"
        "            return self.table(idx)\n"
        "        return self.table(idx) * 2\n"
        "for x, y in S.batches(4):\n    pass\nS.finish(Branchy())\n"
    )
    result = run_source(tmp_path, source, data=small_data)
    assert result.outcome == "crash" and result.val_bpb is None
    assert result.error.startswith("the model cannot be exported for scoring: "), result.error


def test_a_train_py_that_never_hands_over_its_model_gets_no_score(tmp_path, small_data):
    result = run_source(
        tmp_path,
        PRELUDE + "for x, y in S.batches(4):\n    pass\nprint('val_bpb: 0.001')\n",
        data=small_data,
    )
    assert result.outcome == "crash" and result.val_bpb is None
    assert "finish" in result.error + result.log_tail


def test_a_missing_train_py_is_a_clear_error(tmp_path, small_data):
    with pytest.raises(TrainerError, match="cannot read"):
        run_experiment(tmp_path / "absent.py", FAST, small_data, tmp_path / "run")


@pytest.mark.slow
def test_runs_that_take_turns_start_up_while_another_trains_and_never_train_together(
    tmp_path, small_data, monkeypatch
):
    """Two runs of one device sharing GpuTurns, from two threads: the second starts up while the
    first trains, waits, ready, until the first stops training (not for its score: that runs
    beside the second's training), and scores what it scores alone."""
    import threading

    from node.trainer import runner

    monkeypatch.setattr(runner, "SETTLE_SECONDS", 0.0)
    turns, stamps, results, holder = runner.GpuTurns(), {}, {}, {}
    profile = get_profile("test")

    def one(name: str, delay: float) -> None:
        time.sleep(delay)

        def stamp(event: dict) -> None:
            stamps.setdefault((name, event["event"]), time.monotonic())
            holder.setdefault((name, event["event"]), turns.training)  # who has the GPU

        results[name] = run_experiment(
            BASELINE_TRAIN_PY, profile, small_data, tmp_path / name, seed=1, on_event=stamp,
            turns=turns,
        )  # fmt: skip

    threads = [threading.Thread(target=one, args=(n, d)) for n, d in (("a", 0.0), ("b", 0.5))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    a, b = results["a"], results["b"]
    assert a.outcome == b.outcome == "ok", (a.error, b.error)
    assert a.val_bpb == b.val_bpb  # the same seed: waiting changes nothing of the run
    assert stamps["b", "started"] < stamps["a", "eval_start"]  # b started up while a trained
    assert stamps["a", "eval_start"] < stamps["b", "train_start"]
    assert stamps["b", "ready"] < stamps["b", "train_start"]
    assert holder["a", "train_start"] is not None  # a had the GPU while it trained ...
    assert holder["a", "eval_start"] is not holder["a", "train_start"]  # ... not for its score
    assert b.held_seconds > 0 and b.startup_seconds < b.total_seconds - b.held_seconds
    assert turns.starting is None and turns.training is None


def test_a_run_that_fails_while_it_starts_up_beside_another_runs_again_alone(tmp_path, small_data):
    """A held run whose start-up fails (here: always) runs again once the GPU is free; its result
    is that of a run alone, and the turns are left free."""
    from node.trainer import runner

    turns, events = runner.GpuTurns(), []
    script = tmp_path / "train.py"
    script.write_text(PRELUDE + "raise SystemExit(3)\n")
    result = run_experiment(
        script, FAST, small_data, tmp_path / "run", on_event=events.append, turns=turns
    )
    assert result.outcome == "crash" and "code 3" in result.error
    assert [e["event"] for e in events].count("started") == 2  # held, then alone
    assert result.held_seconds is None
    assert turns.starting is None and turns.training is None


def test_what_a_process_wrote_just_before_it_ended_is_read(monkeypatch):
    """The process writes its last event and exits while the runner's wait on the pipe runs out:
    the event is still read (a scorer's result was once lost that way: "the scorer reported none")."""
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", f'import os; os.write({write_fd}, b\'{{"event": "result"}}\\n\')'],
        pass_fds=(write_fd,),
    )
    os.close(write_fd)
    proc.wait()
    waits, real_select = [], select.select

    def select_that_ran_out_first(fds, w, x, timeout):
        waits.append(timeout)
        return ([], [], []) if len(waits) == 1 else real_select(fds, w, x, timeout)

    monkeypatch.setattr(process.select, "select", select_that_ran_out_first)
    limits = {"score": 10.0}
    try:
        seen = process.watch(
            proc,
            read_fd,
            limits,
            "score",
            time.monotonic(),
            frozenset({"result"}),
            lambda e: None,
            None,
        )
    finally:
        os.close(read_fd)
    assert "result" in seen and seen["returncode"] == 0
