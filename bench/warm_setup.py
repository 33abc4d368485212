#!/usr/bin/env python3
"""Benchmark: a warm `invoke setup` (nothing changed since the last run), with the manifest's
stat check that proves every installed file is still what the build left.

One untimed `invoke setup` first (it must end "ready": build the environment before, this only
re-runs it); then --repeat timed runs, each a fresh process as a user would start it, with the
per-step seconds from its summary table; then the stat check alone, in process, over the
manifest it reads; and one `--verify-deep` run (every file re-hashed, imports proven) for scale.

    python bench/warm_setup.py --profile core_v0.4.0-cu121 [--prefix DIR] [--repeat 5]
    python bench/warm_setup.py --profile core_v0.19.0-cu130 --adopt /opt/torch/.venv/bin/python3

Extra arguments for `invoke setup` (for example --no-builds) follow `--`. JSON on stdout, and
into --out when given.

    python bench/warm_setup.py ... --against OTHER_CHECKOUT -- --no-builds

times another checkout of the tool (an older commit, unpacked) on the same environment, its
runs alternating with this one's, and reports the ratio of the medians. Where strace is
installed, one more run of each is traced and every program it starts is counted (the
subprocesses a warm run costs). Bytecode is written and used as an installed tool's is
(PYTHONDONTWRITEBYTECODE is dropped from the children's environment: with it set, every run
compiles every imported module again).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megatron_env import profile  # noqa: E402
from megatron_env.pyenv import audit, env, manifest  # noqa: E402
from megatron_env.setup import pipeline  # noqa: E402

ROW = re.compile(r"^(\w+)\s+(done|up to date|skipped|failed|not run)\s+([\d.]+)\b", re.M)


FRONT = {"invoke": ["-m", "invoke"], "megatron-env": ["-m", "megatron_env"]}
_front = FRONT["invoke"]


def _env() -> dict[str, str]:
    """The children's environment: one state root for both checkouts (the same environment and
    Megatron checkout), bytecode as an installed tool has it."""
    e = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**e, "COLUMNS": "250", "MEGATRON_ENV_STATE": os.environ.get("MEGATRON_ENV_STATE",
                                                                        str(ROOT))}


def setup(args: list[str], tree: Path = ROOT, wrap: list[str] | None = None
          ) -> tuple[float, dict, str]:
    """(wall seconds, {step: [status, seconds]}, output) of one `invoke setup` process (or
    `megatron-env setup`, --front), run from `tree` (its megatron_env is the one imported)."""
    t0 = time.perf_counter()
    r = subprocess.run([*(wrap or []), sys.executable, *_front, "setup", *args], cwd=tree,
                       capture_output=True, text=True, env=_env())
    seconds = time.perf_counter() - t0
    steps = {m.group(1): [m.group(2), float(m.group(3))] for m in ROW.finditer(r.stdout)}
    if r.returncode:
        raise SystemExit(f"invoke setup {' '.join(args)} failed (exit {r.returncode}):\n"
                         f"{r.stdout[-3000:]}{r.stderr[-2000:]}")
    return seconds, steps, r.stdout


def execs(args: list[str], tree: Path) -> dict | None:
    """The programs one warm run starts (successful execve calls after the tool's own), from
    strace; None when strace is not installed."""
    if not shutil.which("strace"):
        return None
    import tempfile

    # one file per process (-ff): no call split across lines by another thread's
    with tempfile.TemporaryDirectory(prefix="warm-setup-strace-") as tmp:
        setup(args, tree, ["strace", "-f", "-ff", "-qq", "-e", "trace=execve", "-e",
                           "signal=none", "-o", f"{tmp}/trace"])
        per_pid = {int(f.suffix[1:]): re.findall(r'^execve\("([^"]+)".*\) = 0$',
                                                  f.read_text(), re.M)
                   for f in Path(tmp).iterdir()}
    # the first process is the tool's own; a process that execs twice (a wrapper script, then
    # its program) counts once, named by what it ran last
    started = [ran[-1] for _pid, ran in sorted(per_pid.items())[1:] if ran]
    names: dict[str, int] = {}
    for exe in started:
        names[Path(exe).name] = names.get(Path(exe).name, 0) + 1
    return {"processes": len(started), "programs": names}


def _summary(walls: list[float]) -> dict:
    return {"median": statistics.median(walls), "min": min(walls), "max": max(walls)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default=None)
    p.add_argument("--prefix", default=None, help="the environment (default: the profile's)")
    p.add_argument("--adopt", default=None, help="an existing interpreter, as `invoke setup`")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--front", choices=sorted(FRONT), default="invoke",
                   help="the command a user starts: `invoke setup` (imports invoke, ~0.3 s) or "
                        "the `megatron-env setup` console command")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--against", type=Path, help="another checkout of the tool to time, "
                   "alternating with this one (its commit: --against-name)")
    p.add_argument("--against-name", default=None, help="what --against is (a commit)")
    p.add_argument("rest", nargs="*", help="after --: more `invoke setup` arguments")
    a = p.parse_args()
    global _front
    _front = FRONT[a.front]

    prof = profile.load(a.profile)
    prefix = Path(a.prefix).absolute() if a.prefix else env.default_prefix(prof)
    args = ["--profile", prof.name, "--prefix", str(prefix), *a.rest]
    if a.adopt:
        args += ["--adopt", str(Path(a.adopt).absolute())]  # both checkouts' cwd
    setup(args)  # warm-up: must already be set up, so this one only re-checks
    other = a.against.absolute() if a.against else None
    if other:
        setup(args, other)  # its bytecode written; must be up to date for it too
    runs, against = [], []
    for _ in range(a.repeat):
        seconds, steps, _out = setup(args)
        runs.append({"seconds": round(seconds, 3), "steps": steps})
        if other:
            seconds, steps, _out = setup(args, other)
            against.append({"seconds": round(seconds, 3), "steps": steps})
    walls = [r["seconds"] for r in runs]

    where = (prefix.with_name(prefix.name + ".setup") / pipeline.ADOPTED_MANIFEST if a.adopt
             else prefix / env.MANIFEST)
    t0 = time.perf_counter()
    m = manifest.load(where)
    loaded = time.perf_counter() - t0
    if m is None:
        raise SystemExit(f"no manifest at {where}: run `invoke setup` with this version first")
    t0 = time.perf_counter()
    diffs = manifest.stat_check(m, ignore_extra=set() if a.adopt else audit.TOOLING | audit.ON_TOP)
    checked = time.perf_counter() - t0
    deep_seconds, deep_steps, _ = setup([*args, "--verify-deep"])

    doc = {
        "benchmark": "warm_setup",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(),
                 "python": platform.python_version()},
        "profile": prof.name, "prefix": str(prefix), "adopt": a.adopt,
        "command": [a.front, "setup", *args],
        "repeat": a.repeat,
        "warm_setup_seconds": _summary(walls),
        "runs": runs,
        "execs": execs(args, ROOT),
        "stat_check": {"files": sum(len(d["files"]) for d in m["dists"].values()),
                       "packages": len(m["dists"]), "bytes": m["bytes"],
                       "load_seconds": round(loaded, 4), "check_seconds": round(checked, 4),
                       "differences": len(diffs)},
        "verify_deep": {"seconds": round(deep_seconds, 3), "steps": deep_steps},
    }
    if other:
        theirs = [r["seconds"] for r in against]
        doc["against"] = {"checkout": a.against_name or str(other),
                          "warm_setup_seconds": _summary(theirs), "runs": against,
                          "execs": execs(args, other),
                          "ratio_of_medians": round(statistics.median(walls)
                                                    / statistics.median(theirs), 3)}
    text = json.dumps(doc, indent=2) + "\n"
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
