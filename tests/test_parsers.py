"""Parsers on real captured outputs (see fixtures/captures/README.md)."""

import pytest

from megatron_env.host import parsers
from megatron_env.host.parsers import ParseError

from .conftest import CAPTURES, H200


def cap(name: str) -> str:
    return (CAPTURES / name).read_text()


@pytest.mark.parametrize(
    "name, n_gpus, cells, nics",
    [
        ("topo-8gpu-pcie-4090.txt", 8, {"SYS"}, ["NIC0", "NIC1"]),
        ("topo-8gpu-pcie-pix-phb.txt", 8, {"PIX", "PHB", "SYS"}, []),
        ("topo-8gpu-h100-nv18-nics.txt", 8, {"NV18"}, [f"NIC{i}" for i in range(9)]),
        ("topo-8gpu-dgx1-cube-mesh.txt", 8, {"NV1", "NV2", "SYS"}, ["mlx5_0", "mlx5_1"]),
        ("topo-4gpu-v100-nv2.txt", 4, {"NV2"}, ["mlx5_0"]),
        ("topo-16gpu-dgx2-nv6.txt", 16, {"NV6"}, [f"mlx5_{i}" for i in range(10)]),
        ("topo-1gpu-h200-ansi.txt", 1, set(), []),
    ],
)
def test_topology_layouts(name, n_gpus, cells, nics):
    topo = parsers.topology(cap(name))
    assert topo.gpus == [f"GPU{i}" for i in range(n_gpus)]
    assert {c for _, _, c in topo.pairs()} == cells
    assert topo.nics == nics


def test_topology_shared_h200_capture():
    topo = parsers.topology((H200 / "nvidia-smi-topo-m.txt").read_text())
    assert topo.gpus == ["GPU0"] and topo.pairs() == []


def test_topology_nic_legend_renames_columns():
    text = cap("topo-4gpu-v100-nv2.txt").replace("mlx5_0", "NIC0") + "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
    assert parsers.topology(text).nics == ["mlx5_0"]


def test_topology_dgx1_pairs_read_by_position():
    topo = parsers.topology(cap("topo-8gpu-dgx1-cube-mesh.txt"))
    assert topo.link[0][3] == "NV1" and topo.link[0][5] == "SYS" and topo.link[7][4] == "NV1"


@pytest.mark.parametrize("name", ["topo-16gpu-dgx2-truncated.txt", "garbage.bin.txt"])
def test_topology_garbage_raises_parse_error(name):
    with pytest.raises(ParseError):
        parsers.topology(cap(name))


def test_ibstatus_ports():
    ports = parsers.ibstatus(cap("ibstatus-cx3-port2-down.txt"))
    assert [(p.name, p.state, p.phys_state, p.rate_gbps) for p in ports] == [
        ("mlx4_0:1", "ACTIVE", "LinkUp", 40.0),
        ("mlx4_0:2", "DOWN", "Polling", 10.0),
    ]
    half = parsers.ibstatus(cap("ibstatus-hdr-half-rate.txt"))
    assert [(p.device, p.rate_gbps, p.link_layer) for p in half] == [
        ("mlx5_1", 200.0, "InfiniBand"), ("ibp59s0", 100.0, "InfiniBand")]
    roce = parsers.ibstatus(cap("ibstatus-roce-slow-port.txt"))
    assert {p.link_layer for p in roce} == {"Ethernet"}


def test_ibstatus_garbage():
    with pytest.raises(ParseError):
        parsers.ibstatus(cap("garbage.bin.txt"))
    assert parsers.ibstatus("") == []


def test_clock_event_reasons_new_and_old_names():
    h200 = parsers.clock_event_reasons((H200 / "nvidia-smi-q.txt").read_text())
    assert [(g.bus_id, g.active) for g in h200] == [("00000000:00:06.0", ["Idle"])]
    a10 = parsers.clock_event_reasons(cap("nvidia-smi-q-a10-hw-slowdown.txt"))
    assert a10[0].active == ["Idle", "HW Slowdown", "HW Power Brake Slowdown"]
    v100 = parsers.clock_event_reasons(cap("nvidia-smi-q-v100-throttle-reasons.txt"))
    assert v100[0].active == ["HW Slowdown", "HW Power Brake Slowdown"]
    with pytest.raises(ParseError):
        parsers.clock_event_reasons(cap("garbage.bin.txt"))


def test_driver_versions():
    assert parsers.driver_version((H200 / "nvidia-smi.txt").read_text()) == "580.159.04"
    assert parsers.driver_version((H200 / "nvidia-smi-q.txt").read_text()) == "580.159.04"
    assert parsers.driver_version(cap("nvidia-smi-470.txt")) == "470.82.01"
    assert parsers.driver_cuda_version(cap("nvidia-smi-470.txt")) == "11.4"


def test_small_parsers():
    assert parsers.ulimit((H200 / "ulimit-l.txt").read_text()) is None
    assert parsers.ulimit(cap("ulimit-l-8192.txt")) == 8192
    with pytest.raises(ParseError):
        parsers.ulimit(cap("garbage.bin.txt"))
    nvcc = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.1, V12.1.105\n"
    assert parsers.nvcc_release(nvcc) == "12.1"
    df = "Filesystem     1K-blocks  Used Available Use% Mounted on\nshm                65536     0     65536   0% /dev/shm\n"
    assert parsers.df_size_bytes(df) == 64 * 2**20
    ip = "lo               UNKNOWN        127.0.0.1/8 ::1/128\nib0              UP             10.2.6.111/24\n"
    assert parsers.ip_brief(ip)["ib0"].addresses == ["10.2.6.111/24"]
