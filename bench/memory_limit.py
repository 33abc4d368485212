#!/usr/bin/env python3
"""Memory safety for real: a cold kernel build inside a cgroup v2 memory limit, once with the
MAX_JOBS that megatron-env derives (it reads the cgroup's limit) and once with a naive
MAX_JOBS (the core count), recording for each whether the kernel OOM-killed a compiler.

Each run gets a fresh cgroup (memory.max = the limit, memory.swap.max = 0) and an empty wheel
cache, and runs `invoke build PACKAGE` inside it. Recorded per run: exit status, wall time,
memory.peak, memory.events (oom, oom_kill), the MAX_JOBS line of the build plan, the build's
console output. Needs root and a cgroup hierarchy where this process may create a child with
the memory controller (v2, or v1's memory hierarchy: a VM, a bare-metal node, or a container
given its cgroups read-write); otherwise systemd-run --scope is tried; otherwise it says what is
missing.

    sudo python bench/memory_limit.py flash-attn --profile core_v0.19.0-cu130 \\
        --python /opt/torch/.venv/bin/python3 --limit-gib 24 --naive-jobs 16 \\
        --out bench/results/<date>-<gpu>/memory-limit
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CGROUP = Path("/sys/fs/cgroup")


def own_cgroups() -> tuple[Path | None, Path | None]:
    """This process's cgroup v2 directory and its cgroup v1 memory directory (either may be
    absent: /proc/self/cgroup has a 0:: line on v2 and a memory line on v1)."""
    v2 = v1 = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (CGROUP / "cgroup.controllers").exists():
            v2 = CGROUP / path.lstrip("/")
        elif "memory" in controllers.split(","):
            v1 = CGROUP / "memory" / path.lstrip("/")
    return v2, v1


def make_cgroup(name: str, limit: int) -> Path | None:
    """A child cgroup with a memory limit, or None when this hierarchy does not allow it.

    cgroup v2: a child gets the memory controller only if the parent lists it in
    cgroup.subtree_control; enabling it there fails (EBUSY) when the parent itself holds
    processes (v2's no internal processes rule), except at the root; then the parent's parent
    is tried. cgroup v1: a directory in the memory hierarchy, limit in memory.limit_in_bytes."""
    v2, v1 = own_cgroups()
    if v2 is None and v1 is not None and v1.parent.exists():
        d = v1 / name if v1.exists() else CGROUP / "memory" / name
        try:
            d.mkdir(exist_ok=True)
            (d / "memory.limit_in_bytes").write_text(str(limit))
            if (d / "memory.memsw.limit_in_bytes").exists():
                (d / "memory.memsw.limit_in_bytes").write_text(str(limit))
            return d
        except OSError as e:
            print(f"  {d}: {e.strerror}", file=sys.stderr)
            return None
    for parent in (v2, v2.parent) if v2 else ():
        if not (parent / "cgroup.controllers").exists():
            continue
        if "memory" not in (parent / "cgroup.controllers").read_text().split():
            continue
        try:
            if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                (parent / "cgroup.subtree_control").write_text("+memory")
            d = parent / name
            d.mkdir(exist_ok=True)
            (d / "memory.max").write_text(str(limit))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
            return d
        except OSError as e:
            print(f"  {parent}: {e.strerror}", file=sys.stderr)
    return None


def read_events(d: Path) -> dict[str, int]:
    """memory.events (v2: oom, oom_kill ...) or memory.oom_control (v1: oom_kill from 4.13)."""
    f = d / "memory.events" if (d / "memory.events").exists() else d / "memory.oom_control"
    out = {}
    for line in f.read_text().splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    if (d / "memory.failcnt").exists():
        out["failcnt"] = int((d / "memory.failcnt").read_text())
    return out


def peak_bytes(d: Path) -> int | None:
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        if (d / name).exists():
            return int((d / name).read_text())
    return None


def run_in_cgroup(argv: list[str], env: dict, limit: int, name: str, transcript: Path) -> dict:
    d = make_cgroup(name, limit)
    if d is not None:
        # the child moves itself into the cgroup before exec, so the build and every compiler
        # it starts are in it from the first instruction
        wrapped = ["sh", "-c", f'echo $$ > "{d}/cgroup.procs" && exec "$@"', "sh", *argv]
        how = f"cgroup {d}"
    elif shutil.which("systemd-run"):
        wrapped = ["systemd-run", "--scope", "--quiet", "-p", f"MemoryMax={limit}",
                   "-p", "MemorySwapMax=0", "--unit", name, *argv]
        how = f"systemd-run scope {name}"
    else:
        raise SystemExit("error: cannot create a memory-limited cgroup here (no writable cgroup "
                         "v2 parent with the memory controller, no systemd-run)\n"
                         "hint: run as root on the node itself, not in an unprivileged container")
    print(f"{name}: {' '.join(argv[3:])} in {how}", file=sys.stderr)
    t0 = time.perf_counter()
    with transcript.open("w") as out:
        p = subprocess.run(wrapped, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    result = {"how": how, "rc": p.returncode, "wall_seconds": round(time.perf_counter() - t0, 1)}
    text = transcript.read_text(errors="replace")
    result["jobs_line"] = next((ln.strip() for ln in text.splitlines()
                                if ln.strip().startswith("jobs ")), None)
    if d is not None:
        result["events"] = read_events(d)
        if (peak := peak_bytes(d)) is not None:
            result["peak_gib"] = round(peak / 2**30, 2)
        result["oom_killed"] = result["events"].get("oom_kill", 0) > 0
        with contextlib.suppress(OSError):  # a v1 group may keep a zombie a moment longer
            d.rmdir()
    else:
        result["oom_killed"] = "oom" in text.lower() or "killed" in text.lower()
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("package")
    p.add_argument("--profile")
    p.add_argument("--python", required=True)
    p.add_argument("--limit-gib", type=float, default=24.0)
    p.add_argument("--naive-jobs", type=int, default=os.cpu_count() or 16)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", choices=["derived", "naive"], help="run one of the two")
    a = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("error: creating a cgroup needs root\nhint: run it with sudo")
    a.out.mkdir(parents=True, exist_ok=True)
    limit = int(a.limit_gib * 2**30)
    base = {k: v for k, v in os.environ.items() if k not in ("MAX_JOBS", "APEX_PARALLEL_BUILD")}
    runs = {"derived": base, "naive": {**base, "MAX_JOBS": str(a.naive_jobs)}}
    result = {"date": time.strftime("%Y-%m-%d"), "package": a.package, "profile": a.profile,
              "limit_gib": a.limit_gib, "cores": len(os.sched_getaffinity(0)), "runs": {}}
    for name, env in runs.items():
        if a.only and name != a.only:
            continue
        cache = Path(tempfile.mkdtemp(prefix=f"memlimit-{name}-"))
        argv = [sys.executable, "-m", "invoke", "build", a.package, "--python", a.python,
                "--cache-dir", str(cache)] + (["--profile", a.profile] if a.profile else [])
        result["runs"][name] = run_in_cgroup(argv, env, limit, f"megatron-env-{name}-{os.getpid()}",
                                             a.out / f"{name}.txt")
        shutil.rmtree(cache, ignore_errors=True)
        print(f"{name}: {json.dumps(result['runs'][name])}", file=sys.stderr)
    (a.out / "memory_limit.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    derived = result["runs"].get("derived")
    return 0 if derived is None or (derived["rc"] == 0 and not derived["oom_killed"]) else 1


if __name__ == "__main__":
    sys.exit(main())
