"""A whole swarm on one machine, in one command: a bootstrap and N nodes in processes of their own,
each node's progress live in the terminal, and at the end the leaderboard, the lineage of the
best version and where each node's ledger lies.

The nodes are ordinary `swarm join` processes on 127.0.0.1; this module only starts them, watches
their status files and stops them. It never trains anything itself and never listens beyond
loopback.
"""

from __future__ import annotations

import json
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
    proposer: str = "learning"  # without a model: learning, or fixed (the control)
    seed: int = 0  # node i orders the offline proposer's changes by seed + i
    processes: list[subprocess.Popen] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # peer id -> node0, node1, ...

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
                    "--profile", self.profile, "--campaign", self.campaign, "--seed", str(self.seed + i),
                    "--home", str(home), *(["--no-sandbox"] if not self.sandbox else [])]  # fmt: skip
            for option, value in (("--model", self.model), ("--api-base", self.api_base),
                                  ("--data", self.data), ("--proposer", self.proposer)):  # fmt: skip
                if value:
                    args += [option, value]
            self._spawn(args, home / "node.log", env)

    def failed(self) -> list[str]:
        """A line for each process that ended on its own (it should run until stopped)."""
        out = []
        for proc, home in zip(
            self.processes, [self.root / "bootstrap", *self.node_homes()], strict=False
        ):
            if proc.poll() is not None:
                log = home / ("bootstrap.log" if home.name == "bootstrap" else "node.log")
                tail = (
                    log.read_text(errors="replace").strip().splitlines()[-1:]
                    if log.exists()
                    else []
                )
                out.append(
                    f"{home.name} exited ({proc.returncode}): {' '.join(tail)[:200]} (see {log})"
                )
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
        peer_id = network.get("peer_id")
        if peer_id:
            swarm.names[peer_id] = home.name
        rows.append({
            "node": home.name, "peer_id": peer_id, "doing": worker.get("doing", "starting"),
            "change": worker.get("change"), "phase": worker.get("phase"),
            "progress": worker.get("progress"), "head": worker.get("head"),
            "head_val_bpb": worker.get("head_val_bpb"), "adopted": worker.get("adopted"),
            "margin": worker.get("margin"), "steps": worker.get("steps", 0),
            "harness": worker.get("harness"),
            "peers": len(network.get("connected", [])), **_own_counts(home, peer_id),
        })  # fmt: skip
    return rows


def _own_counts(home: Path, peer_id: str | None) -> dict:
    """What this node did, from its ledger: its experiments by outcome (kept, discarded,
    crashed, voided), the verifications it gave and those its claims received from others."""
    from node.ledger import Ledger, LedgerError, ledger_path

    if peer_id is None or not ledger_path(home).is_file():
        return {}
    try:
        with Ledger(ledger_path(home), readonly=True) as ledger:
            outcomes = ledger.rows(
                "SELECT outcome, COUNT(*) AS n FROM results WHERE author = ? GROUP BY outcome",
                (peer_id,),
            )
            given = ledger.rows(
                "SELECT COUNT(*) AS n FROM verifications WHERE author = ?", (peer_id,)
            )[0]["n"]
            received = ledger.rows(
                "SELECT COUNT(*) AS n FROM verifications v JOIN results r ON r.id = v.result "
                "WHERE r.author = ? AND v.author != ?", (peer_id, peer_id),
            )[0]["n"]  # fmt: skip
    except (LedgerError, OSError, sqlite3.Error):
        return {}
    return {
        "outcomes": {r["outcome"]: r["n"] for r in outcomes},
        "given": given, "received": received,
    }  # fmt: skip


class Events:
    """What happened in the swarm, as lines for the log and the live table: each claim (a kept
    experiment), each verdict on one, and each adoption, read from the nodes' own ledgers and
    status files. Every node's facts are read from its own ledger, so a line appears once."""

    def __init__(self, swarm: LocalSwarm, keep: int = 8) -> None:
        self.swarm = swarm
        self.seen: set[str] = set()  # fact ids already told
        self.adopted: dict[str, str | None] = {}  # node -> the head it adopted last
        self.recent: list[str] = []  # the latest `keep` lines, for the live table
        self.keep = keep

    def _name(self, peer_id: str) -> str:
        return self.swarm.names.get(peer_id, peer_id[-6:])

    def poll(self, rows: list[dict]) -> list[str]:
        """The new lines since the last poll, oldest first."""
        lines: list[str] = []
        for row in rows:
            if row.get("peer_id"):
                lines += self._facts(row["node"], row["peer_id"])
        for row in rows:
            adopted, before = row.get("adopted"), self.adopted.get(row["node"])
            if adopted and before and adopted != before:
                about = self._about(row["node"], adopted)
                lines.append(f"{row['node']} adopted {adopted[:12]}: {about}")
            if adopted:
                self.adopted[row["node"]] = adopted
        self.recent = (self.recent + lines)[-self.keep :]
        return lines

    def _facts(self, node: str, peer_id: str) -> list[str]:
        from node.ledger import Ledger, LedgerError, ledger_path

        home = self.swarm.root / node
        try:
            with Ledger(ledger_path(home), readonly=True) as ledger:
                claims = ledger.rows(
                    "SELECT id, description, child_scores, parent_scores FROM results "
                    "WHERE author = ? AND outcome = 'keep' ORDER BY time", (peer_id,))  # fmt: skip
                verdicts = ledger.rows(
                    "SELECT v.id, v.verdict, v.delta, r.author, r.description, r.outcome "
                    "FROM verifications v JOIN results r ON r.id = v.result WHERE v.author = ? "
                    "ORDER BY v.time", (peer_id,),
                )  # fmt: skip
        except (LedgerError, OSError, sqlite3.Error):
            return []
        lines = []
        for c in claims:
            if c["id"] not in self.seen:
                self.seen.add(c["id"])
                gain = _signed(_mean_gain(c))
                lines.append(
                    f"{node} claims a win: {_quote(c['description'])} ({gain} bpb on its seeds)"
                )
        for v in verdicts:
            if v["id"] not in self.seen:
                self.seen.add(v["id"])
                whose = "its own" if v["author"] == peer_id else f"{self._name(v['author'])}'s"
                claim = v["outcome"] == "keep"  # else a replay of a discard's seed (`discards`)
                verb = _VERB.get(v["verdict"], v["verdict"]) if claim else "replayed"
                seen = "the signed score" if v["verdict"] == "confirm" else "not the signed score"
                what = f"({_signed(v['delta'])} bpb on its seed)" if claim else f"discard: {seen}"
                lines.append(f"{node} {verb} {whose} {_quote(v['description'])} {what}")
        return lines

    def _about(self, node: str, version: str) -> str:
        """The claim that made `version`, and who verified it, from `node`'s ledger."""
        from node.ledger import Ledger, LedgerError, ledger_path

        try:
            with Ledger(ledger_path(self.swarm.root / node), readonly=True) as ledger:
                made = ledger.rows(
                    "SELECT r.author, r.description, GROUP_CONCAT(DISTINCT v.author) AS by "
                    "FROM results r LEFT JOIN verifications v ON v.result = r.id "
                    "AND v.verdict = 'confirm' WHERE r.child = ? AND r.outcome = 'keep' "
                    "GROUP BY r.id ORDER BY r.time LIMIT 1", (version,))  # fmt: skip
        except (LedgerError, OSError, sqlite3.Error):
            made = []
        if not made:
            return "a version reached through verified claims"
        by = ", ".join(sorted(self._name(p) for p in (made[0]["by"] or "").split(",") if p))
        return (f"{_quote(made[0]['description'])} by {self._name(made[0]['author'])}"
                + (f", confirmed by {by}" if by else ""))  # fmt: skip


_VERB = {"confirm": "confirmed", "refute": "refuted", "inconclusive": "could not tell on",
         "void": "found void"}  # fmt: skip


def _mean_gain(result: dict) -> float | None:
    """A result's mean paired difference (child minus parent) over its seeds."""
    try:
        child, parent = json.loads(result["child_scores"]), json.loads(result["parent_scores"])
        return sum(c - p for c, p in zip(child, parent, strict=True)) / len(child)
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def _signed(value: float | None) -> str:
    return "?" if value is None else f"{value:+.4f}"


def _quote(description: str | None) -> str:
    return f"'{safe_text(description or '', markup=False)[:60]}'"


def run_local(
    swarm: LocalSwarm, say: Callable[[str], None],
    show: Callable[[list[dict], float, list[str]], None],
) -> dict:  # fmt: skip
    """Run the local swarm for its minutes (or until Ctrl-C), then stop it and summarise: each
    claim, verdict and adoption is said as it happens, and `show` gets the nodes' state, the
    minutes left and the latest such lines. The caller builds the profile's data first, so
    that the nodes find it in the cache."""
    from node.home import data_dir

    swarm.root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SWARM_DATA": str(data_dir(swarm.root.parent))}
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    started = time.monotonic()
    events = Events(swarm)
    try:
        swarm.start(env)
        say(f"{swarm.nodes} nodes and a bootstrap on 127.0.0.1, for {swarm.minutes:g} min "
            f"(Ctrl-C ends sooner); logs and ledgers under {swarm.root}")  # fmt: skip
        end = started + swarm.minutes * 60
        while time.monotonic() < end and not interrupted.is_set():
            failed = swarm.failed()
            if failed:
                raise LocalSwarmError("; ".join(failed))
            rows = snapshot(swarm)
            for line in events.poll(rows):
                say(line)
            show(rows, end - time.monotonic(), events.recent)
            interrupted.wait(2.0)
    finally:
        in_flight = [f"{r['node']}: {_run_in_flight(r)}" for r in snapshot(swarm) if r.get("phase")]
        dropped = f"; the runs in flight are dropped, not recorded ({'; '.join(in_flight)})"
        say("stopping the nodes" + (dropped if in_flight else ""))
        codes = swarm.stop()
        signal.signal(signal.SIGINT, previous)
    for line in events.poll(snapshot(swarm)):
        say(line)
    result = summary(swarm, time.monotonic() - started, codes)
    result["dropped"] = in_flight
    return result


def _run_in_flight(row: dict) -> str:
    """A node's run in flight, in a few words: what it runs and how far it got."""
    what = safe_text(row.get("change") or row.get("doing") or "a run", markup=False)[:60]
    progress = row.get("progress")
    where = f"{row['phase']} {progress:.0%}" if isinstance(progress, float) else row["phase"]
    return f"{what}, {where}"


def campaign_terms(campaign: str) -> tuple[int, str]:
    """(quorum, baseline sha256) of a campaign file, or of a named campaign on the built-in
    baseline (quorum 1, as `swarm join --campaign NAME` without --quorum)."""
    if Path(campaign).is_file():
        from node.campaign import load_campaign

        loaded = load_campaign(campaign)
        return loaded.quorum, loaded.baseline_sha256
    from node.ledger_queries import builtin_baseline

    return 1, builtin_baseline()


def summary(swarm: LocalSwarm, seconds: float, codes: list[int | None]) -> dict:
    """What the swarm found, read from each node's ledger: its head, its experiments and
    verifications, and from the first node's ledger the head's lineage, each step with its
    verified gain and every look at it (they all hold the same facts, once gossiped)."""
    from node.ledger import Ledger, LedgerError, ledger_path
    from node.trainer import get_profile, harness_sha256

    quorum, baseline = campaign_terms(swarm.campaign)
    rows = snapshot(swarm)
    # the harness the nodes ran (a resumed ledger may hold results of an older one)
    harness = next((r["harness"] for r in rows if r.get("harness")), None) or harness_sha256(
        get_profile(swarm.profile, swarm.data)
    )
    nodes = []
    for home, row in zip(swarm.node_homes(), rows, strict=True):
        entry: dict = {
            "node": home.name, "home": str(home), "ledger": str(ledger_path(home)),
            "peer_id": row.get("peer_id"), "outcomes": row.get("outcomes", {}),
            "given": row.get("given", 0), "received": row.get("received", 0),
        }  # fmt: skip
        entry["experiments"] = sum(entry["outcomes"].values())
        try:
            with Ledger(ledger_path(home), readonly=True) as ledger:
                entry["head"] = ledger.head(swarm.profile, quorum, harness, baseline=baseline)
        except LedgerError as exc:  # a node that never got as far as its ledger
            entry["error"] = str(exc)
        nodes.append(entry)
    heads = {n.get("head") for n in nodes}
    best = nodes[0].get("head") if nodes else None
    steps = []
    if best and best != baseline and ledger_path(swarm.node_homes()[0]).is_file():
        with Ledger(ledger_path(swarm.node_homes()[0]), readonly=True) as ledger:
            steps = head_lineage(ledger, swarm.profile, quorum, harness, baseline, best)
    return {
        "seconds": round(seconds, 1), "profile": swarm.profile, "quorum": quorum,
        "baseline": baseline, "exit_codes": codes, "nodes": nodes,
        "agreed": len(heads) == 1 and None not in heads, "best": best, "lineage": steps,
    }  # fmt: skip


def head_lineage(
    ledger, profile: str, quorum: int, harness: str, baseline: str, head: str
) -> list[dict]:
    """The verified steps from the baseline to `head`, oldest first: each claim's description,
    author, verified gain (bpb, negative is better) and its standard error, and every look at
    it (peer, verdict, its delta on its own seed)."""
    scores, judged, results = ledger.standings(profile, quorum, harness, baseline=baseline)
    by_id = {r["id"]: r for r in results}
    steps: list[dict] = []
    version = head
    while version in scores and scores[version].via is not None and len(steps) < 1000:
        score = scores[version]
        claim, judgement = by_id[score.via], judged[score.via]
        looks = ledger.rows(
            "SELECT author, verdict, delta FROM verifications WHERE result = ? ORDER BY time",
            (score.via,),
        )
        steps.append({
            "version": version, "result": score.via, "description": claim["description"],
            "author": claim["author"], "gain": judgement.gain, "gain_se": judgement.se,
            "looks": looks,
        })  # fmt: skip
        version = score.parent
    return steps[::-1]


def summary_lines(result: dict, command: str) -> list[str]:
    """The end of a local swarm in plain lines: whether the nodes agree, the head's lineage
    with each step's verified gain and who looked at it, each node's work and ledger, the runs
    dropped at the stop, and the commands that look deeper (`command`: how to run `swarm`)."""
    names = {n["peer_id"]: n["node"] for n in result["nodes"] if n.get("peer_id")}

    def name(peer_id: str) -> str:
        return names.get(peer_id, peer_id[-6:])

    best, minutes = result["best"], result["seconds"] / 60
    lines = []
    if not best or best == result["baseline"]:
        lines.append(f"after {minutes:.1f} min: no verified win yet; the head is still the "
                     f"baseline {result['baseline'][:8]}")  # fmt: skip
    elif result["agreed"]:
        lines.append(f"after {minutes:.1f} min: all {len(result['nodes'])} nodes hold the "
                     f"verified head {best[:8]}, {len(result['lineage'])} verified step(s) from "
                     f"the baseline {result['baseline'][:8]}:")  # fmt: skip
    else:
        held = ", ".join(f"{n['node']} {(n.get('head') or '-')[:8]}" for n in result["nodes"])
        lines.append(f"after {minutes:.1f} min: the nodes' heads differ ({held}); node0's "
                     f"head {best[:8]} is {len(result['lineage'])} verified step(s) from the "
                     "baseline:")  # fmt: skip
    for k, step in enumerate(result.get("lineage", []), 1):
        gain = "?"
        if step["gain"] is not None:
            gain = f"{-step['gain']:+.4f} +- {step['gain_se'] or 0:.4f}"
        lines.append(f"  {k}. {_quote(step['description'])} by {name(step['author'])} -> "
                     f"{step['version'][:8]}: val_bpb {gain} as verified (all looks "
                     "pooled)")  # fmt: skip
        looks = [f"{name(v['author'])} {v['verdict']} {_signed(v['delta'])}" for v in step["looks"]]
        lines.append("     looks (delta on the looker's seed): " + (", ".join(looks) or "none"))
    for n in result["nodes"]:
        o = n.get("outcomes", {})
        lines.append(f"{n['node']}: {n.get('experiments', 0)} experiments "
                     f"({o.get('keep', 0)} kept, "
                     f"{o.get('discard', 0)} discarded, {o.get('crash', 0)} crashed), "
                     f"{n.get('given', 0)} verifications given, {n.get('received', 0)} received; "
                     f"ledger {n.get('error') or n['ledger']}")  # fmt: skip
    for dropped in result.get("dropped", []):
        lines.append(f"dropped at the stop (not recorded): {dropped}")
    first = result["nodes"][0]["home"] if result["nodes"] else "HOME"
    lines.append(f"look deeper: {command} report --home {first} --out report/   "
                 f"(then open report/report.html)")  # fmt: skip
    if best and best != result["baseline"]:
        lines.append(f"             {command} ledger lineage {best[:12]} --home {first}")
    return lines


def swarm_command() -> str:
    """How the user's shell runs `swarm`: the bare name when it is on PATH, else its path."""
    mine = Path(sys.executable).with_name("swarm")
    found = shutil.which("swarm")
    if not mine.exists() or (found and Path(found).resolve() == mine.resolve()):
        return "swarm"
    relative = os.path.relpath(mine)
    return relative if not relative.startswith("..") else str(mine)


def reset(root: Path) -> None:
    """Forget an earlier local swarm's ledgers and runs (the data cache stays)."""
    if root.exists():
        shutil.rmtree(root)


def status_table(rows: list[dict], left: float, recent: list[str] = ()):
    """A rich view of the nodes' live state; below it, the latest claims, verdicts and adoptions."""
    from rich.console import Group
    from rich.table import Table

    table = Table(title=f"local swarm: {max(0, left) / 60:.1f} min left", expand=True)
    for name in ("node", "head", "val_bpb", "doing", "change", "run", "kept/disc/crash",
                 "verifs gave/got", "peers"):  # fmt: skip
        table.add_column(name, overflow="ellipsis", no_wrap=True,
                         ratio={"doing": 2, "change": 3}.get(name))  # fmt: skip
    for r in rows:
        outcomes = r.get("outcomes") or {}
        table.add_row(
            r["node"], (r.get("head") or "")[:8],
            f"{r['head_val_bpb']:.4f}" if r.get("head_val_bpb") else "",
            safe_text(r.get("doing", "")), safe_text(r.get("change") or ""), _phase(r),
            "/".join(str(outcomes.get(o, 0)) for o in ("keep", "discard", "crash")),
            f"{r.get('given', 0)}/{r.get('received', 0)}", str(r.get("peers", 0)),
        )  # fmt: skip
    if not recent:
        return table
    happened = Table(title="what happened", expand=True, show_header=False)
    happened.add_column("event", overflow="ellipsis", no_wrap=True)
    for line in recent:
        happened.add_row(safe_text(line))
    return Group(table, happened)


def _phase(row: dict) -> str:
    progress = row.get("progress")
    if isinstance(progress, float) and row.get("phase") == "training":
        return f"train {progress:.0%}"
    return {"starting": "start", "scoring": "score"}.get(row.get("phase") or "", "")


def progress_line(rows: list[dict], left: float) -> str:
    """One plain line for logs (no terminal)."""
    parts = []
    for r in rows:
        bpb = f" {r['head_val_bpb']:.4f}" if r.get("head_val_bpb") else ""
        what = r.get("change") or r.get("doing", "")
        parts.append(f"{r['node']}{bpb}: {safe_text(what, markup=False)[:40]} {_phase(r)}".rstrip())
    return f"[{max(0, left) / 60:4.1f} min left] " + " | ".join(parts)
