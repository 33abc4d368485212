"""Console logs of distributed jobs, made uniform: one logical line each, with rank and host.

Job logs reach us in many shapes: one file per rank or per node, or everything interleaved by
srun, torchrun or mpirun, each tagging lines its own way (`[rank3]:`, `3: `, `[gpu187:1]:`,
`[1,3]<stdout>:`, `10.0.87.143: ` from pdsh, `[default0]:` from torchrun --tee), often under
a prefix nobody can list in advance (a log aggregator's `<job>.<host> [stderr] `, Ray's
`(Worker pid=1, ip=10.0.0.1) `, timestamps, a log viewer's line numbers), pasted from a terminal
that wrapped long lines at its width or written by a tool that broke its own message in two.
The analysis in `triage` should not care: `normalise`/`lines` strip the launcher tags into
`Line.rank`/`Line.host` wherever in the line they stand and join wrapped lines whatever the
prefix, so a pattern sees each message whole.

Everything here streams: `lines` takes an iterator of physical lines and holds one logical
line (plus a sample of the first lines for the wrap width) at a time, so a log of gigabytes
goes through in bounded memory. Reading files (and refusing what is not one) is `logfiles`'s.
Nothing here decides what a line means.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from pathlib import Path
from typing import NamedTuple

# colour codes, also as a paste that lost the ESC byte (`[36m(RayWorker pid=1)[0m`)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\[\d{1,2}(?:;\d{1,3})*m(?=[(\[\w ]|$)")
# tags at the very start of a line, tried repeatedly (a pdsh host, then a rank label, ...)
_START_TAGS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r" *(\d{1,5}): "), "rank"),                        # srun --label
    (re.compile(r"std(?:out|err): "), "stream"),  # a launcher relaying its child's streams
    # pdsh/clush "host: ": a dotted IPv4 address or a host name with a digit in it
    (re.compile(r"((?:\d{1,3}\.){3}\d{1,3}|[A-Za-z][\w-]*\d[\w.-]*): "), "host"),
]
# bracketed launcher tags, found wherever they stand (after any prefix), repeated tags in a row
_BRACKET_TAG = re.compile(
    r"\[rank(\d+)\]:"                                          # torchrun --tee, TORCH_* logs
    r"|\[\d+,(\d+)\]<std(?:out|err)>:"                         # mpirun --tag-output
    r"|\[([A-Za-z][\w.-]*?\d[\w.-]*|[A-Za-z][\w.-]*):(\d+)\]:"  # accelerate/deepspeed host:rank
    r"|\[(?:default|[a-z]+_?)(\d+)\]:")                        # torchrun role+local rank
# a row of a table printed in columns (`kubectl get pods`, `squeue`): its own record even when
# the rows are as wide as the terminal
_TABLE_ROW = re.compile(r"\S+ {3,}\S+ {3,}\S")
_ROLE_TAG = re.compile(r"\[(?:default|[a-z]+_?)(\d+)\]:")
# what a prefix before a tag may say about the host: Ray's `ip=`, an aggregator's `job.host [std..]`
_PREFIX_IP = re.compile(r"\bip=((?:\d{1,3}\.){3}\d{1,3})")
# Ray's `(Actor pid=123, ip=10.0.0.1) ` in front of every line a worker printed
_RAY_PREFIX = re.compile(r"\(\w+ pid=\d+(?:, ip=((?:\d{1,3}\.){3}\d{1,3}))?[^)]{0,40}\) ")
_PREFIX_STREAM = re.compile(r"(?:^|\s)([\w.-]+)\s+\[std(?:out|err)\]\s*$")
# a line that begins a new message (never the continuation of a wrapped one)
_RECORD = re.compile(
    r"\s*$|\[rank\d+\]|\[[\w.-]+:\d+\]:|\[\d+,\d+\]<|\d{1,5}: |\[?[EWIF]\d{3,4} |\[[EWIF] |"
    r"[\w.<>-]+:\d+:\d+ \[\d+\]|Traceback |frame #|\s*File \"|[\w.]*\w(?:Error|Exception|Warning)"
    r"\b|\[\d{4}-\d\d-\d\d|\d{4}-\d\d-\d\d|kernel: |NVRM|Root Cause|Failures:|\[\d+\]:|[=-]{8}|"
    r"\(\w+ pid=|\w{3} +\d+ \d\d:|\s*iteration\s+\d+/\s*\d+ \|")
# a rule: one character repeated across the line (Megatron frames its evaluation report with
# '-' * (len(report) + 1), the longest line of its log): printed whole, never text a terminal
# wrapped, so the line after it is a line of its own
_RULE = re.compile(r"\s*([-=_*#~+.])\1{7,}\s*$")
# a record that is whole however wide it is: Megatron-LM's iteration line ends with its last
# field's " |" (training.py's training_log), so the line after it is a record of its own (its
# `[after training is done] datetime: ...`, a checkpoint's line)
_WHOLE = re.compile(r"\s*(?:\[[\d-]+ [\d:]+\]\s*)?iteration\s+\d+/\s*\d+ \|.*\|\s*$")
# a continuation a tool (not a terminal) broke off: it starts lower case or with the rest of a
# PyTorch NCCL message
_GO_ON = re.compile(r"[a-z]|WorkNCCL|OpType=|Numel|Timeout\(ms\)|SeqNum=|\d+[,)]")
# srun's label at a line's start, found after the line end before it (a literal the engine
# skips to in C: `^` with re.M is tried at every character)
_SRUN_LABELS = re.compile(r"\n *(\d{1,5}): ")
_RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.I)
_WIDTH_SAMPLE = 4000  # physical lines read ahead to find a terminal's wrap width
MAX_LINE = 1 << 16  # characters kept of one logical line (a joined run of wraps included)


class Line(NamedTuple):
    text: str  # the message, launcher tags removed
    source: str  # the file it came from
    number: int  # its first physical line there (1-based)
    rank: int | None = None  # from a launcher tag (or the file's name)
    host: str | None = None
    raw: str = ""  # its first physical line as written (the prefix may hold its time)
    words: tuple[str, ...] | None = None  # the trigger words in it, when already found
    last: int = 0  # its last physical line (a message a terminal wrapped spans several)


def normalise(text: str, source: str = "-") -> list[Line]:
    """Split, strip colour and launcher tags, join wrapped lines. Pure."""
    raw = text.replace("\r\n", "\n").split("\n")  # a lone CR is a rewrite, not a line end
    return list(lines(raw[:-1] if raw and raw[-1] == "" else raw, source))


class _Msg:
    """The message being built of one or more physical lines (a terminal's wraps joined)."""

    __slots__ = ("text", "number", "rank", "host", "raw", "words", "last")

    def __init__(self, text: str, number: int, rank: int | None, host: str | None, raw: str,
                 words: tuple[str, ...] | None) -> None:
        self.text, self.number, self.rank, self.host = text, number, rank, host
        self.raw, self.words, self.last = raw, words, number

    def line(self, source: str) -> Line:
        return Line(self.text.rstrip(), source, self.number, self.rank, self.host, self.raw,
                    self.words, self.last)


def lines(raw: Iterable[str | int | tuple[str, tuple[str, ...]]], source: str = "-",
          searched: bool = False) -> Iterator[Line]:
    """The logical lines of one log's physical lines (without their line ends), streamed. An
    int among them says that many lines were passed over there (nothing joins across it); a
    (line, words) pair is a line whose trigger words the reader already found (`searched`:
    a plain line then holds none), kept in `Line.words` so that no line is searched twice.
    Joining never hides a line from the count: `Line.number` and `Line.last` are the first and
    last physical line of each message, so the lines counted are the file's own."""
    default_rank = int(m.group(1)) if (m := _RANK_IN_NAME.search(Path(source).name)) else None
    it = iter(raw)
    head = list(islice(it, _WIDTH_SAMPLE))
    width = _wrap_width([x if isinstance(x, str) else x[0] for x in head
                         if not isinstance(x, int)])  # tags included
    cur: _Msg | None = None
    prev_full = False
    prev = ""  # the physical line before, untagged
    number = 0
    words: tuple[str, ...] | None
    for item in chain(head, it):
        if isinstance(item, int):
            number += item
            if cur is not None:
                yield cur.line(source)
            cur, prev_full = None, False
            continue
        if isinstance(item, tuple):
            text, words = item
        else:
            text, words = item, () if searched else None
        number += 1
        line = _plain(text)
        # terminal padding goes before the tags are read (a wrapped line's one space stays)
        body, rank, host = _untag(line.rstrip() if line[-2:] == "  " else line)
        if cur is not None and _continues(cur, body, rank, host, prev_full, prev):
            # a terminal wraps at its width, mid-word as often as not: join without a space;
            # a tool that broke its own line did so between words
            glue = "" if prev_full or cur.text.endswith(" ") else " "
            if len(cur.text) < MAX_LINE:
                cur.text = cur.text + glue + body.lstrip() if glue else cur.text + body
            cur.words = None  # a word may straddle the join: searched again, whole
            cur.last = number
        else:
            if cur is not None:
                yield cur.line(source)
            cur = _Msg(body, number, rank if rank is not None else default_rank, host, line,
                       words)
        # a wrapped line fills the width with text; a padded one ends in spaces
        prev_full = (width is not None and len(line) == width and line[-2:] != "  "
                     and not _RULE.match(line) and not _WHOLE.match(body))
        prev = body
    if cur is not None:
        yield cur.line(source)


def tagged_ranks(text: str) -> set[int]:
    """The global ranks the launcher tags in `text` name (a block read whole, at C speed)."""
    out = {int(a or b or r) for a, b, _, r, _ in _BRACKET_TAG.findall(text) if a or b or r}
    out.update(int(x) for x in _SRUN_LABELS.findall("\n" + text))
    return out


def _plain(line: str) -> str:
    """The line as a terminal showed it: colour codes out (looked for only where one may be: a
    regex is slower), and of a line a progress bar rewrote with carriage returns, the last
    text written. Trailing padding stays (the wrap width is measured on it) and goes later."""
    if "\r" in line:
        parts = [x for x in line.split("\r") if x.strip()]
        line = parts[-1] if parts else ""
    if "\x1b" in line or "[0m" in line or "[3" in line or "[1;" in line or "[9" in line:
        return _ANSI.sub("", line)
    return line


def _continues(cur: _Msg, body: str, rank: int | None, host: str | None,
               prev_full: bool, prev: str = "") -> bool:
    """Is `body` the rest of the message in `cur`? Only when it does not begin a message of its
    own, carries no other rank's tag, and the message was cut: at the terminal's width, inside
    an NCCL message's parentheses, or after `... timeout: ` / `... detected` by its writer.

    Lines of the wrap width are not all wraps: a run's records are often all as wide (Megatron's
    iteration lines, padded to columns). A line that begins as the physical line before it began
    (the same indentation and first word) starts a record of its own: a terminal's continuation
    is the middle of a message, not a message's beginning again. `prev` is that line."""
    if (rank is not None and rank != cur.rank) or (host is not None and host != cur.host):
        return False
    text = cur.text
    if not prev_full and "NCCL" not in text and "atchdog" not in text:
        return False
    # (a launcher's tag is followed by a space that is not part of the message)
    head = body.lstrip() if rank is not None or host is not None else body
    if _RECORD.match(head) or _TABLE_ROW.match(body):
        return False
    if prev_full:
        return not _same_start(prev, body)
    if text.count("(") > text.count(")"):
        return True
    return not text.rstrip().endswith((".", "!")) and bool(_GO_ON.match(body.lstrip()))


def _same_start(prev: str, body: str) -> bool:
    """Does `body` begin as `prev` does: the same indentation, then the same first word of at
    least three characters (a record like the one before)?"""
    a, b = prev.lstrip(), body.lstrip()
    if len(prev) - len(a) != len(body) - len(b):
        return False
    word = a.split(None, 1)[0] if a else ""
    return len(word) >= 3 and b.startswith(word)


def _untag(line: str) -> tuple[str, int | None, str | None]:
    """The line without its launcher tags, and the rank and host they named."""
    rank = host = None
    if line[:1] == "(" and (m := _RAY_PREFIX.match(line)):
        line, host = line[m.end():], m.group(1)
    if ": " in line[:64]:
        line, rank, host2 = _start_tags(line)
        host = host2 or host
    if "]:" not in line and "]<" not in line:
        return line, rank, host
    m = _BRACKET_TAG.search(line)
    if m is None:
        return line, rank, host
    prefix = line[:m.start()]
    while m is not None:
        rank, host = _bracket(m, rank, host)
        line = line[m.end():]
        m = _BRACKET_TAG.match(line)
    if prefix and host is None:
        host = _host_of(prefix)
    return line, rank, host


def _start_tags(line: str) -> tuple[str, int | None, str | None]:
    """Up to three tags at the very start (srun's `3: `, pdsh's `host: `), peeled in turn."""
    rank = host = None
    for _ in range(3):
        for rx, what in _START_TAGS:
            if m := rx.match(line):
                if what == "rank":
                    rank = int(m.group(1))
                elif what == "host":
                    host = m.group(1)
                line = line[m.end():]
                break
        else:
            break
    return line, rank, host


def _bracket(m: re.Match[str], rank: int | None, host: str | None) -> tuple[int | None, str | None]:
    """What one bracketed tag says: a global rank, host and rank, or a role's local rank (which
    says less than a global rank tag after it)."""
    if m.group(1) is not None:
        return int(m.group(1)), host
    if m.group(2) is not None:
        return int(m.group(2)), host
    if m.group(3) is not None:
        return int(m.group(4)), m.group(3)
    return rank, host  # a role's tag (`[default3]:`) is a local rank: `local_rank` reads it


def local_rank(raw: str) -> int | None:
    """The local rank a torchrun role tag (`[default3]:`, `[trainer1]:`) names in a physical
    line: kept apart from the global rank (rank 3 of node 2 is not global rank 3)."""
    if "]:" in raw and (m := _ROLE_TAG.search(raw)):
        return int(m.group(1))
    return None


def _host_of(prefix: str) -> str | None:
    """The host an unknown prefix names, when it says so plainly (Ray's `ip=`, an aggregator's
    `job.host [stderr]` with the host the dotted part that has a digit)."""
    if m := _PREFIX_IP.search(prefix):
        return m.group(1)
    if m := _PREFIX_STREAM.search(prefix):
        parts = [p for p in m.group(1).split(".") if any(c.isdigit() for c in p)]
        return parts[-1] if parts else None
    return None


def _wrap_width(lines: list[str]) -> int | None:
    """The terminal width a paste was wrapped at: the longest length, shared by several lines."""
    counts = Counter(len(x) for x in lines if len(x) >= 60)
    if not counts:
        return None
    width = max(counts)
    return width if counts[width] >= 2 else None
