#!/usr/bin/env python3
"""How fast `invoke triage` reads a big log, as a ratio to `grep -c` on the same file in the
same run (a machine's load and disk change both alike, so the ratio is what compares).

For each mix of `triage_stream.write_log` (the worst case `signatures`, where nearly every line
is near a signature, and a typical Megatron-LM log, `megatron`), writes a log of SIZE MB, then
times `grep -c ''` (every line counted at C speed), `grep -c -E 'Error|NCCL|WARN'` (a search
for a few words) and the triage of it (`python -m invoke triage LOG --json`, as a user runs
it), each run ROUNDS times (the best kept). Prints JSON: MB/s by wall time and by CPU time
(the child's user+sys: on a loaded machine the wall time says more about the neighbours), the
ratios, the triage's peak RSS and its line count against grep's (they must agree: `wc -l`).

    python bench/triage_speed.py --size 60 --mixes signatures,megatron
    # goal: >= 15 MB/s worst case, >= 30 MB/s typical, <= 400 MB RSS (2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from triage_stream import write_log  # noqa: E402


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int,
                                                                          str]:
    """Wall and CPU seconds (user+sys of the child), peak RSS (KiB) and stdout of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in (0, 1, 3):
        raise SystemExit(f"error: {cmd[0]} exited {r.returncode}: {r.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss, r.stdout


def measure(mix: str, size_mb: int, rounds: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="triage-speed-") as tmp:
        log = Path(tmp) / "job.log"
        size = write_log(log, size_mb, mix) / 1e6
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        runs: dict[str, tuple[float, float]] = {}
        grep_lines = triage_lines = 0
        rss = 0
        for _ in range(rounds):
            for name, cmd in (("grep_lines", ["grep", "-c", "", str(log)]),
                              ("grep_words", ["grep", "-c", "-E", "Error|NCCL|WARN", str(log)]),
                              ("triage", [sys.executable, "-m", "invoke", "triage", str(log),
                                          "--json"])):
                wall, cpu, peak, out = _timed(cmd, env)
                best = runs.get(name)
                runs[name] = (min(wall, best[0]) if best else wall,
                              min(cpu, best[1]) if best else cpu)
                if name == "grep_lines":
                    grep_lines = int(out.strip())
                elif name == "triage":
                    triage_lines, rss = json.loads(out)["lines"], peak
    rate = {k: round(size / w, 1) for k, (w, _) in runs.items()}
    cpu_rate = {k: round(size / max(c, 1e-3), 1) for k, (_, c) in runs.items()}
    return {
        "mix": mix, "log_mb": round(size, 1), "lines_grep": grep_lines,
        "lines_triage": triage_lines, "mb_per_s": rate, "mb_per_cpu_s": cpu_rate,
        "triage_vs_grep_lines": round(runs["grep_lines"][0] / runs["triage"][0], 4),
        "triage_vs_grep_words": round(runs["grep_words"][0] / runs["triage"][0], 4),
        "max_rss_mb_children": round(rss / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=60, help="MB of each log")
    ap.add_argument("--mixes", default="signatures,megatron", help="comma-separated mixes")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each command (best kept)")
    a = ap.parse_args()
    out = [measure(m, a.size, a.rounds) for m in a.mixes.split(",")]
    print(json.dumps({"results": out, "cpus": os.cpu_count(),
                      "load_avg_1min": round(os.getloadavg()[0], 2),
                      "python": sys.version.split()[0]}, indent=2))


if __name__ == "__main__":
    main()
