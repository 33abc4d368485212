#!/usr/bin/env python3
"""Benchmark: a cold kernel build and a cache-hit reinstall, both through `invoke build`.

Runs `invoke build PACKAGE` twice against one empty wheel cache: the first run fetches, patches,
compiles, caches, installs and verifies; the second must be a cache hit that installs without a
compiler. Records each run's console output and wall time, the peak memory the machine used
while compiling, the build plan (MAX_JOBS and why), the compile time, ninja's per-object log and
its summary (slowest objects, parallelism), the wheel's size and the full log from the cache,
and the machine (GPU, driver, torch, CUDA, NCCL, cores, free memory) into OUT/kernel_build.json.

With --full (flash-attn) the same again for every head dim and dtype (the profile's variant
replaced by "all", as upstream builds): the variant's speed-up, measured. On a GPU, the installed
build is checked by the recipe's gpu_check in scripts/gpu_health.py (flash-attn against torch's
SDPA, forward and backward; transformer-engine's Linear and LayerNormLinear against fp32
PyTorch), recorded as gpu.check; for flash-attn a call with a head dim the variant left out must
raise the variant's RuntimeError.

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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megatron_env import recipes  # noqa: E402
from megatron_env.host import parsers  # noqa: E402
from megatron_env.host.resources import cores, mem_available, memory  # noqa: E402

# Kernels outside the profile's variant: each call must raise the variant's RuntimeError (or
# run, where the build has them), never crash the process. Every entry point that dispatches on
# head dim and dtype: forward, backward (the low-level op, on a forward's shapes), varlen and
# kvcache. One case per process (`-X faulthandler`): a case that kills its interpreter (seen on
# the H200, 2026-12-03: SIGSEGV, empty stderr; a static libstdc++ inside the extension) leaves
# the others' answers, and the stage it reached ("call", "raised", "exit") shows where it died.
NOT_BUILT_CASES = (("forward", "bfloat16", 64), ("forward", "float16", 128),
                   ("forward", "bfloat16", 256), ("backward", "bfloat16", 64),
                   ("varlen", "bfloat16", 64), ("kvcache", "bfloat16", 64),
                   ("kvcache", "float16", 128))
NOT_BUILT_PROBE = """
import json, sys, torch
import flash_attn.flash_attn_interface as fa
kind, dtype, d = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3])
print("stage call", flush=True)
x = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype)
try:
    if kind == "forward":
        fa.flash_attn_func(x(1, 128, 4, d), x(1, 128, 4, d), x(1, 128, 4, d))
    elif kind == "backward":
        q = x(1, 128, 4, d)
        lse = torch.zeros(1, 4, 128, device="cuda", dtype=torch.float32)
        fa._flash_attn_backward(q, q, q, q, q, lse, None, None, None, 0.0, d ** -0.5, False,
                                -1, -1, 0.0, None, False)
    elif kind == "varlen":
        cu = torch.tensor([0, 64, 128], device="cuda", dtype=torch.int32)
        fa.flash_attn_varlen_func(x(128, 4, d), x(128, 4, d), x(128, 4, d), cu, cu, 64, 64)
    else:
        fa.flash_attn_with_kvcache(x(1, 1, 4, d), x(1, 256, 4, d), x(1, 256, 4, d),
                                   cache_seqlens=128)
    torch.cuda.synchronize()
    print(json.dumps({"result": "ran"}), flush=True)
except RuntimeError as e:
    print("stage raised", flush=True)
    print(json.dumps({"result": "raised", "message": str(e).splitlines()[0]}), flush=True)
print("stage exit", flush=True)
"""


PROBE = ("import json, torch; print(json.dumps({'torch': torch.__version__, "
         "'cuda': torch.version.cuda, 'nccl': '.'.join(map(str, torch.cuda.nccl.version())) "
         "if torch.cuda.is_available() else None, 'gpu': torch.cuda.get_device_name(0) "
         "if torch.cuda.is_available() else None}))")


class PeakMemory:
    """The most memory in use (MemTotal - MemAvailable, or the cgroup's memory.current where a
    cgroup limits this process) while the build runs, sampled every second, minus the use
    before it started: what the compilers took."""

    def __init__(self) -> None:
        self.base = self.peak = self._used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def _used() -> int:
        avail, _ = memory()
        return max(0, _total() - avail)

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def gib(self) -> float:
        return round((self.peak - self.base) / 2**30, 1)


def _total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def run_build(argv: list[str], transcript: Path) -> tuple[int, float, float]:
    """One `invoke build`, echoed line by line (a long build shows its progress) and kept:
    exit status, seconds, peak GiB the build added."""
    t0 = time.perf_counter()
    with transcript.open("w") as out, PeakMemory() as mem:
        p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, bufsize=1)
        for line in p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            out.write(line)
        rc = p.wait()
    return rc, time.perf_counter() - t0, mem.gib


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


def cold_and_warm(name: str, argv: list[str], out: Path, python: str) -> dict:
    """A cold build into an empty cache, then the cache hit; the cache is removed after."""
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix=f"kernel-build-{name}-"))
    argv = [*argv, "--cache-dir", str(cache)]
    result: dict = {"command": " ".join(["invoke"] + argv[3:])}
    rc1, cold, peak = run_build(argv, out / "build-1.txt")
    result["cold"] = {"rc": rc1, "wall_seconds": round(cold, 1), "peak_memory_gib": peak}
    if rc1 == 0:
        rc2, warm, _ = run_build(argv, out / "build-2.txt")
        text = (out / "build-2.txt").read_text()
        result["cache_hit"] = {"rc": rc2, "wall_seconds": round(warm, 1),
                               "was_hit": "cache hit" in text}
    metas = list(cache.glob("wheels/*/meta.json"))
    if metas:
        meta = json.loads(metas[0].read_text())
        result["plan"] = meta["plan"]
        result["cold"]["compile_seconds"] = round(meta["build_seconds"], 1)
        result["max_jobs"], result["max_jobs_why"] = meta["max_jobs"], meta["why_jobs"]
        result["ninja"] = meta.get("ninja")
        wheel = next(metas[0].parent.glob("*.whl"))
        result["wheel"] = {"name": wheel.name, "bytes": wheel.stat().st_size}
        if (metas[0].parent / "ninja-logs").is_dir():
            shutil.copytree(metas[0].parent / "ninja-logs", out / "ninja-logs",
                            dirs_exist_ok=True)
    logs = sorted(cache.glob("logs/*.log"))
    if logs:  # the full compiler log of the cold build
        with logs[-1].open("rb") as f, gzip.open(out / "build.log.gz", "wb") as g:
            shutil.copyfileobj(f, g)
    shutil.rmtree(cache, ignore_errors=True)
    return result


def all_kernels_profile(name: str | None, where: Path) -> str:
    """A copy of the profile whose flash-attn builds every head dim and dtype: its path."""
    sys.path.insert(0, str(ROOT))
    from megatron_env import profile

    src = profile.load(name).path
    lines = []
    for line in src.read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        lines.append(f'{key} = ["all"]' if key in ("hdims", "dtypes") else line)
    dest = where / src.parent.name / src.name
    dest.parent.mkdir(parents=True)
    for f in src.parent.iterdir():  # the lock and environment files beside it
        if f.is_file() and f != src:
            shutil.copy(f, dest.parent / f.name)
    dest.write_text("\n".join(lines) + "\n")
    return str(dest)


def gpu_checks(python: str, out: Path, check: str, outside_variant: bool,
               head_dims: str = "128") -> dict:
    """On a GPU: scripts/gpu_health.py (the recipe's gpu_check, e.g. flash-attn against SDPA,
    forward and backward) and, for flash-attn, the probe for a head dim the variant left out."""
    r = subprocess.run([python, str(ROOT / "scripts" / "gpu_health.py"), "--size", "4096",
                        "--head-dims", head_dims, "--out", str(out / "gpu_health")],
                       capture_output=True, text=True)
    (out / "gpu_health.txt").write_text(r.stdout + r.stderr)
    found: dict = {"gpu_health_rc": r.returncode}
    res = out / "gpu_health" / "results.json"
    if res.exists():
        found["kernels"] = json.loads(res.read_text())["gpus"][0]["kernels"]
        found["check"] = {"name": check, **found["kernels"].get(check, {"status": "absent"})}
        found["attention"] = json.loads(res.read_text())["gpus"][0].get("attention")
    if not outside_variant:
        return found
    found["outside_variant"] = {}
    for kind, dtype, d in NOT_BUILT_CASES:
        r = subprocess.run([python, "-X", "faulthandler", "-c", NOT_BUILT_PROBE, kind, dtype,
                            str(d)], capture_output=True, text=True, timeout=600)
        lines = r.stdout.splitlines()
        answer = next((json.loads(x) for x in lines if x.startswith("{")), {})
        found["outside_variant"][f"{kind}-{dtype}-{d}"] = {
            "rc": r.returncode,
            "result": answer.get("result") or ("crashed" if r.returncode < 0 else "error"),
            "message": answer.get("message"),
            "stages": [x.split()[1] for x in lines if x.startswith("stage ")],
            "stderr_tail": r.stderr[-2000:]}
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("package", choices=list(recipes.declared()))
    p.add_argument("--profile")
    p.add_argument("--python", required=True, help="the environment to build for")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--full", action="store_true",
                   help="flash-attn: also build every head dim and dtype, for comparison")
    p.add_argument("--no-gpu-check", action="store_true")
    p.add_argument("--gpu-checks-only", action="store_true",
                   help="no build: check what is installed (gpu_health, left-out kernels)")
    p.add_argument("--head-dims", default="128", help="gpu_health's attention head dims")
    a = p.parse_args()

    a.out.mkdir(parents=True, exist_ok=True)
    if a.gpu_checks_only:
        found = gpu_checks(a.python, a.out, recipes.get(a.package).gpu_check,
                           outside_variant=a.package == "flash-attn", head_dims=a.head_dims)
        doc = {"date": time.strftime("%Y-%m-%d"), "package": a.package,
               "machine": machine(a.python), "gpu": found}
        (a.out / "gpu_checks.json").write_text(json.dumps(doc, indent=2) + "\n")
        print(json.dumps(found.get("outside_variant"), indent=1))
        return 0
    argv = [sys.executable, "-m", "invoke", "build", a.package, "--python", a.python]
    result = {"date": time.strftime("%Y-%m-%d"), "package": a.package, "profile": a.profile,
              "machine": machine(a.python)}
    result["variant"] = cold_and_warm(
        "variant", argv + (["--profile", a.profile] if a.profile else []), a.out, a.python)
    ok = result["variant"]["cold"]["rc"] == 0 and result["variant"].get(
        "cache_hit", {}).get("was_hit")
    if ok and not a.no_gpu_check:
        result["gpu"] = gpu_checks(a.python, a.out, recipes.get(a.package).gpu_check,
                                   outside_variant=a.package == "flash-attn")
    if a.full and a.package == "flash-attn":
        with tempfile.TemporaryDirectory() as envs:
            full = all_kernels_profile(a.profile, Path(envs))
            result["full"] = cold_and_warm("full", argv + ["--profile", full], a.out / "full",
                                           a.python)
        v, f = result["variant"]["cold"], result["full"]["cold"]
        if v.get("compile_seconds") and f.get("compile_seconds"):
            result["speedup"] = round(f["compile_seconds"] / v["compile_seconds"], 1)
    (a.out / "kernel_build.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result["variant"].get(k) for k in ("max_jobs", "cold", "cache_hit")}
                     | {"speedup": result.get("speedup"), "gpu": result.get("gpu")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
