"""Findings about how the job's processes were started and ended, not about their collectives:
the rendezvous that never happened, a Ray worker that died, a flight-recorder dump signal that
is the only trace of a timeout on another rank, a process a signal killed, Horovod's stall
inspector. Pure functions of `events.Events`; kept apart
from `triage` so each module keeps one subject (and its size)."""

from __future__ import annotations

import re

from megatron_env.diagnose.events import Events, describe
from megatron_env.findings import Finding


def ranks(rs) -> str:
    """'rank 5', 'ranks 0, 1 and 2', 'ranks 0-498 and 500' as a person would say it: runs of
    three or more as ranges (500 ranks are one range, not 500 numbers)."""
    rs = sorted(set(rs))
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
    parts = [f"{x[0]}-{x[-1]}" if len(x) >= 3 else y for x in runs
             for y in ([None] if len(x) >= 3 else map(str, x))]
    if len(parts) > 12:
        parts = [*parts[:12], f"{len(parts) - 12} more"]
    return "ranks " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1
                       else parts[0])


_ranks = ranks


def rendezvous(ev: Events) -> list[Finding]:
    if not ev.rendezvous:
        return []
    r = ev.rendezvous[0]
    hosts = sorted({x["host"] for x in ev.rendezvous if x["host"]})
    store = next((x["store"] for x in ev.rendezvous if x["store"]), None) or next(
        iter(ev.stores), None)
    return [Finding(
        "job.rendezvous", "fail",
        f"the rendezvous failed{' on ' + ', '.join(hosts[:4]) if hosts else ''}: {r['error']}"
        + (f", the store at {store} could not be reached" if store else "")
        + f" ({r['what']})" * bool(r["what"]),
        [f"{x['host'] or 'a rank'}: {x['error']}: {x['what']}" for x in ev.rendezvous[:4]]
        + [f"store address: {s}" for s in ev.stores[:4]],
        "every node must reach MASTER_ADDR:MASTER_PORT (the rank-0 host) before the job starts: "
        "check the address is the right interface, a firewall allows the port, and rank 0 "
        "started; `invoke preflight` on the nodes checks the links")]


def ray_deaths(ev: Events) -> list[Finding]:
    if not ev.ray_deaths:
        return []
    d = ev.ray_deaths
    return [Finding(
        "job.ray_worker", "fail",
        f"a Ray worker died: PID {d[0]['pid']} on {d[0]['ip']}"
        + (f" ({d[0]['exit']})" if d[0]["exit"] else "")
        + (f", and {len(d) - 1} more" if len(d) > 1 else ""),
        [f"worker PID {x['pid']} on {x['ip']}: {x['exit'] or 'exit unknown'}" for x in d[:6]],
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
        "job.timeout", "fail",
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
    "SIGKILL": "killed from outside: the kernel's OOM killer (`dmesg`, host memory) or the "
               "scheduler (time or memory limit: `sacct -j JOB -o State,MaxRSS`)",
    "SIGTERM": "terminated from outside: the scheduler (time limit, preemption, scancel) or "
               "torchrun ending the other workers after one failed: find that one first",
}


def signals(ev: Events) -> list[Finding]:
    """Processes a signal killed: one finding per signal, who it hit named from the job model."""
    by: dict[str, list[dict]] = {}
    for s in ev.signals:
        by.setdefault(s["signal"], []).append(s)
    out = []
    for name, ss in by.items():
        who = sorted({describe(ev.who(s)) for s in ss})
        what = ss[0]["what"]
        worker = all(s["worker"] for s in ss)
        agent = all(s["agent"] for s in ss)
        subject = ("a DataLoader worker" if worker else "torchrun's agent" if agent else
                   f"{len(who)} process(es)" if len(who) > 4 else ", ".join(who))
        fix = _SIGNAL_FIX.get(name, "the lines before it in that process's log say what it was "
                                    "doing; `py-spy dump` or a core dump says where")
        if worker and name == "SIGBUS":
            fix = ("DataLoader workers pass batches through /dev/shm: give the container "
                   "--shm-size or --ipc=host, or fewer workers (num_workers)")
        out.append(Finding(
            "job.signal", "fail",
            f"{subject} killed by {name}" + (f" ({what})" if what != name else "")
            + (f" on {', '.join(who[:4])}" if worker and who != ["a process"] else ""),
            [s["line"] for s in ss[:4]] + (who[4:8] if len(who) > 4 else []), fix))
    return out


_STALL_ACTION = re.compile(r"Horovod(Allreduce|Allgather|Broadcast|Alltoall|Reducescatter)", re.I)


def stalls(ev: Events) -> list[Finding]:
    """Horovod's stall inspector: the ranks that never submitted the tensors the rest wait on."""
    if not ev.stalls:
        return []
    missing = sorted({r for s in ev.stalls for r in s["ranks"]})
    ready = sorted({r for s in ev.stalls for r in s["ready"]})
    if not missing and ready:  # only the ready ones named: the gaps among them are missing
        missing = sorted(set(range(ready[-1] + 1)) - set(ready))
    ops = list(dict.fromkeys(s["op"] for s in ev.stalls))  # as first reported
    kinds = sorted({m.group(1).lower() for o in ops if (m := _STALL_ACTION.search(o))})
    return [Finding(
        "job.stall", "fail",
        f"Horovod's stall inspector: {ranks(missing) if missing else 'a rank'} never submitted "
        f"{len(ops)} tensor(s) the other ranks wait on"
        + (f" ({', '.join(kinds)})" if kinds else "")
        + (f" ({ranks(ready)} ready)" if ready else "")
        + f", e.g. {ops[0]}",
        [f"{o} [missing {ranks({r for s in ev.stalls if s['op'] == o for r in s['ranks']})}]"
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
    hosts = sorted({x["host"] for x in ev.bootstrap if x["host"]})
    return [Finding(
        "job.bootstrap", "fail",
        f"NCCL's bootstrap root{' on ' + ', '.join(hosts) if hosts else ''}: rank {b['rank']} "
        f"of {b['nranks']} ranks has already checked in (two processes claim one rank)",
        [f"rank {x['rank']} of {x['nranks']} checked in twice"
         + (f" (root on {x['host']})" if x["host"] else "") for x in ev.bootstrap[:4]],
        "two processes were given the same rank: a launcher started twice per node (srun "
        "--ntasks-per-node against torchrun's own --nproc_per_node, or Lightning under srun "
        "with mismatched devices/num_nodes), or two jobs share MASTER_ADDR:MASTER_PORT")]


def cancelled(ev: Events) -> list[Finding]:
    """Slurm cancelled the step or job: nothing inside the job failed first, or it did earlier."""
    if not ev.cancelled:
        return []
    c = ev.cancelled[0]
    return [Finding(
        "job.slurm_cancelled", "fail",
        f"Slurm cancelled {c['what']} {c['id']} on {c['host']} at {c['at']}"
        + (f" due to {c['why']}" if c["why"] else ""),
        [f"{x['what']} {x['id']} on {x['host']} cancelled at {x['at']}"
         + (f" ({x['why']})" if x["why"] else "") for x in ev.cancelled[:4]],
        "a time limit raises --time (or checkpoint more often and requeue); otherwise someone or "
        "something ran scancel (preemption, a node failure, the job's own error handler): "
        "`sacct -j JOB -o JobID,State,ExitCode,Reason` says which")]


def findings(ev: Events) -> list[Finding]:
    return (rendezvous(ev) + ray_deaths(ev) + dump_signal(ev) + signals(ev)
            + stalls(ev) + bootstrap(ev) + cancelled(ev))
