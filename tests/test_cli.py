"""`swarm` as a newcomer meets it: real processes, real exit codes, one-line errors; a run that
crashed fails a script, a bad address or home is refused before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def swarm(*args: str, cache=None, home=None, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    if cache is not None:
        env["SWARM_DATA"] = str(cache)
    if home is not None:
        env["SWARM_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip


def one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_run_json_of_a_crashed_run_exits_two_like_the_table(tmp_path, small_data, data_cache):
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('this train.py is broken')\n")
    done = swarm("run", "--profile", "test", "--train-py", str(broken), "--json", cache=data_cache,
                 home=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout)["outcome"] == "crash"
