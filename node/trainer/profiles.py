"""Profiles: everything that makes val_bpb comparable between two runs.

A profile fixes the hardware class, the time budget, the data and tokenizer, the sequence length
and the evaluation tokens. Absolute val_bpb is only ever compared inside one profile.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from node.trainer.errors import TrainerError


@dataclass(frozen=True)
class Profile:
    name: str
    device: str  # "cuda" or "cpu"
    budget_seconds: float  # training time, timed by the harness from the first counted batch
    data: str  # "embedded:<corpus>" (built from packages) or "web:<corpus>" (downloaded shards)
    vocab_size: int
    seq_len: int
    eval_tokens: int  # validation tokens scored, fixed so that runs compare
    tokenizer_chars: int  # training text the tokenizer learns from (a prefix of the train split)
    warmup_batches: int = 3  # first batches are untimed (compilation), see docs/trainer.md
    startup_seconds: float = 300  # the runner's limit for start-up, compilation and warm-up
    grace_seconds: float = 30  # killed when training runs past budget + grace
    eval_seconds: float = 300  # the runner's limit for the evaluation
    threads: int = 0  # CPU threads for torch (0: torch's default, all cores)
    gpu_memory_fraction: float = 0.9  # share of the GPU's memory a run may allocate (CUDA only)

    def as_dict(self) -> dict:
        return asdict(self)


PROFILES = {
    "gpu": Profile(
        "gpu",
        "cuda",
        300,
        "web:fineweb-edu",
        vocab_size=8192,
        seq_len=2048,
        eval_tokens=8 * 2**20,
        tokenizer_chars=400_000_000,
    ),
    "cpu": Profile(
        "cpu",
        "cpu",
        120,
        "embedded:default",
        vocab_size=2048,
        seq_len=256,
        eval_tokens=2**16,
        tokenizer_chars=100_000_000,
        startup_seconds=180,
        eval_seconds=120,
    ),
    "test": Profile(
        "test",
        "cpu",
        4,
        "embedded:small",
        vocab_size=512,
        seq_len=64,
        eval_tokens=2**13,
        tokenizer_chars=4_000_000,
        startup_seconds=60,
        grace_seconds=10,
        eval_seconds=30,
        threads=1,
    ),
}


def get_profile(name: str, data: str | None = None) -> Profile:
    """The named profile, optionally with its data replaced (e.g. the gpu profile on embedded text)."""
    if name not in PROFILES:
        raise TrainerError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}")
    profile = PROFILES[name]
    if data:
        if not data.startswith(("embedded:", "web:", "urls:")):
            raise TrainerError(f"unknown data {data!r}; use embedded:NAME, web:NAME or urls:PATH")
        profile = Profile(**{**profile.as_dict(), "data": data})
    return profile
