"""A run is a function of its train.py, seed and data: on a CPU the same val_bpb bit for bit,
however busy the machine, because the budget counts tokens, not seconds, and every run sums in
one order (the profile fixes the thread count: at 2 threads the baseline's score moves in its
eighth digit, docs/trainer.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from node.trainer import BASELINE_TRAIN_PY, get_profile, run_experiment

PROFILE = get_profile("test")
SPIN = "while True:\n    pass\n"


def run(tmp_path, data, name: str, source: str | None = None, seed: int = 7):
    folder = tmp_path / name
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(source or BASELINE_TRAIN_PY.read_text())
    result = run_experiment(script, PROFILE, data, folder / "run", seed=seed)
    assert result.outcome == "ok", result.error
    return result


@pytest.mark.slow
def test_one_seed_scores_the_same_on_a_busy_machine(tmp_path, small_data):
    quiet = run(tmp_path, small_data, "quiet")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(3)]
    try:
        busy = run(tmp_path, small_data, "busy")
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert busy.val_bpb == quiet.val_bpb  # bit for bit
    assert (busy.steps, busy.tokens) == (quiet.steps, quiet.tokens)
    assert busy.tokens - PROFILE.warmup_batches * 16 * PROFILE.seq_len >= PROFILE.budget_tokens
    other = run(tmp_path, small_data, "other-seed", seed=8)
    assert other.val_bpb != quiet.val_bpb  # the seed is what moves it


@pytest.mark.slow
def test_the_profile_fixes_the_threads_whatever_the_machine_offers(
    tmp_path, small_data, monkeypatch
):
    """The node's own environment asks for four threads; train.py and the scorer use the
    profile's one, so the score is the one a one-core laptop gets."""
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.setenv("MKL_NUM_THREADS", "4")
    source = BASELINE_TRAIN_PY.read_text().replace(
        "S = session()\n", "S = session()\nprint('threads', torch.get_num_threads(), flush=True)\n"
    )
    result = run(tmp_path, small_data, "asked-for-four", source)
    log = (tmp_path / "asked-for-four" / "run" / "log.txt").read_text()
    assert f"threads {PROFILE.threads}\n" in log
    assert result.val_bpb == run(tmp_path, small_data, "plain").val_bpb
