#!/usr/bin/env python3
"""Where `invoke triage` spends its time on the worst-case log: cProfile's top entries.

Writes the `signatures` mix of bench/triage_stream.py (every fixture line in order, over and
over: nearly every line is a signature or next to one), triages it in this process under
cProfile and prints MB/s and the top entries by own time (tottime), then removes the log.

    python bench/triage_profile.py --size 20 --top 15
    python bench/triage_profile.py --size 10 --rate     # MB per CPU second, best of 3, no profiler
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from triage_stream import write_log  # noqa: E402

from megatron_env.diagnose import jobs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=20, help="MB of log")
    ap.add_argument("--mix", choices=["signatures", "run"], default="signatures")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--rate", action="store_true",
                    help="only MB per CPU second (process time, best of 3): what other load on "
                         "a shared machine changes least")
    a = ap.parse_args()
    if a.rate:
        with tempfile.TemporaryDirectory(prefix="triage-profile-") as tmp:
            log = Path(tmp) / "job.log"
            size = write_log(log, a.size, a.mix)
            best = float("inf")
            for _ in range(3):
                start = time.process_time()
                jobs.run([log])
                best = min(best, time.process_time() - start)
        print(f"{a.mix}: {size / 1e6:.1f} MB, {size / 1e6 / best:.1f} MB per CPU second")
        return
    with tempfile.TemporaryDirectory(prefix="triage-profile-") as tmp:
        log = Path(tmp) / "job.log"
        size = write_log(log, a.size, a.mix)
        start = time.perf_counter()
        jobs.run([log])
        plain = time.perf_counter() - start
        prof = cProfile.Profile()
        prof.enable()
        jobs.run([log])
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.top)
    print(f"{a.mix}: {size / 1e6:.1f} MB in {plain:.2f} s without the profiler: "
          f"{size / 1e6 / plain:.1f} MB/s")
    body = out.getvalue()
    print(body[body.find("   ncalls"):].replace(str(ROOT) + "/", ""))


if __name__ == "__main__":
    main()
