"""The static policy every `train.py` passes before anything runs it, the node's own included.

A `train.py` may import math, a few pure standard modules, torch and the harness's `session`, and
nothing else; it may not reach files, processes, the network or dynamic code, directly or through
the indirect doors (`__import__`, `getattr`, dunder attributes, `torch.load`, ...). The policy is
one layer: the sandbox contains what it misses. It reads source; it never imports or runs it.
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass

MAX_BYTES = 64 * 1024  # a train.py larger than this is not one readable file
MAX_LINES = 1500

ALLOWED_MODULES = {
    "math",
    "dataclasses",
    "functools",
    "itertools",
    "collections",
    "typing",
    "enum",
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.optim",
    "torch.nn.init",
}
HARNESS_IMPORT = (
    "node.trainer.harness",
    "session",
)  # the only name a train.py may take from the node
# Builtins that open files, run code, or reach objects by name.
BANNED_NAMES = {
    "eval",
    "exec",
    "compile",
    "__import__",
    "open",
    "input",
    "breakpoint",
    "getattr",
    "setattr",
    "delattr",
    "globals",
    "locals",
    "vars",
    "exit",
    "quit",
    "help",
    "memoryview",
    "__builtins__",
    "__loader__",
    "__spec__",
    "copyright",
    "credits",
    "license",
}
# Attributes that read or write files, load native code, spawn processes, reach torch's internals
# or lift the harness's limits.
BANNED_ATTRIBUTES = {
    "load",
    "save",
    "hub",
    "from_file",
    "cpp_extension",
    "load_library",
    "load_inline",
    "_C",
    "classes",
    "package",
    "multiprocessing",
    "distributed",
    "library",
    "export",
    "onnx",
    "storage",
    "untyped_storage",
    "data_ptr",
    # the GPU memory cap the harness set, and allocators that load native code
    "set_per_process_memory_fraction",
    "change_current_allocator",
    "CUDAPluggableAllocator",
}
ALLOWED_DUNDERS = {"__init__", "__name__", "__call__", "__main__"}
ALLOWED_PRIVATE_PREFIXES = ("_foreach_",)  # torch's fused multi-tensor ops


@dataclass(frozen=True)
class Violation:
    line: int
    rule: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.rule}"


# CPython 3.11 counts the depth of the tree `ast.parse` builds in one counter per interpreter,
# not per thread: two threads parsing at once can fail with "SystemError: AST constructor
# recursion depth mismatch" (python/cpython#106905; seen here when two runs started at once).
# A node's workers are threads, so every parse of a train.py goes through `parse`.
_PARSING = threading.Lock()


def parse(source: str) -> ast.Module:
    """`ast.parse`, one thread at a time."""
    with _PARSING:
        return ast.parse(source)


def check_source(source: str) -> list[Violation]:
    """Every rule `source` breaks, in line order; an empty list means it may run."""
    size = len(source.encode("utf-8"))
    if size > MAX_BYTES or source.count("\n") > MAX_LINES:
        return [
            Violation(
                0,
                f"train.py is {size:,} bytes and {source.count(chr(10)):,} lines; "
                f"the limits are {MAX_BYTES:,} bytes and {MAX_LINES:,} lines",
            )
        ]
    try:
        tree = parse(source)
    except SyntaxError as exc:
        return [Violation(exc.lineno or 0, f"does not parse: {exc.msg}")]
    found = [v for node in ast.walk(tree) for v in _check(node)]
    return sorted(set(found), key=lambda v: (v.line, v.rule))


def _check(node: ast.AST) -> list[Violation]:
    line = getattr(node, "lineno", 0)
    if isinstance(node, ast.Import):
        return [
            Violation(line, f"import of {a.name!r} is not allowed")
            for a in node.names
            if a.name not in ALLOWED_MODULES
        ]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return [Violation(line, "relative imports are not allowed")]
        if node.module == HARNESS_IMPORT[0]:
            return [
                Violation(line, f"only `session` may be imported from the harness, not {a.name!r}")
                for a in node.names
                if a.name != HARNESS_IMPORT[1]
            ]
        if node.module not in ALLOWED_MODULES:
            return [Violation(line, f"import from {node.module!r} is not allowed")]
        return [
            Violation(line, f"import of {a.name!r} is not allowed")
            for a in node.names
            if a.name in BANNED_ATTRIBUTES or a.name in BANNED_NAMES or a.name == "*"
        ]
    if isinstance(node, ast.Name) and node.id in BANNED_NAMES:
        return [Violation(line, f"use of {node.id!r} is not allowed")]
    if isinstance(node, ast.Name) and node.id.startswith("__") and node.id not in ALLOWED_DUNDERS:
        return [Violation(line, f"use of {node.id!r} is not allowed")]
    if isinstance(node, ast.Attribute):
        return _check_attribute(node.attr, line)
    if isinstance(node, (ast.Global, ast.Nonlocal)) and any(n.startswith("_") for n in node.names):
        return [Violation(line, "rebinding private names is not allowed")]
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _mentions_banned(node.value)
    ):
        return [Violation(line, f"string {node.value[:40]!r} names a banned builtin or dunder")]
    return []


def _check_attribute(attr: str, line: int) -> list[Violation]:
    if attr in ALLOWED_DUNDERS:
        return []
    if attr in BANNED_ATTRIBUTES:
        return [
            Violation(
                line,
                f"attribute {attr!r} is not allowed (files, native code, processes or torch internals)",
            )
        ]
    if attr.startswith("__") and attr not in ALLOWED_DUNDERS:
        return [Violation(line, f"dunder attribute {attr!r} is not allowed")]
    if attr.startswith("_") and not attr.startswith(ALLOWED_PRIVATE_PREFIXES):
        return [
            Violation(
                line,
                f"private attribute {attr!r} is not allowed (the harness's state is not train.py's)",
            )
        ]
    return []


def _mentions_banned(text: str) -> bool:
    """A string that is exactly a banned name (bait for getattr-like lookups through containers)."""
    return text in BANNED_NAMES or (
        text.startswith("__") and text.endswith("__") and text not in ALLOWED_DUNDERS
    )
