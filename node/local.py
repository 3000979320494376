"""A whole swarm on one machine, in one command: a bootstrap and N nodes in processes of their own,
each node's progress live in the terminal, and at the end the leaderboard, the lineage of the
best version and where each node's ledger lies.

The nodes are ordinary `swarm join` processes on 127.0.0.1; this module only starts them, watches
their status files and stops them. It never trains anything itself and never listens beyond
loopback.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from node.errors import SwarmError
from node.safe_text import safe_text

ADDRESS = re.compile(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)")
STOP_SECONDS = 60  # a node ends its run in flight and exits within this after SIGINT


class LocalSwarmError(SwarmError):
    """The local swarm could not start: the message says what to change."""


@dataclass
class LocalSwarm:
    root: Path  # HOME/local: bootstrap/, node0/, node1/, ...
    nodes: int = 3
    profile: str = "cpu"
    minutes: float = 10.0
    campaign: str = "local"  # a name, or a campaign file
    model: str | None = None
    api_base: str | None = None
    data: str | None = None
    sandbox: bool = True
    processes: list[subprocess.Popen] = field(default_factory=list)

    def node_homes(self) -> list[Path]:
        return [self.root / f"node{i}" for i in range(self.nodes)]

    def _spawn(self, args: list[str], log: Path, env: dict) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:  # the child keeps its own handle
            proc = subprocess.Popen([sys.executable, "-m", "node.cli", *args], env=env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.processes.append(proc)
        return proc

    def start(self, env: dict) -> None:
        """Start the bootstrap, wait for its address, then start the nodes."""
        boot_home = self.root / "bootstrap"
        boot_log = boot_home / "bootstrap.log"
        boot_log.unlink(missing_ok=True)
        boot = self._spawn(["bootstrap", "--listen", "/ip4/127.0.0.1/tcp/0", "--campaign",
                            self.campaign, "--home", str(boot_home)], boot_log, env)  # fmt: skip
        deadline = time.monotonic() + 120
        address = None
        while address is None:
            text = boot_log.read_text(errors="replace") if boot_log.exists() else ""
            found = ADDRESS.search(text.replace("\n", ""))
            if found:
                address = found.group(1)
            elif boot.poll() is not None or time.monotonic() > deadline:
                raise LocalSwarmError(f"the bootstrap did not start: see {boot_log}\n{text[-600:]}")
            else:
                time.sleep(0.2)
        for i, home in enumerate(self.node_homes()):
            args = ["join", "--bootstrap", address, "--listen", "/ip4/127.0.0.1/tcp/0",
                    "--profile", self.profile, "--campaign", self.campaign, "--seed", str(i),
                    "--home", str(home)]  # fmt: skip
            if self.model:
                args += ["--model", self.model]
            if self.api_base:
                args += ["--api-base", self.api_base]
            if self.data:
                args += ["--data", self.data]
            if not self.sandbox:
                args.append("--no-sandbox")
            self._spawn(args, home / "node.log", env)

    def failed(self) -> list[str]:
        """A line for each process that ended on its own (it should run until stopped)."""
        out = []
        for proc, home in zip(self.processes, [self.root / "bootstrap", *self.node_homes()], strict=False):
            if proc.poll() is not None:
                log = home / ("bootstrap.log" if home.name == "bootstrap" else "node.log")
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
                out.append(f"{home.name} exited ({proc.returncode}): {' '.join(tail)[:200]} (see {log})")
        return out

    def stop(self) -> list[int | None]:
        """SIGINT every process (nodes end their run in flight), then wait; kill stragglers."""
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + STOP_SECONDS
        for proc in self.processes:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return [proc.returncode for proc in self.processes]


def snapshot(swarm: LocalSwarm) -> list[dict]:
    """Each node's state from its status files and ledger, as `swarm status` reads it."""
    from node.node import NodeError, node_status

    rows = []
    for home in swarm.node_homes():
        try:
            status = node_status(home)
        except (NodeError, OSError, ValueError):
            rows.append({"node": home.name, "doing": "starting"})
            continue
        worker = (status["workers"] or [{}])[0]
        network = status["network"] or {}
        counts = _own_outcomes(home, network.get("peer_id"))
        rows.append({
            "node": home.name, "doing": worker.get("doing", "starting"),
            "progress": worker.get("progress"), "head": worker.get("head"),
            "head_val_bpb": worker.get("head_val_bpb"), "adopted": worker.get("adopted"),
            "margin": worker.get("margin"), "steps": worker.get("steps", 0),
            "peers": len(network.get("connected", [])), "outcomes": counts,
        })  # fmt: skip
    return rows


def _own_outcomes(home: Path, peer_id: str | None) -> dict[str, int]:
    """How many of its own experiments this node kept, discarded, crashed and had voided."""
    from node.ledger import Ledger, LedgerError, ledger_path

    if peer_id is None or not ledger_path(home).is_file():
        return {}
    try:
        with Ledger(ledger_path(home), readonly=True) as ledger:
            rows = ledger.rows(
                "SELECT outcome, COUNT(*) AS n FROM results WHERE author = ? GROUP BY outcome", (peer_id,)
            )
    except (LedgerError, OSError, sqlite3.Error):
        return {}
    return {r["outcome"]: r["n"] for r in rows}


def run_local(
    swarm: LocalSwarm, say: Callable[[str], None], show: Callable[[list[dict], float], None]
) -> dict:
    """Run the local swarm for its minutes (or until Ctrl-C), then stop it and summarise. The
    caller builds the profile's data first, so that the nodes find it in the cache."""
    from node.home import data_dir

    swarm.root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SWARM_DATA": str(data_dir(swarm.root.parent))}
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    started = time.monotonic()
    try:
        swarm.start(env)
        say(f"{swarm.nodes} nodes and a bootstrap on 127.0.0.1, for {swarm.minutes:g} min "
            f"(Ctrl-C ends sooner); logs and ledgers under {swarm.root}")  # fmt: skip
        end = started + swarm.minutes * 60
        while time.monotonic() < end and not interrupted.is_set():
            failed = swarm.failed()
            if failed:
                raise LocalSwarmError("; ".join(failed))
            show(snapshot(swarm), end - time.monotonic())
            interrupted.wait(2.0)
    finally:
        say("stopping the nodes (each ends its run in flight)")
        codes = swarm.stop()
        signal.signal(signal.SIGINT, previous)
    return summary(swarm, time.monotonic() - started, codes)


def campaign_terms(campaign: str) -> tuple[int, str]:
    """(quorum, baseline sha256) of a campaign file, or of a named campaign on the built-in
    baseline (quorum 1, as `swarm join --campaign NAME` without --quorum)."""
    if Path(campaign).is_file():
        from node.campaign import load_campaign

        loaded = load_campaign(campaign)
        return loaded.quorum, loaded.baseline_sha256
    import hashlib

    from node.trainer import BASELINE_TRAIN_PY

    return 1, hashlib.sha256(BASELINE_TRAIN_PY.read_bytes()).hexdigest()


def summary(swarm: LocalSwarm, seconds: float, codes: list[int | None]) -> dict:
    """What the swarm found, read from the first node's ledger (they all hold the same facts)."""
    from node.ledger import Ledger, ledger_path
    from node.trainer import get_profile, harness_sha256

    quorum, baseline = campaign_terms(swarm.campaign)
    harness = harness_sha256(get_profile(swarm.profile, swarm.data))  # hashes every harness file
    nodes = []
    for home in swarm.node_homes():
        entry: dict = {"node": home.name, "home": str(home), "ledger": str(ledger_path(home))}
        if ledger_path(home).is_file():
            with Ledger(ledger_path(home), readonly=True) as ledger:
                entry["head"] = ledger.head(swarm.profile, quorum, harness, baseline=baseline)
                entry["experiments"] = ledger.rows(
                    "SELECT COUNT(*) AS n FROM results r JOIN facts f ON f.id = r.id "
                    "JOIN peers p ON p.peer_id = f.author WHERE r.profile = ?", (swarm.profile,)
                )[0]["n"]  # fmt: skip
        nodes.append(entry)
    heads = {n.get("head") for n in nodes}
    return {
        "seconds": round(seconds, 1), "profile": swarm.profile, "quorum": quorum,
        "baseline": baseline, "exit_codes": codes, "nodes": nodes,
        "agreed": len(heads) == 1 and None not in heads, "best": nodes[0].get("head") if nodes else None,
    }  # fmt: skip


def reset(root: Path) -> None:
    """Forget an earlier local swarm's ledgers and runs (the data cache stays)."""
    if root.exists():
        shutil.rmtree(root)


def status_table(rows: list[dict], left: float):
    """A rich table of the nodes' live state."""
    from rich.table import Table

    table = Table(title=f"local swarm: {max(0, left) / 60:.1f} min left", expand=True)
    for name in ("node", "doing", "run", "head val_bpb", "margin", "kept/disc/crash/void", "peers"):
        table.add_column(name, overflow="ellipsis", no_wrap=True, ratio=4 if name == "doing" else None)
    for r in rows:
        outcomes = r.get("outcomes") or {}
        progress = r.get("progress")
        table.add_row(
            r["node"], safe_text(r.get("doing", "")),
            f"{progress:.0%}" if isinstance(progress, float) else "",
            f"{r['head_val_bpb']:.4f}" if r.get("head_val_bpb") else "",
            f"{r['margin']:.4f}" if r.get("margin") else "",
            "/".join(str(outcomes.get(o, 0)) for o in ("keep", "discard", "crash", "void")),
            str(r.get("peers", 0)),
        )  # fmt: skip
    return table


def progress_line(rows: list[dict], left: float) -> str:
    """One plain line for logs (no terminal)."""
    parts = []
    for r in rows:
        bpb = f" {r['head_val_bpb']:.4f}" if r.get("head_val_bpb") else ""
        parts.append(f"{r['node']}: {safe_text(r.get('doing', ''), markup=False)[:48]}{bpb}")
    return f"[{max(0, left) / 60:4.1f} min left] " + " | ".join(parts)


