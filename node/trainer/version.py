"""The measurement's identity: the harness's version, the hash of its files, and what a profile
fixes of the measurement. Results under two identities never compare."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from node.trainer.profiles import Profile

# The harness's version: move it whenever a file that prepares data, times or scores changes
# (tests/test_harness_version.py fails until it moves), so that results measured by another
# harness never compare with this one's.
HARNESS_VERSION = "2026.12.12"

# What a profile fixes of the measurement: runs that differ in any of these never compare. The
# rest (each phase's limit, the replay tolerance, the prior noise) changes no score.
MEASURED_FIELDS = (
    "name", "device", "budget_tokens", "max_flops_per_token", "data", "vocab_size", "seq_len",
    "eval_tokens", "tokenizer_chars", "warmup_batches", "threads", "deterministic",
)  # fmt: skip


def harness_files() -> list[Path]:
    """Every file of the harness: all of the trainer's code but the `train.py` agents edit."""
    here = Path(__file__).parent
    return sorted(p for p in here.glob("*.py") if p.name != "train.py")


def harness_files_sha256() -> str:
    """Hash of the harness's files, by name and content."""
    digest = hashlib.sha256()
    for path in harness_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def harness_sha256(profile: Profile | None = None) -> str:
    """The measurement's identity: the harness's version and files and, given a profile, what it
    fixes of the measurement (budget, envelope, data, shapes). Results under another identity
    never compare: a campaign that pins another budget measures another thing."""
    text = f"{HARNESS_VERSION}\0{harness_files_sha256()}"
    if profile is not None:
        fixed = {name: getattr(profile, name) for name in MEASURED_FIELDS}
        text += "\0" + json.dumps(fixed, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
