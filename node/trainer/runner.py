"""The runner: one experiment, `train.py` in its own process, timed and scored from outside.

The runner starts the harness in a fresh working directory and a new process group, keeps its
own clock over start-up, training and evaluation, and kills the whole group when a phase runs
past its limit. A crash, a timeout, a NaN or an out-of-memory ends as outcome `crash` with the
tail of the log. It never trusts a number that `train.py` could have printed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from node.trainer.data import TokenData
from node.trainer.errors import TrainerError
from node.trainer.policy import check_source
from node.trainer.profiles import Profile
from node.trainer.sandbox import (
    bwrap_command,
    clean_environment,
    limit_resources,
    sandbox_available,
)

HARNESS_FILES = ("corpus.py", "data.py", "harness.py", "policy.py", "profiles.py", "runner.py", "sandbox.py",
                 "tokenizer.py", "webdata.py")
LOG_TAIL_LINES = 40
# Dense bf16 matrix rate by device name, for MFU; override with SWARM_PEAK_FLOPS.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "4090": 165e12}
Event = dict
OnEvent = Callable[[Event], None]


class RunCancelled(TrainerError):
    """The run was stopped from outside (the node is shutting down): there is no result."""


def harness_sha256() -> str:
    """Hash of the code that prepares data, times and scores: results with another hash never compare."""
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for name in HARNESS_FILES:
        digest.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass
class RunResult:
    """One experiment's measurements; `outcome` is "ok" or "crash" (with `error` and the log tail)."""

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
    eval_seconds: float | None = None
    eval_tokens: int | None = None
    params: int | None = None
    flops_per_token: float | None = None
    device_name: str | None = None
    error: str | None = None
    log_tail: str = ""
    run_dir: str = ""
    sandboxed: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _peak_flops(device_name: str | None) -> float | None:
    if os.environ.get("SWARM_PEAK_FLOPS"):
        return float(os.environ["SWARM_PEAK_FLOPS"])
    for key, flops in PEAK_FLOPS.items():
        if device_name and key in device_name:
            return flops
    return None


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_experiment(train_py: Path, profile: Profile, data: TokenData, run_dir: Path, seed: int = 0,
                   on_event: OnEvent = lambda _: None, sandbox: bool | None = None,
                   cancel: threading.Event | None = None, gpu: int | None = None) -> RunResult:
    """Run `train_py` once under `profile` and return what the harness measured.

    The source passes the static policy first (a version that fails never runs). `sandbox`:
    True requires bubblewrap, False runs without it, None uses it where the machine has it.
    `cancel` set while it runs ends the run and raises RunCancelled (a stop, not a result);
    `gpu` picks one CUDA device for the run.
    """
    try:
        source = train_py.read_bytes()
    except OSError as exc:
        raise TrainerError(f"cannot read {train_py}: {exc.strerror}; pass an existing file with --train-py") from exc
    require_device(profile)
    if sandbox and not sandbox_available():
        raise TrainerError("no sandbox on this machine: install bubblewrap (apt-get install bubblewrap), "
                           "or run without one only for code you trust (--no-sandbox)")
    use_sandbox = sandbox_available() if sandbox is None else sandbox
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train.py").write_bytes(source)
    config = {
        "profile": profile.as_dict(), "seed": seed, "train_py": str(run_dir / "train.py"),
        "data": {"train_path": str(data.train_path), "val_path": str(data.val_path),
                 "token_bytes_path": str(data.token_bytes_path), "vocab_size": data.manifest["vocab_size"]},
    }
    (run_dir / "config.json").write_text(json.dumps(config, indent=1))
    base = dict(train_py_sha256=hashlib.sha256(source).hexdigest(), harness_sha256=harness_sha256(),
                profile=profile.name, seed=seed, data_sha256=data.sha256, run_dir=str(run_dir),
                sandboxed=use_sandbox)
    violations = check_source(source.decode("utf-8", "replace"))
    if violations:
        return _finish(_refused(violations, base), run_dir, on_event)
    log_path = run_dir / "log.txt"
    read_fd, write_fd = os.pipe()
    package = Path(__file__).resolve().parents[1]  # node/: the harness must import in the child
    env = clean_environment({"SWARM_STATUS_FD": str(write_fd), "PYTHONUNBUFFERED": "1", "HOME": str(run_dir),
                             "PYTHONPATH": str(package.parent)})
    if profile.threads:
        env["OMP_NUM_THREADS"] = str(profile.threads)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    cmd = [sys.executable, "-m", "node.trainer.harness", str(run_dir / "config.json")]
    if use_sandbox:
        cmd = bwrap_command(cmd, run_dir, [package, data.train_path, data.val_path, data.token_bytes_path],
                            profile.device)
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            pass_fds=(write_fd,), env=env, start_new_session=True,
            preexec_fn=functools.partial(limit_resources, profile.device),
        )
    os.close(write_fd)
    try:
        outcome = _watch(proc, read_fd, profile, started, on_event, cancel)
    finally:
        os.close(read_fd)
        _kill_group(proc)
    outcome["total_seconds"] = time.monotonic() - started
    return _finish(_result(outcome, base, profile, log_path), run_dir, on_event)


def require_device(profile: Profile) -> None:
    """TrainerError when this machine lacks the profile's device (checked before any data is fetched)."""
    if profile.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise TrainerError(f"profile {profile.name} needs a CUDA GPU and this machine has none; use --profile cpu")


def _finish(result: RunResult, run_dir: Path, on_event: OnEvent) -> RunResult:
    (run_dir / "result.json").write_text(json.dumps(result.as_dict(), indent=1))
    on_event({"event": "done", "outcome": result.outcome, "val_bpb": result.val_bpb})
    return result


def _refused(violations: list, base: dict) -> RunResult:
    """The result of a version the policy refused: it never ran."""
    shown = "; ".join(str(v) for v in violations[:5]) + ("; ..." if len(violations) > 5 else "")
    return RunResult(outcome="crash", val_bpb=None, steps=0, tokens=0, train_seconds=0.0, total_seconds=0.0,
                     peak_memory_mb=None, mfu=None, error=f"refused by the policy: {shown}", **base)


def _watch(proc: subprocess.Popen, read_fd: int, profile: Profile, started: float, on_event: OnEvent,
           cancel: threading.Event | None) -> dict:
    """Follow the harness's events with the runner's own clock until the process ends or is killed."""
    seen: dict = {}
    phase, phase_start, buffer = "startup", started, b""
    limits = {"startup": profile.startup_seconds, "train": profile.budget_seconds + profile.grace_seconds,
              "eval": profile.eval_seconds}
    while True:
        if cancel is not None and cancel.is_set():
            _kill_group(proc)
            raise RunCancelled(f"run cancelled during {phase}")
        now = time.monotonic()
        if now - phase_start > limits[phase]:
            _kill_group(proc)
            seen["error"] = f"timeout: {phase} ran past its limit of {limits[phase]:.0f} s"
            break
        ready, _, _ = select.select([read_fd], [], [], 0.2)
        if ready:
            chunk = os.read(read_fd, 65536)
            if not chunk:  # the process closed the pipe: it has ended
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    event = json.loads(line)
                    name = event["event"]
                except (ValueError, KeyError, TypeError):
                    continue
                now = time.monotonic()
                if name == "train_start":
                    seen["startup_seconds"] = now - started
                    phase, phase_start = "train", now
                elif name == "eval_start" and phase == "train":
                    seen["train_seconds"] = now - phase_start
                    phase, phase_start = "eval", now
                elif name == "result":
                    seen["eval_seconds"] = now - phase_start
                elif name == "refused":  # the harness caught the model cheating
                    seen["error"] = f"refused by the harness: {event.get('reason', '')}"
                seen[name] = event
                on_event({**event, "phase": phase, "runner_elapsed": now - phase_start})
        elif proc.poll() is not None:
            break
    seen["returncode"], seen["rss_mb"] = _reap(proc)
    return seen


def _reap(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for the process; its exit code and its own peak resident memory in MiB."""
    if proc.returncode is not None:
        return proc.returncode, 0.0
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024  # Linux reports KiB


def _result(seen: dict, base: dict, profile: Profile, log_path: Path) -> RunResult:
    end, result = seen.get("train_end", {}), seen.get("result", {})
    train_seconds = seen.get("train_seconds", 0.0)
    timed_tokens = end.get("tokens", 0) - end.get("warmup_tokens", 0)
    tps = timed_tokens / train_seconds if train_seconds > 0 and timed_tokens > 0 else None
    flops, device_name = result.get("flops_per_token"), result.get("device_name")
    peak = _peak_flops(device_name)
    mfu = flops * tps / peak if flops and tps and peak else None
    error = seen.get("error")
    val_bpb = result.get("val_bpb")
    if error is None and seen.get("returncode") != 0:
        error = f"train.py exited with code {seen.get('returncode')}"
        if seen.get("returncode") == -signal.SIGKILL:
            error += " (killed: out of memory?)"
    if error is None and val_bpb is None:
        error = "no score: train.py ended without handing its model to session().finish(model)"
    if error is None and not math.isfinite(val_bpb):
        error = f"val_bpb is {val_bpb}: the model diverged (NaN or infinite loss)"
    if error is None and train_seconds > profile.budget_seconds + profile.grace_seconds:
        error = f"training ran {train_seconds:.1f} s, past the budget of {profile.budget_seconds:.0f} s"
    return RunResult(
        outcome="crash" if error else "ok",
        val_bpb=None if error else val_bpb,
        steps=end.get("steps", 0),
        tokens=end.get("tokens", 0),
        train_seconds=round(train_seconds, 3),
        total_seconds=round(seen["total_seconds"], 3),
        peak_memory_mb=result.get("peak_memory_mb") or seen.get("rss_mb") or None,
        mfu=mfu,
        tokens_per_second=tps,
        startup_seconds=seen.get("startup_seconds"),
        eval_seconds=seen.get("eval_seconds"),
        eval_tokens=result.get("eval_tokens"),
        params=result.get("params"),
        flops_per_token=flops,
        device_name=device_name,
        error=error,
        log_tail=_tail(log_path) if error else "",
        **base,
    )

