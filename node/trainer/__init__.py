"""The trainer: data, tokenizer, harness, the baseline `train.py`, the runner and the profiles.

Nothing in here knows that a network exists. Agents edit only `train.py`; everything else is
the harness, which prepares the data, keeps the clock and computes the score.
"""

from pathlib import Path

from node.trainer.data import TokenData, prepare_data
from node.trainer.device import require_device
from node.trainer.errors import TrainerError
from node.trainer.process import RunCancelled
from node.trainer.profiles import PROFILES, Profile, get_profile
from node.trainer.runner import RunResult, run_experiment
from node.trainer.version import harness_sha256

BASELINE_TRAIN_PY = Path(__file__).with_name("train.py")

__all__ = [
    "BASELINE_TRAIN_PY", "PROFILES", "Profile", "RunCancelled", "RunResult", "TokenData", "TrainerError",
    "get_profile", "harness_sha256", "prepare_data", "require_device", "run_experiment",
]
