#!/usr/bin/env python3
"""Where a kernel build's time went: the slowest objects and how many compiled at once.

Reads the .ninja_log files that `invoke build` keeps beside each cached wheel
(<cache>/wheels/<key>/ninja-logs/, one per extension) or any .ninja_log given, and prints JSON:
the summary (wall and summed compile seconds, mean and peak parallelism, time spent below half
the peak, the slowest objects) and the parallelism over time. A short table goes to stderr.

    python bench/ninja_log.py <cache>/wheels/flash-attn-<key> --every 30 > where-time-went.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megatron_env import ninjalog  # noqa: E402


def logs_of(paths: list[Path]) -> list[Path]:
    """The .ninja_log files named, or found under the directories named."""
    found = []
    for p in paths:
        if p.is_dir():
            found += sorted(p.rglob("*.ninja_log")) + sorted(p.rglob(".ninja_log"))
        elif p.is_file():
            found.append(p)
        else:
            raise SystemExit(f"error: {p} does not exist\nhint: pass a cache slot "
                             "(<cache>/wheels/<key>) or a .ninja_log file")
    if not found:
        raise SystemExit(f"error: no .ninja_log under {', '.join(map(str, paths))}\n"
                         "hint: builds made before ninja logs were kept have none; rebuild")
    return list(dict.fromkeys(found))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", type=Path)
    p.add_argument("--every", type=float, default=10.0, help="seconds per parallelism sample")
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args()
    files = logs_of(a.paths)
    try:
        steps = ninjalog.read(files)
    except ninjalog.NinjaLogError as e:
        raise SystemExit(f"error: {e}") from None
    s = ninjalog.summary(steps, top=a.top)
    for row in s["slowest"]:
        print(f"{row['seconds']:8.1f} s  from {row['start']:7.1f} s  {row['output']}",
              file=sys.stderr)
    print(f"{s['steps']} objects in {s['wall_seconds']} s, {s['compile_seconds']} s of compiling:"
          f" {s['mean_parallel']} at once on average, {s['peak_parallel']} at most, "
          f"{s['below_half_peak_seconds']} s below half of that", file=sys.stderr)
    print(json.dumps({"logs": [str(f) for f in files], "summary": s,
                      "parallel_over_time": ninjalog.concurrency(steps, a.every)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
