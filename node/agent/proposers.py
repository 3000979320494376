"""Proposers: where the next change of train.py comes from, behind one small interface.

`OfflineProposer` needs no network and no key (seeded hyperparameter steps and known-good edits);
`LLMProposer` asks any model litellm reaches. Neither runs code nor publishes anything: they
only return a `Proposal`, and never one whose change was already tried on the same parent.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import itertools
import json
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from node.agent.errors import ModelError, PatchError, ProposalRefused, SpendingLimitReached
from node.agent.patch import apply_diff, change_hash, check_source

# ---------------------------------------------------------------------------------------------
# The interface


@dataclass(frozen=True)
class Attempt:
    """One experiment already made on the parent: by this node or a peer, with its outcome."""

    description: str
    outcome: str  # keep, discard or crash
    delta: float | None  # child minus parent val_bpb (negative is better); None if unknown
    diff_hash: str
    by: str = "a peer"  # "this node" or a peer id


@dataclass(frozen=True)
class Context:
    """What a proposer sees: the parent train.py, the strategy, the profile, recent history."""

    train_py: str
    program: str = ""
    profile: str = "test"
    history: tuple[Attempt, ...] = ()
    tried: frozenset[str] = frozenset()  # diff hashes tried on this parent, beyond `history`

    @property
    def parent(self) -> str:
        return hashlib.sha256(self.train_py.encode()).hexdigest()

    @property
    def tried_hashes(self) -> frozenset[str]:
        return self.tried | {a.diff_hash for a in self.history}


@dataclass(frozen=True)
class Proposal:
    description: str  # one line
    source: str  # the whole new train.py


class Proposer(Protocol):
    def propose(self, context: Context) -> Proposal: ...


def context_from_ledger(
    ledger: Any, train_py: str, profile: str, program: str = "", me: str | None = None,
    parent_val_bpb: float | None = None, limit: int = 30,
) -> Context:  # fmt: skip
    """A Context for `train_py` from the ledger's results on it (this node's and peers').

    Deltas are against `parent_val_bpb`, else the best kept val_bpb the ledger holds for the
    parent. The published diff is the normalised one, so its sha256 is the change's hash.
    """
    parent = hashlib.sha256(train_py.encode()).hexdigest()
    rows = ledger.rows(
        "SELECT author, description, outcome, val_bpb, diff_sha256 FROM results "
        "WHERE parent = ? AND profile = ? ORDER BY time DESC, id",
        (parent, profile),
    )
    if parent_val_bpb is None:
        best = ledger.rows(
            "SELECT MIN(val_bpb) AS v FROM results WHERE child = ? AND profile = ? "
            "AND outcome = 'keep'",
            (parent, profile),
        )
        parent_val_bpb = best[0]["v"] if best else None
    history = tuple(
        Attempt(
            description=r["description"], outcome=r["outcome"], diff_hash=r["diff_sha256"],
            delta=None if r["val_bpb"] is None or parent_val_bpb is None
            else r["val_bpb"] - parent_val_bpb,
            by="this node" if r["author"] == me else r["author"],
        )
        for r in rows[:limit]
    )  # fmt: skip
    tried = frozenset(r["diff_sha256"] for r in rows)
    return Context(train_py, program, profile, history, tried)


# ---------------------------------------------------------------------------------------------
# Offline: seeded hyperparameter steps and known-good edits

SKIP_CONSTANTS = frozenset({"LOG_EVERY", "COMPILE"})  # no effect on what the model learns
FLOAT_FACTORS = (0.5, 0.7, 1.4, 2.0)
MAX_PAIRS = 400  # pairs of hyperparameter steps, tried once every single step was

# (description, text in the baseline, replacement): applied only where the text occurs once.
KNOWN_EDITS = (
    ("Warmdown over the last 60% of the budget, not 40%", "WARMDOWN = 0.4 ", "WARMDOWN = 0.6 "),
    ("Muon momentum 0.9 instead of 0.95", "MUON_MOMENTUM = 0.95 ", "MUON_MOMENTUM = 0.9 "),
    ("MLP ratio 3: a narrower MLP, more steps in the budget", "MLP_RATIO = 4 ", "MLP_RATIO = 3 "),
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
class _Step:
    description: str
    line: int  # 0-based line of the constant
    name: str
    new_line: str


def hyperparameter_steps(source: str) -> list[_Step]:
    """One step per CAPITAL numeric constant (or tuple element) of train.py and neighbour value."""
    lines = source.split("\n")
    out: list[_Step] = []
    for stmt in ast.parse(source).body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            continue
        target = stmt.targets[0]
        if (
            not (isinstance(target, ast.Name) and target.id.isupper())
            or target.id in SKIP_CONSTANTS
        ):
            continue
        nodes = stmt.value.elts if isinstance(stmt.value, ast.Tuple) else [stmt.value]
        for i, node in enumerate(nodes):
            value = getattr(node, "value", None)
            if not isinstance(node, ast.Constant) or type(value) not in (int, float):
                continue
            if node.lineno != node.end_lineno:
                continue
            name = target.id if len(nodes) == 1 else f"{target.id}[{i}]"
            raw = lines[node.lineno - 1].encode()  # ast's columns count UTF-8 bytes
            old_text = raw[node.col_offset : node.end_col_offset].decode()
            for new in _steps(value):
                text = str(new) if isinstance(new, int) else _fmt(new)
                if text == old_text:
                    continue
                new_line = (
                    raw[: node.col_offset] + text.encode() + raw[node.end_col_offset :]
                ).decode()
                out.append(
                    _Step(f"{name} {old_text} -> {text}", node.lineno - 1, target.id, new_line)
                )
    return out


def _with_lines(source: str, steps: tuple[_Step, ...]) -> str:
    lines = source.split("\n")
    for step in steps:
        lines[step.line] = step.new_line
    return "\n".join(lines)


@functools.lru_cache(maxsize=4096)
def _change_hash(parent: str, child: str) -> str:
    return change_hash(parent, child)


class OfflineProposer:
    """Seeded changes that need no model: each call gives the next untried one on the parent.

    The order depends only on the seed and the parent, so the same seed proposes the same
    changes; different seeds explore in different orders, which spreads a swarm's work.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._proposed: set[tuple[str, str]] = set()  # (parent, change hash) given out already

    def candidates(self, source: str) -> Iterator[tuple[str, str]]:
        """(description, child source) in this seed's order for this parent; may not compile."""
        rng = random.Random(f"{self.seed}:{hashlib.sha256(source.encode()).hexdigest()}")
        steps = hyperparameter_steps(source)
        singles: list[tuple[str, Callable[[], str]]] = [
            (d, lambda old=old, new=new: source.replace(old, new))
            for d, old, new in KNOWN_EDITS if source.count(old) == 1
        ]  # fmt: skip
        singles += [(s.description, lambda s=s: _with_lines(source, (s,))) for s in steps]
        rng.shuffle(singles)
        for description, make in singles:
            yield description, make()
        pairs = [(a, b) for a, b in itertools.combinations(steps, 2) if a.name != b.name]
        rng.shuffle(pairs)
        for a, b in pairs[:MAX_PAIRS]:
            yield f"{a.description}; {b.description}", _with_lines(source, (a, b))

    def propose(self, context: Context) -> Proposal:
        parent, tried = context.parent, context.tried_hashes
        seen: set[str] = set()
        for description, child in self.candidates(context.train_py):
            if child == context.train_py:
                continue
            key = _change_hash(context.train_py, child)
            if key in tried or key in seen or (parent, key) in self._proposed:
                continue
            seen.add(key)
            try:
                check_source(child)
            except PatchError:
                continue
            self._proposed.add((parent, key))
            return Proposal(description, child)
        raise ProposalRefused(
            "the offline proposer has tried every change it knows on this train.py; "
            "adopt a newer head, or configure a model with --model"
        )


# ---------------------------------------------------------------------------------------------
# A language model through litellm

_FENCE = re.compile(
    r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S
)
_DESCRIPTION = re.compile(r"^\W*description\W*:\s*(.+)$", re.I | re.M)
DIFF_LANGS = frozenset({"diff", "patch", "udiff"})
PYTHON_LANGS = frozenset({"python", "py", "python3"})


def extract_change(reply: str, parent: str) -> Proposal:
    """The change a model's reply holds: a ```diff block applied to `parent`, or a whole file in
    a ```python block. Raises ProposalRefused, saying why, when there is no usable change."""
    blocks = [(m[1].lower(), m[2]) for m in _FENCE.finditer(reply)]
    prose = _FENCE.sub("", reply)
    if prose.count("```") % 2:
        raise ProposalRefused(
            "the reply was cut off inside a ``` block: raise the model's max_tokens"
        )
    diffs = [
        body for lang, body in blocks if lang in DIFF_LANGS or (not lang and "\n@@ " in "\n" + body)
    ]
    files = [body for lang, body in blocks if lang in PYTHON_LANGS]
    if not blocks and re.search(r"^@@ -\d", reply, re.M):
        diffs = [reply]  # a bare diff with no fence
    if diffs:
        errors = []
        for diff in diffs:
            try:
                child = apply_diff(parent, diff)
                check_source(child)
                return Proposal(_description(prose), child)
            except PatchError as exc:
                errors.append(str(exc))
        raise ProposalRefused(f"the model's diff is broken: {errors[0]}")
    if files:
        child = max(files, key=len)
        if not child.endswith("\n"):
            child += "\n"
        if len(child) < len(parent) / 2:
            raise ProposalRefused("the ```python block is a fragment, not the whole train.py")
        if child == parent:
            raise ProposalRefused("the model returned train.py unchanged")
        try:
            check_source(child)
        except PatchError as exc:
            raise ProposalRefused(f"the model's train.py is broken: {exc}") from None
        return Proposal(_description(prose), child)
    raise ProposalRefused(
        "the reply holds no change: neither a ```diff block nor a whole train.py in a ```python block"
    )


def _description(prose: str) -> str:
    match = _DESCRIPTION.search(prose)
    lines = [match[1]] if match else [x.strip(" #*-`>") for x in prose.splitlines()]
    line = next((x.strip() for x in lines if x.strip()), "a change proposed by a language model")
    return line if len(line) <= 200 else line[:199] + "…"


def build_messages(context: Context) -> list[dict[str, str]]:
    """The chat: program.md as the system message; train.py, history and the task as the user's."""
    if context.history:
        lines = []
        for a in context.history:
            delta = "no score" if a.delta is None else f"{a.delta:+.4f} bpb"
            lines.append(f"- [{a.outcome}, {delta}, by {a.by}] {a.description}")
        history = "\n".join(lines)
    else:
        history = "- nothing yet: you are the first to try a change on this train.py"
    task = (
        f"Profile: {context.profile}. This is the current train.py:\n\n```python\n"
        f"{context.train_py}```\n\n"
        "What this node and its peers already tried on exactly this train.py (negative delta is "
        "better; a discard did not clear the noise margin; a crash failed to run). Do not "
        f"propose any of these again, and learn from what failed:\n{history}\n\n"
        "Propose ONE new change. Reply with a line `Description: <one line>`, then either one "
        "unified diff against the train.py above in a ```diff block, or the whole new train.py "
        "in a ```python block. Nothing else is needed."
    )
    return [{"role": "system", "content": context.program or "Improve train.py."},
            {"role": "user", "content": task}]  # fmt: skip


@dataclass
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    refused: int = 0
    retries: int = 0
    extra: dict = field(default_factory=dict)


def _transient(exc: Exception) -> bool:
    """Worth another try: rate limits, server errors, timeouts, dropped connections."""
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    if name in ("Timeout", "APIConnectionError", "APITimeoutError", "ServiceUnavailableError",
                "InternalServerError", "RateLimitError", "BadGatewayError"):  # fmt: skip
        return True
    return isinstance(status, int) and (status in (408, 409, 429) or status >= 500)


class LLMProposer:
    """Asks a model (litellm's `provider/name`) for one change per call; the API key comes from
    the provider's usual environment variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...).

    Spending is counted per node (in `spent_path` if given, so it survives restarts); once it
    reaches `max_cost_usd` every call raises SpendingLimitReached. Local models cost 0.
    """

    def __init__(
        self, model: str, api_base: str | None = None, max_cost_usd: float = 5.0, *,
        api_key: str | None = None, max_attempts: int = 4, backoff_s: float = 2.0,
        timeout_s: float = 300.0, max_tokens: int | None = None, temperature: float | None = None,
        spent_path: Path | None = None, sleep: Callable[[float], None] = time.sleep,
    ) -> None:  # fmt: skip
        if max_attempts < 1:
            raise ModelError("max_attempts must be at least 1")
        os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # else litellm fetches prices at import
        import litellm  # seconds to import: only when a model is configured

        self._litellm = litellm
        self.model, self.api_base, self.api_key = model, api_base, api_key
        self.max_cost_usd, self.max_attempts, self.backoff_s = max_cost_usd, max_attempts, backoff_s
        self.timeout_s, self.max_tokens, self.temperature = timeout_s, max_tokens, temperature
        self.spent_path, self._sleep = spent_path, sleep
        self.usage = Usage()
        self.spent_before = self._load_spent()

    def _load_spent(self) -> float:
        if self.spent_path is None or not self.spent_path.exists():
            return 0.0
        try:
            return float(json.loads(self.spent_path.read_text())["cost_usd"])
        except (OSError, ValueError, KeyError, TypeError):
            raise ModelError(
                f"cannot read the spending record {self.spent_path}: fix or remove it"
            ) from None

    @property
    def spent_usd(self) -> float:
        return self.spent_before + self.usage.cost_usd

    def _check_budget(self) -> None:
        if self.spent_usd >= self.max_cost_usd:
            raise SpendingLimitReached(
                f"this node has spent ${self.spent_usd:.4f} on model calls, its limit is "
                f"${self.max_cost_usd:.2f}: raise the limit or use the offline proposer"
            )

    def propose(self, context: Context) -> Proposal:
        """One proposal from the model; ProposalRefused when its reply holds no usable change."""
        reply = self.complete(build_messages(context))
        try:
            proposal = extract_change(reply, context.train_py)
            key = change_hash(context.train_py, proposal.source)
            if key in context.tried_hashes:
                raise ProposalRefused(
                    f"the model proposed a change already tried here ({key[:12]})"
                )
        except ProposalRefused:
            self.usage.refused += 1
            raise
        return proposal

    def complete(self, messages: list[dict[str, str]]) -> str:
        """The model's reply text, with retries and backoff on transient errors."""
        last: Exception | None = None
        for attempt in range(1, self.max_attempts + 1):
            self._check_budget()
            try:
                response = self._litellm.completion(
                    model=self.model, messages=messages, api_base=self.api_base,
                    api_key=self.api_key, timeout=self.timeout_s, max_retries=0,
                    **{k: v for k, v in (("max_tokens", self.max_tokens),
                                         ("temperature", self.temperature)) if v is not None},
                )  # fmt: skip
            except Exception as exc:  # litellm maps every provider's errors to its own types
                if not _transient(exc):
                    raise ModelError(f"{self.model} refused the request: {_brief(exc)}") from None
                last = exc
                if attempt < self.max_attempts:
                    self.usage.retries += 1
                    self._sleep(min(60.0, self.backoff_s * 2 ** (attempt - 1)))
                continue
            self._account(response)
            content = response.choices[0].message.content
            if not content:
                raise ProposalRefused("the model sent an empty reply")
            return content
        raise ModelError(
            f"{self.model} failed {self.max_attempts} times, last: {_brief(last)}; check the "
            "api base, the provider's status, or try again later"
        )

    def _account(self, response: Any) -> None:
        usage = getattr(response, "usage", None)
        self.usage.calls += 1
        self.usage.prompt_tokens += int(getattr(usage, "prompt_tokens", 0) or 0)
        self.usage.completion_tokens += int(getattr(usage, "completion_tokens", 0) or 0)
        try:
            cost = float(self._litellm.completion_cost(completion_response=response) or 0.0)
        except Exception:  # a model litellm has no price for (a local one): free
            cost = 0.0
        self.usage.cost_usd += cost
        if self.spent_path is not None:
            self.spent_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.spent_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"cost_usd": self.spent_usd, "model": self.model}))
            tmp.replace(self.spent_path)


def _brief(exc: Exception | None) -> str:
    if exc is None:
        return "no attempt was made"
    status = getattr(exc, "status_code", None)
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}" + (f" (HTTP {status})" if status else "") + f": {text}"
