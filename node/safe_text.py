"""Text from peers, made safe to show: a description is data, never commands for a terminal.

`safe_text` is the one place where a peer's text (a description, a campaign's data, anything a
fact carries) is readied for a terminal, a log line or the report. It never drops a character
silently: each control or format character is shown as an escape, so nothing is hidden either.
"""

from __future__ import annotations

import logging
import unicodedata

from rich.markup import escape as _escape_markup

# Unicode categories a terminal or a text renderer acts on rather than shows: control (C0, DEL,
# C1: ESC sequences, NUL, BEL, CR), format (bidi overrides U+202A-202E, isolates U+2066-2069,
# zero-width marks), line and paragraph separators, lone surrogates, unassigned code points.
_HIDDEN = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"))


def _shown(char: str) -> str:
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def safe_text(value: object, markup: bool = True, keep: str = "") -> str:
    """`value` as text with every control and format character written as a visible escape
    (ESC as `\\x1b`, U+202E as `\\u202e`), except those in `keep` (e.g. a tab in a diff line);
    with `markup` also rich's markup escaped, for text that a rich console prints."""
    text = str(value)
    if not text.isprintable() or keep:
        text = "".join(
            _shown(c) if c not in keep and unicodedata.category(c) in _HIDDEN else c for c in text
        )
    return _escape_markup(text) if markup else text


class SafeLogFormatter(logging.Formatter):
    """Log lines whose messages went through `safe_text`: a peer's words in a log cannot move
    the cursor, retitle the terminal or forge a line of their own (a newline is `\\x0a`)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802  (logging's name)
        record.message = safe_text(record.message, markup=False)
        return super().formatMessage(record)


def install_safe_logging(level: int = logging.WARNING) -> None:
    """Send log records to stderr through `SafeLogFormatter` (before anything else configures
    the root logger, so that no library's default handler prints raw text beside it)."""
    handler = logging.StreamHandler()
    handler.setFormatter(SafeLogFormatter("%(levelname)s:%(name)s:%(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
