#!/usr/bin/env python3
"""Benchmark: replay a recorded cold setup's kernel builds through the pool's own scheduler
(megatron_env.kernels.schedule) and predict the builds step, object by object.

Why a replay that matches the device first: the earlier one (ninja-log times, which include
each object's wait for a slot; every ninja as wide as asked; no probes, links or tails)
predicted 446-483 s for a record whose builds took 496.4 s, and could not say why a second
build of the same pins took 569 s. A scheduling change is judged here only once this predicts
the device's own runs.

What it reads (a record directory as the device run left it, cold1/ of
bench/results/2026-12-06-h100-ac60c25):
- object-costs/*.json: the pool's own record, [object, granted, ended, slots] on the pool's
  clock: each object's true compile seconds (no wait).
- <kernel>-<key>.ninja-logs/*.ninja_log: when each ninja asked for each object (ninja 1.13
  writes the step's start as its mtime: the epoch clock). The pool's clock is placed on the
  epoch's by the objects that were granted at once (t0 = max(asked - granted)).
- setup-cold1.txt: the builds step's seconds and each kernel's install and import check.

What each kernel is, from those (data): its ninjas (when each started, its objects in the
order it asked, its window = the most objects it had asked for and not finished at once: 18
for transformer-engine's CMake build, all of them for the torch extensions), the try-compiles
of a CMake configure (objects in the pool's record that no ninja asked for), the steps of a
ninja log that are not objects (a link), the probes the record shows only by their wait (a
slot that freed while objects waited and went to none of them for a moment: flash-attn's
before its ninja, 44.86-44.91 s), each with the gap before it and its seconds; the tail after
the last object (link, wheel, install, import check).

Modelled, not in the record (constants below, each said where it comes from):
- PROBE_S / LEAD: every setup.py checks its compiler (the CXX wrapper, one slot) at the same
  time, just before apex's ninjas started (the pool's hold let apex start: all had asked).
- HIDDEN_AFTER: a probe seen only by its wait asked this long after the step before it.
- LINK_S: each extension's link after its ninja (setuptools runs the CXX wrapper: one slot).
- The wheel after the last link: the critical kernel's recorded tail less the link, install
  and import check (data); the others are taken to pack theirs as fast.
- SPLIT_P (fitted on run2): an nvcc object with --split-compile given n slots takes
  seconds * (1 - p + p / n); the record holds only one-slot objects.

Policies: "ac60c25" (the pool as it ran both records: probes and links at their estimate's
priority, a 30 s hold for recorded costs, two slots for a --split-compile object whenever two
are free, transformer-engine's CMake ninja at its own -j) and "now" (kernels.schedule as it
is: every ninja as wide as the pool, probes, try-compiles and links at once, one slot per
object while others wait, no hold). Each with the recipes' declared costs (a first build) and
with the record's own costs (a second build of the same pins). JSON on stdout.

    python bench/setup_replay.py bench/results/2026-12-06-h100-ac60c25
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megatron_env import recipes  # noqa: E402
from megatron_env.kernels import ninjalog, schedule, slot_client  # noqa: E402

PROBE_S = 0.05  # the record's probe before flash-attn's ninja: 44.86-44.91 s
LINK_S = 1.0  # transformer-engine's library link took 0.90 s (its ninja log); a torch extension's
SPLIT_P = 0.32  # fitted on run2 (grid 0.30-0.60: 573.6-535.0 s; 0.32 gives 564.6 s of 569)
HIDDEN_AFTER = 1.0  # assumed: a probe the record shows only by its wait asked this long after
# the kernel's step before it (the record bounds it: after the pool filled at 9.27 s)
GROUP_S = 1.0  # ninjas of one kernel started within this of each other run side by side
AT_ONCE = 1e9  # the priority of a job the "now" policy starts at once
TRACE = bool(os.environ.get("REPLAY_TRACE"))  # every job's start and end on stderr


@dataclass
class Obj:
    key: str  # schedule.key of its output
    output: str
    seconds: float  # on one slot
    split: int = 1  # threads it can use (nvcc --split-compile)


@dataclass
class Step:
    kind: str  # "wait", "job" (one slot job: probe, try-compile, link), "ninja"
    seconds: float = 0.0
    objs: list[Obj] = field(default_factory=list)
    window: int = 0  # ninja: objects asked at once (0: all)


@dataclass
class Kernel:
    name: str
    steps: list[list[Step]]  # groups of steps run side by side (apex's ninjas), in sequence
    cmake: bool


@dataclass
class Record:
    kernels: dict[str, Kernel]
    builds_s: float  # the builds step as the device reported it
    costs_runs: dict[str, list[tuple[str, list[ninjalog.Step]]]]  # pool record, as together reads
    notes: dict[str, Any]


def _split_of(kernel: str, output: str) -> int:
    """How many threads an object's compiler can use, from the recipe's NVCC_APPEND_FLAGS as the
    slot client reads it (nvcc compiles the CUDA objects; c++ the rest)."""
    cu = output.endswith(".cu.o") or "/src/" in output or "csrc/megatron" in output
    if not cu:
        return 1
    return slot_client.split_of(["nvcc"], dict(recipes.get(kernel).env))


def _kernel_of(name: str) -> str:
    return re.sub(r"-[0-9a-f]{16,}(\.ninja-logs|\.json)?$", "", name)


def _line(text: str, pattern: str) -> re.Match[str]:
    m = re.search(pattern, text, re.M)
    if not m:
        raise SystemExit(f"setup log: no line matching {pattern!r}")
    return m


def _hidden_jobs(grants: Mapping[tuple[str, str], tuple[str, float, float]],
                 logs: Mapping[str, list[tuple[str, list[tuple[float, float, str]]]]],
                 t0: float) -> list[tuple[float, float, str]]:
    """Slot jobs the pool did not record (no object: a compiler probe), where the record shows
    them: a slot that freed while objects waited and went to none of them for a moment. ->
    (start, end, kernel): the kernel whose next recorded step came soonest after it."""
    asked = {(k, schedule.key(o)): a - t0 for k, ls in logs.items() for _n, rows in ls
             for a, _b, o in rows}
    jobs = sorted((a, b, k, o) for (k, o), (_out, a, b) in grants.items())
    starts = sorted(a for a, _b, _k, _o in jobs)
    out = []
    for _a, e, _k, _o in jobs:
        waiting = any(asked.get((k, o), 1e18) < e < a for a, _b, k, o in jobs)
        nxt = next((g for g in starts if g >= e - 1e-6), None)
        if waiting and nxt is not None and nxt - e > 0.02:
            later = [(a - nxt, k) for (k, _o), a in asked.items() if a >= nxt]
            later += [(a - nxt, k) for a, _b, k, o in jobs if (k, o) not in asked and a >= nxt]
            out.append((e, nxt, min(later)[1]))
    return out


def load(run: Path) -> Record:  # noqa: C901  (to split: record reading, script building)
    """The record of one cold setup (a cold1/ directory) as kernels of steps."""
    grants: dict[tuple[str, str], tuple[str, float, float]] = {}
    costs_runs: dict[str, list[tuple[str, list[ninjalog.Step]]]] = {}
    for f in sorted((run / "object-costs").glob("*.json")):
        k = _kernel_of(f.name)
        doc = json.loads(f.read_text())
        costs_runs[k] = []
        for name, rows in doc["runs"].items():
            costs_runs[k].append((name, [ninjalog.Step(str(o), float(a), float(b))
                                         for o, a, b, _n in rows]))
            for o, a, b, _n in rows:
                grants[(k, schedule.key(o))] = (o, float(a), float(b))
    logs: dict[str, list[tuple[str, list[tuple[float, float, str]]]]] = {}
    for d in sorted(run.glob("*.ninja-logs")):
        k = _kernel_of(d.name)
        for f in sorted(d.glob("*.ninja_log")):
            steps = ninjalog.parse(f.read_text(), f.name)
            logs.setdefault(k, []).append(
                (f.name, sorted((s.start, s.end, s.output) for s in steps)))
    # the pool's clock on the epoch's: the objects granted at once
    t0 = max(a - grants[(k, schedule.key(o))][1] for k, ls in logs.items() for _n, rows in ls
             for a, _b, o in rows if (k, schedule.key(o)) in grants)
    text = next(run.glob("setup-*.txt")).read_text()
    builds_s = float(_line(text, r"^builds\s+done\s+([\d.]+)").group(1))
    after: dict[str, float] = {}
    for k in logs:
        m = _line(text, rf"^{re.escape(k)}: plan [\d.]+ s, install ([\d.]+) s, "
                        r"import check ([\d.]+) s")
        after[k] = float(m.group(1)) + float(m.group(2))
    asked = {k: {schedule.key(o) for _n, rows in ls for _a, _b, o in rows}
             for k, ls in logs.items()}
    starts = {k: min(rows[0][0] for _n, rows in ls) - t0 for k, ls in logs.items()}
    cmake = {k: any(schedule.stage(n) == 0 for n, _r in ls) for k, ls in logs.items()}
    lead = min(s for k, s in starts.items() if not cmake[k]) - PROBE_S
    hidden = _hidden_jobs(grants, logs, t0)
    kernels: dict[str, Kernel] = {}
    ends: dict[str, float] = {}
    for k, ls in logs.items():
        # every slot job and ninja of the kernel on the pool's clock, in order
        items: list[tuple[float, float, str, Any]] = []
        for o, (out, a, b) in ((o, v) for (kk, o), v in grants.items() if kk == k):
            if o not in asked[k]:  # a configure's try-compile: asked by no ninja
                items.append((a, b, "job", Obj(o, out, b - a)))
        for name, rows in ls:
            start = rows[0][0] - t0
            objs = [Obj(schedule.key(o), o, grants[(k, schedule.key(o))][2]
                        - grants[(k, schedule.key(o))][1], _split_of(k, o))
                    for _a, _b, o in rows if o.endswith(".o")]
            window = max(sum(1 for a2, b2, _o in rows if a2 <= a < b2) for a, _b, _o in rows)
            end = max(grants[(k, o.key)][2] for o in objs)
            items.append((start, end, "ninja", (name, objs, window)))
            for a, b, o in rows:  # what a ninja runs after its objects: a link
                if not o.endswith(".o"):
                    items.append((a - t0, b - t0, "job", Obj(schedule.key(o), o, b - a)))
        items += [(a, b, "hidden", Obj("", "", b - a)) for a, b, kk in hidden
                  if kk == k and a < starts[k]]  # the probes before its builds
        items.sort(key=lambda i: i[0])
        # every setup.py checks its compiler first, at the same time (the pool's hold, which
        # waits for every kernel to ask once, let apex's objects start at once: all had asked)
        groups: list[list[Step]] = [[Step("wait", lead)],
                                    [Step("job", objs=[Obj("", "", PROBE_S)])]]
        at = lead + PROBE_S
        grp_start = -1.0
        for start, end, kind, what in items:
            if kind == "ninja":
                name, objs, window = what
                step = Step("ninja", objs=objs, window=window if window < len(objs) else 0)
                if groups[-1][-1].kind == "ninja" and start - grp_start < GROUP_S:
                    groups[-1].append(step)  # side by side (apex's extensions)
                    at = max(at, end)
                    continue
                groups += [[Step("wait", max(0.0, start - at))], [step]]
                grp_start, at = start, end
            elif kind == "hidden":  # its wait in the record was the pool's doing: asked
                # HIDDEN_AFTER after what came before (the pool was full by then)
                groups += [[Step("wait", HIDDEN_AFTER)], [Step("job", objs=[what])]]
                at = end
            else:
                groups += [[Step("wait", max(0.0, start - at))], [Step("job", objs=[what])]]
                at = end
        links = sum(1 for g in groups[-1:] for s in g if s.kind == "ninja")
        groups.append([Step("job", objs=[Obj(f"link{i}.so", f"link{i}.so", LINK_S)])
                       for i in range(links)])
        kernels[k] = Kernel(k, groups, cmake[k])
        ends[k] = at
    last = max(ends, key=lambda k: ends[k])
    wheel = builds_s - ends[last] - LINK_S - after[last]
    for k, kern in kernels.items():
        kern.steps.append([Step("wait", wheel + after[k])])
    return Record(kernels, builds_s, costs_runs,
                  {"t0_epoch": round(t0, 2), "lead_s": round(lead, 2),
                   "ninja_start_s": {k: round(v, 2) for k, v in starts.items()},
                   "hidden_probes": [(round(a, 2), round(b, 2), k) for a, b, k in hidden],
                   "wheel_s": round(wheel, 2), "critical": last,
                   "install_import_s": after})


# The recipes' declared costs as the records were made with them (ac60c25): the replay of a
# record uses these, the "now" policy the recipes' own.
AC60C25_DECLARED: dict[str, tuple[tuple[str, float], ...]] = {
    "apex": (("*softmax*", 60.0), ("*", 45.0)),
    "flash-attn": (("csrc/flash_attn/src/*", 200.0), ("*", 45.0)),
    "transformer-engine": (
        ("transformer_engine/pytorch/csrc/*", 30.0),
        ("transpose/cast_transpose_fusion.cu.o", 208.0),
        ("activation/gelu.cu.o", 204.0), ("activation/relu.cu.o", 189.0),
        ("normalization/layernorm/ln_fwd_cuda_kernel.cu.o", 187.0),
        ("fused_attn/fused_attn_*", 160.0), ("activation/swiglu.cu.o", 155.0),
        ("normalization/*_kernel.cu.o", 150.0), ("gemm/cutlass_grouped_gemm.cu.o", 145.0),
        ("fused_attn/*", 136.0), ("fused_router/*", 125.0), ("activation/*", 110.0),
        ("*", 85.0))}


@dataclass(frozen=True)
class Policy:
    name: str
    hold_s: float  # the Scheduler's hold for recorded costs
    widest: int  # slots one --split-compile object may get
    at_once: bool  # probes, try-compiles and links start at once
    wide_cmake: bool  # a CMake build's ninja asks for all its objects (the pool's width)
    spare_only: bool  # two slots only where no other job waits


AC60C25 = Policy("ac60c25", 30.0, 2, False, False, False)
NOW = Policy("now", 30.0, schedule.WIDEST, True, True, True)


class Replay:
    """One run of the pool: each kernel's steps in order, the Scheduler deciding who compiles."""

    def __init__(self, rec: Record, costs: Mapping[str, schedule.Costs], cores: int,
                 policy: Policy, split_p: float = SPLIT_P) -> None:
        self.rec, self.costs, self.policy, self.split_p = rec, costs, policy, split_p
        self.sched = schedule.Scheduler(cores, schedule.expected(costs, cores), opened=0.0,
                                        hold_s=policy.hold_s, widest=policy.widest,
                                        spare_only=policy.spare_only)
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.rid = itertools.count()
        self.jobs: dict[int, tuple[str, Obj, Any]] = {}
        self.ran: list[tuple[float, float, str, str, int]] = []
        self.end: dict[str, float] = {}
        self.busy = 0.0
        self.at = {k: -1 for k in rec.kernels}  # the group of steps each kernel runs
        self.open: dict[str, int] = {k: 0 for k in rec.kernels}
        self.ninjas: dict[tuple[str, int], list[Obj]] = {}
        self.asking: dict[tuple[str, int], int] = {}
        for k in rec.kernels:
            self.push(0.0, "next", k)

    def push(self, t: float, kind: str, what: Any) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, what))

    def want(self, k: str, o: Obj, owner: Any) -> None:
        r = next(self.rid)
        self.jobs[r] = (k, o, owner)
        urgent = self.policy.at_once and schedule.at_once(o.output)
        prio = AT_ONCE if urgent else self.costs[k].of(o.output)
        self.sched.want(r, k, prio, o.split, at_once=urgent)

    def next_group(self, k: str, now: float) -> None:
        self.at[k] += 1
        groups = self.rec.kernels[k].steps
        if self.at[k] >= len(groups):
            self.end[k] = now
            self.sched.forget(k)
            return
        self.open[k] = len(groups[self.at[k]])
        for i, st in enumerate(groups[self.at[k]]):
            if st.kind == "wait":
                self.push(now + st.seconds, "stepdone", k)
            elif st.kind == "job":
                self.want(k, st.objs[0], None)
            else:
                wide = st.window == 0 or (self.policy.wide_cmake and self.rec.kernels[k].cmake)
                n = (k, i)
                self.ninjas[n] = list(st.objs)
                self.asking[n] = 0
                self.ask(n, len(st.objs) if wide else st.window)

    def ask(self, n: tuple[str, int], window: int) -> None:
        q = self.ninjas[n]
        while q and self.asking[n] < window:
            self.asking[n] += 1
            self.want(n[0], q.pop(0), (n, window))

    def run(self) -> dict[str, Any]:
        while self.events:
            now, _s, kind, what = heapq.heappop(self.events)
            if kind == "next":
                self.next_group(what, now)
            elif kind == "stepdone":
                self.open[what] -= 1
                if self.open[what] == 0:
                    self.next_group(what, now)
            else:  # a job ended
                k, o, owner = self.jobs.pop(what)
                self.sched.done(what)
                if owner is None:
                    self.push(now, "stepdone", k)
                else:
                    n, window = owner
                    self.asking[n] -= 1
                    self.ask(n, window)
                    if not self.ninjas[n] and self.asking[n] == 0:
                        self.push(now, "stepdone", k)
            for r, slots in self.sched.grants(now):
                k, o, _owner = self.jobs[r]
                took = (o.seconds * (1 - self.split_p + self.split_p / slots) if slots > 1
                        else o.seconds)
                self.busy += took * slots
                self.ran.append((now, now + took, k, o.key, slots))
                if TRACE:
                    print(f"{now:7.2f} {now + took:7.2f} {slots} {k:18} {o.key}",
                          file=sys.stderr)
                self.push(now + took, "ended", r)
        if self.sched.waiting() or len(self.end) < len(self.rec.kernels):
            raise SystemExit("replay stalled: jobs wait and nothing runs")
        makespan = max(self.end.values())
        objs = {k: {o.key for g in kern.steps for s in g if s.kind == "ninja" for o in s.objs}
                for k, kern in self.rec.kernels.items()}
        return {"builds_s": round(makespan, 1),
                "kernels_end_s": {k: round(v, 1) for k, v in sorted(self.end.items())},
                "ninja_first_grant_s": {
                    k: round(min(a for a, _b, kk, key, _n in self.ran
                                 if kk == k and key in objs[k]), 1)
                    for k in sorted(self.rec.kernels)},
                "two_slot_grants": sum(1 for *_x, n in self.ran if n > 1),
                "mean_busy_slots": round(self.busy / makespan, 2)}


def costs_of(rec: Record, source: str, cores: int, then: bool) -> dict[str, schedule.Costs]:
    """Each kernel's costs as kernels.together gives them: the recipe's declared ones (a first
    build) or the pool's record of the same pins (a second); `then`: the declared ones as the
    record was made with them."""
    out = {}
    for k in rec.kernels:
        est = AC60C25_DECLARED[k] if then else recipes.get(k).object_seconds
        if source == "declared":
            out[k] = schedule.Costs(k, {}, est, "declared")
        else:
            out[k] = schedule.from_logs(k, rec.costs_runs[k], est, cores)
    return out


def bound(rec: Record, cores: int) -> dict[str, float]:
    objs = [o for kern in rec.kernels.values() for g in kern.steps for s in g
            if s.kind == "ninja" for o in s.objs]
    work = sum(o.seconds for o in objs)
    longest = max(o.seconds for o in objs)
    return {"compile_s": round(work, 1), "longest_object_s": round(longest, 1),
            "bound_s": round(max(longest, work / cores), 1)}


def _with_tails(rec: Record, text: str) -> Record:
    """The record with another run's install and import check (a device's import check is not
    the schedule's doing)."""
    kernels = {}
    for k, kern in rec.kernels.items():
        m = _line(text, rf"^{re.escape(k)}: plan [\d.]+ s, install ([\d.]+) s, "
                        r"import check ([\d.]+) s")
        tail = rec.notes["wheel_s"] + float(m.group(1)) + float(m.group(2))
        kernels[k] = replace(kern, steps=[*kern.steps[:-1], [Step("wait", tail)]])
    return replace(rec, kernels=kernels)


def replay(record: Path, cores: int = 16, split_p: float = SPLIT_P) -> dict[str, Any]:
    """Every prediction for one device record (its cold1/ and cold2/ runs)."""
    rec = load(record / "cold1")
    run2_text = (record / "cold2" / "setup-cold2.txt").read_text()
    run2_s = float(_line(run2_text, r"^kernels: \d+ build\(s\) ended in ([\d.]+) s").group(1))
    rec2 = _with_tails(rec, run2_text)
    out: dict[str, Any] = {"record": record.name, "cores": cores, "split_p": split_p,
                           "model": rec.notes, **bound(rec, cores)}
    runs: list[tuple[str, Record, str, Policy, float | None]] = [
        ("run1_ac60c25_declared", rec, "declared", AC60C25, rec.builds_s),
        ("run2_ac60c25_recorded", rec2, "log", AC60C25, run2_s),
        ("run1_now_declared", rec, "declared", NOW, None),
        ("run2_now_recorded", rec2, "log", NOW, None)]
    for label, r, src, pol, measured in runs:
        if TRACE:
            print(f"== {label}", file=sys.stderr)
        res = Replay(r, costs_of(r, src, cores, pol is AC60C25), cores, pol, split_p).run()
        if measured is not None:
            res["measured_s"] = measured
            res["error"] = round(res["builds_s"] / measured - 1, 4)
        res["x_bound"] = round(res["builds_s"] / out["bound_s"], 3)
        out[label] = res
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("record", type=Path, help="a device record with cold1/ and cold2/")
    p.add_argument("--cores", type=int, default=16)
    p.add_argument("--split-p", type=float, default=SPLIT_P,
                   help="the parallel part of a --split-compile object (fitted on run2)")
    a = p.parse_args(argv)
    print(json.dumps(replay(a.record, a.cores, a.split_p), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
