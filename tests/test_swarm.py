"""Three nodes researching together, as a hackathon group runs them: a signed campaign file, a
real bootstrap and three `swarm join` processes on loopback on the `test` profile with the
offline proposer. Within a bounded time every node holds the same best head, verified by the
campaign's quorum of peers other than its author, and each node's worker builds on it."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from conftest import Process, run_swarm, wait_until, worker_builds_on

from node import consensus
from node.agent.adoption import best_head, swarm_rows
from node.ledger import Ledger, LedgerError
from node.trainer import get_profile, harness_sha256

WEAK = Path(__file__).parent / "campaigns" / "weak_train.py"
PROGRAM = Path(__file__).parents[1] / "program.md"
QUORUM = 2


def consensus_head(home: Path, baseline: str) -> str | None:
    db = home / "ledger.db"
    if not db.exists():
        return None
    try:
        with Ledger(db, readonly=True) as ledger:
            return best_head(ledger, "test", baseline, QUORUM, harness_sha256(get_profile("test")))
    except (sqlite3.OperationalError, LedgerError):  # the node is still creating its ledger
        return None


@pytest.mark.sandbox  # a node runs peers' code only in the sandbox
@pytest.mark.slow
def test_three_nodes_converge_on_a_head_the_quorum_verified(tmp_path, small_data, data_cache):
    env = {**os.environ, "SWARM_DATA": str(data_cache), "COLUMNS": "200"}
    campaign_file = tmp_path / "weak.campaign.json"
    made = run_swarm(
        "campaign",
        "new",
        "weak",
        "--program",
        str(PROGRAM),
        "--profile",
        "test",
        "--quorum",
        str(QUORUM),
        "--baseline",
        str(WEAK),
        "--out",
        str(campaign_file),
        "--home",
        str(tmp_path / "organiser"),
        env=env,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    shown = json.loads(run_swarm("campaign", "show", str(campaign_file), "--json", env=env).stdout)
    baseline = shown["baseline"]
    assert shown["quorum"] == QUORUM and shown["profiles"] == ["test"]

    homes = [tmp_path / f"node{i}" for i in range(3)]
    boot = Process(
        "bootstrap",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--campaign",
        "weak",
        "--home",
        str(tmp_path / "bootstrap"),
        env=env,
    )
    nodes: list[Process] = []
    try:
        address = boot.wait_for(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)", 60).group(1)
        for i, home in enumerate(homes):
            nodes.append(
                Process(
                    "join",
                    "--bootstrap",
                    address,
                    "--listen",
                    "/ip4/127.0.0.1/tcp/0",
                    "--profile",
                    "test",
                    "--campaign",
                    str(campaign_file),
                    "--seed",
                    str(i),
                    "--verify-every",
                    "2",
                    "--home",
                    str(home),
                    env=env,
                )
            )

        def agreed() -> str | None:
            heads = {consensus_head(home, baseline) for home in homes}
            for node in nodes:
                assert node.proc.poll() is None, "".join(node.lines)
            head = heads.pop()
            return head if not heads and head not in (None, baseline) else None

        head = wait_until(agreed, "three nodes agreeing on a verified head", timeout=600, every=2)
        for home in homes:
            with Ledger(home / "ledger.db", readonly=True) as ledger:
                results, verifications = swarm_rows(ledger, "test")
                verified = consensus.verified_children(
                    results, verifications, ledger.rules("test", QUORUM)
                )
            makers = [r for r in results if r["child"] == head and r["id"] in verified]
            assert makers, "the head is made by a verified result"
            assert all(
                len(verified[r["id"]]) >= QUORUM and r["author"] not in verified[r["id"]]
                for r in makers
            )

        # Each node's worker moves to the head its ledger ranks first (or a verified head built on
        # it) and researches from it: seen once for each node. That head may have moved on since
        # they agreed, to a child or to a sibling the later looks rank better (a chance lead of
        # one change overtaken by another's, as seen on a busy machine).
        on_head: set[Path] = set()

        def all_on_the_head() -> bool:
            for home in homes:
                first = consensus_head(home, baseline)
                if first not in (None, baseline) and worker_builds_on(home, first):
                    on_head.add(home)
            return on_head == set(homes)

        def where_they_are() -> str:
            said = []
            for home, node in zip(homes, nodes, strict=True):
                try:
                    state = json.loads((home / "status" / "worker-0.json").read_text())
                except (OSError, ValueError):
                    state = {}
                keys = ("doing", "head", "adopted", "steps")
                said.append(f"{home.name}: ranks first {consensus_head(home, baseline)}, worker "
                            f"{ {k: state.get(k) for k in keys} }; last lines: "
                            + " | ".join(line.strip() for line in node.lines[-6:]))  # fmt: skip
            return f"agreed head {head}; " + "; ".join(said)

        wait_until(
            all_on_the_head, "every node's worker building on the head it ranks first", timeout=240,
            every=2, explain=where_they_are,
        )  # fmt: skip
    finally:
        codes = [node.stop() for node in nodes]
        boot.stop()
    assert codes == [0, 0, 0], [("".join(n.lines))[-2000:] for n in nodes]
    for home in homes:
        with sqlite3.connect(home / "ledger.db") as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            names = {r[0] for r in conn.execute("SELECT DISTINCT campaign FROM facts")}
            assert names == {"weak"}  # nodes of other campaigns never mix facts
