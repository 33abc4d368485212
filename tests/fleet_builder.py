"""Fleets for the tests, built from real captures: one directory per host, planted faults.

Every node starts from the snapshot `invoke collect` wrote on an H200 node (fixtures/h200-live),
with the HGX H100 `nvidia-smi topo -m` capture (8 GPUs on NV18) and a ConnectX-3 `ibstatus`
capture (two ports ACTIVE at 56 Gb/s) in place of the VM's single GPU and missing IB, and the
gpu_health.json the H200 node wrote (bench/results/2026-12-02-h200-1gpu/flash-attn/) with its
one GPU's entry repeated for GPU0..GPU7, each within +-0.8% of the measured figures. The faults
are planted by editing exactly the values they concern.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from scripts import gpu_health  # the script preflight runs on each node, imported whole

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURES = FIXTURES / "captures"
REPO = Path(__file__).parent.parent
H200_HEALTH = REPO / "bench/results/2026-12-02-h200-1gpu/flash-attn/gpu_health.json"
PROFILE = "core_v0.19.0-cu130"


def health(node: int, gpus: int = 8, slow: dict[int, float] | None = None) -> dict:
    """The real H200 gpu_health.json for `gpus` GPUs; slow = {gpu index: factor on GEMM}; the
    findings are gpu_health.py's own judgement of each GPU."""
    doc = json.loads(H200_HEALTH.read_text())
    real = doc["gpus"][0]
    doc["gpus"], doc["findings"] = [], []
    judge = gpu_health.judge  # scripts/gpu_health.py's own thresholds
    for i in range(gpus):
        g = copy.deepcopy(real)
        jitter = 1 + 0.004 * ((node * gpus + i) % 5 - 2)
        g["index"] = i
        g["gemm_bf16_tflops"] = round(real["gemm_bf16_tflops"] * jitter * (slow or {}).get(i, 1),
                                      1)
        g["copy_tbs"] = round(real["copy_tbs"] * jitter, 3)
        doc["gpus"].append(g)
        doc["findings"] += judge(g)
    return doc


def fingerprint(**changes: str) -> dict:
    """What megatron_env.fleet.fingerprint records for the H200 node's stack (versions from its
    bench README: torch 2.11.0+cu130, NCCL 2.28.9, cuDNN 91900)."""
    from megatron_env import digest, profile
    from megatron_env.megatron import checkout

    prof = profile.load(PROFILE)
    doc = {"profile": PROFILE,
           "lock_digest": digest.of_file(prof.lock_file),
           "torch": "2.11.0+cu130", "torch_cuda": "13.0", "nccl": "2.28.9", "cudnn": 91900,
           "megatron_commit": prof.megatron["commit"],
           "megatron_patch_digest": digest.of_files(checkout.patch_series(prof)),
           "kernel_cache_keys": {}, "errors": []}
    doc.update(changes)
    return doc


def node(root: Path, host: str, index: int, *, topo: str = "topo-8gpu-h100-nv18-nics.txt",
         ib_rate: str | None = None, driver: str | None = None, slow: dict | None = None,
         fp: dict | None = None) -> Path:
    d = root / host
    shutil.copytree(FIXTURES / "h200-live", d)
    shutil.copy(CAPTURES / topo, d / "nvidia-smi-topo-m.txt")
    ib = (CAPTURES / "ibstatus-cx3-fdr-ok.txt").read_text()
    if ib_rate:
        ib = ib.replace("56 Gb/sec (4X FDR)", ib_rate)
    (d / "ibstatus.txt").write_text(ib)
    if driver:
        for name in ("nvml.json", "nvidia-smi.txt", "nvidia-smi-q.txt"):
            text = (d / name).read_text()
            assert "580.159.04" in text
            (d / name).write_text(text.replace("580.159.04", driver))
    (d / "gpu_health.json").write_text(json.dumps(health(index, slow=slow), indent=2))
    (d / "fingerprint.json").write_text(json.dumps(fp or fingerprint(), indent=2))
    return d


# host -> what is planted there (None: healthy)
PLANTED = {
    "node01": None,
    "node02": "GPU5 12% slow",
    "node03": "GPU3 lost its NVLinks",
    "node04": "IB at half rate",
    "node05": "another driver",
    "node06": "another torch and NCCL",
    "node07": None,
}
FAILING = ["node02", "node03", "node04"]
WARNING = ["node05", "node06"]


def planted_fleet(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    node(root, "node01", 1)
    node(root, "node02", 2, slow={5: 0.88})
    node(root, "node03", 3, topo="topo-8gpu-h100-gpu3-lost-nvlink.txt")
    node(root, "node04", 4, ib_rate="28 Gb/sec (2X FDR)")
    node(root, "node05", 5, driver="580.95.05")
    node(root, "node06", 6, fp=fingerprint(torch="2.10.0+cu130", nccl="2.27.3"))
    node(root, "node07", 7)
    return root
