"""Which of the logs given belong to one job, and the triage of each job.

Why: a directory often holds the logs of several runs (yesterday's and today's, a restart, an
unrelated job). Compared as one job they make nonsense ("ranks 0, 1, 2, 5, 6 and 7 is the odd
one out"). Each file is read once (streamed) into its own bounded `Events`; files are then put
together while nothing says they differ, and each group is triaged on its own. What tells two
files apart, when the logs show it: a different NCCL timeout (Timeout(ms)), dates more than a
day apart, or the same rank's lines in both (one job writes each rank's lines to one file, or to
the .out/.err pair of one name, or to files that share a job id).
"""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from megatron_env import output
from megatron_env.diagnose import events as events_mod
from megatron_env.diagnose import logfiles, nccl_log, sig_end, triage, twocore
from megatron_env.diagnose.events import Events
from megatron_env.diagnose.flight import report as flight
from megatron_env.diagnose.ids import FindingId
from megatron_env.diagnose.model import Placed
from megatron_env.errors import UserError
from megatron_env.findings import Finding, Status

_JOB_ID = re.compile(r"\d{3,}")


def merge(evs: list[Events]) -> Events:
    """The events of several files of one job as one (each kind still capped)."""
    out = Events()
    out.tail = _tails([ev.tail for ev in evs])
    for ev in evs:
        offset = out.lines
        for f in fields(Events):
            if f.name.startswith("_") or f.name in ("lines", "nccl", "job", "current", "tail",
                                                         "recent"):
                continue
            have, more = getattr(out, f.name), getattr(ev, f.name)
            if isinstance(have, list):
                have += [_shift(x, offset) for x in more[:max(0, events_mod.CAP - len(have))]]
            elif isinstance(have, set):
                have |= more
            else:  # dicts: work status by rank, facts by source
                for k, v in more.items():
                    have.setdefault(k, v)
        out.lines += ev.lines
        out.job.merge(ev.job)
        if ev.nccl is not None:
            out.nccl = nccl_log.merge(out.nccl, ev.nccl)
    return out


def _shift(x: object, offset: int) -> object:
    """An event of a later file, placed after the files read before it."""
    if isinstance(x, Placed):  # (the lists of quoted text and report entries stay as read)
        return replace(x, seq=x.seq + offset) if x.seq is not None else x
    return x


def _day(date: str) -> int:
    month, day = date.split("-")
    return int(month) * 31 + int(day)


def _differ(a: str, fa: dict[str, Any], b: str, fb: dict[str, Any]) -> str:
    """Why files `a` and `b` cannot be one job's ('' when nothing says so)."""
    if fa["timeout_ms"] and fb["timeout_ms"] and fa["timeout_ms"].isdisjoint(fb["timeout_ms"]):
        return (f"Timeout(ms) {min(fa['timeout_ms'])} in {Path(a).name} vs "
                f"{min(fb['timeout_ms'])} in {Path(b).name}")
    if fa["dates"] and fb["dates"] and min(abs(_day(x) - _day(y)) for x in fa["dates"]
                                           for y in fb["dates"]) > 1:
        return f"dated {min(fa['dates'])} in {Path(a).name} vs {min(fb['dates'])} in {Path(b).name}"
    both = fa["ranks"] & fb["ranks"]
    pa, pb = Path(a), Path(b)
    if both and pa.stem != pb.stem and not (set(_JOB_ID.findall(pa.name))
                                            & set(_JOB_ID.findall(pb.name))):
        return f"rank {min(both)} writes to both {pa.name} and {pb.name}"
    return ""


def group(per_file: dict[str, Events]) -> tuple[list[list[str]], list[str]]:
    """Files grouped into jobs (greedily, in the order given), and the reasons for each split."""
    groups: list[list[str]] = []
    reasons: list[str] = []
    for src, ev in per_file.items():
        facts = ev.sources.get(src) or events_mod.new_facts()
        for g in groups:
            why = [w for other in g if (w := _differ(
                other, per_file[other].sources.get(other, facts), src, facts))]
            if not why:
                g.append(src)
                break
            if why[0] not in reasons:
                reasons.append(why[0])
        else:
            groups.append([src])
    return groups, reasons


def _label(srcs: list[str]) -> str:
    names = [Path(s).name for s in srcs]
    return ", ".join(names[:2]) + (f" +{len(names) - 2} more" if len(names) > 2 else "")


PROGRESS_BYTES = 64 << 20  # files at least this big say how far reading them has come


class Progress:
    """How far a big file's reading has come, on stderr: at each tenth of its size, or (a
    compressed file, whose size says little of its text) at each PROGRESS_BYTES read."""

    def __init__(self, path: Path, size: int | None) -> None:
        self.name, self.size, self.done, self.shown = path.name, size, 0, 0

    def __call__(self, n: int) -> None:
        self.done += n
        mb = self.done >> 20
        if self.size:
            step = min(10, self.done * 10 // self.size)
            if step > self.shown:
                self.shown = step
                output.status(f"triage: {self.name}: {step * 10}% ({mb} of "
                              f"{self.size >> 20} MB)")
        elif self.done // PROGRESS_BYTES > self.shown:
            self.shown = self.done // PROGRESS_BYTES
            output.status(f"triage: {self.name}: {mb} MB read")


def _progress(path: Path) -> Progress | None:
    if path == logfiles.STDIN:
        return None
    try:
        size = path.stat().st_size
    except OSError:
        return None  # the reader says why
    if size < PROGRESS_BYTES:
        return None
    return Progress(path, None if logfiles.compressed(path) else size)


def read(path: Path) -> Events | None:
    """One file's events, its cold lines passed over (counted, their rank tags read); None for
    a file with nothing but blank lines."""
    tally = logfiles.Tally()
    tally.progress = _progress(path)
    ev = events_mod.events(twocore.lines(path, events_mod.HOT_PARTS, tally))
    if not tally.text:
        return None
    ev.lines = tally.lines  # the file's physical lines, as `wc -l` counts them
    ev.ranks_seen |= tally.ranks
    ev.sources.setdefault(str(path), events_mod.new_facts())["ranks"] |= tally.ranks
    ev.tail = sig_end.end_state(list(tally.tail), str(path))
    return ev


def _tails(tails: list[dict[str, Any]]) -> dict[str, Any]:
    """How several files of one job end, together: the ranks printing at the end of any, the
    latest time, the progress and last line of the last file."""
    tails = [t for t in tails if t]
    if not tails:
        return {}
    times = sorted(t["time"] for t in tails if t.get("time"))
    return {"time": times[-1] if times else None,
            "iteration": next((t["iteration"] for t in reversed(tails) if t.get("iteration")),
                              None),
            "ranks": sorted({r for t in tails for r in t.get("ranks", [])}),
            "last": tails[-1].get("last", ""),
            "progress_after_end": any(t.get("progress_after_end") for t in tails)}


def run(paths: list[str | Path], skipped: list[str] | None = None,
        ) -> tuple[list[Finding], int, list[str]]:
    """Findings of the logs named (grouped into jobs), the number of lines and the files read;
    the files of a directory that could not be read are left out, each named in `skipped`."""
    dumps: list[Path] = []
    named = logfiles.files(paths, skipped, dumps)
    fr = flight.read(dumps)  # every dump whole before any log: a bad one stops the run
    read_ = {str(f): read(f) for f in named}
    per_file = {k: ev for k, ev in read_.items() if ev is not None}
    empty = [k for k, ev in read_.items() if ev is None]
    if not per_file and not dumps:
        raise UserError(f"{', '.join(empty[:3])}{' ...' if len(empty) > 3 else ''} "
                        f"{'is' if len(empty) == 1 else 'are'} empty: no log lines to triage",
                        fix="pass the job's console output (stdout/stderr of every rank)",
                        kind="triage.empty-log")
    if skipped is not None:
        skipped += [f"{k} (empty)" for k in empty]
    found, lines, srcs = _run(per_file) if per_file else ([], 0, [])
    if dumps:  # the flight recorder's finding among the logs' (flight.report)
        found = flight.join(found, flight.findings(fr, *flight.log_facts(per_file.values())))
    return found, lines, srcs + [str(d) for d in dumps]


def _run(per_file: dict[str, Events]) -> tuple[list[Finding], int, list[str]]:
    groups, reasons = group(per_file)
    lines = sum(ev.lines for ev in per_file.values())
    if len(groups) == 1:
        return triage.findings(merge(list(per_file.values()))), lines, list(per_file)
    mixed = Finding(
        FindingId.JOB_MIXED, Status.WARN,
        f"these logs look like {len(groups)} different jobs, triaged apart: "
        + "; ".join(f"({_label(g)})" for g in groups),
        reasons[:6], "triage one job's logs at a time (one directory per job)")
    out: list[Finding] = []
    for g in groups:
        for f in triage.findings(merge([per_file[s] for s in g])):
            out.append(Finding(f.id, f.status, f"[{_label(g)}] {f.summary}", f.evidence, f.fix,
                               f.kind))
    out.sort(key=lambda f: f.status is not Status.FAIL)  # stable: each job's order is kept
    return [mixed, *out], lines, list(per_file)
