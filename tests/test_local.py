"""What `swarm local` shows: the live table, the plain progress line and the closing summary.
The swarm itself runs for real in tests/test_readme.py; these hold what the user reads."""

from __future__ import annotations

from rich.console import Console

from node.local import progress_line, status_table, summary_lines

ROWS = [
    {"node": "node0", "head": "09f8432848dd" + "0" * 52, "head_val_bpb": 3.02071,
     "doing": "research, seed 1 of 2", "change": "MUON_MOMENTUM_START 0.95 -> 0.9",
     "phase": "training", "progress": 0.45, "outcomes": {"keep": 1, "discard": 3, "crash": 1},
     "given": 2, "received": 3, "peers": 2},
    {"node": "node1", "head": None, "doing": "verify 9d9fd54675df by 3QB1xy",
     "change": "[bold]peer text[/] \x1b[31m", "phase": "scoring", "progress": None,
     "outcomes": {}, "given": 0, "received": 0, "peers": 1},
]  # fmt: skip


def rendered(renderable, width: int = 200) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_live_table_shows_each_nodes_change_phase_counts_and_verifications():
    text = rendered(status_table(ROWS, 125.0, ["node0 adopted 09f84328: 'a change' by node2"]))
    assert "2.1 min left" in text
    row0 = next(line for line in text.splitlines() if "node0" in line and "3.0207" in line)
    for shown in ("09f84328", "MUON_MOMENTUM_START 0.95 -> 0.9", "train 45%", "1/3/1", "2/3"):
        assert shown in row0, (shown, row0)
    row1 = next(line for line in text.splitlines() if "node1" in line)
    assert "score" in row1 and "[bold]peer text[/]" in row1 and "\\x1b" in row1  # data, not markup
    assert "what happened" in text and "node0 adopted 09f84328" in text


def test_the_progress_line_names_the_change_and_the_phase():
    line = progress_line(ROWS, 60.0)
    assert line.startswith(
        "[ 1.0 min left] node0 3.0207: MUON_MOMENTUM_START 0.95 -> 0.9 train 45%"
    )
    assert "\x1b" not in line and "node1: [bold]peer text[/] \\x1b[31m score" in line


def test_the_summary_gives_the_lineage_with_each_steps_gain_and_looks_and_the_next_command():
    ids = {n: f"12D3KooW{n}" for n in ("a", "b", "c")}
    result = {
        "seconds": 600.4, "baseline": "3ac44d43" + "0" * 56, "best": "09f84328" + "1" * 56,
        "agreed": True,
        "nodes": [{"node": f"node{i}", "peer_id": ids[n], "home": f"/h/local/node{i}",
                   "ledger": f"/h/local/node{i}/ledger.db", "experiments": 4,
                   "outcomes": {"keep": 1, "discard": 3}, "given": 2, "received": 1}
                  for i, n in enumerate("abc")],
        "lineage": [{"version": "09f84328" + "1" * 56, "description": "MUON_MOMENTUM_START",
                     "author": ids["c"], "gain": 0.0118, "gain_se": 0.0031,
                     "looks": [{"author": ids["b"], "verdict": "confirm", "delta": -0.0113},
                               {"author": ids["a"], "verdict": "inconclusive", "delta": -0.0074}]}],
        "dropped": ["node2: GAIN_LR 0.5 -> 0.35, training 50%"],
    }  # fmt: skip
    text = "\n".join(summary_lines(result, ".venv/bin/swarm"))
    assert "after 10.0 min: all 3 nodes hold the verified head 09f84328, 1 verified step" in text
    assert "1. 'MUON_MOMENTUM_START' by node2 -> 09f84328: val_bpb -0.0118 +- 0.0031" in text
    assert "node1 confirm -0.0113, node0 inconclusive -0.0074" in text
    assert "node0: 4 experiments (1 kept, 3 discarded, 0 crashed), 2 verifications given" in text
    assert "dropped at the stop (not recorded): node2: GAIN_LR" in text
    assert ".venv/bin/swarm report --home /h/local/node0 --out report/" in text
    result.update(best=result["baseline"], lineage=[])
    assert "no verified win yet" in summary_lines(result, "swarm")[0]
