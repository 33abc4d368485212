"""`invoke preflight` through srun on a real three-node Slurm (tests/slurm_cluster.py).

The three slurmd run on this one host, so the hardware cannot differ between them: the test hook
MEGATRON_ENV_PREFLIGHT_OVERRIDE gives each node the real H200 captures in place of what this
machine has (no GPU), and plants a slow GPU on n2 and another driver on n3. Everything else
(the collection, the host checks, the fingerprint of this interpreter, srun itself, and
verify_nccl with gloo across the nodes that pass) is real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import fleet_builder as fb
from tests import slurm_cluster


@pytest.fixture(scope="module")
def slurm():
    if slurm_cluster.missing_programs():
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            if os.environ.get("MEGATRON_ENV_REQUIRE_SLURM"):
                pytest.fail("slurm-wlm and munge are not installed and cannot be (not root)")
            pytest.skip("slurm-wlm and munge are not installed (.ci/run installs them)")
        slurm_cluster.install()
    # a short path of its own: munge's socket path must stay under 108 bytes
    root = Path(tempfile.mkdtemp(prefix="slurm-"))
    cluster = slurm_cluster.Cluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _overrides(root: Path) -> Path:
    """Per node: the H200 node's GPU captures and gpu_health.json (test hook)."""
    for i, host in enumerate(("n1", "n2", "n3"), 1):
        d = root / host
        d.mkdir(parents=True)
        for name in ("nvidia-smi.txt", "nvidia-smi-q.txt", "nvidia-smi-topo-m.txt", "nvml.json"):
            text = (fb.FIXTURES / "h200-live" / name).read_text()
            (d / name).write_text(text.replace("580.159.04", "580.95.05") if host == "n3"
                                  else text)
        health = fb.health(i, gpus=1, slow={0: 0.88} if host == "n2" else None)
        (d / "gpu_health.json").write_text(json.dumps(health))
    return root


def test_srun_one_task_per_node(slurm):
    r = subprocess.run(["srun", "-N3", "--ntasks-per-node=1", "sh", "-c", "echo $SLURMD_NODENAME"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, **slurm.env))
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["n1", "n2", "n3"]


def test_preflight_through_srun_names_the_bad_node(slurm, tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, **slurm.env,
               MEGATRON_ENV_PREFLIGHT_OVERRIDE=str(_overrides(tmp_path / "override")))
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env["MASTER_ADDR"] = "127.0.0.1"  # the simulated node names do not resolve
    r = subprocess.run(["salloc", "-N3", sys.executable, "-m", "invoke", "preflight", "--json",
                        "--profile", fb.PROFILE, "--python", sys.executable,
                        "--run-dir", str(run), "--nccl",
                        "--nccl-args=--backend gloo --sizes 1K:16K --warmup 1 --iters 2"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=fb.REPO)
    assert r.returncode == 2 and r.stdout.startswith("{"), r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["exclude"] == ["n2"]
    st = {n["host"]: n["status"] for n in doc["nodes"]}
    assert st["n3"] == "warn" and st["n1"] in ("pass", "warn")
    n3 = next(n for n in doc["nodes"] if n["host"] == "n3")
    assert any(f["id"] == "fleet.drift" and "driver 580.95.05" in f["summary"]
               for f in n3["findings"])
    n1 = next(n for n in doc["nodes"] if n["host"] == "n1")
    assert not any(f["id"].startswith("fleet.") and f["status"] != "pass"
                   for f in n1["findings"])
    # every node ran for real: its own snapshot, host checks and fingerprint, through srun
    srun = (run / "command.txt").read_text()
    assert srun.startswith("srun --nodes=3 --ntasks=3 --ntasks-per-node=1")
    for host in ("n1", "n2", "n3"):
        d = run / host
        node = json.loads((d / "node.json").read_text())
        assert node["host"] == host and node["slurm_job_id"]
        assert "gpu_health.json" in node["overridden"] and "env.txt" not in node["overridden"]
        assert f"SLURM_TOPOLOGY_ADDR={host}\n" in (d / "env.txt").read_text()  # srun ran it
        assert json.loads((d / "check.json").read_text())["profile"] == fb.PROFILE
        fp = json.loads((d / "fingerprint.json").read_text())
        assert fp["python"] == sys.executable and fp["torch"]
    assert (run / "fleet.png").is_file()
    # --nccl: verify_nccl through srun on the nodes that did not fail, n2 left out
    nccl = json.loads((run / "nccl" / "results.json").read_text())
    assert [c["rank"] for c in nccl["correctness"]] == [0, 1]
    assert nccl["topology"]["world_size"] == 2
    assert "--nodelist=n1,n3" in (run / "nccl" / "command.txt").read_text()
    assert "verify_nccl: pass across 2 node(s)" in r.stderr
