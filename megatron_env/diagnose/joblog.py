"""Console logs of distributed jobs, made uniform: one logical line each, with rank and host.

Job logs reach us in many shapes: one file per rank or per node, or everything interleaved by
srun, torchrun or mpirun, each tagging lines its own way (`[rank3]:`, `3: `, `[gpu187:1]:`,
`[1,3]<stdout>:`, `10.0.87.143: ` from pdsh), often pasted from a terminal that wrapped long
lines at its width, or from a web page that wrapped a message mid-word. The analysis in
`triage` should not care: `normalise` strips the launcher tags into `Line.rank`/`Line.host` and
joins wrapped lines, so a pattern sees each message whole. `read` is the only part that touches
files. Nothing here decides what a line means.
"""

from __future__ import annotations

import glob
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from megatron_env.errors import UserError

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# launcher tags at the start of a line, tried repeatedly (a pdsh host, then a rank tag, ...)
_TAGS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\[rank(\d+)\]:"), "rank"),                       # torchrun --tee / TORCH_*
    (re.compile(r"\[([\w.-]+):(\d+)\]:"), "host,rank"),            # accelerate, deepspeed
    (re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:"), "rank"),       # mpirun --tag-output
    (re.compile(r" *(\d{1,5}): "), "rank"),                        # srun --label
    # pdsh/clush "host: ": a dotted IPv4 address or a host name with a digit in it
    (re.compile(r"((?:\d{1,3}\.){3}\d{1,3}|[A-Za-z][\w-]*\d[\w.-]*): "), "host"),
]
# a line that begins a new message (never the continuation of a wrapped one)
_RECORD = re.compile(
    r"\s*$|\[rank\d+\]|\[[\w.-]+:\d+\]:|\[\d+,\d+\]<|\d{1,5}: |\[?[EWIF]\d{3,4} |\[[EWIF] |"
    r"[\w.<>-]+:\d+:\d+ \[\d+\]|Traceback |frame #|\s*File \"|\w+(?:Error|Exception|Warning)\b|"
    r"\[\d{4}-\d\d-\d\d|\d{4}-\d\d-\d\d|kernel: |NVRM|Root Cause|Failures:|\[\d+\]:|[=-]{8}")
_RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.I)


@dataclass(frozen=True)
class Line:
    text: str  # the message, launcher tags removed
    source: str  # the file it came from
    number: int  # its first physical line there (1-based)
    rank: int | None = None  # from a launcher tag (or the file's name)
    host: str | None = None


def normalise(text: str, source: str = "-") -> list[Line]:
    """Split, strip colour and launcher tags, join wrapped lines. Pure."""
    raw = [_ANSI.sub("", x) for x in text.splitlines()]
    default_rank = int(m.group(1)) if (m := _RANK_IN_NAME.search(Path(source).name)) else None
    width = _wrap_width(raw)  # a terminal wraps the line as printed, tags included
    out: list[Line] = []
    prev_full = False
    for number, line in enumerate(raw, 1):
        body, rank, host = _untag(line)
        tagged = rank is not None or host is not None  # a launcher tags only a line's start
        if (out and not tagged and not _RECORD.match(body)
                and (prev_full or _open_message(out[-1].text))):
            last = out[-1]  # wrapped mid-word as often as not: join without a space
            out[-1] = Line(last.text + body, last.source, last.number, last.rank, last.host)
        else:
            out.append(Line(body, source, number,
                            rank if rank is not None else default_rank, host))
        prev_full = width is not None and len(line) == width
    return [Line(x.text.rstrip(), x.source, x.number, x.rank, x.host) for x in out]


def _untag(line: str) -> tuple[str, int | None, str | None]:
    rank = host = None
    for _ in range(4):
        for rx, what in _TAGS:
            if m := rx.match(line):
                if what == "rank":
                    rank = int(m.group(1))
                elif what == "host":
                    host = m.group(1)
                else:
                    host, rank = m.group(1), int(m.group(2))
                line = line[m.end():]
                break
        else:
            break
    return line, rank, host


def _wrap_width(lines: list[str]) -> int | None:
    """The terminal width a paste was wrapped at: the longest length, shared by several lines."""
    counts = Counter(len(x) for x in lines if len(x) >= 60)
    if not counts:
        return None
    width = max(counts)
    return width if counts[width] >= 2 else None


def _open_message(text: str) -> bool:
    """A PyTorch/NCCL message cut inside its parentheses (`WorkNCCL(SeqNum=4, OpTy`)."""
    return "NCCL" in text and text.count("(") > text.count(")")


def read(paths: list[str | Path]) -> list[Line]:
    """The lines of every log named (a directory: each file in it, one per rank or node)."""
    if not paths:
        raise UserError("no log given", fix="invoke triage LOG [LOG ...] (files or directories)")
    files: list[Path] = []
    expanded = [Path(x) for p in map(str, paths)
                for x in (sorted(glob.glob(p)) if glob.has_magic(p) else [p])]
    for p in expanded:
        if p.is_dir():
            inside = sorted(x for x in p.iterdir() if x.is_file() and not x.name.startswith("."))
            if not inside:
                raise UserError(f"{p} holds no log files", fix="pass the job's log files")
            files += inside
        elif p.is_file():
            files.append(p)
        else:
            raise UserError(f"{p}: no such file or directory",
                            fix="pass the console logs of the job (files or a directory)")
    out: list[Line] = []
    for f in files:
        try:
            data = f.read_bytes()
        except OSError as e:
            raise UserError(f"cannot read {f}: {e.strerror}") from None
        if b"\0" in data[:8192]:
            raise UserError(f"{f} is not a text log (it holds binary data)",
                            fix="pass the job's console output (stdout/stderr), not a core "
                                "dump or archive")
        out += normalise(data.decode("utf-8", errors="replace"), str(f))
    return out
