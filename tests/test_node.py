"""`swarm join` as a volunteer runs it: a real bootstrap and a real node in separate processes on
loopback, researching on the `test` profile; `swarm status` while it runs; a clean stop; a resume."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Process, wait_until

from node.identity import Identity

CAMPAIGN = "node-test"


def count(db: Path, sql: str) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        try:
            return conn.execute(sql).fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def runs_of_the_node(home: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(home) in (entry / "cmdline").read_bytes().decode(
                errors="replace"
            ):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.mark.sandbox  # a node runs peers' code only in the sandbox
@pytest.mark.slow
def test_a_node_joins_researches_reports_stops_cleanly_and_resumes(
    tmp_path, small_data, data_cache
):
    env = {**os.environ, "SWARM_DATA": str(data_cache), "COLUMNS": "200"}
    boot_home, home = tmp_path / "bootstrap", tmp_path / "node"
    boot = Process(
        "bootstrap",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--campaign",
        CAMPAIGN,
        "--home",
        str(boot_home),
        env=env,
    )
    join_args = (
        "join",
        "--bootstrap",
        None,
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--profile",
        "test",
        "--campaign",
        CAMPAIGN,
        "--home",
        str(home),
    )
    node = None
    try:
        address = boot.wait_for(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)", 60).group(1)
        args = [a if a is not None else address for a in join_args]
        node = Process(*args, env=env)
        # One run scores the baseline, then each research step (child and baseline paired on
        # each seed) publishes a signed result, which the gossip layer carries to the bootstrap.
        wait_until(
            lambda: count(boot_home / "ledger.db", "SELECT COUNT(*) FROM results") >= 1,
            "a result reaches the bootstrap",
            timeout=240,
        )
        status = json.loads(
            subprocess.run(
                [sys.executable, "-m", "node.cli", "status", "--home", str(home), "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
        )
        worker = status["workers"][0]
        assert worker["profile"] == "test" and worker["margin"] > 0 and worker["steps"] >= 1
        assert worker["head"] and len(status["network"]["connected"]) >= 1
        assert node.stop() == 0
        assert "stopping (SIGINT): ending the current run" in "".join(node.lines).replace("\n", "")
        assert not runs_of_the_node(home)  # the run in flight was ended with the node
        with sqlite3.connect(home / "ledger.db") as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        scored = count(home / "ledger.db", "SELECT COUNT(*) FROM runs WHERE description = 'score'")
        steps_before = count(home / "ledger.db", "SELECT COUNT(*) FROM facts")
        assert scored == 1 and steps_before >= 1

        node = Process(
            *args, env=env
        )  # a restart resumes: the head's score is kept, more experiments
        wait_until(
            lambda: count(home / "ledger.db", "SELECT COUNT(*) FROM facts") > steps_before,
            "a new experiment after the restart",
            timeout=240,
        )
        assert (
            count(home / "ledger.db", "SELECT COUNT(*) FROM runs WHERE description = 'score'") == 1
        )
    finally:
        for process in (node, boot):
            if process is not None:
                process.stop()


def test_without_bubblewrap_a_node_says_so_and_runs_only_its_own_and_trusted_code(
    tmp_path, small_data, data_cache
):
    # A PATH without bubblewrap on it: what a laptop without the package looks like to the node.
    env = {
        **os.environ,
        "SWARM_DATA": str(data_cache),
        "PATH": str(Path(sys.executable).parent),
    }  # 80 columns
    args = ["join", "--listen", "/ip4/127.0.0.1/tcp/0", "--profile", "test", "--campaign", CAMPAIGN]
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "node.cli",
            *args,
            "--trust",
            "not-a-peer",
            "--home",
            str(tmp_path / "bad"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "--trust not-a-peer: not a peer id" in bad.stderr
    friend = Identity.generate().peer_id
    node = Process(*args, "--trust", friend, "--home", str(tmp_path / "node"), env=env)
    try:
        node.wait_for(
            r"no sandbox \(bubblewrap\) on this machine: this node runs only its own train\.py "
            r"versions and those of the 1 peer\(s\) you trust",
            60,
        )
        node.wait_for("listening on", 60)
        line = next(line for line in node.lines if "listening on" in line)  # whole, to be copied
        assert re.fullmatch(r"listening on /ip4/127\.0\.0\.1/tcp/\d+/p2p/\w{46,}\n", line), line
    finally:
        assert node.stop() == 0


@pytest.mark.slow
def test_a_node_whose_builtin_baseline_moved_since_its_first_runs_says_so(
    tmp_path, small_data, data_cache
):
    # A home whose lineage began on an older built-in train.py: what an upgrade leaves.
    from node.ledger import Ledger, ledger_path

    home = tmp_path / "node"
    old = hashlib.sha256(b"the previous version's baseline").hexdigest()
    with Ledger(ledger_path(home), campaign=CAMPAIGN) as ledger:
        for _ in range(2):
            ledger.record_run(
                profile="test",
                parent=old,
                child=old,
                outcome="ok",
                val_bpb=3.0,
                description="noise",
            )
    env = {**os.environ, "SWARM_DATA": str(data_cache)}
    node = Process(
        "join",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--profile",
        "test",
        "--campaign",
        CAMPAIGN,
        "--home",
        str(home),
        "--no-sandbox",
        env=env,
    )
    try:
        node.wait_for(
            rf"this home's runs began on another baseline \({old[:12]}\) than this version's "
            r"built-in train\.py \(\w{12}\): an upgrade changed it, so the node starts a new lineage",
            60,
        )
        # It goes on from the new baseline: its score of it, after which the warning has no cause.
        wait_until(
            lambda: (
                count(
                    ledger_path(home),
                    "SELECT COUNT(DISTINCT child) FROM runs WHERE description IN "
                    "('noise', 'score')",
                )
                == 2
            ),
            "a score of the new baseline",
            timeout=120,
        )
    finally:
        assert node.stop() == 0
    from node.node import baseline_moved

    assert baseline_moved(home, CAMPAIGN, "test") is None
    assert baseline_moved(tmp_path / "new", CAMPAIGN, "test") is None  # no ledger: nothing moved


def test_two_workers_take_turns_on_each_gpu_and_one_works_on_the_cpu():
    from node.node import WORKERS_PER_GPU, worker_slots

    slots = worker_slots([0, 1])
    assert [device for device, _ in slots] == [0] * WORKERS_PER_GPU + [1] * WORKERS_PER_GPU
    first, second = {id(t) for d, t in slots if d == 0}, {id(t) for d, t in slots if d == 1}
    assert len(first) == len(second) == 1 and first != second  # one GpuTurns a device, shared
    assert worker_slots([None]) == [(None, None)]
