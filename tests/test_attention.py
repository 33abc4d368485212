"""Attention measured, not assumed: gpu_health's pure parts (FLOP count, the fastest backend,
its gpu.attention finding), `invoke check` reading that finding back, and a profile that stops
building flash-attn (`build = false`). The timing itself needs a GPU (bench/results/)."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from megatron_env import profile
from megatron_env.errors import UserError
from megatron_env.host import attention
from megatron_env.kernels import build

sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))
import gpu_health  # noqa: E402

# measured on the H200 (issue 24): causal bf16 head dim 128, fwd+bwd
ATT = {"head_dims": [128], "backends": {"flash_attn": 290.0, "sdpa_cudnn": 500.0,
                                        "sdpa_flash": 270.0, "te": 480.0},
       "fastest": "sdpa_cudnn", "skipped": {"sdpa_efficient@128": "RuntimeError: no"}}


def test_flops_of_causal_forward_and_backward():
    # forward 4*b*s^2*h*d halved for causal, backward 2.5x the forward
    assert gpu_health.attention_flops(4, 4096, 32, 128, True) == 3.5 * 4 * 4 * 4096**2 * 32 * 128 / 2
    assert gpu_health.attention_flops(1, 2, 1, 1, False) == 3.5 * 16


def test_fastest_is_the_most_tflops_and_none_when_nothing_ran():
    assert gpu_health.fastest(ATT["backends"]) == "sdpa_cudnn"
    assert gpu_health.fastest({}) is None


def test_the_finding_names_the_fastest_and_how_slow_flash_attn_is():
    f = gpu_health.attention_finding("GPU0 (NVIDIA H200)", ATT)
    assert f["id"] == "gpu.attention" and f["status"] == "pass"
    assert "fastest attention sdpa_cudnn (500.0 TFLOP/s, head dim 128" in f["summary"]
    assert "te 480.0, flash_attn 290.0, sdpa_flash 270.0" in f["summary"]
    assert "flash-attn is 1.7x slower than sdpa_cudnn" in f["summary"]
    assert "build = false" in f["fix"] and f["evidence"] == ["sdpa_efficient@128: RuntimeError: no"]
    fa_best = {**ATT, "backends": {"flash_attn": 600.0, "sdpa_cudnn": 500.0}, "fastest": "flash_attn"}
    assert gpu_health.attention_finding("GPU0", fa_best)["fix"] == ""


def profile_copy(tmp_path: Path, extra: str = "") -> profile.Profile:
    src = profile.load("core_v0.19.0-cu130").path
    d = tmp_path / "core_v0.19.0-cu130"
    shutil.copytree(src.parent, d)
    text = (d / "profile.toml").read_text()
    if extra:
        text = text.replace('[kernels.flash-attn]\n', f'[kernels.flash-attn]\n{extra}\n')
    (d / "profile.toml").write_text(text)
    return profile.load_file(d / "profile.toml")


def test_check_reads_the_finding_back_and_drops_the_fix_once_flash_attn_is_off(tmp_path):
    doc = {"gpus": [{"attention": ATT}],
           "findings": [gpu_health.attention_finding("GPU0 (NVIDIA H200)", ATT)]}
    path = tmp_path / "gpu_health.json"
    path.write_text(json.dumps(doc))
    on = attention.from_file(path, profile_copy(tmp_path / "a"))
    assert on.summary.startswith("GPU0 (NVIDIA H200): fastest attention sdpa_cudnn")
    assert "build = false" in on.fix
    off = attention.from_file(path, profile_copy(tmp_path / "b", "build = false"))
    assert off.fix == "" and "sdpa_cudnn" in off.summary
    assert attention.from_file(tmp_path / "absent.json") is None
    assert attention.finding({"gpus": [{}], "findings": []}) is None


def test_head_dims_come_from_the_profile(tmp_path):
    assert attention.head_dims(profile_copy(tmp_path)) == [128]
    assert attention.head_dims(profile.load("core_v0.4.0-cu121")) == [128]  # "all": the default


def test_build_false_keeps_the_pin_but_builds_nothing(tmp_path):
    prof = profile_copy(tmp_path, "build = false")
    assert "flash-attn" not in build.packages(prof) and "apex" in build.packages(prof)
    with pytest.raises(UserError, match="says build = false for flash-attn") as e:
        build.selected(prof, "flash-attn", ["9.0"])
    assert "remove `build = false`" in e.value.fix
    with pytest.raises(UserError, match=r"build.*a bool"):
        profile_copy(tmp_path / "bad", 'build = "no"')
