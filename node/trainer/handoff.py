"""The runner's end of the pipe to the scorer (`scorer.py`, the other end): the scorer's own
sandboxed process, started early, handed a copy of the exported model and the validation tokens
(in anonymous memory files, never on its disk), and followed to its score. It never runs
train.py and never reads a file the training process could swap for something else than a
plain file.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from node.trainer.data import TokenData
from node.trainer.process import MAX_MODEL_BYTES, PACKAGE, SCORER_EVENTS, Run
from node.trainer.sandbox import sandbox_uid

MODEL_FILE = "model.pt2"  # what the training process exports into its run folder for the scorer


class Scoring:
    """The scorer of one run: started while the model is exported, told to go once it is copied.

    It gets a folder of its own (read-only inside its sandbox) where the runner puts a copy of the
    model file, and the validation tokens in anonymous memory files.
    """

    def __init__(self, run: Run, data: TokenData, seed: int, rows: int, batch_size: int) -> None:
        self.run, self.data, self.process = run, data, None
        self.folder = Path(tempfile.mkdtemp(prefix="swarm-score-"))
        self.folder.chmod(0o755)
        self.go_fd = -1
        self.fds: tuple = ()
        self.config = {
            "model": str(self.folder / MODEL_FILE),
            "device": run.profile.device,
            "threads": run.profile.threads,
            "seed": seed,
            "seq_len": run.profile.seq_len,
            "rows": rows,
            "batch_size": batch_size,
            "gpu_memory_fraction": run.profile.gpu_memory_fraction,
        }

    def start(self) -> None:
        if self.process is not None:
            return
        profile = self.run.profile
        tokens = np.memmap(self.data.val_path, dtype=np.uint16, mode="r")
        token_bytes = np.load(self.data.token_bytes_path).astype(np.int32)
        self.fds = (
            memory_file(
                "val-tokens", tokens[: self.config["rows"] * profile.seq_len + 1].tobytes()
            ),
            memory_file("token-bytes", token_bytes.tobytes()),
        )
        config = {
            **self.config,
            "vocab_size": len(token_bytes),
            "tokens_fd": self.fds[0],
            "token_bytes_fd": self.fds[1],
        }
        cmd = [sys.executable, "-P", "-m", "node.trainer.scorer", json.dumps(config)]
        go_read, self.go_fd = os.pipe()
        try:
            self.process = self.run.start(
                cmd,
                [PACKAGE, self.folder],
                {"HOME": "/tmp"},
                sandbox_uid() if self.run.sandbox else None,
                cwd=self.folder,
                fds=self.fds,
                stdin=go_read,
            )
        finally:
            os.close(go_read)

    def score(self, run_dir: Path) -> dict:
        """Copy the exported model in, let the scorer go, and follow it to its result."""
        self.start()
        try:
            copy_regular_file(run_dir / MODEL_FILE, self.folder / MODEL_FILE, MAX_MODEL_BYTES)
        except OSError as exc:
            return {"error": f"no score: the exported model cannot be read: {exc.strerror or exc}"}
        try:
            os.write(self.go_fd, b"go\n")
        except BrokenPipeError:
            pass  # the scorer has died already: following it says how
        process, self.process = self.process, None
        return self.run.follow(process, SCORER_EVENTS, "score", time.monotonic())

    def close(self) -> None:
        if self.process is not None:
            self.run.stop(self.process)
            self.process = None
        for fd in (*self.fds, self.go_fd):
            if fd >= 0:
                os.close(fd)
        self.fds, self.go_fd = (), -1
        shutil.rmtree(self.folder, ignore_errors=True)


def memory_file(name: str, payload: bytes) -> int:
    """An anonymous in-memory file holding `payload`, rewound: how the scorer gets validation data."""
    fd = os.memfd_create(name, 0)
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def copy_regular_file(source: Path, target: Path, limit: int) -> None:
    """Copy `source` if it is a plain file (not a link, not a device) of at most `limit` bytes."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(src.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise OSError(f"{source.name} is not a plain file of at most {limit >> 30} GiB")
        with target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
