"""What a job's console lines hold: every signature of every family recognised, in order of
appearance (megatron_env.diagnose.triage judges them).

How a line is read: one pattern made of every signature's trigger word (`TRIGGERS`) finds which
words a line holds, at C speed; only the readers of those words run (a line with none is passed
over at once, and `logfiles` passes over whole runs of such lines before they are even split).
The readers live with their family (`sig_comm`, `sig_proc`, `sig_net`, `sig_host`, the table of
`sig_table`); this module only walks the lines and keeps the state of multi-line blocks (a
desync report, torchrun's failure table, Horovod's stall list).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

from megatron_env.diagnose import sig_comm, sig_end, sig_host, sig_net, sig_proc, sig_table
from megatron_env.diagnose.joblog import Line
from megatron_env.diagnose.model import (
    CAP,
    SIGNALS,
    XIDS,
    Events,
    Lagging,
    Stall,
    describe,
    from_origin,
    new_facts,
)
from megatron_env.diagnose.sig_comm import DESYNC_AT, DESYNC_ENTRY, DESYNC_HEAD, STALL_BLOCK
from megatron_env.diagnose.sig_proc import ENTRY, FIELD, failure
from megatron_env.diagnose.wordscan import Anchored, trie

__all__ = ["CAP", "SIGNALS", "XIDS", "Events", "describe", "events", "is_hot", "new_facts",
           "trie"]

Reader = Callable[[Events, Line, str, deque[Line], dict[str, Any]], None]
READERS: list[tuple[str, Reader]] = [*sig_comm.READERS, *sig_proc.READERS, *sig_net.READERS,
                                     *sig_host.READERS, *sig_table.READERS, *sig_end.READERS]
# words that open a block, or send a line to the NCCL analysis, beside the readers' triggers
_BLOCK_WORDS = ("lagging/dead", "Snapshot of", "Missing ranks:", "Root Cause", "Failures:",
                "NCCL", "WARN")
_WORDS = sorted({w for w, _ in READERS} | set(_BLOCK_WORDS), key=lambda w: (-len(w), w))


assert max(map(len, _WORDS)) < 1024  # logfiles._WORD_MAX
# the words a line holds, longest first where they overlap: a word's readers include those of
# every shorter word inside it (found at the same place, which the engine does not report)
TRIGGERS = re.compile(trie(_WORDS))
_BY_WORD: dict[str, list[Reader]] = {
    w: list(dict.fromkeys(r for k, r in READERS if k in w)) for w in _WORDS}
HOT = TRIGGERS
# the same words as two scans, those that begin with a small letter and the others, merged by
# logfiles: the first scan skips most of a log's characters at once (capitals are rare); the
# second looks for a rarer piece of each word first (`wordscan.Anchored`)
HOT_PARTS = (re.compile(trie([w for w in _WORDS if not w[0].islower()])),
             Anchored([w for w in _WORDS if w[0].islower()]))


def is_hot(text: str) -> bool:
    """Does the text hold a word some signature needs?"""
    return HOT.search(text) is not None


_DATE_PROBES = 200  # hot lines of a file searched for a date (its start is what tells jobs apart)
_DATE = re.compile(r"\[[EWIF](\d{1,2})(\d\d) \d\d:|\b(20\d\d)-(\d\d)-(\d\d)[ T_]")


def _window(lines: Iterable[Line], n: int = 9,
            ) -> Iterator[tuple[Line | None, Line, deque[Line]]]:
    """Each line with the one before and up to `n` after it: the only look-around any
    signature needs, so memory stays bounded."""
    it = iter(lines)
    buf = deque(islice(it, n + 1))
    prev = None
    while buf:
        line = buf.popleft()
        if (nxt := next(it, None)) is not None:
            buf.append(nxt)
        yield prev, line, buf
        prev = line


class _Reader:
    """The state carried from line to line: which file, and which block (a desync report, a
    failure table, a stall inspector's list) the lines belong to."""

    def __init__(self) -> None:
        self.ev = Events()
        self.in_desync = False
        self.in_stall = False
        self.table = False  # inside torchrun's failure table
        self.entry: dict[str, Any] | None = None
        self.root = False
        self.source: str | None = None
        self.base = 0  # physical lines of the files read before this one
        self.facts: dict[str, Any] = {}

    def line(self, prev: Line | None, line: Line, ahead: deque[Line]) -> None:
        ev = self.ev
        t = line.text
        if line.source != self.source:
            self.base = ev.lines  # a file's lines are numbered from 1: counted after the last
            self.source = line.source
            self.facts = ev.sources.setdefault(line.source, new_facts())
            ev.recent.clear()
        ev.lines = self.base + (line.last or line.number)  # physical lines, however joined
        ev.recent.append(line)
        if line.rank is not None:
            self._tagged(line, line.rank)
        if self.in_desync or self.in_stall or self.entry is not None or self.table:
            if self._block(line, t, ahead):
                return
        elif ENTRY.match(t) and ahead and FIELD.match(ahead[0].text):
            self.entry = {"root": False}  # a failure table pasted without its heading
            return
        found: Sequence[str] = line.words if line.words is not None else TRIGGERS.findall(t)
        if found or self.in_desync:
            self._hot(prev, line, t, ahead, found)

    def _tagged(self, line: Line, rank: int) -> None:
        self.ev.ranks_seen.add(rank)
        if len(self.facts["ranks"]) < CAP:
            self.facts["ranks"].add(rank)
        if line.host is not None:
            self.ev.job.note(rank, line.host)

    def _block(self, line: Line, t: str, ahead: deque[Line]) -> bool:
        """A line inside one of the blocks; True when it was taken as part of it."""
        ev = self.ev
        if self.in_desync:
            if m := DESYNC_ENTRY.match(t):
                ev.keep(ev.desync_lagging,
                        Lagging([int(x) for x in m.group(1).split(", ")], m.group(2)))
                return True
            self.in_desync = False
        if self.in_stall:
            m = STALL_BLOCK.match(t)
            if m or (line.rank is not None and t.startswith("[")):
                # "1: [op, ...]": the rank may have been read as an srun label already
                rank, op = ((int(m.group(1)), m.group(2)) if m else
                            (line.rank, t[1:].split(",")[0].rstrip("]")))
                ev.add(Stall(ranks=[rank] if rank is not None else [], op=op, host=line.host),
                       key=(rank, op))
                return True
            self.in_stall = False
        if self.entry is not None:
            if m := FIELD.match(t):
                self.entry[m.group(1)] = m.group(2).strip()
                if m.group(1) == "traceback":
                    self.end_entry()
                return True
            self.end_entry()  # a table cut short: what it said is kept
        if self.table and ENTRY.match(t):
            self.entry = {"root": self.root}
            return True
        return False

    def end_entry(self) -> None:
        """One process of torchrun's failure table, read."""
        if self.entry is not None and len(self.entry) > 1:
            f = failure(self.entry)
            sig_proc.failed(self.ev, f)
            if f.rank is not None:
                self.ev.job.note(f.rank, f.host, f.pid)
        self.entry = None

    def _hot(self, prev: Line | None, line: Line, t: str, ahead: deque[Line],
             found: Sequence[str]) -> None:
        ev, facts = self.ev, self.facts
        ev.current = line
        facts["probes"] = probes = facts.get("probes", 0) + 1
        if probes < _DATE_PROBES and len(facts["dates"]) < 64 and (m := _DATE.search(t)):
            facts["dates"].add(f"{m.group(1)}-{m.group(2)}" if m.group(1) else
                               f"{int(m.group(4))}-{m.group(5)}")
        if "NCCL" in t or "WARN" in t:
            ev.nccl_line(from_origin(ev, line, t))
        _dispatch(ev, line, t, ahead, facts, found)
        if DESYNC_HEAD in t:
            self.in_desync = True
            if prev is not None and (m := DESYNC_AT.search(prev.text)):
                ev.keep(ev.desync, f"timeout at collective {m.group(1)} #{m.group(2)}")
        elif "Snapshot of ranks' latest states" in t:
            for x in islice(ahead, 8):
                if not x.text.startswith(" "):
                    break
                ev.keep(ev.desync, x.text.strip())
        elif "Missing ranks:" in t:
            self.in_stall = True
        elif "Root Cause (first observed failure)" in t:
            self.root = self.table = True
        elif t.strip() == "Failures:":
            self.root, self.table = False, True


def _dispatch(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any],
              found: Sequence[str]) -> None:
    """Each reader whose word the line holds, once."""
    done: set[Reader] = set()
    for word in found:
        for reader in _BY_WORD[word]:
            if reader not in done:
                done.add(reader)
                reader(ev, line, t, ahead, facts)


def events(lines: Iterable[Line]) -> Events:
    """Everything recognised in the lines, in order of appearance, in bounded memory."""
    r = _Reader()
    for prev, line, ahead in _window(lines):
        r.line(prev, line, ahead)
    r.end_entry()
    ev = r.ev
    sig_table.cut_tracebacks(ev)
    ev.current = None
    ev.flush()
    ev.failures = [f for f in ev.failures if f.rank is not None or f.local_rank is not None
                   or f.host]
    return ev
