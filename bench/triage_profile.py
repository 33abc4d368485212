#!/usr/bin/env python3
"""Where `invoke triage` spends its time on the worst-case log: cProfile's top entries.

Writes the `signatures` mix of bench/triage_stream.py (every fixture line in order, over and
over: nearly every line is a signature or next to one), triages it in this process under
cProfile and prints MB/s and the top entries by own time (tottime), then removes the log.

    python bench/triage_profile.py --size 20 --top 15
    python bench/triage_profile.py --size 10 --rate     # one process against two, no profiler

--rate triages the log in one process and in two (megatron_env/diagnose/twocore.py), in
turn, three times each, and prints the best wall MB/s and MB per CPU second of each: on a
shared machine other load changes CPU time least, and the two figures together say what the
second core bought.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pickle
import pstats
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from triage_stream import write_log  # noqa: E402

from megatron_env.diagnose import events, jobs, twocore  # noqa: E402


def _cpu() -> float:
    """CPU seconds of this process and of its children that ended (the reading process)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def rates(log: Path, size: int, mix: str) -> dict[str, object]:
    """One process against two (twocore.MODE "one", then "two"), alternating, three
    rounds: the best wall MB/s and MB per CPU second of each, and the findings of each (the
    same, or the figures mean nothing)."""
    best: dict[str, dict[str, float]] = {}
    ids: dict[str, list[str]] = {}
    for _ in range(3):
        for mode, limit in (("one_process", "one"), ("two_processes", "two")):
            twocore.MODE = limit
            cpu, start = _cpu(), time.perf_counter()
            findings, _, _ = jobs.run([log])
            wall, cpu = time.perf_counter() - start, _cpu() - cpu
            b = best.setdefault(mode, {"wall_s": float("inf"), "cpu_s": float("inf")})
            b["wall_s"], b["cpu_s"] = min(b["wall_s"], wall), min(b["cpu_s"], cpu)
            ids[mode] = [f"{f.id} {f.summary}" for f in findings]
    assert ids["one_process"] == ids["two_processes"], "the two ways found different things"
    mb = size / 1e6
    return {"mix": mix, "log_mb": round(mb, 1), "cpus": os.cpu_count(),
            "load_avg_1min": round(os.getloadavg()[0], 2),
            **{mode: {"wall_s": round(b["wall_s"], 2), "cpu_s": round(b["cpu_s"], 2),
                      "mb_per_s": round(mb / b["wall_s"], 1),
                      "mb_per_cpu_s": round(mb / b["cpu_s"], 1)} for mode, b in best.items()},
            "max_rss_mb": {"this_process": round(_rss(resource.RUSAGE_SELF), 1),
                           "reading_process": round(_rss(resource.RUSAGE_CHILDREN), 1)}}


def _rss(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=20, help="MB of log")
    ap.add_argument("--mix", choices=["signatures", "run"], default="signatures")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--rate", action="store_true",
                    help="one process against two: wall MB/s and MB per CPU second (best of 3 "
                         "each, alternating), no profiler")
    a = ap.parse_args()
    if a.rate:
        with tempfile.TemporaryDirectory(prefix="triage-profile-") as tmp:
            log = Path(tmp) / "job.log"
            size = write_log(log, a.size, a.mix)
            print(json.dumps(rates(log, size, a.mix), indent=1))
        return
    with tempfile.TemporaryDirectory(prefix="triage-profile-") as tmp:
        log = Path(tmp) / "job.log"
        size = write_log(log, a.size, a.mix)
        twocore.MODE = "one"
        start = time.perf_counter()
        jobs.run([log])
        plain = time.perf_counter() - start
        print(f"{a.mix}: {size / 1e6:.1f} MB in {plain:.2f} s in one process without the "
              f"profiler: {size / 1e6 / plain:.1f} MB/s")
        print(_top("one process", lambda: jobs.run([log]), a.top))
        twocore.MODE = "two"
        print(_top("two processes, this one (the events)", lambda: jobs.run([log]), a.top))
        print(_top("two processes, the reading one (the lines, pickled for the pipe)",
                   lambda: twocore._produce(log, events.HOT_PARTS, _Pickles()), a.top))  # type: ignore[arg-type]


class _Pickles:
    """What the pipe does to each message on the reading side (pickling), and nothing else."""

    def send(self, obj: object) -> None:
        pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)

    def close(self) -> None:
        pass


def _top(title: str, work: Callable[[], object], top: int) -> str:
    """cProfile's `top` entries by own time (tottime) of `work`."""
    prof = cProfile.Profile()
    prof.enable()
    work()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    body = out.getvalue()
    return f"-- {title}\n" + body[body.find("   ncalls"):].replace(str(ROOT) + "/", "")

if __name__ == "__main__":
    main()
