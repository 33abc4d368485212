"""What a job's console lines hold: every signature of PyTorch, torchrun, CUDA, the kernel and
NCCL recognised, in order of appearance (megatron_env.diagnose.triage judges them)."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

from megatron_env.diagnose import nccl_log
from megatron_env.diagnose.joblog import Line

_WATCHDOG = re.compile(
    r"\[Rank (\d+)\] Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), "
    r"OpType=(\w+)(?:, NumelIn=(\d+), NumelOut=(\d+))?, Timeout\(ms\)=(\d+)\) ran for (\d+) "
    r"milliseconds")
_WORK = re.compile(r"detected by watchdog at work(?: sequence id)?: (\d+),? (?:PG status: )?last "
                   r"enqueued (?:NCCL )?work: (-?\d+), last completed (?:NCCL )?work: (-?\d+)")
_DUMP_WORK = re.compile(r"dump signal.*?[Ll]ast enqueued NCCL work: (-?\d+), last completed "
                        r"NCCL work: (-?\d+)")
_STUCK = re.compile(r"watchdog got stuck for (\d+) seconds")
_DUMP_FROM = re.compile(r"dump signal due to a collective timeout from\s+rank (\d+)")
_RANK_IN_TEXT = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")
_DESYNC_HEAD = "lagging/dead/mismatched ranks that caused the desync are"
_DESYNC_ENTRY = re.compile(r"^\s*-?\s*\[(?:Rank )?(\d+(?:, \d+)*)\] (.+)$")
_DESYNC_AT = re.compile(r"Timeout at collective: (\w+), #(\d+)")
# "NCCL error in: file:line, KIND", "NCCL error: KIND", "NCCL Error 2: KIND" (the number is
# ncclResult_t), "ncclCommInitRank failed: KIND" (Horovod)
_NCCL_ERROR = re.compile(
    r"(?:NCCL [Ee]rror(?: in: \S+?,| (\d+):|:| \S+)?|nccl\w+ failed:) '?(unhandled system error|"
    r"remote process exited or there was a network error|unhandled cuda error|internal error|"
    r"invalid usage|invalid argument)(?:[^,]*, NCCL version ([\w.+]+))?")
_CUDA_ERROR = re.compile(r"CUDA error: ([^.\n]+?)(?:\.|$)|cuda runtime error \(\d+\) : ([^.\n]+?)"
                         r"(?: at |$)")
_OOM = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]iB)(?: \(GPU (\d+); "
                  r"([\d.]+ [KMGT]iB) total capacity|\. GPU (\d+) has a total capac\w* of "
                  r"([\d.]+ [KMGT]iB))?")
_XID = re.compile(r"NVRM: Xid \((PCI:[\w:.]+)\): (\d+)(?:, pid=(\d+))?(?:, name=([^,\s]+))?"
                  r"(?:.*caused by previous Xid (\d+))?")
_SYSLOG_HOST = re.compile(r"\b\w{3}\s+\d+ [\d:]+ (\S+) kernel:")
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*: (.*)$")
_ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_ELASTIC = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")

SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
           9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
# NVIDIA's Xid catalogue, the codes a training job meets most
XIDS = {13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
        45: "preemptive cleanup after an earlier error", 48: "double-bit ECC error",
        61: "internal micro-controller breakpoint", 62: "internal micro-controller halt",
        63: "ECC page retirement or row remapping", 64: "ECC page retirement or row remap failure",
        74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC rate",
        94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout",
        120: "GSP error"}


_CAP = 2000  # events kept of one kind: a week of logs repeats the same few many times
_NCCL_BATCH = 5000  # NCCL lines analysed together (verify_nccl.py's analysis), then merged
# NCCL's "host:pid:tid [dev]" origin, found by its literal part (a search for the host name
# first would try every position of the line)
_NCCL_ORIGIN = re.compile(r":\d+:\d+ \[\d+\]| \[\d+\] \S+:\d+ WARN")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.<>-")
# any word a signature below needs: a line without one is passed over at once
_HOT = ("NCCL", "rror", "WARN", "atchdog", "nccl", "exitcode", "dump signal", "stuck for",
        "lagging/dead", "Snapshot of", "out of memory", "Xid", "Root Cause", "Failures:",
        "worker died")
HOT = re.compile("|".join(map(re.escape, _HOT)))  # for a reader that passes over cold lines
_DATE_PROBES = 200  # hot lines of a file searched for a date (its start is what tells jobs apart)
_RENDEZVOUS = re.compile(r"(DistNetworkError|DistStoreError|RendezvousConnectionError)\b:? "
                         r"(.*?(?:\(errno: \d+ - [^)]*\)|timed out|$))")
_STORE_AT = re.compile(r"(?:\(|to )(\S+?)[,:] ?(\d+)\)?")
_RAY_DIED = re.compile(r"A worker died or was killed.*?Worker IP address: (\S+).*?Worker PID: "
                       r"(\d+)(?:.*?Worker exit type: (\w+))?")
_DATE = re.compile(r"\[[EWIF](\d{1,2})(\d\d) \d\d:|\b(20\d\d)-(\d\d)-(\d\d)[ T_]")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")


@dataclass
class Events:
    timeouts: list[dict] = field(default_factory=list)
    work: dict[int, str] = field(default_factory=dict)  # rank -> watchdog's work status
    first_timeout: set[int] = field(default_factory=set)  # "dump signal ... from rank N"
    dump_seen_by: set[int] = field(default_factory=set)  # ranks that received that signal
    stuck: list[dict] = field(default_factory=list)  # the heartbeat monitor's verdict
    desync: list[str] = field(default_factory=list)
    desync_lagging: list[tuple[list[int], str]] = field(default_factory=list)
    nccl_errors: list[dict] = field(default_factory=list)
    cuda_errors: list[dict] = field(default_factory=list)
    ooms: list[dict] = field(default_factory=list)
    xids: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)  # torchrun's failure table
    rendezvous: list[dict] = field(default_factory=list)
    ray_deaths: list[dict] = field(default_factory=list)
    ranks_seen: set[int] = field(default_factory=set)
    nccl: dict | None = None  # verify_nccl.py's analysis of the NCCL lines, batches merged
    sources: dict[str, dict] = field(default_factory=dict)  # file -> what says which job it is
    lines: int = 0
    _batch: list[str] = field(default_factory=list)
    _seen: set = field(default_factory=set)

    def add(self, kind: str, item: dict, key: tuple | None = None) -> None:
        """Keep an event unless `_CAP` of its kind are kept or the same one was (by `key`)."""
        items = getattr(self, kind)
        if len(items) >= _CAP or (key is not None and (kind, *key) in self._seen):
            return
        if key is not None:
            self._seen.add((kind, *key))
        items.append(item)

    def nccl_line(self, text: str) -> None:
        self._batch.append(text)
        if len(self._batch) >= _NCCL_BATCH:
            self.flush()

    def flush(self) -> None:
        if self._batch:
            self.nccl = nccl_log.merge(self.nccl, nccl_log.analyze("\n".join(self._batch)))
            self._batch = []


def new_facts() -> dict:
    """What tells one file's job from another's (see `jobs`)."""
    return {"ranks": set(), "timeout_ms": set(), "dates": set()}


def _from_origin(t: str) -> str:
    """An NCCL line from its `host:pid:tid [dev]` on (whatever prefix came before it)."""
    o = _NCCL_ORIGIN.search(t)
    if o is None or o.start() == 0:
        return t
    i = o.start()
    while i > 0 and t[i - 1] in _HOST_CHARS:
        i -= 1
    return t[i:]


def _rank(line: Line) -> int | None:
    """The global rank: the launcher's tag, else `[Rank N]` in the text (which, in a process
    group other than the default one, is the rank inside that group)."""
    if line.rank is not None:
        return line.rank
    m = _RANK_IN_TEXT.search(line.text)
    return int(m.group(1)) if m else None


def _window(lines: Iterable[Line], n: int = 9) -> Iterator[tuple[Line | None, Line, deque]]:
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


def events(lines: Iterable[Line]) -> Events:
    """Everything recognised in the lines, in order of appearance, in bounded memory."""
    ev = Events()
    in_desync = False
    table = False  # inside torchrun's failure table
    entry: dict | None = None
    root = False
    source = None
    facts: dict = {}
    for prev, line, ahead in _window(lines):
        ev.lines += 1
        t = line.text
        if line.source != source:
            source = line.source
            facts = ev.sources.setdefault(source, new_facts())
        if line.rank is not None:
            ev.ranks_seen.add(line.rank)
            if len(facts["ranks"]) < _CAP:
                facts["ranks"].add(line.rank)
        if in_desync:
            if m := _DESYNC_ENTRY.match(t):
                ev.add("desync_lagging", ([int(x) for x in m.group(1).split(", ")], m.group(2)))
                continue
            in_desync = False
        if entry is not None and (m := _FIELD.match(t)):
            entry[m.group(1)] = m.group(2).strip()
            if m.group(1) == "traceback":
                ev.add("failures", _failure(entry))
                entry = None
            continue
        if table and (m := _ENTRY.match(t)):
            entry = {"root": root}
            continue
        for k in _HOT:
            if k in t:
                break
        else:
            continue
        facts["probes"] = probes = facts.get("probes", 0) + 1
        if probes < _DATE_PROBES and len(facts["dates"]) < 64 and (m := _DATE.search(t)):
            facts["dates"].add(f"{m.group(1)}-{m.group(2)}" if m.group(1) else
                               f"{int(m.group(4))}-{m.group(5)}")
        if "NCCL" in t or "WARN" in t:
            ev.nccl_line(_from_origin(t))
        _scan(ev, line, t, prev, ahead, facts)
        if _DESYNC_HEAD in t:
            in_desync = True
            if prev is not None and (m := _DESYNC_AT.search(prev.text)):
                ev.add("desync", f"timeout at collective {m.group(1)} #{m.group(2)}")
        if "Snapshot of ranks' latest states" in t:
            for x in islice(ahead, 8):
                if not x.text.startswith(" "):
                    break
                ev.add("desync", x.text.strip())
        if "Root Cause (first observed failure)" in t:
            root = table = True
        elif t.strip() == "Failures:":
            root, table = False, True
    ev.flush()
    ev.failures = [f for f in ev.failures if f.get("rank") is not None
                   or f.get("local_rank") is not None]
    return ev


def _scan(ev: Events, line: Line, t: str, prev: Line | None, ahead: deque,
          facts: dict) -> None:
    """The one-line signatures (and the few lines after an NCCL error that explain it)."""
    if "atchdog caught" in t and (m := _WATCHDOG.search(t)):
        rank = _rank(line)
        pg = int(m.group(1))
        facts["timeout_ms"].add(int(m.group(6)))
        ev.add("timeouts", {
            "rank": rank if rank is not None else pg, "pg_rank": pg, "seq": int(m.group(2)),
            "op": m.group(3), "numel_in": int(m.group(4)) if m.group(4) else None,
            "numel_out": int(m.group(5)) if m.group(5) else None,
            "timeout_ms": int(m.group(6)), "ran_ms": int(m.group(7)), "host": line.host},
            key=(rank if rank is not None else pg, int(m.group(2)), m.group(3)))
    if ("by watchdog" in t and (m := _WORK.search(t)) and (r := _rank(line)) is not None
            and len(ev.work) < _CAP):
        ev.work[r] = (f"failed at work {m.group(1)}, last enqueued {m.group(2)}, last "
                      f"completed {m.group(3)}")
    elif ("dump signal" in t and (m := _DUMP_WORK.search(t)) and (r := _rank(line)) is not None
          and len(ev.work) < _CAP):
        ev.work.setdefault(r, f"last enqueued {m.group(1)}, last completed {m.group(2)}")
    if "stuck for" in t and (m := _STUCK.search(t)):
        ev.add("stuck", {"rank": _rank(line), "host": line.host, "seconds": int(m.group(1))},
               key=(_rank(line), line.host))
    if "dump signal" in t and (m := _DUMP_FROM.search(t)) and len(ev.first_timeout) < _CAP:
        ev.first_timeout.add(int(m.group(1)))
        if (r := _rank(line)) is not None:
            ev.dump_seen_by.add(r)
    if ("rror" in t or "failed:" in t) and (m := _NCCL_ERROR.search(t)):
        after = list(islice(ahead, 5))
        detail = next((x.text.strip() for x in after
                       if x.text.strip() and not x.text.startswith(("Last error", "ncclRe",
                                                                    "ncclSy", "ncclUn",
                                                                    "ncclIn"))), "")
        last = any(x.text.startswith("Last error") for x in after[:3])
        kind = m.group(2)
        ev.add("nccl_errors", {"kind": kind, "version": m.group(3), "rank": _rank(line),
                               "host": line.host, "last_error": detail if last else "",
                               "line": t.strip()[:500]},
               key=(kind, _rank(line), line.host))
    if "out of memory" in t and (m := _OOM.search(t)):
        ev.add("ooms", {"rank": _rank(line), "host": line.host, "size": m.group(1),
                        "gpu": m.group(2) or m.group(4), "total": m.group(3) or m.group(5),
                        "line": t.strip()[:500]}, key=(_rank(line), line.host, m.group(0)))
    elif (("CUDA error" in t or "cuda runtime" in t) and (m := _CUDA_ERROR.search(t))
          and "Compile with" not in t):
        what = (m.group(1) or m.group(2)).strip()
        ev.add("cuda_errors", {"what": what, "rank": _rank(line), "host": line.host,
                               "line": t.strip()[:500]}, key=(what, _rank(line), line.host))
    if "Xid" in t and (m := _XID.search(t)):
        h = _SYSLOG_HOST.search(t) if "kernel:" in t else None
        host = (h.group(1) if h else None) or line.host
        ev.add("xids", {"pci": m.group(1), "xid": int(m.group(2)), "pid": m.group(3),
                        "name": m.group(4), "cause": int(m.group(5)) if m.group(5) else None,
                        "host": host}, key=(m.group(0),))
    if "exitcode" in t and (m := _ELASTIC.search(t)):
        ev.add("failures", {"root": False, "rank": None, "local_rank": int(m.group(2)),
                            "host": line.host, "exitcode": int(m.group(1)),
                            "pid": m.group(3), "source": "elastic"},
               key=(m.group(2), m.group(3)))
    if ("Dist" in t or "Rendezvous" in t) and (m := _RENDEZVOUS.search(t)):
        store = _STORE_AT.search(m.group(2))
        ev.add("rendezvous", {"error": m.group(1), "what": m.group(2).strip()[:300],
                              "store": f"{store.group(1)}:{store.group(2)}" if store else None,
                              "rank": _rank(line), "host": line.host},
               key=(m.group(1), line.host))
    if "worker died" in t and (m := _RAY_DIED.search(t)):
        ev.add("ray_deaths", {"ip": m.group(1), "pid": m.group(2), "exit": m.group(3)},
               key=(m.group(2),))


def _failure(e: dict) -> dict:
    rank = re.match(r"(\d+)(?: \(local_rank: (\d+)\))?", e.get("rank", ""))
    code = re.match(r"(-?\d+)(?: \(pid: (\d+)\))?", e.get("exitcode", ""))
    return {"root": e["root"], "rank": int(rank.group(1)) if rank else None,
            "local_rank": int(rank.group(2)) if rank and rank.group(2) else None,
            "host": e.get("host"), "exitcode": int(code.group(1)) if code else None,
            "pid": code.group(2) if code else None, "time": e.get("time"),
            "traceback": e.get("traceback", "")}


# --------------------------------------------------------------------------- findings


