"""The sandbox around every run of `train.py`: bubblewrap on Linux, and a clean environment always.

Inside: no network, the system and Python read-only, the harness's code and the run's data files
read-only, a private working directory and /tmp, no home directory (so no key, ledger or logs),
its own process and /proc namespace, and an environment with no secrets. Limits on file size and,
on the CPU, memory. Never bind anything the run does not need.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

MAX_FILE_BYTES = 1 << 30  # the log and any file train.py writes; past it the run is killed
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group", "nsswitch.conf")
PASSED_ENV = ("LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS")


@functools.cache
def sandbox_available() -> bool:
    """True when bubblewrap is installed and can make namespaces on this machine."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    probe = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
                           capture_output=True, timeout=30)
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


def bwrap_command(cmd: list[str], run_dir: Path, read_only: list[Path], device: str) -> list[str]:
    """`cmd` wrapped in bubblewrap: only the listed paths, the run folder writable."""
    args = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for name in SYSTEM_DIRS:
        if Path(name).exists():
            args += _bind(Path(name))
    for name in ETC_FILES:
        if (Path("/etc") / name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    python_dirs = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.prefix)}
    for path in sorted(python_dirs | set(read_only)):
        if not any(str(path).startswith(d + "/") for d in SYSTEM_DIRS):
            args += ["--ro-bind", str(path), str(path)]
    if device == "cuda":
        args += ["--ro-bind-try", "/sys", "/sys"]
        for node in sorted(Path("/dev").glob("nvidia*")):
            args += ["--dev-bind", str(node), str(node)]
    args += [*_bind(run_dir, writable=True), "--chdir", str(run_dir)]
    return [*args, "--", *cmd]


def limit_resources(device: str) -> None:
    """Run in the child before exec: cap file size, drop core dumps, and cap memory on the CPU."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if device == "cpu":  # CUDA reserves far more address space than it uses: no cap there
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        cap = int(memory * 0.75)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
