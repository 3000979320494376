"""Profiles: everything that makes val_bpb comparable between two runs.

A profile fixes the device class, the training budget (tokens, not seconds: see docs/trainer.md),
the model envelope (training FLOPs per token), the data and tokenizer, the sequence length and
the evaluation tokens. Absolute val_bpb is only ever compared inside one profile, and gains only
between runs paired on one machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from node.trainer.errors import TrainerError


@dataclass(frozen=True)
class Profile:
    name: str
    device: str  # "cuda" or "cpu"
    budget_tokens: int  # training tokens the harness serves after the warm-up: the budget
    max_flops_per_token: float  # the model envelope: training FLOPs per token, forward + backward
    data: str  # "embedded:<corpus>" (built from packages) or "web:<corpus>" (downloaded shards)
    vocab_size: int
    seq_len: int
    eval_tokens: int  # validation tokens scored, fixed so that runs compare
    tokenizer_chars: int  # training text the tokenizer learns from (a prefix of the train split)
    warmup_batches: int = 3  # first batches are untimed (compilation), see docs/trainer.md
    startup_seconds: float = 300  # the runner's limit for start-up, compilation and warm-up
    # The safety cap on training's wall clock where the node has not measured its speed yet
    # (the runner derives a tighter one from a measured speed): never the budget.
    max_train_seconds: float = 1800
    eval_seconds: float = 300  # the runner's limit for the evaluation
    # CPU threads for torch, fixed so that every machine sums in one order (0: all of them).
    threads: int = 1
    gpu_memory_fraction: float = 0.9  # share of the GPU's memory a run may allocate (CUDA only)
    # val_bpb two runs of one train.py and seed may differ by on this device class (measured,
    # docs/trainer.md). A CPU replays bit for bit under any load; 1e-4 guards against CPUs of one
    # instruction set whose kernels block their sums differently (not measured), far below any
    # gain a margin believes (0.001 at least).
    replay_tolerance: float = 1e-4
    # torch.use_deterministic_algorithms for training on a GPU (docs/trainer.md: what it costs).
    deterministic: bool = False
    # The standard deviation of a paired difference (child minus parent on one seed) before a
    # node has measured its own: the prior its first paired runs replace (docs/trainer.md).
    paired_noise: float = 0.005

    def as_dict(self) -> dict:
        return asdict(self)


# Budgets are sized so that the baseline trains about as long as the profile's machine took
# under the old wall-clock budgets; envelopes are three times the baseline's FLOPs per token.
PROFILES = {
    "gpu": Profile(  # one H100-class GPU: about 250 s of training
        "gpu",
        "cuda",
        # 307 M tokens, the FLOPs of 503 M tokens of the recipe before 2026-12-03's (4 x 1024 does
        # 453.0 M FLOPs a token, 8 x 512 did 276.8 M): about 250 s at the H200's 1.24 M tokens/s
        budget_tokens=2346 * 2**17,
        max_flops_per_token=3 * 452_987_904,
        data="web:fineweb-edu",
        vocab_size=8192,
        seq_len=2048,
        eval_tokens=8 * 2**20,
        tokenizer_chars=400_000_000,
        replay_tolerance=0.002,
        paired_noise=0.002,
        threads=0,  # the GPU does the sums; the host's threads only feed it
    ),
    "cpu": Profile(  # one laptop core: about 2 minutes of training
        "cpu",
        "cpu",
        budget_tokens=786_432,
        max_flops_per_token=3 * 6_291_456,
        data="embedded:default",
        vocab_size=2048,
        seq_len=256,
        eval_tokens=2**16,
        tokenizer_chars=100_000_000,
        startup_seconds=180,
        eval_seconds=120,
        max_train_seconds=900,
        paired_noise=0.007,  # measured: 0.0067 over 5 seeds (docs/trainer.md)
    ),
    "demo": Profile(  # one laptop core: about 20 s of training, for a first swarm in minutes
        "demo",
        "cpu",
        budget_tokens=2**17,
        max_flops_per_token=3 * 6_291_456,
        data="embedded:default",  # the cpu profile's data and tokenizer: built once for both
        vocab_size=2048,
        seq_len=128,
        eval_tokens=2**14,
        tokenizer_chars=100_000_000,
        startup_seconds=120,
        eval_seconds=60,
        max_train_seconds=300,
        paired_noise=0.007,
    ),
    "test": Profile(  # seconds on one core, for tests and a first look
        "test",
        "cpu",
        budget_tokens=2**16,
        max_flops_per_token=3 * 786_432,
        data="embedded:small",
        vocab_size=512,
        seq_len=64,
        eval_tokens=2**13,
        tokenizer_chars=4_000_000,
        startup_seconds=60,
        eval_seconds=30,
        max_train_seconds=60,
        paired_noise=0.005,
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
