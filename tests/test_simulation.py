"""The swarm simulation: deterministic, faster than one node, agreeing, safe below the quorum,
healing after a partition. Small swarms over a few virtual hours: seconds each."""

from __future__ import annotations

import statistics

import numpy as np

from node import wire
from node.simulation import Settings, Simulation
from node.simulation import landscape as land


def _run(**kw) -> tuple[Simulation, dict]:
    sim = Simulation(Settings(**kw))
    return sim, sim.run()


def test_the_surrogate_is_the_documented_bowl_and_versions_are_real_hashes():
    assert land.true_bpb(land.OPTIMUM) == land.FLOOR
    assert land.true_bpb(land.BASELINE) > land.FLOOR + 0.1
    x = np.array([0.5, -0.25, 0, 0, 0, 0, 0, 1.0])
    assert land.version(x) == wire.content_ref(land.source(x).encode())[0]
    runs = [land.measure(x, np.random.default_rng(i)) for i in range(400)]
    assert abs(statistics.fmean(runs) - land.true_bpb(x)) < 0.0005
    assert abs(statistics.stdev(runs) - land.NOISE_SD) < 0.0003


def test_the_same_seed_gives_the_same_facts_and_figures_and_another_seed_does_not():
    settings = dict(nodes=4, hours=2.0, ledger="sqlite", loss=0.1, stop_at_target=False)
    first, a = _run(seed=5, **settings)
    second, b = _run(seed=5, **settings)
    _, c = _run(seed=6, **settings)
    assert [f.id for f in first.store.facts] == [f.id for f in second.store.facts]
    a.pop("wall_seconds"), b.pop("wall_seconds"), c.pop("wall_seconds")
    assert a == b
    assert a["final_head"] != c["final_head"] or a["facts"] != c["facts"]
    assert a["rejected_by_ledgers"] == 0  # every fact passed every receiving node's ledger


def test_the_shared_store_signs_the_same_facts_and_adopts_the_same_as_per_node_ledgers():
    settings = dict(nodes=5, seed=1, hours=2.0, loss=0.1, stop_at_target=False)
    ledgers, by_ledger = _run(ledger="sqlite", **settings)
    shared, by_store = _run(ledger="shared", **settings)
    assert [f.id for f in ledgers.store.facts] == [f.id for f in shared.store.facts]
    for summary in (by_ledger, by_store):
        summary.pop("wall_seconds"), summary.pop("settings")
    assert by_ledger == by_store


def test_a_small_swarm_reaches_the_target_faster_than_one_node():
    alone, swarm = [], []
    for seed in (0, 1):
        alone.append(_run(nodes=1, seed=seed, hours=200.0, ledger="shared")[1])
        swarm.append(_run(nodes=8, seed=seed, hours=200.0, ledger="shared")[1])
    one = statistics.fmean(s["hours_to_target_local"] for s in alone)
    eight = statistics.fmean(s["hours_to_target_verified"] for s in swarm)
    assert eight < one / 2, (one, eight)


def test_all_nodes_agree_on_the_head_at_the_end_despite_latency_and_loss():
    sim, summary = _run(nodes=6, seed=2, hours=3.0, latency=2.0, loss=0.2, stop_at_target=False)
    assert summary["settings"]["path"] == "sqlite"
    assert summary["all_agree"]
    assert summary["final_head"] != sim.baseline
    assert summary["seconds_to_agree_after_last_win"] is not None
    assert {n.view.best_head() for n in sim.nodes} == {summary["final_head"]}


def test_colluders_below_the_quorum_get_nothing_wrong_adopted():
    sim, summary = _run(nodes=10, seed=3, hours=4.0, malicious=0.2, quorum=3, stop_at_target=False)
    assert summary["malicious_nodes"] == 2 and summary["fake_claims"] > 20
    assert not summary["wrong_adopted"]
    assert summary["fakes_adopted"] == 0


def test_colluders_at_the_quorum_get_their_fakes_adopted():
    """The other side of the line, so that the check above is known to catch a fake."""
    sim, summary = _run(nodes=10, seed=3, hours=2.0, malicious=0.3, quorum=2, stop_at_target=False)
    assert summary["malicious_nodes"] == 3
    assert summary["wrong_adopted"] and summary["fakes_adopted"] > 0


def test_a_partition_heals_and_both_halves_agree():
    cut, _ = _run(
        nodes=8, seed=4, hours=2.0, partition=(0.5, 2.5), ledger="shared", stop_at_target=False,
        drain_hours=0.0,
    )  # fmt: skip
    index = {n.peer_id: n.index for n in cut.nodes}
    during = [k for k, t in enumerate(cut.store.made) if 0.6 * 3600 < t < 1.9 * 3600]
    for k in during:  # while cut, no fact crossed from one half to the other
        side = index[cut.store.facts[k].peer_id] % 2
        assert not cut.store.held[1 - side :: 2, k].any()
    assert during
    sim, summary = _run(
        nodes=8, seed=4, hours=4.0, partition=(0.5, 2.5), ledger="shared", stop_at_target=False
    )
    made_by_end = sum(1 for t in sim.store.made if t < 2.5 * 3600)
    assert sim.store.held[:, :made_by_end].all()  # every fact of either half reached everyone
    assert summary["all_agree"]
    assert {n.view.best_head() for n in sim.nodes} == {summary["final_head"]}
