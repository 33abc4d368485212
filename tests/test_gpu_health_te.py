"""scripts/gpu_health.py's Transformer Engine check, on the CPU.

TE needs a GPU, so a stand-in package takes its place at the import boundary: te.Linear,
te.LayerNormLinear and te.DotProductAttention as plain bf16 torch modules (what TE computes,
without its kernels; the attention raising, where asked, the error TE raised on an H100 node,
bench/results/2026-12-06-h100-converge/4-preflight.txt). The check's
own comparison against fp32 PyTorch is what runs for real: a faithful module passes, one whose
output carries a NaN or is 5% off fails, an absent TE is a skip, a TE whose PyTorch part does not
import is a failure that says why."""

import importlib.util
import math
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))
import gpu_health  # noqa: E402

STAND_IN = '''
import torch
import torch.nn.functional as F

class Linear(torch.nn.Module):
    def __init__(self, i, o, bias=True, params_dtype=None, device=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(o, i, dtype=params_dtype, device=device) / i**.5)
        self.bias = torch.nn.Parameter(torch.zeros(o, dtype=params_dtype, device=device))

    def forward(self, x):
        return SPOIL(F.linear(x, self.weight, self.bias))

class LayerNormLinear(Linear):
    def __init__(self, i, o, eps=1e-5, bias=True, params_dtype=None, device=None):
        super().__init__(i, o, bias, params_dtype, device)
        self.eps = eps
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(i, dtype=params_dtype, device=device))
        self.layer_norm_bias = torch.nn.Parameter(torch.zeros(i, dtype=params_dtype, device=device))

    def forward(self, x):
        x = F.layer_norm(x, x.shape[-1:], self.layer_norm_weight, self.layer_norm_bias, self.eps)
        return super().forward(x)

class DotProductAttention(torch.nn.Module):
    def __init__(self, heads, head_dim, attn_mask_type="causal", qkv_format="bshd"):
        super().__init__()
        assert attn_mask_type == "causal" and qkv_format == "bshd"

    def forward(self, q, k, v):
        ATTENTION_RAISES()
        o = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True)
        return SPOIL(o.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1))
'''

#: what TE's fused attention raised on the H100 node (4-preflight.txt there, path shortened)
H100_ERROR = ("/tmp/build/transformer_engine/common/fused_attn/fused_attn_f16_arbitrary_seqlen.cu"
              ":419 in function operator(): cuDNN Error: CUDNN_BACKEND_TENSOR_DESCRIPTOR "
              "cudnnFinalize failedptrDesc->finalize() cudnn_status: "
              "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED. For more information, enable cuDNN error "
              "logging by setting CUDNN_LOGERR_DBG=1 and CUDNN_LOGDEST_DBG=stderr in the "
              "environment.")


def plant(root: Path, spoil: str = "lambda y: y", pytorch: str | None = None,
          attention_raises: str = "lambda: None") -> None:
    pkg = root / "transformer_engine"
    (pkg / "pytorch").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "2.17.1"\n')
    body = pytorch if pytorch is not None else (
        f"SPOIL = {spoil}\nATTENTION_RAISES = {attention_raises}\n" + textwrap.dedent(STAND_IN))
    (pkg / "pytorch" / "__init__.py").write_text(body)


@pytest.fixture
def clean_modules(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("transformer_engine")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m.startswith("transformer_engine")]:
        del sys.modules[name]


def check(tmp_path, monkeypatch, **plant_args):
    plant(tmp_path, **plant_args)
    monkeypatch.syspath_prepend(str(tmp_path))
    return gpu_health.te_check(torch, torch.device("cpu"), tokens=64, hidden=128, features=96)


def test_faithful_bf16_modules_pass(tmp_path, monkeypatch, clean_modules):
    r = check(tmp_path, monkeypatch)
    assert r["status"] == "pass" and r["version"] == "2.17.1" and r["finite"]
    assert set(r["errors"]) == {"Linear.out", "Linear.dgrad", "Linear.grad0", "Linear.grad1",
                                "LayerNormLinear.out", "LayerNormLinear.dgrad",
                                *(f"LayerNormLinear.grad{i}" for i in range(4)),
                                "DotProductAttention.out", "DotProductAttention.dq",
                                "DotProductAttention.dk", "DotProductAttention.dv"}
    assert 0 < r["rel_err"] < 1e-2 and 0 < r["grad_rel_err"] < 1e-2  # bf16 rounding, not zero


def test_a_nan_fails(tmp_path, monkeypatch, clean_modules):
    spoil = "lambda y: y.index_put((torch.tensor([0]), torch.tensor([0])), torch.tensor(float('nan'), dtype=y.dtype))"  # noqa: E501
    r = check(tmp_path, monkeypatch, spoil=spoil)
    assert r["status"] == "fail" and not r["finite"] and math.isnan(r["errors"]["Linear.out"])
    assert gpu_health.judge(_report(r))[-1]["status"] == "fail"


def test_five_percent_off_fails(tmp_path, monkeypatch, clean_modules):
    r = check(tmp_path, monkeypatch, spoil="lambda y: y * 1.05")
    assert r["status"] == "fail" and r["finite"] and 0.04 < r["rel_err"] < 0.06


def test_absent_is_a_skip_and_broken_is_a_failure(tmp_path, monkeypatch, clean_modules):
    assert importlib.util.find_spec("transformer_engine") is None  # the test environment's
    assert gpu_health.te_check(torch, torch.device("cpu")) == {
        "status": "skip", "why": "transformer_engine not installed"}
    r = check(tmp_path, monkeypatch, pytorch="import pydantic_is_not_here\n")
    assert r["status"] == "fail" and "ModuleNotFoundError" in r["why"]
    finding = gpu_health.judge(_report(r))[-1]
    assert finding["status"] == "fail" and "does not import" in finding["summary"]


def test_attention_that_raises_fails_with_its_error_and_the_cudnn_hint(tmp_path, monkeypatch,
                                                                      clean_modules):
    """Before: the check called te.Linear and te.LayerNormLinear only, so the H100 node whose
    TE fused attention raised CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED passed it ("ready")."""
    (tmp_path / "h100_error.txt").write_text(H100_ERROR)
    raises = (f"lambda: (_ for _ in ()).throw(RuntimeError(open({str(tmp_path / 'h100_error.txt')!r})"
              ".read()))")
    r = check(tmp_path, monkeypatch, attention_raises=raises)
    assert r["status"] == "fail", r
    assert r["why"].startswith("DotProductAttention raised RuntimeError: ") and (
        "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED" in r["why"]), r["why"]
    finding = gpu_health.judge(_report(r))[-1]
    assert finding["id"] == "kernel.transformer_engine" and finding["status"] == "fail"
    assert "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED" in finding["summary"]
    assert "CUDNN_LOGERR_DBG=1" in finding["fix"] and "CUDNN_PATH=" in finding["fix"]


#: torch's own check on the H100 node once TE had loaded the system cuDNN beside torch's
#: (bench/results/2026-12-06-h100-te-cudnn/probe/te.stderr.txt)
TORCH_CUDNN_ERROR = ("cuDNN version incompatibility: PyTorch was compiled  against (9, 19, 0) but "
                     "found runtime version (9, 14, 0). PyTorch already comes bundled with cuDNN. "
                     "One option to resolving this error is to ensure PyTorch can find the "
                     "bundled cuDNN. one possibility is that there is a conflicting cuDNN in "
                     "LD_LIBRARY_PATH.")


def test_torch_cudnn_broken_by_importing_te_fails(tmp_path, monkeypatch, clean_modules):
    """Before: TE's own calls passed while TE's import had put a second cuDNN in the process,
    so torch's first cuDNN use in training would raise; the check called only TE. Now torch's
    cuDNN is asked after TE is imported (the GPU itself is the boundary: its error stands in)."""
    def version():
        raise RuntimeError(TORCH_CUDNN_ERROR)

    monkeypatch.setattr(torch.backends.cudnn, "version", version)
    r = check(tmp_path, monkeypatch)
    assert r["status"] == "fail", r
    assert r["why"].startswith("torch's own cuDNN, with TE imported, raised RuntimeError: cuDNN "
                               "version incompatibility"), r["why"]
    finding = gpu_health.judge(_report(r))[-1]
    assert finding["status"] == "fail" and "CUDNN_PATH=" in finding["fix"]


def test_attention_a_little_off_fails(tmp_path, monkeypatch, clean_modules):
    """Attention's own tolerance (2e-2 on gradients) is not loose enough to pass 5% off."""
    plant(tmp_path, spoil="lambda y: y")
    src = (tmp_path / "transformer_engine" / "pytorch" / "__init__.py")
    src.write_text(src.read_text().replace("return SPOIL(o.transpose", "return 1.05 * SPOIL(o.transpose"))
    monkeypatch.syspath_prepend(str(tmp_path))
    r = gpu_health.te_check(torch, torch.device("cpu"), tokens=64, hidden=128, features=96)
    assert r["status"] == "fail" and 0.04 < r["errors"]["DotProductAttention.out"] < 0.06, r


def _report(kernel: dict) -> dict:
    return {"index": 0, "name": "NVIDIA H200", "gemm_rel_err": 0.0, "gemm_bf16_tflops": 790.0,
            "copy_tbs": 4.24, "kernels": {"transformer_engine": kernel}}
