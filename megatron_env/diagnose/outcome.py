"""Findings of the families' table signatures (`sig_table`), and the three outcomes a log has
when no signature names its failure: `job.unrecognised` (it looks like a failure), `job.stopped`
(it ends with neither an error nor a normal end: a hang or a kill) or a clean end.

Why the outcomes are judged here and last: a log only "shows no failure" once every family has
had its say, and exit 0 must mean exactly that (DESIGN: triage outcomes). Pure functions of
`model.Events`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from megatron_env.diagnose import families, launch
from megatron_env.diagnose.ids import FindingId
from megatron_env.diagnose.model import End, Events, Failing, Hit, first, in_time_order
from megatron_env.findings import INCONCLUSIVE, Finding, Status

_STOPPED_NEXT = ("`py-spy dump --pid PID` (add --native for a stuck CUDA/NCCL call) on a rank "
                 "that still runs says where it waits; next run: NCCL_DEBUG=INFO, "
                 "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and TORCH_NCCL_DUMP_ON_TIMEOUT=1 (the flight "
                 "recorder; its dump, written to TORCH_NCCL_DEBUG_INFO_TEMP_FILE, names the "
                 "collective each rank was in), and TORCH_NCCL_ENABLE_MONITORING=1 with a "
                 "heartbeat timeout so a hang ends in an error; if nothing hung, the job was "
                 "killed from outside: `sacct -j JOB -o State,ExitCode`, `dmesg` on its nodes")

# advice of a finding kind, where it says more than its family's
_FIX: dict[tuple[str, str], str] = {
    (FindingId.JOB_OOM_KILLER, "kernel"):
        "the host ran out of memory and the kernel killed the biggest process: fewer "
        "DataLoader workers or smaller prefetch, less CPU-side caching (datasets in memory, "
        "pinned buffers), or a node with more memory; `dmesg -T | grep -i oom` on the node",
    (FindingId.JOB_OOM_KILLER, "cgroup"):
        "the job's memory limit (Slurm --mem, the container's limit) was reached: ask for "
        "more (`sacct -j JOB -o MaxRSS,ReqMem` shows the peak) or use less host memory",
    (FindingId.JOB_DISK, "no space"):
        "the disk is full: free space or write checkpoints and caches elsewhere (HF_HOME, "
        "TRITON_CACHE_DIR, TMPDIR); `df -h` on the path",
    (FindingId.JOB_DISK, "quota"):
        "a quota is exhausted: `quota -s` / `lfs quota`; move caches (TRITON_CACHE_DIR, "
        "HF_HOME, TORCH_EXTENSIONS_DIR) to a file system with room",
    (FindingId.JOB_DISK, "stale file handle"):
        "a network file system (NFS) lost a file another node replaced or deleted: keep "
        "per-rank caches and logs on node-local disk, or write each file from one rank only",
    (FindingId.JOB_DATA, "worker killed"):
        "a DataLoader worker was killed: by SIGKILL it is the host OOM killer (fewer workers, "
        "smaller prefetch_factor), by SIGBUS /dev/shm too small (--shm-size, --ipc=host), by "
        "SIGSEGV a crash in a native library reading the data (num_workers=0 shows where)",
    (FindingId.JOB_SCHEDULER, "eviction"):
        "Kubernetes' kubelet evicted the pod under node memory pressure: set the pod's memory "
        "request equal to its limit (Guaranteed QoS) or use a node with more memory",
    (FindingId.JOB_RENDEZVOUS, "heartbeat"):
        "a node stopped answering the rendezvous' heartbeats: it died (OOM killer, a hardware "
        "fault: check its own log and `dmesg`) or the network to it failed",
    (FindingId.JOB_RENDEZVOUS, "name resolution"):
        "a host name did not resolve: use an IP address or a name every node resolves for "
        "MASTER_ADDR / --rdzv_endpoint (`getent hosts NAME` on each node)",
    (FindingId.JOB_DEVICE_ASSERT, "assert"):
        "an index out of range inside a CUDA kernel, most often the data: a label >= the "
        "number of classes (nll_loss, cross_entropy), a token id >= the vocabulary "
        "(embedding), an index past a tensor's size; rerun with CUDA_LAUNCH_BLOCKING=1 (or on "
        "CPU) to get the Python line, and check the batch's min/max against the sizes",
    (FindingId.JOB_KERNEL_ABI, "undefined symbol"):
        "a compiled package (one of the kernel packages setup builds, a custom op) was "
        "built against another torch, CUDA or C++ ABI than the one installed: rebuild it against "
        "this torch or install the wheel made for it; `invoke build-check` compares them",
    (FindingId.JOB_SCRIPT, "missing"):
        "the script the launcher was told to run is not there on that node: a relative path "
        "from another working directory (Slurm runs a batch script from its spool directory: "
        "use an absolute path or cd first), or a file system not mounted there",
    (FindingId.JOB_ACCELERATOR_OOM, "xla"):
        "the XLA device (TPU or GPU) ran out of memory or another resource at compile or run "
        "time: a smaller batch or sequence, more sharding, or rematerialisation",
    (FindingId.JOB_NUMERICS, "loss scale"):
        "the fp16 loss scale fell to its minimum: gradients overflow at every step; use bf16, "
        "a lower learning rate, gradient clipping, or a higher min loss scale",
}


def _who(items: Sequence[Hit | Failing], prompts: list[str] | None = None) -> str:
    """Who printed these events: ranks as ranges, srun task ids, hosts (or, when no line
    names one, the host of the one shell prompt pasted with them)."""
    prompts = prompts if prompts and len(prompts) == 1 else []
    got = [(x.rank, x.host, x.tasks, x.local) for x in items]
    rs = sorted({r for r, _, _, _ in got if r is not None})
    hosts = list(dict.fromkeys(h for _, h, _, _ in got if h)) or prompts
    tasks = sorted({t for _, _, ts, _ in got for t in ts})
    local = sorted({lr for _, _, _, lr in got if lr is not None})
    out = (launch.ranks(rs) if rs else
           launch.ranks(local).replace("rank", "local rank") if local else "")
    if tasks:
        out = (out + "; " if out else "") + "srun " + launch.ranks(tasks).replace("rank", "task")
    if hosts:
        out = (out + " on " if out else "on ") + ", ".join(hosts[:4]) + (
            f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
    return out


def _placed(x: Hit) -> str:
    """An evidence line with who printed it and when, where the log said."""
    who = " on ".join(w for w in (f"rank {x.rank}" if x.rank is not None else "",
                                  x.host or "") if w)
    head = ", ".join(w for w in (who, x.time or "") if w)
    return f"{head}: {x.line}" if head else x.line


def _own_errors(ev: Events, what: str) -> list[str]:
    """The exception a finding names, as its own traceback ended (a DataLoader worker's
    "Caught X in DataLoader worker" is followed by the worker's traceback, whose last line
    says which sample and why)."""
    return list(dict.fromkeys(
        x.line for x in ev.failing if x.kind == "exception" and x.name in what
        and "Caught " not in x.line))[:2]


def table(ev: Events, skip: frozenset[str] = frozenset()) -> list[Finding]:
    """One finding per id of the table's hits: what happened first (in time) first."""
    by_id: dict[str, list[Hit]] = defaultdict(list)
    for h in ev.hits:
        if h.id not in skip:
            by_id[h.id].append(h)
    out = []
    for fid, hs in by_id.items():
        hs = in_time_order(hs)
        h0 = first(hs)
        whats = list(dict.fromkeys(h.what for h in hs))
        who = _who(hs, ev.prompts)
        fam = families.family(fid)
        fix = _FIX.get((fid, h0.kind), fam.advice)
        out.append(Finding(
            fid, Status.FAIL, f"{whats[0]}" + (f" ({who})" if who else "")
            + (f"; also: {'; '.join(whats[1:3])}" if len(whats) > 1 else ""),
            [_placed(h) for h in hs[:4]] + _own_errors(ev, whats[0]), fix, h0.kind))
    return out


def _failing_lines(items: list[Failing]) -> list[Failing]:
    """The failure-looking lines to quote: exceptions first (first in time first), then
    tracebacks cut before their exception line, exit codes, then error lines."""
    order = {"exception": 0, "traceback": 1, "exit": 2, "pod": 3, "error": 4}
    return sorted(in_time_order(items), key=lambda x: order.get(x.kind, 4))


def outcome(ev: Events, failed: bool) -> list[Finding]:
    """The finding of a log no named failure explains (none when `failed`): a failure-looking
    line no end excuses, a clean end (`sig_end`: the run's own end line, after which no failure
    was printed, or the exit path of processes that ended on their own, with no failure seen at
    all), else a log that cannot tell (`job.stopped`, inconclusive: exit 3)."""
    if failed:
        return []
    ends = [e for e in ev.ends if not e.exit]
    last_end = max((e.seq or 0 for e in ends), default=None)
    fails = [x for x in ev.failing if last_end is None or (x.seq or 0) > last_end]
    if fails:
        return [_unrecognised(ev, fails)]
    if ev.tail.get("progress_after_end"):
        return [_stopped(ev)]
    if last_end is not None:
        end = next(e for e in ends if (e.seq or 0) == last_end)
        return [Finding(FindingId.JOB_CLEAN, Status.PASS, f"the log ends normally: {end.line}",
                        [e.line for e in ends[-3:]], "", "clean")]
    exits = [e for e in ev.ends if e.exit]
    if exits and _every_rank(ev, exits):
        return [Finding(FindingId.JOB_CLEAN, Status.PASS, "the processes exited on their own, "
                        f"with no failure in the log: {exits[-1].line}",
                        [e.line for e in exits[-3:]], "", "clean")]
    return [_stopped(ev)]


def _every_rank(ev: Events, exits: list[End]) -> bool:
    """Did every rank the logs name print its way out? (One rank that exited while another
    still waits is a hang, not an end.)"""
    ranks = {e.rank for e in exits if e.rank is not None}
    return len(ev.ranks_seen) < 2 or not ranks or ev.ranks_seen <= ranks


def _unrecognised(ev: Events, fails: list[Failing]) -> Finding:
    shown = _failing_lines(fails)
    x0 = shown[0]
    who = _who(fails)
    if x0.kind == "traceback":  # the rank's own failure, its exception line cut off
        return Finding(
            FindingId.JOB_UNRECOGNISED, Status.FAIL,
            f"{_who([x0]) or 'a process'}'s traceback was cut before its exception line"
            + (f" (innermost frame {x0.frame})" if x0.frame else "") + f": {x0.line}",
            [x.line for x in shown[:6]],
            "the log stops inside a traceback: the lines after it (the exception that ended "
            "that process) are missing; find the full log of that rank (its own file, the "
            "scheduler's output) or rerun to get them", "unrecognised")
    where = {"user": "raised in the training code", "framework": "raised inside an installed "
             "package"}.get(x0.where, "")
    what = (x0.name if x0.kind == "exception" else
            f"exit code {x0.code}" if x0.kind == "exit" else
            "a pod that keeps failing (`kubectl logs --previous POD` shows why)"
            if x0.kind == "pod" else "an error line")
    return Finding(
        FindingId.JOB_UNRECOGNISED, Status.FAIL,
        f"the log shows a failure no signature names: {what}"
        + (f", {where}" + (f" ({x0.frame})" if x0.frame else "") if where else "")
        + (f" ({who})" if who else "") + f": {x0.line}",
        [x.line for x in shown[:6]],
        "the quoted lines are what looks like the failure; the traceback above the first one "
        "in the log says where. Please report it so the next version names it: open an issue "
        "with these lines (or the whole log) and the output of `invoke report`",
        x0.where or "unrecognised")


def _stopped(ev: Events) -> Finding:
    tail = ev.tail
    said = []
    if tail.get("time"):
        said.append(f"last time printed {tail['time']}")
    if tail.get("iteration"):
        said.append(f"last progress: {tail['iteration']}")
    printing = tail.get("ranks") or []
    silent = sorted(ev.ranks_seen - set(printing))
    if printing:
        said.append(f"{launch.ranks(printing)} still printing at the end")
    if silent and printing:
        said.append(f"{launch.ranks(silent)} silent at the end")
    last = tail.get("last") or ""
    return Finding(
        FindingId.JOB_STOPPED, Status.INCONCLUSIVE,
        "inconclusive: the log ends with neither an error nor a normal end (a hang, a kill "
        "from outside, or a log cut short)" + (": " + "; ".join(said) if said else ""),
        [f"last line: {last}"] if last else [], _STOPPED_NEXT, INCONCLUSIVE)
