"""`swarm report`: what a node's ledger says the swarm has tried, as a picture and one web page.

It reads the ledger read-only and writes `report.png` (val_bpb per experiment over time, with
the baseline and the swarm's head as lines) and `report.html` (self-contained: leaderboard,
lineage of the best version with its diffs, peers, noise margin). It never writes to the
ledger, and every text that comes from a fact reaches the page escaped: descriptions are
written by peers, and a peer may be hostile. Reading, drawing and writing the page are apart:

    reading.py   the ledger, read-only, into one `Snapshot`
    picture.py   the plot (matplotlib)
    page.py      the HTML page, every peer's text escaped
"""

from __future__ import annotations

import os
from pathlib import Path

from node.ledger import Ledger
from node.report.page import render_html
from node.report.picture import figure, plot
from node.report.reading import ReportError, Snapshot, open_ledger, read_snapshot

PNG_FILE, HTML_FILE = "report.png", "report.html"
EXTRA = "pip install 'research-swarm[report]'"

__all__ = [
    "ReportError",
    "Snapshot",
    "figure",
    "open_ledger",
    "plot",
    "read_snapshot",
    "render_html",
    "write_report",
]


def write_report(
    ledger: Ledger, out: Path, quorum: int | None = None, now_ms: int | None = None
) -> tuple[Path, Path]:
    """Write report.png and report.html into `out` (created if missing); returns their paths."""
    try:
        import matplotlib  # noqa: F401  (an extra: asked for by name before anything is read)
    except ImportError:
        raise ReportError(f"swarm report draws its plot with matplotlib, which is not installed: "
                          f"{EXTRA}") from None  # fmt: skip
    snap = read_snapshot(ledger, quorum, now_ms)
    png = plot(snap)
    page = render_html(snap, png)
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = out / PNG_FILE, out / HTML_FILE
        for path, data in zip(paths, (png, page.encode()), strict=True):
            partial = path.with_name(path.name + ".partial")
            partial.write_bytes(data)
            os.replace(partial, path)
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror}") from None
    return paths
