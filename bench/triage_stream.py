#!/usr/bin/env python3
"""Can `invoke triage` read a week-long job's log: memory and speed on a big log of real lines.

Writes a log of SIZE MB made of the lines of the real logs under tests/fixtures/job-logs/ and
runs the triage of it in a child process (`python -m invoke triage LOG --json`, as a user would) and
prints JSON: the child's peak RSS (resource.getrusage(RUSAGE_CHILDREN).ru_maxrss), its wall
time, CPU time and MB/s, and the findings' ids. The log is deleted afterwards. Two mixes:

- `signatures` (the worst case): every fixture's lines in order, over and over (each round's
  ranks shifted so repeats are not identical lines). Nearly every line is a signature or next
  to one, so every line takes the full parse.
- `run` (a job's life): the fixture lines that match no signature (tracebacks, progress bars,
  loss lines, launcher chatter), repeated, with one fixture log's lines inserted whole every
  MB, the way a long run's log has its errors among millions of ordinary lines.
- `megatron` (a typical Megatron-LM log): its iteration lines (training.py's training_log
  format: every field padded, each line as wide as the others and beginning with a space),
  with one fixture log's lines inserted whole every MB.

    python bench/triage_stream.py --size 300 --mix run   # goal: <= 400 MB RSS, >= 20 MB/s
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "fixtures" / "job-logs"
_RANK = re.compile(r"\[rank(\d+)\]")


def _shifted(shift: int) -> Callable[[re.Match[str]], str]:
    """A `[rankN]` tag with its rank `shift` higher (each round's ranks differ)."""
    return lambda m: f"[rank{int(m.group(1)) + shift}]"


def megatron(start: int, n: int) -> list[str]:
    """Megatron-LM's iteration lines (megatron/training/training.py, training_log)."""
    return [f" iteration {i:8d}/{500000:8d} | consumed samples: {i * 512:12d} | elapsed time "
            f"per iteration (ms): {1234.5:.1f} | learning rate: {1.5e-4:.3E} | global batch "
            f"size: {512:5d} | lm loss: {2.5 - i / 1e6:.6E} | loss scale: 1.0 | grad norm: "
            f"{0.812:.3f} | number of skipped iterations: {0:3d} | number of nan iterations: "
            f"{0:3d} |" for i in range(start + 1, start + n + 1)]


def write_log(path: Path, size_mb: int, mix: str = "signatures") -> int:
    """A log of about `size_mb` MB from the fixtures' lines; its size in bytes."""
    sys.path.insert(0, str(ROOT))
    from megatron_env.diagnose.events import is_hot

    logs = [f.read_text(errors="replace").splitlines() for f in sorted(LOGS.glob("*.log"))]
    lines = [x for log in logs for x in log]
    cold = [x for x in lines if not is_hot(x)]
    target = size_mb * 1_000_000
    written = 0
    round_ = 0
    with open(path, "w") as out:
        while written < target:
            shift = round_ % 64
            if mix == "signatures":
                body = lines
            elif mix == "megatron":
                body = megatron(round_ * 3000, 3000) + logs[round_ % len(logs)]
            else:  # about a MB of ordinary lines, then one whole fixture log
                body = cold * max(1, 1_000_000 // max(1, sum(map(len, cold)))) + \
                    logs[round_ % len(logs)]
            chunk = "\n".join(_RANK.sub(_shifted(shift), x) for x in body) + "\n"
            out.write(chunk)
            written += len(chunk.encode())
            round_ += 1
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=300, help="MB of log to triage")
    ap.add_argument("--mix", choices=["signatures", "run", "megatron"], default="signatures",
                    help="what the log is made of (see above)")
    ap.add_argument("--keep", help="write the log here and keep it")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="triage-stream-") as tmp:
        log = Path(a.keep) if a.keep else Path(tmp) / "job.log"
        size = write_log(log, a.size, a.mix)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        start = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "invoke", "triage", str(log), "--json"],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss_kib = usage.ru_maxrss
    if r.returncode not in (0, 1, 3):
        raise SystemExit(f"error: triage exited {r.returncode}: {r.stderr.strip()[-500:]}")
    doc = json.loads(r.stdout)
    print(json.dumps({
        "mix": a.mix, "log_mb": round(size / 1e6, 1), "lines": doc["lines"],
        "wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "mb_per_s": round(size / 1e6 / wall, 1),
        "mb_per_cpu_s": round(size / 1e6 / (usage.ru_utime + usage.ru_stime), 1),
        "max_rss_mb": round(rss_kib / 1024, 1),
        "cpus": os.cpu_count(), "load_avg_1min": round(os.getloadavg()[0], 2),
        "findings": [f["id"] for f in doc["findings"]]}, indent=2))


if __name__ == "__main__":
    main()
