"""verify's GPU proof of the built kernels reads gpu_health's results as the program writes
them: real results captured on the H200 (bench/results/2026-12-04-h200-1gpu: all three kernels
built and checked; 2026-12-02-h200-1gpu/flash-attn: apex not installed there, so skipped)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from megatron_env.kernels import gpu_proof

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
ALL = RESULTS / "2026-12-04-h200-1gpu" / "raw" / "gpu_health" / "results.json"
FLASH_ONLY = RESULTS / "2026-12-02-h200-1gpu" / "flash-attn" / "gpu_health.json"
KERNELS = ["flash-attn", "apex", "transformer-engine"]


def test_every_kernel_has_a_gpu_check_and_the_h200_run_passed_them_all():
    wanted = gpu_proof.checks(KERNELS)
    assert set(wanted) == set(KERNELS)
    got = gpu_proof.verdicts(json.loads(ALL.read_text()), wanted)
    assert {k: v[0] for k, v in got.items()} == dict.fromkeys(KERNELS, "pass")
    assert "matches PyTorch" in got["flash-attn"][1]


def test_a_skipped_a_failed_and_an_absent_check_are_told_apart():
    doc = json.loads(FLASH_ONLY.read_text())
    got = gpu_proof.verdicts(doc, gpu_proof.checks(KERNELS))
    assert {k: v[0] for k, v in got.items()} == {"flash-attn": "pass", "apex": "skip",
                                                 "transformer-engine": "absent"}
    wrong = copy.deepcopy(doc)
    for f in wrong["findings"]:
        if f["id"] == "kernel.flash_attn":
            f["status"] = "fail"
    assert gpu_proof.verdicts(wrong, {"flash-attn": "flash_attn"})["flash-attn"][0] == "fail"
    assert gpu_proof.verdicts([], {"apex": "apex"}) == {
        "apex": ("absent", "gpu_health reported no kernel.apex")}
