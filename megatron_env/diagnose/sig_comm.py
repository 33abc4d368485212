"""Signatures of the communication family: PyTorch's NCCL watchdog and flight recorder, NCCL's
own errors, Horovod's stall inspector, failed ibverbs calls, the collective a traceback was in,
and NCCL's bootstrap root. Each reader runs only on lines holding its trigger word (`READERS`)."""

from __future__ import annotations

import re
from collections import deque
from itertools import islice
from typing import Any

from megatron_env.diagnose.joblog import Line
from megatron_env.diagnose.model import (
    CAP,
    NCCL_ORIGIN,
    Bootstrap,
    Events,
    Ibv,
    LastError,
    NcclError,
    Stall,
    Stuck,
    Timeout,
    from_origin,
    rank_of,
)

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
DESYNC_HEAD = "lagging/dead/mismatched ranks that caused the desync are"
DESYNC_ENTRY = re.compile(r"^\s*-?\s*\[(?:Rank )?(\d+(?:, \d+)*)\] (.+)$")
DESYNC_AT = re.compile(r"Timeout at collective: (\w+), #(\d+)")
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
_STALL = re.compile(r"(\S+) \[(missing|ready) ranks: ([\d, ]+)\]")
STALL_BLOCK = re.compile(r"^\s*(\d+): \[(\S+?)[,\]]")  # "Missing ranks:\n1: [op, ...]"
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
# (faulthandler prints `File "...distributed_c10d.py", line 2430 in all_reduce`, no comma)
_TB_COLL = re.compile(r"distributed_c10d\.py\", line \d+,? in ([a-z]\w+)"
                      r"|work = \w+\.(\w+)\(")
# the collective in a native stack (gdb, UCX, c10d's C++ traceback: innermost first), as NCCL's
# API or ProcessGroupNCCL's method names it
_NATIVE_COLL = re.compile(r"\bp?nccl(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|AllToAll|"
                          r"Send|Recv)\b|ProcessGroupNCCL::(allreduce\w*|allgather\w*|"
                          r"_allgather_base|broadcast|reduce_scatter\w*|_reduce_scatter_base|"
                          r"barrier|alltoall\w*|send|recv|reduce)\b")
_NOT_COLL = frozenset({"wrapper", "new_group", "init_process_group", "destroy_process_group",
                       "get_rank", "get_world_size", "new_subgroups"})
_BOOTSTRAP = re.compile(r"Bootstrap Root : rank (\d+) of (\d+) ranks has already checked in")
_LAST_ERROR = re.compile(r"^\s*Last error:\s*(.*)")
def _watchdog(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _WATCHDOG.search(t):
        rank = rank_of(line)
        pg = int(m.group(1))
        facts["timeout_ms"].add(int(m.group(6)))
        ev.add(Timeout(
            rank=rank if rank is not None else pg, pg_rank=pg, seqnum=int(m.group(2)),
            op=m.group(3), numel_in=int(m.group(4)) if m.group(4) else None,
            numel_out=int(m.group(5)) if m.group(5) else None,
            timeout_ms=int(m.group(6)), ran_ms=int(m.group(7) or 0), host=line.host),
            key=(rank if rank is not None else pg, int(m.group(2)), m.group(3)))


def _work(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if (m := _WORK.search(t)) and (r := rank_of(line)) is not None and len(ev.work) < CAP:
        ev.work[r] = (f"failed at work {m.group(1)}, last enqueued {m.group(2)}, last "
                      f"completed {m.group(3)}")


def _dump(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if "by watchdog" not in t and (m := _DUMP_WORK.search(t)) and (
            r := rank_of(line)) is not None and len(ev.work) < CAP:
        ev.work.setdefault(r, f"last enqueued {m.group(1)}, last completed {m.group(2)}")
    if (m := _DUMP_FROM.search(t)) and len(ev.first_timeout) < CAP:
        ev.first_timeout.add(int(m.group(1)))
        if (r := rank_of(line)) is not None:
            ev.dump_seen_by.add(r)


def _stuck(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _STUCK.search(t):
        ev.add(Stuck(rank=rank_of(line), host=line.host, seconds=int(m.group(1))),
               key=(rank_of(line), line.host))


def _nccl_error(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
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
    ev.add(NcclError(kind=kind, version=m.group(3), rank=rank_of(line), host=line.host,
                     last_error=detail if last else "", line=t.strip(),
                     op=ev.collective.get(rank_of(line))),
           key=(kind, rank_of(line), line.host))


def _last_error(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """NCCL's `Last error:` pasted without the error above it: the line after it says what."""
    if not (m := _LAST_ERROR.match(t)):
        return
    what = m.group(1).strip()
    if len(what) < 8 and ahead:
        what = ahead[0].text.strip()
    ev.add(LastError(what=what, rank=rank_of(line), host=line.host),
           key=(what[:80], rank_of(line)))


def _bootstrap(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _BOOTSTRAP.search(t):
        o = NCCL_ORIGIN.search(t)
        host = line.host or (t[:o.start()].split()[-1] if o and o.group(1) and o.start() else None)
        ev.add(Bootstrap(rank=int(m.group(1)), nranks=int(m.group(2)), host=host),
               key=(m.group(1), host))


def _stall(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """Horovod's stall inspector names, per tensor, the ranks missing (newer) or the ranks ready
    (older: the missing ones are the rest)."""
    for m in _STALL.finditer(t):
        named = [int(x) for x in m.group(3).replace(" ", "").split(",") if x]
        ready = m.group(2) == "ready"
        ev.add(Stall(ranks=[] if ready else named, ready=named if ready else [],
                     op=m.group(1).removeprefix("ops:"), rank=rank_of(line), host=line.host),
               key=(m.group(3), m.group(1)))


def _ibv(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if not (m := _IBV.search(t)):
        return
    text = m.group(2).strip().rstrip(".")
    name = (_ERRNO_NUMS.get(int(m.group(3))) if m.group(3) else None) or next(
        (v for k, v in _ERRNOS.items() if k.lower() in t.lower()), None)
    o = NCCL_ORIGIN.search(t)
    ev.add(Ibv(call=m.group(1), errno=name, error=text, rank=rank_of(line), host=line.host,
               pid=o.group(1) if o and o.group(1) else None,
               line=from_origin(ev, line, t).strip()),
           key=(m.group(1), name, rank_of(line), line.host))


def _collective(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """The collective a rank's traceback was in (the innermost named frame wins)."""
    if (m := _TB_COLL.search(t)) and len(ev.collective) < CAP:
        name = m.group(1) or m.group(2)
        if name not in _NOT_COLL and not name.startswith("_"):
            ev.collective[rank_of(line)] = name


def _native(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """The collective of a native stack: its innermost frame is printed first, so the first
    one seen of a rank stays."""
    if (m := _NATIVE_COLL.search(t)) and len(ev.collective) < CAP:
        ev.collective.setdefault(rank_of(line), m.group(1) or m.group(2))


# (trigger word, reader): a reader runs only on lines holding its word


READERS = [
    ("atchdog caught", _watchdog), ("by watchdog", _work), ("dump signal", _dump),
    ("stuck for", _stuck), ("rror", _nccl_error), ("failed:", _nccl_error),
    ("Last error", _last_error), ("issing ranks", _stall), ("ready ranks", _stall),
    ("ibv_", _ibv), ("checked in", _bootstrap), ("distributed_c10d", _collective),
    ("work = ", _collective), ("ProcessGroupNCCL::", _native),
    *((f"nccl{op}", _native) for op in ("AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                         "AllToAll", "Send", "Recv")),
]
