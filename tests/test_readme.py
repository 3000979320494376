"""The README's commands are the contract with a new user: they exist, and the main one works."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    block = re.search(r"## Two commands\n\n```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md lost its block of two commands"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_names_two_commands_that_exist_and_ci_runs_the_test_one():
    commands = readme_commands()
    assert commands == ["scripts/demo", "scripts/test"]
    for command in commands:
        assert os.access(ROOT / command, os.X_OK)
    assert "scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_the_main_command_runs_one_cpu_experiment_end_to_end(tmp_path, data_cache):
    env = {**os.environ, "SWARM_HOME": str(tmp_path / "home"), "SWARM_DATA": str(data_cache)}
    done = subprocess.run([str(ROOT / "scripts" / "demo"), "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "ok" and result["profile"] == "cpu"
    assert 1.0 < result["val_bpb"] < 3.5  # a uniform guess scores about 3.9 on this vocabulary
    assert result["train_seconds"] >= 120 and result["tokens"] > 100_000
    assert (tmp_path / "home" / "runs").is_dir()
