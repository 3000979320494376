"""The harness: the data and the clock that `train.py` gets, and never edits.

The runner starts `python -m node.trainer.harness CONFIG` in a fresh working directory. The
harness seeds everything, then runs `train.py`, which asks `session()` for its batches and hands
its model to `Session.finish`, which exports it and ends the process; the scorer (another
process) computes val_bpb. This process never sees validation data. Events go to the runner on
a pipe of their own; the runner keeps its own clock and does not trust them.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

PROGRESS_EVERY = 1.0  # seconds between progress events
# What a run started ahead of its turn (`hold`) leaves free of the GPU's memory for the run that
# trains meanwhile, beyond what that run already holds.
HOLD_MARGIN_BYTES = 4 << 30
_SESSION: Session | None = None


def session() -> Session:
    """The running experiment's session; `train.py` calls this once at its top."""
    if _SESSION is None:
        raise RuntimeError(
            "train.py runs inside the harness: use `swarm run --train-py train.py`, not python directly"
        )
    return _SESSION


class Session:
    """What `train.py` may use: profile facts, seeded batches, the budget spent, and `finish`."""

    def __init__(self, config: dict, status: int | None) -> None:
        self.config = config
        self.profile_name: str = config["profile"]["name"]
        self.seq_len: int = config["profile"]["seq_len"]
        self.vocab_size: int = config["data"]["vocab_size"]
        self.seed: int = config["seed"]
        self.device = torch.device(config["profile"]["device"])
        self._budget: int = config["profile"]["budget_tokens"]
        self._envelope: float = config["profile"]["max_flops_per_token"]
        self._threads: int = config["profile"]["threads"]
        self._status = status
        self._warmup = config["profile"]["warmup_batches"]
        self._train = np.memmap(config["data"]["train_path"], dtype=np.uint16, mode="r")
        self._rng = np.random.default_rng(self.seed)
        self._clock_start: float | None = None
        self._cpu_start = 0.0  # the process's CPU time when the clock started
        self._last_progress = 0.0
        self._steps = 0
        self._tokens = 0
        self._warmup_tokens = 0
        self._last_batch = 0.0  # budget seconds spent when the last counted batch was served
        self._finished = False
        self._hold = bool(config.get("hold"))  # wait for the runner's word before the clock

    # What train.py reads of the count is a view: the counts are the harness's own.
    budget_tokens = property(lambda self: self._budget, doc="training budget: tokens after warm-up")
    max_flops_per_token = property(
        lambda self: self._envelope, doc="the model envelope: training FLOPs per token, at most"
    )
    steps = property(lambda self: self._steps, doc="batches served so far, warm-up included")
    tokens = property(lambda self: self._tokens, doc="tokens served so far, warm-up included")
    warmup_tokens = property(lambda self: self._warmup_tokens, doc="tokens of the warm-up")
    finished = property(lambda self: self._finished, doc="whether finish() was called")

    def counts(self) -> dict:
        """What the harness counted so far, for the runner's result."""
        return {
            "steps": self._steps,
            "tokens": self._tokens,
            "warmup_tokens": self._warmup_tokens,
            "train_seconds": self.elapsed(),
            "work_seconds": self.work_seconds(),
            "last_batch_seconds": self._last_batch,
        }

    # -- events to the runner ----------------------------------------------------------------
    def _emit(self, event: str, **fields) -> None:
        if self._status is not None:
            os.write(self._status, (json.dumps({"event": event, **fields}) + "\n").encode())

    # -- the clock ---------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds of the budget spent: zero until the first counted batch."""
        return 0.0 if self._clock_start is None else time.perf_counter() - self._clock_start

    def work_seconds(self) -> float:
        """The training's compute time: on a CPU the process's CPU seconds per thread (a busy
        machine stretches the wall clock, not these), on a GPU the wall clock."""
        if self._clock_start is None:
            return 0.0
        if self.device.type == "cuda":
            return self.elapsed()
        return (time.process_time() - self._cpu_start) / max(self._threads, 1)

    def timed_tokens(self) -> int:
        """Tokens of the budget served so far (the warm-up's are not the budget's)."""
        return 0 if self._clock_start is None else self._tokens - self._warmup_tokens

    def progress(self) -> float:
        """Share of the training budget spent, from 0 to 1, in tokens served: drive schedules
        with it, and they run the same on any machine under any load."""
        return min(self.timed_tokens() / self._budget, 1.0)

    # -- data --------------------------------------------------------------------------------
    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Training batches (inputs, targets), each `batch_size` x `seq_len`, until the budget ends.

        The first `warmup_batches` are outside the budget, so that compilation costs every
        version the same, and hold uniformly random tokens, not text: training on them learns
        nothing about the data. The budget's batches follow until `budget_tokens` were served
        (the last batch may pass it by less than one batch). The clock starts with the first
        of them and stops only at `finish()`: work after the last batch is timed, and bounded.
        """
        span = self.seq_len + 1
        starts_per_epoch = (len(self._train) - 1) // span
        if starts_per_epoch < batch_size:
            raise ValueError(f"batch of {batch_size} sequences is larger than the training data")
        order = self._rng.permutation(starts_per_epoch)
        noise = np.random.default_rng([self.seed, 1])  # the warm-up's tokens: never the data's
        cursor = 0
        pinned = self.device.type == "cuda"
        while True:
            if self._steps >= self._warmup and self._clock_start is None:
                self._sync()
                if self._hold:
                    self._wait_for_turn()
                self._clock_start = time.perf_counter()
                self._cpu_start = time.process_time()
                self._warmup_tokens = self._tokens
                self._emit("train_start", warmup_tokens=self._tokens)
            if self._clock_start is not None and self.timed_tokens() >= self._budget:
                break
            if self._clock_start is None:
                chunk = noise.integers(0, self.vocab_size, size=(batch_size, span), dtype=np.int64)
            else:
                if cursor + batch_size > len(order):
                    order, cursor = self._rng.permutation(starts_per_epoch), 0
                rows = np.sort(order[cursor : cursor + batch_size]) * span
                cursor += batch_size
                chunk = np.stack([self._train[r : r + span] for r in rows]).astype(np.int64)
                self._last_batch = self.elapsed()
            tensor = torch.from_numpy(chunk)
            if pinned:
                tensor = tensor.pin_memory().to(self.device, non_blocking=True)
            self._steps += 1
            self._tokens += batch_size * self.seq_len
            self._maybe_progress()
            yield tensor[:, :-1], tensor[:, 1:]
        self._sync()
        self._emit("train_end", **self.counts())

    def _wait_for_turn(self) -> None:
        """A run started while another trains on the GPU (runner.GpuTurns) waits here, compiled
        and warmed up, until the runner says the GPU is its own (a byte on stdin); the budget's
        clock starts after."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the warm-up's activations, back to the run that trains
        self._emit("ready")
        if not os.read(0, 1):  # the runner is gone
            _exit(5)
        if self.device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(
                self.config["profile"]["gpu_memory_fraction"]
            )

    def _maybe_progress(self) -> None:
        now = time.perf_counter()
        if now - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = now
            self._emit(
                "progress", **self.counts(), elapsed=self.elapsed(), progress=self.progress()
            )

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # -- the hand-over ---------------------------------------------------------------------
    def finish(self, model: torch.nn.Module) -> None:
        """Hand over the trained model and end the training process: the scorer takes it from here.

        The harness counts its FLOPs, exports it (the uncompiled module, at the evaluation's
        input shape) to the run folder, reports, and exits; nothing after this call runs.
        """
        if self._finished:
            raise RuntimeError("session.finish() was called twice")
        if self._clock_start is None:
            raise RuntimeError(
                "train.py finished before its budget started: iterate session.batches() to the end"
            )
        self._sync()
        self._finished = True
        self._emit("eval_start", **self.counts())  # the clock stops here, not at the last batch
        model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: export what it wraps
        # Modules compiled in place (Module.compile) run eager from here: new input shapes would
        # compile them again, seconds spent on nothing the score needs.
        with torch.compiler.set_stance("force_eager"):
            flops = flops_per_token(model, self.seq_len, self.device)
        model.eval()
        started = time.perf_counter()
        try:
            with torch.compiler.set_stance("force_eager"):
                export_model(
                    model,
                    self.config["eval"]["batch_size"],
                    self.seq_len,
                    self.device,
                    self.config["eval"]["model_path"],
                )
        except Exception as exc:  # any failure of torch.export: the run cannot be scored
            reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            print(f"the model cannot be exported for scoring: {reason}", file=sys.stderr)
            self._emit("export_failed", reason=reason[:500])
            _exit(4)
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated() / 2**20
        else:  # the process's own peak resident memory (Linux reports KiB)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self._emit(
            "exported",
            flops_per_token=flops,
            peak_memory_mb=peak,
            export_seconds=time.perf_counter() - started,
            device_name=device_class(self.device),
        )
        # Skip interpreter teardown (compile workers, CUDA context): seconds no experiment needs.
        _exit(0)


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def export_model(
    model: torch.nn.Module, batch_size: int, seq_len: int, device: torch.device, path: str
) -> None:
    """Save `model` as a torch.export program of one (batch_size, seq_len) token input, for the scorer."""
    example = torch.zeros(batch_size, seq_len, dtype=torch.long, device=device)
    with torch.no_grad():
        program = torch.export.export(model, (example,), strict=False)
    torch.export.save(program, path)


def device_class(device: torch.device) -> str:
    """What a replay must match to give the same val_bpb: the GPU's name, or on a CPU the
    vector instructions torch's kernels use (their sums round differently)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {torch.backends.cpu.get_cpu_capability()}"


def flops_per_token(model: torch.nn.Module, seq_len: int, device: torch.device) -> float:
    """Training FLOPs per token (forward + backward), counted by torch on one sequence, the
    standard way (PaLM's appendix B): every matrix product, and attention as 12 x its width x
    the context a layer (its two products forward, four backward; the causal mask's zeros and the
    kernels' recomputation not taken off or added), on a CPU as on a GPU."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def forward(query, key, value, *_args, **_kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    def backward(_grad_out, query, key, value, *_args, **_kwargs) -> int:
        return 2 * sdpa_flop_count(query, key, value)  # torch's own adds the scores' recompute

    aten = torch.ops.aten
    attention = {aten._scaled_dot_product_flash_attention_for_cpu: forward} | {
        op: backward
        for op in (
            aten._scaled_dot_product_flash_attention_for_cpu_backward,
            aten._scaled_dot_product_flash_attention_backward,
            aten._scaled_dot_product_efficient_attention_backward,
            aten._scaled_dot_product_cudnn_attention_backward,
        )
    }
    x = torch.zeros(1, seq_len, dtype=torch.long, device=device)
    counter = FlopCounterMode(display=False, custom_mapping=attention)
    with counter, torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(x)
        logits.float().sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / seq_len


def main(config_path: str) -> int:
    global _SESSION
    config = json.loads(Path(config_path).read_text())
    status = int(os.environ["SWARM_STATUS_FD"]) if "SWARM_STATUS_FD" in os.environ else None
    torch.manual_seed(config["seed"])
    np.random.seed(config["seed"] % 2**32)
    if config["profile"]["device"] == "cuda" and config["profile"].get("deterministic"):
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # before the first cuBLAS call
        torch.use_deterministic_algorithms(True, warn_only=True)
    if config["profile"]["device"] == "cpu" and config["profile"]["threads"]:
        torch.set_num_threads(config["profile"]["threads"])
    if config["profile"]["device"] == "cuda":  # before train.py exists; the policy forbids changing it
        fraction = config["profile"]["gpu_memory_fraction"]
        if config.get("hold"):  # another run trains on this GPU: take only what it leaves free
            free, total = torch.cuda.mem_get_info()
            fraction = min(fraction, max(free - HOLD_MARGIN_BYTES, 0) / total)
        torch.cuda.set_per_process_memory_fraction(fraction)
    _SESSION = Session(config, status)
    _SESSION._emit("started", pid=os.getpid())
    train_py = config["train_py"]
    sys.argv = [train_py]
    runpy.run_path(train_py, run_name="__main__")
    print("train.py ended without calling session().finish(model): no score", file=sys.stderr)
    return 3


if __name__ == "__main__":
    # Run under the module's real name, so that train.py's `import` finds this same session.
    from node.trainer import harness

    sys.exit(harness.main(sys.argv[1]))
