"""The scorer: val_bpb of a trained model, in a process of its own that never runs `train.py`.

The runner starts `python -m node.trainer.scorer CONFIG` in a fresh sandbox after the training
process has exited. It reads the validation tokens from a memory file the runner filled (there
is no validation file on its disk), loads the exported model with every door to code execution
closed, refuses a graph that could reach files or keep state, checks causality, and scores.
It must never import `train.py` or anything `train.py` could have written, but the model file.
"""

from __future__ import annotations

import importlib
import json
import math
import operator
import os
import secrets
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from node.trainer.causality import Checker, LookAheadError
from node.trainer.process import MAX_MODEL_BYTES

# Aten ops that read files or write to the console: a model has no business with either.
DENIED_OPS = {"from_file", "_print", "save", "load"}
# Python-level events the scorer refuses once the model file is being read (see `_close_doors`).
REFUSED_AUDIT_EVENTS = (
    "pickle.find_class",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "subprocess.Popen",
    "socket.",
    "ctypes.dlopen",
    "os.kill",
    "os.killpg",
)


class ModelRefused(RuntimeError):
    """The model file is not a program the scorer is willing to run."""


# ---------------------------------------------------------------------------------------------
# Loading a file that untrusted code wrote


def _refuse_event(event: str, _args: tuple) -> None:
    if event.startswith(REFUSED_AUDIT_EVENTS):
        raise ModelRefused(f"the model file tried {event!r} while loading or running")


def _close_doors() -> None:
    """Shut the ways a crafted .pt2 could run code: pickle, torchbind objects, sympy's eval.

    torch.export.load falls back to full pickle for some payloads and parses symbolic shapes
    with sympy (which evaluates strings). A static, plain-tensor export needs none of that.
    """
    import sympy

    sys.addaudithook(_refuse_event)  # cannot be removed once added
    plain_load = torch.load

    def weights_only_load(*args, **kwargs):
        kwargs["weights_only"] = True
        return plain_load(*args, **kwargs)

    def refused(*_args, **_kwargs):
        raise ModelRefused("the model file holds pickled objects or symbolic expressions")

    torch.load = weights_only_load
    torch._C._pickle_load_obj = refused
    sympy.sympify = refused


def _check_graph(program: torch.export.ExportedProgram) -> None:
    """Only aten tensor ops, no file or console ops, and no state carried from one call to the next.

    torch.export keeps in-place ops in its graph, so a write is refused when it lands on a
    parameter, a buffer, a constant or the input, or on a view of one.
    """
    if len(program.graph_signature.user_inputs) != 1:
        raise ModelRefused(
            f"the model takes {len(program.graph_signature.user_inputs)} inputs; it must take the tokens only"
        )
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        state: set = set()  # nodes that are, or view, what outlives one call
        for node in graph.nodes if graph is not None else ():
            if node.op in ("placeholder", "get_attr"):
                state.add(node)
            elif node.op == "call_function":
                _check_op(node.target)
                _check_writes(node, state)
            elif node.op in ("call_module", "call_method"):
                raise ModelRefused(
                    f"the model's graph calls {node.op} {node.target!r}; only aten ops are allowed"
                )


def _check_op(target) -> None:
    if target is operator.getitem:
        return
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        raise ModelRefused(
            f"the model calls {target!r}; only aten ops are allowed in a scored model"
        )
    name = target._schema.name.split("::")[-1]
    if name in DENIED_OPS or any(
        "file" in a.name or "path" in a.name for a in target._schema.arguments
    ):
        raise ModelRefused(f"the model calls aten.{name}, which reaches files or the console")


def _flat(value) -> list:
    if isinstance(value, (list, tuple)):
        return [item for inner in value for item in _flat(inner)]
    return [value] if isinstance(value, torch.fx.Node) else []


def _check_writes(node: torch.fx.Node, state: set) -> None:
    """Refuse a write into state; mark `node` as state when it is a view of state."""
    if node.target is operator.getitem:
        if node.args[0] in state:
            state.add(node)
        return
    schema = node.target._schema
    named = dict(zip((a.name for a in schema.arguments), node.args, strict=False)) | dict(
        node.kwargs
    )
    for argument in schema.arguments:
        written = argument.alias_info is not None and argument.alias_info.is_write
        if written and any(v in state for v in _flat(named.get(argument.name))):
            raise ModelRefused(
                f"the model writes into its own weights, buffers or input ({node.target}); "
                "a scored model must be a pure function of its tokens"
            )
    if any(r.alias_info is not None for r in schema.returns) and any(
        v in state for v in _flat(list(named.values()))
    ):
        state.add(node)


def load_model(path: str, device: torch.device) -> tuple[torch.nn.Module, int]:
    """The exported program at `path` as a callable module, and its parameter count."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_MODEL_BYTES:
            raise ModelRefused(
                f"the model file is {size / 2**30:.1f} GiB, over the limit of {MAX_MODEL_BYTES >> 30} GiB"
            )
        _close_doors()
        try:
            program = torch.export.load(f)
        except ModelRefused:
            raise
        except Exception as exc:
            raise ModelRefused(
                f"the model file does not load as an exported program: {type(exc).__name__}: "
                f"{str(exc)[:300]}"
            ) from exc
    _check_graph(program)
    params = sum(p.numel() for p in program.parameters())
    return program.module().to(device), params


# ---------------------------------------------------------------------------------------------
# The score


@torch.no_grad()
def evaluate_bpb(
    model,
    tokens: np.ndarray,
    token_bytes: np.ndarray,
    seq_len: int,
    rows: int,
    batch_size: int,
    device: torch.device,
    check: Checker | None = None,
) -> dict:
    """Bits per byte of `model` on the first `rows` sequences of `tokens` (their targets).

    Sum of per-target cross-entropy in nats, over ln 2 times the UTF-8 bytes those targets
    stand for (from each token's raw bytes); targets that are special tokens (0 bytes) are
    left out of both sums. The model maps (batch_size, seq_len) token ids to logits; a last
    batch that is short is padded with copies of its first row, which are not counted. `check`
    checks every scored batch for look-ahead once the score is known to be finite.
    """
    table = torch.from_numpy(np.asarray(token_bytes, dtype=np.int64)).to(device)
    nats = torch.zeros((), dtype=torch.float64, device=device)
    nbytes = torch.zeros((), dtype=torch.int64, device=device)
    for first in range(0, rows, batch_size):
        count = min(batch_size, rows - first)
        flat = np.asarray(tokens[first * seq_len : (first + count) * seq_len + 1], dtype=np.int64)
        x = torch.from_numpy(flat[:-1].reshape(count, seq_len).copy())
        y = torch.from_numpy(flat[1:].reshape(count, seq_len).copy())
        if count < batch_size:
            x = torch.cat([x, x[:1].expand(batch_size - count, -1)])
        batch = x.numpy()
        x, y = x.to(device), y.to(device)
        logits = model(x)  # no autocast: the exported graph holds its own dtypes
        if not isinstance(logits, torch.Tensor) or logits.shape[:2] != x.shape or logits.dim() != 3:
            raise ModelRefused(
                f"the model returned {type(logits).__name__} "
                f"{tuple(getattr(logits, 'shape', ()))}; it must return (batch, seq, vocab) logits"
            )
        loss = F.cross_entropy(logits[:count].float().flatten(0, 1), y.flatten(), reduction="none")
        weight = table[y.flatten()]
        counted = weight > 0
        nats += loss[counted].double().sum()
        nbytes += weight[counted].sum()
        if check is not None and math.isfinite(nats.item()):  # a diverged model: no score anyway
            check.check_batch(first, batch, logits)
    total_nats, total_bytes = nats.item(), int(nbytes.item())
    bpb = total_nats / (math.log(2) * total_bytes) if total_bytes else float("nan")
    return {
        "val_bpb": bpb,
        "eval_tokens": rows * seq_len,
        "eval_bytes": total_bytes,
        "eval_nats": total_nats,
    }


def exhaustive_rows(rows: int, seq_len: int) -> int:
    """Rows checked at every position: about one evaluation's worth of tokens (a row costs
    seq_len variants of seq_len tokens), at least one."""
    return max(1, round(rows / seq_len))


def _read_fd(fd: int, count: int, dtype) -> np.ndarray:
    """`count` items of `dtype` from the start of the memory file `fd`, which is then closed."""
    with os.fdopen(fd, "rb") as f:
        data = f.read(count * np.dtype(dtype).itemsize)
    return np.frombuffer(data, dtype=dtype)


def main(config_json: str) -> int:
    config = json.loads(config_json)
    status = int(os.environ["SWARM_STATUS_FD"])

    def emit(event: str, **fields) -> None:
        os.write(status, (json.dumps({"event": event, **fields}) + "\n").encode())

    device = torch.device(config["device"])
    if config["device"] == "cpu" and config["threads"]:
        torch.set_num_threads(config["threads"])
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(config["gpu_memory_fraction"])
        # The program was exported in float32 (autocast over it breaks its dtype checks); TF32
        # matmuls run it twice as fast (H200). A row's TF32 rounding moved with its slot in the
        # batch (0.0016 nats on an H200), not with the other rows' tokens, so the look-ahead
        # check compares each row at the slot it was scored at.
        torch.backends.cuda.matmul.allow_tf32 = True
    seq_len, rows, batch_size = config["seq_len"], config["rows"], config["batch_size"]
    tokens = _read_fd(config["tokens_fd"], rows * seq_len + 1, np.uint16)
    token_bytes = _read_fd(config["token_bytes_fd"], config["vocab_size"], np.int32)
    torch.manual_seed(config["seed"])
    # Started while the training process exports its model: import what loading needs, then
    # wait for the runner's word that the copy is in place (end of input: the run ended without).
    for module in ("sympy", "torch._export.serde.serialize"):
        importlib.import_module(module)

    if sys.stdin.readline().strip() != "go":
        return 4
    started = time.perf_counter()
    try:
        model, params = load_model(config["model"], device)
        loaded = time.perf_counter()
        checker = Checker(
            model, tokens[: rows * seq_len].reshape(rows, seq_len), batch_size,
            config["vocab_size"], device, np.random.default_rng(secrets.randbits(128)),
            exhaustive=exhaustive_rows(rows, seq_len),
        )  # fmt: skip
        score = evaluate_bpb(
            model, tokens, token_bytes, seq_len, rows, batch_size, device, check=checker
        )
    except (LookAheadError, ModelRefused) as exc:
        emit("refused", reason=str(exc))
        return 3
    emit(
        "result",
        **score,
        params=params,
        load_seconds=loaded - started,
        score_seconds=time.perf_counter() - loaded,
        check_seconds=checker.seconds,
        check_tokens=checker.checked_tokens,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
