#!/usr/bin/env python3
"""`invoke triage`'s speed at two revisions, in one run: each round triages the same log with the
old tree's code, then this tree's in one process and in two (megatron_env/diagnose/
twocore.py), each in a fresh process, so that the load of a shared machine falls on all alike.
Prints JSON: per revision the best wall MB/s and MB per CPU second over the rounds (CPU of the
process and of any it started), the peak RSS of each process, and whether the findings were the
same (they must be: a speed change changes no result).

    python bench/triage_revisions.py --old 794adad --size 50 --mix signatures
    python bench/triage_revisions.py --old-tree DIR ...   # a tree already checked out
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from triage_stream import write_log  # noqa: E402

# what each process runs: the triage of the log in-process, its wall time and findings
_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from megatron_env.diagnose import jobs
if sys.argv[3] != "-":  # this tree: one process or two (twocore.MODE)
    from megatron_env.diagnose import twocore
    twocore.MODE = sys.argv[3]
start = time.perf_counter()
findings, lines, _ = jobs.run([sys.argv[2]])
wall = time.perf_counter() - start
print(json.dumps({"wall_s": wall, "lines": lines,
                  "findings": [[f.id, f.status, f.summary, f.evidence] for f in findings]}))
"""


def once(tree: Path, log: Path, mode: str) -> dict[str, Any]:
    """One triage of `log` with `tree`'s code in a fresh process: wall, CPU, peak RSS."""
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(tree), str(log), mode],
                         stdout=subprocess.PIPE, cwd=tree)
    assert p.stdout is not None
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"error: the triage with {tree} exited {p.returncode}")
    doc: dict[str, Any] = json.loads(out)
    doc["cpu_s"] = usage.ru_utime + usage.ru_stime  # its own and its waited children's
    doc["max_rss_mb"] = usage.ru_maxrss / 1024
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", help="the old revision (git archive of it is triaged)")
    ap.add_argument("--old-tree", help="or the old revision's files, already checked out")
    ap.add_argument("--size", type=int, default=50, help="MB of log")
    ap.add_argument("--mix", choices=["signatures", "run", "megatron"], default="signatures")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if not (a.old or a.old_tree):
        raise SystemExit("error: name the old revision: --old REV or --old-tree DIR")
    with tempfile.TemporaryDirectory(prefix="triage-revisions-") as tmp:
        old = Path(a.old_tree) if a.old_tree else Path(tmp) / "old"
        if a.old:
            old.mkdir()
            tar = subprocess.run(["git", "-C", str(ROOT), "archive", a.old], check=True,
                                 capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=tar, check=True)
        log = Path(tmp) / "job.log"
        size = write_log(log, a.size, a.mix) / 1e6
        variants = (("old", old, "-"), ("new_one_process", ROOT, "one"),
                    ("new_two_processes", ROOT, "two"))
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
        for _ in range(a.rounds):
            for name, tree, mode in variants:
                runs[name].append(once(tree, log, mode))
    first = runs["old"][0]
    same = all((r["findings"], r["lines"]) == (first["findings"], first["lines"])
               for rs in runs.values() for r in rs)
    out: dict[str, object] = {"mix": a.mix, "log_mb": round(size, 1), "rounds": a.rounds,
                              "cpus": os.cpu_count(),
                              "load_avg_1min": round(os.getloadavg()[0], 2),
                              "old": a.old or str(old), "same_findings": same}
    for name, rs in runs.items():
        wall = min(float(r["wall_s"]) for r in rs)
        cpu = min(float(r["cpu_s"]) for r in rs)
        out[name] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                     "mb_per_s": round(size / wall, 1), "mb_per_cpu_s": round(size / cpu, 1),
                     "max_rss_mb": round(max(r["max_rss_mb"] for r in rs), 1)}
    print(json.dumps(out, indent=1))
    if not same:
        raise SystemExit("error: the two revisions found different things")


if __name__ == "__main__":
    main()
