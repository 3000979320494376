"""scripts/node_timeline.py: a node's runs, phases, head and overhead, read from a copied home."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

from node.ledger import Ledger

_spec = importlib.util.spec_from_file_location(
    "node_timeline", Path(__file__).resolve().parent.parent / "scripts" / "node_timeline.py"
)
node_timeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(node_timeline)

T0 = 1_800_000_000.0


def _run_folder(
    home: Path, name: str, start: float, phases: tuple[float, float, float, float]
) -> str:
    """A run folder as the runner leaves it; its files dated as on the machine it ran on."""
    startup, train, evaluation, total = phases
    folder = home / "runs" / "worker-0" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"profile": {"budget_seconds": 300}}))
    (folder / "result.json").write_text(
        json.dumps(
            {
                "startup_seconds": startup,
                "train_seconds": train,
                "eval_seconds": evaluation,
                "total_seconds": total,
            }
        )
    )
    os.utime(folder / "config.json", (start, start))
    os.utime(folder / "result.json", (start + total, start + total))
    return f"/elsewhere/home/runs/worker-0/{name}/log.txt"  # recorded on another machine


def test_timeline_of_a_copied_home(tmp_path):
    home = tmp_path / "home"
    with Ledger(home / "ledger.db", campaign="t") as ledger:
        for i, val in enumerate((1.52, 1.50)):  # two baseline runs back to back, from t0 + 10
            log = _run_folder(home, f"noise-{i}", T0 + 10 + 340 * i, (30, 300, 2, 340))
            ledger.record_run(
                profile="gpu",
                parent="b",
                child="b",
                outcome="ok",
                val_bpb=val,
                description="noise",
                log_path=log,
            )
        for i, (outcome, val) in enumerate((("keep", 1.44), ("discard", 1.45))):
            start = T0 + 690 + 345 * i + 1  # 1 s to propose, 4 s after the runner to publish
            log = _run_folder(home, f"r{i}", start, (40, 300, 0, 340))
            ledger.record_run(
                profile="gpu",
                parent="b",
                child=f"c{i}",
                outcome=outcome,
                val_bpb=val,
                description=f"change {i}",
                log_path=log,
                started=int(start * 1000),
                finished=int((start + 344) * 1000),
            )
    (home / "runs" / "worker-0" / "stopped").mkdir()
    (home / "runs" / "worker-0" / "stopped" / "config.json").write_text("{}")

    data = node_timeline.timeline(home, T0)
    runs, s = data["runs"], data["summary"]
    assert [r["kind"] for r in runs] == ["baseline", "baseline", "research", "research"]
    assert [r["head_val_bpb"] for r in runs] == pytest.approx([1.52, 1.51, 1.44, 1.44])
    assert runs[0]["before"] == pytest.approx(10) and runs[0]["cycle"] == pytest.approx(350)
    assert runs[2]["before"] == pytest.approx(1) and runs[2]["after"] == pytest.approx(4)
    assert runs[2]["exit"] == pytest.approx(0) and runs[0]["exit"] == pytest.approx(8)
    assert s["research"] == {"keep": 1, "discard": 1} and s["baseline_runs"] == 2
    assert s["mean_cycle"] == pytest.approx((350 + 340 + 345 + 345) / 4)
    assert s["overhead_share_of_budget"] == pytest.approx((s["mean_cycle"] - 300) / 300)
    assert s["experiments_per_hour"] == pytest.approx(3600 / s["mean_cycle"])
    assert [h[1] for h in s["head"]] == pytest.approx([1.52, 1.51, 1.44])
    assert [c["folder"] for c in data["cancelled"]] == ["stopped"]


def test_cli_prints_the_summary(tmp_path, capsys):
    home = tmp_path / "home"
    with Ledger(home / "ledger.db", campaign="t") as ledger:
        log = _run_folder(home, "noise-0", T0 + 5, (30, 300, 2, 340))
        ledger.record_run(
            profile="gpu",
            parent="b",
            child="b",
            outcome="ok",
            val_bpb=1.5,
            description="noise",
            log_path=log,
        )
    node_timeline.main(["--home", str(home), "--t0", str(T0)])
    out = capsys.readouterr().out
    assert "15.0% of the 300 s budget" in out and "head val_bpb over time: 345 s 1.5000" in out


def test_a_node_stopped_and_resumed_counts_node_time(tmp_path):
    home, gap = tmp_path / "home", 3 * 3600.0
    with Ledger(home / "ledger.db", campaign="t") as ledger:
        log = _run_folder(home, "noise-0", T0 + 10, (30, 300, 2, 340))
        ledger.record_run(
            profile="gpu",
            parent="b",
            child="b",
            outcome="ok",
            val_bpb=1.52,
            description="noise",
            log_path=log,
        )
        stopped = home / "runs" / "worker-0" / "stopped"  # run 2, ended by the stop at T0 + 400
        stopped.mkdir()
        (stopped / "config.json").write_text("{}")
        os.utime(stopped / "config.json", (T0 + 351, T0 + 351))
        (stopped / "log.txt").write_text("step 1")
        os.utime(stopped / "log.txt", (T0 + 400, T0 + 400))
        restart = T0 + 400 + gap
        start = restart + 20  # the resumed node's own start-up, then its first run
        log = _run_folder(home, "r0", start, (40, 300, 0, 340))
        ledger.record_run(
            profile="gpu",
            parent="b",
            child="c0",
            outcome="keep",
            val_bpb=1.44,
            description="change 0",
            log_path=log,
            started=int(start * 1000),
            finished=int((start + 341) * 1000),
        )

    data = node_timeline.timeline(home, [T0, restart])
    runs, s = data["runs"], data["summary"]
    assert data["restarts_at"] == pytest.approx([400])  # down for 3 hours: left out
    assert [r["at"] for r in runs] == pytest.approx([350, 400 + 20 + 341])
    assert runs[1]["before"] == pytest.approx(20) and runs[1]["cycle"] == pytest.approx(361)
    assert s["mean_cycle"] == pytest.approx((350 + 361) / 2)  # no cycle spans the stop
    assert s["head"] == [(pytest.approx(350), 1.52), (pytest.approx(761), 1.44)]
    assert data["cancelled"][0]["at"] == pytest.approx(351)
