"""The process that failed first, and what it raised: a launcher's failure table (torchrun's
"Root Cause (first observed failure)", DeepSpeed's launcher, the elastic agent's `failed
(exitcode: N)`) joined to the rank's own exception printed above it.

Why its own module: the table says who and when (rank, local rank, host, pid, time, exit code)
but not why; the why is the rank's own traceback, earlier in the log. A finding that names only
the table's `exitcode 1` sends the reader back to the log for the one line that matters, and an
exit code of 1 is not a signal. And the table's first failure may be a rank that only timed out
waiting for another (its watchdog aborts it first): a rank with an error of its own that did
not time out is the cause then.
"""

from __future__ import annotations

from megatron_env.diagnose import exceptions, families
from megatron_env.diagnose.ids import FindingId
from megatron_env.diagnose.launch import ranks
from megatron_env.diagnose.model import SIGNALS, Events, Failing, Failure, first, in_time_order
from megatron_env.findings import Finding, Status

# what the launcher raises about its child, not the child's own error
LAUNCHER_ERRORS = frozenset({"ChildFailedError", "CalledProcessError", "ProcessExitedException",
                             "ProcessRaisedException", "SystemExit", "KeyboardInterrupt"})
_FIXES = {-6: "SIGABRT is usually PyTorch's NCCL watchdog ending the process after a timeout "
              "or an NCCL error: see those findings",
          -9: "SIGKILL: the kernel's OOM killer or the scheduler; check `dmesg` and the job's "
              "host memory (`sacct -j JOB -o MaxRSS`), and the scheduler's time limit",
          -11: "SIGSEGV in native code: kernels built against another torch (`invoke "
               "build-check`), or a driver fault (Xid lines in `dmesg`)",
          -7: "SIGBUS: /dev/shm too small (containers: --shm-size or --ipc=host)"}


def proc(f: Failure) -> str:
    """A failure table's process: its rank, else its local rank, else (a table cut short) 'a
    worker'."""
    if f.rank is not None:
        return f"rank {f.rank}"
    return f"local rank {f.local_rank}" if f.local_rank is not None else "a worker"


def _exceptions(ev: Events) -> list[Failing]:
    return [x for x in ev.failing if x.kind == "exception" and x.name not in LAUNCHER_ERRORS]


def own_exception(ev: Events, root: Failure) -> Failing | None:
    """The exception the root-cause process printed: the first of its rank's (a global rank
    tag, else its local rank's role tag); in a log whose exceptions carry no tag, the first one
    when only one process failed (nothing else could have printed it)."""
    ex = _exceptions(ev)
    mine = [x for x in ex if x.rank == root.rank] if root.rank is not None else []
    if not mine and root.local_rank is not None:
        mine = [x for x in ex if x.rank is None and x.local == root.local_rank]
    if not mine and len({(f.rank, f.local_rank) for f in ev.failures}) == 1:
        mine = [x for x in ex if x.rank is None and x.local is None]
    return min(mine, key=lambda x: x.seq or 0) if mine else None


def _waited(ev: Events, root: Failure) -> Failing | None:
    """When the table's first failure only timed out (its watchdog), the first exception of a
    rank that did not time out: the one the others were waiting for."""
    waiting = {t.rank for t in ev.timeouts}
    if root.rank is None or root.rank not in waiting:
        return None
    others = [x for x in _exceptions(ev) if x.rank is not None and x.rank not in waiting]
    return min(others, key=lambda x: x.seq or 0) if others else None


def findings(ev: Events) -> list[Finding]:
    if not ev.failures:
        return []
    roots = [f for f in ev.failures if f.root]
    root = first(roots or ev.failures)  # each node's agent prints its own: the first in time
    launcher = root.launcher
    code = root.exitcode
    how = (f"killed by signal {SIGNALS.get(-code, -code)} (exit code {code})"
           if code is not None and code < 0 else f"exit code {code}" if code is not None
           else "its exit code cut off")
    p = ev.who(root)
    who = proc(root)
    if root.rank is not None and root.local_rank is not None:
        who += f" (local rank {root.local_rank})"
    if p["host"]:
        who += f" on host {p['host']}"
    ids = ", ".join(x for x in (f"GPU {p['gpu']}" if p["gpu"] is not None else "",
                                f"pid {p['pid']}" if p["pid"] else "") if x)
    more = ", ".join(x for x in (ids, f"at {root.time}" if root.time else "") if x)
    others = [f for f in ev.failures if f is not root]
    failed = sorted({f.rank for f in ev.failures if f.rank is not None})
    table = [f"{'root cause' if f.root else 'also failed'}: " + proc(f)
             + (f" on {f.host}" if f.host else "") + f", exit code {f.exitcode}"
             for f in [root, *others][:8]]
    also = f"; failed: {ranks(failed)}" if len(failed) > 1 else ""
    if (culprit := _waited(ev, root)) is not None:
        return [Finding(
            FindingId.JOB_ROOT_CAUSE, Status.FAIL,
            f"rank {culprit.rank} raised {_said(culprit)}; {launcher}'s first observed "
            f"failure, {who}, only timed out waiting for it ({how}){also}",
            [culprit.line, *table], _EXCEPTION_FIX, culprit.where or "user")]
    if (own := own_exception(ev, root)) is not None and code not in (-9, -15):
        return [Finding(
            FindingId.JOB_ROOT_CAUSE, Status.FAIL,
            f"{who} raised {_said(own)}; {launcher}'s first observed failure"
            + (f" ({more})" if more else "") + f", {how}{also}",
            [own.line, *table], _EXCEPTION_FIX, own.where or "user")]
    who += f" ({ids})" if ids else ""
    fix = _FIXES.get(code if code is not None else 0,
                     f"{who}'s own traceback, earlier in its log, names the error; rerun with "
                     "`@record` on the entry point (torch.distributed.elastic.multiprocessing."
                     "errors) so torchrun prints it here")
    return [Finding(
        FindingId.JOB_ROOT_CAUSE, Status.FAIL,
        f"{launcher}'s first observed failure: {who}, {how}{also}",
        table, fix, "signal" if code is not None and code < 0 else "unrecognised")]


def _said(x: Failing) -> str:
    """An exception as its traceback ended, and where it was raised when known."""
    return x.line + (f" ({x.frame})" if x.frame else "")


_EXCEPTION_FIX = ("the exception is that rank's own error, the first in the job; its traceback, "
                  "just above it in the log, says where. The other ranks failed after it (a "
                  "peer gone, a collective that timed out): fix this one first")


def exception_findings(ev: Events, quoted: set[str]) -> list[Finding]:
    """A rank's own exception (`Type: message`, the first in time that is a cause, not a
    consequence of another process's failure) as a finding of the family its type and raising
    package say (`exceptions`), unless another finding already quotes it (`quoted`: their
    evidence lines)."""
    own = []
    for x in _exceptions(ev):
        if "Caught " in x.line or any(x.line in q or q in x.line for q in quoted if q):
            continue
        kind = exceptions.classify(x.name, x.frame, x.line, x.where)
        if not kind.consequence:
            own.append((x, kind))
    if not own:
        return []
    x = first([y for y, _ in own])
    k = next(k for y, k in own if y is x)
    who = (f"rank {x.rank}" if x.rank is not None else
           f"local rank {x.local}" if x.local is not None else "a process")
    others = list(dict.fromkeys(y.line for y in in_time_order([y for y, _ in own])
                                if y.line != x.line))
    where = {"user": ", raised in the training code", "framework": ", raised inside an installed "
             "package"}.get(x.where, "")
    return [Finding(
        FindingId.JOB_EXCEPTION, Status.FAIL, f"{who} raised {x.line}{where}"
        + (f" ({x.frame})" if x.frame else "") + (f"; also: {others[0]}" if others else ""),
        [x.line, *others[:3]],
        f"{_EXCEPTION_FIX}; {families.FAMILIES[k.family].advice}", k.family)]
