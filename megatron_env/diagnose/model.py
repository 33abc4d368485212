"""The job model events are gathered into: who each process is (rank, host, GPU, pid), and
everything the signature readers (`sig_*`) recognised, each event with its position and, when
the line carries one, its time (so that the first error in time can be told from the last
printed). Pure data and small helpers; nothing here reads a log."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from megatron_env.diagnose import nccl_log
from megatron_env.diagnose.joblog import Line, local_rank

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


RECENT = 48  # lines read before an event searched for its time (a traceback's head)
CAP = 2000  # events kept of one kind: a week of logs repeats the same few many times
_NCCL_BATCH = 5000  # NCCL lines analysed together (verify_nccl.py's analysis), then merged
# NCCL's "host:pid:tid [dev]" origin, found by its literal part (a search for the host name
# first would try every position of the line)
NCCL_ORIGIN = re.compile(r":(\d+):\d+ \[(\d+)\]| \[(\d+)\] \S+:\d+ WARN")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.<>-")
_RANK_IN_TEXT = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")
_INIT = re.compile(r"comm 0x[0-9a-f]+ rank (\d+) nranks \d+ cudaDev (\d+)")
# a line's own time, in the forms logs print it: ISO (Python logging, Docker, k8s), glog
# (`[E429 06:01:12.977`, `E0429 06:01:12.977`), syslog/dmesg -T (`Mar 14 01:57:54`)
_ISO = re.compile(r"(20\d\d)-(\d\d)-(\d\d)[ T_](\d\d:\d\d:\d\d(?:[.,]\d+)?)")
_GLOG = re.compile(r"\b[EWIF](\d\d)(\d\d) (\d\d:\d\d:\d\d(?:\.\d+)?)")
_MONTHS = {m: i + 1 for i, m in enumerate(["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul",
                                           "Aug", "Sep", "Oct", "Nov", "Dec"])}
_SYSLOG = re.compile(r"\b(" + "|".join(_MONTHS) + r") +(\d{1,2}) (\d\d:\d\d:\d\d)")

@dataclass
class Job:
    """One model of the job's processes: rank, host, local GPU and pid, put together from every
    line kind that names two of them (NCCL's `host:pid:tid [gpu]` origin, a `[rankN]` tag, NCCL's
    `comm ... rank N ... cudaDev G` init line, torchrun's failure table, UCX's `[host:pid]`)."""

    by_rank: dict[int, dict[str, Any]] = field(default_factory=dict)
    by_pid: dict[str, dict[str, Any]] = field(default_factory=dict)
    _noted: set[Any] = field(default_factory=set)

    def note(self, rank: int | None = None, host: str | None = None, pid: str | None = None,
             gpu: int | None = None) -> None:
        key = (rank, host, pid, gpu)
        if key in self._noted or len(self._noted) >= CAP:
            return
        self._noted.add(key)
        if pid is not None and len(self.by_pid) < CAP:
            p = self.by_pid.setdefault(pid, {})
            if host and p.get("host") not in (None, host):  # pids repeat across hosts
                return
            _fill(p, rank=rank, host=host, gpu=gpu)
            rank = rank if rank is not None else p.get("rank")
            host, gpu = host or p.get("host"), gpu if gpu is not None else p.get("gpu")
        if rank is not None and len(self.by_rank) < CAP:
            _fill(self.by_rank.setdefault(rank, {}), host=host, pid=pid, gpu=gpu)

    def who(self, rank: int | None = None, host: str | None = None,
            pid: str | None = None) -> dict[str, Any]:
        """All that is known of one process from any one or two of rank, host and pid."""
        out: dict[str, Any] = {"rank": rank, "host": host, "pid": pid, "gpu": None}
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


def _fill(d: dict[str, Any], **kw: Any) -> None:
    for k, v in kw.items():
        if v is not None and d.get(k) is None:
            d[k] = v


def describe(p: dict[str, Any]) -> str:
    """'rank 3 on node5 (GPU 3, pid 240)': what a finding says of one process."""
    head = " on ".join(x for x in (f"rank {p['rank']}" if p.get("rank") is not None else "",
                                   p.get("host") or "") if x) or "a process"
    more = ", ".join(x for x in (f"GPU {p['gpu']}" if p.get("gpu") is not None else "",
                                 f"pid {p['pid']}" if p.get("pid") else "") if x)
    return head + (f" ({more})" if more else "")


@dataclass(kw_only=True)
class Placed:
    """Where an event stands: its file, first physical line, order of reading (the physical
    line count when it was read), its own time and the local rank of a role tag. `Events.add`
    fills what the event's line says where the event did not set it."""

    source: str | None = None
    number: int | None = None
    seq: int | None = None
    time: str | None = None
    local: int | None = None


@dataclass(kw_only=True)
class Failure(Placed):
    """One process of a launcher's failure report: an entry of torchrun's table, its agent's
    `failed (exitcode: N) local_rank: L (pid: P)`, DeepSpeed's launcher's failed command."""

    root: bool = False  # under torchrun's "Root Cause (first observed failure)"
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    exitcode: int | None = None
    pid: str | None = None
    traceback: str = ""
    launcher: str = "torchrun"


@dataclass(kw_only=True)
class End(Placed):
    """A line that says how the run ended well (`sig_end`): its own end line, or (`exit`) the
    exit path of a process that ended on its own."""

    line: str = ""
    rank: int | None = None
    exit: bool = False


@dataclass(kw_only=True)
class Failing(Placed):
    """A line that looks like a failure without a signature of its own (`job.unrecognised`
    quotes it; `rootcause` takes a rank's exception from it): an exception ending a traceback,
    an error line, a launcher's non-zero exit code, a failing pod."""

    kind: str = "error"  # "exception", "error", "exit" or "pod"
    line: str = ""
    rank: int | None = None
    host: str | None = None
    name: str = ""  # an exception's class
    where: str = ""  # an exception's: "user" (the training code) or "framework" (a package)
    frame: str = ""  # an exception's innermost frame, file:line
    code: int | None = None  # an exit code
    tasks: list[int] = field(default_factory=list)  # srun's task ids


@dataclass(kw_only=True)
class Who(Placed):
    """An event of one process, as far as its line says which: rank, host, pid."""

    rank: int | None = None
    host: str | None = None
    pid: str | None = None


@dataclass(kw_only=True)
class Timeout(Placed):
    """NCCL's watchdog: a collective that timed out (`WorkNCCL(SeqNum=..., OpType=...)`): its
    rank (the launcher's tag, else its `[Rank N]`), always known."""

    rank: int
    host: str | None = None
    pid: str | None = None
    pg_rank: int | None = None  # the `[Rank N]` inside its process group
    seqnum: int
    op: str
    numel_in: int | None = None
    numel_out: int | None = None
    timeout_ms: int = 0
    ran_ms: int = 0


@dataclass(kw_only=True)
class Stuck(Who):
    """The heartbeat monitor: a watchdog stuck for `seconds`."""

    seconds: int = 0


@dataclass(kw_only=True)
class NcclError(Who):
    kind: str = ""
    version: str | None = None
    last_error: str = ""
    line: str = ""
    op: str | None = None


@dataclass(kw_only=True)
class LastError(Who):
    """NCCL's `Last error:` on a line of its own."""

    what: str = ""


@dataclass(kw_only=True)
class CudaError(Who):
    what: str = ""
    line: str = ""


@dataclass(kw_only=True)
class Oom(Who):
    """CUDA out of memory: the size asked for, the GPU and its total."""

    size: str = ""
    gpu: str | None = None
    total: str | None = None
    line: str = ""


@dataclass(kw_only=True)
class Xid(Who):
    pci: str = ""
    xid: int = 0
    name: str | None = None
    cause: int | None = None


@dataclass(kw_only=True)
class Rendezvous(Who):
    error: str = ""
    what: str = ""
    store: str | None = None


@dataclass(kw_only=True)
class RayDeath(Placed):
    ip: str = ""
    pid: str = ""
    exit: str | None = None


@dataclass(kw_only=True)
class Bootstrap(Who):
    """NCCL's root: a rank checked in twice."""

    nranks: int = 0


@dataclass(kw_only=True)
class Cancelled(Placed):
    """Slurm cancelled the step or job (`*** STEP 1.0 ON host CANCELLED AT ... ***`)."""

    what: str = ""
    id: str = ""
    host: str = ""
    at: str = ""
    why: str = ""


@dataclass(kw_only=True)
class Signal(Who):
    """A process a signal killed: the signal's name, the words that said it, its number."""

    signal: str = ""
    what: str = ""
    number: int | None = None
    code: int | None = None  # the exit code that said it
    tasks: list[int] = field(default_factory=list)  # srun's task ids
    worker: bool = False  # a DataLoader worker
    agent: bool = False  # sent to the agent from outside
    table: bool = False  # from a launcher's failure table
    line: str = ""


@dataclass(kw_only=True)
class Stall(Who):
    """Horovod's stall inspector: ranks missing (or ready) for a tensor op."""

    ranks: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    op: str = ""


@dataclass(kw_only=True)
class Ibv(Who):
    """A failed ibv_* call and its errno."""

    call: str = ""
    errno: str | None = None
    error: str = ""
    line: str = ""


@dataclass(kw_only=True)
class Hit(Who):
    """A line of the families' table (`sig_table`): its finding id, kind within it, what it
    says."""

    id: str = ""
    kind: str = ""
    what: str = ""
    pci: str | None = None
    store: str | None = None
    tasks: list[int] = field(default_factory=list)
    line: str = ""


Event = TypeVar("Event", bound=Placed)
T = TypeVar("T")


def _time(x: Placed) -> str | None:
    return x.time


def _seq(x: Placed) -> int:
    return x.seq or 0


@dataclass(frozen=True)
class Lagging:
    """One entry of PyTorch's desync report: the ranks it names and what they were doing."""

    ranks: list[int]
    what: str


@dataclass
class Events:
    timeouts: list[Timeout] = field(default_factory=list)
    work: dict[int, str] = field(default_factory=dict)  # rank -> watchdog's work status
    first_timeout: set[int] = field(default_factory=set)  # "dump signal ... from rank N"
    dump_seen_by: set[int] = field(default_factory=set)  # ranks that received that signal
    stuck: list[Stuck] = field(default_factory=list)  # the heartbeat monitor's verdict
    desync: list[str] = field(default_factory=list)
    desync_lagging: list[Lagging] = field(default_factory=list)
    nccl_errors: list[NcclError] = field(default_factory=list)
    # NCCL's "Last error:" on its own
    last_errors: list[LastError] = field(default_factory=list)
    cuda_errors: list[CudaError] = field(default_factory=list)
    ooms: list[Oom] = field(default_factory=list)
    xids: list[Xid] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)  # launchers' failure reports
    rendezvous: list[Rendezvous] = field(default_factory=list)
    stores: list[str] = field(default_factory=list)  # store addresses a client failed to reach
    ray_deaths: list[RayDeath] = field(default_factory=list)
    # NCCL's root: a rank checked in twice
    bootstrap: list[Bootstrap] = field(default_factory=list)
    cancelled: list[Cancelled] = field(default_factory=list)  # Slurm cancelled the step/job
    signals: list[Signal] = field(default_factory=list)  # processes a signal killed
    stalls: list[Stall] = field(default_factory=list)  # Horovod's stall inspector
    ibv: list[Ibv] = field(default_factory=list)  # failed ibv_* calls, by errno
    collective: dict[int | None, str] = field(default_factory=dict)  # rank -> traceback's op
    job: Job = field(default_factory=Job)
    ranks_seen: set[int] = field(default_factory=set)
    # verify_nccl.py's analysis of the NCCL lines, batches merged
    nccl: dict[str, Any] | None = None
    # file -> what says which job it is
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the families' table signatures (sig_table)
    hits: list[Hit] = field(default_factory=list)
    # failure-looking lines, no signature yet
    failing: list[Failing] = field(default_factory=list)
    ends: list[End] = field(default_factory=list)  # normal ends (launchers, trainers)
    # rank -> its traceback no exception line has closed yet: its last line (a frame), when it
    # was read, the frame (file:line); made a failure only if the logs end with it open
    tracebacks: dict[int | None, tuple[Line, int, str]] = field(default_factory=dict)
    prompts: list[str] = field(default_factory=list)  # hosts of shell prompts in the log
    pods: list[str] = field(default_factory=list)  # kubectl's pod rows: the pods named
    # the logs' last lines (jobs.read: `end_state`)
    tail: dict[str, Any] = field(default_factory=dict)
    lines: int = 0
    current: Line | None = None  # the line being read (`add` places its events there)
    recent: deque[Line] = field(default_factory=lambda: deque(maxlen=RECENT))
    _batch: list[str] = field(default_factory=list)
    _seen: set[Any] = field(default_factory=set)

    def add(self, item: Placed, key: tuple[Any, ...] | None = None) -> None:
        """Keep an event in its kind's list unless `CAP` of its kind are kept or the same one
        was (by `key`), placed where the line being read stands."""
        items = self._list(item)
        if len(items) >= CAP or (key is not None and (type(item), *key) in self._seen):
            return
        if key is not None:
            self._seen.add((type(item), *key))
        self.place(item)
        items.append(item)

    def _list(self, item: Placed) -> list[Any]:
        """The list an event of this type is kept in."""
        keep = _LISTS.get(type(item))
        if keep is None:
            raise TypeError(f"no list keeps {type(item).__name__}")
        return keep(self)

    def place(self, item: Placed) -> None:
        """Fill where an event stands from the line being read, where it did not say."""
        if item.seq is None and self.current is not None:
            for k, v in self.at(self.current).items():
                if getattr(item, k) is None:
                    setattr(item, k, v)

    def keep(self, items: list[T], item: T) -> None:
        """Keep a fact that is no event (a line of a report, quoted) in `items` (one of the
        lists here): capped, never placed."""
        if len(items) < CAP:
            items.append(item)

    def at(self, line: Line) -> dict[str, Any]:
        """Where an event stands: its file, line number, order of reading and own time."""
        time = stamp(line.raw or line.text)
        if time is None:  # a traceback's last line: the time of its rank's last stamped line
            time = next((t for x in reversed(self.recent) if x.rank == line.rank
                         and (t := stamp(x.raw or x.text))), None)
        return {"source": line.source, "number": line.number, "seq": self.lines, "time": time,
                "local": local_rank(line.raw) if line.raw else None}

    def nccl_line(self, text: str) -> None:
        self._batch.append(text)
        if len(self._batch) >= _NCCL_BATCH:
            self.flush()

    def flush(self) -> None:
        if self._batch:
            self.nccl = nccl_log.merge(self.nccl, nccl_log.analyze("\n".join(self._batch)))
            self._batch = []

    def who(self, e: Who | Timeout | Failure) -> dict[str, Any]:
        """An event's process with all the job model adds to it (and the host, when every
        process the logs name ran on one)."""
        p = self.job.who(e.rank, e.host, e.pid)
        if p["host"] is None:
            hosts = {x.get("host") for x in self.job.by_pid.values()}
            if len(hosts) == 1:
                p["host"] = hosts.pop()
        return p


# each event type's list in `Events` (what `Events.add` keeps an event in)
_LISTS: dict[type[Placed], Callable[[Events], list[Any]]] = {
    Timeout: lambda ev: ev.timeouts,
    Stuck: lambda ev: ev.stuck,
    NcclError: lambda ev: ev.nccl_errors,
    LastError: lambda ev: ev.last_errors,
    CudaError: lambda ev: ev.cuda_errors,
    Oom: lambda ev: ev.ooms,
    Xid: lambda ev: ev.xids,
    Rendezvous: lambda ev: ev.rendezvous,
    RayDeath: lambda ev: ev.ray_deaths,
    Bootstrap: lambda ev: ev.bootstrap,
    Cancelled: lambda ev: ev.cancelled,
    Signal: lambda ev: ev.signals,
    Stall: lambda ev: ev.stalls,
    Ibv: lambda ev: ev.ibv,
    Hit: lambda ev: ev.hits,
    Failure: lambda ev: ev.failures,
    Failing: lambda ev: ev.failing,
}


def new_facts() -> dict[str, Any]:
    """What tells one file's job from another's (see `jobs`)."""
    return {"ranks": set(), "timeout_ms": set(), "dates": set()}


def from_origin(ev: Events, line: Line, t: str) -> str:
    """An NCCL line from its `host:pid:tid [dev]` on (whatever prefix came before it); the
    origin's host, pid and GPU go into the job model with the line's rank tag."""
    o = NCCL_ORIGIN.search(t)
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


def rank_of(line: Line) -> int | None:
    """The global rank: the launcher's tag, else `[Rank N]` in the text (which, in a process
    group other than the default one, is the rank inside that group)."""
    if line.rank is not None:
        return line.rank
    m = _RANK_IN_TEXT.search(line.text)
    return int(m.group(1)) if m else None


def stamp(text: str) -> str | None:
    """The line's own time as a string that sorts within one form ('2023-04-29 06:01:12.977',
    '04-29 06:01:12.977' for glog's yearless form), or None."""
    if "-" in text and (m := _ISO.search(text)):
        return f"{m.group(1)}-{m.group(2)}-{m.group(3)} {m.group(4).replace(',', '.')}"
    if m := _GLOG.search(text):
        return f"{m.group(1)}-{m.group(2)} {m.group(3)}"
    if m := _SYSLOG.search(text):
        return f"{_MONTHS[m.group(1)]:02d}-{int(m.group(2)):02d} {m.group(3)}"
    return None


def _comparable(items: Sequence[Placed]) -> bool:
    """Does every event have a time, all of one form (so that they sort by it)?"""
    times = [_time(x) for x in items]
    return all(times) and len({len(t.split(" ")[0]) for t in times if t}) == 1


def first(items: Sequence[Event]) -> Event:
    """The event that happened first: by the lines' own time when every one has a time of the
    same form, else the first read (the order a log was printed in)."""
    if _comparable(items):
        return min(items, key=lambda x: (_time(x) or "", _seq(x)))
    return min(items, key=_seq)


def in_time_order(items: Sequence[Event]) -> list[Event]:
    """The events, first in time first (see `first`)."""
    if _comparable(items):
        return sorted(items, key=lambda x: (_time(x) or "", _seq(x)))
    return sorted(items, key=_seq)
