"""Fleet preflight: the per-node work, and its launch through `srun` (one task per node).

`invoke preflight` inside an allocation runs `srun --ntasks-per-node=1 python -m
megatron_env.fleet.preflight --node ...`; every task writes RUN/<host>/ (the snapshot `invoke
collect` writes, check.json, gpu_health.json, fingerprint.json, node.json) and the launcher then
analyses RUN with megatron_env.fleet.analysis. RUN lies under the checkout, which every node
already reads (srun starts this package from it), so no copying back is needed. `--local` does
the same per-node work on this host without Slurm.

Test hook: when MEGATRON_ENV_PREFLIGHT_OVERRIDE names a directory, the files of its <host>/
sub-directory are copied over that host's results after collection (so one machine can stand in
for hosts with different hardware). node.json lists every file replaced this way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from megatron_env import REPO_ROOT, output, proc, profile
from megatron_env.errors import UserError
from megatron_env.fleet import fingerprint
from megatron_env.host import attention, checks, snapshot

OVERRIDE_ENV = "MEGATRON_ENV_PREFLIGHT_OVERRIDE"
HEALTH_FILE = "gpu_health.json"
FINGERPRINT_FILE = "fingerprint.json"
CHECK_FILE = "check.json"
NODE_FILE = "node.json"


def host_name() -> str:
    """The node's name as Slurm knows it (what --exclude takes), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _no_gpu(snap: snapshot.Snapshot) -> str:
    """Why this node has no GPU to test, or "" when it has (or may have) one. NVML missing from
    the tool's interpreter is no proof: then nvidia-smi decides."""
    nvml = snap.nvml()
    if "error" not in nvml:
        return "" if nvml.get("gpus") else "no GPU: NVML lists none"
    smi = snap.meta().get("files", {}).get("nvidia-smi.txt", {}).get("status")
    if smi == "ok":
        return ""
    return f"no GPU: {nvml['error']}; nvidia-smi {'not installed' if smi == 'missing' else smi}"


def gpu_health(python: Path, snap: snapshot.Snapshot, out: Path, size: int,
               head_dims: list[int] | tuple[int, ...] = (128,)) -> dict[str, Any]:
    """scripts/gpu_health.py on every GPU of this node (seconds), or a skip saying why."""
    if why := _no_gpu(snap):
        doc = {"skipped": why, "gpus": [], "findings": [
            {"id": "gpu.health", "status": "skip", "summary": why, "evidence": [], "fix": ""}]}
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-health-") as tmp:
            argv = [python, REPO_ROOT / "scripts" / "gpu_health.py", "--out", tmp,
                    "--size", str(size), "--head-dims",
                    ",".join(map(str, head_dims))]
            env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
            r = proc.run(argv, env=env, timeout=600, log=out / "gpu_health.log")
            results = Path(tmp) / "results.json"
            if results.is_file():
                doc = json.loads(results.read_text())
            else:
                why = f"gpu_health.py exited {r.returncode}: {r.tail(3)}"
                doc = {"gpus": [], "findings": [
                    {"id": "gpu.health", "status": "fail", "summary": why,
                     "evidence": [f"log: {out.name}/gpu_health.log"],
                     "fix": f"run `{python} scripts/gpu_health.py` on the node and read its "
                            "error"}]}
    (out / HEALTH_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def apply_override(host: str, out: Path) -> list[str]:
    """The test hook (see the module doc): copy OVERRIDE/<host>/* over `out`."""
    root = os.environ.get(OVERRIDE_ENV)
    src = Path(root) / host if root else None
    if src is None or not src.is_dir():
        return []
    replaced = []
    for f in sorted(src.iterdir()):
        if f.is_file():
            shutil.copyfile(f, out / f.name)
            replaced.append(f.name)
    return replaced


def run_node(run_dir: Path, profile_name: str | None, python: str | None, *,
             health: bool = True, size: int = 8192, echo=print) -> Path:
    """Everything one node contributes to a preflight, into run_dir/<host>/."""
    t0 = time.monotonic()
    host = host_name()
    out = run_dir / host
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    prof = profile.load(profile_name)
    py = fingerprint.interpreter(prof, python)
    snap = snapshot.collect(out, echo=lambda *_: None)
    timings = {"collect": time.monotonic() - t0}
    if health:
        gpu_health(py, snap, out, size, attention.head_dims(prof))
        timings["gpu_health"] = time.monotonic() - t0 - sum(timings.values())
    fp = fingerprint.collect(prof, py)
    (out / FINGERPRINT_FILE).write_text(json.dumps(fp, indent=2) + "\n")
    timings["fingerprint"] = time.monotonic() - t0 - sum(timings.values())
    replaced = apply_override(host, out)
    findings = checks.run_all(snapshot.Snapshot(out), prof)
    (out / CHECK_FILE).write_text(json.dumps(
        {"profile": prof.name, "findings": [f.to_dict() for f in findings]}, indent=2) + "\n")
    node = {"host": host, "hostname": socket.gethostname(), "profile": prof.name,
            "python": str(py), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "seconds": {k: round(v, 2) for k, v in timings.items()},
            "overridden": replaced}
    (out / NODE_FILE).write_text(json.dumps(node, indent=2) + "\n")
    from megatron_env.findings import worst

    echo(f"{host}: {worst(findings)}; {len(findings)} host checks, "
         f"{time.monotonic() - t0:.1f} s" + (f"; test override: {', '.join(replaced)}"
                                             if replaced else ""))
    return out


# --- the launch through srun -------------------------------------------------------------------


def allocation() -> tuple[str, int]:
    """(job id, node count) of the allocation this runs in, or a UserError saying how to get one."""
    job = os.environ.get("SLURM_JOB_ID")
    nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES")
    if not job or not nodes:
        raise UserError("not inside a Slurm allocation (no SLURM_JOB_ID)",
                        fix="run it under `salloc -N <nodes>` or in an sbatch script; "
                            "`--local` checks this node alone, `--fleet DIR` analyses results")
    if not proc.which("srun"):
        raise UserError("srun is not on PATH", fix="load the Slurm client (module load slurm)")
    return job, int(nodes)


def expected_hosts() -> list[str]:
    """The allocation's node names, expanded by Slurm itself."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    r = proc.run(["scontrol", "show", "hostnames", nodelist], timeout=30)
    return r.stdout.split() if r.ok else []


def srun_argv(run_dir: Path, nodes: int, profile_name: str | None, python: str | None,
              health: bool, size: int) -> list[str]:
    argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=0", f"--chdir={REPO_ROOT}", sys.executable, "-m",
            "megatron_env.fleet.preflight", "--node", "--run-dir", str(run_dir),
            "--size", str(size)]
    argv += ["--profile", profile_name] if profile_name else []
    argv += ["--python", python] if python else []
    argv += [] if health else ["--no-gpu-health"]
    return argv


def launch(run_dir: Path, profile_name: str | None, python: str | None, *, health: bool = True,
           size: int = 8192, echo=print) -> tuple[int, list[str]]:
    """srun one task per node of the allocation; (srun's exit status, the expected hosts)."""
    job, nodes = allocation()
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = srun_argv(run_dir, nodes, profile_name, python, health, size)
    (run_dir / "command.txt").write_text(subprocess.list2cmdline(argv) + "\n")
    echo(f"preflight: job {job}, {nodes} node(s), results in {run_dir}")
    r = proc.run(argv, timeout=None, log=run_dir / "srun.log", stream=True, on_line=echo)
    return r.returncode, expected_hosts()


def verify_nccl(run_dir: Path, healthy: list[str], gpus_per_node: int, python: Path,
                extra: list[str], echo=print) -> int | None:
    """scripts/verify_nccl.py through srun across the healthy nodes (one rank per GPU); its
    exit status, or None when fewer than two nodes are left to test."""
    if len(healthy) < 2:
        echo(f"verify_nccl: skipped, {len(healthy)} healthy node(s): nothing to connect")
        return None
    out = run_dir / "nccl"
    argv = ["srun", f"--nodes={len(healthy)}", f"--ntasks={len(healthy) * gpus_per_node}",
            f"--ntasks-per-node={gpus_per_node}", f"--nodelist={','.join(healthy)}",
            f"--chdir={REPO_ROOT}", str(python), str(REPO_ROOT / "scripts" / "verify_nccl.py"),
            "--out", str(out), *extra]
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text(subprocess.list2cmdline(argv) + "\n")
    echo(f"verify_nccl: {len(healthy)} node(s) x {gpus_per_node} rank(s): {', '.join(healthy)}")
    r = proc.run(argv, timeout=None, log=out / "srun.log", stream=True, on_line=echo)
    return r.returncode


def main(argv: list[str] | None = None) -> int:
    """The per-node entry point srun starts (not meant to be typed; see `invoke preflight`)."""
    p = argparse.ArgumentParser(prog="python -m megatron_env.fleet.preflight")
    p.add_argument("--node", action="store_true", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--profile")
    p.add_argument("--python")
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--no-gpu-health", action="store_true")
    a = p.parse_args(argv)
    try:
        run_node(Path(a.run_dir), a.profile, a.python, health=not a.no_gpu_health, size=a.size,
                 echo=output.status)
    except UserError as e:
        output.error(f"{host_name()}: {e.message}", e.fix)
        return 2
    except OSError as e:
        output.error(f"{host_name()}: cannot write the results: {e}",
                     "give --run-dir a directory every node can write (a shared file system)")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
