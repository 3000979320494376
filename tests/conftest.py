"""Shared fixtures: identities and signed facts built the way a node builds them, the test data,
and `swarm` commands run in processes of their own. A test that cannot run here (no sandbox, no
browser) is a failure in CI and a skip that says why elsewhere (`unavailable`)."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import pytest

from node import consensus, wire
from node.agent.adoption import descends_from
from node.identity import Identity
from node.ledger import Ledger, LedgerError
from node.trainer.sandbox import sandbox_available

# The scripts' folder, for the helpers tests share with the benchmarks (scripts/synthetic.py).
sys.path.append(str(Path(__file__).resolve().parents[1] / "scripts"))

CAMPAIGN = "demo"
HARNESS = "ab" * 32
BASELINE = "00" * 32
T0 = 1_790_000_000_000  # a fixed clock (ms), so that tests never depend on today's date
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")  # .ci/run sets CI=true
# pytest-xdist's workers export COLUMNS=80: the command line's consoles, made at import, would
# keep that width whatever width a test runs a command with. A terminal's own width is read anew.
os.environ.pop("COLUMNS", None)


def unavailable(why: str) -> NoReturn:
    """End a test that cannot run on this machine: in CI a failure, since a green run must hold
    every test; elsewhere a skip, listed with `why` (pytest's -rs, in the pyproject's addopts)."""
    if IN_CI:
        pytest.fail(f"in CI: {why}", pytrace=False)
    pytest.skip(why)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("sandbox") and not sandbox_available():
        unavailable("bubblewrap cannot run here, and this test runs code in the sandbox "
                    "(scripts/setup installs bubblewrap as root)")  # fmt: skip


def make_result(
    who: Identity, seq: int, parent: str, child: str, val_bpb: float | None, *,
    outcome: str = "keep", profile: str = "cpu", harness: str = HARNESS, time_ms: int | None = None,
    description: str = "an experiment", device: str = "",
) -> wire.Fact:  # fmt: skip
    metrics = {"val_bpb": val_bpb, "steps": 100, "tokens": 51200, "train_seconds": 60.0,
               "total_seconds": 75.5, "peak_memory_mb": 812.0, "mfu": 0.02}  # fmt: skip
    body = wire.result_body(
        parent=parent, child=child, diff=f"diff {seq} {child}".encode(), description=description,
        profile=profile, harness=harness, seed=seq, outcome=outcome, metrics=metrics,
        device=device,
    )  # fmt: skip
    return wire.sign(
        who, "result", CAMPAIGN, seq, body, T0 + seq * 1000 if time_ms is None else time_ms
    )


def make_verification(
    who: Identity, seq: int, result: wire.Fact, verdict: str = "confirm", *,
    harness: str = HARNESS, delta: float = -0.05, seed: int = 7,
) -> wire.Fact:  # fmt: skip
    body = wire.verification_body(
        result=result.id, child_val_bpb=1.5 + delta, parent_val_bpb=1.5, seed=seed,
        profile=result.body["profile"], harness=harness, verdict=verdict,
    )  # fmt: skip
    return wire.sign(who, "verification", CAMPAIGN, seq, body, T0 + 500_000 + seq * 1000)


def confirming_looks(
    who: Identity, seq: int, result: wire.Fact, looks: int = consensus.HOLD_LOOKS, *,
    harness: str = HARNESS, delta: float = -0.05,
) -> list[wire.Fact]:  # fmt: skip
    """`looks` confirmations of `result` by `who`, with seqs from `seq` on, each on a fresh seed:
    by default the looks the outlier hold asks of a claim (`consensus.HOLD_LOOKS`), as the first
    verified win of a profile needs, whatever its gain."""
    return [make_verification(who, seq + i, result, harness=harness, delta=delta, seed=7 + i)
            for i in range(looks)]  # fmt: skip


def set_terms(book, quorum: int = 1, baseline: str = BASELINE, organiser: str | None = None,
              members: list[str] | None = None) -> None:  # fmt: skip
    """Judge `book` (a Ledger of CAMPAIGN) as a node would that joined it: on `baseline`."""
    book.set_terms({"name": CAMPAIGN, "organiser": organiser, "baseline": baseline,
                    "quorum": quorum, "members": members, "fact": None})  # fmt: skip


def vote_row(
    rid: str, author: str, verdict: str = "confirm", *, profile: str = "cpu", harness: str = "h",
    delta: float | None = -0.01, seed: int = 7,
) -> dict:  # fmt: skip
    """A verification as the flat row `consensus` reads (result, author, verdict, profile,
    harness, delta, seed)."""
    return {"result": rid, "author": author, "verdict": verdict, "profile": profile,
            "harness": harness, "delta": delta, "seed": seed}  # fmt: skip


def looks_rows(rid: str, author: str, looks: int = consensus.HOLD_LOOKS, **kwargs) -> list[dict]:
    """`looks` confirming rows of `rid` by `author`, each on a fresh seed (`vote_row`)."""
    return [vote_row(rid, author, seed=7 + i, **kwargs) for i in range(looks)]


@pytest.fixture
def alice() -> Identity:
    return Identity(bytes(range(32)))


@pytest.fixture
def bob() -> Identity:
    return Identity(bytes(range(1, 33)))


@pytest.fixture
def carol() -> Identity:
    return Identity(bytes(range(2, 34)))


@pytest.fixture
def mallory() -> Identity:
    return Identity(bytes(range(3, 35)))


@pytest.fixture
def dave() -> Identity:
    return Identity(bytes(range(4, 36)))


# ---------------------------------------------------------------------------------------------
# The trainer's data: the `test` profile's corpus and shards, built once per session. Set
# SWARM_TEST_DATA to a folder to keep the build between sessions (rebuilt when absent).


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    import os
    from pathlib import Path

    keep = os.environ.get("SWARM_TEST_DATA")
    return Path(keep) if keep else tmp_path_factory.mktemp("swarm-data")


@pytest.fixture(scope="session")
def small_data(data_cache):
    from node.trainer import get_profile, prepare_data

    return prepare_data(get_profile("test"), data_cache)


def wait_until(predicate, what: str, timeout: float = 60.0, every: float = 0.2, explain=None):
    """Poll `predicate` until it returns something true (returned), or fail after `timeout` s,
    with what `explain()` (if given) says of the state it was waiting on."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    said = f": {explain()}" if explain is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{said}")


class Process:
    """A `swarm` command in its own process, its output collected as it comes."""

    def __init__(self, *args: str, env: dict) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "node.cli", *args], env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, "".join(self.lines).replace("\n", ""))
            if found:
                return found
            assert self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{''.join(self.lines)}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
        return self.proc.returncode


def run_swarm(*args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """A `swarm` command run to its end, its output captured."""
    return subprocess.run([sys.executable, "-m", "node.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def worker_builds_on(home: Path, head: str) -> bool:
    """Whether the first worker of the node at HOME adopted `head`, or a head built on it, and
    stands on what it adopted: its own head is that head, or reached from it by kept results
    (its own research, or a claim it researches ahead from). `adopted` alone is set before the
    worker has scored and moved to the new head, and stays set when it cannot."""
    try:
        state = json.loads((home / "status" / "worker-0.json").read_text())
        with Ledger(home / "ledger.db", readonly=True) as ledger:

            def kept_parent(child: str) -> str | None:
                rows = ledger.rows("SELECT parent FROM results WHERE child = ? AND outcome = 'keep' "
                                   "ORDER BY time LIMIT 1", (child,))  # fmt: skip
                return rows[0]["parent"] if rows else None

            adopted, own = state.get("adopted"), state.get("head")
            return bool(adopted and own) and (
                descends_from(adopted, head, kept_parent)
                and descends_from(own, adopted, kept_parent)
            )
    except (
        OSError,
        ValueError,
        sqlite3.OperationalError,
        LedgerError,
    ):  # being written: look again
        return False
