#!/usr/bin/env python3
"""Benchmark: a cold kernel build and a cache-hit reinstall, both through `invoke build`.

Runs `invoke build PACKAGE` twice against one empty wheel cache: the first run fetches, patches,
compiles, caches, installs and verifies; the second must be a cache hit that installs without a
compiler. Records each run's console output and wall time, the build plan (MAX_JOBS and why),
the compile time and full log from the cache's meta.json, and the machine (GPU, driver, torch,
CUDA, NCCL, cores, free memory) into OUT/kernel_build.json.

    python bench/kernel_build.py flash-attn --profile core_v0.19.0-cu130 \\
        --python /opt/torch/.venv/bin/python3 --out bench/results/<date>-<gpu>/flash-attn
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megatron_env import parsers  # noqa: E402
from megatron_env.resources import cores, mem_available  # noqa: E402

PROBE = ("import json, torch; print(json.dumps({'torch': torch.__version__, "
         "'cuda': torch.version.cuda, 'nccl': '.'.join(map(str, torch.cuda.nccl.version())) "
         "if torch.cuda.is_available() else None, 'gpu': torch.cuda.get_device_name(0) "
         "if torch.cuda.is_available() else None}))")


def run_build(argv: list[str], transcript: Path) -> tuple[int, float]:
    """One `invoke build`, echoed line by line (a long build shows its progress) and kept."""
    t0 = time.perf_counter()
    with transcript.open("w") as out:
        p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, bufsize=1)
        for line in p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            out.write(line)
        rc = p.wait()
    return rc, time.perf_counter() - t0


def machine(python: str) -> dict:
    facts: dict = {"host_python": platform.python_version(), "cores": cores(),
                   "mem_available_gib": round(mem_available() / 2**30, 1)}
    r = subprocess.run([python, "-c", PROBE], capture_output=True, text=True)
    if r.returncode == 0:
        facts.update(json.loads(r.stdout.strip().splitlines()[-1]))
    smi = shutil.which("nvidia-smi")
    if smi:
        r = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            facts["gpu"], facts["driver"] = (x.strip() for x in
                                             r.stdout.splitlines()[0].split(",", 1))
    if shutil.which("nvcc"):
        with contextlib.suppress(parsers.ParseError):
            facts["nvcc"] = parsers.nvcc_release(
                subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout)
    return facts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("package", choices=["flash-attn", "apex"])
    p.add_argument("--profile")
    p.add_argument("--python", required=True, help="the environment to build for")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cache-dir", type=Path,
                   help="an empty wheel cache (default: a new temporary directory)")
    a = p.parse_args()

    a.out.mkdir(parents=True, exist_ok=True)
    cache = a.cache_dir or Path(tempfile.mkdtemp(prefix="kernel-build-cache-"))
    if (cache / "wheels").exists() and any((cache / "wheels").iterdir()):
        raise SystemExit(f"{cache} already holds wheels: a cold build needs an empty cache")
    argv = [sys.executable, "-m", "invoke", "build", a.package, "--python", a.python,
            "--cache-dir", str(cache)] + (["--profile", a.profile] if a.profile else [])
    result = {"date": time.strftime("%Y-%m-%d"), "package": a.package, "profile": a.profile,
              "command": " ".join(["invoke"] + argv[3:]), "machine": machine(a.python)}

    rc1, cold = run_build(argv, a.out / "build-1.txt")
    result["cold"] = {"rc": rc1, "wall_seconds": round(cold, 1)}
    if rc1 == 0:
        rc2, warm = run_build(argv, a.out / "build-2.txt")
        text = (a.out / "build-2.txt").read_text()
        result["cache_hit"] = {"rc": rc2, "wall_seconds": round(warm, 1),
                               "was_hit": "cache hit" in text}
    metas = list(cache.glob("wheels/*/meta.json"))
    if metas:
        meta = json.loads(metas[0].read_text())
        result["plan"] = meta["plan"]
        result["cold"]["compile_seconds"] = round(meta["build_seconds"], 1)
        result["max_jobs"], result["max_jobs_why"] = meta["max_jobs"], meta["why_jobs"]
        wheel = next(metas[0].parent.glob("*.whl"))
        result["wheel"] = {"name": wheel.name, "bytes": wheel.stat().st_size}
    logs = sorted(cache.glob("logs/*.log"))
    if logs:  # the full compiler log of the cold build
        with logs[-1].open("rb") as f, gzip.open(a.out / "build.log.gz", "wb") as g:
            shutil.copyfileobj(f, g)
    (a.out / "kernel_build.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result.get(k) for k in ("max_jobs", "cold", "cache_hit")}))
    if not a.cache_dir:
        shutil.rmtree(cache, ignore_errors=True)
    return 0 if rc1 == 0 and result.get("cache_hit", {}).get("was_hit") else 1


if __name__ == "__main__":
    sys.exit(main())
