"""A peer's text reaches a terminal, a log or the report as data: escape sequences, NUL, C1
controls, bidi overrides and rich markup are shown, never acted on."""

from __future__ import annotations

import io
import logging
import unicodedata

from conftest import BASELINE, CAMPAIGN, confirming_looks, make_result, set_terms
from rich.console import Console
from typer.testing import CliRunner

from node.cli import app
from node.ledger import Ledger, ledger_path
from node.safe_text import SafeLogFormatter, safe_text

# What a hostile description holds: clear the screen, retitle the terminal, a CSI in its C1
# form, NUL, a right-to-left override and the isolates, a zero-width space, and rich markup.
HOSTILE = (
    "\x1b[2J\x1b]0;owned\x07 \x9b31m \x00 \u202eevil\u202c \u2066a\u2067b\u2068c\u2069 "
    "\u200bzw [bold red]alarm[/] [link=http://x]y[/link] déjà vu 中文"
)
ACTED_ON = {"Cc", "Cf", "Zl", "Zp"}
runner = CliRunner()


def acted_on(text: str) -> list[str]:
    """The characters of `text` a terminal would act on rather than show (newlines aside)."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ACTED_ON]


def rendered(text: str) -> str:
    console = Console(file=io.StringIO(), width=400, color_system=None)
    console.print(text, highlight=False)
    return console.file.getvalue()


def test_control_bidi_and_markup_are_shown_as_escapes_and_plain_text_is_kept():
    shown = safe_text(HOSTILE)
    assert acted_on(shown) == []
    for escape in ("\\x1b[2J", "\\x1b]0;owned\\x07", "\\x9b", "\\x00", "\\u202e", "\\u2066"):
        assert escape in shown
    printed = rendered(shown)
    assert "[bold red]alarm[/]" in printed and "[link=http://x]y[/link]" in printed
    assert "déjà vu 中文" in printed
    assert safe_text("a plain description") == "a plain description"
    assert safe_text("a\tb", markup=False, keep="\t") == "a\tb"
    assert safe_text("a\tb\nc", markup=False) == "a\\x09b\\x0ac"


def test_the_ledger_commands_and_the_report_show_a_hostile_description_as_text(
    tmp_path, alice, bob
):
    fact = make_result(alice, 1, BASELINE, "11" * 32, 1.5, description=HOSTILE)
    with Ledger(ledger_path(tmp_path), campaign=CAMPAIGN) as ledger:
        set_terms(ledger)
        assert ledger.ingest(fact.raw, now_ms=fact.time).id == fact.id
        ledger.ingest_many([f.raw for f in confirming_looks(bob, 1, fact)])  # on the leaderboard
    shows = (["experiments"], ["leaderboard"], ["lineage", "11" * 32], ["show", fact.id[:12]])
    for args in shows:
        out = runner.invoke(app, ["ledger", *args, "--home", str(tmp_path)], env={"COLUMNS": "400"})
        assert out.exit_code == 0, (out.output, out.exception)
        assert acted_on(out.output) == [], args
        clear = ("\\x1b[2J", "\\u001b[2J")  # as safe_text or as JSON (`show`) writes it
        assert any(c in out.output for c in clear) and "\\u202e" in out.output, args
        assert "alarm[/]" in out.output, args  # the markup is shown, not applied

    out = runner.invoke(app, ["report", "--home", str(tmp_path), "--out", str(tmp_path / "r")])
    assert out.exit_code == 0, (out.output, out.exception)
    page = (tmp_path / "r" / "report.html").read_text()
    assert "\\u202e" in page and acted_on(page) == []


def test_a_log_line_quoting_a_peer_cannot_forge_lines_or_move_the_cursor():
    forged = HOSTILE + "\nWARNING:swarm.gossip:all is well"
    record = logging.LogRecord("swarm.gossip", logging.WARNING, __file__, 1, "from %s: %s",
                               ("peer", forged), None)  # fmt: skip
    line = SafeLogFormatter("%(levelname)s:%(name)s:%(message)s").format(record)
    assert "\n" not in line and acted_on(line) == []
    assert line.startswith("WARNING:swarm.gossip:from peer: \\x1b[2J")
