"""Measure a fresh node under one attack of `attack_gossip.py`: its RSS before, at the peak and
after, whether it still serves at its printed address, and how long an honest peer's facts take
each way while the attack runs. Run through `python scripts/attack_gossip.py measure ATTACK ...`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from attack_gossip import LOOPBACK, _say  # this script's folder is on the path
from synthetic import publish_synthetic

ATTACKS = Path(__file__).with_name("attack_gossip.py")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"no {field} for pid {pid}")


class _Peer:
    """A `swarm peer` process on loopback in a home of its own, for `measure`."""

    def __init__(self, home: Path, *args: str) -> None:
        self.home, self.campaign = home, "attack"
        home.mkdir()
        self.log = open(home / "node.log", "wb")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli", "peer", "--campaign", self.campaign, "--listen",
             LOOPBACK, "--home", str(home), *args], stdout=self.log, stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        end = time.monotonic() + 60
        while not (home / "gossip.json").exists() and time.monotonic() < end:
            time.sleep(0.2)
        self.status = lambda: json.loads((home / "gossip.json").read_text())
        self.addr = self.status()["addrs"][0]

    def publish(self, n: int) -> str:
        return publish_synthetic(self.home, self.campaign, n)

    def holds(self, ids: set[str]) -> bool:
        import sqlite3

        with sqlite3.connect(f"file:{self.home / 'ledger.db'}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT id FROM facts WHERE kind = 'result'").fetchall()
        return ids <= {row[0] for row in rows}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def measure(attack_args: list[str]) -> None:
    """Start a fresh `swarm peer` on loopback and an honest peer of it, let a fact flow each way,
    run one attack on the first from another process, and print the node's RSS before, its peak
    (VmHWM) and after, in MiB, whether it still serves, and how long a fact took each way
    between the two while the attack ran (one from each side every 2 s; a round that took over
    60 s is cut there)."""
    import statistics
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        node = _Peer(Path(tmp) / "node")
        honest = _Peer(Path(tmp) / "honest", "--bootstrap", node.addr)
        try:
            first = {node.publish(0), honest.publish(0)}  # the two peers meet and gossip first
            end = time.monotonic() + 60
            while not (node.holds(first) and honest.holds(first)) and time.monotonic() < end:
                time.sleep(0.1)
            time.sleep(2)  # settle: imports done, first heartbeats
            before = _status_kib(node.proc.pid, "VmRSS")
            out = open(Path(tmp) / "attack.out", "w+")  # noqa: SIM115  (closed below)
            with open(Path(tmp) / "attack.log", "w") as log:  # its libraries' logging
                attack = subprocess.Popen(
                    [sys.executable, str(ATTACKS), attack_args[0], node.addr, *attack_args[1:]],
                    stdout=out, stderr=log, text=True,
                )  # fmt: skip
            waits, n = [], 0
            while attack.poll() is None:
                n += 1
                began = time.monotonic()
                ids = {node.publish(n), honest.publish(n)}
                while not (node.holds(ids) and honest.holds(ids)) and time.monotonic() - began < 60:
                    time.sleep(0.05)
                waits.append(time.monotonic() - began)
                time.sleep(max(0.0, 2 - waits[-1]))
            attack.wait()
            out.seek(0)
            said = [line for line in out.read().splitlines() if line.startswith("done")]
            out.close()
            peak, after = _status_kib(node.proc.pid, "VmHWM"), _status_kib(node.proc.pid, "VmRSS")
            status = node.status()
            _say(said[-1] if said else "the attack said nothing")
            _say(f"{' '.join(attack_args)}: RSS before {before / 1024:.0f} MiB, peak "
                 f"{peak / 1024:.0f} MiB, after {after / 1024:.0f} MiB; node alive: "
                 f"{node.proc.poll() is None}; honest peer connected: "
                 f"{honest.status()['peer_id'] in status['connected']}")  # fmt: skip
            _say(f"a fact each way during the attack: median {statistics.median(waits):.2f} s, "
                 f"at most {max(waits):.2f} s, {len(waits)} rounds; connected "
                 f"{len(status['connected'])}; counts {status['counts']}")  # fmt: skip
        finally:
            node.stop()
            honest.stop()
