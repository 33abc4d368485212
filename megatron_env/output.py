"""Output for people, in uv's manners: every line a person reads goes through here.

- `status` lines (what is happening now) go to stderr, so stdout carries only results and can
  be piped; `result` and `summary` lines go to stdout.
- Tables are short aligned lines (`table`), one summary line ends a command (`summary`).
- A problem is `error: what went wrong` followed by `hint: what to do`.
- Every line goes through megatron_env.redact first: no secret reaches a terminal or CI log.
- Colour carries meaning only (a status word: pass/fail, done/failed ...), only on a terminal,
  never with NO_COLOR set. There is no markup language: nothing can show up literally.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from megatron_env import redact

#: Where a function says what it is doing: `status` (stderr), or a caller's collector.
Echo = Callable[[str], object]

_ANSI = {"green": "32", "yellow": "33", "red": "1;31", "cyan": "36", "dim": "2", "bold": "1"}
# The words that carry a meaning, and the colour that says it.
MEANING = {
    "pass": "green", "ok": "green", "done": "green", "up to date": "green", "fresh": "green",
    "cache hit": "green", "built": "green", "passed": "green", "matches": "green",
    "ready": "green", "stopped": "red",
    "warn": "yellow", "skipped": "yellow", "differs": "yellow", "would run": "cyan",
    "fail": "red", "failed": "red", "missing": "red", "stale": "red", "error": "red",
    "skip": "dim", "not run": "dim", "hint": "cyan", "warning": "yellow",
    "inconclusive": "yellow",
}


def _tty(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


def paint(word: str, stream: TextIO | None = None, colour: str | None = None) -> str:
    """`word` in the colour of its meaning when `stream` is a terminal; otherwise as it is."""
    stream = stream or sys.stdout
    code = _ANSI.get(colour or MEANING.get(word, ""))
    return f"\033[{code}m{word}\033[0m" if code and _tty(stream) else word


def _write(stream: TextIO, text: str) -> None:
    """Every line a person or a CI log sees, after the one redaction (megatron_env.redact)."""
    stream.write(redact.text(text) + "\n")
    stream.flush()


def block(text: str, stream: TextIO | None = None) -> None:
    """A multi-line result (JSON, a report) on stdout, redacted like every line."""
    stream = stream or sys.stdout
    stream.write(redact.text(text))
    stream.flush()


def status(*parts: object) -> None:
    """Progress: what is being done now (stderr). Usable wherever an `echo` is taken."""
    _write(sys.stderr, " ".join(map(str, parts)))


def result(text: str) -> None:
    """A result line (stdout)."""
    _write(sys.stdout, text)


def summary(text: str, status: str = "") -> None:
    """The one line that ends a command (stdout); `status`, a word of it, painted by meaning."""
    if status and status in text:
        text = text.replace(status, paint(status, sys.stdout), 1)
    _write(sys.stdout, text)


def hint(text: str, stream: TextIO | None = None) -> None:
    stream = stream or sys.stderr
    _write(stream, f"{paint('hint', stream)}: {text}")


def warning(text: str) -> None:
    _write(sys.stderr, f"{paint('warning', sys.stderr)}: {text}")


def error(text: str, fix: str = "") -> None:
    _write(sys.stderr, f"{paint('error', sys.stderr)}: {text}")
    if fix:
        hint(fix)


def table(rows: Sequence[Sequence[str]], *, status_col: int | None = None,
          stream: TextIO | None = None, indent: str = "") -> None:
    """Aligned columns; the last one is free text (its extra lines indented under it).

    `status_col` names the column whose words are painted by meaning."""
    stream = stream or sys.stdout
    if not rows:
        return
    n = len(rows[0])  # every row has the same columns
    widths = [max(len(r[i]) for r in rows) for i in range(n - 1)]
    for r in rows:
        cells = []
        for i, cell in enumerate(r[:-1]):
            pad = " " * (widths[i] - len(cell))
            cells.append((paint(cell, stream) if i == status_col else cell) + pad)
        first, *rest = str(r[-1]).split("\n")
        lead = indent + "  ".join(cells)
        _write(stream, (lead + "  " + first).rstrip())
        for line in rest:
            _write(stream, " " * (len(indent) + sum(widths) + 2 * len(widths)) + line)
