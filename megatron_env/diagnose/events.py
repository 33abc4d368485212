"""What a job's console lines hold: every signature of PyTorch, torchrun, CUDA, the kernel and
NCCL recognised, in order of appearance (megatron_env.diagnose.triage judges them)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from megatron_env.diagnose.joblog import Line

_WATCHDOG = re.compile(
    r"\[Rank (\d+)\] Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), "
    r"OpType=(\w+)(?:, NumelIn=(\d+), NumelOut=(\d+))?, Timeout\(ms\)=(\d+)\) ran for (\d+) "
    r"milliseconds")
_WORK = re.compile(r"detected by watchdog at work(?: sequence id)?: (\d+),? (?:PG status: )?last "
                   r"enqueued (?:NCCL )?work: (-?\d+), last completed (?:NCCL )?work: (-?\d+)")
_STUCK = re.compile(r"watchdog got stuck for (\d+) seconds")
_DUMP_FROM = re.compile(r"dump signal due to a collective timeout from\s+rank (\d+)")
_RANK_IN_TEXT = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")
_DESYNC_HEAD = "lagging/dead/mismatched ranks that caused the desync are"
_DESYNC_ENTRY = re.compile(r"^\s*-?\s*\[(?:Rank )?(\d+(?:, \d+)*)\] (.+)$")
_DESYNC_AT = re.compile(r"Timeout at collective: (\w+), #(\d+)")
_NCCL_ERROR = re.compile(
    r"NCCL error(?: in: \S+?,| \S+)? '?(unhandled system error|remote process exited or there "
    r"was a network error|unhandled cuda error|internal error|invalid usage|invalid argument)"
    r"(?:[^,]*, NCCL version ([\w.+]+))?")
_CUDA_ERROR = re.compile(r"CUDA error: ([^.\n]+?)(?:\.|$)|cuda runtime error \(\d+\) : ([^.\n]+?)"
                         r"(?: at |$)")
_OOM = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]iB)(?: \(GPU (\d+); "
                  r"([\d.]+ [KMGT]iB) total capacity|\. GPU (\d+) has a total capac\w* of "
                  r"([\d.]+ [KMGT]iB))?")
_XID = re.compile(r"NVRM: Xid \((PCI:[\w:.]+)\): (\d+)(?:, pid=(\d+))?(?:, name=([^,\s]+))?"
                  r"(?:.*caused by previous Xid (\d+))?")
_SYSLOG_HOST = re.compile(r"^\w{3}\s+\d+ [\d:]+ (\S+) kernel:")
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


@dataclass
class Events:
    timeouts: list[dict] = field(default_factory=list)
    work: dict[int, str] = field(default_factory=dict)  # rank -> watchdog's work status
    first_timeout: set[int] = field(default_factory=set)  # "dump signal ... from rank N"
    stuck: list[dict] = field(default_factory=list)  # the heartbeat monitor's verdict
    desync: list[str] = field(default_factory=list)
    desync_lagging: list[tuple[list[int], str]] = field(default_factory=list)
    nccl_errors: list[dict] = field(default_factory=list)
    cuda_errors: list[dict] = field(default_factory=list)
    ooms: list[dict] = field(default_factory=list)
    xids: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)  # torchrun's failure table
    ranks_seen: set[int] = field(default_factory=set)
    text: list[str] = field(default_factory=list)  # every line, for the NCCL_DEBUG analysis
    sources: set[str] = field(default_factory=set)
    lines: int = 0


def _rank(line: Line) -> int | None:
    m = _RANK_IN_TEXT.search(line.text)
    return int(m.group(1)) if m else line.rank


def events(lines: list[Line]) -> Events:
    """Everything recognised in the lines, in order of appearance."""
    ev = Events(lines=len(lines))
    in_desync = False
    entry: dict | None = None
    root = False
    for i, line in enumerate(lines):
        t = line.text
        ev.sources.add(line.source)
        if line.rank is not None:
            ev.ranks_seen.add(line.rank)
        ev.text.append(t)
        if m := _WATCHDOG.search(t):
            ev.timeouts.append({
                "rank": int(m.group(1)), "seq": int(m.group(2)), "op": m.group(3),
                "numel_in": int(m.group(4)) if m.group(4) else None,
                "numel_out": int(m.group(5)) if m.group(5) else None,
                "timeout_ms": int(m.group(6)), "ran_ms": int(m.group(7)), "host": line.host})
        if (m := _WORK.search(t)) and (r := _rank(line)) is not None:
            ev.work[r] = (f"failed at work {m.group(1)}, last enqueued {m.group(2)}, last "
                          f"completed {m.group(3)}")
        if m := _STUCK.search(t):
            ev.stuck.append({"rank": _rank(line), "host": line.host,
                             "seconds": int(m.group(1))})
        if m := _DUMP_FROM.search(t):
            ev.first_timeout.add(int(m.group(1)))
        if _DESYNC_HEAD in t:
            in_desync = True
            prev = lines[i - 1].text if i else ""
            if m := _DESYNC_AT.search(prev):
                ev.desync.append(f"timeout at collective {m.group(1)} #{m.group(2)}")
            continue
        if in_desync:
            if m := _DESYNC_ENTRY.match(t):
                ev.desync_lagging.append(([int(x) for x in m.group(1).split(", ")], m.group(2)))
                continue
            in_desync = False
        if "Snapshot of ranks' latest states" in t:
            for x in lines[i + 1:i + 9]:
                if not x.text.startswith(" "):
                    break
                ev.desync.append(x.text.strip())
        if m := _NCCL_ERROR.search(t):
            detail = next((x.text.strip() for x in lines[i + 1:i + 6]
                           if x.text.strip() and not x.text.startswith(("Last error", "ncclRe",
                                                                         "ncclSy", "ncclUn",
                                                                         "ncclIn"))), "")
            last = any(x.text.startswith("Last error") for x in lines[i + 1:i + 4])
            ev.nccl_errors.append({"kind": m.group(1), "version": m.group(2),
                                   "rank": _rank(line), "host": line.host,
                                   "last_error": detail if last else "", "line": t.strip()})
        if m := _OOM.search(t):
            ev.ooms.append({"rank": _rank(line), "host": line.host, "size": m.group(1),
                            "gpu": m.group(2) or m.group(4), "total": m.group(3) or m.group(5),
                            "line": t.strip()})
        elif (m := _CUDA_ERROR.search(t)) and "Compile with" not in t:
            ev.cuda_errors.append({"what": (m.group(1) or m.group(2)).strip(),
                                   "rank": _rank(line), "host": line.host, "line": t.strip()})
        if m := _XID.search(t):
            host = (h.group(1) if (h := _SYSLOG_HOST.match(t)) else None) or line.host
            ev.xids.append({"pci": m.group(1), "xid": int(m.group(2)), "pid": m.group(3),
                            "name": m.group(4),
                            "cause": int(m.group(5)) if m.group(5) else None, "host": host})
        if "Root Cause (first observed failure)" in t:
            root = True
        elif t.strip() == "Failures:":
            root = False
        if m := _ENTRY.match(t):
            entry = {"root": root}
            continue
        if entry is not None and (m := _FIELD.match(t)):
            entry[m.group(1)] = m.group(2).strip()
            if m.group(1) == "traceback":
                ev.failures.append(_failure(entry))
                entry = None
        if m := _ELASTIC.search(t):
            ev.failures.append({"root": False, "rank": None, "local_rank": int(m.group(2)),
                                "host": line.host, "exitcode": int(m.group(1)),
                                "pid": m.group(3), "source": "elastic"})
    ev.failures = [f for f in ev.failures if f.get("rank") is not None
                   or f.get("local_rank") is not None]
    return ev


def _failure(e: dict) -> dict:
    rank = re.match(r"(\d+)(?: \(local_rank: (\d+)\))?", e.get("rank", ""))
    code = re.match(r"(-?\d+)(?: \(pid: (\d+)\))?", e.get("exitcode", ""))
    return {"root": e["root"], "rank": int(rank.group(1)) if rank else None,
            "local_rank": int(rank.group(2)) if rank and rank.group(2) else None,
            "host": e.get("host"), "exitcode": int(code.group(1)) if code else None,
            "pid": code.group(2) if code else None, "time": e.get("time"),
            "traceback": e.get("traceback", "")}


# --------------------------------------------------------------------------- findings


