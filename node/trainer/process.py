"""One process of a run (training or scoring), started in the sandbox and followed on the
runner's own clock: its status pipe read, each phase held to its limit, the process group and
every process of its uid ended. Nothing here believes what the process reports about itself
beyond the events a phase accepts.
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from node.trainer.errors import TrainerError
from node.trainer.profiles import Profile
from node.trainer.sandbox import (
    bwrap_command,
    clean_environment,
    end_processes_of,
    limit_resources,
    task_limit,
)

PACKAGE = Path(__file__).resolve().parents[1]  # node/: both processes import the harness from it
SCORER_EVENTS = frozenset({"result", "refused"})  # what only the scorer may report
MAX_MODEL_BYTES = 16 << 30  # an exported model over this is neither handed to the scorer nor read
REFUSED = "refused by the harness: "  # how a void run's error begins when the harness caught it
Event = dict
OnEvent = Callable[[Event], None]


class RunCancelled(TrainerError):
    """The run was stopped from outside (the node is shutting down): there is no result."""


@dataclass
class Process:
    proc: subprocess.Popen
    status_fd: int
    uid: int | None
    began: float


@dataclass
class Run:
    """What the two processes of one run share: the profile, the sandbox choice, the log, the clock."""

    profile: Profile
    sandbox: bool
    log_path: Path
    gpu: int | None
    on_event: OnEvent
    cancel: threading.Event | None
    started: float
    train_limit: float | None = None  # the safety cap on training's wall clock, in seconds

    def start(
        self,
        cmd: list[str],
        read_only: list[Path],
        env_extra: dict,
        uid: int | None,
        run_dir: Path | None = None,
        cwd: Path | None = None,
        fds: tuple = (),
        stdin: int = subprocess.DEVNULL,
        binds: dict[str, Path] | None = None,
    ) -> Process:
        """Start `cmd` (sandboxed when the run is, with `binds`: path inside -> folder, writable)
        with a status pipe of its own."""
        read_fd, write_fd = os.pipe()
        env = clean_environment(
            {
                "SWARM_STATUS_FD": str(write_fd),
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": str(PACKAGE.parent),
                "USER": "sandbox",
                "LOGNAME": "sandbox",
                **env_extra,
            }
        )
        if self.profile.threads:
            env["OMP_NUM_THREADS"] = str(self.profile.threads)
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu)
        if self.sandbox:
            cmd = bwrap_command(cmd, run_dir, read_only, self.profile.device, uid, binds)
        tasks = task_limit(uid) if self.sandbox else None
        try:
            with self.log_path.open("ab") as log:
                proc = subprocess.Popen(
                    cmd,
                    cwd=cwd or run_dir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=stdin,
                    pass_fds=(write_fd, *fds),
                    env=env,
                    start_new_session=True,
                    preexec_fn=functools.partial(limit_resources, self.profile.device, tasks),
                )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        return Process(proc, read_fd, uid, time.monotonic())

    def follow(
        self,
        process: Process,
        accepted: frozenset,
        phase: str,
        started: float,
        on_event: OnEvent | None = None,
    ) -> dict:
        """Follow a started process's status pipe until it ends; reap it and all it started."""
        try:
            return watch(
                process.proc,
                process.status_fd,
                self.limits(),
                phase,
                started,
                accepted,
                on_event or self.on_event,
                self.cancel,
            )
        finally:
            self.stop(process)

    def limits(self) -> dict[str, float]:
        """Each phase's limit on the runner's clock, in seconds."""
        profile = self.profile
        return {
            "startup": profile.startup_seconds,
            # waiting for another run's turn on the GPU: its start-up, training and evaluation
            "held": profile.startup_seconds + profile.max_train_seconds + 2 * profile.eval_seconds,
            "train": self.train_limit or profile.max_train_seconds,
            "eval": profile.eval_seconds,
            "score": profile.eval_seconds,
        }

    @staticmethod
    def stop(process: Process) -> None:
        if process.status_fd >= 0:
            os.close(process.status_fd)
            process.status_fd = -1
        kill_group(process.proc)
        if process.uid is not None:
            end_processes_of(process.uid)


def give_back(run_dir: Path) -> None:
    """The run folder and what the sandbox left in it back to this node's user (links not followed)."""
    me = (os.geteuid(), os.getegid())
    os.lchown(run_dir, *me)
    for folder, dirs, files in os.walk(run_dir):
        for name in dirs + files:
            try:
                os.lchown(os.path.join(folder, name), *me)
            except OSError:
                continue


def kill_group(proc: subprocess.Popen) -> None:
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


def watch(
    proc: subprocess.Popen,
    read_fd: int,
    limits: dict[str, float],
    phase: str,
    started: float,
    accepted: frozenset,
    on_event: OnEvent,
    cancel: threading.Event | None,
) -> dict:
    """Follow one process's events with the runner's own clock until it ends or is killed.

    Only the events in `accepted` count; a score sent by the training process is a forgery,
    and ends the run as refused.
    """
    seen: dict = {}
    phase_start, buffer = started, b""
    while True:
        if cancel is not None and cancel.is_set():
            kill_group(proc)
            raise RunCancelled(f"run cancelled during {phase}")
        now = time.monotonic()
        if now - phase_start > limits[phase]:
            kill_group(proc)
            seen.setdefault(
                "error", f"timeout: {phase} ran past its limit of {limits[phase]:.0f} s"
            )
            break
        ready, _, _ = select.select([read_fd], [], [], 0.2)
        if not ready:
            if proc.poll() is None:
                continue
            # It ended after the wait above began: what it wrote before it ended is in the pipe.
            # Look once more without waiting (a child it left holding the pipe is not waited for).
            ready, _, _ = select.select([read_fd], [], [], 0)
            if not ready:
                break
        chunk = os.read(read_fd, 65536)
        if not chunk:  # every writer closed the pipe: the process has ended
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
                name = event["event"]
            except (ValueError, KeyError, TypeError):
                continue
            if name not in accepted:
                if name in SCORER_EVENTS:
                    seen.setdefault(
                        "error",
                        f"{REFUSED}the training process sent a {name!r} "
                        f"event of its own; only the scorer scores",
                    )
                continue
            now = time.monotonic()
            if name == "started":
                seen["launch_seconds"] = now - started
            elif name == "ready" and phase == "startup":  # compiled, waiting for its turn
                seen["ready_at"] = now
                phase, phase_start = "held", now
            elif name == "train_start":
                seen["startup_seconds"] = now - started
                phase, phase_start = "train", now
            elif name == "eval_start" and phase == "train":
                seen["train_seconds"] = now - phase_start
                seen["eval_started"] = now
                phase, phase_start = "eval", now
            elif name == "result":
                seen["result_at"] = now
            elif name == "refused":  # the scorer caught the model cheating
                seen.setdefault("error", f"{REFUSED}{event.get('reason', '')}")
            elif name == "export_failed":
                seen.setdefault(
                    "error",
                    f"the model cannot be exported for scoring: {event.get('reason', '')}",
                )
            seen[name] = event
            on_event(
                {
                    **event,
                    "phase": "eval" if phase == "score" else phase,
                    "runner_elapsed": now - phase_start,
                }
            )
    seen["returncode"], seen["rss_mb"] = reap(proc)
    return seen


def reap(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for the process; its exit code and its own peak resident memory in MiB."""
    if proc.returncode is not None:
        return proc.returncode, 0.0
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024  # Linux reports KiB
