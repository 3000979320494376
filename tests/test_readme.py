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


def test_the_main_command_runs_a_local_swarm_and_reports_where_its_ledgers_are(tmp_path, data_cache):
    # The README's command as a user runs it, on the seconds-long test profile and for 2 minutes
    # (the cpu profile's 10 minutes are measured in docs/node.md, not here).
    env = {**os.environ, "SWARM_HOME": str(tmp_path / "home"), "SWARM_DATA": str(data_cache)}
    done = subprocess.run([str(ROOT / "scripts" / "demo"), "--profile", "test", "--minutes", "2", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["profile"] == "test" and result["exit_codes"] == [0, 0, 0, 0]  # bootstrap and 3 nodes
    assert 110 <= result["seconds"] < 400
    for node in result["nodes"]:
        assert Path(node["ledger"]).is_file() and node["experiments"] >= 1, node
    assert "min left]" in done.stderr  # progress while it ran, one line every 30 s without a terminal
    assert "stopping the nodes" in done.stderr
