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
    r"OpType=(\w+)(?:, NumelIn=(\d+), NumelOut=(\d+))?, Timeout\(ms\)=(\d+)\)(?: ran for (\d+) "
    r"milliseconds)?")  # (a paste cut after the parenthesis still names the collective)
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
# ncclResult_t), "ncclCommInitRank failed: KIND" (Horovod), "...ProcessGroupNCCL.cpp:1275, KIND"
# (a paste that lost the line's head), or any line with one of the three unmistakable kinds
# (TensorFlow's "NCCL communication aborted: unhandled system error")
_NCCL_ERROR = re.compile(
    r"(?:NCCL [Ee]rror(?: in: \S+?,| (\d+):|:| \S+)?|nccl\w+ failed:|NCCL\w*\.[ch]pp:\d+,|"
    r"(?=unhandled (?:system|cuda) error|remote process exited)[^']?)"
    r" ?'?(unhandled system error|"
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
_NCCL_ORIGIN = re.compile(r":(\d+):\d+ \[(\d+)\]| \[(\d+)\] \S+:\d+ WARN")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.<>-")
# any word a signature below needs: a line without one is passed over at once
_HOT = ("NCCL", "rror", "WARN", "atchdog", "nccl", "exitcode", "dump signal", "stuck for",
        "lagging/dead", "Snapshot of", "out of memory", "Xid", "Root Cause", "Failures:",
        "worker died", "ignal", "issing ranks", "Last error", "ibv_", "distributed_c10d",
        "work = ", "connect to", "Fatal Python", "rdzv_endpoint", "ready ranks", "CANCELLED",
        "the rendezvous", "checked in", "RayTaskError")
# for a reader that passes over cold lines: the common words as one pattern (a regex alternation
# slows with every word: 15 words scan at ~60 MB/s, 30 at ~30), the rarer ones found with
# str.find, which skips through a block at memory speed
_HOT_COMMON = ("NCCL", "rror", "WARN", "atchdog", "nccl", "exitcode", "dump signal", "stuck for",
               "lagging/dead", "Snapshot of", "out of memory", "Xid", "Root Cause", "Failures:",
               "worker died")
HOT = re.compile("|".join(map(re.escape, _HOT_COMMON)))
HOT_RARE = tuple(k for k in _HOT if k not in _HOT_COMMON)


def is_hot(text: str) -> bool:
    """Does the text hold a word some signature needs?"""
    return HOT.search(text) is not None or any(k in text for k in HOT_RARE)
_DATE_PROBES = 200  # hot lines of a file searched for a date (its start is what tells jobs apart)
_RENDEZVOUS = re.compile(r"(DistNetworkError|DistStoreError|RendezvousConnectionError)\b:? "
                         r"(.*?(?:\(errno: \d+ - [^)]*\)|timed out|$))")
# where a store was: "(host, 29500)", "to host:29500", "[host]:29500", "host=h, port=29500"
_STORE_AT = re.compile(r"(?:\(|to |\[)([\w.:-]*?[\w-])\]?[,:] ?(\d{2,5})\)?"
                       r"|host=([\w.-]+), port=(\d+)")
_STORE_LINE = re.compile(r"(?:to connect to|connect to any network address|TCPStore\(|"
                         r"Connection to) \S")
_ENDPOINT = re.compile(r"rdzv_endpoint\s*[:=]\s*'?([\w.-]+(?::\d+)?)")
_RAY_DIED = re.compile(r"A worker died or was killed.*?Worker IP address: (\S+).*?Worker PID: "
                       r"(\d+)(?:.*?Worker exit type: (\w+))?")
_RAY_ACTOR = re.compile(r"RayTaskError\((\w+)\): \S+ \(pid=(\d+), ip=([\w.-]+)")
# dynamic rendezvous naming its node "host_pid_n"
_RDZV_NODE = re.compile(r"The node '([\w.-]+?)_(\d+)_\d+' has failed to (\w+) the rendezvous "
                        r"'[^']*' due to an error of type (\w+)")
_RAISED = re.compile(r"^\w*(?:Error|Exception): (.+)")
_BOOTSTRAP = re.compile(r"Bootstrap Root : rank (\d+) of (\d+) ranks has already checked in")
_SLURM_CANCEL = re.compile(r"\*\*\* (STEP|JOB) ([\w.]+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO "
                           r"([A-Z ]+?))? \*\*\*")
_DATE = re.compile(r"\[[EWIF](\d{1,2})(\d\d) \d\d:|\b(20\d\d)-(\d\d)-(\d\d)[ T_]")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
# a process killed by a signal, as UCX, CPython, Open MPI, the DataLoader, torchrun's agent, gdb
# and Python's subprocess say it: (pattern, groups of number, name, host, pid)
_SIGNAL_FORMS = [
    (re.compile(r"(?:\[([\w.-]+):(\d+) ?:\d+:\d+\] )?Caught signal (\d+) \(([^:)]+)"),
     (3, 4, 1, 2)),
    (re.compile(r"Fatal Python error: (Bus error|Segmentation fault|Aborted|Floating point "
                r"exception)"), (None, 1, None, None)),
    (re.compile(r"(?:\[([\w.-]+):(\d+)\] )?Signal: ([\w ]+?) \((\d+)\)"), (4, 3, 1, 2)),
    (re.compile(r"worker \(pid (\d+)\) is killed by signal: ([\w ]+?)\."), (None, 2, None, 1)),
    (re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID (\d+)"), (1, 2, None, 3)),
    (re.compile(r"<Signals\.(SIG\w+): (\d+)>"), (2, 1, None, None)),
    (re.compile(r"received signal (SIG\w+)"), (None, 1, None, None)),
    (re.compile(r"Received (\d+) death signal, shutting down workers"), (1, None, None, None)),
]
_SIGNAL_NAMES = {"Bus error": 7, "Segmentation fault": 11, "Aborted": 6, "Killed": 9,
                 "Floating point exception": 8}
_STALL = re.compile(r"(\S+) \[(missing|ready) ranks: ([\d, ]+)\]")
_STALL_BLOCK = re.compile(r"^\s*(\d+): \[(\S+?)[,\]]")  # "Missing ranks:\n1: [op, ...]"
_IBV = re.compile(r"(ibv_\w+)(?:\(\))? failed(?: with error|:|,)? ?(.*?)(?: \((?:errno|error)"
                  r"[ =:]*(\d+)\)|\s*$)")
_ERRNOS = {"Cannot allocate memory": "ENOMEM", "Invalid argument": "EINVAL",
           "Bad address": "EFAULT", "Operation not permitted": "EPERM",
           "No such device": "ENODEV", "Operation not supported": "EOPNOTSUPP",
           "Connection refused": "ECONNREFUSED", "Connection timed out": "ETIMEDOUT"}
_ERRNO_NUMS = {12: "ENOMEM", 22: "EINVAL", 14: "EFAULT", 1: "EPERM", 19: "ENODEV",
               95: "EOPNOTSUPP", 111: "ECONNREFUSED", 110: "ETIMEDOUT"}
# the collective a traceback was in: distributed_c10d's public function, or the call on the
# process group inside it (`work = group.allgather_into_tensor_coalesced(...)`)
_TB_COLL = re.compile(r"distributed_c10d\.py\", line \d+, in ([a-z]\w+)"
                      r"|work = \w+\.(\w+)\(")
_NOT_COLL = frozenset({"wrapper", "new_group", "init_process_group", "destroy_process_group",
                       "get_rank", "get_world_size", "new_subgroups"})
_INIT = re.compile(r"comm 0x[0-9a-f]+ rank (\d+) nranks \d+ cudaDev (\d+)")
_LAST_ERROR = re.compile(r"^\s*Last error:\s*(.*)")


@dataclass
class Job:
    """One model of the job's processes: rank, host, local GPU and pid, put together from every
    line kind that names two of them (NCCL's `host:pid:tid [gpu]` origin, a `[rankN]` tag, NCCL's
    `comm ... rank N ... cudaDev G` init line, torchrun's failure table, UCX's `[host:pid]`)."""

    by_rank: dict[int, dict] = field(default_factory=dict)
    by_pid: dict[str, dict] = field(default_factory=dict)
    _noted: set = field(default_factory=set)

    def note(self, rank: int | None = None, host: str | None = None, pid: str | None = None,
             gpu: int | None = None) -> None:
        key = (rank, host, pid, gpu)
        if key in self._noted or len(self._noted) >= _CAP:
            return
        self._noted.add(key)
        if pid is not None and len(self.by_pid) < _CAP:
            p = self.by_pid.setdefault(pid, {})
            if host and p.get("host") not in (None, host):  # pids repeat across hosts
                return
            _fill(p, rank=rank, host=host, gpu=gpu)
            rank = rank if rank is not None else p.get("rank")
            host, gpu = host or p.get("host"), gpu if gpu is not None else p.get("gpu")
        if rank is not None and len(self.by_rank) < _CAP:
            _fill(self.by_rank.setdefault(rank, {}), host=host, pid=pid, gpu=gpu)

    def who(self, rank: int | None = None, host: str | None = None,
            pid: str | None = None) -> dict:
        """All that is known of one process from any one or two of rank, host and pid."""
        out = {"rank": rank, "host": host, "pid": pid, "gpu": None}
        p = self.by_pid.get(pid) if pid is not None else None
        if p and (host is None or p.get("host") in (None, host)):
            _fill(out, **p)
        r = self.by_rank.get(out["rank"]) if out["rank"] is not None else None
        if r and (out["host"] is None or r.get("host") in (None, out["host"])):
            _fill(out, **r)
        return out

    def merge(self, other: Job) -> None:
        for pid, p in other.by_pid.items():
            self.note(p.get("rank"), p.get("host"), pid, p.get("gpu"))
        for rank, r in other.by_rank.items():
            self.note(rank, r.get("host"), r.get("pid"), r.get("gpu"))


def _fill(d: dict, **kw) -> None:
    for k, v in kw.items():
        if v is not None and d.get(k) is None:
            d[k] = v


def describe(p: dict) -> str:
    """'rank 3 on node5 (GPU 3, pid 240)': what a finding says of one process."""
    head = " on ".join(x for x in (f"rank {p['rank']}" if p.get("rank") is not None else "",
                                   p.get("host") or "") if x) or "a process"
    more = ", ".join(x for x in (f"GPU {p['gpu']}" if p.get("gpu") is not None else "",
                                 f"pid {p['pid']}" if p.get("pid") else "") if x)
    return head + (f" ({more})" if more else "")


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
    last_errors: list[dict] = field(default_factory=list)  # NCCL's "Last error:" on its own
    cuda_errors: list[dict] = field(default_factory=list)
    ooms: list[dict] = field(default_factory=list)
    xids: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)  # torchrun's failure table
    rendezvous: list[dict] = field(default_factory=list)
    stores: list[str] = field(default_factory=list)  # store addresses a client failed to reach
    ray_deaths: list[dict] = field(default_factory=list)
    bootstrap: list[dict] = field(default_factory=list)  # NCCL's root: a rank checked in twice
    cancelled: list[dict] = field(default_factory=list)  # Slurm cancelled the step or job
    signals: list[dict] = field(default_factory=list)  # processes a signal killed
    stalls: list[dict] = field(default_factory=list)  # Horovod's stall inspector
    ibv: list[dict] = field(default_factory=list)  # failed ibv_* calls, by errno
    collective: dict[int | None, str] = field(default_factory=dict)  # rank -> traceback's op
    job: Job = field(default_factory=Job)
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

    def who(self, e: dict) -> dict:
        """An event's process with all the job model adds to it (and the host, when every
        process the logs name ran on one)."""
        p = self.job.who(e.get("rank"), e.get("host"), e.get("pid"))
        if p["host"] is None:
            hosts = {x.get("host") for x in self.job.by_pid.values()}
            if len(hosts) == 1:
                p["host"] = hosts.pop()
        return p


def new_facts() -> dict:
    """What tells one file's job from another's (see `jobs`)."""
    return {"ranks": set(), "timeout_ms": set(), "dates": set()}


def _from_origin(ev: Events, line: Line, t: str) -> str:
    """An NCCL line from its `host:pid:tid [dev]` on (whatever prefix came before it); the
    origin's host, pid and GPU go into the job model with the line's rank tag."""
    o = _NCCL_ORIGIN.search(t)
    if o is None:
        return t
    i = o.start()
    while i > 0 and t[i - 1] in _HOST_CHARS:
        i -= 1
    if o.group(1) is not None and i < o.start():
        host = line.host or t[i:o.start()]
        rank = line.rank
        if rank is None and " rank " in t and (m := _INIT.search(t, o.end())):
            rank = int(m.group(1))
        ev.job.note(rank, host, o.group(1), int(o.group(2)))
    return t[i:] if i else t


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


class _Reader:
    """The state carried from line to line: which file, and which block (a desync report, a
    failure table, a stall inspector's list) the lines belong to."""

    def __init__(self) -> None:
        self.ev = Events()
        self.in_desync = False
        self.in_stall = False
        self.table = False  # inside torchrun's failure table
        self.entry: dict | None = None
        self.root = False
        self.source: str | None = None
        self.facts: dict = {}

    def line(self, prev: Line | None, line: Line, ahead: deque) -> None:
        ev = self.ev
        ev.lines += 1
        t = line.text
        if line.source != self.source:
            self.source = line.source
            self.facts = ev.sources.setdefault(line.source, new_facts())
        if line.rank is not None:
            self._tagged(line)
        if self.in_desync or self.in_stall or self.entry is not None or self.table:
            if self._block(line, t, ahead):
                return
        elif _ENTRY.match(t) and ahead and _FIELD.match(ahead[0].text):
            self.entry = {"root": False}  # a failure table pasted without its heading
            return
        for k in _HOT:
            if k in t:
                break
        else:
            return
        self._hot(prev, line, t, ahead)

    def _tagged(self, line: Line) -> None:
        self.ev.ranks_seen.add(line.rank)
        if len(self.facts["ranks"]) < _CAP:
            self.facts["ranks"].add(line.rank)
        if line.host is not None:
            self.ev.job.note(line.rank, line.host)

    def _block(self, line: Line, t: str, ahead: deque) -> bool:
        """A line inside one of the blocks; True when it was taken as part of it."""
        ev = self.ev
        if self.in_desync:
            if m := _DESYNC_ENTRY.match(t):
                ev.add("desync_lagging", ([int(x) for x in m.group(1).split(", ")], m.group(2)))
                return True
            self.in_desync = False
        if self.in_stall:
            m = _STALL_BLOCK.match(t)
            if m or (line.rank is not None and t.startswith("[")):
                # "1: [op, ...]": the rank may have been read as an srun label already
                rank, op = ((int(m.group(1)), m.group(2)) if m else
                            (line.rank, t[1:].split(",")[0].rstrip("]")))
                ev.add("stalls", {"ranks": [rank], "ready": [], "op": op, "rank": None,
                                  "host": line.host},
                       key=(rank, op))
                return True
            self.in_stall = False
        if self.entry is not None:
            if m := _FIELD.match(t):
                self.entry[m.group(1)] = m.group(2).strip()
                if m.group(1) == "traceback":
                    self.end_entry()
                return True
            self.end_entry()  # a table cut short: what it said is kept
        if self.table and _ENTRY.match(t):
            self.entry = {"root": self.root}
            return True
        return False

    def end_entry(self) -> None:
        """One process of torchrun's failure table, read."""
        if self.entry is not None and len(self.entry) > 1:
            f = _failure(self.entry)
            self.ev.add("failures", f)
            if f["rank"] is not None:
                self.ev.job.note(f["rank"], f["host"], f["pid"])
        self.entry = None

    def _hot(self, prev: Line | None, line: Line, t: str, ahead: deque) -> None:
        ev, facts = self.ev, self.facts
        facts["probes"] = probes = facts.get("probes", 0) + 1
        if probes < _DATE_PROBES and len(facts["dates"]) < 64 and (m := _DATE.search(t)):
            facts["dates"].add(f"{m.group(1)}-{m.group(2)}" if m.group(1) else
                               f"{int(m.group(4))}-{m.group(5)}")
        if "NCCL" in t or "WARN" in t:
            ev.nccl_line(_from_origin(ev, line, t))
        _scan(ev, line, t, prev, ahead, facts)
        if _DESYNC_HEAD in t:
            self.in_desync = True
            if prev is not None and (m := _DESYNC_AT.search(prev.text)):
                ev.add("desync", f"timeout at collective {m.group(1)} #{m.group(2)}")
        elif "Snapshot of ranks' latest states" in t:
            for x in islice(ahead, 8):
                if not x.text.startswith(" "):
                    break
                ev.add("desync", x.text.strip())
        elif "Missing ranks:" in t:
            self.in_stall = True
        elif "Root Cause (first observed failure)" in t:
            self.root = self.table = True
        elif t.strip() == "Failures:":
            self.root, self.table = False, True


def events(lines: Iterable[Line]) -> Events:
    """Everything recognised in the lines, in order of appearance, in bounded memory."""
    r = _Reader()
    for prev, line, ahead in _window(lines):
        r.line(prev, line, ahead)
    r.end_entry()
    ev = r.ev
    ev.flush()
    ev.failures = [f for f in ev.failures if f.get("rank") is not None
                   or f.get("local_rank") is not None or f.get("host")]
    return ev


def _scan(ev: Events, line: Line, t: str, prev: Line | None, ahead: deque,
          facts: dict) -> None:
    """The one-line signatures (and the few lines after one that explain it): each reader
    runs only on a line that holds its trigger word."""
    for trigger, reader in _READERS:
        if trigger in t:
            reader(ev, line, t, ahead, facts)


def _watchdog(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if m := _WATCHDOG.search(t):
        rank = _rank(line)
        pg = int(m.group(1))
        facts["timeout_ms"].add(int(m.group(6)))
        ev.add("timeouts", {
            "rank": rank if rank is not None else pg, "pg_rank": pg, "seq": int(m.group(2)),
            "op": m.group(3), "numel_in": int(m.group(4)) if m.group(4) else None,
            "numel_out": int(m.group(5)) if m.group(5) else None,
            "timeout_ms": int(m.group(6)), "ran_ms": int(m.group(7) or 0), "host": line.host},
            key=(rank if rank is not None else pg, int(m.group(2)), m.group(3)))


def _work(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if (m := _WORK.search(t)) and (r := _rank(line)) is not None and len(ev.work) < _CAP:
        ev.work[r] = (f"failed at work {m.group(1)}, last enqueued {m.group(2)}, last "
                      f"completed {m.group(3)}")


def _dump(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if "by watchdog" not in t and (m := _DUMP_WORK.search(t)) and (
            r := _rank(line)) is not None and len(ev.work) < _CAP:
        ev.work.setdefault(r, f"last enqueued {m.group(1)}, last completed {m.group(2)}")
    if (m := _DUMP_FROM.search(t)) and len(ev.first_timeout) < _CAP:
        ev.first_timeout.add(int(m.group(1)))
        if (r := _rank(line)) is not None:
            ev.dump_seen_by.add(r)


def _stuck(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if m := _STUCK.search(t):
        ev.add("stuck", {"rank": _rank(line), "host": line.host, "seconds": int(m.group(1))},
               key=(_rank(line), line.host))


def _nccl_error(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if "failed:" not in t and "rror" not in t:
        return
    if not (m := _NCCL_ERROR.search(t)):
        return
    after = list(islice(ahead, 5))
    detail = next((x.text.strip() for x in after
                   if x.text.strip() and not x.text.startswith(("Last error", "ncclRe", "ncclSy",
                                                                "ncclUn", "ncclIn"))), "")
    last = any(x.text.startswith("Last error") for x in after[:3])
    kind = m.group(2)
    ev.add("nccl_errors", {"kind": kind, "version": m.group(3), "rank": _rank(line),
                           "host": line.host, "last_error": detail if last else "",
                           "line": t.strip(), "op": ev.collective.get(_rank(line))},
           key=(kind, _rank(line), line.host))


def _last_error(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    """NCCL's `Last error:` pasted without the error above it: the line after it says what."""
    if not (m := _LAST_ERROR.match(t)):
        return
    what = m.group(1).strip()
    if len(what) < 8 and ahead:
        what = ahead[0].text.strip()
    ev.add("last_errors", {"what": what, "rank": _rank(line), "host": line.host},
           key=(what[:80], _rank(line)))


def _oom(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if m := _OOM.search(t):
        ev.add("ooms", {"rank": _rank(line), "host": line.host, "size": m.group(1),
                        "gpu": m.group(2) or m.group(4), "total": m.group(3) or m.group(5),
                        "line": t.strip()}, key=(_rank(line), line.host, m.group(0)))


def _cuda(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if "out of memory" in t and _OOM.search(t):
        return
    if ("CUDA error" in t or "cuda runtime" in t) and (m := _CUDA_ERROR.search(t)) and (
            "Compile with" not in t):
        what = (m.group(1) or m.group(2)).strip()
        ev.add("cuda_errors", {"what": what, "rank": _rank(line), "host": line.host,
                               "line": t.strip()}, key=(what, _rank(line), line.host))


def _xid(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if m := _XID.search(t):
        h = _SYSLOG_HOST.search(t) if "kernel:" in t else None
        host = (h.group(1) if h else None) or line.host
        ev.add("xids", {"pci": m.group(1), "xid": int(m.group(2)), "pid": m.group(3),
                        "name": m.group(4), "cause": int(m.group(5)) if m.group(5) else None,
                        "host": host}, key=(m.group(0),))


def _elastic(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if m := _ELASTIC.search(t):
        ev.add("failures", {"root": False, "rank": None, "local_rank": int(m.group(2)),
                            "host": line.host, "exitcode": int(m.group(1)),
                            "pid": m.group(3), "source": "elastic"},
               key=(m.group(2), m.group(3)))


def _rendezvous(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if m := _RENDEZVOUS.search(t):
        store = _store(m.group(2)) or next(
            (s for x in islice(ahead, 4) if _STORE_LINE.search(x.text)
             and (s := _store(x.text))), None)
        ev.add("rendezvous", {"error": m.group(1), "what": m.group(2).strip(),
                              "store": store, "rank": _rank(line), "host": line.host},
               key=(m.group(1), line.host))


def _store(text: str) -> str | None:
    if m := _STORE_AT.search(text):
        return f"{m.group(1)}:{m.group(2)}" if m.group(1) else f"{m.group(3)}:{m.group(4)}"
    return None


def _store_line(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    """A c10d client that could not reach the store: its address, for the rendezvous finding."""
    if _STORE_LINE.search(t) and (s := _store(t[_STORE_LINE.search(t).start():])) and (
            s not in ev.stores and len(ev.stores) < 16):
        ev.stores.append(s)


def _ray(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if m := _RAY_DIED.search(t):
        ev.add("ray_deaths", {"ip": m.group(1), "pid": m.group(2), "exit": m.group(3)},
               key=(m.group(2),))


def _ray_actor(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if m := _RAY_ACTOR.search(t):
        ev.add("ray_deaths", {"ip": m.group(3), "pid": m.group(2), "exit": m.group(1)},
               key=(m.group(2),))


def _rdzv_node(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    """Dynamic rendezvous failing on a node; the exception it names follows a few lines on."""
    if m := _RDZV_NODE.search(t):
        why = next((r.group(1) for x in ahead if (r := _RAISED.match(x.text))), "")
        ev.add("rendezvous", {"error": m.group(4), "what": f"failed to {m.group(3)} the "
                              f"rendezvous" + (f": {why}" if why else ""), "store": None,
                              "rank": _rank(line), "host": m.group(1), "pid": m.group(2)},
               key=(m.group(4), m.group(1)))


def _bootstrap(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if m := _BOOTSTRAP.search(t):
        o = _NCCL_ORIGIN.search(t)
        host = line.host or (t[:o.start()].split()[-1] if o and o.group(1) and o.start() else None)
        ev.add("bootstrap", {"rank": int(m.group(1)), "nranks": int(m.group(2)), "host": host},
               key=(m.group(1), host))


def _cancelled(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if m := _SLURM_CANCEL.search(t):
        ev.add("cancelled", {"what": m.group(1).lower(), "id": m.group(2), "host": m.group(3),
                             "at": m.group(4), "why": (m.group(5) or "").lower()},
               key=(m.group(2),))


def _signal(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    m, groups = next(((m, g) for rx, g in _SIGNAL_FORMS if (m := rx.search(t))), (None, None))
    if m is None:
        return
    gnum, gname, ghost, gpid = groups
    what = m.group(gname).strip() if gname else SIGNALS.get(int(m.group(gnum)), "signal")
    num = int(m.group(gnum)) if gnum else _SIGNAL_NAMES.get(what) or next(
        (n for n, s in SIGNALS.items() if s == what), None)
    host = (m.group(ghost) if ghost else None) or line.host
    pid = m.group(gpid) if gpid else None
    name = SIGNALS.get(num, what) if num else what
    ev.add("signals", {"signal": name, "what": what, "number": num, "rank": _rank(line),
                       "host": host, "pid": pid, "worker": "is killed by signal" in t,
                       "agent": "received by PID" in t or "death signal" in t,
                       "line": t.strip()},
           key=(name, _rank(line), host, pid))
    if pid is not None:
        ev.job.note(_rank(line), host, pid)


def _stall(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    """Horovod's stall inspector names, per tensor, the ranks missing (newer) or the ranks ready
    (older: the missing ones are the rest)."""
    for m in _STALL.finditer(t):
        named = [int(x) for x in m.group(3).replace(" ", "").split(",") if x]
        ready = m.group(2) == "ready"
        ev.add("stalls", {"ranks": [] if ready else named, "ready": named if ready else [],
                          "op": m.group(1).removeprefix("ops:"), "rank": _rank(line),
                          "host": line.host},
               key=(m.group(3), m.group(1)))


def _endpoint(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    """torchrun's --rdzv_endpoint, as its launch configuration prints it: where the store is."""
    if (m := _ENDPOINT.search(t)) and m.group(1) not in ev.stores and len(ev.stores) < 16:
        ev.stores.append(m.group(1))


def _ibv(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    if not (m := _IBV.search(t)):
        return
    text = m.group(2).strip().rstrip(".")
    name = (_ERRNO_NUMS.get(int(m.group(3))) if m.group(3) else None) or next(
        (v for k, v in _ERRNOS.items() if k.lower() in t.lower()), None)
    o = _NCCL_ORIGIN.search(t)
    ev.add("ibv", {"call": m.group(1), "errno": name, "error": text, "rank": _rank(line),
                   "host": line.host, "pid": o.group(1) if o and o.group(1) else None,
                   "line": _from_origin(ev, line, t).strip()},
           key=(m.group(1), name, _rank(line), line.host))


def _collective(ev: Events, line: Line, t: str, ahead: deque, facts: dict) -> None:
    """The collective a rank's traceback was in (the innermost named frame wins)."""
    if (m := _TB_COLL.search(t)) and len(ev.collective) < _CAP:
        name = m.group(1) or m.group(2)
        if name not in _NOT_COLL and not name.startswith("_"):
            ev.collective[_rank(line)] = name


# (trigger word, reader): a reader runs only on lines holding its word
_READERS = [
    ("atchdog caught", _watchdog), ("by watchdog", _work), ("dump signal", _dump),
    ("stuck for", _stuck), ("rror", _nccl_error), ("failed:", _nccl_error),
    ("Last error", _last_error), ("out of memory", _oom), ("rror", _cuda), ("Xid", _xid),
    ("exitcode", _elastic), ("Dist", _rendezvous), ("Rendezvous", _rendezvous),
    ("connect to", _store_line), ("Connection to", _store_line), ("TCPStore(", _store_line),
    ("worker died", _ray), ("ignal", _signal), ("Fatal Python", _signal),
    ("issing ranks", _stall), ("ready ranks", _stall), ("ibv_", _ibv),
    ("rdzv_endpoint", _endpoint), ("RayTaskError", _ray_actor), ("the rendezvous", _rdzv_node),
    ("checked in", _bootstrap), ("CANCELLED", _cancelled),
    ("distributed_c10d", _collective), ("work = ", _collective),
]


def _failure(e: dict) -> dict:
    rank = re.match(r"(\d+)(?: \(local_rank: (\d+)\))?", e.get("rank", ""))
    code = re.match(r"(-?\d+)(?: \(pid: (\d+)\))?", e.get("exitcode", ""))
    return {"root": e["root"], "rank": int(rank.group(1)) if rank else None,
            "local_rank": int(rank.group(2)) if rank and rank.group(2) else None,
            "host": e.get("host"), "exitcode": int(code.group(1)) if code else None,
            "pid": code.group(2) if code else None, "time": e.get("time"),
            "traceback": e.get("traceback", "")}


# --------------------------------------------------------------------------- findings


