"""Data the trainer tests share: the `test` profile's corpus and shards, built once per session.

Set SWARM_TEST_DATA to a folder to keep the build between sessions (it is rebuilt when absent).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node.trainer import get_profile, prepare_data


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    keep = os.environ.get("SWARM_TEST_DATA")
    return Path(keep) if keep else tmp_path_factory.mktemp("swarm-data")


@pytest.fixture(scope="session")
def test_data(data_cache):
    return prepare_data(get_profile("test"), data_cache)
