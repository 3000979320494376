"""The device a profile runs on: whether this machine has it, and its peak rate for MFU."""

from __future__ import annotations

import os

from node.trainer.errors import TrainerError
from node.trainer.profiles import Profile

# Dense bf16 matrix rate by device name, for MFU; override with SWARM_PEAK_FLOPS.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "4090": 165e12}


def peak_flops(device_name: str | None) -> float | None:
    """The device's peak rate in FLOPs a second, where it is known (never for a CPU)."""
    if os.environ.get("SWARM_PEAK_FLOPS"):
        return float(os.environ["SWARM_PEAK_FLOPS"])
    for key, flops in PEAK_FLOPS.items():
        if device_name and key in device_name:
            return flops
    return None


def require_device(profile: Profile) -> None:
    """TrainerError when this machine lacks the profile's device (checked before any data is fetched)."""
    if profile.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise TrainerError(
                f"profile {profile.name} needs a CUDA GPU and this machine has none; use --profile cpu"
            )
