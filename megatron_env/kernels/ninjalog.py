"""Where a kernel build's time goes, from ninja's own record (.ninja_log): per object, start and
end, and how many compile jobs ran at once.

ninja appends one line per finished step: start and end in milliseconds since that ninja run
started, the output's mtime, the output path and a command hash (format v5 to v7, tab
separated). A torch extension build runs one ninja per extension, so a package with several
extensions built at once leaves one log per extension, each with its own clock; the mtime
column (the step's start, or its output's mtime, by ninja version) places them on one clock,
the epoch's.
Pure functions: text in, numbers out.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HEADER = re.compile(r"^# ninja log v(\d+)\s*$")


class NinjaLogError(ValueError):
    """The text is not a ninja log (or a version this module does not read)."""


@dataclass(frozen=True)
class Step:
    output: str
    start: float  # seconds on the build's clock
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def parse(text: str, name: str = ".ninja_log") -> list[Step]:
    """The steps of one log, the last run of each output only (a rebuild appends again).
    Times are on the mtime clock where the log has one (v6+), else on the log's own."""
    lines = text.splitlines()
    m = _HEADER.match(lines[0]) if lines else None
    if not m:
        raise NinjaLogError(f"{name}: no '# ninja log vN' header")
    version = int(m.group(1))
    if version < 5:
        raise NinjaLogError(f"{name}: ninja log v{version}; v5 or newer is read")
    rows: dict[str, tuple[int, int, float]] = {}
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 5:
            raise NinjaLogError(f"{name}:{n}: {len(fields)} fields, a v{version} line has 5")
        try:
            rows[fields[3]] = (int(fields[0]), int(fields[1]), _epoch(int(fields[2])))
        except ValueError:
            raise NinjaLogError(f"{name}:{n}: start, end and mtime must be integers") from None
    shift = _clock(list(rows.values()))
    return [Step(out, a / 1e3 + shift, b / 1e3 + shift) for out, (a, b, _m) in rows.items()]


def _clock(rows: list[tuple[int, int, float]]) -> float:
    """Seconds to add to a log's own clock to reach the epoch's (0: unknown).

    ninja 1.13 writes the time each step started as its mtime; older ninja writes the output's
    mtime, which is about when the step ended. Whichever of the two fits every step of the log
    (the smaller spread) is the clock."""
    timed = [(a / 1e3, b / 1e3, m) for a, b, m in rows if m]
    if not timed:
        return 0.0
    best = min(([m - a for a, _b, m in timed], [m - b for _a, b, m in timed]),
               key=lambda s: max(s) - min(s))
    return sorted(best)[len(best) // 2]


def _epoch(mtime: int) -> float:
    """The output's mtime in seconds since the epoch: nanoseconds from ninja 1.10 on, seconds
    before; 0 (not recorded) stays 0."""
    if mtime > 10**15:
        return mtime / 1e9
    return float(mtime) if mtime > 10**8 else 0.0


def read(paths: list[Path]) -> list[Step]:
    """The steps of several logs (one per extension), on one clock starting at 0."""
    steps = [s for p in paths for s in parse(p.read_text(errors="replace"), str(p))]
    if not steps:
        return []
    t0 = min(s.start for s in steps)
    return [Step(s.output, s.start - t0, s.end - t0) for s in steps]


def concurrency(steps: list[Step], every: float = 10.0) -> list[tuple[float, float]]:
    """(t, mean number of steps running in [t, t + every)) across the build."""
    if not steps:
        return []
    end = max(s.end for s in steps)
    out = []
    t = 0.0
    while t < end:
        busy = sum(max(0.0, min(s.end, t + every) - max(s.start, t)) for s in steps)
        out.append((round(t, 1), round(busy / every, 2)))
        t += every
    return out


def summary(steps: list[Step], top: int = 10) -> dict[str, Any]:
    """Wall time, compile time summed over steps, mean and peak parallelism, the slowest steps,
    and the tail: how long the build ran with fewer steps than its peak (waiting on the last,
    slowest objects rather than on cores)."""
    if not steps:
        return {"steps": 0}
    wall = max(s.end for s in steps) - min(s.start for s in steps)
    total = sum(s.seconds for s in steps)
    edges = sorted({s.start for s in steps} | {s.end for s in steps})
    peak = 0
    running_at = []
    for a, b in itertools.pairwise(edges):
        n = sum(1 for s in steps if s.start <= a and s.end >= b)
        running_at.append((a, b, n))
        peak = max(peak, n)
    starved = sum(b - a for a, b, n in running_at if 0 < n < peak / 2)
    slowest = sorted(steps, key=lambda s: s.seconds, reverse=True)[:top]
    return {
        "steps": len(steps),
        "wall_seconds": round(wall, 1),
        "compile_seconds": round(total, 1),
        "mean_parallel": round(total / wall, 2) if wall else 0.0,
        "peak_parallel": peak,
        "below_half_peak_seconds": round(starved, 1),
        "slowest": [{"output": _short(s.output), "seconds": round(s.seconds, 1),
                     "start": round(s.start, 1)} for s in slowest],
    }


def _short(output: str) -> str:
    """'.../build/temp.linux-x86_64-cpython-312/csrc/src/x.o' -> 'csrc/src/x.o'."""
    m = re.search(r"/temp\.[^/]+/(.*)$", output)
    return m.group(1) if m else Path(output).name
