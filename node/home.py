"""Where a node keeps its state: key, ledger, runs and data live under one home directory.

The home is `--home DIR`, else `$SWARM_HOME`, else `~/.research-swarm`. Data that can be
rebuilt (corpora, tokenizers, shards) lives in a cache that several homes may share. Read-only
commands never create a home.
"""

from __future__ import annotations

import os
from pathlib import Path

from node.errors import SwarmError

DEFAULT_HOME = "~/.research-swarm"


class HomeError(SwarmError):
    """A home that cannot be used: not a directory, or not writable."""


def resolve_home(home: str | os.PathLike | None = None, create: bool = True) -> Path:
    """The node's home directory. `create`: made if missing and checked writable, for commands
    that write; else only found, for read-only commands, which never create a home."""
    raw = home if home is not None else os.environ.get("SWARM_HOME", DEFAULT_HOME)
    path = Path(raw).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise HomeError(
            f"the home {path} is not a directory: pass --home a folder (made if missing)"
        )
    if not create:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HomeError(f"cannot make the home {path}: {exc.strerror}; pass --home a folder you "
                        "can write") from None  # fmt: skip
    if not os.access(path, os.W_OK | os.X_OK):
        raise HomeError(f"the home {path} is not writable: pass --home a folder you can write")
    return path


def data_dir(home: Path) -> Path:
    """Rebuildable data: `$SWARM_DATA` if set (shared between homes), else `HOME/data`."""
    raw = os.environ.get("SWARM_DATA")
    path = Path(raw).expanduser().resolve() if raw else home / "data"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fix = "set SWARM_DATA to" if raw else "pass --home"
        raise HomeError(f"cannot make the data folder {path}: {exc.strerror}; {fix} a folder you "
                        "can write") from None  # fmt: skip
    return path


def compiled_dir(home: Path) -> Path:
    """The node's compiled kernels (`HOME/compiled`): written by its trusted runs, lent to all."""
    return home / "compiled"
