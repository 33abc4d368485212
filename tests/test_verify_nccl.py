"""scripts/verify_nccl.py: the NCCL log analyser on real logs, and a real 4-process gloo run."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import FIXTURES, free_port

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "verify_nccl.py"
LOGS = FIXTURES / "nccl-logs"

spec = importlib.util.spec_from_file_location("verify_nccl", SCRIPT)
vn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vn)


def findings_of(name):
    a = vn.analyze_log((LOGS / name).read_text())
    return a, {f["id"]: f for f in vn.log_findings(a)}


def test_ib_with_gdrdma_old_phrasing():
    a, f = findings_of("ib-gdrdma-a100-nccl2.10.log")
    assert a["transports"] == {"NET/IB": 12} and a["gdrdma"]
    assert f["nccl.net"]["status"] == "pass" and "GPUDirect RDMA" in f["nccl.net"]["summary"]


def test_roce_two_nodes_new_phrasing():
    a, f = findings_of("roce-h100-nccl2.19.log")
    assert a["networks"] == ["IB"] and a["hosts"] == ["dgxh100-3", "dgxh100-4"]
    assert a["ib_devices"] == ["[0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]"]
    assert a["nccl_versions"] == ["2.19.3+cuda12.3"]
    assert f["nccl.net"]["status"] == "pass"


def test_ib_plugin_with_mpirun_tags():
    a, f = findings_of("ibext-h100-mpirun-tags.log")
    assert a["hosts"] == ["h100clust-worker-1"] and a["transports"] == {"NET/IB": 9}
    assert f["nccl.net"]["status"] == "pass"


def test_sockets_between_nodes_warns():
    a, f = findings_of("socket-between-nodes-nccl952.log")
    assert a["transports"] == {"P2P/IPC": 13, "NET/Socket": 2}
    assert f["nccl.net"]["status"] == "warn" and "TCP sockets" in f["nccl.net"]["summary"]


def test_missing_ibverbs_fails():
    _, f = findings_of("no-ibverbs-socket-a100.log")
    assert f["nccl.ibverbs"]["status"] == "fail"


def test_ib_missing_and_socket_fallback_between_nodes_fails():
    # The H200 log says "NET/IB : No device found" and chose Socket; with the channel lines of a
    # two-node job (issue 952's) the same log is a socket fallback between nodes.
    text = (LOGS / "h200-1rank-nccl2.28.log").read_text() + (LOGS / "socket-between-nodes-nccl952.log").read_text()
    f = {x["id"]: x for x in vn.log_findings(vn.analyze_log(text))}
    assert f["nccl.net"]["status"] == "fail" and "falls back to TCP sockets" in f["nccl.net"]["summary"]


def test_single_node_without_ib_is_not_a_failure():
    a, f = findings_of("h200-1rank-nccl2.28.log")
    assert a["ib_missing"] and a["networks"] == ["Socket"] and a["nranks"] == 1
    assert a["nccl_versions"] == ["2.28.9+cuda13.0"]
    assert f["nccl.net"]["status"] == "skip"


def test_shm_instead_of_p2p_warns():
    _, f = findings_of("shm-instead-of-p2p-nccl1817.log")
    assert f["nccl.transport"]["status"] == "warn" and "not P2P" in f["nccl.transport"]["summary"]


@pytest.mark.parametrize("name", ["shm-full-nccl2.5.log", "shm-full-nccl2.2x.log"])
def test_shm_too_small_old_and_new_phrasing(name):
    _, f = findings_of(name)
    assert f["nccl.shm"]["status"] == "fail" and "shm-size" in f["nccl.shm"]["fix"]


@pytest.mark.parametrize("name, rid, where", [
    ("ib-completion-error-nccl928.log", "nccl.ib_completion", "H100-5 [3]"),
    ("nccl-cuda-oom-nccl1235.log", "nccl.cuda", "ng30903 [3]"),
    # behind pdsh's tags the warning is still found; the host only once triage strips the tags
    ("register-memory-pdsh-prefix-nccl563.log", "nccl.system_error", "locked-memory"),
])
def test_runtime_errors_with_host_and_device(name, rid, where):
    a = vn.analyze_log((FIXTURES / "job-logs" / name).read_text())
    f = {x["id"]: x for x in vn.log_findings(a)}
    assert f[rid]["status"] == "fail" and where in f[rid]["summary"]


def test_analyze_log_cli_json_and_exit_codes():
    ok = subprocess.run([sys.executable, SCRIPT, "--analyze-log", LOGS / "roce-h100-nccl2.19.log", "--json"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["analysis"]["networks"] == ["IB"]
    bad = subprocess.run([sys.executable, SCRIPT, "--analyze-log", LOGS / "shm-full-nccl2.2x.log"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "nccl.shm" in bad.stdout
    missing = subprocess.run([sys.executable, SCRIPT, "--analyze-log", "/nonexistent.log"],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_busbw_factors_are_nccl_tests_definitions():
    assert vn.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert vn.bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert vn.bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert vn.bus_factor("broadcast", 4) == 1.0


def test_judgement_names_the_cause():
    topo = {"world_size": 8, "backend": "nccl", "nodes": 1, "local_world_size": 8,
            "compute_capability": [9, 0], "nvlink": True}
    slow = [{"op": "all_reduce", "bytes": 1 << 30, "busbw_gbps": 20.0}]
    shm = vn.log_findings(vn.analyze_log((LOGS / "shm-instead-of-p2p-nccl1817.log").read_text()))
    f = vn.judge(slow, topo, None, shm)
    assert f["status"] == "fail" and any("SHM" in e for e in f["evidence"])
    fast = [{"op": "all_reduce", "bytes": 1 << 30, "busbw_gbps": 365.0}]
    assert vn.judge(fast, topo, None, [])["status"] == "pass"


def test_gloo_four_processes(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4",
                        f"--master_port={free_port()}", str(SCRIPT), "--backend", "gloo",
                        "--sizes", "4K:64K",
                        "--iters", "3", "--warmup", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / "results.json").read_text())
    assert set(doc) >= {"date", "topology", "sizes", "results", "correctness", "findings",
                        "peak_busbw_gbps"}
    assert [c["rank"] for c in doc["correctness"]] == [0, 1, 2, 3]
    for c in doc["correctness"]:
        assert c["all_reduce"] is True and c["all_gather"] is True and c["broadcast"] is True
    assert {r["op"] for r in doc["results"]} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert doc["sizes"] == [4096, 8192, 16384, 32768, 65536]
    for row in doc["results"]:
        assert row["time_us"] > 0
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * vn.bus_factor(row["op"], 4))
    assert doc["findings"][0] == {**doc["findings"][0], "id": "nccl.correctness", "status": "pass"}


def test_slurm_variables_two_tasks_gloo(tmp_path):
    """Two processes started as srun would start them: only SLURM_* variables, no torchrun."""
    pytest.importorskip("torch")
    import os

    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_"))}
    base.update({"SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS_PER_NODE": "2",
                 "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "4242"})
    out = tmp_path / "run"
    procs = [subprocess.Popen([sys.executable, SCRIPT, "--backend", "gloo", "--sizes", "4K:8K",
                               "--iters", "2", "--warmup", "1", "--out", str(out)],
                              env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r),
                                   "PATH": "/usr/bin:/bin"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    doc = json.loads((out / "results.json").read_text())
    assert doc["topology"]["world_size"] == 2 and doc["topology"]["local_world_size"] == 2
    assert [c["rank"] for c in doc["correctness"]] == [0, 1]
    assert all(c["all_reduce"] is True for c in doc["correctness"])


# numpy made unavailable the way Python spells it (a None entry in sys.modules): the program must
# run where torch is the only package, as its docstring promises.
WITHOUT_NUMPY = ("import runpy, sys; sys.modules['numpy'] = None; sys.argv = sys.argv[1:]; "
                 "runpy.run_path(sys.argv[0], run_name='__main__')")


def run_gloo(python, out, nproc, port, *extra, timeout=300):
    """verify_nccl.py under torchrun with gloo, numpy unavailable in every rank."""
    wrapper = out.parent / f"no-numpy-{nproc}.py"
    wrapper.write_text(WITHOUT_NUMPY.replace("; ", "\n"))
    return subprocess.run([str(python), "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                           f"--master_port={port}", str(wrapper), str(SCRIPT), "--backend", "gloo",
                           "--sizes", "4K:16K", "--iters", "2", "--warmup", "1", "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=timeout, cwd=out.parent)


def test_gloo_with_torch_alone_no_numpy(tmp_path):
    pytest.importorskip("torch")
    r = run_gloo(sys.executable, tmp_path / "run", 2, free_port())
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [c["rank"] for c in doc["correctness"]] == [0, 1]
    assert all(c["all_reduce"] is True and c["all_gather"] is True for c in doc["correctness"])
    assert {row["op"] for row in doc["results"]} >= {"all_reduce", "all_gather", "broadcast"}
    assert all(row["meaningful"] for row in doc["results"])


def test_one_rank_marks_bandwidth_as_not_meaningful(tmp_path):
    pytest.importorskip("torch")
    r = run_gloo(sys.executable, tmp_path / "run", 1, free_port())
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["results"] and not any(row["meaningful"] for row in doc["results"])
    assert "one rank: no data crosses a link" in r.stdout
    table = [line for line in r.stdout.splitlines() if line.startswith(("all_reduce", "broadcast"))]
    assert table and all(line.split()[-2:] == ["n/a", "n/a"] for line in table)


@pytest.mark.parametrize("text", ["", "garbage without the magic word\n\x00\x01binary"])
def test_analyze_log_without_nccl_lines_is_bad_usage(tmp_path, text):
    log = tmp_path / "empty.log"
    log.write_text(text)
    r = subprocess.run([sys.executable, SCRIPT, "--analyze-log", str(log)], capture_output=True, text=True)
    assert r.returncode == 2 and "holds no NCCL line" in r.stderr and "NCCL_DEBUG=INFO" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_old_torch_is_compared_as_numbers():
    """2.11 is newer than 2.2 (a string comparison would say otherwise): only torch 2.1's gloo
    keeps its process group at exit."""
    assert vn.old_torch("2.1.0+cu121") and vn.old_torch("1.13.1")
    assert not vn.old_torch("2.11.0+cu130") and not vn.old_torch("2.2.0")
