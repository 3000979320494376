"""The LLM proposer: one change of train.py per call from any model litellm reaches.

The prompt is program.md, the current train.py and what the swarm already tried on it. The reply
must hold a diff or a whole file; anything else is refused with a reason. Retries transient
errors, counts tokens and dollars, and stops at the node's spending limit. It never runs the
code it receives, and imports litellm only when a model is configured.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.agent.errors import ModelError, PatchError, ProposalRefused, SpendingLimitReached
from node.agent.patch import apply_diff, change_hash, check_source
from node.agent.proposers import Context, Proposal
from node.trainer import policy
from node.wire_schema import MAX_DESCRIPTION

_FENCE = re.compile(
    r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S
)
_DESCRIPTION = re.compile(r"^\W*description\W*:\s*(.+)$", re.I | re.M)
DIFF_LANGS = frozenset({"diff", "patch", "udiff"})
MAX_HISTORY_SHOWN = 30  # experiments on the parent a prompt lists, the latest
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
    lines = [match[1]] if match else prose.splitlines()
    lines = [x.strip(" \t#*-_`>") for x in lines]  # markdown around the line is not part of it
    line = next((x for x in lines if x), "a change proposed by a language model")
    return line if len(line) <= MAX_DESCRIPTION else line[: MAX_DESCRIPTION - 1] + "…"


def build_messages(context: Context, refused: str | None = None) -> list[dict[str, str]]:
    """The chat: program.md as the system message; train.py, history, the policy's rules (from
    `rules_text`, the rules checked), why the last reply was refused (`refused`) and the
    task as the user's."""
    if context.history:
        lines = []
        for a in context.history[:MAX_HISTORY_SHOWN]:
            delta = "no score" if a.delta is None else f"{a.delta:+.4f} bpb"
            lines.append(f"- [{a.outcome}, {delta}, by {a.by}] {a.description}")
        history = "\n".join(lines)
    else:
        history = "- nothing yet: you are the first to try a change on this train.py"
    task = (
        f"Profile: {context.profile}. This is the current train.py:\n\n```python\n"
        f"{context.train_py}```\n\n"
        + _evidence(context)
        + "What this node and its peers already tried on exactly this train.py (negative delta is "
        "better; a discard did not clear the noise margin; a crash failed to run; a void broke "
        "the measurement's rules (it looked ahead at later tokens or at other rows of its batch, "
        "or trained past its budget) and was not scored; running: "
        "another GPU of this node is running it now). Do not propose any of these again, and "
        f"learn from what failed:\n{history}\n\n"
        "The train.py you return is checked against these rules before it runs, and refused if "
        f"it breaks one:\n{rules_text()}\n"
        + (f"Your last reply was refused: {refused}. Do not repeat that.\n\n" if refused else "")
        + "Propose ONE new change. Reply with a line `Description: <one line>`, then either one "
        "unified diff against the train.py above in a ```diff block, or the whole new train.py "
        "in a ```python block. Nothing else is needed."
    )
    return [{"role": "system", "content": context.program or "Improve train.py."},
            {"role": "user", "content": task}]  # fmt: skip


def rules_text() -> str:
    """The train.py policy in words, made from the sets `policy.check_source` applies, so that
    what a model reads and what is checked cannot drift apart. (Here, not in the policy's file:
    that file is part of the harness, whose hash every result carries.)"""

    def listed(names: Iterable[str]) -> str:
        return ", ".join(f"`{n}`" for n in sorted(names))

    module, name = policy.HARNESS_IMPORT
    return (
        f"- Imports: only {listed(policy.ALLOWED_MODULES)} (no other module, nor a submodule not "
        f"named here), and `from {module} import {name}`; no relative or `*` imports.\n"
        f"- Never these names: {listed(policy.BANNED_NAMES)}.\n"
        f"- Never these attributes: {listed(policy.BANNED_ATTRIBUTES)}.\n"
        "- No private attribute (a name that starts with `_`) but those that start with "
        f"{listed(policy.ALLOWED_PRIVATE_PREFIXES)}, no dunder but "
        f"{listed(policy.ALLOWED_DUNDERS)}, and no string that is one of the names above.\n"
        f"- At most {policy.MAX_BYTES:,} bytes and {policy.MAX_LINES:,} lines.\n"
    )


def _evidence(context: Context) -> str:
    """What the swarm verified on the way to this train.py and refuted on that way, with the
    pooled gains and their uncertainty: what the model learns from beyond this version."""
    if not context.lineage and not context.refuted:
        return ""

    def line(j: Any) -> str:
        return f"- {j.description}: {j.gain:+.4f} +- {j.se:.4f} bpb gain, {j.seeds} seeds"

    text = ""
    if context.lineage:
        text += ("The swarm reached this train.py from the campaign's baseline by these verified "
                 "changes, first first (gain: how much lower val_bpb is, pooled over every "
                 "peer's seeds, with its standard error):\n"
                 + "\n".join(line(j) for j in context.lineage) + "\n\n")  # fmt: skip
    if context.refuted:
        text += ("Changes the swarm refuted on the way (their seeds showed no gain): do not "
                 "propose them again in another form unless you know why they failed:\n"
                 + "\n".join(line(j) for j in context.refuted) + "\n\n")  # fmt: skip
    return text


@dataclass
class Usage:
    """What a proposer's model calls cost: calls, tokens, dollars, refusals and retries."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    refused: int = 0
    retries: int = 0


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

    Spending is counted per node in `spent_path` if given: every worker's proposer of the node
    adds its calls' cost there (under a file lock) and reads the total before each call, so the
    limit is the node's, whatever the number of workers, and survives restarts; once the total
    reaches `max_cost_usd` every call raises SpendingLimitReached (a call already in flight on
    another worker may pass it by its own cost). Without `spent_path`, per proposer. Local
    models cost 0.
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
        try:
            import litellm  # seconds to import: only when a model is configured
        except ImportError:
            raise ModelError(
                f"--model {model} needs litellm: pip install 'research-swarm[llm]'"
            ) from None

        litellm.suppress_debug_info = True  # its help banners are not our user's business
        self._litellm = litellm
        if api_key is None:
            api_key = _key_or_placeholder(litellm, model, api_base)
        self.model, self.api_base, self.api_key = model, api_base, api_key
        self.kind = f"model {model}"  # for `swarm status`
        self.max_cost_usd, self.max_attempts, self.backoff_s = max_cost_usd, max_attempts, backoff_s
        self.timeout_s, self.max_tokens, self.temperature = timeout_s, max_tokens, temperature
        self.spent_path, self._sleep = spent_path, sleep
        self.usage = Usage()
        self.last_refused: str | None = None  # why the last reply was refused, for the next prompt
        self._spend(0.0)  # a record it cannot read is an error now, not at the first call

    def _spend(self, cost: float) -> float:
        """Add `cost` to the node's spending record and return the node's total (this proposer's
        own without a record)."""
        if self.spent_path is None:
            return self.usage.cost_usd
        self.spent_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.spent_path.with_name(self.spent_path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other workers wait their turn
            total = 0.0
            try:
                total = float(json.loads(self.spent_path.read_text())["cost_usd"])
            except FileNotFoundError:
                pass
            except (OSError, ValueError, KeyError, TypeError):
                raise ModelError(
                    f"cannot read the spending record {self.spent_path}: fix or remove it"
                ) from None
            if cost:
                total += cost
                tmp = self.spent_path.with_suffix(".tmp")
                tmp.write_text(json.dumps({"cost_usd": total, "model": self.model}))
                tmp.replace(self.spent_path)
        return total

    @property
    def spent_usd(self) -> float:
        """What the node has spent on model calls (this proposer's alone without a record)."""
        return self._spend(0.0)

    def _check_budget(self) -> None:
        spent = self.spent_usd
        if spent >= self.max_cost_usd:
            raise SpendingLimitReached(
                f"this node has spent ${spent:.4f} on model calls, its limit is "
                f"${self.max_cost_usd:.2f}: raise the limit or use the offline proposer"
            )

    def propose(self, context: Context) -> Proposal:
        """One proposal from the model; ProposalRefused when its reply holds no usable change
        (and the next prompt says why, so that the model need not guess)."""
        reply = self.complete(build_messages(context, self.last_refused))
        try:
            proposal = extract_change(reply, context.train_py)
            key = change_hash(context.train_py, proposal.source)
            if key in context.tried_hashes:
                raise ProposalRefused(
                    f"the model proposed a change already tried here ({key[:12]})"
                )
        except ProposalRefused as exc:
            self.usage.refused += 1
            self.last_refused = str(exc)
            raise
        self.last_refused = None
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
        self._spend(cost)


def _key_or_placeholder(litellm: Any, model: str, api_base: str | None) -> str | None:
    """None when the provider's key is in the environment (litellm reads it there); a
    placeholder for a local server at `api_base`, which takes any key; else a clear error."""
    try:
        missing = litellm.validate_environment(model=model).get("missing_keys") or []
    except Exception:  # a provider litellm cannot check: let the call itself say what is wrong
        return None
    keys = [name for name in missing if "KEY" in name]
    if not keys:
        return None
    if api_base is not None:
        return "no-key"
    raise ModelError(
        f"{model} needs {' or '.join(keys)} in the environment; set it, or pass --api-base "
        "for a local OpenAI-compatible server"
    )


def _brief(exc: Exception | None) -> str:
    if exc is None:
        return "no attempt was made"
    status = getattr(exc, "status_code", None)
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}" + (f" (HTTP {status})" if status else "") + f": {text}"
