"""`swarm` as a newcomer meets it: real processes, real exit codes, one-line errors; a run that
crashed fails a script, a bad address or home is refused before anything is written."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest
from conftest import Process, wait_until

from node.gossip.peer import STATUS_FILE


def swarm(
    *args: str, cache=None, home=None, env: dict | None = None
) -> subprocess.CompletedProcess:
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


# ---------------------------------------------------------------- join: the address, the GPUs, the home


@pytest.mark.slow
def test_a_malformed_bootstrap_or_gpus_is_refused_before_any_key_or_data_is_written(tmp_path):
    home = tmp_path / "new-home"
    peer = "12D3KooWBtLKtwxQvEnB3wZZEr39r71n6GLa56xtPEnMCok1C6VZ"
    for args, words in [
        (["--bootstrap", "127.0.0.1:4001"], "--bootstrap 127.0.0.1:4001: not a multiaddr"),
        (["--bootstrap", "/ip4/127.0.0.1/tcp/4001"], "it lacks /p2p/<peer id>"),
        (["--bootstrap", "/ip4/127.0.0.1/tcp/4001/p2p/xyz"], "not a multiaddr"),
        (["--bootstrap", f"/ip4/127.0.0.1/tcp/4001/p2p/{peer}", "--gpus", "foo"],
         "--gpus foo: pass 'all' or how many GPUs to use"),
        (["--gpus", "0"], "--gpus 0: pass 'all'"),
        (["--listen", "/ip4/127.0.0.1/tcp/notaport"], "is not a multiaddr"),
        (["--proposer", "blind"], "--proposer blind: pass learning or fixed"),
        (["--proposer", "fixed", "--model", "openai/m"], "leave out --model openai/m"),
    ]:  # fmt: skip
        done = swarm("join", "--profile", "test", *args, "--home", str(home))
        assert done.returncode == 1, (args, done.stderr)
        assert words in one_error_line(done), args
        assert "e.g. " in done.stderr  # what to do, not only what was wrong
        assert not home.exists(), args  # no key, no ledger, no data


@pytest.mark.slow
def test_an_unusable_home_is_a_one_line_error(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    writers = (
        ["join", "--profile", "test"],
        ["keys", "show"],
        ["data", "build", "--profile", "test"],
    )
    readers = (["status"], ["ledger", "summary"], ["report", "--out", str(tmp_path / "r")])
    for home, words in [(a_file, "is not a directory"), (a_file / "below", "cannot make the home")]:
        for args in (*writers, *readers):
            done = swarm(*args, "--home", str(home))
            assert done.returncode == 1, (args, done.stderr)
            line = one_error_line(done)
            assert str(home) in line, args
            if args in writers or home == a_file:  # a reader finds no node below a file
                assert words in line, args


@pytest.mark.slow
def test_read_only_commands_never_create_a_home(tmp_path):
    home = tmp_path / "absent"
    for args in (["status"], ["peers"], ["ledger", "summary"], ["ledger", "experiments"],
                 ["ledger", "peers"], ["ledger", "leaderboard"], ["report", "--out", str(tmp_path / "r")]):  # fmt: skip
        done = swarm(*args, "--home", str(home))
        assert done.returncode == 1, (args, done.stderr)
        one_error_line(done)
        assert not home.exists(), args
    done = swarm("status", env={"SWARM_HOME": str(home)})  # the home from the environment, too
    assert done.returncode == 1 and not home.exists()


@pytest.mark.slow
def test_join_says_at_once_that_the_bootstrap_cannot_be_reached_and_when_it_connects(
    tmp_path, small_data, data_cache
):
    with socket.socket() as probe:  # a port nothing listens on, yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    boot_home = tmp_path / "bootstrap"
    made = swarm("keys", "new", "--home", str(boot_home), "--json")
    peer_id = json.loads(made.stdout)["peer_id"]
    address = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id}"
    env = {**os.environ, "SWARM_DATA": str(data_cache), "COLUMNS": "200"}
    node = Process("join", "--bootstrap", address, "--listen", "/ip4/127.0.0.1/tcp/0", "--profile",
                   "test", "--campaign", "cli-test", "--no-sandbox", "--home", str(tmp_path / "node"),
                   env=env)  # fmt: skip
    boot = None
    try:
        node.wait_for("listening on", 120)
        listening = time.monotonic()
        node.wait_for(re.escape(f"cannot reach the bootstrap {address}: nothing answers there; "
                                "retrying"), 30)  # fmt: skip
        assert time.monotonic() - listening < 10  # at once, not after minutes
        said = "".join(node.lines)
        assert said.count("cannot reach the bootstrap") == 1  # said once while it retries
        boot = Process("bootstrap", "--listen", f"/ip4/127.0.0.1/tcp/{port}", "--campaign",
                       "cli-test", "--home", str(boot_home), env=env)  # fmt: skip
        boot.wait_for(re.escape(address), 60)  # it listens: the node's next dial finds it
        assert address in (boot_home / "address").read_text().split()  # for whoever hands it out
        node.wait_for(re.escape(f"connected to the bootstrap {address}"), 45)  # not a minute late
    finally:
        assert node.stop() == 0
        if boot is not None:
            boot.stop()


# ---------------------------------------------------------------- status and peers of a stopped node


@pytest.mark.slow
def test_status_and_peers_say_when_a_node_stopped_and_round_what_they_show(tmp_path):
    home = tmp_path / "node"
    env = {**os.environ, "COLUMNS": "200"}
    node = Process("peer", "--campaign", "cli-test", "--listen", "/ip4/127.0.0.1/tcp/0", "--home",
                   str(home), env=env)  # fmt: skip
    try:
        wait_until(lambda: (home / STATUS_FILE).is_file(), "the node's gossip status", 60)
        (home / "status").mkdir()  # what a research worker writes as it goes
        (home / "status" / "worker-0.json").write_text(json.dumps(
            {"doing": "research: training", "profile": "test", "head": "ab" * 32,
             "head_val_bpb": 2.309579818357533, "steps": 3, "proposer": "fixed"}))  # fmt: skip
        for command in ("status", "peers"):
            live = swarm(command, "--home", str(home))
            assert live.returncode == 0 and "not running" not in live.stdout, live.stdout
        shown = swarm("status", "--home", str(home)).stdout
        assert "val_bpb 2.3096 " in shown and "2.30957" not in shown
        assert re.search(r"proposer +│ fixed", shown), shown
        assert re.search(r"updated +│ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+ s ago\)", shown), (
            shown
        )
        assert json.loads(swarm("status", "--json", "--home", str(home)).stdout)["running"] is True
    finally:
        assert node.stop() == 0
    stopped = time.time()
    for command in ("status", "peers"):
        done = swarm(command, "--home", str(home))
        assert done.returncode == 0, done.stderr
        first = done.stdout.splitlines()[0]
        said = re.fullmatch(rf"the node in {re.escape(str(home))} is not running \(it stopped at "
                            r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC\): below is what it last wrote; "
                            rf"start it again with `swarm join --home {re.escape(str(home))} \.\.\.`",
                            first)  # fmt: skip
        assert said, first
        at = datetime.strptime(said.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
        assert stopped - 10 < at.timestamp() <= stopped + 1
        as_json = json.loads(swarm(command, "--json", "--home", str(home)).stdout)
        assert as_json["running"] is False and stopped - 10 < as_json["stopped_at"] <= stopped + 1


def test_status_reads_a_home_whose_ledger_a_node_is_still_creating(tmp_path):
    # A node's first moments: SQLite has made the file, the schema is not committed yet. A status
    # read then (by `swarm status`, or the demo's table each second) says so and goes on.
    home = tmp_path / "node"
    (home / "status").mkdir(parents=True)
    (home / "status" / "worker-0.json").write_text(json.dumps({"doing": "starting"}))
    (home / "ledger.db").write_bytes(b"")
    done = swarm("status", "--home", str(home))
    assert done.returncode == 0, done.stderr
    assert f"ledger: {home / 'ledger.db'} holds no ledger yet" in " ".join(done.stdout.split())
    shown = json.loads(swarm("status", "--json", "--home", str(home)).stdout)
    assert "no ledger yet" in shown["ledger"]["error"]


def test_a_data_folder_that_cannot_be_made_is_a_one_line_error(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    done = swarm("data", "build", "--profile", "test", "--home", str(tmp_path / "home"),
                 env={"SWARM_DATA": str(a_file / "data")})  # fmt: skip
    assert done.returncode == 1
    assert one_error_line(done) == (f"error: cannot make the data folder {a_file / 'data'}: Not a "
                                    "directory; set SWARM_DATA to a folder you can write")  # fmt: skip


def test_a_bootstrap_that_is_down_is_asked_again_within_seconds_other_peers_back_off(monkeypatch):
    from node.gossip import limits

    clock = [1000.0]
    monkeypatch.setattr(limits.time, "monotonic", lambda: clock[0])
    book = limits.PeerBook(limits.Limits())
    book.add("boot", ["/ip4/127.0.0.1/tcp/1"], bootstrap=True)
    book.add("peer", ["/ip4/127.0.0.1/tcp/2"])
    for _ in range(10):  # down for minutes: each dial fails as soon as it is due
        for who in ("boot", "peer"):
            book.dialed(who, ok=False)
        clock[0] += 12.1  # the longest a bootstrap waits, with its jitter
        assert "boot" in book.candidates(set())
    assert "peer" not in book.candidates(set())  # a minute, at most, for the others


def test_a_bootstrap_address_with_another_peers_id_is_said_to_be_so(tmp_path):
    env = {**os.environ, "COLUMNS": "200"}
    first = Process("peer", "--campaign", "cli-test", "--listen", "/ip4/127.0.0.1/tcp/0",
                    "--home", str(tmp_path / "first"), env=env)  # fmt: skip
    second = None
    try:
        address = first.wait_for(r"(/ip4/127\.0\.0\.1/tcp/\d+)/p2p/\w+", 60).group(1)
        other = json.loads(swarm("keys", "new", "--home", str(tmp_path / "k"), "--json").stdout)
        wrong = f"{address}/p2p/{other['peer_id']}"  # a peer listens there, but not this one
        second = Process("peer", "--campaign", "cli-test", "--bootstrap", wrong, "--listen",
                         "/ip4/127.0.0.1/tcp/0", "--home", str(tmp_path / "second"), env=env)  # fmt: skip
        second.wait_for(re.escape(f"cannot reach the bootstrap {wrong}: a peer answers there, but "
                                  "not with the peer id after /p2p/; retrying"), 60)  # fmt: skip
    finally:
        for process in (second, first):
            if process is not None:
                assert process.stop() == 0
