"""Verdicts of `invoke check` on snapshots assembled from real captures."""

import json
import subprocess
import sys

import pytest

from megatron_env import profile
from megatron_env.host import checks
from megatron_env.host.snapshot import Snapshot

from .conftest import H200

DEFAULT = profile.load("core_v0.4.0-cu121")
CURRENT = profile.load("core_v0.19.0-cu130")


def verdicts(path, prof=DEFAULT):
    return {f.id: f for f in checks.run_all(Snapshot.load(path), prof)}


def test_h200_node_passes_current_profile():
    v = verdicts(H200, CURRENT)
    assert {k: f.status for k, f in v.items() if f.status not in ("pass", "skip")} == {}
    assert v["driver.version"].status == "pass"
    assert v["gpu.topology"].status == "pass"


@pytest.mark.parametrize(
    "capture, status, words",
    [
        ("topo-8gpu-pcie-4090.txt", "warn", "no NVLink"),
        ("topo-8gpu-pcie-pix-phb.txt", "warn", "no NVLink"),
        ("topo-16gpu-dgx2-nv6.txt", "pass", "all 120 pairs of 16 GPUs on NVLink"),
        ("topo-8gpu-h100-nv18-nics.txt", "pass", "all 28 pairs of 8 GPUs on NVLink (NV18)"),
        ("topo-8gpu-h100-gpu3-lost-nvlink.txt", "fail", "GPU3 lost all NVLinks"),
        ("topo-8gpu-dgx1-cube-mesh.txt", "fail", "12 of 28 GPU pairs are not on NVLink"),
        ("topo-16gpu-dgx2-truncated.txt", "warn", "could not be parsed"),
        ("garbage.bin.txt", "warn", "could not be parsed"),
    ],
)
def test_topology_verdicts(make_snapshot, capture, status, words):
    f = verdicts(make_snapshot(nvidia_smi_topo_m=capture))["gpu.topology"]
    assert f.status == status, f
    assert words in f.summary


def test_lost_nvlink_names_the_pairs(make_snapshot):
    f = verdicts(make_snapshot(nvidia_smi_topo_m="topo-8gpu-h100-gpu3-lost-nvlink.txt"))["gpu.topology"]
    assert "GPU0-GPU3: NODE" in f.evidence and "GPU3-GPU7: SYS" in f.evidence
    assert len(f.evidence) == 7 and f.fix


@pytest.mark.parametrize(
    "capture, status, words",
    [
        ("ibstatus-cx3-fdr-ok.txt", "pass", "2 port(s) ACTIVE"),
        ("ibstatus-cx3-port2-down.txt", "fail", "mlx4_0:2 is DOWN/Polling"),
        ("ibstatus-hdr-half-rate.txt", "fail", "ibp59s0:1 trained at 100 Gb/s, its peers at 200"),
        ("ibstatus-roce-slow-port.txt", "fail", "mlx5_0:1 trained at 10 Gb/s, its peers at 25"),
        ("garbage.bin.txt", "warn", "could not be parsed"),
    ],
)
def test_ib_verdicts(make_snapshot, capture, status, words):
    f = verdicts(make_snapshot(ibstatus=capture))["net.ib"]
    assert f.status == status and words in f.summary, f


def test_no_ibstatus_is_skip(make_snapshot):
    assert verdicts(make_snapshot())["net.ib"].status == "skip"


@pytest.mark.parametrize(
    "ulimit, ib, status",
    [("ulimit-l-64.txt", "ibstatus-cx3-fdr-ok.txt", "fail"),
     ("ulimit-l-8192.txt", "ibstatus-cx3-fdr-ok.txt", "fail"),
     ("ulimit-l-8192.txt", None, "warn"),
     ("unlimited\n", "ibstatus-cx3-fdr-ok.txt", "pass")],
)
def test_memlock_verdicts(make_snapshot, ulimit, ib, status):
    f = verdicts(make_snapshot(ulimit_l=ulimit, ibstatus=ib))["limits.memlock"]
    assert f.status == status, f


def test_driver_too_old_for_cuda_121(make_snapshot):
    snap = make_snapshot(nvidia_smi="nvidia-smi-470.txt", nvidia_smi_q=None)
    f = verdicts(snap)["driver.version"]
    assert f.status == "fail" and "470.82.01 is too old for CUDA 12.1" in f.summary
    assert "530.30.02" in f.fix


def test_driver_minor_version_compatibility_is_warn(make_snapshot):
    text = (H200 / "nvidia-smi.txt").read_text().replace("580.159.04", "525.85.12")
    f = verdicts(make_snapshot(nvidia_smi=text, nvidia_smi_q=None))["driver.version"]
    assert f.status == "warn" and "minor-version" in f.summary


def test_no_driver_is_a_finding(make_snapshot):
    snap = make_snapshot(base=None, ulimit_l="ulimit-l-8192.txt",
                         **{"meta.json": '{"files": {}}'})
    (snap / "nvml.json").write_text('{"error": "NVML init failed: NVML Shared Library Not Found"}')
    f = verdicts(snap)["driver.version"]
    assert f.status == "fail" and "no NVIDIA driver" in f.summary
    assert f.kind == "absent"  # what setup reads to skip the kernel builds, not the summary


def test_an_old_driver_is_not_an_absent_one(make_snapshot):
    f = verdicts(make_snapshot(nvidia_smi="nvidia-smi-470.txt", nvidia_smi_q=None))[
        "driver.version"]
    assert f.status == "fail" and f.kind == ""


@pytest.mark.parametrize(
    "capture, status",
    [("nvidia-smi-q-a10-hw-slowdown.txt", "fail"),
     ("nvidia-smi-q-v100-throttle-reasons.txt", "fail")],
)
def test_throttle_verdicts(make_snapshot, capture, status):
    f = verdicts(make_snapshot(nvidia_smi_q=capture))["gpu.throttle"]
    assert f.status == status and "HW Power Brake Slowdown" in " ".join(f.evidence)


def test_shm_sizes(make_snapshot):
    docker = "Filesystem     1K-blocks  Used Available Use% Mounted on\nshm                65536     0     65536   0% /dev/shm\n"
    assert verdicts(make_snapshot(shm=docker))["sys.shm"].status == "fail"
    big = docker.replace("65536     0     65536", "263815528 0 263815528")
    assert verdicts(make_snapshot(shm=big))["sys.shm"].status == "pass"


def test_cuda_toolkit_major_mismatch_and_several_toolkits(make_snapshot):
    nvcc13 = "Cuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0\n"
    assert verdicts(make_snapshot(nvcc_version=nvcc13))["cuda.toolkit"].status == "fail"
    nvcc121 = nvcc13.replace("13.0", "12.1")
    assert verdicts(make_snapshot(nvcc_version=nvcc121))["cuda.toolkit"].status == "pass"
    env = "PATH=/usr/local/cuda-12.1/bin:/usr/local/cuda-11.8/bin:/usr/bin\nLD_LIBRARY_PATH=/usr/local/cuda-11.8/lib64\n"
    f = verdicts(make_snapshot(nvcc_version=nvcc121, env=env))["cuda.toolkit"]
    assert f.status == "warn" and "11.8, 12.1" in f.summary


def test_nccl_env_contradictions(make_snapshot):
    ip = "lo               UNKNOWN        127.0.0.1/8\neth0             UP             10.0.0.2/24\nib0              UP             10.2.0.2/24\n"
    snap = make_snapshot(ibstatus="ibstatus-cx3-fdr-ok.txt", ip_br_addr=ip,
                         env="NCCL_SOCKET_IFNAME=ens5\nNCCL_IB_DISABLE=1\n")
    f = verdicts(snap)["nccl.env"]
    assert f.status == "fail"
    assert "NCCL_SOCKET_IFNAME=ens5 matches no interface" in f.summary
    assert "NCCL_IB_DISABLE=1" in f.summary
    ok = make_snapshot(ip_br_addr=ip, env="NCCL_SOCKET_IFNAME=eth\n")
    assert verdicts(ok)["nccl.env"].status == "pass"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True)


def test_cli_check_json_and_exit_codes(make_snapshot):
    good = run_cli("check", "--snapshot", str(H200), "--profile", "core_v0.19.0-cu130", "--json")
    assert good.returncode == 0, good.stderr
    doc = json.loads(good.stdout)
    assert {f["id"] for f in doc["findings"]} >= {
        "driver.version", "cuda.toolkit", "gpu.topology", "gpu.throttle", "net.ib",
        "limits.memlock", "sys.shm", "nccl.env"}
    assert all(set(f) == {"id", "status", "summary", "evidence", "fix"} for f in doc["findings"])
    bad = run_cli("check", "--snapshot", str(make_snapshot(ibstatus="ibstatus-cx3-port2-down.txt")),
                  "--json")
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["summary"]["fail"] >= 1


@pytest.mark.parametrize("args, words", [
    (["--snapshot", "/nonexistent/dir"], "is not a directory"),
    (["--profile", "nope"], "unknown profile 'nope'"),
])
def test_cli_bad_usage_exits_2_without_traceback(args, words):
    r = run_cli("check", *args)
    assert r.returncode == 2
    assert words in r.stderr and "Traceback" not in r.stderr


def test_cli_garbage_snapshot_does_not_crash(make_snapshot):
    snap = make_snapshot(**{k: "garbage.bin.txt" for k in (
        "nvidia_smi", "nvidia_smi_topo_m", "nvidia_smi_q", "ibstatus", "ulimit_l", "nvcc_version",
        "shm", "ip_br_addr", "env")})
    (snap / "nvml.json").write_text("{not json")
    r = run_cli("check", "--snapshot", str(snap), "--json")
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert sum("could not be parsed" in f["summary"] for f in doc["findings"]) >= 5


def test_live_h200_snapshot_collected_by_invoke_collect():
    """tests/fixtures/h200-live was written by `invoke collect` on an H200 node (one GPU, no IB
    tools, no iproute2 in that VM): everything passes but IB, which is skipped with its reason."""
    live = H200.parent / "h200-live"
    snap = Snapshot.load(live)
    assert snap.missing("ibstatus.txt") and snap.missing("ip-br-addr.txt")
    assert snap.nvml()["gpus"][0]["name"] == "NVIDIA H200"
    v = verdicts(live, CURRENT)
    assert {k: f.status for k, f in v.items()} == {
        "driver.version": "pass", "cuda.toolkit": "pass", "gpu.topology": "pass",
        "gpu.throttle": "pass", "net.ib": "skip", "limits.memlock": "pass", "sys.shm": "pass",
        "nccl.env": "pass"}
    assert "ibstatus not installed" in v["net.ib"].summary
    # The same node against the default profile: its nvcc 13.0 cannot build cu121 kernels.
    assert verdicts(live, DEFAULT)["cuda.toolkit"].status == "fail"


def test_nvml_and_topo_text_disagreeing_is_reported(make_snapshot):
    """NVML (live) says GPU3 has no NVLink P2P while the text says NV18 everywhere."""
    import json

    nvml = [[True] * 8 for _ in range(8)]
    for k in range(8):
        if k != 3:
            nvml[3][k] = nvml[k][3] = False
    snap = make_snapshot(nvidia_smi_topo_m="topo-8gpu-h100-nv18-nics.txt")
    (snap / "nvml.json").write_text(json.dumps({"driver_version": "550.54.15",
                                                "nvlink_p2p": nvml}))
    f = verdicts(snap)["gpu.topology"]
    assert f.status == "warn" and "NVML and nvidia-smi disagree on 7 pair(s)" in f.summary
    assert "GPU0-GPU3: topo NV18, NVML no NVLink" in f.evidence
    agree = make_snapshot(nvidia_smi_topo_m="topo-8gpu-h100-nv18-nics.txt")
    (agree / "nvml.json").write_text(json.dumps({"nvlink_p2p": [[True] * 8 for _ in range(8)]}))
    assert verdicts(agree)["gpu.topology"].status == "pass"


def test_memlock_on_an_ib_node_names_the_error_and_no_missing_port(make_snapshot):
    """With an active IB port the limit fails NCCL: the line says so, and nothing more."""
    f = verdicts(make_snapshot(ulimit_l="ulimit-l-64.txt",
                               ibstatus="ibstatus-cx3-fdr-ok.txt"))["limits.memlock"]
    assert f.summary == ("locked memory limited to 64 KiB: NCCL over IB fails with "
                         "'unhandled system error'")
    g = verdicts(make_snapshot(ulimit_l="ulimit-l-64.txt", ibstatus=None))["limits.memlock"]
    assert g.summary == f.summary + " (no active IB port here)"


def test_no_driver_without_nvidia_smi_nor_an_nvml_error_says_not_installed(make_snapshot):
    """No nvidia-smi output and NVML without an error text: the evidence is the one line a
    user can act on, not an empty or made-up excerpt."""
    snap = make_snapshot(base=None, ulimit_l="ulimit-l-8192.txt",
                         **{"meta.json": '{"files": {}}'})
    (snap / "nvml.json").write_text("{}")
    f = verdicts(snap)["driver.version"]
    assert (f.status, f.summary) == ("fail", "no NVIDIA driver: nvidia-smi and NVML are "
                                             "unavailable")
    assert f.evidence == ["nvidia-smi: not installed"]


def test_no_driver_shows_the_first_three_lines_nvidia_smi_printed(make_snapshot):
    said = ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "Make sure that the latest NVIDIA driver is installed and running.", "",
            "This line is the fourth.", "And the fifth."]
    f = verdicts(make_snapshot(nvidia_smi="\n".join(said) + "\n",
                               nvidia_smi_q=None))["driver.version"]
    assert f.status == "fail" and f.evidence == said[:3]


def test_a_display_clock_setting_is_no_throttle(make_snapshot):
    """`Display Clock Setting: Active` is a clock the display asked for, as benign as Idle."""
    text = (H200 / "nvidia-smi-q.txt").read_text()
    active = text.replace("Display Clock Setting                          : Not Active",
                          "Display Clock Setting                          : Active")
    assert active != text
    assert verdicts(make_snapshot(nvidia_smi_q=active))["gpu.throttle"].status == "pass"
