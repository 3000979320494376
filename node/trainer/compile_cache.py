"""A node's compiled kernels (torch.compile's Inductor and Triton caches, and the CUDA driver's
cache of kernels it compiles from PTX at load), kept between runs.

A cold torch.compile is most of a gpu run's start-up. Each run gets a private copy of the
node's store, writable, in its run folder; only a run of code the node trusts hands what it
compiled back. Never let a stranger's run write the store: Inductor's entries are pickles and
Triton's are binaries, so a planted entry would run inside, and bias, a later run of another
version.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
from pathlib import Path

RUN_FOLDER = "compiled"  # inside a run folder: the run's own copy
# Where a sandboxed run sees its copy: one path for every run, because Inductor's entries name
# the folder they were compiled in.
IN_SANDBOX = "/tmp/compiled"
MAX_STORE_BYTES = 2 << 30  # past it the store is emptied, and fills again from the next runs
MAX_ENTRY_BYTES = 256 << 20  # a larger file is not kept
# Locks and half-written files are never kept: a lent lock the run cannot open would stop it.
SKIPPED_NAMES = ("locks",)
SKIPPED_SUFFIXES = (".lock", ".tmp", ".part")
# Lent as the run's own writable copies, never as links: the CUDA driver rewrites its cache's
# index in place, and cannot use a cache it cannot write.
OWN_COPIES = ("nv",)


def environment(folder: str | Path) -> dict[str, str]:
    """What points torch.compile (Inductor, and Triton under it) and the CUDA driver's PTX cache
    at the store in `folder`. Without the last, every gpu run compiles the same library kernels
    again (about 20 of them, 1.2 MB, each run on the H200)."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor",
        "TRITON_CACHE_DIR": f"{folder}/triton",
        "CUDA_CACHE_PATH": f"{folder}/nv",
    }


class CompileCache:
    """The store of one node, shared by its workers (threads). `lend` before a run, `keep`
    after a trusted one, `release` always."""

    def __init__(self, root: Path, max_bytes: int = MAX_STORE_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.root.mkdir(parents=True, exist_ok=True)

    def lend(self, run_dir: Path, uid: int | None = None) -> Path:
        """Copy the store into `run_dir`; the copy's folder (bind it at IN_SANDBOX).

        For a sandbox that runs as its own `uid`, files are hard links (that uid cannot write
        files it does not own) in folders it owns, except in OWN_COPIES, where that uid gets
        copies of its own; a sandbox running as this user gets copies.
        """
        target = Path(run_dir) / RUN_FOLDER

        def lend_file(source: str, copy: str) -> None:
            if uid is None:
                shutil.copy2(source, copy)
            elif Path(copy).relative_to(target).parts[0] in OWN_COPIES:
                shutil.copyfile(source, copy)
                os.chown(copy, uid, uid)
            else:
                os.link(source, copy)

        shutil.rmtree(target, ignore_errors=True)
        with self._lock:
            try:
                shutil.copytree(self.root, target, copy_function=lend_file)
            except (OSError, shutil.Error):  # a full disk, a file system without links: start cold
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir()
        if uid is not None:
            for folder, _, _ in os.walk(target):
                os.chown(folder, uid, uid)
        return target

    def keep(self, run_dir: Path) -> int:
        """Add the files a trusted run compiled (those the store lacks) to the store; bytes added.

        Existing entries are never replaced, links are not followed, and the store is emptied
        when it passes its limit."""
        source = Path(run_dir) / RUN_FOLDER
        added = 0
        with self._lock:
            for folder, dirs, files in os.walk(source):
                dirs[:] = [d for d in dirs if d not in SKIPPED_NAMES]
                relative = Path(folder).relative_to(source)
                for name in files:
                    if name.endswith(SKIPPED_SUFFIXES):
                        continue
                    target = self.root / relative / name
                    if not os.path.lexists(target):
                        added += _add_file(Path(folder) / name, target)
            if added and self.size() > self.max_bytes:
                self.clear()
        return added

    @staticmethod
    def release(run_dir: Path) -> None:
        """Remove a run's copy: run folders are kept, their compiled kernels need not be."""
        shutil.rmtree(Path(run_dir) / RUN_FOLDER, ignore_errors=True)

    def size(self) -> int:
        return sum(
            (Path(folder) / name).lstat().st_size
            for folder, _, files in os.walk(self.root)
            for name in files
        )

    def clear(self) -> None:
        """Empty the store (it refills from the next trusted runs)."""
        trash = self.root.with_name(self.root.name + ".old")
        shutil.rmtree(trash, ignore_errors=True)
        self.root.rename(trash)
        self.root.mkdir()
        shutil.rmtree(trash, ignore_errors=True)


def _add_file(source: Path, target: Path) -> int:
    """Copy one plain file into the store, read-only, appearing whole or not at all; its size."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return 0
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(src.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ENTRY_BYTES:
            return 0
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.part")
        with partial.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        partial.chmod(0o444)
        partial.replace(target)
        return info.st_size
