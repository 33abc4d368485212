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
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_env import REPO_ROOT, findings, output, proc, profile, project, redact
from megatron_env.errors import UserError
from megatron_env.fleet import analysis, fingerprint
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
            argv: list[str | Path] = [python, REPO_ROOT / "scripts" / "gpu_health.py", "--out", tmp,
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
    snapshot.reseal(out, replaced)  # a replaced file is no longer what collect recorded
    return replaced


def run_node(run_dir: Path, profile_name: str | None, python: str | None, *,
             health: bool = True, size: int = 8192, echo: output.Echo=print) -> Path:
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
                            "`--local` checks this node alone, `--fleet DIR` analyses results",
                        kind="slurm.no-allocation")
    if not proc.which("srun"):
        raise UserError("srun is not on PATH", fix="load the Slurm client (module load slurm)",
                        kind="tool.no-srun")
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
           size: int = 8192, echo: output.Echo=print) -> tuple[int, list[str]]:
    """srun one task per node of the allocation; (srun's exit status, the expected hosts)."""
    job, nodes = allocation()
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = srun_argv(run_dir, nodes, profile_name, python, health, size)
    (run_dir / "command.txt").write_text(redact.text(subprocess.list2cmdline(argv) + "\n"))
    echo(f"preflight: job {job}, {nodes} node(s), results in {run_dir}")
    r = proc.run(argv, timeout=None, log=run_dir / "srun.log", stream=True, on_line=echo)
    return r.returncode, expected_hosts()


def verify_nccl(run_dir: Path, healthy: list[str], gpus_per_node: int, python: Path,
                extra: list[str], echo: output.Echo=print) -> int | None:
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
    (out / "command.txt").write_text(redact.text(subprocess.list2cmdline(argv) + "\n"))
    echo(f"verify_nccl: {len(healthy)} node(s) x {gpus_per_node} rank(s): {', '.join(healthy)}")
    r = proc.run(argv, timeout=None, log=out / "srun.log", stream=True, on_line=echo)
    return r.returncode


def _slow_and_size(slow: str | float | None, size: str | int) -> tuple[float, int]:
    """--slow and --size as numbers, checked before any node is asked to measure."""
    try:
        slow = analysis.DEFAULT_SLOW if slow is None else float(slow)
        size = int(size)
    except ValueError as e:
        raise UserError(f"--slow {slow} / --size {size}: {e}",
                        fix="--slow takes a fraction (0.1), --size an integer (8192)",
                        kind="input.value") from None
    if not 0 < slow < 1:
        raise UserError(f"--slow {slow}: expected a fraction between 0 and 1",
                        fix="e.g. --slow 0.1 fails GPUs more than 10% below the fleet median",
                        kind="input.value")
    return slow, size


def _measure(root: Path, profile_name: str | None, python: str | None, *, local: bool,
             health: bool, size: int) -> list[str]:
    """This node (`local`) or every node of the allocation through srun measures into `root`;
    the hosts expected to have written there (none for `local`)."""
    if local:
        run_node(root, profile_name, python, health=health, size=size, echo=output.status)
        return []
    code, expected = launch(root, profile_name, python, health=health, size=size,
                            echo=lambda s: output.status(s.rstrip("\n")))
    if code:
        output.warning(f"srun exited {code}; analysing what the nodes wrote")
    return expected


@dataclass
class Verdict:
    """What a preflight found: the fleet report, the profile it was judged against, where the
    nodes wrote, and whether the plot was drawn. The command prints it (commands/host.py)."""

    report: analysis.Report
    profile: profile.Profile
    root: Path
    plot: Path | None
    nodes: list[analysis.Node]  # every node read (a reference fleet's too)
    launched: bool  # this run launched the nodes through srun itself

    def healthy(self) -> list[str]:
        return [n.host for n in self.report.nodes if n.status is not findings.Status.FAIL]


def run(*, fleet: str | None = None, local: bool = False, profile_name: str | None = None,
        python: str | None = None, run_dir: str | None = None,
        slow: str | float | None = None, health: bool = True, size: str | int = 8192,
        against: str | None = None) -> Verdict:
    """`invoke preflight`: every node of the allocation through srun (or `local`: this node; or
    `fleet`: a directory analysed again), then the fleet verdict (its exit code: 0 pass, 1
    warnings, 2 a node fails). `against`: a reference fleet directory whose nodes the medians
    and majorities include (a Slurm prolog or HealthCheckProgram judging one node against the
    last fleet run). The nodes' progress goes to stderr as it comes; the verdict is returned."""
    slow, size = _slow_and_size(slow, size)
    expected: list[str] = []
    if fleet:
        root = Path(fleet)
    else:
        root = Path(run_dir) if run_dir else (
            project.state_root() / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-preflight")
        expected = _measure(root, profile_name, python, local=local, health=health, size=size)
    nodes = analysis.load(root)
    if local:  # a run directory other nodes also write into: judge this node alone
        nodes = [n for n in nodes if n.host == host_name()]
    hosts = {n.host for n in nodes}
    if against:  # judge these nodes among a reference fleet's, report only these
        nodes += [n for n in analysis.load(Path(against)) if n.host not in hosts]
    prof = profile.load(profile_name or _fleet_profile(nodes))
    rep = analysis.analyse(nodes, prof, slow=slow, expected=expected)
    rep.nodes = [n for n in rep.nodes if n.host in hosts or n.host in expected]
    png = root / "fleet.png"
    try:
        drawn = analysis.plot(nodes, png, slow)
    except OSError:
        drawn = False
    return Verdict(rep, prof, root, png if drawn else None, nodes, not (fleet or local))


def nccl_across(v: Verdict, python: str | None, nccl_args: str) -> int | None:
    """scripts/verify_nccl.py through srun across the nodes of `v` that did not fail (its exit
    code; None when skipped: fewer than two healthy nodes)."""
    healthy = v.healthy()
    per_node = max((len(analysis.gpus(n)) for n in v.nodes if n.host in healthy), default=0)
    return verify_nccl(v.root, healthy, max(per_node, 1),
                       fingerprint.interpreter(v.profile, python), shlex.split(nccl_args),
                       echo=lambda s: output.status(s.rstrip("\n")))


def _fleet_profile(nodes: list[analysis.Node]) -> str | None:
    """The profile most nodes' fingerprints name (None: the default profile)."""
    names = Counter(n.fingerprint.get("profile") for n in nodes if n.fingerprint.get("profile"))
    return names.most_common(1)[0][0] if names else None


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
