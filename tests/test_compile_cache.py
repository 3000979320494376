"""The node's compiled kernels: lent to every run, written only by trusted runs, never replaced.

The real test compiles the test profile's model with torch.compile on the CPU, in the sandbox."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from node.trainer import BASELINE_TRAIN_PY, get_profile, run_experiment
from node.trainer.compile_cache import RUN_FOLDER, CompileCache
from node.trainer.sandbox import sandbox_uid

COMPILED = BASELINE_TRAIN_PY.read_text().replace(
    'COMPILE = S.device.type == "cuda"', "COMPILE = True"
)
WIDER = COMPILED.replace('"test": (2, 64, 32, 16, 1)', '"test": (2, 96, 32, 16, 1)')
PROFILE = dataclasses.replace(get_profile("test"), budget_tokens=2**15, startup_seconds=240)


class Counting(CompileCache):
    """A store that remembers how many bytes each `keep` added."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.added: list[int] = []

    def keep(self, run_dir) -> int:
        self.added.append(super().keep(run_dir))
        return self.added[-1]


def files_of(root) -> dict[str, int]:
    return {
        os.path.relpath(os.path.join(folder, name), root): os.lstat(
            os.path.join(folder, name)
        ).st_size
        for folder, _, names in os.walk(root)
        for name in names
    }


@pytest.mark.slow
def test_a_trusted_run_fills_the_store_a_strangers_run_adds_nothing_and_a_rerun_compiles_nothing(
    tmp_path, small_data
):
    if shutil.which("g++") is None:
        pytest.skip("torch.compile on the CPU needs a C++ compiler")
    store = Counting(tmp_path / "store")

    def run(source: str, name: str, keep: bool):
        script = tmp_path / f"{name}.py"
        script.write_text(source)
        result = run_experiment(
            script, PROFILE, small_data, tmp_path / name, compile_cache=store, keep_compiled=keep
        )
        assert result.outcome == "ok", result.error
        assert not (tmp_path / name / RUN_FOLDER).exists()  # the run's copy is removed
        return result

    run(COMPILED, "trusted", keep=True)
    filled = files_of(store.root)
    assert store.added[0] > 0 and filled, "a cold compile added nothing to the store"
    assert all((store.root / f).stat().st_mode & 0o222 == 0 for f in filled)  # read-only
    run(WIDER, "stranger", keep=False)  # other shapes: new kernels, compiled but not kept
    assert files_of(store.root) == filled and len(store.added) == 1
    shutil.rmtree(tmp_path / "trusted")  # entries must not lean on the folder they came from
    run(COMPILED, "again", keep=True)  # every kernel comes from the store
    assert store.added[1] == 0 and files_of(store.root) == filled


def test_keep_adds_only_new_plain_files_and_never_replaces_an_entry(tmp_path):
    store = CompileCache(tmp_path / "store")
    run = tmp_path / "run" / RUN_FOLDER
    (run / "triton" / "abc").mkdir(parents=True)
    (run / "triton" / "abc" / "kernel.cubin").write_bytes(b"first")
    assert store.keep(tmp_path / "run") == 5
    (run / "triton" / "abc" / "kernel.cubin").write_bytes(b"second, planted")
    (run / "inductor" / "locks").mkdir(parents=True)
    (run / "inductor" / "locks" / "x.lock").write_text("")
    (run / "inductor" / "entry.lock").write_text("")
    (run / "inductor" / "secret").symlink_to("/etc/passwd")
    assert store.keep(tmp_path / "run") == 0
    assert files_of(store.root) == {"triton/abc/kernel.cubin": 5}
    assert (store.root / "triton" / "abc" / "kernel.cubin").read_bytes() == b"first"
    assert (store.root / "triton" / "abc" / "kernel.cubin").stat().st_mode & 0o777 == 0o444


def test_the_store_is_emptied_when_it_passes_its_limit(tmp_path):
    store = CompileCache(tmp_path / "store", max_bytes=10)
    run = tmp_path / "run" / RUN_FOLDER
    run.mkdir(parents=True)
    (run / "a").write_bytes(b"123456")
    store.keep(tmp_path / "run")
    assert files_of(store.root) == {"a": 6}
    (run / "b").write_bytes(b"123456")
    store.keep(tmp_path / "run")
    assert files_of(store.root) == {}


@pytest.fixture
def open_folder():
    """A folder that another uid can reach (pytest's own are private to their user)."""
    folder = Path(tempfile.mkdtemp(prefix="swarm-cache-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.sandbox
def test_a_lent_copy_cannot_change_the_store_from_the_sandbox_uid(open_folder):
    uid = sandbox_uid()
    if uid is None:
        pytest.skip("needs a root node, which runs its sandbox as a uid of its own")
    tmp_path = open_folder
    store = CompileCache(tmp_path / "store")
    (store.root / "triton").mkdir()
    entry = store.root / "triton" / "kernel.cubin"
    entry.write_bytes(b"honest")
    entry.chmod(0o444)
    (store.root / "nv").mkdir()
    index = store.root / "nv" / "index"
    index.write_bytes(b"driver")
    index.chmod(0o444)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chown(run_dir, uid, uid)
    assert store.lend(run_dir, uid) == run_dir / RUN_FOLDER
    lent = run_dir / RUN_FOLDER / "triton" / "kernel.cubin"
    assert lent.read_bytes() == b"honest" and lent.stat().st_ino == entry.stat().st_ino
    as_uid = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    read = subprocess.run([*as_uid, "cat", str(lent)], capture_output=True)
    assert read.stdout == b"honest", read.stderr  # the uid reaches the copy, and reads it
    write = subprocess.run([*as_uid, "sh", "-c", f"echo planted > {lent}"], capture_output=True)
    chmod = subprocess.run([*as_uid, "chmod", "666", str(lent)], capture_output=True)
    assert write.returncode != 0 and chmod.returncode != 0
    # What the run may do is replace its own link: the store's entry stays as it was.
    replace = subprocess.run(
        [*as_uid, "sh", "-c", f"echo planted > {lent}.new && mv -f {lent}.new {lent}"],
        capture_output=True,
    )
    assert replace.returncode == 0, replace.stderr
    assert entry.read_bytes() == b"honest" and lent.read_bytes() == b"planted\n"
    # The CUDA driver's cache is the run's own copy: it rewrites its index in place.
    own = run_dir / RUN_FOLDER / "nv" / "index"
    assert own.stat().st_ino != index.stat().st_ino
    update = subprocess.run([*as_uid, "sh", "-c", f"echo more >> {own}"], capture_output=True)
    assert update.returncode == 0, update.stderr
    assert index.read_bytes() == b"driver" and own.read_bytes() == b"drivermore\n"
