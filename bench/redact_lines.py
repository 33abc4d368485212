#!/usr/bin/env python3
"""How fast is the one redaction on the lines it sees most, and triage that quotes through it.

Every console line, every triage output line and every line of a command's log goes through
megatron_env.redact.text. This times, for this checkout and for a git revision (`--base`,
default `HEAD~1`) in one run, each in a child Python whose megatron_env is that revision's
(`git archive`; the redaction was one module and is now a package, so neither is imported
into the other's process):
- redact.text on the real lines of tests/fixtures (job logs, NCCL logs, ninja and
  build-progress logs), line by line, with an empty environment and with this process's;
- `triage` (commands.triage, its output to a buffer) on each job log of tests/fixtures.
Best of 3 in a child, each from cold memo caches, and best of `--rounds` children run
alternately; JSON out (microseconds per line, milliseconds per triage, this/base ratios).

    python bench/redact_lines.py --base cd09f9c [--only-redaction]

`--only-redaction`: the base is this checkout with only the redaction taken from `--base`, so
that triage's own changes since then are not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

CHILD = r'''
import contextlib, io, json, os, sys, time
from pathlib import Path
from megatron_env import redact
try:
    from megatron_env.commands import host as commands  # the commands split by topic
except ImportError:
    from megatron_env import commands

fixtures = Path(sys.argv[1])
lines = []
for sub in ("job-logs", "nccl-logs", "ninja-logs", "build-progress"):
    for f in sorted((fixtures / sub).rglob("*")):
        if f.is_file() and f.suffix not in (".zst", ".gz"):
            lines += f.read_text(errors="replace").splitlines()
logs = [str(f) for f in sorted((fixtures / "job-logs").glob("*.log"))]


def clear_caches():
    """Every memo of the redaction emptied: each repetition starts cold, as a new run does."""
    mods = [m for name, m in sys.modules.items() if name.startswith("megatron_env.redact")]
    for mod in mods:
        for obj in vars(mod).values():
            if hasattr(obj, "cache_clear"):
                obj.cache_clear()


def best(fn):
    out = float("inf")
    for _ in range(3):
        clear_caches()
        t = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t)
    return out


def redact_all(environ):
    for line in lines:
        redact.text(line, environ)


def triage_all():
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for log in logs:
            commands.triage(logs=log)


env = dict(os.environ)
print(json.dumps({
    "lines": len(lines), "logs": len(logs),
    "empty_env_us_per_line": best(lambda: redact_all({})) / len(lines) * 1e6,
    "process_env_us_per_line": best(lambda: redact_all(env)) / len(lines) * 1e6,
    "triage_ms_per_log": best(triage_all) / len(logs) * 1e3,
}))
'''


def measure(tree: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(FIXTURES)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD~1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only-redaction", action="store_true",
                    help="the base is this checkout with the base revision's redaction")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        if args.only_redaction:  # this checkout with the base's redaction: triage's own
            shutil.copytree(ROOT / "megatron_env", base / "megatron_env")  # changes left out
            shutil.rmtree(base / "megatron_env" / "redact", ignore_errors=True)
            (base / "megatron_env" / "redact.py").unlink(missing_ok=True)
            paths = ["megatron_env/redact.py", "megatron_env/redact"]
        else:
            paths = ["megatron_env"]
        listed = subprocess.run(["git", "ls-tree", "--name-only", args.base, *paths], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.split()
        archive = subprocess.run(["git", "archive", args.base, *listed], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        # alternated rounds, best of each: a machine busy with other work slows both alike
        rounds = [(measure(base), measure(ROOT)) for _ in range(args.rounds)]
        results = {name: {k: min(r[i][k] for r in rounds) for k in rounds[0][i]}
                   for i, name in enumerate(("base", "this"))}
    out: dict[str, object] = {"base": args.base, "only_redaction": args.only_redaction,
                              "lines": results["this"]["lines"],
                              "logs": results["this"]["logs"]}
    for key in ("empty_env_us_per_line", "process_env_us_per_line", "triage_ms_per_log"):
        b, t = results["base"][key], results["this"][key]
        out[key] = {"base": round(b, 2), "this": round(t, 2), "this_over_base": round(t / b, 2)}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
