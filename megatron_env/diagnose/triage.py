"""What a failed or hung distributed job's console log says happened, most likely cause first.

Pure functions of normalised log lines (`joblog`): `events` finds what PyTorch, torchrun, CUDA,
the kernel and NCCL printed; `findings` turns that into the one finding shape of `invoke check`
(id, status, summary naming rank/host/op as a person would, evidence, fix). The NCCL_DEBUG lines
are read by the analysis scripts/verify_nccl.py already has (see `nccl_log` for why it is shared
by loading that file), so a job log and `verify_nccl.py --analyze-log` agree.

The order is a judgement: a rank's own fault (a GPU Xid, an ECC or illegal-address error, NCCL
unable to allocate or complete an IB transfer) comes before what other ranks saw as a
consequence (a peer gone, a collective timing out), because the ranks that time out are almost
always waiting for the one that failed.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from megatron_env.diagnose import families, launch, nccl_log, outcome, rootcause
from megatron_env.diagnose.events import XIDS, Events, describe, events
from megatron_env.diagnose.ids import FindingId
from megatron_env.diagnose.joblog import Line
from megatron_env.diagnose.model import (
    CudaError,
    Ibv,
    NcclError,
    Timeout,
    Who,
    first,
    in_time_order,
)
from megatron_env.findings import Finding, Status

NEXT_RUN = ("NCCL_DEBUG=INFO TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "
            "TORCH_NCCL_DESYNC_DEBUG=1")


ranks = launch.ranks


def _where(rank: int | None, host: str | None) -> str:
    parts = ([f"rank {rank}"] if rank is not None else []) + ([f"host {host}"] if host else [])
    return " on ".join(parts) or "a rank"


def _who(items: Sequence[Who]) -> str:
    """'rank 1 on gpu187', 'ranks 0 and 3', 'a rank': who printed these events."""
    rs = sorted({e.rank for e in items if e.rank is not None})
    local = sorted({e.local for e in items if e.local is not None})
    hosts = sorted({e.host for e in items if e.host})
    who = (ranks(rs) if rs else ranks(local).replace("rank", "local rank") if local
           else "a rank")
    return who + (f" on {', '.join(hosts)}" if hosts else "")


def _seconds(ms: int) -> str:
    s = ms / 1000
    return f"{s / 3600:.1f} h" if s >= 7200 else f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"


def _timeouts(ev: Events) -> list[Finding]:
    if not ev.timeouts:
        return []
    seen: dict[tuple[Any, ...], Timeout] = {}
    for t in ev.timeouts:  # the watchdog line and the exception text repeat the same timeout
        seen.setdefault((t.rank, t.seqnum, t.op), t)
    ts = list(seen.values())
    groups: dict[tuple[str, int], list[Timeout]] = defaultdict(list)
    for t in ts:
        groups[(t.op, t.seqnum)].append(t)
    by_rank: dict[int, set[int]] = defaultdict(set)
    for t in ts:
        by_rank[t.rank].add(t.seqnum)
    t0 = ts[0]
    size = (f", {t0.numel_in} elements in / {t0.numel_out} out"
            if t0.numel_in is not None else "")
    ran = max(t.ran_ms for t in ts)
    ops = " and ".join(sorted({t.op for t in ts}))
    seqs = sorted({t.seqnum for t in ts})
    summary = (f"{ranks(by_rank)} timed out in {ops} (SeqNum {_span(seqs)}"
               f"{size if len(groups) == 1 else ''}) after {_seconds(t0.timeout_ms)} "
               f"(Timeout(ms)={t0.timeout_ms})")
    if ran > 1.5 * t0.timeout_ms:
        summary += f"; the watchdog only noticed after {_seconds(ran)}"
    if ev.first_timeout:
        summary += f"; {ranks(ev.first_timeout)} timed out first"
    evidence = [describe(ev.who(t))
                + (f" ([Rank {t.pg_rank}] of its process group)"
                   if t.pg_rank not in (None, t.rank) else "")
                + f": {t.op} SeqNum {t.seqnum}"
                + (f" ({t.numel_in} elements in / {t.numel_out} out)"
                   if t.numel_in is not None and len(groups) > 1 else "")
                + (f", ran for {t.ran_ms} ms" if t.ran_ms else "") for t in ts[:8]]
    evidence += [f"rank {r}: {w}" for r, w in sorted(ev.work.items())[:8]]
    out = []
    odd = _odd_ones(by_rank)
    silent = sorted(ev.ranks_seen - set(by_rank) - set(ev.work))
    suspects = odd or silent
    if odd:
        behind = {r: sorted(by_rank[r]) for r in odd}
        rest = sorted(set(by_rank) - set(odd))
        others = sorted({s for r in rest for s in by_rank[r]})
        hosts = sorted({t.host for t in ts if t.rank in odd and t.host})
        ahead = min(s for r in odd for s in behind[r]) > max(others)
        ops_of = {r: {t.op for t in ts if t.rank == r} for r in by_rank}
        odd_ops = {o for r in odd for o in ops_of[r]}
        rest_ops = {o for r in rest for o in ops_of[r]}
        mismatch = (f"; the ranks disagree on the next collective ({', '.join(sorted(odd_ops))} "
                    f"vs {', '.join(sorted(rest_ops))})" if odd_ops.isdisjoint(rest_ops) else "")
        where = f"{ranks(odd)}{' on ' + ', '.join(hosts) if hosts else ''}"
        said = (f"{where} is the odd one out: ahead at SeqNum "
                f"{', '.join(str(s) for r in odd for s in behind[r])} while {ranks(rest)} "
                f"still wait at SeqNum {_span(others)}" if ahead else
                f"{where} is the odd one out: stuck at SeqNum "
                f"{', '.join(str(s) for r in odd for s in behind[r])} while {ranks(rest)} "
                f"reached SeqNum {_span(others)}")
        out.append(Finding(
            FindingId.JOB_ODD_RANK, Status.FAIL, said + mismatch,
            [f"rank {r}: SeqNum {', '.join(map(str, sorted(seqs)))}"
             for r, seqs in sorted(by_rank.items())],
            f"look at {ranks(odd)} first: its log, `py-spy dump` of its process while hung, and "
            f"`invoke preflight` on its host; next run: {NEXT_RUN}"))
    if silent and not odd and len(by_rank) > 1:
        out.append(Finding(
            FindingId.JOB_ODD_RANK, Status.FAIL,
            f"{ranks(silent)} printed no watchdog timeout while {ranks(by_rank)} did: "
            f"{'it' if len(silent) == 1 else 'they'} may never have reached SeqNum "
            f"{_span(seqs)}",
            [f"ranks in the logs: {ranks(ev.ranks_seen)}",
             f"timed out: {ranks(by_rank)}"],
            f"look at {ranks(silent)} first: its own error earlier in its log, or where it hung "
            f"(`py-spy dump`); `invoke preflight` on its host; next run: {NEXT_RUN}"))
    fix = ("the ranks that time out are waiting for one that never joined"
           + (f" ({ranks(suspects)})" if suspects else "")
           + f": find it (its own error earlier in its log, or a hang). Next run: {NEXT_RUN} "
             "(the flight-recorder dump names the missing rank), and `invoke preflight` on the "
             "nodes")
    out.insert(0, Finding(FindingId.JOB_TIMEOUT, Status.FAIL, summary, evidence, fix))
    return out


def _odd_ones(by_rank: dict[int, set[int]]) -> list[int]:
    """The ranks whose newest SeqNum differs from where the majority of ranks are."""
    if len(by_rank) < 2:
        return []
    newest = {r: max(s) for r, s in by_rank.items()}
    counts: dict[int, int] = defaultdict(int)
    for s in newest.values():
        counts[s] += 1
    if len(counts) == 1:
        return []
    majority = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
    odd = [r for r, s in newest.items() if s != majority]
    return sorted(odd) if len(odd) < len(newest) else []


def _span(seqs: list[int]) -> str:
    return str(seqs[0]) if len(seqs) == 1 else f"{seqs[0]}-{seqs[-1]}"


def _desync(ev: Events) -> list[Finding]:
    if not ev.desync_lagging:
        return []
    lag = sorted({r for x in ev.desync_lagging for r in x.ranks})
    first = ev.desync_lagging[0]
    return [Finding(
        FindingId.JOB_DESYNC, Status.FAIL,
        f"PyTorch's desync report names {ranks(lag)}: [{', '.join(map(str, first.ranks))}] "
        f"{first.what}",
        [f"[{', '.join(map(str, x.ranks))}] {x.what}" for x in ev.desync_lagging[:6]]
        + ev.desync,
        f"{ranks(lag)} fell behind or took another code path: read its log and stack "
        f"(`py-spy dump --pid` while hung); a rank that skipped or reordered a collective is a "
        f"bug in the training script, a dead one a host problem (`invoke preflight` on its node)")]


_NCCL_FIX = {
    "unhandled system error":
        "a system call inside NCCL failed: with InfiniBand this is usually the locked-memory "
        "limit (set `ulimit -l unlimited` for the job: limits.conf, --ulimit memlock=-1, Slurm "
        "PropagateResourceLimits), else /dev/shm too small; rerun with NCCL_DEBUG=INFO to see "
        "the failing call and run `invoke preflight` on the host",
    "remote process exited or there was a network error":
        "another rank exited or the network between nodes failed: find the rank that failed "
        "first (torchrun's root cause, the earliest error) and fix that; if none did, check the "
        "links (`invoke preflight` on every node, `ibstatus`) and rerun with NCCL_DEBUG=INFO",
    "unhandled cuda error":
        "a CUDA call inside NCCL failed: out of GPU memory or a GPU fault; rerun with "
        "NCCL_DEBUG=INFO and look for Xid lines in `dmesg` on the host",
}


def _nccl_errors(ev: Events) -> list[Finding]:
    out = []
    by_kind: dict[str, list[NcclError]] = defaultdict(list)
    for e in in_time_order(ev.nccl_errors):
        by_kind[e.kind].append(e)
    for kind, es in by_kind.items():
        where = sorted({describe(ev.who(e)) for e in es} - {"a process"})
        version = next((e.version for e in es if e.version), None)
        last = next((e.last_error for e in es if e.last_error), "") or next(
            (x.what for x in ev.last_errors), "")
        op = next((e.op for e in es if e.op), None) or _op(ev, es)
        out.append(Finding(
            FindingId.JOB_NCCL_ERROR, Status.FAIL,
            f"NCCL error '{kind}'" + (f" on {', '.join(where[:4])}" if where else "")
            + (f" in {op}" if op else "")
            + (f" (NCCL {version})" if version else "") + (f": {last}" if last else ""),
            [e.line for e in es[:4]] + ([f"last error: {last}"] if last else []),
            _NCCL_FIX.get(kind, f"rerun with NCCL_DEBUG=INFO to see where it fails; {NEXT_RUN}")))
    if not ev.nccl_errors and ev.last_errors:
        where = sorted({describe(ev.who(e)) for e in ev.last_errors
                        if e.rank is not None or e.host})
        what = ev.last_errors[0].what
        op = _op(ev, ev.last_errors)
        out.append(Finding(
            FindingId.JOB_NCCL_ERROR, Status.FAIL,
            "NCCL's last error" + (f" on {', '.join(where[:4])}" if where else "")
            + (f" in {op}" if op else "") + f": {what}",
            [f"Last error: {x.what}" for x in ev.last_errors[:4]],
            _LAST_FIX if _REFUSED in what or "onnect" in what else
            f"rerun with NCCL_DEBUG=INFO to see the failing call; {NEXT_RUN}"))
    return out


_REFUSED = "Connection refused"
_LAST_FIX = ("a peer's socket refused or dropped the connection: that rank had already exited "
             "(find its own error first) or a firewall/NCCL_SOCKET_IFNAME points at the wrong "
             "interface; `invoke preflight` on the nodes checks the links")


def _op(ev: Events, es: Sequence[Who]) -> str | None:
    """The collective the ranks of these events were in, from their tracebacks."""
    return next((ev.collective[e.rank] for e in es if e.rank in ev.collective),
                None) or ev.collective.get(None) or (
        next(iter(ev.collective.values())) if len(set(ev.collective.values())) == 1 else None)


# CUDA errors that are the hardware's, not the code's (cudaErrorECCUncorrectable,
# cudaErrorNvlinkUncorrectable, cudaErrorHardwareStackError, a GPU that is lost)
_HARDWARE = re.compile(r"ECC|NVLink|hardware|fallen off|GPU is lost|uncorrectable", re.I)


# a math library's or CUDA's allocation failure: what running out of GPU memory looks like from
# inside cuBLAS/cuDNN (CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_ALLOC_FAILED)
_ALLOC = re.compile(r"ALLOC_FAILED|out of memory", re.I)
ALLOC = "alloc"


def _cuda(ev: Events) -> list[Finding]:
    out = []
    by_what: dict[str, list[CudaError]] = defaultdict(list)
    for e in in_time_order(ev.cuda_errors):
        by_what[e.what].append(e)
    for what, es in by_what.items():
        if "ECC" in what:
            fix = ("a GPU memory fault, not a software bug: drain the node, check "
                   "`nvidia-smi -q -d ECC,ROW_REMAPPER` and Xid lines in `dmesg`, reset or replace "
                   "the GPU; `invoke preflight` on the host before it rejoins")
        elif "illegal memory access" in what or "illegal address" in what:
            fix = ("a kernel wrote out of bounds: rerun with CUDA_LAUNCH_BLOCKING=1 to name the "
                   "kernel; compiled kernel packages built for another torch/CUDA are a common "
                   "cause: `invoke build-check`; if it moves between nodes, check Xid lines")
        else:
            fix = "rerun with CUDA_LAUNCH_BLOCKING=1 to name the failing kernel"
        hardware = _HARDWARE.search(what) is not None
        alloc = _ALLOC.search(what) is not None
        out.append(Finding(FindingId.JOB_CUDA_ERROR, Status.FAIL,
                           f"{_who(es)} hit CUDA error: {what}"
                           + (" (a GPU hardware fault, not the code's)" if hardware else ""),
                           [e.line for e in es[:4]], fix,
                           "hardware" if hardware else ALLOC if alloc else ""))
    if ev.ooms:
        o = first(ev.ooms)
        out.append(Finding(
            FindingId.JOB_CUDA_OOM, Status.FAIL,
            f"{_who(ev.ooms)} ran out of GPU memory: tried to allocate {o.size}"
            + (f" on GPU {o.gpu} ({o.total} total)" if o.gpu else ""),
            [e.line for e in ev.ooms[:4]],
            "smaller micro-batch, activation recomputation, more tensor/pipeline parallelism, or "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation"))
    return out


def _xids(ev: Events) -> list[Finding]:
    if not ev.xids:
        return []
    codes = sorted({x.xid for x in ev.xids} | {x.cause for x in ev.xids if x.cause})
    gpus = sorted({x.pci for x in ev.xids})
    hosts = sorted({x.host for x in ev.xids if x.host})
    causes = sorted({x.cause for x in ev.xids if x.cause})
    named = ", ".join(f"Xid {c}" + (f" ({XIDS[c]})" if c in XIDS else "") for c in codes)
    return [Finding(
        FindingId.JOB_GPU_XID, Status.FAIL,
        f"the GPU driver reported {named} on {len(gpus)} GPU(s) ({', '.join(gpus[:4])})"
        + (f" of {', '.join(hosts)}" if hosts else "")
        + (f"; the first error was Xid {', '.join(map(str, causes))}" if causes else ""),
        [f"{x.pci}: Xid {x.xid}" + (f" pid {x.pid} ({x.name})" if x.pid else "")
         + (f", caused by Xid {x.cause}" if x.cause else "") for x in ev.xids[:6]],
        "a GPU, NVLink or driver fault on that node: drain it, look up the Xid in NVIDIA's Xid "
        "catalogue, collect `nvidia-bug-report.sh`, reset the GPUs or reboot, and run "
        "`invoke preflight` there before it rejoins")]


def _stuck(ev: Events) -> list[Finding]:
    if not ev.stuck:
        return []
    return [Finding(
        FindingId.JOB_WATCHDOG_STUCK, Status.FAIL,
        f"the NCCL watchdog of {_who(ev.stuck)} got stuck for "
        f"{max(s.seconds for s in ev.stuck)} s: a CUDA or NCCL call itself hung",
        [f"{_where(s.rank, s.host)}: stuck for {s.seconds} s" for s in ev.stuck[:6]],
        "a call that never returns is a GPU fault (Xid lines in `dmesg` on that host) or a "
        "deadlock around the GIL: take `py-spy dump --native --pid` of the process while it "
        "hangs, run `invoke preflight` on the host; TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC only helps "
        "when the call is merely slow")]


def _nccl_debug(ev: Events) -> list[Finding]:
    """The NCCL_DEBUG lines, through verify_nccl.py's analysis (skips dropped: a job log that
    has no channel lines says nothing about the transport). A failed ibv_* call is judged by
    its errno (`_ibv`), so the analysis' memlock advice stays only where ENOMEM says so."""
    if ev.nccl is None:
        return []
    fs = [f for f in nccl_log.findings(ev.nccl) if f.status is not Status.SKIP]
    if any(e.errno for e in ev.ibv):  # `_ibv` says it, with the advice of its errno
        fs = [f for f in fs if f.id != FindingId.NCCL_SYSTEM_ERROR
              or not all("ibv_" in x for x in f.evidence)]
    return fs


_IBV_FIX = {
    "ENOMEM": "the locked-memory limit is too low for InfiniBand memory registration: set "
              "`ulimit -l unlimited` for the job (limits.conf, --ulimit memlock=-1, Slurm "
              "PropagateResourceLimits) and check `ulimit -l` inside the job",
    "EINVAL": "the HCA refused the memory registration itself (not a limit): GPU memory needs "
              "GPUDirect RDMA (nvidia-peermem loaded, or NCCL_DMABUF_ENABLE=1 with a kernel "
              "that has dma-buf), a driver/OFED pair that supports it, and PCIe relaxed "
              "ordering settled (NCCL_IB_PCI_RELAXED_ORDERING); a region larger than the HCA's "
              "max MR size fails the same way; NCCL_NET_GDR_LEVEL=LOC to confirm",
    "EFAULT": "the HCA could not pin the pages: GPU memory without GPUDirect RDMA support "
              "(nvidia-peermem not loaded, or a GPU/driver without it); NCCL_NET_GDR_LEVEL=LOC "
              "to confirm",
    "EPERM": "not permitted: the container lacks IPC_LOCK/privileges or the RDMA device "
             "(--cap-add IPC_LOCK, --device /dev/infiniband)",
}


def _ibv(ev: Events) -> list[Finding]:
    """Failed ibv_* calls, one finding per errno: the advice depends on the errno, not on which
    call failed."""
    by: dict[str | None, list[Ibv]] = defaultdict(list)
    for e in ev.ibv:
        if e.errno:  # without one, the NCCL analysis' system error says what is known
            by[e.errno].append(e)
    out = []
    for errno, es in by.items():
        calls = sorted({e.call for e in es})
        who = sorted({describe(ev.who(e)) for e in es if e.rank is not None or e.host
                      or e.pid})
        op = _op(ev, es)
        out.append(Finding(
            FindingId.NCCL_IBVERBS_CALL, Status.FAIL,
            f"{', '.join(calls)} failed" + (f" with {errno}" if errno else "")
            + (f" ({es[0].error})" if es[0].error else "")
            + (f" on {', '.join(who[:4])}" if who else "") + (f" in {op}" if op else ""),
            [e.line for e in es[:4]],
            _IBV_FIX.get(errno or "", "look up the errno the call failed with (`errno -l`); rerun "
                                "with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET")))
    return out


ORDER: list[str] = [  # FindingId members (each the string it names)
    FindingId.JOB_GPU_XID,
    FindingId.JOB_HARDWARE,
    FindingId.JOB_OOM_KILLER,
    FindingId.JOB_DISK,
    FindingId.JOB_CUDA_ERROR,
    FindingId.JOB_DEVICE_ASSERT,
    FindingId.JOB_KERNEL_ABI,
    FindingId.JOB_SCRIPT,
    FindingId.NCCL_IB_COMPLETION,
    FindingId.NCCL_CUDA,
    FindingId.JOB_CUDA_OOM,
    FindingId.JOB_ACCELERATOR_OOM,
    FindingId.JOB_COMPILER,
    FindingId.JOB_NUMERICS,
    FindingId.JOB_DATA,
    FindingId.JOB_EXCEPTION,  # a rank's own exception: before what other processes did after it
    FindingId.NCCL_IBVERBS_CALL,
    FindingId.NCCL_SYSTEM_ERROR,
    FindingId.NCCL_SHM,
    FindingId.JOB_SIGNAL,
    FindingId.JOB_MPI_ABORT,
    FindingId.NCCL_IBVERBS,
    FindingId.JOB_HANG,  # the flight recorder's root rank: before what the other ranks saw
    FindingId.JOB_WATCHDOG_STUCK,
    FindingId.JOB_DESYNC,
    FindingId.JOB_STALL,
    FindingId.JOB_ODD_RANK,
    FindingId.JOB_BOOTSTRAP,
    FindingId.JOB_RENDEZVOUS,
    FindingId.NCCL_SOCKET,
    FindingId.JOB_NCCL_NET,
    FindingId.JOB_NCCL_ERROR,
    FindingId.JOB_ROOT_CAUSE,
    FindingId.JOB_RAY_WORKER,
    FindingId.NCCL_PEER_LOST,
    FindingId.JOB_TIMEOUT,
    FindingId.JOB_SCHEDULER,
    FindingId.NCCL_NET,
    FindingId.NCCL_TRANSPORT,
]


def _rank_of(f: Finding, ev: Events | None = None) -> tuple[int, int]:
    rank = ORDER.index(f.id) if f.id in ORDER else len(ORDER)
    if ev is not None and _is_consequence(f, ev):  # listed after (and under) its cause
        return (f.status is not Status.FAIL, ORDER.index(_CAUSE[f.id]) + 1)
    # the rank's own error
    if f.id == FindingId.JOB_ROOT_CAUSE and f.kind in ("user", "framework"):
        rank = ORDER.index(FindingId.JOB_SIGNAL) - 1
    elif f.id == FindingId.JOB_ROOT_CAUSE and "SIGABRT" in f.summary:  # the watchdog's doing
        rank = ORDER.index(FindingId.JOB_TIMEOUT) + 1
    if f.id == FindingId.JOB_SIGNAL and f.kind == "launcher":  # the root cause's exit code, again
        rank = ORDER.index(FindingId.JOB_ROOT_CAUSE) + 1
    if f.id == FindingId.JOB_SIGNAL and f.kind in ("agent", "SIGTERM"):  # sent from outside
        rank = ORDER.index(FindingId.JOB_SCHEDULER) + 1
    return (f.status is not Status.FAIL, rank)


# a consequence's finding id -> the id of the finding of its cause
_CAUSE: dict[str, str] = {FindingId.JOB_SIGNAL: FindingId.JOB_TIMEOUT,
                          FindingId.JOB_ROOT_CAUSE: FindingId.JOB_TIMEOUT,
                          FindingId.JOB_CUDA_ERROR: FindingId.JOB_CUDA_OOM}


def _aborted(ev: Events) -> list[tuple[int | None, str]]:
    """The processes a SIGABRT ended (rank, 'SIGABRT' or the exit code): a signal line or a
    launcher's table entry with exit code -6."""
    out: list[tuple[int | None, str]] = [(s.rank, "SIGABRT") for s in ev.signals
                                         if s.signal == "SIGABRT"]
    out += [(f.rank, "SIGABRT (exit code -6)") for f in ev.failures if f.exitcode == -6]
    return out


def _is_consequence(f: Finding, ev: Events) -> bool:
    """A finding another one explains: an abort after NCCL's watchdog timed out (the watchdog
    aborts its process), a math library's allocation failure after running out of memory."""
    if f.id == FindingId.JOB_CUDA_ERROR:
        return f.kind == ALLOC and bool(ev.ooms)
    if f.id == FindingId.JOB_SIGNAL and f.kind in ("SIGABRT", "launcher"):
        return bool(ev.timeouts) and bool(_aborted(ev))
    if f.id == FindingId.JOB_ROOT_CAUSE:
        return bool(ev.timeouts) and f.kind == "signal" and any(
            x.exitcode == -6 for x in ev.failures)
    return False


def _under_causes(fs: list[Finding], ev: Events) -> list[Finding]:
    """Each cause with what it explains listed in its evidence ("consequence: rank 7's SIGABRT
    follows its NCCL watchdog timeout in BROADCAST")."""
    notes: dict[str, list[str]] = defaultdict(list)
    if ev.timeouts and any(_is_consequence(f, ev) for f in fs):
        ops = {t.rank: t.op for t in ev.timeouts}
        every = " and ".join(sorted(set(ops.values())))
        for rank, how in dict.fromkeys(_aborted(ev)):
            notes[FindingId.JOB_TIMEOUT].append(
                f"consequence: rank {rank}'s {how} follows its NCCL watchdog timeout in "
                f"{ops[rank]}" if rank in ops else
                f"consequence: the {how} of {f'rank {rank}' if rank is not None else 'a process'}"
                f" follows the NCCL watchdog timeout in {every}")
    if ev.ooms and any(f.id == FindingId.JOB_CUDA_ERROR and _is_consequence(f, ev) for f in fs):
        notes[FindingId.JOB_CUDA_OOM] += [
            f"consequence: {e.what} follows running out of GPU memory"
            for e in ev.cuda_errors if _ALLOC.search(e.what)][:2]
    return [Finding(f.id, f.status, f.summary, f.evidence + notes.pop(f.id, []), f.fix, f.kind)
            if f.id in notes else f for f in fs]


def findings(ev: Events) -> list[Finding]:
    """Most likely cause first (see the module's docstring), each in its family (its `kind`);
    when no signature names a failure, the log's outcome (`outcome`): unrecognised, stopped
    or a clean end."""
    fs = (_xids(ev) + _cuda(ev) + _nccl_debug(ev) + _desync(ev) + _timeouts(ev)
          + _stuck(ev) + rootcause.findings(ev) + _nccl_errors(ev) + _ibv(ev) + launch.findings(ev)
          + outcome.table(ev, skip=frozenset({FindingId.JOB_RENDEZVOUS} | (
              {FindingId.JOB_SCHEDULER} if ev.cancelled else set()))))
    quoted = {e for f in fs if f.status is Status.FAIL for e in f.evidence}
    fs += rootcause.exception_findings(ev, quoted)
    fs.sort(key=lambda f: _rank_of(f, ev))
    fs = _under_causes(fs, ev)
    fs += outcome.outcome(ev, any(f.status is Status.FAIL for f in fs))
    return [Finding(f.id, f.status, f.summary, f.evidence, f.fix,
                    families.family(f.id, f.kind).name) for f in fs]


def triage(lines: Iterable[Line]) -> list[Finding]:
    """The findings of lines that belong to one job."""
    return findings(events(lines))
