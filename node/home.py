"""Where a node keeps its state: key, ledger, runs and data live under one home directory.

The home is `--home DIR`, else `$SWARM_HOME`, else `~/.research-swarm`. Data that can be
rebuilt (corpora, tokenizers, shards) lives in a cache that several homes may share.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = "~/.research-swarm"


def resolve_home(home: str | os.PathLike | None = None) -> Path:
    """The node's home directory, created if missing."""
    raw = home if home is not None else os.environ.get("SWARM_HOME", DEFAULT_HOME)
    path = Path(raw).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir(home: Path) -> Path:
    """Rebuildable data: `$SWARM_DATA` if set (shared between homes), else `HOME/data`."""
    raw = os.environ.get("SWARM_DATA")
    path = Path(raw).expanduser().resolve() if raw else home / "data"
    path.mkdir(parents=True, exist_ok=True)
    return path


def compiled_dir(home: Path) -> Path:
    """The node's compiled kernels (`HOME/compiled`): written by its trusted runs, lent to all."""
    return home / "compiled"
