"""Findings about how the job's processes were started and ended, not about their collectives:
the rendezvous that never happened, a Ray worker that died, a flight-recorder dump signal that
is the only trace of a timeout on another rank, a process a signal killed, Horovod's stall
inspector. Pure functions of `events.Events`; kept apart
from `triage` so each module keeps one subject (and its size)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from megatron_env.diagnose.ids import FindingId
from megatron_env.diagnose.model import Events, Hit, Rendezvous, Signal, first, in_time_order
from megatron_env.findings import Finding, Status


def ranks(given: Iterable[int]) -> str:
    """'rank 5', 'ranks 0, 1 and 2', 'ranks 0-498 and 500' as a person would say it: runs of
    three or more as ranges (500 ranks are one range, not 500 numbers)."""
    rs = sorted(set(given))
    if not rs:
        return "no rank"
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if len(rs) > 3 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    if len(rs) <= 8:
        return "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}"
    runs: list[list[int]] = []
    for r in rs:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [p for x in runs for p in ([f"{x[0]}-{x[-1]}"] if len(x) >= 3 else map(str, x))]
    if len(parts) > 12:
        parts = [*parts[:12], f"{len(parts) - 12} more"]
    return "ranks " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1
                       else parts[0])


_ranks = ranks


def rendezvous(ev: Events) -> list[Finding]:
    """The rendezvous or store that failed: where the store was, who could not reach it, and
    whether a heartbeat was lost or a name did not resolve (the table's `job.rendezvous` hits)."""
    hits = [h for h in ev.hits if h.id == FindingId.JOB_RENDEZVOUS]
    if not ev.rendezvous and not hits:
        return []
    items: list[Rendezvous | Hit] = in_time_order([*ev.rendezvous, *hits])
    r = first(items)
    store = next((x.store for x in items if x.store), None) or next(iter(ev.stores), None)
    failed = [x for x in items if x.rank is not None or x.host]
    rs = sorted({x.rank for x in failed if x.rank is not None})
    hosts = list(dict.fromkeys(x.host for x in failed if x.host))
    who = " on ".join(x for x in (ranks(rs) if rs else "", ", ".join(hosts[:4])) if x)
    error = r.error if isinstance(r, Rendezvous) else ""
    what = error + (": " if error else "") + r.what
    kinds = {h.kind for h in hits}
    kind = ("name resolution" if "name resolution" in kinds else
            "heartbeat" if "heartbeat" in kinds else "store")
    return [Finding(
        FindingId.JOB_RENDEZVOUS, Status.FAIL,
        {"name resolution": "a host name did not resolve",
         "heartbeat": "a node lost the rendezvous' heartbeat",
         "store": "the rendezvous failed"}[kind]
        + (f": {who} could not reach" if who else ": could not reach")
        + (f" the store at {store}" if store else " the store")
        + (f" ({what})" if what else ""),
        [x.line if isinstance(x, Hit) else f"{x.host or 'a rank'}: {x.error}: {x.what}"
         for x in items[:4]] + [f"store address: {s}" for s in ev.stores[:4]],
        _RDZV_FIX[kind], kind)]


_RDZV_FIX = {
    "store": "every node must reach MASTER_ADDR:MASTER_PORT (the rank-0 host, or "
             "--rdzv_endpoint) while the job starts: check the address is the right interface, "
             "a firewall allows the port, and the store's host (rank 0) was up and had not "
             "already failed; `invoke preflight` on the nodes checks the links",
    "heartbeat": "a node stopped answering the rendezvous' keep-alive heartbeats: it died (its "
                 "own log and `dmesg`: OOM killer, a hardware fault) or the network to it "
                 "failed; `invoke preflight` on it before it rejoins",
    "name resolution": "a host name did not resolve: use an IP address or a name every node "
                       "resolves for MASTER_ADDR / --rdzv_endpoint (`getent hosts NAME` on each "
                       "node), and check /etc/hosts or DNS inside the container",
}


def ray_deaths(ev: Events) -> list[Finding]:
    if not ev.ray_deaths:
        return []
    d = ev.ray_deaths
    return [Finding(
        FindingId.JOB_RAY_WORKER, Status.FAIL,
        f"a Ray worker died: PID {d[0].pid} on {d[0].ip}"
        + (f" ({d[0].exit})" if d[0].exit else "")
        + (f", and {len(d) - 1} more" if len(d) > 1 else ""),
        [f"worker PID {x.pid} on {x.ip}: {x.exit or 'exit unknown'}" for x in d[:6]],
        "Ray names the usual causes: the kernel's OOM killer (`dmesg` on that node, host "
        "memory), `ray stop --force`, or a crash (SIGSEGV); the worker's own log under "
        "/tmp/ray/session_latest/logs holds its last lines")]


def dump_signal(ev: Events) -> list[Finding]:
    """A rank received PyTorch's flight-recorder dump signal for a timeout on another rank, and
    that rank's own watchdog line is not in these logs."""
    if not ev.first_timeout or ev.timeouts:
        return []
    seen = sorted(ev.dump_seen_by - ev.first_timeout)
    return [Finding(
        FindingId.JOB_TIMEOUT, Status.FAIL,
        f"{_ranks(ev.first_timeout)} timed out first: "
        + (f"{_ranks(seen)} received the flight-recorder dump signal for it"
           if seen else "its collective timed out (the flight-recorder dump signal)"),
        [f"dump signal due to a collective timeout from rank {r}"
         for r in sorted(ev.first_timeout)[:6]],
        f"read {_ranks(ev.first_timeout)}'s own log: its watchdog line names the collective and "
        "SeqNum, and the flight-recorder dump (TORCH_NCCL_DEBUG_INFO_TEMP_FILE) its stack")]


_SIGNAL_FIX = {
    "SIGBUS": "a bus error in a training process is almost always shared memory running out "
              "(/dev/shm, which NCCL and DataLoader workers use): give the container "
              "--shm-size=64g or --ipc=host, or check `df -h /dev/shm` on the host",
    "SIGSEGV": "a crash in native code: compiled kernels built against another torch (`invoke "
               "build-check`), or a driver fault (Xid lines in `dmesg`); the backtrace names "
               "the library",
    "SIGABRT": "an abort: usually PyTorch's NCCL watchdog ending the process after a timeout or "
               "an NCCL error (see those findings), else a failed C++ assertion just above",
    "SIGKILL": "killed from outside, most often by the host's OOM killer: `dmesg -T | grep -i "
               "-e oom -e 'Killed process'` on that node, the job's peak host memory (`sacct -j "
               "JOB -o MaxRSS,ReqMem`), the container's memory limit (exit 137, OOMKilled); "
               "else the scheduler (time limit, scancel) or a person",
    "SIGTERM": "terminated from outside: the scheduler (time limit, preemption, scancel) or "
               "the launcher ending the other workers after one failed: find that one first",
}


def _subject(ev: Events, ss: list[Signal]) -> str:
    """Who a signal hit: ranks as ranges, srun task ids and local ranks named as such."""
    rs = sorted({s.rank for s in ss if s.rank is not None})
    tasks = sorted({t for s in ss for t in s.tasks})
    local = sorted({s.local for s in ss if s.local is not None})
    hosts = list(dict.fromkeys(h for s in ss if (h := ev.who(s)["host"])))
    pids = list(dict.fromkeys(s.pid for s in ss if s.pid))
    parts = [ranks(rs)] if rs else []
    parts += ["srun " + ranks(tasks).replace("rank", "task")] if tasks else []
    parts += [ranks(local).replace("rank", "local rank")] if local and not rs else []
    parts += [("pid " if len(pids) == 1 else "pids ") + ", ".join(pids[:6])] if pids and not (
        rs or tasks) else []
    who = ", ".join(parts) or ("torchrun's agent" if all(s.agent for s in ss)
                               else "a process")
    if not hosts and len(ev.pods) == 1:
        return f"{who} in pod {ev.pods[0]}"
    return who + (f" on {', '.join(hosts[:4])}" if hosts else "")


def signals(ev: Events) -> list[Finding]:
    """Processes a signal killed: one finding per signal, the first in time first."""
    by: dict[str, list[Signal]] = {}
    for s in in_time_order(ev.signals):
        by.setdefault(s.signal, []).append(s)
    oom = any(h.id == FindingId.JOB_OOM_KILLER for h in ev.hits)
    out = []
    for name, ss in by.items():
        what = ss[0].what
        code = next((s.code for s in ss if s.code not in (None, 0)), None)
        fix = _SIGNAL_FIX.get(name, "the lines before it in that process's log say what it was "
                                    "doing; `py-spy dump` or a core dump says where")
        if name == "SIGKILL" and oom:
            fix = "the host's OOM killer sent it (see job.oom_killer): " + fix
        agent = all(s.agent for s in ss)
        op = next((ev.collective[s.rank] for s in ss if s.rank in ev.collective),
                  None) or ev.collective.get(None)
        out.append(Finding(
            FindingId.JOB_SIGNAL, Status.FAIL,
            f"{_subject(ev, ss)} killed by {name}" + (f" ({what})" if what != name else "")
            + (f" in {op}" if op else "")
            + (f", exit code {code}" if code is not None else ""),
            [s.line for s in ss[:4]], fix,
            "agent" if agent else "launcher" if any(s.table for s in ss) else name))
    return out


_STALL_ACTION = re.compile(r"Horovod(Allreduce|Allgather|Broadcast|Alltoall|Reducescatter)", re.I)


def stalls(ev: Events) -> list[Finding]:
    """Horovod's stall inspector: the ranks that never submitted the tensors the rest wait on."""
    if not ev.stalls:
        return []
    missing = sorted({r for s in ev.stalls for r in s.ranks})
    ready = sorted({r for s in ev.stalls for r in s.ready})
    if not missing and ready:  # only the ready ones named: the gaps among them are missing
        missing = sorted(set(range(ready[-1] + 1)) - set(ready))
    ops = list(dict.fromkeys(s.op for s in ev.stalls))  # as first reported
    kinds = sorted({m.group(1).lower() for o in ops if (m := _STALL_ACTION.search(o))})
    return [Finding(
        FindingId.JOB_STALL, Status.FAIL,
        f"Horovod's stall inspector: {ranks(missing) if missing else 'a rank'} never submitted "
        f"{len(ops)} tensor(s) the other ranks wait on"
        + (f" ({', '.join(kinds)})" if kinds else "")
        + (f" ({ranks(ready)} ready)" if ready else "")
        + f", e.g. {ops[0]}",
        [f"{o} [missing {ranks({r for s in ev.stalls if s.op == o for r in s.ranks})}]"
         if not ready else f"{o} [ready {ranks(ready)}]" for o in ops[:6]],
        f"{ranks(missing) if missing else 'the rank not ready'} took another code path or died: "
        "read its log for an error; ranks that "
        "submit tensors under different names or in a different order (a conditional branch, "
        "a layer built only on some ranks) deadlock the same way; "
        "HOROVOD_STALL_CHECK_TIME_SECONDS sets when the inspector reports")]


def bootstrap(ev: Events) -> list[Finding]:
    """NCCL's bootstrap root saw one rank check in twice: two processes claim one rank."""
    if not ev.bootstrap:
        return []
    b = ev.bootstrap[0]
    hosts = sorted({x.host for x in ev.bootstrap if x.host})
    return [Finding(
        FindingId.JOB_BOOTSTRAP, Status.FAIL,
        f"NCCL's bootstrap root{' on ' + ', '.join(hosts) if hosts else ''}: rank {b.rank} "
        f"of {b.nranks} ranks has already checked in (two processes claim one rank)",
        [f"rank {x.rank} of {x.nranks} checked in twice"
         + (f" (root on {x.host})" if x.host else "") for x in ev.bootstrap[:4]],
        "two processes were given the same rank: a launcher started twice per node (srun "
        "--ntasks-per-node against torchrun's own --nproc_per_node, or Lightning under srun "
        "with mismatched devices/num_nodes), or two jobs share MASTER_ADDR:MASTER_PORT")]


def cancelled(ev: Events) -> list[Finding]:
    """The scheduler ended the job: Slurm's cancellation line (the reason it names), and the
    table's scheduler hits (PBS, LSF, Kubernetes eviction, srun's force-terminate)."""
    hits = [h for h in ev.hits if h.id == FindingId.JOB_SCHEDULER]
    if not ev.cancelled and not hits:
        return []
    if not ev.cancelled:
        return []  # the table's own finding says it (outcome.table)
    c = first(ev.cancelled)
    why = c.why
    kind = ("time limit" if "time limit" in why else "preemption" if "preempt" in why else
            "node failure" if "node fail" in why else "cancelled")
    return [Finding(
        FindingId.JOB_SCHEDULER, Status.FAIL,
        f"Slurm cancelled {c.what} {c.id} on {c.host} at {c.at}"
        + (f" due to {why}" if why else " (scancel, or the scheduler without a reason)"),
        [f"{x.what} {x.id} on {x.host} cancelled at {x.at}" for x in ev.cancelled[:4]]
        + [h.line for h in hits[:2]],
        _CANCEL_FIX[kind], kind)]


_CANCEL_FIX = {
    "time limit": "the job reached its time limit: raise --time, or checkpoint more often and "
                  "requeue (--signal=USR1@120 lets the job save before it is killed)",
    "preemption": "a higher-priority job preempted it: requeue (--requeue) and resume from the "
                  "last checkpoint",
    "node failure": "a node failed under the job: `sinfo -R` names it; drain and check it "
                    "(`invoke preflight`) before it rejoins",
    "cancelled": "someone or something ran scancel (a person, a workflow, the job's own error "
                 "handler): `sacct -j JOB -o JobID,State,ExitCode,Reason` says which",
}


def findings(ev: Events) -> list[Finding]:
    return (rendezvous(ev) + ray_deaths(ev) + dump_signal(ev) + signals(ev)
            + stalls(ev) + bootstrap(ev) + cancelled(ev))
