"""Findings about how the job's processes were started and ended, not about their collectives:
the rendezvous that never happened, a Ray worker that died, a flight-recorder dump signal that
is the only trace of a timeout on another rank. Pure functions of `events.Events`; kept apart
from `triage` so each module keeps one subject (and its size)."""

from __future__ import annotations

from megatron_env.diagnose.events import Events
from megatron_env.findings import Finding


def _ranks(rs) -> str:
    rs = sorted(set(rs))
    return (f"rank {rs[0]}" if len(rs) == 1 else
            "ranks " + ", ".join(map(str, rs[:-1])) + f" and {rs[-1]}")


def rendezvous(ev: Events) -> list[Finding]:
    if not ev.rendezvous:
        return []
    r = ev.rendezvous[0]
    hosts = sorted({x["host"] for x in ev.rendezvous if x["host"]})
    store = next((x["store"] for x in ev.rendezvous if x["store"]), None)
    return [Finding(
        "job.rendezvous", "fail",
        f"the rendezvous failed{' on ' + ', '.join(hosts[:4]) if hosts else ''}: {r['error']}"
        + (f", the store at {store} could not be reached" if store else "")
        + f" ({r['what'][-80:]})" * bool(r["what"]),
        [f"{x['host'] or 'a rank'}: {x['error']}: {x['what']}" for x in ev.rendezvous[:4]],
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


def findings(ev: Events) -> list[Finding]:
    return rendezvous(ev) + ray_deaths(ev) + dump_signal(ev)
