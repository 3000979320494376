"""The harness is what it says: its hash is its version and the hash of every harness file,
found by the code, and a change to any of them without a new version fails here."""

from __future__ import annotations

import json
from pathlib import Path

from node.trainer import version

RECORD = Path(__file__).with_name("harness_versions.json")


def test_the_harness_files_are_every_file_of_the_trainer_but_train_py():
    here = Path(version.__file__).parent
    found = {p.name for p in version.harness_files()}
    assert found == {p.name for p in here.glob("*.py")} - {"train.py"}


def test_a_change_to_the_harness_moves_its_version():
    """Each version is recorded with the hash of its files: files that changed under an old
    version fail; a new version needs a new line in tests/harness_versions.json."""
    record = json.loads(RECORD.read_text())
    assert len(set(record.values())) == len(record), "two versions share one set of files"
    files = version.harness_files_sha256()
    assert version.HARNESS_VERSION in record, (
        f"HARNESS_VERSION {version.HARNESS_VERSION!r} is not recorded: add "
        f'"{version.HARNESS_VERSION}": "{files}" to {RECORD.name}'
    )
    assert record[version.HARNESS_VERSION] == files, (
        f"the harness's files changed but HARNESS_VERSION ({version.HARNESS_VERSION}) did not: "
        f"move it in node/trainer/version.py and record its files' hash {files} in {RECORD.name}"
    )


def test_the_harness_hash_is_its_version_and_its_files():
    before = version.harness_sha256()
    try:
        version.HARNESS_VERSION += "+next"
        assert version.harness_sha256() != before
    finally:
        version.HARNESS_VERSION = version.HARNESS_VERSION.removesuffix("+next")
    assert version.harness_sha256() == before
