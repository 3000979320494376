"""A swarm against what it is for, over many seeds: the swarm under its settings, the same swarm
adopting every claim unverified, and a node alone under each lone rule (the swarm's own, and
keep-if-lower: autoresearch's), each on the same landscape and seeds. Medians of the hours to
the target, with bootstrap intervals over the seeds; a seed that never reached the target
counts as slower than any that did.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from node.simulation.swarm import Settings, Simulation

LONE_HOURS = 1000.0  # virtual hours a lone node researches at most
BOOTSTRAP = 2000  # resamples of the seeds behind each interval
# The comparisons each seed runs: (name, how its settings differ from the swarm's)
BASELINES = {
    "trusting": dict(rule="trusting", liars=0, colluders=0.0, framers=0, jammers=0,
                     membership=False),
    "lone_swarm_rule": dict(nodes=1, rule="swarm", liars=0, colluders=0.0, framers=0, jammers=0,
                            hours=LONE_HOURS, fast_hardware=0.0, churn=0.0, partition=None),
    "lone_keep_if_lower": dict(nodes=1, rule="keep-if-lower", liars=0, colluders=0.0, framers=0,
                               jammers=0, hours=LONE_HOURS, fast_hardware=0.0, churn=0.0,
                               partition=None),
}  # fmt: skip


def simulate(settings: Settings) -> dict:
    """One simulation's summary (its ledgers closed)."""
    sim = Simulation(settings)
    try:
        return sim.run()
    finally:
        sim.close()


def study(
    settings: Settings, seeds: Sequence[int], workers: int = 1, baselines: bool = True,
    progress: Callable[[str], None] | None = None, nodes: Sequence[int] | None = None,
) -> dict:  # fmt: skip
    """The swarm of `settings` on each seed, against its BASELINES (unless `baselines` is
    False), in `workers` processes; the figures of docs/simulation.md. With several counts of
    `nodes`, the swarm (and its trusting twin) of each against the same lone nodes, run once:
    {"by_nodes": {count: figures}}."""
    counts = list(nodes or [settings.nodes])
    lone = {k: v for k, v in BASELINES.items() if k != "trusting"} if baselines else {}
    tasks = []
    for count in counts:
        tasks += [((count, "swarm"), seed, dataclasses.replace(settings, seed=seed, nodes=count))
                  for seed in seeds]  # fmt: skip
        if baselines:
            tasks += [((count, "trusting"), seed,
                       dataclasses.replace(settings, seed=seed, nodes=count, **BASELINES["trusting"]))
                      for seed in seeds]  # fmt: skip
    for name, change in lone.items():
        tasks += [((None, name), seed, dataclasses.replace(settings, seed=seed, **change))
                  for seed in seeds]  # fmt: skip
    runs: dict[tuple, dict[int, dict]] = {key: {} for key, _, _ in tasks}
    with ProcessPoolExecutor(max(1, workers)) as pool:
        futures = [(key, seed, pool.submit(simulate, s)) for key, seed, s in tasks]
        for done, ((count, name), seed, future) in enumerate(futures, 1):
            runs[(count, name)][seed] = future.result()
            if progress is not None:
                summary = runs[(count, name)][seed]
                hours, fakes = summary["hours_to_target"], summary["fakes_in_final_lineage"]
                label = name if count is None or len(counts) == 1 else f"{name} of {count}"
                progress(f"{done}/{len(futures)} {label} seed {seed}: "
                         f"{'not reached' if hours is None else f'{hours:.1f} h'}"
                         f"{f', {fakes} fake(s) in its final lineage' if fakes else ''}")  # fmt: skip
    each = {
        count: figures({name: by_seed for (c, name), by_seed in runs.items() if c in (count, None)},
                       seeds)
        for count in counts
    }  # fmt: skip
    return each[counts[0]] if len(counts) == 1 else {"by_nodes": each}


def figures(runs: dict[str, dict[int, dict]], seeds: Sequence[int]) -> dict:
    """The study's figures from each comparison's summaries by seed."""
    rng = np.random.default_rng(0)
    swarm = [runs["swarm"][s] for s in seeds]
    hours = {name: np.array([_hours(by_seed[s]) for s in seeds]) for name, by_seed in runs.items()}
    out: dict = {"seeds": len(seeds), "settings": {k: v for k, v in swarm[0]["settings"].items()
                                                    if k != "seed"}}  # fmt: skip
    out["median_hours"] = _finite(np.median(hours["swarm"]))
    out["seeds_reaching_target"] = int(np.isfinite(hours["swarm"]).sum())
    resamples = rng.integers(0, len(seeds), (BOOTSTRAP, len(seeds)))
    if "trusting" in runs:
        out["trusting_median_hours"] = _finite(np.median(hours["trusting"]))
        out["verification_cost"] = _ratio(hours["swarm"], hours["trusting"], resamples, minus=1)
        for name in ("lone_keep_if_lower", "lone_swarm_rule"):
            out[f"{name}_median_hours"] = _finite(np.median(hours[name]))
        out["speedup_vs_keep_if_lower"] = _ratio(
            hours["lone_keep_if_lower"], hours["swarm"], resamples
        )
        out["speedup_vs_lone_swarm_rule"] = _ratio(
            hours["lone_swarm_rule"], hours["swarm"], resamples
        )
        out["trusting_speedup_vs_keep_if_lower"] = _ratio(
            hours["lone_keep_if_lower"], hours["trusting"], resamples
        )
    out["fakes_in_final_lineage"] = sum(r["fakes_in_final_lineage"] for r in swarm)
    out["seeds_with_fake_in_final_lineage"] = sum(r["fakes_in_final_lineage"] > 0 for r in swarm)
    out["fake_seeds"] = [s for s in seeds if runs["swarm"][s]["fakes_in_final_lineage"]]
    out["false_steps_in_final_lineage"] = sum(r["false_steps_in_final_lineage"] for r in swarm)
    out["adversary_changes_in_final_lineage"] = sum(
        r["adversary_changes_in_final_lineage"] for r in swarm
    )
    out["lineage_steps"] = sum(r["lineage_steps"] for r in swarm)
    out["targets_revoked"] = sum(r["targets_revoked"] for r in swarm)
    for key in ("liar_head_share", "fake_head_share"):
        values = [r[key] for r in swarm]
        out[key] = {"mean": statistics.fmean(values), "max": max(values)}
    fast = [r["fast_share_of_lineage"] for r in swarm if r["fast_share_of_lineage"] is not None]
    if swarm[0]["settings"]["fast_hardware"] and fast:
        out["fast_share_of_lineage"] = _mean_interval(fast, rng)
        out["fast_share_of_changes"] = _mean_interval(
            [r["fast_share_of_changes"] for r in swarm if r["fast_share_of_changes"] is not None],
            rng,
        )
        out["fast_share_of_research_runs"] = statistics.fmean(
            r["fast_share_of_research_runs"] for r in swarm
        )
    out["final_head_gain"] = statistics.fmean(r["final_head_gain"] for r in swarm)
    targets = [r["target_gain"] for r in swarm if r.get("target_gain") is not None]
    out["target_gain_median"] = statistics.median(targets) if targets else None
    out["all_agree"] = sum(r["all_agree"] for r in swarm)
    out["runs_by_purpose"] = {k: sum(r["runs_by_purpose"][k] for r in swarm)
                              for k in swarm[0]["runs_by_purpose"]}  # fmt: skip
    out["per_seed_hours"] = {name: [_finite(h) for h in values] for name, values in hours.items()}
    return out


def _hours(summary: dict) -> float:
    hours = summary["hours_to_target"]
    return math.inf if hours is None else hours


def _finite(value: float) -> float | None:
    return None if not math.isfinite(value) else float(value)


def _ratio(top: np.ndarray, bottom: np.ndarray, resamples: np.ndarray, minus: float = 0.0) -> dict:
    """The ratio of the medians (less `minus`), with its bootstrap 95% interval over the seeds
    (resampled together: the same seed in both). None where a median did not reach the target."""

    def one(index: Iterable[int] | slice) -> float:
        a, b = np.median(top[index]), np.median(bottom[index])
        return math.nan if not (math.isfinite(a) and math.isfinite(b)) else a / b - minus

    value = one(slice(None))
    boots = np.array([one(index) for index in resamples])
    boots = boots[np.isfinite(boots)]
    low, high = np.percentile(boots, [2.5, 97.5]) if len(boots) else (math.nan, math.nan)
    return {"value": _finite(value), "low": _finite(low), "high": _finite(high)}


def _mean_interval(values: Sequence[float], rng: np.random.Generator) -> dict:
    data = np.array(values)
    boots = data[rng.integers(0, len(data), (BOOTSTRAP, len(data)))].mean(axis=1)
    low, high = np.percentile(boots, [2.5, 97.5])
    return {"value": float(data.mean()), "low": float(low), "high": float(high)}
