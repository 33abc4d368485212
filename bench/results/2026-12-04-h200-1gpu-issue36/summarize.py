#!/usr/bin/env python3
"""The figures of this record, read from raw/ (run from the repository root or here):
    python bench/results/2026-12-04-h200-1gpu-issue36/summarize.py > .../issue36.json"""

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from megatron_env.kernels import ninjalog  # noqa: E402

RAW = HERE / "raw"


def timed(name: str) -> dict:
    text = (RAW / name).read_text()
    m = re.search(r"real ([\d.]+) s, user ([\d.]+) s, sys ([\d.]+) s", text)
    ready = re.search(r"; ([\d.]+) s\n", text)
    rows = dict(re.findall(r"^(\w+)\s+(?:done|up to date)\s+([\d.]+)", text, re.M))
    out = {"wall_s": float(m.group(1)), "cpu_s": round(float(m.group(2)) + float(m.group(3)), 1),
           "exit": int(re.search(r"exit (\d+)", text).group(1))}
    if ready:
        out["tool_reported_s"] = float(ready.group(1))
    if rows:
        out["steps_s"] = {k: float(v) for k, v in rows.items()}
    if s := re.search(r"setup ready: .*; (\d+ done(?:, \d+ up to date)?)", text):
        out["steps"] = s.group(1)
    return out


def objects(d: Path) -> dict:
    steps = [s for p in sorted(d.glob("*.ninja_log"))
             for s in ninjalog.parse(p.read_text(), str(p))]
    longest = max(steps, key=lambda s: s.seconds)
    return {"objects": len(steps), "object_seconds": round(sum(s.seconds for s in steps)),
            "longest_s": round(longest.seconds), "longest": ninjalog._short(longest.output)}


def at_once(dirs: list[Path]) -> dict:
    steps = [s for d in dirs for p in sorted(d.glob("*.ninja_log"))
             for s in ninjalog.parse(p.read_text(), str(p))]
    t0 = min(s.start for s in steps)
    per30 = [sum(1 for s in steps if s.start - t0 <= t < s.end - t0) for t in range(0, 630, 30)]
    edges = sorted({s.start for s in steps})
    peak = max(sum(1 for s in steps if s.start <= a < s.end) for a in edges)
    return {"peak_objects_at_once": peak,
            "objects_at_once_every_30_s": per30}


cache = RAW / "cache"
doc = {
    "date": "2026-12-04",
    "versions": (RAW / "versions.txt").read_text().splitlines(),
    "setup_cold": timed("setup-1.txt"),
    "kernels_in_setup": {re.sub(r"-[0-9a-f]{32}\.ninja-logs$", "", d.name): objects(d)
                         for d in sorted(cache.glob("*.ninja-logs"))},
    "load": at_once(sorted(cache.glob("*.ninja-logs"))),
    "setup_warm": [timed(f"setup-{i}.txt") for i in (2, 3, 4)],
    "setup_verify_deep": timed("setup-deep.txt"),
    "te_alone_cold": {**timed("te-alone.txt"), **objects(RAW / "te-cache" / "ninja-logs")},
    "bare_image_import": (RAW / "imports.txt").read_text().splitlines()[-2:],
    "pydantic_before_setup": (RAW / "pydantic-before.txt").read_text().splitlines()[-2:],
}
print(json.dumps(doc, indent=1))
