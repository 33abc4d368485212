#!/usr/bin/env python3
"""Benchmark: `invoke triage` on 64 ranks' flight-recorder dumps of 2,000 entries each.

The dumps are real: a 4-rank gloo job (tests/flight_jobs.py, scenario `skip`) runs COLLECTIVES
all_reduces with TORCH_FR_BUFFER_SIZE=2000, then rank 2 skips one and every rank dumps. They are
copied to 64 ranks: rank 2 keeps rank 2's dump, every other rank gets one of the other three
(read with the triage's own reader, the default group's member list renumbered to 0-63, written
back as protocol-2 pickles like torch's, named nccl_trace_rank_<rank>). Then
`python -m invoke triage DIR --json` runs as a user would, pinned to two cores (taskset -c 0,1),
REPEAT times; the wall times, the findings' first summary and the root are printed as JSON and
written to bench/results/<date>-cpu/flight_recorder.json.

    python bench/flight_recorder.py            # goal: < 5 s on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megatron_env.diagnose.flight import dump  # noqa: E402


def make(work: Path, ranks: int, collectives: int) -> Path:
    src = work / "src"
    r = subprocess.run(["timeout", "-k", "5", "300", sys.executable,
                        str(ROOT / "tests/flight_jobs.py"), str(src), "4", "skip",
                        str(collectives)], env={**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"},
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"the gloo job failed: {r.stderr[-2000:]}")
    data = {k: dump.load(src / "skip" / f"nccl_trace_rank_{k}") for k in range(4)}
    out = work / "dumps"
    out.mkdir()
    members = str(list(range(ranks)))
    for rank in range(ranks):
        d = data[2] if rank == 2 else data[(0, 1, 3)[rank % 3]]
        cfg = {k: {**v, "ranks": members if v.get("ranks", "[]") != "[]" else "[]"}
               for k, v in d["pg_config"].items()}
        (out / f"nccl_trace_rank_{rank}").write_bytes(
            pickle.dumps({**d, "pg_config": cfg}, protocol=2))
    return out


def _torch() -> str:
    from importlib.metadata import version

    return version("torch")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--collectives", type=int, default=2100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cores", default="0,1")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flight-bench-"))
    try:
        dumps = make(work, a.ranks, a.collectives)
        entries = [len(dump.read(p).entries) for p in sorted(dumps.iterdir())]
        size = sum(p.stat().st_size for p in dumps.iterdir())
        walls, out = [], {}
        for _ in range(a.repeat):
            t = time.perf_counter()
            r = subprocess.run(["taskset", "-c", a.cores, sys.executable, "-m", "invoke",
                                "triage", str(dumps), "--json"], cwd=ROOT, capture_output=True,
                               text=True)
            walls.append(round(time.perf_counter() - t, 3))
            if r.returncode != 1:
                raise SystemExit(f"triage exited {r.returncode}: {r.stderr[-2000:]}")
            out = json.loads(r.stdout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first = out["findings"][0]
    result = {
        "date": time.strftime("%Y-%m-%d"), "host": platform.machine(),
        "python": platform.python_version(), "torch": _torch(), "cores": a.cores,
        "load_average": os.getloadavg(),
        "ranks": a.ranks, "entries_per_rank": sorted(set(entries)), "bytes": size,
        "wall_s": walls, "median_s": statistics.median(walls), "goal_s": 5,
        "finding": first["id"], "summary": first["summary"],
    }
    print(json.dumps(result, indent=1))
    dest = ROOT / "bench" / "results" / f"{result['date']}-cpu"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "flight_recorder.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["median_s"] < 5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
