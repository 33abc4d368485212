"""The fleet analysis on fleets built from real captures, with planted faults (fleet_builder)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from megatron_env import profile
from megatron_env.fleet import analysis
from tests import fleet_builder as fb


@pytest.fixture
def planted(tmp_path):
    return fb.planted_fleet(tmp_path / "fleet")


def analyse(root, **kw):
    return analysis.analyse(analysis.load(root), profile.load(fb.PROFILE), **kw)


def statuses(rep):
    return {n.host: n.status for n in rep.nodes}


def test_planted_bad_nodes_and_only_those(planted):
    rep = analyse(planted)
    st = statuses(rep)
    assert rep.exclude == fb.FAILING
    assert sorted(h for h, s in st.items() if s == "warn") == fb.WARNING
    assert sorted(h for h, s in st.items() if s == "pass") == ["node01", "node07"]
    assert rep.exit_code == 2


def _finding(rep, host, fid):
    node = next(n for n in rep.nodes if n.host == host)
    return next(f for f in node.findings if f.id == fid)


def test_findings_name_host_gpu_and_odd_value(planted):
    rep = analyse(planted)
    slow = _finding(rep, "node02", "fleet.gpu_speed")
    assert slow.status == "fail" and slow.summary.startswith("node02: GPU5 (NVIDIA H200)")
    assert "12% below the fleet median" in slow.summary
    nv = _finding(rep, "node03", "fleet.nvlink")
    assert nv.status == "fail" and "GPU3 has 0 NVLinks" in nv.summary and "126" in nv.summary
    ib = _finding(rep, "node04", "fleet.ib")
    assert ib.status == "fail" and "mlx4_0:1 at 28 Gb/s, its peers at 56" in ib.summary
    drv = _finding(rep, "node05", "fleet.drift")
    assert "driver 580.95.05" in drv.summary and "580.159.04, 6 of 7 nodes" in drv.summary
    env = _finding(rep, "node06", "fleet.drift")
    assert "torch 2.10.0+cu130" in env.summary and "nccl 2.27.3" in env.summary
    for n in rep.nodes:  # every finding of a node names it
        assert all(f.summary.startswith(f"{n.host}: ") for f in n.findings)


def test_slow_gpu_passes_its_own_absolute_line_but_not_the_fleet(planted):
    """88% of the median is 87% of gpu_health's H200 expectation: a pass on the node alone."""
    health = json.loads((planted / "node02" / "gpu_health.json").read_text())
    assert all(f["status"] == "pass" for f in health["findings"] if f["id"] == "gpu.speed")
    assert analyse(planted).exclude[0] == "node02"


def test_the_slow_threshold_is_settable(tmp_path):
    root = tmp_path / "f"
    for i in range(1, 4):
        fb.node(root, f"n{i}", i, slow={2: 0.93} if i == 2 else None)
    assert analyse(root).exclude == []
    rep = analyse(root, slow=0.05)
    assert rep.exclude == ["n2"]
    assert "GPU2" in _finding(rep, "n2", "fleet.gpu_speed").summary


def test_healthy_fleet_passes_with_exit_0(tmp_path):
    root = tmp_path / "f"
    for i in range(1, 5):
        fb.node(root, f"n{i}", i)
    rep = analyse(root)
    assert statuses(rep) == {f"n{i}": "pass" for i in range(1, 5)}
    assert rep.exit_code == 0 and rep.exclude == []


def test_no_majority_warns_every_side(tmp_path):
    root = tmp_path / "f"
    fb.node(root, "a", 1)
    fb.node(root, "b", 2, driver="580.95.05")
    rep = analyse(root)
    assert statuses(rep) == {"a": "warn", "b": "warn"}
    assert "no majority" in _finding(rep, "a", "fleet.drift").summary


def test_hand_made_fleet_of_collect_output_only(tmp_path):
    """Only what `invoke collect` writes (no gpu_health.json, no fingerprint.json)."""
    root = tmp_path / "f"
    for host, topo in (("x", None), ("y", None), ("z", "topo-8gpu-h100-gpu3-lost-nvlink.txt")):
        d = fb.node(root, host, 1, **({"topo": topo} if topo else {}))
        (d / "gpu_health.json").unlink()
        (d / "fingerprint.json").unlink()
    rep = analyse(root)
    assert rep.exclude == ["z"] and statuses(rep)["x"] == "pass"


def test_missing_node_of_the_allocation_fails(planted):
    rep = analysis.analyse(analysis.load(planted), profile.load(fb.PROFILE),
                        expected=[*fb.PLANTED, "node08"])
    assert "node08" in rep.exclude
    assert _finding(rep, "node08", "fleet.missing").summary.startswith("node08: sent no results")


def test_node_without_ibstatus_among_ib_peers_warns(tmp_path):
    root = tmp_path / "f"
    for i in range(1, 4):
        d = fb.node(root, f"n{i}", i)
    (d / "ibstatus.txt").unlink()
    rep = analyse(root)
    assert _finding(rep, "n3", "fleet.ib").status == "warn"


def invoke(*args):
    return subprocess.run([sys.executable, "-m", "invoke", "preflight", *args],
                          capture_output=True, text=True, cwd=fb.REPO)


def test_cli_json_exclude_line_plot_and_exit_codes(planted):
    r = invoke("--fleet", str(planted), "--json")
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    assert doc["exclude"] == fb.FAILING
    assert [n["host"] for n in doc["nodes"]] == list(fb.PLANTED)
    assert {"host", "status", "findings"} <= set(doc["nodes"][0])
    assert (planted / "fleet.png").read_bytes()[:4] == b"\x89PNG", r.stderr
    r = invoke("--fleet", str(planted))
    assert r.returncode == 2
    assert "--exclude=node02,node03,node04" in r.stdout.splitlines()
    assert "7 node(s)" in r.stderr and "3 fail" in r.stderr
    for host in ("node05", "node06"):  # warnings only: exit 1
        shutil.rmtree(planted / host.replace("5", "2").replace("6", "3"))
    shutil.rmtree(planted / "node04")
    r = invoke("--fleet", str(planted), "--json")
    assert r.returncode == 1, r.stdout
    assert json.loads(r.stdout)["exclude"] == []


@pytest.mark.parametrize("make, words", [
    (lambda p: p / "absent", "is not a directory"),
    (lambda p: (p / "file").write_text("x") and p / "file", "is not a directory"),
    (lambda p: (p / "e" / "h").mkdir(parents=True) or p / "e", "holds no node snapshot"),
])
def test_cli_bad_fleet_dir_is_one_line(tmp_path, make, words):
    r = invoke("--fleet", str(make(tmp_path)))
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr


def test_cli_outside_an_allocation_says_how_to_get_one(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run([sys.executable, "-m", "invoke", "preflight", "--run-dir",
                        str(tmp_path / "r")], capture_output=True, text=True, cwd=fb.REPO, env=env)
    assert r.returncode == 2 and "not inside a Slurm allocation" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_against_a_reference_fleet_judges_one_node(planted, tmp_path):
    """A prolog's view: one fresh node directory, medians and majorities from the last run.
    All its GPUs are 15% slow (a node-wide clock cap): alone it is its own median."""
    one = tmp_path / "one"
    fb.node(one, "node09", 9, slow={i: 0.85 for i in range(8)})
    r = invoke("--fleet", str(one), "--against", str(planted), "--json")
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    assert [n["host"] for n in doc["nodes"]] == ["node09"] and doc["exclude"] == ["node09"]
    alone = invoke("--fleet", str(one), "--json")  # alone, it is its own median
    assert json.loads(alone.stdout)["exclude"] == []


@pytest.mark.parametrize("args, words", [(["--slow", "ten"], "--slow ten"),
                                         (["--slow", "1.5"], "between 0 and 1")])
def test_cli_bad_threshold_is_one_line(planted, args, words):
    r = invoke("--fleet", str(planted), *args)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr


def test_fingerprint_kernel_keys_are_the_build_plan_keys():
    """The fingerprint takes torch's facts from its one probe; the keys must still be exactly
    the cache keys `invoke build` computes for this interpreter (one with torch: the keys are
    made of torch's facts; CI installs it, so there the skip fails the run)."""
    from pathlib import Path

    pytest.importorskip("torch")

    from megatron_env.fleet import fingerprint
    from megatron_env.kernels import build
    from megatron_env.pyenv import probe

    prof = profile.load(fb.PROFILE)
    fp = fingerprint.collect(prof, Path(sys.executable))
    assert fp["torch"] and fp["megatron_commit"] == prof.megatron["commit"]
    facts = probe.torch_facts(Path(sys.executable))  # what plan() would import torch for
    for pkg in build.packages(prof).values():
        want = build.plan(pkg, Path(sys.executable), prof.archs, facts=facts).key
        assert want and fp["kernel_cache_keys"][pkg.name] == want  # None == None proves nothing


def test_local_run_collects_this_host_and_skips_gpu_health_with_a_reason(tmp_path):
    """`--local`: the per-node work without Slurm (what the single GPU node runs); this machine
    has no GPU, so the health run is a skip that says why, never a pass."""
    run = tmp_path / "run"
    (run / "other").mkdir(parents=True)  # another node's results in the same run directory
    shutil.copytree(fb.FIXTURES / "h200-live", run / "other", dirs_exist_ok=True)
    r = invoke("--local", "--json", "--profile", fb.PROFILE, "--python", sys.executable,
               "--run-dir", str(run))
    doc = json.loads(r.stdout)
    (node,) = doc["nodes"]  # only this host is judged
    assert node["status"] in ("warn", "fail")  # no GPU here: never a pass
    assert r.returncode == {"warn": 1, "fail": 2}[node["status"]], r.stderr
    d = run / node["host"]
    for name in ("nvml.json", "meta.json", "env.txt", "check.json", "fingerprint.json"):
        assert (d / name).is_file(), name
    health = json.loads((d / "gpu_health.json").read_text())
    if health.get("skipped"):
        assert health["skipped"].startswith("no GPU")
        assert any(f["id"] == "gpu.health" and f["status"] == "skip" for f in node["findings"])
    assert json.loads((d / "node.json").read_text())["overridden"] == []


def test_garbage_node_files_are_findings_not_crashes(planted):
    garbage = (fb.CAPTURES / "garbage.bin.txt").read_bytes()
    (planted / "node07" / "gpu_health.json").write_bytes(garbage)
    (planted / "node07" / "fingerprint.json").write_bytes(garbage)
    (planted / "node01" / "nvidia-smi-topo-m.txt").write_bytes(garbage)
    rep = analyse(planted)
    node07 = next(n for n in rep.nodes if n.host == "node07")
    assert node07.status == "warn"
    assert {f.evidence[0] for f in node07.findings if f.id == "fleet.input"} == {
        "file: node07/gpu_health.json", "file: node07/fingerprint.json"}
    assert rep.exclude == fb.FAILING  # the others are judged as before
    topo = _finding(rep, "node01", "gpu.topology")
    assert topo.status == "warn" and "could not be parsed" in topo.summary


def test_a_node_with_fewer_active_ib_ports_than_its_peers_fails(tmp_path):
    """A port gone down (a pulled cable) leaves the node's other port at full rate: only the
    count of active ports tells it from its peers; a node with as many as its peers passes."""
    root = tmp_path / "f"
    for i in range(1, 4):
        d = fb.node(root, f"n{i}", i)
    text = (d / "ibstatus.txt").read_text()
    port2 = text.index("port 2 status:")
    (d / "ibstatus.txt").write_text(text[:port2] + text[port2:].replace(
        "4: ACTIVE", "1: DOWN").replace("5: LinkUp", "3: Disabled"))
    rep = analyse(root)
    bad = _finding(rep, "n3", "fleet.ib")
    assert bad.status == "fail" and "1 active port(s), its peers 2" in bad.summary
    assert "n3" in rep.exclude
    for host in ("n1", "n2"):
        assert _finding(rep, host, "fleet.ib").status == "pass"


def test_a_node_finding_keeps_its_kind_in_the_fleet_report(tmp_path):
    """Code decides by a finding's kind, never its text: the fleet report puts the host in
    front of the summary and keeps the kind (a node without a driver: driver.version, absent)."""
    root = tmp_path / "f"
    for i in range(1, 3):
        d = fb.node(root, f"n{i}", i)
    for name in ("nvml.json", "nvidia-smi.txt", "nvidia-smi-q.txt"):
        (d / name).unlink()
    f = _finding(analyse(root), "n2", "driver.version")
    assert f.status == "fail" and f.kind == "absent" and f.summary.startswith("n2: no NVIDIA")


def test_fingerprint_facts_are_the_values_nodes_must_share(tmp_path):
    """What drift compares, read from the node's own files: the driver and its CUDA from NVML
    (13000 is CUDA 13.0), nvcc's release, every fingerprint value under a spaced name, a cache
    key per kernel that has one (an empty key is no fact)."""
    fp = fb.fingerprint(kernel_cache_keys={"apex": "k1", "flash-attn": ""})
    fb.node(tmp_path, "n1", 1, fp=fp)
    (node,) = analysis.load(tmp_path)
    assert analysis.fingerprint_facts(node) == {
        "driver": "580.159.04", "driver CUDA": "13.0", "nvcc": "13.0",
        "profile": fp["profile"], "lock digest": fp["lock_digest"], "torch": fp["torch"],
        "torch cuda": fp["torch_cuda"], "nccl": fp["nccl"], "cudnn": str(fp["cudnn"]),
        "megatron commit": fp["megatron_commit"],
        "megatron patch digest": fp["megatron_patch_digest"], "apex cache key": "k1"}


def test_fingerprint_facts_fall_back_to_nvidia_smi_and_gpu_health(tmp_path):
    """Without NVML the driver comes from nvidia-smi's header (and no CUDA version is made up);
    without a fingerprint's torch, gpu_health's torch stands in."""
    fp = {k: v for k, v in fb.fingerprint().items() if k != "torch"}
    d = fb.node(tmp_path, "n1", 1, fp=fp)
    (d / "nvml.json").unlink()
    health = json.loads((d / "gpu_health.json").read_text())
    (d / "gpu_health.json").write_text(json.dumps({**health, "torch": "2.11.0+cu130"}))
    (node,) = analysis.load(tmp_path)
    facts = analysis.fingerprint_facts(node)
    assert facts["driver"] == "580.159.04" and "driver CUDA" not in facts
    assert facts["torch"] == "2.11.0+cu130"
