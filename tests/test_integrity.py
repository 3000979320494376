"""Cheats that pass the policy and the sandbox, and must not earn a score: each is an edit of the
baseline train.py, run for real through the runner, the sandbox, the harness and the scorer on
the `test` profile. A model that looks at later tokens of its row (anywhere, sparsely, only on
text that looks real) or at other rows of its batch is void; so is training past the budget; a
run that leaves its loop early still reports what it did. Honest edits are never refused."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from node.trainer import BASELINE_TRAIN_PY, get_profile, run_experiment

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]  # each test trains for real: 5 to 50 s

PROFILE = dataclasses.replace(get_profile("test"), max_train_seconds=20)
BASELINE = BASELINE_TRAIN_PY.read_text()
RETURN = "        return self.head(x, targets, FP8 and targets is not None)\n"
assert RETURN in BASELINE


def scored_differently(scoring: str) -> str:
    """The baseline, whose model adds `bonus` (a (B, T, V) tensor built by `scoring` from the
    input `idx`) to its logits whenever it is called without targets, that is when scored."""
    body = "".join(f"            {line}\n" for line in scoring.strip().splitlines())
    return BASELINE.replace(
        RETURN,
        "        if targets is not None:\n"
        + "    "
        + RETURN
        + "        logits = self.head(x)\n"
        + "        with torch.no_grad():\n"
        + body
        + "        return logits + bonus\n",
    )


NEXT = "nxt = F.one_hot(idx.roll(-1, 1), logits.size(-1)).float()\n"
POSITIONS = "pos = torch.arange(idx.size(1), device=idx.device)[None, :, None]\n"
AHEAD, ACROSS = "looks ahead", "reads across rows"
# name: (how the scored model builds its bonus, what the refusal must say)
CHEATS = {
    # the examples of the issue: late positions, a sparse comb, text-triggered
    "peeks past the middle of the row": (
        NEXT + POSITIONS + "bonus = 8 * nxt * (pos > idx.size(1) // 2)", AHEAD),
    "peeks on a sparse comb of positions": (
        NEXT + POSITIONS + "bonus = 8 * nxt * (pos % 7 == 3)", AHEAD),
    "peeks only on rows that look like text (a token repeats)": (
        NEXT + "same = (idx[:, :, None] == idx[:, None, :]).float().sum(-1).amax(-1)\n"
        "bonus = 8 * nxt * (same >= 4).float()[:, None, None]", AHEAD),
    # and others of the same classes
    "peeks two tokens ahead": (
        "bonus = 4 * F.one_hot(idx.roll(-2, 1), logits.size(-1)).float()", AHEAD),
    "peeks where a hash of the token picks": (
        NEXT + "bonus = 8 * nxt * ((idx * 40503) % 13 == 0).float()[..., None]", AHEAD),
    "peeks at the last three positions only": (
        NEXT + POSITIONS + "bonus = 8 * nxt * (pos >= idx.size(1) - 3)", AHEAD),
    "counts the row's later tokens (a bag of words of the whole row)": (
        "bag = F.one_hot(idx, logits.size(-1)).float().sum(dim=1, keepdim=True)\n"
        "bonus = 0.5 * bag.expand_as(logits)", AHEAD),
    "peeks only when few rows of the batch share a prefix (scoring, not a check)": (
        NEXT + "alike = (idx[:, :16][:, None, :] == idx[:, :16][None, :, :]).all(-1).float()\n"
        "scoring = ((alike.sum(-1) > 1).float().mean() < 0.25).float()\n"
        "bonus = 8 * nxt * scoring", AHEAD),
    "reads the next row of its batch": (
        "nxt = F.one_hot(idx.roll(-1, 0)[:, :1], logits.size(-1)).float()\n"
        "bonus = 3 * nxt.expand_as(logits)", ACROSS),
    "reads the other rows' words (a bag of words of the batch)": (
        "bag = F.one_hot(idx, logits.size(-1)).float().sum(dim=1)\n"
        "others = (bag.sum(0, keepdim=True) - bag) / idx.numel()\n"
        "bonus = 20 * others[:, None, :].expand_as(logits)", ACROSS),
}  # fmt: skip


def run(tmp_path, data, source: str, speed: float | None = None, profile=PROFILE):
    script = tmp_path / "train.py"
    script.write_text(source)
    return run_experiment(script, profile, data, tmp_path / "run", sandbox=True, speed=speed)


# For what the scorer or the envelope refuses whatever the training did: a quarter of the
# profile's tokens (16 batches after the 3 of warm-up).
SHORT = dataclasses.replace(PROFILE, budget_tokens=2**14)


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_model_that_looks_ahead_or_across_rows_is_void(name, tmp_path, small_data):
    scoring, says = CHEATS[name]
    result = run(tmp_path, small_data, scored_differently(scoring), profile=SHORT)
    assert result.outcome == "void", (result.outcome, result.error, result.log_tail[-1500:])
    assert result.val_bpb is None
    assert result.error.startswith("refused by the harness: the model " + says), result.error


TRAINS_ON = """
kept = []
for micro, (x, y) in enumerate(S.batches(DEVICE_BATCH)):
    kept = (kept + [(x, y)])[-4:]
    loss = model(x, y)
    loss.backward()
    for opt in optimizers:
        opt.step()
    model.zero_grad(set_to_none=True)
"""


def test_training_after_the_last_batch_counts_against_the_budget(tmp_path, small_data):
    """The loop ends when the batches stop; the script goes on training on the batches it kept,
    for about as long again, before it hands its model over."""
    tail = BASELINE[BASELINE.index("for micro, (x, y) in enumerate") :]
    source = BASELINE.replace(
        tail,
        TRAINS_ON
        + """
batches_took = S.elapsed()
while S.elapsed() < 2 * batches_took:
    for x, y in kept:
        model(x, y).backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
S.finish(model)
""",
    )
    result = run(tmp_path, small_data, source)
    assert result.outcome == "void", (result.outcome, result.error)
    assert "past the budget" in result.error and "finish" in result.error


LOOP = "for micro, (x, y) in enumerate(S.batches(DEVICE_BATCH)):\n"
assert LOOP in BASELINE
# Twice the test profile's budget, so that the bound's one second of slack does not decide
WORKED = dataclasses.replace(PROFILE, budget_tokens=2 * PROFILE.budget_tokens)


@pytest.fixture(scope="module")
def speed(tmp_path_factory, small_data):
    """This node's speed as a node measures it: the median of its honest runs."""
    speeds = []
    for _ in range(3):
        result = run_experiment(
            BASELINE_TRAIN_PY, WORKED, small_data, tmp_path_factory.mktemp("speed")
        )
        assert result.outcome == "ok", result.log_tail
        speeds.append(result.speed)
    return float(np.median(speeds))


@pytest.mark.parametrize("passes", [3, 6])
def test_work_beyond_the_counted_compute_is_void(passes, tmp_path, small_data, speed):
    """Several optimizer steps on every batch: the tokens are the budget's, the compute a
    multiple of what its FLOPs per token count. The node's measured speed bounds it."""
    source = BASELINE.replace(
        LOOP,
        LOOP + f"    for _ in range({passes - 1}):\n"
        "        model(x, y).backward()\n"
        "        for opt in optimizers:\n"
        "            opt.step()\n"
        "        model.zero_grad(set_to_none=True)\n",
    )
    script = tmp_path / "train.py"
    script.write_text(source)
    result = run_experiment(script, WORKED, small_data, tmp_path / "run", sandbox=True, speed=speed)
    assert result.outcome == "void", (result.outcome, result.error)
    assert "work the budget does not count" in result.error
    assert result.val_bpb is None


def test_a_model_beyond_the_envelope_is_void(tmp_path, small_data):
    """The budget is tokens for a model of at most the profile's FLOPs per token: a wider one
    would buy compute the budget does not count."""
    source = BASELINE.replace('"test": (2, 64, 32, 16, 1)', '"test": (4, 128, 32, 16, 1)')
    assert source != BASELINE
    result = run(tmp_path, small_data, source, profile=SHORT)
    assert result.outcome == "void", (result.outcome, result.error)
    assert "envelope" in result.error and "make the model smaller" in result.error


def test_a_run_that_leaves_its_loop_early_reports_what_it_did(tmp_path, small_data):
    source = BASELINE.replace(
        "    step += 1\n",
        "    step += 1\n    if step == 20:\n        break\n",
    )
    result = run(tmp_path, small_data, source)
    assert result.outcome == "ok", result.error
    assert result.steps == 20 and result.tokens == 20 * 16 * PROFILE.seq_len
    assert 0 < result.train_seconds and result.tokens < PROFILE.budget_tokens


def occurs_in(tokens: np.ndarray, gram: list[int]) -> bool:
    """Whether `gram` occurs in `tokens` (uint16) at a token boundary."""
    needle, haystack = np.asarray(gram, dtype=np.uint16).tobytes(), tokens.tobytes()
    at = haystack.find(needle)
    while at >= 0 and at % 2:
        at = haystack.find(needle, at + 1)
    return at >= 0


def test_warm_up_batches_hold_no_text(tmp_path, small_data):
    """Warm-up batches are untimed, so they carry nothing of the data: a script may train on
    them as long as its start-up limit lets it and learn nothing about the text it is scored on."""
    source = BASELINE.replace(
        "for micro, (x, y) in enumerate(S.batches(DEVICE_BATCH)):\n",
        "for micro, (x, y) in enumerate(S.batches(DEVICE_BATCH)):\n"
        "    if S.steps <= 4:\n"
        "        print('BATCH', S.steps, x[:, :8].tolist(), flush=True)\n",
    )
    result = run(tmp_path, small_data, source)
    assert result.outcome == "ok", result.error
    log = (tmp_path / "run" / "log.txt").read_text()
    batches = {}
    for line in log.splitlines():
        if line.startswith("BATCH "):
            _, step, rows = line.split(" ", 2)
            batches[int(step)] = json.loads(rows)
    assert sorted(batches) == [1, 2, 3, 4]
    train = np.memmap(small_data.train_path, dtype=np.uint16, mode="r")
    for step in (1, 2, 3):  # warm-up: no row's first 8 tokens occur anywhere in the training text
        assert not any(occurs_in(train, row) for row in batches[step]), step
    assert all(occurs_in(train, row) for row in batches[4])  # the first timed batch is text


def test_no_honest_change_of_the_baseline_is_refused(tmp_path_factory, small_data, speed):
    """The offline proposer's changes of the baseline score: none is void or crashes, with the
    work bound at the node's measured speed. Two at a time on a machine of two cores, so the
    clock's slack and the work bound are tried under load too. The suite runs
    the changes of the model's code and of the test profile's sizes and batches (19); with
    SWARM_TEST_ALL_CHANGES=1 every single change (51, six minutes), constants included."""
    from concurrent.futures import ThreadPoolExecutor

    from node.agent.catalogue import KNOWN_EDITS
    from node.agent.offline import OfflineProposer

    profile = dataclasses.replace(PROFILE, budget_tokens=2**14)
    changes = [c for c in OfflineProposer(0).candidates(BASELINE, "test") if ";" not in c[0]]
    assert len(changes) >= 40
    if not os.environ.get("SWARM_TEST_ALL_CHANGES"):
        edits = {description for description, _, _ in KNOWN_EDITS}
        changes = [c for c in changes if c[0] in edits or c[0].endswith("on the test profile")]
        assert len(changes) >= 15

    def one(change: tuple[str, str]):
        folder = tmp_path_factory.mktemp("honest-change")
        (folder / "train.py").write_text(change[1])
        result = run_experiment(
            folder / "train.py", profile, small_data, folder / "run", sandbox=True,
            speed=speed,
        )  # fmt: skip
        return change[0], result.outcome, result.error

    with ThreadPoolExecutor(2) as pool:
        ends = list(pool.map(one, changes))
    refused = [end for end in ends if end[1] != "ok"]
    assert not refused, refused
