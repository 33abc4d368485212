#!/usr/bin/env python3
"""How fast is the one redaction on the lines it sees most: a job log's and a build's.

Every console line, every triage output line and every line of a command's log goes through
megatron_env.redact.text. This times it on the real lines of tests/fixtures (job logs, NCCL logs,
ninja and build-progress logs), line by line, once with an empty environment and once with this
process's, for the redact.py of this checkout and of a git revision (`--base`, default
`HEAD~1`'s), in one run; JSON out (microseconds per line and the ratio).

    python bench/redact_lines.py --base main
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def lines() -> list[str]:
    out: list[str] = []
    for sub in ("job-logs", "nccl-logs", "ninja-logs", "build-progress"):
        for f in sorted((FIXTURES / sub).rglob("*")):
            if f.is_file():
                out += f.read_text(errors="replace").splitlines()
    return out


def load(source: str, name: str):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(source)
    spec = importlib.util.spec_from_file_location(name, fh.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    os.unlink(fh.name)
    return mod


def per_line(mod, corpus: list[str], environ) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for line in corpus:
            mod.text(line, environ)
        best = min(best, time.perf_counter() - t)
    return best / len(corpus) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD~1")
    args = ap.parse_args()
    base = subprocess.run(["git", "show", f"{args.base}:megatron_env/redact.py"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    mods = {"base": load(base, "redact_base"),
            "this": load((ROOT / "megatron_env" / "redact.py").read_text(), "redact_this")}
    corpus = lines()
    result: dict = {"lines": len(corpus), "base": args.base}
    for env_name, environ in (("empty_env", {}), ("process_env", dict(os.environ))):
        us = {k: per_line(m, corpus, environ) for k, m in mods.items()}
        result[env_name] = {"us_per_line": {k: round(v, 2) for k, v in us.items()},
                            "this_over_base": round(us["this"] / us["base"], 2)}
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
