"""The discrete-event simulation of a swarm: nodes, a virtual clock, gossip, anti-entropy sync,
churn and partitions, and the figures a run yields.

Deterministic for a seed: one event heap ordered by (virtual time, insertion number), and every
random draw from generators seeded from the settings. It never sleeps and never reads the wall
clock for anything but the progress line.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from node import consensus, wire
from node.simulation import landscape as land
from node.simulation.network import FactStore, Transport, head_size
from node.simulation.nodes import SimNode
from node.simulation.views import PROFILE, LedgerView, SharedView
from node.trainer.profiles import get_profile

LEDGER_MAX_NODES = 64  # up to here each node keeps a real Ledger; past it, a SharedView
SYNC_FRAME = 256  # facts per sync frame (docs/gossip.md)
TARGET = 0.925  # default target val_bpb (true, noise-free): the baseline is 1.0048, the floor 0.9


@dataclass
class Settings:
    """One run's parameters. Times are virtual: hours for the run, seconds for the network.

    `churn`: leaves per node per hour (exponential), each for an exponential `away_hours`;
    `partition`: (start, end) in hours, the even and odd nodes cut apart; `ledger`: "auto"
    (a real Ledger per node up to LEDGER_MAX_NODES nodes), "sqlite" or "shared"."""

    nodes: int = 8
    seed: int = 0
    hours: float = 48.0
    malicious: float = 0.0
    quorum: int = 1
    latency: float = 0.1
    loss: float = 0.0
    churn: float = 0.0
    away_hours: float = 1.0
    partition: tuple[float, float] | None = None
    target: float = TARGET
    verify_every: int = 4
    noise_runs: int = 2
    sync_every: float = 30.0
    ledger: str = "auto"
    stop_at_target: bool = True
    drain_hours: float = 2.0


class Simulation:
    def __init__(self, settings: Settings, progress: Callable[[str], None] | None = None) -> None:
        self.settings, self.progress = settings, progress
        s = settings
        if s.quorum < 1 or s.nodes < 1:
            raise ValueError("nodes and quorum must be at least 1")
        self.rng = np.random.default_rng([s.seed, 0])
        self.store = FactStore(s.nodes)
        partition = None if s.partition is None else (s.partition[0] * 3600, s.partition[1] * 3600)
        self.net = Transport(
            s.nodes, np.random.default_rng([s.seed, 1]), s.latency, s.loss, partition
        )
        self.versions: dict[str, np.ndarray] = {}
        self.kept_parent_of: dict[str, str] = {}
        self.baseline = self.add_version(land.BASELINE)
        # A simulated look is two unpaired runs (the surrogate has no common noise per seed), so
        # the noise of its difference is sqrt(2) times one run's.
        self.rules = consensus.Rules(s.quorum, math.sqrt(2) * land.NOISE_SD,
                                     get_profile(PROFILE).replay_tolerance)  # fmt: skip
        self.use_ledger = s.ledger == "sqlite" or (
            s.ledger == "auto" and s.nodes <= LEDGER_MAX_NODES
        )
        view_type = LedgerView if self.use_ledger else SharedView
        cheats = set(self.rng.choice(s.nodes, round(s.malicious * s.nodes), replace=False).tolist())
        self.nodes = [
            SimNode(self, i, view_type(self.store, i, self.baseline, self.rules), i in cheats)
            for i in range(s.nodes)
        ]
        self.cheats = sorted(cheats)
        self.honest = [n for n in self.nodes if not n.malicious]
        self.head_bytes = head_size(s.nodes)
        self.now, self.runs, self.research_open = 0.0, 0, True
        self.runs_by_purpose = {"noise": 0, "research": 0, "verify": 0, "adopt": 0}
        self.fakes: set[str] = set()
        self.adoptions: list[tuple[float, int, str]] = []
        self.current: dict[int, str] = {}  # the head each node adopted last (and scored)
        self.fake_adoptions = 0
        self.t_local: float | None = None  # a node's own head first at the target
        self.t_verified: float | None = None  # a node first adopts a verified head at the target
        self.sync_messages = 0
        self.sync_bytes = 0
        self._heap: list = []
        self._order = 0
        self._loops: dict[int, object] = {}

    # ------------------------------------------------------------ what nodes call

    def add_version(self, x: np.ndarray) -> str:
        """Store a point by its version hash: any node can fetch any version by hash at once."""
        version = land.version(x)
        self.versions.setdefault(version, land.quantise(x))
        return version

    def source_of(self, version: str) -> bytes | None:
        """A train.py's bytes by sha256, as the gossip layer fetches them for a node."""
        x = self.versions.get(version)
        return None if x is None else land.source(x).encode()

    def publish(self, node: SimNode, fact: wire.Fact) -> None:
        index = self.store.add(fact, self.now)
        node.view.own(index, self.now)
        if fact.kind == "result" and fact.body["outcome"] == "keep":
            self.kept_parent_of.setdefault(fact.body["child"], fact.body["parent"])
        self.net.send(index, node.index, self.now)

    def collude(self, author: SimNode, fact: wire.Fact) -> None:
        """Partners confirm a fake as soon as gossip brings it: just enough of them to make a
        quorum, and two more to outvote the first refutations."""
        partners = [i for i in self.cheats if i != author.index and self.net.online[i]]
        count = min(len(partners), self.settings.quorum + 2)
        for i in self.rng.choice(partners, count, replace=False).tolist() if count else []:
            delay = (
                float(self.rng.gamma(self.net.hops, self.settings.latency))
                if self.settings.latency
                else 0.0
            )
            self._push(self.now + delay, "confirm", i, fact)

    def adopted(self, node: SimNode, version: str) -> None:
        self.adoptions.append((self.now, node.index, version))
        self.current[node.index] = version
        if self._lineage_has_fake(version):
            self.fake_adoptions += 1
        if version != self.baseline:
            self._check_target(version, verified=True)

    def reached(self, node: SimNode, version: str) -> None:
        self._check_target(version, verified=False)

    def _check_target(self, version: str, verified: bool) -> None:
        if land.true_bpb(self.versions[version]) > self.settings.target:
            return
        if self.t_local is None:
            self.t_local = self.now
        if verified and self.t_verified is None:
            self.t_verified = self.now

    def _lineage_has_fake(self, version: str) -> bool:
        seen = set()
        while version in self.kept_parent_of and version not in seen:
            if version in self.fakes:
                return True
            seen.add(version)
            version = self.kept_parent_of[version]
        return False

    # ------------------------------------------------------------ events

    def _push(self, at: float, kind: str, node: int, payload: object = None) -> None:
        self._order += 1
        heapq.heappush(self._heap, (at, self._order, kind, node, payload))

    def _start(self, node: SimNode, at: float | None = None) -> None:
        self._loops[node.index] = node.loop()
        self._push(self.now if at is None else at, "resume", node.index, node.token)

    def _pull(self, i: int) -> None:
        arrived = self.net.arrived(i, self.now)
        if arrived:
            self.net.received[i] += len(arrived)
            self.net.received_bytes[i] += sum(self.store.sizes[k] for k in arrived)
            self.nodes[i].view.add(arrived, self.now)

    def _resume(self, i: int, token: int) -> None:
        node = self.nodes[i]
        if token != node.token or not self.net.online[i]:
            return
        self._pull(i)
        seconds = next(self._loops[i])
        self._push(self.now + seconds, "resume", i, token)

    def _sync(self, i: int) -> None:
        """Anti-entropy with one random reachable peer: each sends its head and gets the facts it
        lacks, in frames of SYNC_FRAME (docs/gossip.md)."""
        self._push(self.now + self.settings.sync_every, "sync", i)
        if not self.net.online[i] or self.settings.nodes < 2:
            return
        for _ in range(3):
            j = int(self.rng.integers(self.settings.nodes - 1))
            j += j >= i
            if self.net.reachable(i, j, self.now):
                break
        else:
            return
        self._pull(i)
        self._pull(j)
        for a, b in ((i, j), (j, i)):
            missing = self.store.missing(b, a)
            frames = math.ceil(len(missing) / SYNC_FRAME) + 1
            size = self.head_bytes + sum(self.store.sizes[k] for k in missing)
            self.net.received[a] += 1 + frames
            self.net.received_bytes[a] += size
            self.sync_messages += 1 + frames
            self.sync_bytes += size
            if missing:
                self.nodes[a].view.add(missing, self.now)

    def _leave(self, i: int) -> None:
        node = self.nodes[i]
        self._pull(i)
        self.net.online[i] = False
        self.net.drop_inbox(i)
        node.token += 1  # the run in flight ends with no result
        self._push(self.now + self.rng.exponential(self.settings.away_hours * 3600), "join", i)

    def _join(self, i: int) -> None:
        self.net.online[i] = True
        self._sync(i)
        self._start(self.nodes[i])
        self._push(self.now + self.rng.exponential(3600 / self.settings.churn), "leave", i)

    # ------------------------------------------------------------ the run

    def run(self) -> dict:
        s = self.settings
        for node in self.nodes:
            self._start(node, at=float(self.rng.uniform(0, land.RUN_SECONDS)))  # joined apart
            if s.nodes > 1:
                self._push(self.rng.uniform(0, s.sync_every), "sync", node.index)
            if s.churn > 0:
                self._push(self.rng.exponential(3600 / s.churn), "leave", node.index)
        started, research_end, end, next_report = time.time(), s.hours * 3600, math.inf, 3600.0
        while self._heap:
            at, _, kind, i, payload = heapq.heappop(self._heap)
            if at > end:
                break
            self.now = at
            if self.research_open and (at >= research_end or (s.stop_at_target and self._done())):
                self.research_open = False
                self.research_ended = at
                end = at + s.drain_hours * 3600
            if at >= next_report:
                self._report(started)
                next_report += 3600
            if kind == "resume":
                self._resume(i, payload)
            elif kind == "sync":
                self._sync(i)
                if not self.research_open and self._agreed():
                    break
            elif kind == "confirm":
                if self.net.online[i]:
                    self.nodes[i].confirm(payload)
            elif kind == "leave":
                if self.net.online[i]:
                    self._leave(i)
            elif kind == "join":
                self._join(i)
        return self.summary(time.time() - started)

    def close(self) -> None:
        """Close the nodes' ledgers (in memory); the figures stay."""
        for node in self.nodes:
            node.view.close()

    def _done(self) -> bool:
        if self.settings.nodes <= self.settings.quorum:  # nobody can verify: a lone node's head
            return self.t_local is not None
        return self.t_verified is not None

    def _agreed(self) -> bool:
        """Research is over and every online honest node has adopted the best head of all the
        facts made."""
        heads = {self.current.get(n.index) for n in self.honest if self.net.online[n.index]}
        return len(heads) == 1 and heads.pop() == self.final_head()

    def final_head(self) -> str:
        key = len(self.store.facts)
        if getattr(self, "_final", (None,))[0] != key:
            results = [r for r in self.store.rows if "verdict" not in r and r["outcome"] == "keep"]
            checks = [r for r in self.store.rows if "verdict" in r]
            head = consensus.best_head(
                results, checks, PROFILE, self.baseline, self.rules, land.HARNESS
            )
            self._final = (key, head)
        return self._final[1]

    def _report(self, started: float) -> None:
        if self.progress is None:
            return
        head = self.final_head()
        self.progress(
            f"t={self.now / 3600:5.1f} h  facts={len(self.store.facts):6d}  runs={self.runs:6d}  "
            f"head={head[:8]} true={land.true_bpb(self.versions[head]):.4f}  "
            f"wall={time.time() - started:5.1f} s"
        )

    # ------------------------------------------------------------ figures

    def _head_of_prefix(self, count: int) -> str:
        rows = self.store.rows[:count]
        results = [r for r in rows if "verdict" not in r and r["outcome"] == "keep"]
        checks = [r for r in rows if "verdict" in r]
        return consensus.best_head(
            results, checks, PROFILE, self.baseline, self.rules, land.HARNESS
        )

    def win_time(self, head: str) -> float | None:
        """When `head` became the best head of all facts made, for the last time: the end of the
        last prefix of the facts (in the order made) whose best head is another, found by
        galloping back from the end and bisecting (exact when the head did not flip back and
        forth in between, which the checks along the way make unlikely)."""
        if head == self.baseline:
            return None
        total = len(self.store.rows)
        good, step = total, 1  # the prefix of `good` facts has `head` as its best
        while True:
            probe = max(0, good - step)
            if probe == 0 or self._head_of_prefix(probe) != head:
                bad = probe
                break
            good, step = probe, step * 2
        while good - bad > 1:
            middle = (good + bad) // 2
            if self._head_of_prefix(middle) == head:
                good = middle
            else:
                bad = middle
        return self.store.made[good - 1]

    def summary(self, wall: float) -> dict:
        s = self.settings
        final = self.final_head()
        t_win = self.win_time(final)
        online_honest = [n.index for n in self.honest if self.net.online[n.index]]
        last = {}
        for at, i, version in self.adoptions:
            last[i] = (at, version)
        agreed = all(last.get(i, (0, None))[1] == final for i in online_honest)
        t_agree = None
        if agreed and t_win is not None:
            t_agree = max(last[i][0] for i in online_honest) - t_win
        runs = max(self.runs, 1)
        verified_fakes = sum(1 for v in self.fakes if self._ever_adopted(v))
        return {
            "settings": {**asdict(s), "path": "sqlite" if self.use_ledger else "shared"},
            "facts": len(self.store.facts),
            "runs": self.runs,
            "runs_by_purpose": dict(self.runs_by_purpose),
            "research_hours": getattr(self, "research_ended", self.now) / 3600,
            "hours_to_target_local": None if self.t_local is None else self.t_local / 3600,
            "hours_to_target_verified": None if self.t_verified is None else self.t_verified / 3600,
            "final_head": final,
            "final_head_true_bpb": land.true_bpb(self.versions[final]),
            "seconds_to_agree_after_last_win": t_agree,
            "all_agree": agreed,
            # Messages a node receives per run of train.py it makes (gossip and sync together).
            "messages_per_node_per_run": float(self.net.received.sum()) / runs,
            "bytes_per_node_per_run": float(self.net.received_bytes.sum()) / runs,
            "sync_share_of_bytes": self.sync_bytes / max(1, int(self.net.received_bytes.sum())),
            "malicious_nodes": len(self.cheats),
            "fake_claims": len(self.fakes),
            "fakes_adopted": verified_fakes,
            "adoptions_with_fake_in_lineage": self.fake_adoptions,
            "wrong_adopted": self.fake_adoptions > 0,
            "rejected_by_ledgers": sum(getattr(n.view, "rejected", 0) for n in self.nodes),
            "wall_seconds": wall,
        }

    def _ever_adopted(self, version: str) -> bool:
        return any(v == version for _, _, v in self.adoptions)
