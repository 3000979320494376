"""The runner: one experiment, `train.py` in its own process, timed and scored from outside.

The runner starts the harness in a fresh working directory and a new process group, keeps its
own clock over start-up, training and evaluation, and kills the whole group when a phase runs
past its limit. A crash, a timeout, a NaN or an out-of-memory ends as outcome `crash` with the
tail of the log. It never trusts a number that `train.py` could have printed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from node.trainer.compile_cache import IN_SANDBOX, CompileCache, environment
from node.trainer.data import TokenData
from node.trainer.device import peak_flops, require_device
from node.trainer.errors import TrainerError
from node.trainer.handoff import MODEL_FILE, Scoring
from node.trainer.policy import check_source
from node.trainer.process import PACKAGE, REFUSED, Event, OnEvent, Run, RunCancelled, give_back
from node.trainer.profiles import Profile
from node.trainer.sandbox import sandbox_available, sandbox_uid
from node.trainer.version import harness_sha256

# What the training process may report; anything else on its pipe is ignored, and a score from
# it is a forgery (only the scorer scores).
TRAINING_EVENTS = frozenset(
    {
        "started",
        "ready",
        "train_start",
        "progress",
        "train_end",
        "eval_start",
        "exported",
        "export_failed",
    }
)
# A run that took its turn on the GPU lets the next one start up once it has trained this long:
# its first steps allocate what its training holds from then on.
SETTLE_SECONDS = 5.0
CPU_BATCH_TOKENS, CUDA_BATCH_TOKENS = 2**14, 2**17  # tokens per evaluation batch
LOG_TAIL_LINES = 40
# Training may go on after its last batch by this much before the run is void: the last step
# (on a GPU the host queues work up to a few steps ahead of the device, and the harness waits
# for it), and a pause of the process on a busy machine.
SLACK_STEPS = 4
SLACK_SECONDS = 0.25  # on the harness's own clock, in the training process
RUNNER_SLACK_SECONDS = 2.0  # on the runner's clock, two processes and a pipe apart: a coarse guard
OVERRUN = "past the budget"  # in the error of a run void for training too long
OVERWORK = "work the budget does not count"  # in the error of a run void for too much work
TIMED_VOIDS = (OVERRUN, OVERWORK)  # voids a pause of a busy machine could cause: worth a re-run
# The budget counts tokens, not the work done on them: a train.py that spends more compute per
# token than its counted FLOPs (several passes over each batch, a larger model trained on the
# side) is bounded by this node's measured speed, in counted FLOPs per second of training
# compute. A run whose training took more than WORK_FACTOR times what its counted FLOPs take
# at that speed (plus WORK_SLACK_SECONDS) is void. A model smaller than a third of the envelope
# (the baseline's size) is bounded as if it were that size: small models run at a lower rate
# per FLOP. The offline proposer's 50 honest variants of the baseline ran at 0.61 to 1.16
# times the baseline's speed on the test profile (docs/trainer.md).
WORK_FACTOR = 2.0
WORK_FLOOR = 1 / 3  # of the envelope's FLOPs per token: the least a run is bounded as
WORK_SLACK_SECONDS = 1.0
CAP_FACTOR = 3.0  # the wall-clock cap: this many times the envelope's work at the measured speed
CAP_SLACK_SECONDS = 60.0


@dataclass
class RunResult:
    """One experiment's measurements. `outcome` is "ok"; "crash" (it failed: `error` and the log
    tail say how); or "void": it ran, but broke the rules of the measurement (its model looked
    ahead or across rows, it trained past its budget, its counts contradict its score), and
    `error` says which. A void run has no score."""

    outcome: str
    val_bpb: float | None
    steps: int
    tokens: int
    train_seconds: float
    total_seconds: float
    peak_memory_mb: float | None
    mfu: float | None
    train_py_sha256: str
    harness_sha256: str
    profile: str
    seed: int
    data_sha256: str
    tokens_per_second: float | None = None
    startup_seconds: float | None = None
    launch_seconds: float | None = None  # of the start-up: sandbox, interpreter, torch, device
    eval_seconds: float | None = None
    eval_tokens: int | None = None
    check_seconds: float | None = None  # of the evaluation: the scorer's look-ahead check
    check_tokens: int | None = None
    params: int | None = None
    flops_per_token: float | None = None
    work_seconds: float | None = None  # training's compute time (CPU seconds per thread on a CPU)
    speed: float | None = None  # counted training FLOPs per second of work_seconds
    budget_tokens: int | None = None  # the profile's budget the run trained for
    device_name: str | None = None  # the device class: the GPU's name, or "cpu" and its kernels
    error: str | None = None
    log_tail: str = ""
    run_dir: str = ""
    sandboxed: bool = False
    # Started while another run trained (GpuTurns): how long it waited, compiled and warmed up,
    # for its turn (not part of start-up_seconds).
    held_seconds: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


class GpuTurns:
    """Runs of one GPU that take turns on it, so that one run's start-up (launch, compilation,
    warm-up batches) happens while the run before it trains.

    A run may start up once no other run is starting up or in its first SETTLE_SECONDS of
    training; it starts up in a process that takes only the GPU memory the training run leaves
    free, then waits, ready, until the run before it has stopped training (`hold` in the
    harness): the export and the score of the run before run beside its first seconds of
    training, as its start-up ran beside the other's training. Its budget's clock starts once no
    other run trains. A run that fails before it is ready runs again, alone. Pass one GpuTurns
    to every `run_experiment` of a GPU (from threads).
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.starting: object | None = None  # the run starting up, or just started training
        self.training: object | None = None  # the run that has the GPU

    def _wait(self, free, stops: tuple) -> None:
        def stopped() -> bool:
            return any(stop is not None and stop.is_set() for stop in stops)

        while not self._changed.wait_for(lambda: free() or stopped(), timeout=0.5):
            pass
        if stopped():
            raise RunCancelled("the run stopped while it waited for its turn on the GPU")

    def start_up(self, run: object, *stops: threading.Event | None) -> None:
        """Wait until `run` may start up (raises RunCancelled once any of `stops` is set)."""
        with self._changed:
            self._wait(lambda: self.starting is None, stops)
            self.starting = run

    def take(self, run: object, *stops: threading.Event | None) -> None:
        """Wait until the GPU is free, and give it to `run`."""
        with self._changed:
            self._wait(lambda: self.training is None, stops)
            self.training = run

    def trained(self, run: object) -> None:
        """`run` stopped training: the next may train while it is exported and scored."""
        with self._changed:
            if self.training is run:
                self.training = None
                self._changed.notify_all()

    def settled(self, run: object) -> None:
        with self._changed:
            if self.starting is run:
                self.starting = None
                self._changed.notify_all()

    def leave(self, run: object) -> None:
        with self._changed:
            self.starting = None if self.starting is run else self.starting
            self.training = None if self.training is run else self.training
            self._changed.notify_all()


def run_experiment(
    train_py: Path,
    profile: Profile,
    data: TokenData,
    run_dir: Path,
    seed: int = 0,
    on_event: OnEvent = lambda _: None,
    sandbox: bool | None = None,
    cancel: threading.Event | None = None,
    gpu: int | None = None,
    compile_cache: CompileCache | None = None,
    keep_compiled: bool = False,
    speed: float | None = None,
    turns: GpuTurns | None = None,
) -> RunResult:
    """Run `train_py` once under `profile` and return what the harness measured.

    The source passes the static policy first (a version that fails never runs). Training runs
    in one process that never sees validation data; the scorer scores the model it exported in
    a second one. `sandbox`: True requires bubblewrap, False runs without it, None uses it where
    the machine has it. `cancel` set while it runs ends the run and raises RunCancelled (a stop,
    not a result); `gpu` picks one CUDA device for the run. `compile_cache` lends the run a
    copy of the node's compiled kernels; `keep_compiled` (for code the node trusts, never a
    stranger's) adds what the run compiled to it. `speed`: this node's measured speed on the
    profile (`RunResult.speed` of its earlier runs), which bounds the work a run may do per
    counted FLOP and caps training's wall clock; without it the profile's cap applies.
    `turns`: the GPU's turns, shared with the runs of other threads (GpuTurns): this run starts
    up while another trains, and trains once that one is scored.
    """
    if turns is not None:
        me = object()
        turns.start_up(me, cancel)
        try:
            return _run_experiment(
                train_py, profile, data, run_dir, seed, on_event, sandbox, cancel, gpu,
                compile_cache, keep_compiled, speed, turns, me,
            )  # fmt: skip
        finally:
            turns.leave(me)
    return _run_experiment(
        train_py, profile, data, run_dir, seed, on_event, sandbox, cancel, gpu, compile_cache,
        keep_compiled, speed,
    )  # fmt: skip


def _run_experiment(
    train_py: Path, profile: Profile, data: TokenData, run_dir: Path, seed: int,
    on_event: OnEvent, sandbox: bool | None, cancel: threading.Event | None, gpu: int | None,
    compile_cache: CompileCache | None, keep_compiled: bool, speed: float | None,
    turns: GpuTurns | None = None, me: object = None,
) -> RunResult:  # fmt: skip
    try:
        source = train_py.read_bytes()
    except OSError as exc:
        raise TrainerError(
            f"cannot read {train_py}: {exc.strerror}; pass an existing file with --train-py"
        ) from exc
    require_device(profile)
    if sandbox and not sandbox_available():
        raise TrainerError(
            "no sandbox on this machine: install bubblewrap (apt-get install bubblewrap), "
            "or run without one only for code you trust (--no-sandbox)"
        )
    use_sandbox = sandbox_available() if sandbox is None else sandbox
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train.py").write_bytes(source)
    rows, batch_size = eval_shape(
        data.val_path.stat().st_size // 2, profile.seq_len, profile.eval_tokens, profile.device
    )
    config = {  # no validation path: the training process has no business with it
        "profile": profile.as_dict(),
        "seed": seed,
        "train_py": str(run_dir / "train.py"),
        "data": {"train_path": str(data.train_path), "vocab_size": data.manifest["vocab_size"]},
        "eval": {"batch_size": batch_size, "model_path": str(run_dir / MODEL_FILE)},
        "hold": turns is not None,
    }
    (run_dir / "config.json").write_text(json.dumps(config, indent=1))
    base = dict(
        train_py_sha256=hashlib.sha256(source).hexdigest(),
        harness_sha256=harness_sha256(profile),
        profile=profile.name,
        seed=seed,
        data_sha256=data.sha256,
        budget_tokens=profile.budget_tokens,
        run_dir=str(run_dir),
        sandboxed=use_sandbox,
    )
    violations = check_source(source.decode("utf-8", "replace"))
    if violations:
        return _finish(_refused(violations, base), run_dir, on_event)
    cap = (
        CAP_FACTOR * profile.budget_tokens * profile.max_flops_per_token / speed + CAP_SLACK_SECONDS
        if speed
        else None
    )
    run = Run(
        profile, use_sandbox, run_dir / "log.txt", gpu, on_event, cancel, time.monotonic(), cap
    )
    scoring = Scoring(run, data, seed, rows, batch_size)

    # The scorer starts early so that its start-up overlaps other work: on a GPU while training
    # runs (its imports use CPU cores the training leaves idle), on a CPU once training is over.
    prestart = "train_start" if profile.device == "cuda" else "eval_start"
    went: list[float] = []  # when the held run was told to go
    ended, pipe_lock = threading.Event(), threading.Lock()  # the training process has ended

    def go() -> None:  # from a thread of its own: the watch loop keeps the run's limits
        try:
            turns.take(me, cancel, ended)
        except RunCancelled:
            return
        with pipe_lock:
            if not ended.is_set():
                went.append(time.monotonic())
                os.write(go_write, b"g")

    def relay(event: Event) -> None:
        if event["event"] == prestart:
            scoring.start()
        if event["event"] == "ready" and turns is not None:
            threading.Thread(target=go, daemon=True).start()
        if event["event"] == "eval_start" and turns is not None:
            turns.trained(me)
        if event["event"] == "train_start" and turns is not None:
            timer = threading.Timer(SETTLE_SECONDS, turns.settled, (me,))
            timer.daemon = True
            timer.start()
        on_event(event)

    uid = sandbox_uid() if use_sandbox else None
    go_read, go_write = os.pipe() if turns is not None else (-1, -1)
    try:
        if uid is not None:
            os.chown(run_dir, uid, uid)
        env, binds = {"HOME": str(run_dir)}, {}
        if compile_cache is not None and use_sandbox:  # on the runner's clock: start-up time
            binds[IN_SANDBOX] = compile_cache.lend(run_dir, uid)
            env.update(environment(IN_SANDBOX))
        elif compile_cache is not None:  # unconfined code could write the store anyway
            env.update(environment(compile_cache.root))
        cmd = [sys.executable, "-P", "-m", "node.trainer.harness", str(run_dir / "config.json")]
        if turns is not None and turns.training is not None:  # leave the training run cores
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(1, (os.cpu_count() or 2) // 2))
        training = run.start(
            cmd, [PACKAGE, data.train_path], env, uid, run_dir=run_dir, binds=binds,
            stdin=go_read if turns is not None else subprocess.DEVNULL,
        )  # fmt: skip
        if turns is not None:
            os.close(go_read)
            go_read = -1
        try:
            seen = run.follow(training, TRAINING_EVENTS, "startup", run.started, relay)
        finally:
            with pipe_lock:
                ended.set()
                if go_write >= 0:
                    os.close(go_write)
                    go_write = -1
        held_failed = turns is not None and "ready" not in seen and "train_start" not in seen
        if went and "ready_at" in seen:
            seen["held_seconds"] = went[0] - seen["ready_at"]
            if "startup_seconds" in seen:
                seen["startup_seconds"] -= seen["held_seconds"]
        if uid is not None:
            give_back(run_dir)
            uid = None
        if seen.get("exported") and seen.get("returncode") == 0 and "error" not in seen:
            seen["score"] = scoring.score(run_dir)
        if binds and keep_compiled and "train_start" in seen:
            compile_cache.keep(run_dir)
    finally:
        if uid is not None:
            give_back(run_dir)
        if compile_cache is not None:
            compile_cache.release(run_dir)
        scoring.close()
        # Scored or not, the exported model is done with: 80 to 140 MB a run on the gpu profile.
        (run_dir / MODEL_FILE).unlink(missing_ok=True)
        with pipe_lock:
            ended.set()
            for fd in (go_read, go_write):
                if fd >= 0:
                    os.close(fd)
    if turns is not None and held_failed and not (cancel is not None and cancel.is_set()):
        # It failed while it started up beside another run (its memory, say): again, alone.
        turns.take(me, cancel)
        return _run_experiment(
            train_py, profile, data, run_dir, seed, on_event, sandbox, cancel, gpu,
            compile_cache, keep_compiled, speed,
        )  # fmt: skip
    seen["total_seconds"] = time.monotonic() - run.started
    return _finish(_result(seen, base, profile, run.log_path, speed), run_dir, on_event)


def eval_shape(val_tokens: int, seq_len: int, eval_tokens: int, device: str) -> tuple[int, int]:
    """(sequences scored, sequences per batch): the export's input shape and the scorer's batches."""
    rows = min(eval_tokens // seq_len, (val_tokens - 1) // seq_len)
    if rows < 1:
        raise TrainerError("the validation split is shorter than one sequence: rebuild the data")
    per_batch = (CUDA_BATCH_TOKENS if device == "cuda" else CPU_BATCH_TOKENS) // seq_len
    return rows, max(1, min(rows, per_batch))


def _finish(result: RunResult, run_dir: Path, on_event: OnEvent) -> RunResult:
    (run_dir / "result.json").write_text(json.dumps(result.as_dict(), indent=1))
    on_event({"event": "done", "outcome": result.outcome, "val_bpb": result.val_bpb})
    return result


def _refused(violations: list, base: dict) -> RunResult:
    """The result of a version the policy refused: it never ran."""
    shown = "; ".join(str(v) for v in violations[:5]) + ("; ..." if len(violations) > 5 else "")
    return RunResult(
        outcome="crash",
        val_bpb=None,
        steps=0,
        tokens=0,
        train_seconds=0.0,
        total_seconds=0.0,
        peak_memory_mb=None,
        mfu=None,
        error=f"refused by the policy: {shown}",
        **base,
    )


def _counts(seen: dict) -> dict:
    """The harness's counts at the latest event that carried them: finish, the end of the
    batches, or the last progress (a run that never finished)."""
    for name in ("eval_start", "train_end", "progress"):
        if "steps" in seen.get(name, {}):
            return seen[name]
    return {}


def _void(
    counts: dict, flops: float | None, profile: Profile, train_seconds: float, speed: float | None
) -> str | None:
    """Why a scored run breaks the rules of the measurement, or None."""
    timed_steps = counts.get("steps", 0) - profile.warmup_batches
    timed_tokens = counts.get("tokens", 0) - counts.get("warmup_tokens", 0)
    if timed_steps <= 0 or timed_tokens <= 0:
        return (
            f"a score but no counted training ({counts.get('steps', 0)} batches, "
            f"{timed_tokens} timed tokens); a run must train on session().batches()"
        )
    flops = flops or 0.0  # a model of lookups alone counts no FLOPs
    if flops > profile.max_flops_per_token:
        return (
            f"its model takes {flops:.4g} training FLOPs per token, beyond the profile's "
            f"envelope of {profile.max_flops_per_token:.4g}: make the model smaller"
        )
    last = counts.get("last_batch_seconds", 0.0)
    step = last / max(timed_steps - 1, 1)
    for clock, seconds, floor in (
        ("the harness's", counts.get("train_seconds", 0.0), SLACK_SECONDS),
        ("the runner's", train_seconds, RUNNER_SLACK_SECONDS),
    ):
        slack = SLACK_STEPS * step + floor
        if seconds > last + slack:
            return (
                f"training ran {seconds:.2f} s on {clock} clock, {OVERRUN}: {seconds - last:.2f} s "
                f"after its last batch, more than {slack:.2f} s ({SLACK_STEPS} steps of "
                f"{step:.3f} s and {floor:g} s); the clock runs until session().finish(model)"
            )
    work = counts.get("work_seconds")
    if speed and work is not None:
        counted = timed_tokens * max(flops, WORK_FLOOR * profile.max_flops_per_token) / speed
        if work > WORK_FACTOR * counted + WORK_SLACK_SECONDS:
            return (
                f"training took {work:.2f} s of compute, more than {WORK_FACTOR:g} times the "
                f"{counted:.2f} s its counted FLOPs take at this node's speed "
                f"({speed:.3g} FLOP/s): it did {OVERWORK}"
            )
    return None


def _result(
    seen: dict, base: dict, profile: Profile, log_path: Path, speed: float | None = None
) -> RunResult:
    counts, exported = _counts(seen), seen.get("exported", {})
    score = seen.get("score", {})
    result = score.get("result", {})
    train_seconds = seen.get("train_seconds", 0.0)
    timed_tokens = counts.get("tokens", 0) - counts.get("warmup_tokens", 0)
    tps = timed_tokens / train_seconds if train_seconds > 0 and timed_tokens > 0 else None
    work = counts.get("work_seconds")
    flops, device_name = exported.get("flops_per_token"), exported.get("device_name")
    peak = peak_flops(device_name)
    mfu = flops * tps / peak if flops and tps and peak else None
    val_bpb = result.get("val_bpb")
    error = seen.get("error")
    void = None
    if error and error.startswith(REFUSED):  # it forged a score of its own
        void, error = error, None
    if void is None and error is None and seen.get("returncode") != 0:
        error = f"train.py exited with code {seen.get('returncode')}"
        if seen.get("returncode") == -signal.SIGKILL:
            error += " (killed: out of memory?)"
    if void is None and error is None and not exported:
        error = "no score: train.py ended without handing its model to session().finish(model)"
    if void is None and error is None and "refused" in score:  # the scorer caught it
        void = score.get("error")
    error = None if void else error or score.get("error")
    if void is None and error is None:
        if score.get("returncode") != 0:
            error = f"the scorer exited with code {score.get('returncode')}"
        elif val_bpb is None:
            error = "no score: the scorer reported none"
        elif not math.isfinite(val_bpb):
            error = f"val_bpb is {val_bpb}: the model diverged (NaN or infinite loss)"
        else:
            void = _void(counts, flops, profile, train_seconds, speed)
    eval_seconds = (
        score["result_at"] - seen["eval_started"]
        if "result_at" in score and "eval_started" in seen
        else None
    )
    return RunResult(
        outcome="void" if void else "crash" if error else "ok",
        val_bpb=None if error or void else val_bpb,
        steps=counts.get("steps", 0),
        tokens=counts.get("tokens", 0),
        train_seconds=round(train_seconds, 3),
        total_seconds=round(seen["total_seconds"], 3),
        peak_memory_mb=exported.get("peak_memory_mb") or seen.get("rss_mb") or None,
        mfu=mfu,
        tokens_per_second=tps,
        startup_seconds=seen.get("startup_seconds"),
        held_seconds=seen.get("held_seconds"),
        launch_seconds=seen.get("launch_seconds"),
        eval_seconds=eval_seconds,
        eval_tokens=result.get("eval_tokens"),
        check_seconds=result.get("check_seconds"),
        check_tokens=result.get("check_tokens"),
        params=result.get("params"),
        flops_per_token=flops,
        work_seconds=round(work, 3) if work is not None else None,
        speed=flops * timed_tokens / work if flops and work and timed_tokens > 0 else None,
        device_name=device_name,
        error=void or error,
        log_tail=_tail(log_path) if error or void else "",
        **base,
    )
