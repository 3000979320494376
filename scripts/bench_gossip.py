"""Benchmark the gossip network: N `swarm peer` processes on 127.0.0.1, each publishing results.

Each node's results are written into its ledger under its key (as its workers write them) and
its network gossips them as they appear.

Measures propagation latency of a fact to every node (p50/p99, author's clock to each ledger's
receive time: one machine, one clock), bytes on the wire per fact (TCP bytes_sent from `ss`),
idle CPU and memory per node, and time from start to first connected peer. Prints one JSON.

Example: .venv/bin/python scripts/bench_gossip.py --nodes 8 --facts 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from synthetic import publish_synthetic  # this script's folder is on the path

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = "bench"


def status(home: Path) -> dict | None:
    try:
        return json.loads((home / "gossip.json").read_text())
    except (OSError, ValueError):
        return None


def wait_until(predicate, what: str, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wire_bytes(ports: set[int]) -> int:
    """Bytes sent on every established TCP socket between our nodes (both ends count once each)."""
    out = subprocess.run(
        ["ss", "-tinH", "state", "established"], capture_output=True, text=True
    ).stdout
    total, lines = 0, out.splitlines()
    for i, line in enumerate(lines):
        parts = line.split()
        if line[:1].isspace() or len(parts) < 4 or ":" not in parts[2]:  # an info line
            continue
        local, peer = int(parts[2].rsplit(":", 1)[1]), int(parts[3].rsplit(":", 1)[1])
        if (local in ports or peer in ports) and i + 1 < len(lines):
            for token in lines[i + 1].split():
                if token.startswith("bytes_sent:"):
                    total += int(token.split(":")[1])
    return total


def latencies(homes: list[Path]) -> tuple[list[float], int]:
    """Per (fact, receiving node): receive time minus the author's publish time, in seconds."""
    out, facts = [], set()
    for home in homes:
        with sqlite3.connect(f"file:{home / 'ledger.db'}?mode=ro", uri=True) as conn:
            me = status(home)["peer_id"]
            for fid, author, t, received in conn.execute(
                "SELECT id, author, time, received FROM facts WHERE kind = 'result'"
            ):
                facts.add(fid)
                if author != me:
                    out.append((received - t) / 1000)
    return out, len(facts)


def publish(homes: list[Path], facts: int, every: float) -> None:
    """Each node's results, one for every node each `every` seconds, into its ledger."""
    for seq in range(1, facts + 1):
        began = time.monotonic()
        for home in homes:
            publish_synthetic(home, CAMPAIGN, seq)
        time.sleep(max(0.0, every - (time.monotonic() - began)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--facts", type=int, default=10, help="results each node publishes")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between a node's results")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle measurement")
    parser.add_argument("--keep", action="store_true", help="keep the nodes' homes (logs, ledgers)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-gossip-"))
    homes = [base / f"n{i}" for i in range(args.nodes)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs, spawned = [], []
    try:
        bootstrap: list[str] = []
        for i, home in enumerate(homes):
            home.mkdir(parents=True)
            cmd = [sys.executable, "-m", "node.cli", "peer", "--campaign", CAMPAIGN, "--home", str(home),
                   "--listen", "/ip4/127.0.0.1/tcp/0", *bootstrap]  # fmt: skip
            spawned.append(time.time())
            log = open(home / "node.log", "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            )
            if i == 0:  # node 0 is everyone's bootstrap: any node can be one
                addr = wait_until(
                    lambda h=home: (s := status(h)) and s["addrs"] and s["addrs"][0], "node 0"
                )
                bootstrap = ["--bootstrap", addr]
        first_peer = []
        for home, t0 in zip(homes, spawned, strict=True):
            wait_until(
                lambda h=home: (s := status(h)) and s["connected"], f"{home.name} to connect"
            )
            first_peer.append((status(home)["first_peer_s"], status(home)["first_peer_at"] - t0))
        ports = {int(status(h)["addrs"][0].split("/tcp/")[1].split("/")[0]) for h in homes}
        bytes0, facts0 = wire_bytes(ports), latencies(homes)[1]
        t0 = time.monotonic()
        threading.Thread(target=publish, args=(homes, args.facts, args.every), daemon=True).start()
        total = args.nodes * args.facts
        wait_until(lambda: all(status(h)["facts"] >= total for h in homes), "every fact everywhere",
                   timeout=args.facts * args.every * 3 + 120)  # fmt: skip
        bytes1, t1 = wire_bytes(ports), time.monotonic()
        time.sleep(3)  # let fetches and the last heartbeats settle
        cpu0 = [cpu_seconds(p.pid) for p in procs]
        bytes2, t2 = wire_bytes(ports), time.monotonic()
        time.sleep(args.idle)
        cpu1 = [cpu_seconds(p.pid) for p in procs]
        bytes3, t3 = wire_bytes(ports), time.monotonic()
        lat, facts = latencies(homes)
        lat.sort()
        idle_rate = (bytes3 - bytes2) / (t3 - t2)
        per_fact = ((bytes1 - bytes0) - idle_rate * (t1 - t0)) / max(1, total - facts0)
        result = {
            "nodes": args.nodes, "facts": facts, "deliveries": len(lat),
            "latency_p50_ms": round(1000 * statistics.median(lat), 1),
            "latency_p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
            "latency_max_ms": round(1000 * lat[-1], 1),
            "wire_bytes_per_fact": round(per_fact),
            "idle_wire_bytes_per_s": round(idle_rate),
            "idle_cpu_percent_per_node": round(100 * statistics.mean(
                (b - a) / (t3 - t2) for a, b in zip(cpu0, cpu1, strict=True)), 2),
            "rss_mib_per_node": round(statistics.mean(rss_mib(p.pid) for p in procs), 1),
            # Node 0 waits for the others to come; the others dial it at once.
            "first_peer_s_in_process_median": round(statistics.median(f for f, _ in first_peer[1:]), 2),
            "first_peer_s_in_process_max": round(max(f for f, _ in first_peer[1:]), 2),
            "first_peer_s_from_spawn_median": round(statistics.median(w for _, w in first_peer[1:]), 2),
            "first_peer_s_from_spawn_max": round(max(w for _, w in first_peer[1:]), 2),
            "connected_per_node_min": min(len(status(h)["connected"]) for h in homes),
        }  # fmt: skip
        print(json.dumps(result, indent=1))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        if args.keep:
            print(f"homes kept in {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
