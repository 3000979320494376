"""Unified diffs of train.py: make one, apply one strictly, hash the change, merge two changes.

`apply_diff` never guesses: every context and removed line must match the parent (a hunk may sit
at another line than its header says, as models often miscount, but never with fuzz). A diff
over the wire's size limit is refused before it is read. Pure functions: no I/O.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass, field

import merge3

from node.agent.errors import PatchError
from node.wire import MAX_DIFF_SIZE

MAX_SOURCE_SIZE = 1 << 20  # a train.py larger than this is not one file a person reads
NO_NEWLINE = "\\ No newline at end of file"
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FILE_HEADERS = ("diff ", "index ", "new file mode", "deleted file mode", "similarity ", "rename ")


@dataclass
class _Hunk:
    old_start: int
    new_start: int
    lines: list[str] = field(default_factory=list)  # each with its prefix: " ", "-", "+" or "\\"

    def side(self, keep: str) -> list[str]:
        """The hunk's lines (without prefix) that the old (" -") or new (" +") side holds."""
        return [line[1:] for line in self.lines if line[0] in keep]


def _split(text: str) -> list[str]:
    """Lines with their endings; only "\\n" ends a line (Python source may hold a form feed)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _check_size(diff: str) -> None:
    size = len(diff.encode("utf-8", "surrogatepass"))
    if size > MAX_DIFF_SIZE:
        raise PatchError(
            f"the diff is {size:,} bytes, over the limit of {MAX_DIFF_SIZE:,}: "
            "an experiment is a small change of train.py, not a new file"
        )


def check_source(source: str) -> None:
    """Raise PatchError unless `source` is a train.py of sane size that compiles."""
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_SIZE:
        raise PatchError(f"train.py would be {size:,} bytes, over the limit of {MAX_SOURCE_SIZE:,}")
    try:
        compile(source, "train.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f" at line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        raise PatchError(
            f"the new train.py does not compile{where}: {exc.msg if isinstance(exc, SyntaxError) else exc}"
        ) from None


def make_diff(parent: str, child: str) -> str:
    """The unified diff (3 lines of context) that turns `parent` into `child`; "" when equal."""
    out = []
    for line in difflib.unified_diff(_split(parent), _split(child), "a/train.py", "b/train.py"):
        out.append(line if line.endswith("\n") else f"{line}\n{NO_NEWLINE}\n")
    diff = "".join(out)
    _check_size(diff)
    return diff


def _parse(diff: str) -> list[_Hunk]:
    """The hunks of a one-file unified diff; header counts are not trusted, the body is."""
    _check_size(diff)
    lines = diff.replace("\r\n", "\n").split("\n")
    hunks: list[_Hunk] = []
    files = 0
    current: _Hunk | None = None
    for i, line in enumerate(lines):
        next_line = lines[i + 1] if i + 1 < len(lines) else ""
        if line.startswith("--- ") and next_line.startswith("+++ "):
            files += 1
            current = None
            continue
        if line.startswith("+++ ") and current is None:
            continue
        if match := _HUNK.match(line):
            current = _Hunk(int(match[1]), int(match[3]))
            hunks.append(current)
            continue
        if current is None or line.startswith(_FILE_HEADERS):
            current = None
            continue
        if line == "":
            current.lines.append("")  # models often strip the space of a blank context line
        elif line[0] in " -+\\":
            current.lines.append(line)
        else:
            current = None  # prose after the diff ends the hunk
    if files > 1:
        raise PatchError("the diff changes more than one file; only train.py may change")
    for hunk in hunks:
        while hunk.lines and hunk.lines[-1] == "":  # trailing empty lines are separators
            hunk.lines.pop()
        hunk.lines = [line or " " for line in hunk.lines]
        if not any(line[0] in "-+" for line in hunk.lines):
            raise PatchError(
                f"hunk at line {hunk.old_start} changes nothing: is the diff cut short?"
            )
    if not hunks:
        raise PatchError("no hunks: the diff has no '@@ -start,count +start,count @@' sections")
    return hunks


def _find(lines: list[str], old: list[str], start: int, hint: int) -> int | None:
    """Where `old` occurs in `lines` at or after `start`, nearest to `hint`: exactly, else with
    trailing whitespace ignored (models drop it). None when it does not occur."""
    for same in (lambda a, b: a == b, lambda a, b: a.rstrip() == b.rstrip()):
        found = [
            i for i in range(start, len(lines) - len(old) + 1)
            if all(same(lines[i + j], old[j]) for j in range(len(old)))
        ]  # fmt: skip
        if found:
            return min(found, key=lambda i: (abs(i - hint), i))
    return None


def apply_diff(parent: str, diff: str) -> str:
    """`parent` with `diff` applied; raises PatchError when any hunk does not match exactly."""
    hunks = _parse(diff)
    lines = parent.split("\n")
    final_newline = lines[-1] == ""
    if final_newline:
        lines.pop()
    out: list[str] = []
    cursor = 0
    for n, hunk in enumerate(hunks, 1):
        old = hunk.side(" -")
        hint = hunk.old_start if not old else hunk.old_start - 1
        at = _find(lines, old, cursor, hint) if old else min(max(hint, cursor), len(lines))
        if at is None:
            held = {x.rstrip() for x in lines[cursor:]}
            missing = next((x for x in old if x.rstrip() not in held), None)
            why = (
                f"train.py has no line {missing.strip()[:80]!r}"
                if missing is not None
                else "its context and removed lines are not in train.py in that order"
            )
            raise PatchError(
                f"hunk {n} of {len(hunks)} (at line {hunk.old_start}) does not apply: {why}; "
                "make the diff against the exact train.py given"
            )
        out += lines[cursor:at]
        i = at  # context lines come from the parent, exactly as it has them
        for line in hunk.lines:
            if line[0] in " -":
                if line[0] == " ":
                    out.append(lines[i])
                i += 1
            elif line[0] == "+":
                out.append(line[1:])
        cursor = at + len(old)
        for prev, line in zip(hunk.lines, hunk.lines[1:], strict=False):
            if line.startswith("\\"):
                if cursor >= len(lines) and prev[0] in " +":
                    final_newline = False
                elif prev[0] == "-" and cursor >= len(lines):
                    final_newline = True
    out += lines[cursor:]
    child = "\n".join(out) + ("\n" if final_newline and out else "")
    if child == parent:
        raise PatchError("the diff changes nothing in train.py")
    return child


def normalise_diff(diff: str) -> str:
    """The diff in one canonical spelling: fixed file headers, no timestamps or hunk titles, no
    trailing whitespace, counts recomputed. The same change made by two peers reads the same."""
    out = ["--- a/train.py\n", "+++ b/train.py\n"]
    for hunk in _parse(diff):
        body = [
            line.rstrip() if line[0] == "\\" else line[0] + line[1:].rstrip() for line in hunk.lines
        ]
        old = sum(1 for line in body if line[0] in " -")
        new = sum(1 for line in body if line[0] in " +")
        out.append(f"@@ -{hunk.old_start},{old} +{hunk.new_start},{new} @@\n")
        out += [line + "\n" for line in body]
    return "".join(out)


def diff_hash(diff: str) -> str:
    """sha256 (hex) of the normalised diff: the name of a change on its parent."""
    return hashlib.sha256(normalise_diff(diff).encode("utf-8", "surrogatepass")).hexdigest()


def change_hash(parent: str, child: str) -> str:
    """The hash of the change from `parent` to `child`, independent of how its diff was written."""
    return diff_hash(make_diff(parent, child))


def merge(base: str, ours: str, theirs: str) -> str | None:
    """Three-way merge of two changes of `base`; None when they touch the same lines differently.
    Changes of neighbouring lines merge (two constants of adjacent lines: a region that merge3
    calls a conflict because no unchanged line parts them), where each line of the region is
    changed on one side at most and neither side adds or removes lines there."""
    merged: list[str] = []
    for group in merge3.Merge3(_split(base), _split(ours), _split(theirs)).merge_groups():
        if group[0] != "conflict":
            merged += group[1]
            continue
        _, was, mine, other = group
        if not len(was) == len(mine) == len(other):
            return None
        for line, a, b in zip(was, mine, other, strict=True):
            if a != line and b != line and a != b:
                return None
            merged.append(b if a == line else a)
    return "".join(merged)
