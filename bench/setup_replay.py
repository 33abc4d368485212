#!/usr/bin/env python3
"""Benchmark: replay a recorded cold setup's kernel builds through the pool's own scheduler
(megatron_env.kernels.schedule) and report the makespan against its bound.

The record is each kernel's ninja logs (object costs on the epoch clock). ninja logs hold no
edges, so the order constraints come from the builds' structure (schedule.stage): a CMake build
(transformer-engine's library) is a stage before the torch extensions of the same kernel, which
start the recorded gap (a link, Python) after it ended; torch's extensions are independent
chains side by side (apex's twelve). A chain's first stage starts at the kernel's earliest
recorded lead-in after the builds began (plan, setup.py start, configure; the pool builds every
extension of a kernel at once). Each stage is one ninja: at most `--width` of its objects ask
for a slot at a time, in the order they ran. Object durations are the recorded ones.

bound = max(longest chain, compile seconds / cores): no schedule of these objects on these
cores ends sooner. Both orders are replayed: "fifo" (every object the same priority: first come,
first served, the pool's order before) and "lpt" (kernels.schedule). JSON on stdout.

    python bench/setup_replay.py bench/results/2026-12-05-h100-cold-setup-e883413 --cores 16
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megatron_env import recipes  # noqa: E402
from megatron_env.kernels import ninjalog, schedule  # noqa: E402
from megatron_env.kernels.ninjalog import Step  # noqa: E402

TRACE = bool(os.environ.get("REPLAY_TRACE"))  # each object's start and end on stderr


@dataclass
class Stage:
    gap: float  # seconds after the previous stage's last object (or the builds' start)
    objects: list[Step]


@dataclass
class Chain:
    kernel: str
    stages: list[Stage]
    at: int = 0  # the stage running
    queued: list[Step] = field(default_factory=list)  # its objects not yet asking
    asking: int = 0  # asking or running


def chains(record: Path, start: float
           ) -> tuple[list[Chain], dict[str, list[tuple[str, list[Step]]]]]:
    """The record's kernels as chains of stages (schedule.stage: a CMake build first, torch's
    extensions after it, each extension a chain of its own beside the others), and each
    kernel's logs (epoch clock). A chain's first stage starts at the kernel's earliest
    recorded lead-in (the pool builds every extension at once); a later one at the recorded
    gap after the stage before it ended."""
    out: list[Chain] = []
    logs: dict[str, list[tuple[str, list[Step]]]] = {}
    for d in sorted(p for p in record.iterdir() if p.is_dir()):
        runs = [(f.name, sorted((s for s in ninjalog.parse(f.read_text(), f.name)
                                 if s.output.endswith(".o")), key=lambda s: s.start))
                for f in sorted(d.glob("*.ninja_log"))]  # links: in the gaps
        runs = [(n, r) for n, r in runs if r]
        logs[d.name] = runs
        lead = min(r[0].start for _n, r in runs) - start
        first = [r for n, r in runs if schedule.stage(n) == 0]
        later = [r for n, r in runs if schedule.stage(n) == 1]
        if first and later:  # one chain: the CMake library, then the extensions
            end = max(s.end for r in first for s in r)
            gap = min(r[0].start for r in later) - end
            out.append(Chain(d.name, [Stage(lead, [s for r in first for s in r]),
                                      Stage(gap, [s for r in later for s in r])]))
        else:
            out += [Chain(d.name, [Stage(lead, r)]) for _n, r in runs]
    return out, logs


class Replay:
    """One run of the pool over the chains: events in time order, the Scheduler deciding."""

    def __init__(self, chs: list[Chain], costs: dict[str, schedule.Costs], cores: int,
                 width: int, policy: str) -> None:
        self.costs, self.width, self.lpt = costs, width, policy == "lpt"
        expected = schedule.expected(costs, cores) if self.lpt else {}
        self.sched = schedule.Scheduler(cores, expected, opened=0.0)
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.jobs: dict[int, tuple[Chain, Step]] = {}
        self.rid = itertools.count()
        self.started: dict[int, float] = {}
        self.ended: list[tuple[float, float, str, str]] = []
        for c in chs:
            self.push(c.stages[0].gap, "stage", c)

    def push(self, t: float, kind: str, what: object) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, what))

    def ask(self, c: Chain) -> None:
        """The chain's ninja shows up to `width` objects at a time."""
        while c.queued and c.asking < self.width:
            s = c.queued.pop(0)
            r = next(self.rid)
            self.jobs[r] = (c, s)
            c.asking += 1
            self.sched.want(r, c.kernel, self.costs[c.kernel].of(s.output) if self.lpt else 0.0)

    def ended_job(self, r: int, now: float) -> None:
        c, s = self.jobs.pop(r)
        self.sched.done(r)
        c.asking -= 1
        self.ended.append((self.started[r], now, c.kernel, schedule.key(s.output)))
        self.ask(c)
        if not c.queued and c.asking == 0:
            c.at += 1
            if c.at < len(c.stages):
                self.push(now + c.stages[c.at].gap, "stage", c)

    def run(self) -> dict:
        busy = 0.0
        while self.events:
            now, _n, kind, what = heapq.heappop(self.events)
            if kind == "stage":
                assert isinstance(what, Chain)
                what.queued = list(what.stages[what.at].objects)
                self.ask(what)
            else:
                assert isinstance(what, int)
                self.ended_job(what, now)
            for r, _n in self.sched.grants(now):  # one slot each: objects' recorded seconds
                self.started[r] = now
                busy += self.jobs[r][1].seconds
                self.push(now + self.jobs[r][1].seconds, "end", r)
        if self.sched.waiting():
            raise SystemExit("replay stalled: jobs wait and nothing runs")
        ended = self.ended
        if TRACE:
            for st, en, k, o in sorted(ended):
                print(f"{st:7.1f} {en:7.1f} {k:20} {o}", file=sys.stderr)
        makespan = max(e for _s, e, _k, _o in ended)
        return {"makespan_s": round(makespan, 1),
                "kernels_end_s": {k: round(max(e for _s, e, kk, _o in ended if kk == k), 1)
                                  for k in self.costs},
                "first_start_s": {k: round(min(s for s, _e, kk, _o in ended if kk == k), 1)
                                  for k in self.costs},
                "mean_busy": round(busy / makespan, 2)}


def critical(c: Chain) -> float:
    return sum(st.gap + max(s.seconds for s in st.objects) for st in c.stages)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("record", type=Path)
    p.add_argument("--cores", type=int, default=16)
    p.add_argument("--width", type=int, default=18, help="objects one ninja shows at a time")
    p.add_argument("--start", type=float, default=None,
                   help="epoch the builds began (default: from the record's README.json)")
    p.add_argument("--costs", choices=("log", "declared"), default="log",
                   help="the record's own logs (a previous build of the same pins) or the "
                        "recipes' declared estimates (a first build)")
    a = p.parse_args()
    meta = json.loads((a.record / "replay.json").read_text())
    start = a.start if a.start is not None else float(meta["builds_start_epoch"])
    result: dict = {"record": a.record.name, "cores": a.cores, "width": a.width,
                    "costs": a.costs}
    for policy in ("fifo", "lpt"):
        chs, logs = chains(a.record, start)
        if a.costs == "log":
            costs = {k: schedule.from_logs(k, lg, slots=a.cores) for k, lg in logs.items()}
        else:
            costs = {k: schedule.Costs(k, {}, recipes.get(k).object_seconds, "declared")
                     for k in logs}
        result[policy] = Replay(chs, costs, a.cores, a.width, policy).run()
    chs, _logs = chains(a.record, start)
    work = sum(s.seconds for c in chs for st in c.stages for s in st.objects)
    longest_chain = max(critical(c) for c in chs)
    bound = max(longest_chain, work / a.cores)
    result.update({"compile_s": round(work, 1), "longest_chain_s": round(longest_chain, 1),
                   "longest_object_s": round(max(s.seconds for c in chs for st in c.stages
                                                 for s in st.objects), 1),
                   "bound_s": round(bound, 1),
                   "fifo_x_bound": round(result["fifo"]["makespan_s"] / bound, 3),
                   "lpt_x_bound": round(result["lpt"]["makespan_s"] / bound, 3)})
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
