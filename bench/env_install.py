#!/usr/bin/env python3
"""Benchmark: install the default profile's lock with uv and with pip into fresh prefixes.

Both tools install the same hashed lock (--require-hashes --no-deps) from the same local
wheelhouse, each once untimed first so that its own cache is warm; then each is timed --repeat
times into a new prefix, alternating, and the medians and their ratio are reported. Writes
bench/results/<date>-env-install.json.

    python bench/env_install.py [--wheelhouse DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
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

from megatron_env import profile, uv  # noqa: E402
from megatron_env.pyenv import lock  # noqa: E402


def sh(argv, **kw):
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    if r.returncode:
        cmd = " ".join(map(str, argv))
        raise SystemExit(f"failed: {cmd}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def install(tool: str, python: str, lockfile: Path, wheelhouse: Path, where: Path) -> float:
    prefix = where / f"{tool}-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    if tool == "uv":
        sh([uv.exe(), "venv", "-q", "--python", python, prefix], env=uv.env())
        sh([uv.exe(), "pip", "install", "-q", "--python", prefix / "bin" / "python",
            "--require-hashes", "--no-deps", "--no-index", "--find-links", wheelhouse, "-r",
            lockfile], env=uv.env())
    else:
        sh([python, "-m", "venv", prefix])
        sh([prefix / "bin" / "python", "-m", "pip", "install", "-q", "--require-hashes",
            "--no-deps", "--no-index", "--find-links", wheelhouse, "-r", lockfile])
    seconds = time.perf_counter() - t0
    shutil.rmtree(prefix)
    return seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default=None)
    p.add_argument("--wheelhouse", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    prof = profile.load(args.profile)
    lockfile = prof.lock_file
    python, _ = lock.find_python(prof.python)
    with tempfile.TemporaryDirectory(prefix="bench-env-") as tmp:
        where = Path(tmp)
        wh = args.wheelhouse or where / "wheelhouse"
        if not wh.exists():
            print(f"downloading the lock's wheels into {wh} ...", flush=True)
            r = lock.download_wheels(lockfile, wh, prof.python)
            if not r.ok:
                raise SystemExit(f"downloading the wheels failed:\n{r.tail(20)}")
        times: dict[str, list[float]] = {"uv": [], "pip": []}
        for tool in times:  # warm each tool's own cache
            print(f"warming {tool} ...", flush=True)
            install(tool, python, lockfile, wh, where)
        for i in range(args.repeat):
            for tool in times:
                times[tool].append(install(tool, python, lockfile, wh, where))
                print(f"run {i + 1}: {tool} {times[tool][-1]:.1f} s", flush=True)
    med = {t: statistics.median(v) for t, v in times.items()}
    doc = {"date": time.strftime("%Y-%m-%d"), "profile": prof.name,
           "packages": len(lock.parse_lock(lockfile.read_text())),
           "machine": f"{platform.machine()}, {platform.processor() or '?'}, "
                      f"{__import__('os').cpu_count()} cores",
           "uv": sh([uv.exe(), "--version"]).stdout.strip(),
           "pip": sh([python, "-m", "pip", "--version"]).stdout.split(" from ")[0],
           "seconds": times, "median_seconds": med, "pip_over_uv": med["pip"] / med["uv"]}
    out = ROOT / "bench" / "results" / f"{doc['date']}-env-install.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"uv {med['uv']:.1f} s, pip {med['pip']:.1f} s (medians of {args.repeat}): pip takes "
          f"{doc['pip_over_uv']:.1f}x as long; {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
