"""The sandbox around every run of `train.py` and of the scorer: bubblewrap on Linux, a clean environment always.

Inside: no network, the system and Python read-only, the harness's code and the run's data files
read-only, a private working directory and /tmp, no home directory (so no key, ledger or logs),
its own process and /proc namespace, and an environment with no secrets. A node running as root
runs the sandboxed process as an unprivileged user id of its own, with no capabilities, so that
the limits on processes, file size and (on the CPU) memory bind it. Never bind anything the run
does not need.
"""

from __future__ import annotations

import functools
import os
import resource
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

MAX_FILE_BYTES = 1 << 30  # the log and any file train.py writes; past it the run is killed
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "passwd",
    "group",
    "nsswitch.conf",
)
PASSED_ENV = ("LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
# A root node runs each sandbox as a fresh uid above this, one no account uses.
SANDBOX_UID_BASE = 1 << 30
# Processes and threads one run may have (compile workers too).
MAX_TASKS = 512 + 32 * (os.cpu_count() or 1)


@functools.cache
def sandbox_available() -> bool:
    """True when bubblewrap is installed and can make namespaces on this machine."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    probe = subprocess.run(
        [bwrap, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


def clean_environment(extra: dict[str, str]) -> dict[str, str]:
    """What the run may see of the environment: no API keys, no tokens, no home."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    env.update(extra)
    return env


def _bind(path: Path, writable: bool = False) -> list[str]:
    if path.is_symlink() and str(path) in SYSTEM_DIRS:  # merged /usr: /bin -> usr/bin
        return ["--symlink", os.readlink(path), str(path)]
    return ["--bind" if writable else "--ro-bind", str(path), str(path)]


def sandbox_uid() -> int | None:
    """A fresh unprivileged uid for one sandboxed process, when this node runs as root (else None).

    Root is exempt from the process limit and holds capabilities that lift the others, so a root
    node drops to a uid of its own for each run: `setpriv` inside the sandbox, after bubblewrap
    has set up the mounts. A node that is not root runs as itself.
    """
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    return SANDBOX_UID_BASE + secrets.randbelow(1 << 30)


def bwrap_command(
    cmd: list[str], run_dir: Path | None, read_only: list[Path], device: str, uid: int | None = None,
    binds: dict[str, Path] | None = None,
) -> list[str]:  # fmt: skip
    """`cmd` wrapped in bubblewrap: only the listed paths, the run folder (if any) and `binds`
    (a path under /tmp inside -> a folder outside) writable.

    With `uid`, bubblewrap (running as root) makes no user namespace, and `cmd` runs as `uid`
    with no capabilities and no way to gain any (bubblewrap sets no_new_privs).
    """
    namespaces = (
        ["--unshare-all"]
        if uid is None
        else [
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]
    )
    args = [
        shutil.which("bwrap") or "bwrap",
        *namespaces,
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
    ]
    for name in SYSTEM_DIRS:
        if Path(name).exists():
            args += _bind(Path(name))
    args += ["--perms", "0755", "--dir", "/etc"]  # else 0700: the sandbox's uid could read none of it
    for name in ETC_FILES:
        if (Path("/etc") / name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    python_dirs = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.prefix)}
    bound = [
        p
        for p in sorted(python_dirs | set(read_only))
        if not str(p).startswith(tuple(d + "/" for d in SYSTEM_DIRS))
    ]
    bound_all = bound + ([run_dir] if run_dir is not None else [])
    # The folders above each bound path, made traversable: bubblewrap makes them 0700, which
    # would shut out the unprivileged uid a root node runs the sandbox as.
    for parent in sorted({a for p in bound_all for a in p.parents if a != Path("/")}):
        args += ["--perms", "0755", "--dir", str(parent)]
    for path in bound:
        args += ["--ro-bind", str(path), str(path)]
    if device == "cuda":
        args += ["--ro-bind-try", "/sys", "/sys"]
        for node in sorted(Path("/dev").glob("nvidia*")):
            args += ["--dev-bind", str(node), str(node)]
    if run_dir is not None:
        args += [*_bind(run_dir, writable=True), "--chdir", str(run_dir)]
    else:
        args += ["--chdir", "/tmp"]
    for inside, folder in (binds or {}).items():
        args += ["--bind", str(folder), inside]
    if uid is not None:
        cmd = [
            shutil.which("setpriv") or "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            *cmd,
        ]
    return [*args, "--", *cmd]


def processes_of(uid: int) -> list[int]:
    """Process ids that `uid` owns now."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def end_processes_of(uid: int, timeout: float = 10.0) -> None:
    """Kill every process of a sandbox's own uid and wait until none is left.

    bubblewrap's outer process can exit a moment before its process namespace is torn down,
    so a run's processes may still live when the runner has reaped it. A process of that uid
    sends the kill to all of them at once (kill -1), which a fork bomb cannot outrun.
    """
    end = time.monotonic() + timeout
    while processes_of(uid) and time.monotonic() < end:
        subprocess.run(
            [
                shutil.which("setpriv") or "setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--",
                "/bin/sh",
                "-c",
                "kill -KILL -1",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        time.sleep(0.05)


def tasks_of(uid: int) -> int:
    """Processes and threads that `uid` runs now (what the kernel counts against RLIMIT_NPROC)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = entry.stat()
                if stat.st_uid == uid:
                    count += sum(1 for _ in (entry / "task").iterdir())
            except OSError:
                continue
    return count


def limit_resources(device: str, tasks: int | None = None) -> None:
    """Run in the child before exec: cap file size, drop core dumps, cap memory on the CPU, and
    cap processes and threads at `tasks` (counted per user id, so binding only a uid other than 0).
    """
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if tasks is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
    if device == "cpu":  # CUDA reserves far more address space than it uses: no cap there
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        cap = int(memory * 0.75)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def task_limit(uid: int | None) -> int | None:
    """RLIMIT_NPROC for a sandboxed process: MAX_TASKS of its own uid, or on top of what this
    (non-root) user already runs; None for root without a uid to drop to (it would not bind)."""
    if uid is not None:
        return MAX_TASKS
    if os.geteuid() == 0:
        return None
    return MAX_TASKS + tasks_of(os.geteuid())
