"""The harness: the data, the clock and the score that `train.py` gets, and never edits.

The runner starts `python -m node.trainer.harness CONFIG` in a fresh working directory. The
harness seeds everything, then runs `train.py`, which asks `session()` for its batches and hands
its model to `Session.finish`, where the harness (not `train.py`) computes val_bpb. Events go to
the runner on a pipe of their own; the runner keeps its own clock and does not trust them.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

PROGRESS_EVERY = 1.0  # seconds between progress events
_SESSION: Session | None = None


def session() -> Session:
    """The running experiment's session; `train.py` calls this once at its top."""
    if _SESSION is None:
        raise RuntimeError("train.py runs inside the harness: use `swarm run --train-py train.py`, not python directly")
    return _SESSION


class Session:
    """What `train.py` may use: profile facts, seeded batches, the time left, and `finish`."""

    def __init__(self, config: dict, status: int | None) -> None:
        self.config = config
        self.profile_name: str = config["profile"]["name"]
        self.seq_len: int = config["profile"]["seq_len"]
        self.vocab_size: int = config["data"]["vocab_size"]
        self.budget_seconds: float = config["profile"]["budget_seconds"]
        self.seed: int = config["seed"]
        self.device = torch.device(config["profile"]["device"])
        self._status = status
        self._warmup = config["profile"]["warmup_batches"]
        self._train = np.memmap(config["data"]["train_path"], dtype=np.uint16, mode="r")
        self._rng = np.random.default_rng(self.seed)
        self._clock_start: float | None = None
        self._last_progress = 0.0
        self.steps = 0
        self.tokens = 0
        self.warmup_tokens = 0
        self.train_seconds = 0.0
        self.finished = False

    # -- events to the runner ----------------------------------------------------------------
    def _emit(self, event: str, **fields) -> None:
        if self._status is not None:
            os.write(self._status, (json.dumps({"event": event, **fields}) + "\n").encode())

    # -- the clock ---------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds of the budget spent: zero until the first counted batch."""
        return 0.0 if self._clock_start is None else time.perf_counter() - self._clock_start

    def progress(self) -> float:
        """Share of the training budget spent, from 0 to 1: drive schedules with it."""
        return min(self.elapsed() / self.budget_seconds, 1.0)

    # -- data --------------------------------------------------------------------------------
    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Training batches (inputs, targets), each `batch_size` x `seq_len`, until the budget ends.

        The first `warmup_batches` are untimed, so compilation costs every version the same;
        the clock starts when the next one is asked for, and the batches stop when it runs out.
        """
        span = self.seq_len + 1
        starts_per_epoch = (len(self._train) - 1) // span
        if starts_per_epoch < batch_size:
            raise ValueError(f"batch of {batch_size} sequences is larger than the training data")
        order = self._rng.permutation(starts_per_epoch)
        cursor = 0
        pinned = self.device.type == "cuda"
        while True:
            if self.steps == self._warmup:
                if self._clock_start is None:
                    self._sync()
                    self._clock_start = time.perf_counter()
                    self.warmup_tokens = self.tokens
                    self._emit("train_start", warmup_tokens=self.tokens)
            if self._clock_start is not None and self.elapsed() >= self.budget_seconds:
                break
            if cursor + batch_size > len(order):
                order, cursor = self._rng.permutation(starts_per_epoch), 0
            rows = np.sort(order[cursor:cursor + batch_size]) * span
            cursor += batch_size
            chunk = np.stack([self._train[r:r + span] for r in rows]).astype(np.int64)
            tensor = torch.from_numpy(chunk)
            if pinned:
                tensor = tensor.pin_memory().to(self.device, non_blocking=True)
            self.steps += 1
            self.tokens += batch_size * self.seq_len
            self._maybe_progress()
            yield tensor[:, :-1], tensor[:, 1:]
        self._sync()
        self.train_seconds = self.elapsed()
        self._emit("train_end", steps=self.steps, tokens=self.tokens, warmup_tokens=self.warmup_tokens,
                   train_seconds=self.train_seconds)

    def _maybe_progress(self) -> None:
        now = time.perf_counter()
        if now - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = now
            self._emit("progress", steps=self.steps, tokens=self.tokens, elapsed=self.elapsed(),
                       progress=self.progress())

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # -- the score ---------------------------------------------------------------------------
    def finish(self, model: torch.nn.Module) -> None:
        """Hand over the trained model: the harness scores it on validation data and reports."""
        if self.finished:
            raise RuntimeError("session.finish() was called twice")
        if self._clock_start is None:
            raise RuntimeError("train.py finished before its budget started: iterate session.batches() to the end")
        self.finished = True
        self._emit("eval_start")
        flops = flops_per_token(model, self.seq_len, self.device)
        was_training = model.training
        model.eval()
        try:
            score = evaluate_bpb(model, self.config["data"]["val_path"], self.config["data"]["token_bytes_path"],
                                 self.seq_len, self.config["profile"]["eval_tokens"], self.device)
        except LookAheadError as exc:
            self._emit("refused", reason=str(exc))
            raise
        model.train(was_training)
        peak = torch.cuda.max_memory_allocated() / 2**20 if self.device.type == "cuda" else None
        self._emit("result", **score, flops_per_token=flops, peak_memory_mb=peak,
                   params=sum(p.numel() for p in model.parameters()),
                   device_name=torch.cuda.get_device_name() if self.device.type == "cuda" else "cpu")


def flops_per_token(model: torch.nn.Module, seq_len: int, device: torch.device) -> float:
    """Training FLOPs per token (forward + backward), counted by torch on one sequence."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, seq_len, dtype=torch.long, device=device)
    counter = FlopCounterMode(display=False)
    with counter, torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(x)
        logits.float().sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / seq_len


class LookAheadError(RuntimeError):
    """The model's predictions depend on tokens after the one being predicted."""


def check_causal(model: torch.nn.Module, x: torch.Tensor, logits: torch.Tensor, tolerance: float = 1e-3) -> None:
    """Change every token after a cut and require the predictions up to the cut to stay the same.

    Done on the first scored batch itself, in the same mode and precision as the scoring, so a
    model cannot tell the check from the evaluation.
    """
    cut = x.size(1) // 2
    changed = x.clone()
    changed[:, cut + 1:] = (x[:, cut + 1:] + 1 + torch.randint_like(x[:, cut + 1:], 1000)) % logits.size(-1)
    before = logits[:, :cut + 1].float()
    if not torch.isfinite(before).all():
        return  # a diverged model: the score itself will say so
    moved = (model(changed)[:, :cut + 1].float() - before).abs().max().item()
    if not moved <= tolerance * (1 + before.abs().max().item()):
        raise LookAheadError(f"the model looks ahead: its predictions up to position {cut} changed by {moved:.3g} "
                             f"when only later tokens changed; a language model may use past tokens only")


@torch.no_grad()
def evaluate_bpb(model: torch.nn.Module, val_path: str, token_bytes_path: str, seq_len: int,
                 eval_tokens: int, device: torch.device, batch_size: int = 0) -> dict:
    """Bits per byte of `model` on the first `eval_tokens` validation targets.

    Sum of per-target cross-entropy in nats, over ln 2 times the UTF-8 bytes those targets
    stand for (from each token's raw bytes); targets that are special tokens (0 bytes) are
    left out of both sums. The model maps (B, T) token ids to (B, T, vocab) logits.
    """
    tokens = np.memmap(val_path, dtype=np.uint16, mode="r")
    token_bytes = torch.from_numpy(np.load(token_bytes_path)).to(device)
    rows = min(eval_tokens // seq_len, (len(tokens) - 1) // seq_len)
    if rows < 1:
        raise ValueError("validation split is shorter than one sequence")
    batch_size = batch_size or max(1, min(rows, (2**17 if device.type == "cuda" else 2**14) // seq_len))
    nats = torch.zeros((), dtype=torch.float64, device=device)
    nbytes = torch.zeros((), dtype=torch.int64, device=device)
    for first in range(0, rows, batch_size):
        count = min(batch_size, rows - first)
        flat = np.asarray(tokens[first * seq_len:(first + count) * seq_len + 1], dtype=np.int64)
        x = torch.from_numpy(np.lib.stride_tricks.sliding_window_view(flat[:-1], seq_len)[::seq_len].copy())
        y = torch.from_numpy(np.lib.stride_tricks.sliding_window_view(flat[1:], seq_len)[::seq_len].copy())
        x, y = x.to(device), y.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x)
            if first == 0:
                check_causal(model, x, logits)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
        weight = token_bytes[y.flatten()]
        counted = weight > 0
        nats += loss[counted].double().sum()
        nbytes += weight[counted].sum()
    total_nats, total_bytes = nats.item(), int(nbytes.item())
    bpb = total_nats / (math.log(2) * total_bytes) if total_bytes else float("nan")
    return {"val_bpb": bpb, "eval_tokens": rows * seq_len, "eval_bytes": total_bytes, "eval_nats": total_nats}


def main(config_path: str) -> int:
    global _SESSION
    config = json.loads(Path(config_path).read_text())
    status = int(os.environ["SWARM_STATUS_FD"]) if "SWARM_STATUS_FD" in os.environ else None
    torch.manual_seed(config["seed"])
    np.random.seed(config["seed"] % 2**32)
    if config["profile"]["device"] == "cpu" and config["profile"]["threads"]:
        torch.set_num_threads(config["profile"]["threads"])
    _SESSION = Session(config, status)
    _SESSION._emit("started", pid=os.getpid())
    train_py = config["train_py"]
    sys.argv = [train_py]
    runpy.run_path(train_py, run_name="__main__")
    if not _SESSION.finished:
        print("train.py ended without calling session().finish(model): no score", file=sys.stderr)
        return 3
    # The score is out: skip interpreter teardown (compile workers, CUDA context), which is
    # seconds of wall time that no experiment needs.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    # Run under the module's real name, so that train.py's `import` finds this same session.
    from node.trainer import harness

    sys.exit(harness.main(sys.argv[1]))
