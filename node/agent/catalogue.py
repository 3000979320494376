"""The catalogue of changes the offline proposer knows on a train.py: a step up and down of each
CAPITAL numeric constant and of its profile's row of the model-size table, the known-good edits
of code, and those applied together (`combined`).

A change is a `Step` (one line of a constant, rewritten) or a known edit (a text replaced where
it occurs once); `single_changes` names each by the description a result carries.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from node.trainer import policy

SKIP_CONSTANTS = frozenset({"LOG_EVERY", "COMPILE"})  # no effect on what the model learns
FLOAT_FACTORS = (0.5, 0.7, 1.4, 2.0)
MAX_PAIRS = 400  # pairs of hyperparameter steps, tried once every single step was

# (description, text in the baseline, replacement): applied only where the text occurs once.
KNOWN_EDITS = (
    ("Warmdown over the last 60% of the budget, not 40%", "WARMDOWN = 0.4 ", "WARMDOWN = 0.6 "),
    ("Muon momentum 0.9 instead of 0.95", "MUON_MOMENTUM = 0.95 ", "MUON_MOMENTUM = 0.9 "),
    ("MLP ratio 3: a narrower MLP, a quarter fewer FLOPs per token", "MLP_RATIO = 4 ", "MLP_RATIO = 3 "),
    ("Logit softcap 30 instead of 15", "LOGIT_SOFTCAP = 15.0 ", "LOGIT_SOFTCAP = 30.0 "),
    ("Cosine warmdown instead of a linear one", "max(0.0, (1 - progress) / WARMDOWN)",
     "0.5 * (1 - math.cos(math.pi * max(0.0, (1 - progress) / WARMDOWN)))"),
    ("Learning rate falls to 10% of its peak, not to zero", "max(0.0, (1 - progress) / WARMDOWN)",
     "max(0.1, (1 - progress) / WARMDOWN)"),
    ("Learning-rate warm-up over the first 2% of the budget",
     "def lr_scale(progress):\n    return 1.0 if",
     "def lr_scale(progress):\n    if progress < 0.02:\n        return max(progress / 0.02, 0.05)\n"
     "    return 1.0 if"),
    ("GELU MLP instead of ReLU squared", "F.relu(self.up(x)).square()", "F.gelu(self.up(x))"),
    ("Four Newton-Schulz steps in Muon instead of five", "def orthogonalize(G, steps=5):",
     "def orthogonalize(G, steps=4):"),
    ("Muon without Nesterov: orthogonalize the momentum itself",
     'orthogonalize(grads.lerp_(buf, group["momentum"]))', "orthogonalize(buf)"),
)  # fmt: skip


def _fmt(value: float) -> str:
    text = f"{value:.4g}"
    if "e" in text and abs(value) >= 1:
        text = repr(float(text))
    return text if any(c in text for c in ".e") else text + ".0"


def _steps(value: int | float) -> list[int | float]:
    """Sensible neighbours of a hyperparameter value."""
    if isinstance(value, int):
        step = max(1, value // 4)
        return [v for v in (value - step, value + step) if v >= 1]
    if value <= 0:
        return []
    if 0.5 < value < 1:  # a share near 1 (momentum, beta): scale its distance from 1
        return [1 - (1 - value) * f for f in (0.5, 2.0) if (1 - value) * f < 1]
    return [value * f for f in FLOAT_FACTORS if value >= 1 or value * f < 1]


@dataclass(frozen=True)
class Step:
    description: str
    line: int  # 0-based line of the constant
    name: str
    new_line: str


def _values(value: ast.expr, profile: str | None) -> list[tuple[str, ast.expr]]:
    """(how a step names it, the expression) for each part of a constant's value a step may
    change: the value, each element of a tuple, and of `a if GPU else b` the branch the profile
    runs (both, named, when it is not known or the condition is another)."""
    if isinstance(value, ast.IfExp):
        if isinstance(value.test, ast.Name) and value.test.id == "GPU" and profile:
            return _values(value.body if profile == "gpu" else value.orelse, profile)
        cond = ast.unparse(value.test)
        return [(f" (if {cond}){n}", v) for n, v in _values(value.body, profile)] + [
            (f" (unless {cond}){n}", v) for n, v in _values(value.orelse, profile)
        ]
    if isinstance(value, ast.Tuple):
        return [(f"[{i}]", v) for i, v in enumerate(value.elts)]
    return [("", value)]


def _constants_of(source: str, profile: str | None) -> Iterator[tuple[str, str, ast.Constant]]:
    """(the step's name for it, the constant's name, its node) for each CAPITAL numeric constant
    (or tuple element) of train.py on one line; of one set per profile (`a if GPU else b`), the
    value `profile` runs (`_values`)."""
    for stmt in policy.parse(source).body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            continue
        target = stmt.targets[0]
        if (
            not (isinstance(target, ast.Name) and target.id.isupper())
            or target.id in SKIP_CONSTANTS
        ):
            continue
        for part, node in _values(stmt.value, profile):
            value = getattr(node, "value", None)
            if not isinstance(node, ast.Constant) or type(value) not in (int, float):
                continue
            if node.lineno == node.end_lineno:
                yield target.id + part, target.id, node


def hyperparameter_steps(source: str, profile: str | None = None) -> list[Step]:
    """One step per CAPITAL numeric constant (or tuple element) of train.py and neighbour value
    (`_constants_of`)."""
    lines = source.split("\n")
    out: list[Step] = []
    for name, constant, node in _constants_of(source, profile):
        raw = lines[node.lineno - 1].encode()  # ast's columns count UTF-8 bytes
        old_text = raw[node.col_offset : node.end_col_offset].decode()
        for new in _steps(node.value):
            text = str(new) if isinstance(new, int) else _fmt(new)
            if text == old_text:
                continue
            new_line = (
                raw[: node.col_offset] + text.encode() + raw[node.end_col_offset :]
            ).decode()
            out.append(Step(f"{name} {old_text} -> {text}", node.lineno - 1, constant, new_line))
    return out


def constant_values(source: str, profile: str) -> dict[str, float]:
    """What the steps move, by the name they give it: each constant's value (`_constants_of`)
    and each entry of the profile's row of the model-size table (`NAME@profile`)."""
    values = {name: float(node.value) for name, _, node in _constants_of(source, profile)}
    for names, row in rows_of(source, profile):
        values |= {f"{n}@{profile}": float(e.value) for n, e in _row_ints(names, row).items()}
    return values


def _row_steps(name: str, row: dict[str, int]) -> list[int]:
    """Neighbours of one entry of a profile's model-size row that keep the row valid."""
    value, head = row[name], row.get("HEAD_DIM")
    if name == "MODEL_DIM" and head:  # one attention head more or less
        return [v for v in (value - head, value + head) if v >= head]
    if name == "HEAD_DIM" and "MODEL_DIM" in row:  # the width must stay a whole number of heads
        return [v for v in (value // 2, value * 2) if v % 2 == 0 and row["MODEL_DIM"] % v == 0]
    if name in ("DEVICE_BATCH", "GRAD_ACCUM"):
        return [v for v in (value // 2, value * 2) if v >= 1 and v != value]
    return [v for v in (value - 1, value + 1) if v >= 1]


def rows_of(source: str, profile: str) -> Iterator[tuple[list[str], list[ast.expr]]]:
    """(its names, `profile`'s row) of each model-size table at the top of train.py
    (`DEPTH, MODEL_DIM, ... = {"gpu": (...), ...}[S.profile_name]`)."""
    for stmt in policy.parse(source).body:
        if not (
            isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Tuple)
            and isinstance(stmt.value, ast.Subscript) and isinstance(stmt.value.value, ast.Dict)
        ):  # fmt: skip
            continue
        names = [t.id if isinstance(t, ast.Name) else "" for t in stmt.targets[0].elts]
        for key, row in zip(stmt.value.value.keys, stmt.value.value.values, strict=True):
            if (
                isinstance(key, ast.Constant) and key.value == profile
                and isinstance(row, ast.Tuple) and len(row.elts) == len(names)
            ):  # fmt: skip
                yield names, row.elts


def _row_ints(names: list[str], row: list[ast.expr]) -> dict[str, ast.Constant]:
    """The entries of a row a step may change: named whole numbers on one line."""
    return {
        n: e for n, e in zip(names, row, strict=True)
        if n and isinstance(e, ast.Constant) and type(e.value) is int and e.lineno == e.end_lineno
    }  # fmt: skip


def profile_steps(source: str, profile: str) -> list[Step]:
    """Steps of the model size and batch in `profile`'s row of the table at the top of train.py."""
    lines = source.split("\n")
    out: list[Step] = []
    for names, row in rows_of(source, profile):
        ints = _row_ints(names, row)
        values = {n: e.value for n, e in ints.items()}
        for name, node in ints.items():
            raw = lines[node.lineno - 1].encode()
            for new in _row_steps(name, values):
                new_line = (
                    raw[: node.col_offset] + str(new).encode() + raw[node.end_col_offset :]
                ).decode()
                description = f"{name} {node.value} -> {new} on the {profile} profile"
                out.append(Step(description, node.lineno - 1, f"row:{profile}", new_line))
    return out


def with_lines(source: str, steps: tuple[Step, ...]) -> str:
    lines = source.split("\n")
    for step in steps:
        lines[step.line] = step.new_line
    return "\n".join(lines)


Part = Step | tuple[str, str]  # a step of a constant, or a known edit (its text, replaced)


@functools.lru_cache(maxsize=64)
def single_changes(source: str, profile: str | None = None) -> Mapping[str, Part]:
    """Each single change the proposer knows on `source`, by its description: the known edits
    whose text occurs once, then the steps of its constants (and with `profile`, of that
    profile's model-size row). Read-only, and kept for the latest sources: a proposal reads
    them twice (`offline.combination`, `OfflineProposer.candidates`), each a parse of train.py."""
    out: dict[str, Part] = {d: (old, new) for d, old, new in KNOWN_EDITS if source.count(old) == 1}
    steps = hyperparameter_steps(source, profile) + (
        profile_steps(source, profile) if profile else []
    )
    return MappingProxyType(out | {s.description: s for s in steps})


def combined(source: str, parts: list[Part]) -> str | None:
    """`source` with every part applied, steps first (by line), then edits (by text); None when
    two touch one line, or an edit's text is gone or another edit changed what it wrote."""
    steps = [p for p in parts if isinstance(p, Step)]
    edits = [p for p in parts if not isinstance(p, Step)]
    if len({s.line for s in steps}) < len(steps):
        return None
    text = with_lines(source, tuple(steps))
    for old, new in edits:
        if text.count(old) != 1:
            return None
        text = text.replace(old, new)
    return text if all(new in text for _, new in edits) else None
