"""The discrete-event simulation of a swarm: real Researchers on real in-memory ledgers, a
surrogate trainer on a virtual clock, gossip, anti-entropy sync, churn and partitions, and the
figures a run yields.

A node's step runs at once in real time: its runs add their virtual seconds to the clock as
they happen, each fact it signs is stamped and sent at the clock's time then, and its next step
starts when the last run ended. Other nodes act in between (the event heap) on what had reached
them by their own time. Deterministic for a seed: one event heap ordered by (virtual time,
insertion number), and every random draw from generators seeded from the settings. It never
sleeps, and reads the wall clock only for the progress line.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from node import consensus, wire
from node.simulation import landscape as land
from node.simulation import provenance
from node.simulation.catalogue import CatalogueLandscape
from node.simulation.network import FactStore, Transport, head_size
from node.simulation.nodes import CAMPAIGN, HARNESS, SimNode

EPOCH_MS = 1_800_000_000_000  # virtual second 0, as a fact's time in ms (fixed: determinism)
SYNC_FRAME = 256  # facts per sync frame (docs/gossip.md)
ENTRY_BYTES = 39  # one author's entry in a sync request: a 32-byte key and a seq, in msgpack
IDLE_SECONDS = 30.0  # a step that ran nothing (nothing to propose): the agent's turn
# Each further step in a row that ran nothing, with no news between, waits twice as long, up to
# 2 ** IDLE_DOUBLINGS turns; news wakes the node at once. A real node tries every turn, but with
# no news its ledger is the same and so is its choice but for the clock's own draws (one more
# replayer an hour): a swarm with nothing left to try would spin the simulator for hours.
IDLE_DOUBLINGS = 6
STUCK_HOURS = 24.0  # research ends after this long without a new fact: nobody has an idea left
RULES = ("swarm", "trusting", "keep-if-lower")
LANDSCAPES = {"ideas": land.Landscape, "catalogue": CatalogueLandscape}
ADVERSARIES = ("liar", "colluder", "framer", "jammer")


@dataclass
class Settings:
    """One run's parameters. Times are virtual: hours for the run, seconds for the network.

    `rule`: the nodes' adoption rule: "swarm" (the product's), "trusting" (every claim adopted
    unverified) or "keep-if-lower" (one run a change, kept when lower: for a lone node).
    `liars`: nodes that sign their children's scores lower than measured; `colluders`: the
    share of nodes that confirm each other's claims without running them and refute honest
    ones; `framers`: nodes that run nothing and sign a false replay (misreported) of every
    honest claim; `jammers`: nodes that run nothing and sign a discard of every change the
    offline proposer knows on each head they see (the catalogue landscape); `membership`: the
    campaign lists its members, so each claim's committee is drawn from them; `fast_hardware`: the share of nodes on a device class that runs faster and
    reads lower (`nodes.FAST_SPEED`, `nodes.FAST_OFFSET`). `churn`: leaves per node per hour
    (exponential), each for an exponential `away_hours`; `partition`: (start, end) in hours,
    the even and odd nodes cut apart."""

    nodes: int = 8
    seed: int = 0
    hours: float = 48.0
    quorum: int = 1
    rule: str = "swarm"
    liars: int = 0
    colluders: float = 0.0
    framers: int = 0
    jammers: int = 0
    membership: bool = False
    fast_hardware: float = 0.0
    latency: float = 0.1
    loss: float = 0.0
    churn: float = 0.0
    away_hours: float = 1.0
    partition: tuple[float, float] | None = None
    target_gain: float | None = None  # None: the landscape's own (`target_gain()`)
    landscape: str = "ideas"  # "ideas" (landscape.py) or "catalogue" (the real proposer's)
    proposer: str = "learning"  # on the catalogue, "fixed": its seeded order alone
    verify_every: int = 4
    sync_every: float = 30.0
    stop_at_target: bool = True
    drain_hours: float = 2.0


class Simulation:
    def __init__(self, settings: Settings, progress: Callable[[str], None] | None = None) -> None:
        self.settings, self.progress = settings, progress
        s = settings
        if s.quorum < 1 or s.nodes < 1:
            raise ValueError("nodes and quorum must be at least 1")
        if s.rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, not {s.rule!r}")
        self.rng = np.random.default_rng([s.seed, 0])
        if s.landscape not in LANDSCAPES:
            raise ValueError(
                f"landscape must be one of {', '.join(LANDSCAPES)}, not {s.landscape!r}"
            )
        if s.jammers and s.landscape != "catalogue":
            raise ValueError("jammers sign the offline proposer's changes: use the catalogue")
        if s.proposer not in ("learning", "fixed"):
            raise ValueError(f"proposer must be learning or fixed, not {s.proposer!r}")
        self.landscape = LANDSCAPES[s.landscape](s.seed)
        self.target_gain = self.landscape.target_gain() if s.target_gain is None else s.target_gain
        self.clock = 0.0  # virtual seconds: the event's time, advanced by the runs of a step
        self.now = 0.0  # the time of the event being handled
        self.store = FactStore(s.nodes)
        partition = None if s.partition is None else (s.partition[0] * 3600, s.partition[1] * 3600)
        self.net = Transport(
            s.nodes, np.random.default_rng([s.seed, 1]), s.latency, s.loss, partition
        )
        self.work = tempfile.TemporaryDirectory(prefix="swarm-sim-")
        self.work_dir = self.work.name
        roles = ["honest"] * s.nodes
        order = self.rng.permutation(s.nodes).tolist()
        colluders = round(s.colluders * s.nodes)
        for i in order[:colluders]:
            roles[i] = "colluder"
        for i in order[colluders : colluders + s.liars]:
            roles[i] = "liar"
        for i in order[colluders + s.liars : colluders + s.liars + s.framers]:
            roles[i] = "framer"
        for i in order[colluders + s.liars + s.framers :][: s.jammers]:
            roles[i] = "jammer"
        fast = set(
            self.rng.choice(s.nodes, round(s.fast_hardware * s.nodes), replace=False).tolist()
        )
        self.baseline = hashlib.sha256(self.landscape.baseline.encode()).hexdigest()
        members = [SimNode.identity(s.seed, i).peer_id for i in range(s.nodes)]
        self.terms = {"name": CAMPAIGN, "baseline": self.baseline, "quorum": s.quorum,
                      "members": members if s.membership else None}  # fmt: skip
        self.rules = consensus.Rules.of(land.PROFILE, s.quorum, self.terms["members"])
        self.nodes = [SimNode(self, i, roles[i], i in fast) for i in range(s.nodes)]
        colluding = [n for n in self.nodes if n.role == "colluder"]
        for n in colluding:
            n.partners = [m for m in colluding if m is not n]
        self.role_of = {n.peer_id: n.role for n in self.nodes}
        self.fast_of = {n.peer_id: n.fast for n in self.nodes}
        self.honest = [n for n in self.nodes if n.role == "honest"]
        self.sources: dict[str, bytes] = {self.baseline: self.landscape.baseline.encode()}
        # version -> the kept result that made it: the first honest one, else the first
        self.made_by: dict[str, dict] = {}
        # a single change's description: who first ran it alone, who first kept it alone
        self.first_run: dict[str, str] = {}
        self.first_keep: dict[str, str] = {}
        self.head_bytes = head_size(s.nodes)
        self.authors_per_bin = [0] * wire.HEAD_BINS
        for n in self.nodes:
            self.authors_per_bin[wire.bin_of(n.me.public_key)] += 1
        self.runs = 0
        self.runs_by_purpose = {"research": 0, "verify": 0, "adopt": 0, "audit": 0}
        self.research_runs_fast = 0
        self.fakes: set[str] = set()  # result ids of adversaries' kept claims
        self.adoptions: list[tuple[float, int, str]] = []  # (when, honest node, head adopted)
        self.adopted_now: dict[int, str] = {}  # each honest node's head now
        self.research_open = True
        self.last_made = 0.0  # when the latest fact was made
        self.t_target: float | None = None  # an honest node first adopts a head at the target
        self.t_local: float | None = None  # an honest node's own head first at the target
        self.settled = False  # research is over and every online honest node holds the head
        self.targets_revoked = 0  # times research went on: the head at the target was revoked
        self.sync_messages = 0
        self.sync_bytes = 0
        self._heap: list = []
        self._order = 0

    def clock_ms(self) -> int:
        return EPOCH_MS + int(round(self.clock * 1000))

    # ------------------------------------------------------------ what nodes call

    def publish(self, node: SimNode, fact: wire.Fact) -> None:
        """A fact `node` signed (its ledger holds it): stored and gossiped at the clock's time."""
        index = self.store.add(fact, self.clock)
        self.last_made = max(self.last_made, self.clock)
        self.store.held[node.index, index] = True
        if fact.kind == "result":
            for role in ("parent", "child"):
                version = fact.body[role]
                if version not in self.sources:
                    self.sources[version] = node.ledger.version(version) or b""
            # who found each single change (`found_by`): a combination's parts are theirs
            single = fact.body["description"]
            if "; " not in single and node.role != "jammer":  # a jammer ran none
                self.first_run.setdefault(single, fact.peer_id)
                if fact.body["outcome"] == "keep":
                    self.first_keep.setdefault(single, fact.peer_id)
            if fact.body["outcome"] == "keep":
                child, made = (
                    fact.body["child"],
                    {**fact.body, "id": fact.id, "author": fact.peer_id},
                )
                held = self.made_by.get(child)
                if held is None or (node.role == "honest" and held["id"] in self.fakes):
                    self.made_by[child] = made
                if node.role in ADVERSARIES:
                    self.fakes.add(fact.id)
        self.net.send(index, node.index, self.clock)

    def schedule_confirm(self, partner: SimNode, fact: wire.Fact, claimed: tuple) -> None:
        """A colluder's partner confirms the claim as soon as gossip could bring it."""
        s = self.settings
        delay = float(self.rng.gamma(self.net.hops, s.latency)) if s.latency else 0.0
        self._push(self.clock + delay, "confirm", partner.index, (fact, claimed))

    def count_run(self, node: SimNode, text: str) -> None:
        self.runs += 1
        doing = node.researcher.now.doing
        purpose = next((p for prefix, p in (("verify", "verify"), ("re-score", "adopt"), ("look ahead", "adopt"),
                                            ("audit", "audit")) if doing.startswith(prefix)),
                       "research")  # fmt: skip
        self.runs_by_purpose[purpose] += 1
        if purpose == "research" and node.fast:
            self.research_runs_fast += 1

    # ------------------------------------------------------------ events

    def _push(self, at: float, kind: str, node: int, payload: object = None) -> None:
        self._order += 1
        heapq.heappush(self._heap, (at, self._order, kind, node, payload))

    def _pull(self, i: int) -> int:
        """Deliver what reached node `i` by now; the count of facts new to it."""
        arrived = self.net.arrived(i, self.now)
        if not arrived:
            return 0
        self.net.received[i] += len(arrived)
        self.net.received_bytes[i] += sum(self.store.sizes[k] for k in arrived)
        return self._deliver(i, arrived)

    def _deliver(self, i: int, indices: list[int]) -> int:
        new = [k for k in indices if not self.store.held[i, k]]
        if not new:
            return 0
        self.store.held[i, new] = True
        node = self.nodes[i]
        if node.idle > 1 and self.net.online[i]:  # asleep for longer than a turn: news wakes it
            node.idle, node.token = 0, node.token + 1
            self._push(self.now, "resume", i, node.token)
        facts = [self.store.facts[k] for k in new]
        versions = {
            f.body[role] for f in facts if f.kind == "result" for role in ("parent", "child")
        }
        self.nodes[i].receive([f.raw for f in facts], [self.sources[v] for v in versions
                                                       if self.sources.get(v)])  # fmt: skip
        return len(new)

    def _resume(self, i: int, token: int) -> None:
        node = self.nodes[i]
        if token != node.token or not self.net.online[i]:
            return
        idle, node.idle = node.idle, 0  # awake: news now does not wake it again
        news = self._pull(i)
        node.act()
        self._observe(node)
        node.idle = 0 if self.clock > self.now or news else idle + 1  # it ran nothing
        turns = 2 ** min(max(node.idle - 1, 0), IDLE_DOUBLINGS)
        self._push(max(self.clock, self.now + IDLE_SECONDS * turns), "resume", i, token)

    def _observe(self, node: SimNode) -> None:
        """What an honest node's step showed: the head it adopted (at the step's start) and its
        own head (at the step's end), against the target."""
        if node.role != "honest":
            return
        adopted = node.adopted()
        if adopted is not None and self.adopted_now.get(node.index) != adopted:
            self.adopted_now[node.index] = adopted
            self.adoptions.append((self.now, node.index, adopted))
            if self.t_target is None and self._at_target(adopted) and adopted != self.baseline:
                self.t_target = self.now
        own = node.own_head()
        if self.t_local is None and own is not None and self._at_target(own):
            self.t_local = self.clock

    def true_bpb(self, version: str) -> float:
        return self.landscape.bpb(self.sources[version].decode())

    def _at_target(self, version: str) -> bool:
        return self.true_bpb(version) <= land.BASELINE_BPB - self.target_gain

    def _sync(self, i: int) -> None:
        """Anti-entropy with one random reachable peer: each sends its head and gets the facts it
        lacks (made by now), in frames of SYNC_FRAME (docs/gossip.md)."""
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
        lacks = {a: self.store.missing(b, a, self.now) for a, b in ((i, j), (j, i))}
        # The bins whose digests differ hold the authors of what either side lacks; the
        # requester sends its entries of every author in those bins.
        bins = {wire.bin_of(self.store.facts[k].author) for m in lacks.values() for k in m}
        entries = sum(self.authors_per_bin[x] for x in bins)
        for a, missing in lacks.items():
            frames = math.ceil(len(missing) / SYNC_FRAME) + 1
            size = (self.head_bytes + 3 * len(bins) + ENTRY_BYTES * entries
                    + sum(self.store.sizes[k] for k in missing))  # fmt: skip
            self.net.received[a] += 3 + frames  # bins, want, entries, the frames and their end
            self.net.received_bytes[a] += size
            self.sync_messages += 3 + frames
            self.sync_bytes += size
            if missing:
                self._deliver(a, missing)

    def _leave(self, i: int) -> None:
        node = self.nodes[i]
        self._pull(i)
        self.net.online[i] = False
        self.net.drop_inbox(i)
        node.token += 1  # the step in flight ends with no result
        node.idle = 0  # it steps when it joins again
        self._push(self.now + self.rng.exponential(self.settings.away_hours * 3600), "join", i)

    def _join(self, i: int) -> None:
        self.net.online[i] = True
        self._sync(i)
        self._push(self.now, "resume", i, self.nodes[i].token)
        self._push(self.now + self.rng.exponential(3600 / self.settings.churn), "leave", i)

    # ------------------------------------------------------------ the run

    def run(self) -> dict:
        s = self.settings
        for node in self.nodes:  # joined apart
            self._push(float(self.rng.uniform(0, land.RUN_SECONDS)), "resume", node.index, 0)
            if s.nodes > 1:
                self._push(self.rng.uniform(0, s.sync_every), "sync", node.index)
            if s.churn > 0:
                self._push(self.rng.exponential(3600 / s.churn), "leave", node.index)
        started, research_end, end, next_report = time.time(), s.hours * 3600, math.inf, 3600.0
        self.research_ended = research_end
        while self._heap:
            at, _, kind, i, payload = heapq.heappop(self._heap)
            if at > end or self.settled:
                if not self._reopen(at, research_end):
                    break
                end = math.inf
            self.now = self.clock = at
            stuck = at - self.last_made > STUCK_HOURS * 3600
            if self.research_open and (
                at >= research_end or (s.stop_at_target and self._done()) or stuck
            ):
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
                self.settled = not self.research_open and self._agreed()
            elif kind == "confirm":
                if self.net.online[i]:
                    self._pull(i)
                    self.nodes[i].confirm(*payload)
            elif kind == "leave":
                if self.net.online[i]:
                    self._leave(i)
            elif kind == "join":
                self._join(i)
        self.ended = self.now
        return self.summary(time.time() - started)

    def _reopen(self, at: float, research_end: float) -> bool:
        """Whether research that stopped at the target goes on: it does, under the swarm's
        rule, when the head the swarm settled on is below the target (later looks revoked the
        win that reached it) and hours remain; the hours to the target are then those of the
        next head at it. (A trusting swarm revokes nothing; a lone node's own head counts.)"""
        if (self.settings.rule != "swarm" or self.lone or self.t_target is None
                or at >= research_end or self._at_target(self.final_head())):  # fmt: skip
            return False
        self.research_open, self.settled, self.t_target = True, False, None
        self.targets_revoked += 1
        return True

    def close(self) -> None:
        """Close the nodes' ledgers (in memory) and remove their run folders; the figures stay."""
        for node in self.nodes:
            node.ledger.close()
        self.work.cleanup()

    @property
    def lone(self) -> bool:
        """A lone node: nobody verifies its claims, and its own head counts."""
        return self.settings.nodes == 1 or self.settings.rule == "keep-if-lower"

    def _done(self) -> bool:
        return self.t_local is not None if self.lone else self.t_target is not None

    def _agreed(self) -> bool:
        """Research is over and every online honest node has adopted the best head of all the
        facts made."""
        heads = {self.adopted_now.get(n.index) for n in self.honest if self.net.online[n.index]}
        return len(heads) == 1 and heads.pop() == self.final_head()

    def standings(self) -> tuple[dict[str, consensus.Score], dict[str, dict]]:
        """(the versions' scores, the kept results by id) of every fact made, under the rule."""
        key = len(self.store.facts)
        if getattr(self, "_standings", (None,))[0] != key:
            results, checks = self.store.rows_for(land.PROFILE.name)
            scores, _ = consensus.standings(
                results, checks, land.PROFILE.name, self.baseline, self.rules, HARNESS
            )
            self._standings = (key, (scores, {r["id"]: r for r in results}))
        return self._standings[1]

    @property
    def found_by(self) -> dict[str, str]:
        """A single change's description: who first kept it alone, else who first ran it alone.
        A first run that lost (a discard on an unlucky seed, or on another parent) found
        nothing."""
        return {**self.first_run, **self.first_keep}

    def final_head(self) -> str:
        return consensus.head_of(self.standings()[0])

    def _report(self, started: float) -> None:
        if self.progress is None:
            return
        head = self.final_head()
        self.progress(
            f"t={self.now / 3600:5.1f} h  facts={len(self.store.facts):6d}  runs={self.runs:6d}  "
            f"head={head[:8]} gain={land.BASELINE_BPB - self.true_bpb(head):.4f}  "
            f"wall={time.time() - started:5.1f} s"
        )

    # ------------------------------------------------------------ figures

    def summary(self, wall: float) -> dict:
        s = self.settings
        scores, by_id = self.standings()
        final = consensus.head_of(scores)
        steps = []
        version = final
        while scores[version].via is not None:
            steps.append(by_id[scores[version].via])
            version = scores[version].parent
        gains = [self.true_bpb(r["parent"]) - self.true_bpb(r["child"]) for r in steps]
        online_honest = [n.index for n in self.honest if self.net.online[n.index]]
        runs = max(self.runs, 1)
        research = max(self.runs_by_purpose["research"], 1)
        held = [*self.adoptions, *((self.ended, n.index, None) for n in self.honest)]
        adversaries = {peer for peer, role in self.role_of.items() if role in ADVERSARIES}
        shares = provenance.head_shares(self.made_by, held, adversaries, self.fakes)
        hours = self.t_local if self.lone else self.t_target
        finders = [a for r in steps for a in provenance.finders(self.made_by, self.found_by, r)]
        return {
            "settings": asdict(s),
            "hours_to_target": None if hours is None else hours / 3600,
            "hours_to_target_local": None if self.t_local is None else self.t_local / 3600,
            "research_hours": self.research_ended / 3600,
            "final_head": final,
            "final_head_gain": land.BASELINE_BPB - self.true_bpb(final),
            "target_gain": self.target_gain,
            "lineage_steps": len(steps),
            "targets_revoked": self.targets_revoked,
            "fakes_in_final_lineage": sum(
                provenance.carries(self.made_by, r, self.fakes) for r in steps
            ),
            "false_steps_in_final_lineage": sum(g <= 0 for g in gains),
            # changes in it an adversary measured first: its claims, or parts of combinations
            "adversary_changes_in_final_lineage": sum(a in adversaries for a in finders),
            "fast_share_of_lineage": (
                sum(self.fast_of[r["author"]] for r in steps) / len(steps) if steps else None
            ),  # fmt: skip
            # the same, counted by change: a merge for the author of the change it carries, a
            # bundle for those of each of its changes, a combination for who found each of its
            "fast_share_of_changes": (
                sum(self.fast_of[a] for a in finders) / len(finders) if finders else None
            ),
            "fast_share_of_research_runs": self.research_runs_fast / research,
            "liar_head_share": shares["adversary_made"] if s.liars else 0.0,
            "fake_head_share": shares["adversary_in_lineage"],
            "all_agree": all(self.adopted_now.get(i) == final for i in online_honest),
            "facts": len(self.store.facts),
            "runs": self.runs,
            "runs_by_purpose": dict(self.runs_by_purpose),
            "adversary_claims": len(self.fakes),
            # Messages a node receives per run of train.py it makes (gossip and sync together).
            "messages_per_node_per_run": float(self.net.received.sum()) / runs,
            "bytes_per_node_per_run": float(self.net.received_bytes.sum()) / runs,
            "sync_share_of_bytes": self.sync_bytes / max(1, int(self.net.received_bytes.sum())),
            "rejected_by_ledgers": sum(n.rejected for n in self.nodes),
            "wall_seconds": wall,
        }
