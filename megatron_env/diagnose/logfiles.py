"""The log files a user names, checked before anything is read, then read as streams.

Why its own module: what a "log" is on the command line (files, directories, quoted globs) and
which of them to refuse (a glob matching nothing, /dev/null, a FIFO, a core dump) is a question
of files, not of log lines; `joblog` turns lines into messages and never opens anything.

Reading streams: each file is read one physical line at a time (a line longer than
`joblog.MAX_LINE` is cut, the rest of it skipped), so memory stays bounded whatever the size.
A crash log padded with NUL bytes (a node that died mid-write leaves its file's last blocks
zero) is read with the NULs left out; a file whose first block is mostly control bytes (a core
dump, an archive) is refused.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import io
import lzma
import os
import re
import stat
import sys
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol, cast

from megatron_env.diagnose import joblog
from megatron_env.diagnose.flight import dump
from megatron_env.errors import UserError

STDIN = Path("-")
# what reading a damaged file raises (a bad gzip header is an OSError, a bad xz stream not)
_BROKEN: tuple[type[BaseException], ...] = (OSError, EOFError, lzma.LZMAError)
# ... and while reading on (zstandard raises ZstdError, a ValueError)
_READ_ERRORS: tuple[type[BaseException], ...] = (*_BROKEN, ValueError)
# compressed logs, known by their first bytes (a rotated `.log.1` is gzip as often as not)
_MAGIC = {b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"(\xb5/\xfd": "zstd", b"BZh": "bzip2"}

_SNIFF = 8192
_BLOCK = 1 << 20
_BEFORE, _AFTER = 3, 12  # lines handed on around a hot one
_MAX_RANKS = 1 << 20
# bytes no text log holds (tab, line ends, form feed and ESC of colour codes are text)
_CONTROL = frozenset([*range(1, 9), 11, *range(14, 27), *range(28, 32), 127])
_FIX = "pass the console logs of the job (files or a directory)"


class Scan(Protocol):
    """What finds a part of the words: a compiled pattern, or `wordscan.Anchored`."""

    def finditer(self, text: str) -> Iterator[re.Match[str]]: ...

    def search(self, text: str, pos: int = 0) -> re.Match[str] | None: ...


# what a hot line holds: one pattern, or its parts (see `_hits`)
Hot = re.Pattern[str] | tuple[Scan, ...]


def files(paths: list[str | Path], skipped: list[str] | None = None,
          dumps: list[Path] | None = None) -> list[Path]:
    """The files named: globs expanded, directories listed; anything unusable refused at once.
    Inside a directory, a file that cannot be read as a log is left out instead, with one line
    in `skipped` (what and why), and the rest are read; `-` is standard input. With `dumps`,
    a flight-recorder dump (known by its first bytes) goes there instead of being a log."""
    if not paths:
        raise UserError("no log given", fix="invoke triage LOG [LOG ...] (files or directories)",
                        kind="triage.no-log")
    out: list[Path] = []
    for p in map(str, paths):
        if p == "-":
            out.append(STDIN)
            continue
        if glob.has_magic(p) and not Path(p).exists():
            matched = sorted(glob.glob(p))
            if not matched:
                raise UserError(f"{p} matches no file",
                                fix="check the pattern (quoted globs are expanded here)",
                                kind="triage.no-match")
            named = [Path(x) for x in matched]
        else:
            named = [Path(p)]
        for f in named:
            out += _expand(f, skipped, dumps)
    return out


def _expand(p: Path, skipped: list[str] | None = None,
            dumps: list[Path] | None = None) -> list[Path]:
    try:
        st = p.stat()
    except OSError:
        raise UserError(f"{p}: no such file or directory", fix=_FIX,
                        kind="triage.no-such-log") from None
    if stat.S_ISDIR(st.st_mode):
        return _directory(p, skipped if skipped is not None else [], dumps)
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{p} is not a regular file ({_kind(st.st_mode)})", fix=_FIX,
                        kind="triage.not-a-file")
    if dumps is not None and dump.sniff(p):
        dumps.append(p)
        return []
    try:
        with _open(p) as f:
            _sniff(f.read(_SNIFF), p)
    except _BROKEN as e:
        raise UserError(f"cannot read {p}: {_why(e)}", fix=_FIX, kind="triage.unreadable") from None
    return [p]


def _why(e: BaseException) -> str:
    if isinstance(e, EOFError):
        return "the compressed stream is cut short"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _directory(p: Path, skipped: list[str], dumps: list[Path] | None = None) -> list[Path]:
    """A directory's logs: what cannot be read is left out with its reason, the rest kept."""
    inside = sorted(x for x in p.iterdir() if not x.name.startswith(".") and _regular(x))
    out: list[Path] = []
    taken = len(dumps) if dumps is not None else 0
    for x in inside:
        try:
            out += _expand(x, dumps=dumps)
        except UserError as e:
            skipped.append(e.message)
    if not out and (dumps is None or len(dumps) == taken):
        raise UserError(f"{p} holds no log files" + (f" ({skipped[0]})" if skipped else ""),
                        fix="pass the job's log files", kind="triage.empty-directory")
    return out


def _open(p: Path) -> BinaryIO:
    """The file (or standard input) as bytes, decompressed on the way when its first bytes
    say gzip, xz, zstd or bzip2 (never its name)."""
    raw = sys.stdin.buffer if p == STDIN else open(p, "rb")  # noqa: SIM115
    buf: io.BufferedReader = (raw if isinstance(raw, io.BufferedReader)
                              else io.BufferedReader(raw))  # type: ignore[arg-type]
    head = buf.peek(6)[:6]
    kind = next((k for magic, k in _MAGIC.items() if head.startswith(magic)), None)
    if kind == "gzip":
        return cast(BinaryIO, gzip.GzipFile(fileobj=buf))
    if kind == "xz":
        return cast(BinaryIO, lzma.LZMAFile(buf))
    if kind == "bzip2":
        return cast(BinaryIO, bz2.BZ2File(buf))
    if kind == "zstd":
        return _zstd(buf, p)
    return cast(BinaryIO, buf)


def _zstd(buf: io.BufferedReader, p: Path) -> BinaryIO:
    try:
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]  # 3.14
        return cast(BinaryIO, zstd.ZstdFile(buf))
    except ImportError:
        pass
    try:
        import zstandard
    except ImportError:
        buf.close()
        raise UserError(f"{p} is zstd-compressed and this Python has no zstd reader",
                        fix="pip install zstandard (or `zstd -dc LOG | invoke triage -`)",
                        kind="triage.zstd-missing") from None
    return cast(BinaryIO, zstandard.ZstdDecompressor().stream_reader(buf, closefd=True))


def _regular(p: Path) -> bool:
    try:
        return stat.S_ISREG(p.stat().st_mode)
    except OSError:
        return False


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


TAIL = 200  # last lines of a file kept for how the log ends (job.stopped, a clean end)


class Tally:
    """What `physical` passed over without handing it on (how many lines, which ranks), and
    how the file ends."""

    def __init__(self) -> None:
        self.skipped = 0
        self.lines = 0  # physical lines: `wc -l` (a last line without a line end counted too)
        self.ranks: set[int] = set()
        self.tail: deque[str] = deque(maxlen=TAIL)  # the file's last lines, hot or not
        self.text = False  # any line that is not blank
        self.progress: Callable[[int], None] | None = None  # told the bytes of each block read


def physical(path: Path, hot: Hot | None = None,
             tally: Tally | None = None, rare: tuple[str, ...] = (),
             ) -> Iterator[str | int | tuple[str, tuple[str, ...]]]:
    """The file's lines without line ends, NULs removed, each at most joblog.MAX_LINE long.

    Read in blocks of a MiB. With `hot` (what a line must hold to matter), only the lines near
    one that matches, or that holds one of the `rare` words, are handed on (`_BEFORE` before,
    `_AFTER` after: a wrapped message's
    head, a table under its heading); an int stands for the lines passed over, which `tally`
    counts and whose launcher tags it reads, block by block, at C speed."""
    try:
        f = _open(path)
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}", fix=_FIX,
                        kind="triage.unreadable") from None
    with f:
        rest = b""
        tail: list[str] = []  # the last lines of the block before, not handed on
        tail_found: dict[int, tuple[str, ...]] = {}  # the words found in them
        after = 0  # lines of this block still inside a hot line's window
        while True:
            try:
                block = f.read(_BLOCK)
            except _READ_ERRORS as e:
                raise UserError(f"cannot read {path}: {_why(e)}", fix=_FIX,
                                kind="triage.unreadable") from None
            if tally is not None and tally.progress is not None:
                tally.progress(len(block))
            data = rest + block
            if not data:
                break
            cut = data.rfind(b"\n") if block else len(data)
            if cut < 0:  # no line end in a whole block: keep its start, drop the rest
                rest = data[:joblog.MAX_LINE] if len(data) < 2 * _BLOCK else b""
                continue
            data, rest = data[:cut], data[cut + 1:]
            text, lines = _decode(data)
            if tally is not None:
                tally.lines += len(lines)
                tally.tail.extend(lines[-TAIL:])
                tally.text = tally.text or not text.isspace() and text != ""
            if hot is None:
                yield from lines
                continue
            if tally is not None and len(tally.ranks) < _MAX_RANKS:
                tally.ranks |= joblog.tagged_ranks(text)
            lines = tail + lines
            keep, found = _windows(text, hot, len(tail), after, rare)
            found.update(tail_found)
            after = max(0, keep[-1][1] - len(lines)) if keep else 0
            # the last lines near no hot one wait for the next block (a hot line may follow)
            held = max(min(keep[-1][1], len(lines)) if keep else 0, len(lines) - _BEFORE)
            yield from _handed_on(lines, keep, held, tally, found)
            tail = lines[held:]
            tail_found = {i - held: w for i, w in found.items() if i >= held}
        if tail:
            if tally is not None:
                tally.skipped += len(tail)
            yield len(tail)


def _decode(data: bytes) -> tuple[str, list[str]]:
    """A block of whole lines as text and as lines: NULs out, CRLF ends cut, long lines cut."""
    if b"\0" in data:
        data = data.replace(b"\0", b"")
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if "\r" in text:
        lines = [x[:-1] if x.endswith("\r") else x for x in lines]
    if max(map(len, lines)) > joblog.MAX_LINE:
        lines = [x[:joblog.MAX_LINE] for x in lines]
    return text, lines


def _windows(text: str, hot: Hot, offset: int, after: int,
             rare: tuple[str, ...] = ()) -> tuple[list[tuple[int, int]],
                                                   dict[int, tuple[str, ...]]]:
    """[start, end) line ranges around the hot lines of `text` (`offset` lines on), merged, and
    the words `hot` found in each hot line (so that no line is searched twice)."""
    spans: list[tuple[int, int]] = [(offset, offset + after)] if after else []
    found: dict[int, tuple[str, ...]] = {}
    line = at = 0
    for pos, words in _hits(text, hot, rare):
        line += text.count("\n", at, pos)
        at = pos
        idx = offset + line
        found[idx] = words
        start, end = max(0, idx - _BEFORE), idx + 1 + _AFTER
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans, found


_START = re.Match.start


def _hits(text: str, hot: Hot | _Exact,
          rare: tuple[str, ...]) -> list[tuple[int, tuple[str, ...]]]:
    """Where the hot lines of `text` start, in order, with the words found in each: one pass
    of `hot` over the whole block (its matches grouped by line), then the `rare` words. `hot`
    may be one pattern or its parts (the same words split by their first character: two
    scans of half the words are faster than one of all), whose matches are merged into what
    one scan of all the words finds."""
    out: list[tuple[int, tuple[str, ...]]] = []
    start = end = -1
    words: list[str] = []
    taken = 0  # the end of the last match kept
    for m in _matches(text, hot):
        if m.start() < taken:  # inside a match of another part: one scan would not see it
            # its part's scan missed one (merged matches never overlap: `_Exact` is exact)
            if m.end() > taken and not isinstance(hot, _Exact) and _hid(m, text, taken):
                return _hits(text, _Exact(_merged(text, hot)), rare)
            continue
        taken = m.end()
        if m.start() >= end:  # a new line
            if words:
                out.append((start, tuple(words)))
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            end = len(text) if end < 0 else end
            words = []
        words.append(m.group())
    if words:
        out.append((start, tuple(words)))
    for word in rare:
        i = text.find(word)
        while i >= 0:
            out.append((text.rfind("\n", 0, i) + 1, (word,)))
            nl = text.find("\n", i)
            if nl < 0:
                break
            i = text.find(word, nl)
    if rare:
        merged: dict[int, tuple[str, ...]] = {}
        for pos, ws in out:
            merged[pos] = merged.get(pos, ()) + ws
        out = sorted(merged.items())
    return out


def _matches(text: str, hot: Hot | _Exact) -> list[re.Match[str]]:
    """The matches of every part of `hot`, in order of where they start (parts begin with
    different characters, so no two start at one place)."""
    if isinstance(hot, _Exact):
        return hot.matches
    if isinstance(hot, re.Pattern):
        return list(hot.finditer(text))
    out = [m for rx in hot for m in rx.finditer(text)]
    out.sort(key=_START)
    return out


_WORD_MAX = 1024  # longer than any trigger word


def _hid(m: re.Match[str], text: str, taken: int) -> bool:
    """Did `m` (a match not kept: it starts inside the one kept, which ends at `taken`) hide a
    match of its own part that starts at or after `taken`, which one scan of all would find?"""
    r = m.re.search(text, taken, m.end() + _WORD_MAX)
    return r is not None and r.start() < m.end()


class _Exact:
    """Matches already merged exactly (`_merged`)."""

    def __init__(self, matches: list[re.Match[str]]) -> None:
        self.matches = matches


def _merged(text: str, hot: Hot) -> list[re.Match[str]]:
    """What one scan of all the parts' words finds: from where the last match ended, the
    match of the part that matches first (the longest there, as each part's pattern takes)."""
    parts = (hot,) if isinstance(hot, re.Pattern) else hot
    out: list[re.Match[str]] = []
    pos = 0
    pending = [rx.search(text) for rx in parts]
    while True:
        best: re.Match[str] | None = None
        for i, m in enumerate(pending):
            if m is not None and m.start() < pos:
                m = pending[i] = parts[i].search(text, pos)
            if m is not None and (best is None or m.start() < best.start()):
                best = m
        if best is None:
            return out
        out.append(best)
        pos = best.end()


def _handed_on(lines: list[str], keep: list[tuple[int, int]], held: int,
               tally: Tally | None, found: dict[int, tuple[str, ...]] | None = None,
               ) -> Iterator[str | int | tuple[str, tuple[str, ...]]]:
    """lines[:held]: those in `keep` (a hot one with the words found in it), an int for each
    run of others."""
    at = 0
    found = found or {}
    for start, end in keep:
        end = min(end, held)
        if start > at:
            if tally is not None:
                tally.skipped += start - at
            yield start - at
        for i in range(start, end):
            w = found.get(i)
            yield (lines[i], w) if w else lines[i]
        at = max(at, end)
    if held > at:
        if tally is not None:
            tally.skipped += held - at
        yield held - at


def _sniff(head: bytes, path: Path) -> None:
    """Refuse a file that is not text: after NULs are left out, control bytes or invalid UTF-8
    in more than a tenth of its first block (a log's ANSI colours and tabs are text)."""
    head = head.replace(b"\0", b"")
    if not head:
        return
    bad = sum(b in _CONTROL for b in head) + head.decode("utf-8", "replace").count("\ufffd")
    if bad * 10 > len(head):
        raise UserError(f"{path} is not a text log (it holds binary data)",
                        fix="pass the job's console output (stdout/stderr), not a core dump or "
                            "archive", kind="triage.binary")


def read(paths: list[str | Path]) -> Iterator[joblog.Line]:
    """The logical lines of every log named, file after file, streamed (the names are checked
    now, each file's content when it is reached)."""
    return _stream(files(paths))


def _stream(paths: list[Path]) -> Iterator[joblog.Line]:
    for f in paths:
        yield from joblog.lines(physical(f), str(f))


def compressed(path: Path) -> bool:
    """Do the file's first bytes say it is compressed (its size then says little of its text)?"""
    if path == STDIN:
        return False
    with open(path, "rb") as f:
        head = f.read(6)
    return any(head.startswith(magic) for magic in _MAGIC)


def size(paths: list[Path]) -> int:
    return sum(os.stat(p).st_size for p in paths if p != STDIN)
