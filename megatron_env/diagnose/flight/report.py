"""The flight recorder's finding: `job.hang`, the root rank first, fused with the logs.

Why here and not in `triage`: the dumps are read and analysed apart from the log lines
(`dump`, `analysis`); what the logs add is two facts, taken by `log_facts`: the watchdog's
timeout lines (rank, SeqNum, op), which must agree with the dumps' sequence ids, and the host
each rank ran on. `join` puts the finding among the logs' own, by triage's order of causes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from megatron_env.diagnose import launch
from megatron_env.diagnose.flight import analysis, dump
from megatron_env.diagnose.flight.analysis import Hang, Wait
from megatron_env.diagnose.ids import FindingId
from megatron_env.diagnose.model import Events
from megatron_env.errors import UserError
from megatron_env.findings import Finding, Status

ranks = launch.ranks
Timeout = tuple[int, int | None, str | None]  # (rank, SeqNum, op) of a watchdog timeout line
_FRAMES = 4  # the stuck rank's frames shown
_INTERNAL = ("/torch/distributed/", "/torch/multiprocessing/", "/multiprocessing/",
             "<string>", "/threading.py", "/runpy.py")


def read(paths: Iterable[Path]) -> list[dump.Dump]:
    """Every dump, each read whole (a bad one stops here, naming it); one dump per rank."""
    out: dict[int, dump.Dump] = {}
    with dump.paused_gc():
        for p in paths:
            d = dump.read(p)
            if d.rank in out:
                raise UserError(f"{p} and {out[d.rank].path} are both dumps of rank {d.rank}",
                                fix="pass one job's dumps, one file per rank",
                                kind="triage.dump-twice")
            out[d.rank] = d
    return [out[r] for r in sorted(out)]


def file_hosts(dumps: list[dump.Dump]) -> dict[int, str]:
    """Hosts from the file names: the directory of each dump, where they were gathered one
    directory per node (dumps in one directory say nothing of hosts)."""
    dirs = {d.rank: Path(d.path).parent.name for d in dumps}
    return dirs if len(set(dirs.values())) > 1 else {}


def log_facts(evs: Iterable[Events]) -> tuple[list[Timeout], dict[int, str]]:
    """What the logs' events say that the dumps need: the watchdog's timeouts and the host of
    each rank."""
    timeouts: list[Timeout] = []
    hosts: dict[int, str] = {}
    for ev in evs:
        for t in ev.timeouts:
            rank, host = t.rank, t.host
            if rank is not None:
                timeouts.append((rank, t.seqnum, t.op or None))
                if host:
                    hosts.setdefault(rank, host)
        for r, p in ev.job.by_rank.items():
            if p.get("host"):
                hosts.setdefault(r, p["host"])
    return timeouts, hosts


def _group(pg: str, desc: str) -> str:
    if desc == "default_pg":
        return "the default group"
    return f"group {pg}" + (f" ({desc})" if desc and desc not in ("undefined", pg) else "")


def _who(rs: Iterable[int], hosts: dict[int, str]) -> str:
    rs = sorted(set(rs))
    on = sorted({hosts[r] for r in rs if r in hosts})
    return ranks(rs) + (f" on {', '.join(on[:4])}" if on else "")


def _where(w: Wait) -> str:
    return f"{w.op} #{w.seq} of {_group(w.pg, w.desc)}"


def _frames(fr: list[tuple[str, str, int]]) -> str:
    own = [f for f in fr if not any(x in f[1] for x in _INTERNAL)] or fr
    return " <- ".join(f"{name} ({'/'.join(Path(file).parts[-2:])}:{line})"
                       for name, file, line in own[:_FRAMES])


def _root_said(h: Hang, r: int, hosts: dict[int, str]) -> str:
    waits = {w.rank: w for w in h.waits}
    odd = {x: dv for dv in h.divergences for x in [*dv.other_op, *dv.mismatch]}
    who = _who([r], hosts)
    if r in odd:
        dv = odd[r]
        rest = [x for x in dv.entered if x not in dv.other_op and x not in dv.mismatch]
        if r in dv.other_op:
            return (f"{who} entered {dv.other_op[r]} #{dv.seq} of {_group(dv.pg, dv.desc)} "
                    f"where {ranks(rest)} entered {dv.op}")
        return (f"{who} entered {dv.op} #{dv.seq} of {_group(dv.pg, dv.desc)} with "
                f"{dv.mismatch[r]}, unlike {ranks(rest)}")
    if r in waits:
        w = waits[r]
        return (f"every member of {_group(w.pg, w.desc)} entered {w.op} #{w.seq} and it never "
                f"completed ({who} among them): the collective itself hung")
    last = h.last_done.get(r)
    after = f" after {last[3]} #{last[2]} of {_group(last[0], last[1])}" if last else ""
    return f"{who} never arrived: it is in no collective{after}"


def summary(h: Hang, hosts: dict[int, str]) -> str:
    said = "; ".join(_root_said(h, r, hosts) for r in h.roots)
    by_where: dict[tuple[str, int, str, str], list[Wait]] = defaultdict(list)
    for w in h.waits:
        if w.rank not in h.roots:
            by_where[(w.pg, w.seq, w.op, w.desc)].append(w)
    waiting = [f"{_who([w.rank for w in ws], hosts)} "
               f"wait{'s' if len(ws) == 1 else ''} in {_where(ws[0])}"
               + (f" for {ranks({x for w in ws for x in w.on})}" if ws[0].on else "")
               for ws in by_where.values()]
    return said + ("; " + ", ".join(waiting) if waiting else "")


def evidence(h: Hang, dumps: list[dump.Dump], timeouts: list[Timeout],
             hosts: dict[int, str]) -> list[str]:
    out = []
    for dv in h.divergences:
        parts = [f"entered by {ranks(dv.entered)}" if dv.entered else "entered by no rank"]
        if dv.missing:
            parts.append(f"never by {ranks(dv.missing)}")
        parts += [f"rank {r} in {op}" for r, op in sorted(dv.other_op.items())]
        parts += [f"rank {r} with {s}" for r, s in sorted(dv.mismatch.items())]
        if dv.unknown:
            parts.append(f"{ranks(dv.unknown)} unknown (the buffer wrapped past the group)")
        out.append(f"{_group(dv.pg, dv.desc)}, first divergence at {dv.op} #{dv.seq}: "
                   + ", ".join(parts))
    for pg in h.unknown_peers:
        out.append(f"{_group(pg, '')}: only its waiting rank's entries carry it (gloo names no "
                   "members), so its peers are taken to be the ranks outside every collective")
    for r, fr in h.frames.items():
        where = "stuck at" if r in {w.rank for w in h.waits} else "last in a collective at"
        out.append(f"rank {r} {where}: {_frames(fr)}")
    done: dict[tuple[str, str, int, str], list[int]] = defaultdict(list)
    for r in sorted(h.last_done):
        done[h.last_done[r]].append(r)
    out += [f"last completed: {ranks(rs)} {op} #{seq} of {_group(pg, desc)}"
            for (pg, desc, seq, op), rs in list(done.items())[:8]]
    none = sorted({d.rank for d in dumps} - set(h.last_done))
    if none:
        out.append(f"no completed collective in the buffer of {ranks(none)}")
    absent = sorted(set().union(*(d.world for d in dumps)) - {d.rank for d in dumps})
    if absent:
        out.append(f"no dump of {ranks(absent)}, which the process-group config names (it "
                   "exited before dumping, or its file was not passed)")
    out += agreement(h, timeouts, {d.rank for d in dumps})
    return out


def _norm(op: str | None) -> str:
    return (op or "").replace("_", "").lower()


def agreement(h: Hang, timeouts: list[Timeout], dumped: set[int]) -> list[str]:
    """Whether the watchdog's timeout lines and the dumps name the same collective."""
    waits = {w.rank: w for w in h.waits}
    agree, differ = [], []
    undumped = sorted({r for r, _, _ in timeouts if r not in dumped})
    for r, seq, op in sorted(set(timeouts)):
        w = waits.get(r)
        if r not in dumped:
            continue
        if w is not None and w.seq == seq and _norm(w.op) == _norm(op):
            agree.append(r)
        else:
            differ.append(f"rank {r}'s log timed out in {op} SeqNum {seq}, its dump "
                          + (f"waits in {_where(w)}" if w else "waits in no collective"))
    out = [f"the logs agree: the watchdog of {ranks(agree)} timed out at the sequence id the "
           "dump shows"] if agree else []
    out += [f"the logs and dumps differ: {x} (dumps of another run or moment?)"
            for x in differ[:4]]
    return out + ([f"no dump of {ranks(undumped)}, whose logs timed out"] if undumped else [])


def findings(dumps: list[dump.Dump], timeouts: list[Timeout] | None = None,
             hosts: dict[int, str] | None = None) -> list[Finding]:
    """`job.hang` when the dumps show ranks waiting, else one line saying they do not."""
    hosts = {**file_hosts(dumps), **(hosts or {})}
    with dump.paused_gc():
        h = analysis.analyse(dumps)
    entries = sum(len(d.entries) for d in dumps)
    if h is None:
        return [Finding(FindingId.JOB_HANG, Status.PASS,
                        f"the flight-recorder dumps of {ranks(d.rank for d in dumps)} show no "
                        f"collective waiting ({entries} entries)", [], "", "clean")]
    if h.all_arrived:
        w = h.waits[0]
        return [Finding(
            FindingId.JOB_HANG, Status.WARN,
            f"every member of {_group(w.pg, w.desc)} entered {w.op} #{w.seq}, and the dumps do "
            "not show it completed: the transport hung, or the ranks were dumped while it "
            "completed; no rank is behind",
            evidence(h, dumps, timeouts or [], hosts),
            "if the job hung here, it is the network or a GPU, not a code path: NCCL_DEBUG=INFO "
            "and `invoke preflight` on the nodes")]
    roots = _who(h.roots, hosts)
    return [Finding(
        FindingId.JOB_HANG, Status.FAIL, "hang: " + summary(h, hosts),
        evidence(h, dumps, timeouts or [], hosts),
        f"look at {roots} first: `py-spy dump --pid` of it while hung says where it is; a rank "
        "that skipped, reordered or changed a collective is a code path that differs between "
        "ranks (a condition on the rank, data-dependent control flow); one that stalls outside "
        "any collective is slow I/O, a dead DataLoader or a host fault (`invoke preflight` on "
        "its node)")]


def join(logs: list[Finding], dumps: list[Finding]) -> list[Finding]:
    """The dumps' finding among the logs' own, where triage's order of causes puts `job.hang`
    (after a rank's own fault, before what the other ranks saw: timeouts, an odd SeqNum); a
    log's clean end does not stand beside a hang the dumps show."""
    from megatron_env.diagnose import families, triage

    hang = any(f.status is Status.FAIL for f in dumps)
    kept = [f for f in logs if not (hang and f.status is Status.PASS)]
    dumps = [Finding(f.id, f.status, f.summary, f.evidence, f.fix, families.family(f.id).name)
             for f in dumps]
    if not hang:
        return kept + dumps
    at = triage.ORDER.index(FindingId.JOB_HANG)
    i = next((k for k, f in enumerate(kept) if f.status is not Status.FAIL
              or f.id not in triage.ORDER or triage.ORDER.index(f.id) > at), len(kept))
    return kept[:i] + dumps + kept[i:]
