"""What a `pip install` gives a user: program.md and the licence inside the wheel, the extras
(llm, report, web) asked for by name when missing, and the locked versions matching the pins."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from node.agent.errors import ModelError
from node.agent.llm import LLMProposer
from node.trainer import webdata
from node.trainer.errors import TrainerError

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = ("litellm", "matplotlib", "pyarrow")


def _name(requirement: str) -> str:
    return re.split(r"[\[=<>!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the source tree (the copy keeps the tree clean)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE", "program.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("node", "bootstrap"):
        shutil.copytree(ROOT / package, src / package, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    return next(out.glob("research_swarm-*.whl"))


def test_the_wheel_holds_program_md_as_the_top_level_file_and_the_licence(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert archive.read("node/program.md") == (ROOT / "program.md").read_bytes()
        licence = [n for n in names if n.endswith("LICENSE") and ".dist-info/" in n]
        assert licence and archive.read(licence[0]) == (ROOT / "LICENSE").read_bytes()
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n\nCopyright (c) 2026 ")
    assert PYPROJECT["project"]["license"] == {"text": "MIT"}


def test_a_non_editable_install_gives_the_llm_its_strategy(wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    read = subprocess.run(
        [sys.executable, "-c", "import node, node.node as n; print(node.__file__); "
         "print(n._program_text(), end='')"],
        cwd=tmp_path, env={"PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr[-2000:]
    where, _, text = read.stdout.partition("\n")
    assert Path(where).is_relative_to(site)
    assert text == (ROOT / "program.md").read_text() and text.strip()


def test_the_wheel_needs_no_extra_to_install_and_offers_each_by_name(wheel):
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(n) for n in archive.namelist() if n.endswith("/METADATA"))
    lines = metadata.decode().splitlines()
    core = [line.split(":", 1)[1].strip() for line in lines
            if line.startswith("Requires-Dist:") and "extra ==" not in line]  # fmt: skip
    assert core and not {_name(r) for r in core} & set(EXTRAS)
    offered = {
        line.split(":", 1)[1].strip() for line in lines if line.startswith("Provides-Extra:")
    }
    assert {"llm", "report", "web", "test"} <= offered


def test_the_commands_start_without_any_extra():
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in EXTRAS)
    code = (f"import sys; {blocked}; import node.node, node.trainer.data, node.report; "
            "sys.argv = ['swarm', '--help']; from node.cli import main; main()")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Usage" in done.stdout


def test_a_model_without_litellm_asks_for_the_llm_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "litellm", None)
    with pytest.raises(ModelError, match=re.escape("pip install 'research-swarm[llm]'")):
        LLMProposer("openai/some-model", "http://127.0.0.1:9/v1")


def test_a_parquet_shard_without_pyarrow_asks_for_the_web_extra_before_it_downloads(
    monkeypatch, tmp_path
):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    said: list[str] = []
    folder = tmp_path / "shards"
    with pytest.raises(TrainerError, match=re.escape("pip install 'research-swarm[web]'")):
        webdata.download(
            webdata.Shard("http://127.0.0.1:9/shard_00000.parquet"), folder, said.append
        )
    assert not said and not folder.exists()  # nothing fetched, nothing written
    with pytest.raises(TrainerError, match=re.escape("'research-swarm[web]'")):
        list(webdata.documents(tmp_path / "shard.parquet"))


def test_the_locked_versions_are_the_pinned_ones():
    lock = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            lock[_name(name)] = version
    assert "research-swarm" not in lock
    project = PYPROJECT["project"]
    pins = project["dependencies"] + [
        r for rs in project["optional-dependencies"].values() for r in rs
    ]
    for pin in pins:
        if _name(pin) != "research-swarm":
            name, _, version = pin.partition("==")
            assert lock.get(_name(name)) == version.strip(), (
                f"{pin} is locked at {lock.get(_name(name))}"
            )
    assert "-c constraints.txt" in (ROOT / "scripts" / "setup").read_text()


def test_setup_names_a_missing_compiler_before_it_installs_anything(tmp_path):
    """A machine without a C compiler (fastecdsa is compiled during the install): one line says
    what to install, and nothing is installed."""
    for name in ("scripts", "constraints.txt", "pyproject.toml"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, tmp_path / name)
    tools = tmp_path / "bin"  # a PATH with no cc, gcc or apt-get
    tools.mkdir()
    for tool in ("bash", "env", "id", "uname", "dirname", "cat"):
        (tools / tool).symlink_to(shutil.which(tool))
    (tools / "python3").symlink_to(sys.executable)
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup")], env={"PATH": str(tools)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "setup: no C compiler, which fastecdsa (a libp2p dependency) is compiled with: " \
        "install gcc\n" in done.stderr  # fmt: skip
    assert "then run scripts/setup again" in done.stderr.splitlines()[-1]
    assert not (tmp_path / ".venv").exists()


def test_the_readme_activates_the_venv_before_its_first_bare_swarm_command():
    """`swarm` lives in .venv/bin: the README says to activate it before any command that uses
    it, and setup ends by printing the same line."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    first_swarm = next(i for i, line in enumerate(lines) if line.startswith("swarm "))
    assert "source .venv/bin/activate" in lines[:first_swarm]
    assert "source .venv/bin/activate" in (ROOT / "scripts" / "setup").read_text()
