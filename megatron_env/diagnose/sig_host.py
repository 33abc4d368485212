"""Signatures of the GPU and CUDA runtime: CUDA errors, GPU out-of-memory, the driver's Xid
lines."""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from megatron_env.diagnose.joblog import Line
from megatron_env.diagnose.model import CudaError, Events, Oom, Xid, rank_of

_CUDA_ERROR = re.compile(r"CUDA error: ([^.\n]+?)(?:\.|$)|cuda runtime error \(\d+\) : ([^.\n]+?)"
                         r"(?: at |$)")
_OOM = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]iB)(?: \(GPU (\d+); "
                  r"([\d.]+ [KMGT]iB) total capacity|\. GPU (\d+) has a total capac\w* of "
                  r"([\d.]+ [KMGT]iB))?")
_XID = re.compile(r"NVRM: Xid \((PCI:[\w:.]+)\): (\d+)(?:, pid=(\d+))?(?:, name=([^,\s]+))?"
                  r"(?:.*caused by previous Xid (\d+))?")
_SYSLOG_HOST = re.compile(r"\b\w{3}\s+\d+ [\d:]+ (\S+) kernel:")
def _oom(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _OOM.search(t):
        ev.add(Oom(rank=rank_of(line), host=line.host, size=m.group(1),
                   gpu=m.group(2) or m.group(4), total=m.group(3) or m.group(5),
                   line=t.strip()), key=(rank_of(line), line.host, m.group(0)))


def _cuda(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if "out of memory" in t and _OOM.search(t):
        return
    if ("CUDA error" in t or "cuda runtime" in t) and (m := _CUDA_ERROR.search(t)) and (
            "Compile with" not in t):
        what = (m.group(1) or m.group(2)).strip()
        ev.add(CudaError(what=what, rank=rank_of(line), host=line.host, line=t.strip()),
               key=(what, rank_of(line), line.host))


def _xid(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _XID.search(t):
        h = _SYSLOG_HOST.search(t) if "kernel:" in t else None
        host = (h.group(1) if h else None) or line.host
        ev.add(Xid(pci=m.group(1), xid=int(m.group(2)), pid=m.group(3), name=m.group(4),
                   cause=int(m.group(5)) if m.group(5) else None, host=host), key=(m.group(0),))




READERS = [("out of memory", _oom), ("rror", _cuda), ("Xid", _xid)]
