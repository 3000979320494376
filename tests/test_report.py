"""`swarm report`: a real ledger from three peers in, a PNG and a page out, the page rendered by
headless Chromium and read back as a person's browser shows it."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import (
    CAMPAIGN,
    HARNESS,
    T0,
    confirming_looks,
    make_result,
    make_verification,
    set_terms,
    unavailable,
)
from typer.testing import CliRunner

from node import wire
from node.cli import app
from node.ledger import Ledger

REPO = Path(__file__).parent.parent
BASE_SRC = b"lr = 0.01\nwidth = 128\n"
V1_SRC = b"lr = 0.01\nwidth = 192\n"
V2_SRC = b"lr = 0.005\nwidth = 192\n"  # published, but its bytes never reached this ledger
BASE, V1, V2 = (hashlib.sha256(s).hexdigest() for s in (BASE_SRC, V1_SRC, V2_SRC))
V3, V4, V5, V6 = ("33" * 32, "44" * 32, "55" * 32, "66" * 32)
HOSTILE = (
    '<script>document.body.dataset.pwned="script"</script>'
    "<img src=x onerror=\"document.body.dataset.pwned='img'\"> & lower lr"
)
# Appended to a copy of the page by the tests only: reports whether Chromium decoded the plot.
PROBE = (
    "<script>addEventListener('load', () => { document.body.dataset.plotWidth = "
    "document.querySelector('img.plot').naturalWidth; });</script>"
)
runner = CliRunner()


@pytest.fixture
def ledger_file(tmp_path, alice, bob, carol) -> Path:
    """Alice's two wins are verified (the second's bytes are not held here; the first, the cpu
    profile's first win, with the looks the outlier hold asks), Bob discards one, Carol crashes
    one and has a claim refuted (Alice confirmed it, Bob refuted it); Bob tried the gpu profile once."""
    path = tmp_path / "node" / "ledger.db"
    campaign = wire.campaign_body(
        name=CAMPAIGN, organiser=alice.public_key, program=b"# program", baseline=BASE,
        profiles=["cpu", "gpu"], quorum=1, data={"tokenizer": "ab" * 32},
    )  # fmt: skip
    at = lambda minute: T0 + minute * 60_000  # noqa: E731
    first = make_result(alice, 2, BASE, V1, 1.50, description="wider MLP", time_ms=at(1))
    second = make_result(alice, 3, V1, V2, 1.45, description=HOSTILE, time_ms=at(3))
    refuted = make_result(carol, 3, V2, V5, 1.44, description="tied embeddings", time_ms=at(6))
    facts = [
        first, second, refuted,
        make_result(bob, 1, V1, V3, 1.52, outcome="discard", description="smaller batch",
                    time_ms=at(2)),
        make_result(carol, 2, V2, V4, None, outcome="crash", description="bigger batch",
                    time_ms=at(5)),
        make_result(bob, 4, BASE, V6, 1.20, profile="gpu", description="gpu try", time_ms=at(7)),
        *confirming_looks(bob, 5, first), make_verification(carol, 1, second, delta=-0.03),
        *(make_verification(bob, 8 + i, refuted, "refute", delta=0.03, seed=i) for i in range(3)),
        make_verification(alice, 4, refuted),
    ]  # fmt: skip
    with Ledger(path, campaign=CAMPAIGN) as book:
        set_terms(book, baseline=BASE, organiser=alice.peer_id)
        book.publish(alice, "campaign", campaign, T0)
        assert all(isinstance(f, wire.Fact) for f in book.ingest_many([f.raw for f in facts]))
        for source in (BASE_SRC, V1_SRC):
            book.add_version(source)
        # This node's paired runs: V1 against BASE on two seeds, V6 against BASE on one.
        for profile, parent, child, seed, val_bpb in (
            ("cpu", BASE, BASE, 1, 1.60), ("cpu", BASE, BASE, 2, 1.61), ("cpu", BASE, V1, 1, 1.50),
            ("cpu", BASE, V1, 2, 1.53), ("gpu", BASE, BASE, 1, 1.30), ("gpu", BASE, V6, 1, 1.20),
        ):  # fmt: skip
            book.record_run(profile=profile, parent=parent, child=child, val_bpb=val_bpb,
                            seed=seed, harness=HARNESS)  # fmt: skip
    return path


def report(*args: str) -> str:
    done = runner.invoke(app, ["report", *args], env={"COLUMNS": "200"})
    assert done.exit_code == 0, (done.output, done.exception)
    return done.output


# ---------------------------------------------------------------- reading what a browser shows


class Page(HTMLParser):
    """A rendered page as a test reads it: tables by id (rows of cell texts), the text inside
    each element with an id, and every tag with its attributes."""

    VOID = {"img", "br", "meta", "link", "input", "hr", "source", "wbr"}

    def __init__(self, markup: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self.text: dict[str, str] = {}
        self.tags: list[tuple[str, dict]] = []
        self._open: list[tuple[str, str | None]] = []
        self._table: str | None = None
        self._cell: list[str] | None = None
        self.feed(markup)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "table":
            self._table = attrs.get("id", "")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []
        if tag not in self.VOID:
            self._open.append((tag, attrs.get("id")))
            if attrs.get("id"):
                self.text.setdefault(attrs["id"], "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        for _, element_id in self._open:
            if element_id:
                self.text[element_id] += data

    def body(self) -> dict:
        return next(attrs for tag, attrs in self.tags if tag == "body")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    unavailable(
        "chromium is not installed (scripts/setup --test installs it as root: apt-get install chromium)"
    )


def render(page: Path, profile: Path) -> Page:
    """The page's DOM after Chromium loaded it and ran whatever scripts it holds."""
    done = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0 and "<body" in done.stdout, done.stderr[-2000:]
    return Page(done.stdout)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def probed(html_path: Path) -> Path:
    copy = html_path.with_name("probe.html")
    copy.write_text(html_path.read_text().replace("</body>", PROBE + "</body>"))
    return copy


# ---------------------------------------------------------------- the tests


def test_report_writes_a_png_of_sane_size_one_panel_per_profile(ledger_file, tmp_path):
    from PIL import Image

    out = tmp_path / "out"
    assert "wrote" in report("--db", str(ledger_file), "--out", str(out))
    data = (out / "report.png").read_bytes()
    width, height = png_size(data)
    assert 600 <= width <= 3000 and 400 <= height <= 3000
    with Image.open(out / "report.png") as image:
        image.verify()
    # Two profiles (cpu, gpu), two panels: taller than the one panel of an empty ledger.
    Ledger(tmp_path / "empty" / "ledger.db", campaign=CAMPAIGN).close()
    report("--home", str(tmp_path / "empty"), "--out", str(tmp_path / "one"))
    assert png_size((tmp_path / "one" / "report.png").read_bytes())[1] < height


def test_a_stricter_quorum_verifies_nothing_here(ledger_file, tmp_path):
    report("--db", str(ledger_file), "--out", str(tmp_path), "--quorum", "2")
    markup = (tmp_path / "report.html").read_text()
    assert "No version is verified yet (quorum 2)" in markup and "leaderboard-cpu" not in markup
    assert "0 verified wins, 0 refuted claims (quorum 2)" in markup


def test_page_shows_leaderboard_lineage_peers_and_noise(ledger_file, tmp_path, alice, bob, carol):
    out = tmp_path / "out"
    report("--home", str(ledger_file.parent), "--out", str(out))
    page = render(probed(out / "report.html"), tmp_path / "chromium")
    tail = lambda who: "…" + who.peer_id[-8:]  # noqa: E731  (tables show a peer id's tail)

    # The plot is inside the page, and Chromium decoded it.
    (plot,) = [a for tag, a in page.tags if tag == "img"]
    assert plot["src"].startswith("data:image/png;base64,")
    width, _ = png_size(base64.b64decode(plot["src"].split(",", 1)[1]))
    assert page.body()["data-plot-width"] == str(width)

    assert page.tables["leaderboard-cpu"][1:] == [
        ["1", "-0.0800 ± 0.0081", "0.0300 (1 seeds)", V2[:12], tail(alice), tail(carol), HOSTILE],
        ["2", "-0.0500 ± 0.0040", "0.0500 (3 seeds)", V1[:12], tail(alice), tail(bob), "wider MLP"],
    ]  # Carol's 1.44 was refuted by Bob's looks (whatever Alice says): not on the board
    assert "leaderboard-gpu" not in page.tables  # Bob's gpu claim is unverified

    lineage = page.text["lineage-cpu"]
    assert lineage.index("wider MLP") < lineage.index(HOSTILE)
    assert "-width = 128" in lineage and "+width = 192" in lineage  # both versions held
    assert "diff not held: this ledger lacks the child version" in lineage  # V2's bytes

    peers = {row[1]: row[2:] for row in page.tables["peers"][1:]}
    # experiments, kept, discarded, crashed, void, claims verified, claims refuted, verifications made
    assert peers[alice.peer_id] == ["2", "2", "0", "0", "0", "2", "0", "1"]
    assert peers[bob.peer_id] == ["2", "1", "1", "0", "0", "0", "0", "6"]
    assert peers[carol.peer_id] == ["2", "1", "0", "1", "0", "0", "1", "1"]

    noise = {row[0]: row[1:] for row in page.tables["noise"][1:]}
    assert noise["cpu"][:2] == ["1", "2"]  # one pair, on two seeds
    # The spread of V1 - BASE around its mean: stdev(-0.10, -0.08) = 0.01414, one degree of freedom.
    assert noise["cpu"][2].startswith("0.0141 bpb over 1 degrees of freedom; margin 0.0283")
    assert noise["gpu"][2].startswith("not measured yet: no pair ran on two seeds")

    summary = page.text["summary"]
    assert "6 experiments by 3 peers: 4 kept, 1 discarded, 1 crashed" in summary
    assert "2 verified wins, 1 refuted claim (quorum 1)" in summary
    read_at = datetime.strptime(page.text["read-at"], "%Y-%m-%d %H:%M:%S UTC")
    age = time.time() - read_at.replace(tzinfo=timezone.utc).timestamp()
    assert -5 < age < 600


def test_a_peers_description_cannot_inject_markup(ledger_file, tmp_path):
    out = tmp_path / "out"
    report("--db", str(ledger_file), "--out", str(out))
    markup = (out / "report.html").read_text()
    assert "<script" not in markup and "<img src=x" not in markup
    assert "&lt;script&gt;" in markup
    page = render(out / "report.html", tmp_path / "chromium")
    assert "data-pwned" not in page.body()  # neither the script nor the handler ran
    assert [tag for tag, _ in page.tags if tag in ("script", "img", "iframe", "object")] == ["img"]
    assert page.tables["leaderboard-cpu"][1][-1] == HOSTILE  # shown as the text it is
    # Self-contained: nothing to fetch, no scripts.
    for link in re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', markup):
        assert link.startswith("data:"), link
    assert "url(" not in markup and "@import" not in markup


def test_an_empty_ledger_gives_a_page_that_says_nothing_was_tried(tmp_path):
    Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN).close()
    out = tmp_path / "out"
    report("--home", str(tmp_path), "--out", str(out))
    png_size((out / "report.png").read_bytes())
    page = render(out / "report.html", tmp_path / "chromium")
    assert "Nothing was tried yet" in page.text["summary"]
    assert "leaderboard-cpu" not in page.tables and "peers" not in page.tables
    assert "Not measured yet" in (out / "report.html").read_text()


def report_in_read_only_folder(folder: Path, out: Path) -> subprocess.CompletedProcess:
    """`swarm report` on FOLDER/ledger.db with FOLDER read-only, for root too where bubblewrap
    is installed (root ignores file modes; a read-only mount binds root as well)."""
    command = [sys.executable, "-m", "node.cli", "report", "--db", str(folder / "ledger.db"),
               "--out", str(out)]  # fmt: skip
    bwrap = ["bwrap", "--dev-bind", "/", "/"]
    works = shutil.which("bwrap") and subprocess.run([*bwrap, "true"]).returncode == 0
    if works:
        command = [*bwrap, "--ro-bind", str(folder), str(folder), *command]
    elif os.geteuid() == 0:
        unavailable(
            "root ignores file modes and bubblewrap is missing or cannot run: no read-only disk"
        )
    folder.chmod(0o555)
    try:
        return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
    finally:
        folder.chmod(0o755)


def test_a_read_only_copy_on_a_read_only_disk_is_read_and_never_written(ledger_file, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(ledger_file, copy / "ledger.db")
    before = hashlib.sha256((copy / "ledger.db").read_bytes()).hexdigest()
    (copy / "ledger.db").chmod(0o444)
    done = report_in_read_only_folder(copy, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in copy.iterdir()) == ["ledger.db"]
    assert hashlib.sha256((copy / "ledger.db").read_bytes()).hexdigest() == before
    assert V1[:12] in (tmp_path / "out" / "report.html").read_text()


def test_a_read_only_copy_whose_wal_holds_commits_is_refused_not_misread(ledger_file, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    with Ledger(ledger_file) as book:  # a node still writing: its last commit is in the -wal
        book.record_run(profile="cpu", child=BASE, val_bpb=1.62)
        for name in ("ledger.db", "ledger.db-wal"):
            shutil.copy(ledger_file.with_name(name), copy / name)
    assert (copy / "ledger.db-wal").stat().st_size > 0
    done = report_in_read_only_folder(copy, tmp_path / "out")
    assert done.returncode == 1 and "holds commits not yet in the file" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_bad_input_is_a_one_line_error(ledger_file, tmp_path):
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    other = tmp_path / "other.db"
    subprocess.run([sys.executable, "-c", f"import sqlite3; c = sqlite3.connect({str(other)!r}); "
                    "c.execute('CREATE TABLE t (x)'); c.commit()"], check=True)  # fmt: skip
    (tmp_path / "a-file").write_text("")
    cases = [
        (["--db", str(tmp_path / "absent.db")], "no ledger at"),
        (["--home", str(tmp_path / "empty-home")], "no ledger at"),
        (["--db", str(tmp_path / "junk.db")], "as a ledger"),
        (["--db", str(other)], "not a research-swarm ledger"),
        (["--db", str(ledger_file), "--out", str(tmp_path / "a-file")], "cannot write the report"),
    ]
    for args, message in cases:
        args = args if "--out" in args else [*args, "--out", str(tmp_path / "out")]
        done = subprocess.run(
            [sys.executable, "-m", "node.cli", "report", *args], capture_output=True, text=True,
            cwd=REPO, timeout=300,
        )  # fmt: skip
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr.startswith("error:") and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_report_explains_itself_with_an_example():
    assert "Example: swarm report" in report("--help")


def test_void_runs_and_a_held_claim_are_shown_as_such(tmp_path, alice, bob, carol):
    path = tmp_path / "ledger.db"
    scale = make_result(alice, 1, BASE, V1, 1.50, description="wider MLP")
    outlier = make_result(alice, 2, V1, V2, 1.00, description="too good")
    void = make_result(carol, 1, V1, V3, None, outcome="void", description="peeks ahead")
    with Ledger(path, campaign=CAMPAIGN) as book:
        set_terms(book, baseline=BASE)
        book.ingest_many(
            [scale.raw, outlier.raw, void.raw, *(f.raw for f in confirming_looks(bob, 1, scale)),
             make_verification(bob, 4, outlier, delta=-0.5).raw]
        )  # fmt: skip
    report("--db", str(path), "--out", str(tmp_path / "out"))
    page = Page((tmp_path / "out" / "report.html").read_text())
    assert "0 crashed, 1 void; 1 verified win" in page.text["summary"]
    assert "(quorum 1); 1 held for more looks." in page.text["summary"]
    assert [row[3] for row in page.tables["leaderboard-cpu"][1:]] == [V1[:12]]
    (held,) = page.tables["held"][1:]
    assert held[2] == V2[:12] and held[4].startswith("held: gain 0.5000 is 10x the largest")
    peers = {row[1]: row[2:] for row in page.tables["peers"][1:]}
    assert peers[carol.peer_id][:5] == ["1", "0", "0", "0", "1"]  # one experiment, void


def paired_result(who, seq: int, parent: str, child: str, child_bpb: float, parent_bpb: float,
                  minute: int, outcome: str = "keep") -> wire.Fact:  # fmt: skip
    """A result as a node makes it: its child and its parent run on one seed."""
    body = wire.result_body(
        parent=parent, child=child, diff=b"diff", description=f"try {seq}", profile="cpu",
        harness=HARNESS, seed=seq, outcome=outcome, metrics={"val_bpb": child_bpb},
        pairs=[(seq, child_bpb, parent_bpb)],
    )  # fmt: skip
    return wire.sign(who, "result", CAMPAIGN, seq, body, T0 + minute * 60_000)


def test_the_plot_draws_the_baseline_and_the_head_stepping_down_when_a_win_is_verified(
    tmp_path, alice, bob
):
    from matplotlib.collections import LineCollection

    from node.report import figure, read_snapshot

    win = paired_result(alice, 1, BASE, V1, 1.55, 1.60, minute=1)
    tried = paired_result(bob, 1, BASE, V3, 1.63, 1.62, minute=2, outcome="discard")
    looks = confirming_looks(bob, 2, win)  # at T0 + 500 s and on, after both results
    with Ledger(tmp_path / "ledger.db", campaign=CAMPAIGN) as book:
        set_terms(book, baseline=BASE)
        book.ingest_many([win.raw, tried.raw])
        before = read_snapshot(book)
        book.ingest_many([f.raw for f in looks])
        snap = read_snapshot(book)
    assert before.baseline_bpb == {"cpu": pytest.approx(1.61)}  # the median of its paired runs
    assert before.heads["cpu"] == [(T0 + 60_000, 0.0)]  # nothing verified: the head is the baseline
    score = snap.board["cpu"][0]["score"]
    assert score < 0 and snap.board["cpu"][0]["child"] == V1
    (start, moved) = snap.heads["cpu"]
    assert start == (T0 + 60_000, 0.0)
    assert moved[1] == pytest.approx(score)
    assert moved[0] in {f.time for f in looks}  # it moved at a look, not at the claim

    (ax,) = figure(snap).axes
    head = next(line for line in ax.get_lines() if line.get_label() == "head")
    assert list(head.get_ydata()) == pytest.approx([1.61, 1.61 + score, 1.61 + score])
    (baseline,) = [c for c in ax.collections
                   if isinstance(c, LineCollection) and c.get_label() == "baseline"]  # fmt: skip
    assert [y for _, y in baseline.get_segments()[0]] == pytest.approx([1.61, 1.61])


def test_the_page_of_a_ledger_without_terms_names_the_campaign_of_its_facts(tmp_path, alice):
    path = tmp_path / "ledger.db"  # as a bootstrap holds it: facts, no terms of its own
    with Ledger(path, campaign=CAMPAIGN) as book:
        book.ingest_many([make_result(alice, 1, BASE, V1, 1.50).raw])
    report("--db", str(path), "--out", str(tmp_path / "out"))
    assert f"Campaign: {CAMPAIGN}." in (tmp_path / "out" / "report.html").read_text()


def test_without_matplotlib_the_report_names_the_extra_to_install(ledger_file, tmp_path):
    shadow = tmp_path / "shadow"  # a matplotlib that cannot be imported, found first
    (shadow / "matplotlib").mkdir(parents=True)
    (shadow / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    done = subprocess.run(
        [sys.executable, "-m", "node.cli", "report", "--db", str(ledger_file), "--out",
         str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "PYTHONPATH": str(shadow)},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == ("error: swarm report draws its plot with matplotlib, which is "
                                   "not installed: pip install 'research-swarm[report]'")  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_ledger_older_than_this_version_is_a_one_line_error_not_a_traceback(tmp_path):
    import sqlite3

    import sqlite_utils

    from node.ledger import MIGRATIONS

    path = tmp_path / "old.db"  # as a node of release 3 left it
    with sqlite3.connect(path) as conn:
        for step in MIGRATIONS[:3]:
            step(sqlite_utils.Database(conn))
        conn.execute("PRAGMA user_version=3")
    done = subprocess.run(
        [sys.executable, "-m", "node.cli", "report", "--db", str(path), "--out",
         str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        f"error: {path} is a ledger of schema 3, older than this version's {len(MIGRATIONS)}: start "
        "its node once with this version (that upgrades the file), then ask again"
    )
