#!/usr/bin/env python3
"""gpu_health.py - is every GPU of this node as fast as its model should be, and do the kernels
that were built for it (flash-attn, apex, Transformer Engine) compute what PyTorch computes?

    python gpu_health.py [--out runs/gpu_health] [--size 8192]
    torchrun --nproc_per_node=8 gpu_health.py          # one process per GPU, same results

Per GPU: bf16 GEMM TFLOP/s (random inputs, median of timed runs with CUDA events), device-to-
device copy bandwidth (bytes read + written), and when importable flash-attn's causal forward
against torch's scaled_dot_product_attention, apex's FusedLayerNorm against torch.layer_norm, and
Transformer Engine's bf16 Linear and LayerNormLinear, forward and backward, against fp32 PyTorch.
Results are judged against expectations per GPU model; JSON out, findings in the shape of
`invoke check`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

# name fragment -> (bf16 dense GEMM TFLOP/s, copy TB/s) that a healthy GPU reaches; a result
# below WARN x this warns, below FAIL x this fails. H200: 790 TFLOP/s and 4.24 TB/s measured.
EXPECTED = {"H200": (780.0, 4.2), "H100": (700.0, 2.9), "A100": (280.0, 1.7)}
WARN, FAIL = 0.85, 0.7


def finding(id, status, summary, evidence=(), fix=""):
    return {"id": id, "status": status, "summary": summary, "evidence": list(evidence), "fix": fix}


def timed(torch, fn, warmup=3, reps=10) -> float:
    """Median seconds of fn() over reps, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1000)
    return statistics.median(times)


def rel_err(torch, out, ref) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm() / ref.norm())


# --- attention: which backend is fastest on this GPU, measured ------------------------------
# A training-like shape: 4 sequences of 4096 tokens, hidden 4096 (heads = 4096 / head dim),
# causal, bf16, forward + backward (what a training step runs).
ATTN_SHAPE = {"batch": 4, "seq": 4096, "hidden": 4096, "causal": True, "dtype": "bfloat16"}


def attention_flops(batch: int, seq: int, heads: int, head_dim: int, causal: bool) -> float:
    """FLOPs of one forward + backward (flash-attn's own count): the forward's two matmuls are
    4*b*s^2*h*d, halved when causal; the backward is 2.5x the forward."""
    fwd = 4 * batch * seq * seq * heads * head_dim / (2 if causal else 1)
    return 3.5 * fwd


def fastest(backends: dict) -> str | None:
    """The backend with the most TFLOP/s (None when nothing ran)."""
    return max(backends, key=backends.get) if backends else None


def attention_backends(torch) -> dict:
    """name -> (layout, make(heads, head_dim) -> fn(q, k, v)) for every attention backend
    present; `layout` is "bshd" (flash-attn, TE) or "bhsd" (SDPA). The SDPA backends are
    pinned one at a time with torch.nn.attention.sdpa_kernel, so none falls back silently."""
    found = {}
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        pass
    else:
        found["flash_attn"] = ("bshd", lambda h, d: lambda q, k, v: flash_attn_func(
            q, k, v, causal=True))
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3
        pass
    else:
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def pinned(backend):
            def fn(q, k, v):
                with sdpa_kernel(backend):
                    return sdpa(q, k, v, is_causal=True)
            return lambda h, d: fn

        for name, which in (("sdpa_cudnn", "CUDNN_ATTENTION"), ("sdpa_flash", "FLASH_ATTENTION"),
                            ("sdpa_efficient", "EFFICIENT_ATTENTION")):
            if hasattr(SDPBackend, which):
                found[name] = ("bhsd", pinned(getattr(SDPBackend, which)))
    try:
        import transformer_engine.pytorch as te
    except Exception:  # noqa: BLE001 - absent or broken: te_check says which
        pass
    else:
        def make_te(h, d):
            m = te.DotProductAttention(h, d, attn_mask_type="causal", qkv_format="bshd")
            return lambda q, k, v: m(q, k, v)
        found["te"] = ("bshd", make_te)
    return found


def attention_report(torch, dev, head_dims=(128,), shape=None, reps=10) -> dict:
    """TFLOP/s of each backend present, forward + backward, per head dim: the first head dim's
    numbers are `backends` and `fastest`. A backend that cannot run a shape (a flash-attn build
    without that head dim, SDPA's cuDNN backend on an old cuDNN) is listed under `skipped` with
    its error, never fatal."""
    shape = {**ATTN_SHAPE, **(shape or {})}
    dtype = getattr(torch, shape["dtype"])
    out: dict = {"shape": shape, "head_dims": list(head_dims), "by_head_dim": {},
                 "skipped": {}}
    present = attention_backends(torch)
    for d in head_dims:
        h = shape["hidden"] // d
        b, s = shape["batch"], shape["seq"]
        flops = attention_flops(b, s, h, d, shape["causal"])
        q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        res = {}
        for name, (layout, make) in present.items():
            args = (q, k, v) if layout == "bshd" else tuple(
                x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            dy = dout if layout == "bshd" else dout.transpose(1, 2)
            try:
                fn = make(h, d)

                def step(fn=fn, args=args, dy=dy):
                    o = fn(*args)
                    torch.autograd.grad(o, args, dy.reshape(o.shape))

                t = timed(torch, step, warmup=2, reps=reps)
                res[name] = round(flops / t / 1e12, 1)
            except Exception as e:  # noqa: BLE001 - recorded per backend
                out["skipped"][f"{name}@{d}"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        out["by_head_dim"][str(d)] = {"backends": res, "fastest": fastest(res)}
        del q, k, v, dout
        torch.cuda.empty_cache()
    first = out["by_head_dim"][str(head_dims[0])]
    out["backends"], out["fastest"] = first["backends"], first["fastest"]
    return out


def attention_finding(gpu: str, att: dict) -> dict:
    """gpu.attention: the fastest backend, the others beside it, and when flash-attn is built
    but slower, how much and how to stop compiling it (`invoke check` shows this finding)."""
    tf, best = att["backends"], att["fastest"]
    others = ", ".join(f"{n} {tf[n]}" for n in sorted(tf, key=lambda n: -tf[n]) if n != best)
    summary = (f"{gpu}: fastest attention {best} ({tf[best]} TFLOP/s, head dim "
               f"{att['head_dims'][0]}, causal bf16 fwd+bwd)" + (f"; {others}" if others else ""))
    fix = ""
    if "flash_attn" in tf and best != "flash_attn" and tf["flash_attn"] > 0:
        summary += f"; flash-attn is {tf[best] / tf['flash_attn']:.1f}x slower than {best}"
        fix = ("train without --use-flash-attn (Megatron then uses TE or torch's SDPA) and stop "
               "compiling flash-attn: `build = false` under [kernels.flash-attn] in the profile")
    return finding("gpu.attention", "pass", summary,
                   [f"{k}: {v}" for k, v in att.get("skipped", {}).items()], fix)


def gpu_report(torch, index: int, size: int, head_dims=(128,), attention=True) -> dict:
    torch.cuda.set_device(index)
    props = torch.cuda.get_device_properties(index)
    dev = torch.device("cuda", index)
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    t = timed(torch, lambda: a @ b)
    tflops = 2 * size**3 / t / 1e12
    ref = (a[:256].double() @ b[:, :256].double())
    gemm_err = rel_err(torch, (a @ b)[:256, :256], ref)
    n = 1 << 30  # 1 GiB of bf16... as bytes: 2 GiB
    src = torch.randn(n, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    tc = timed(torch, lambda: dst.copy_(src))
    copy_tbs = 2 * src.numel() * src.element_size() / tc / 1e12

    rep = {"index": index, "name": props.name, "sms": props.multi_processor_count,
           "memory_gib": round(props.total_memory / 2**30, 1),
           "gemm_bf16_tflops": round(tflops, 1), "gemm_rel_err": gemm_err,
           "copy_tbs": round(copy_tbs, 3), "kernels": {}}
    rep["kernels"].update(kernel_checks(torch, dev))
    torch.cuda.empty_cache()
    if attention:
        rep["attention"] = attention_report(torch, dev, head_dims)
    return rep


def kernel_checks(torch, dev) -> dict:
    out = {}
    try:
        import flash_attn
        from flash_attn import flash_attn_func
    except ImportError:
        out["flash_attn"] = {"status": "skip", "why": "flash_attn not installed"}
    else:
        # forward and backward against SDPA in fp32: the backward kernels are separate
        # instantiations, and a build can carry a broken one that the forward never touches
        q, k, v = (torch.randn(4, 2048, 16, 128, device=dev, dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        o = flash_attn_func(q, k, v, causal=True)
        dout = torch.randn_like(o)
        grads = torch.autograd.grad(o, (q, k, v), dout)
        q32, k32, v32 = (x.detach().float().transpose(1, 2).requires_grad_() for x in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, is_causal=True)
        ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float().transpose(1, 2))
        err = rel_err(torch, o, ref.transpose(1, 2))
        pairs = zip(grads, ref_grads, strict=True)
        grad_err = max(rel_err(torch, g, r.transpose(1, 2)) for g, r in pairs)
        with torch.no_grad():
            t = timed(torch, lambda: flash_attn_func(q, k, v, causal=True))
        flops = 4 * 4 * 16 * 2048 * 2048 * 128 / 2
        ok = err < 1e-2 and grad_err < 2e-2
        out["flash_attn"] = {"status": "pass" if ok else "fail", "version":
                             flash_attn.__version__, "rel_err": err, "grad_rel_err": grad_err,
                             "tflops": flops / t / 1e12}
    try:
        from apex.normalization import FusedLayerNorm
    except ImportError:
        out["apex"] = {"status": "skip", "why": "apex not installed"}
    else:
        x = torch.randn(4096, 4096, device=dev, dtype=torch.float32)
        ln = FusedLayerNorm(4096).to(dev)
        err = rel_err(torch, ln(x), torch.nn.functional.layer_norm(x, (4096,)))
        out["apex"] = {"status": "pass" if err < 1e-5 else "fail", "rel_err": err}
    out["transformer_engine"] = te_check(torch, dev)
    return out


def te_check(torch, dev, tokens=2048, hidden=4096, features=4096) -> dict:
    """te.Linear, te.LayerNormLinear and te.DotProductAttention in bf16, forward and backward,
    against fp32 PyTorch on the same bf16 values (LayerNorm gamma/beta and the bias
    non-trivial, so their gradients count). rel err < 1e-2 for every output and gradient (bf16
    keeps 8 bits: 3.9e-3 a value), 2e-2 for attention's gradients (as flash-attn's check).

    DotProductAttention is called as Megatron's TE layers call it, TE choosing its backend (on
    Hopper: cuDNN's fused attention): an H100 node whose TE Linear passed raised
    CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED there, so a training step could not have run. A
    call that raises fails the check with the error's first line.

    Absent is a skip; installed but not importing is a failure: `import transformer_engine`
    swallows the PyTorch part's ImportError, so the PyTorch part itself is imported."""
    import importlib.util
    import math

    if importlib.util.find_spec("transformer_engine") is None:
        return {"status": "skip", "why": "transformer_engine not installed"}
    try:
        import transformer_engine
        import transformer_engine.pytorch as te
    except Exception as e:  # noqa: BLE001 - installed but broken: the failure says how
        return {"status": "fail", "why": f"transformer_engine.pytorch does not import: "
                                         f"{type(e).__name__}: {e}"}
    F, bf16 = torch.nn.functional, torch.bfloat16
    torch.manual_seed(0)
    errs = {}

    def compare(name, module, ref_fn, params):
        x = torch.randn(tokens, hidden, device=dev, dtype=bf16, requires_grad=True)
        dy = torch.randn(tokens, features, device=dev, dtype=bf16)
        y = module(x)
        grads = torch.autograd.grad(y, [x, *params], dy)
        x32 = x.detach().float().requires_grad_()
        p32 = [q.detach().float().requires_grad_() for q in params]
        y32 = ref_fn(x32, *p32)
        refs = torch.autograd.grad(y32, [x32, *p32], dy.float())
        errs[f"{name}.out"] = rel_err(torch, y, y32)
        for label, g, r in zip(["dgrad", *(f"grad{i}" for i in range(len(params)))], grads, refs,
                               strict=True):
            errs[f"{name}.{label}"] = rel_err(torch, g, r)

    lin = te.Linear(hidden, features, bias=True, params_dtype=bf16, device=dev)
    lnl = te.LayerNormLinear(hidden, features, eps=1e-5, bias=True, params_dtype=bf16,
                             device=dev)
    with torch.no_grad():
        lin.bias.copy_(0.1 * torch.randn(features, device=dev))
        lnl.layer_norm_weight.copy_(1 + 0.1 * torch.randn(hidden, device=dev))
        lnl.layer_norm_bias.copy_(0.1 * torch.randn(hidden, device=dev))
        lnl.bias.copy_(0.1 * torch.randn(features, device=dev))
    compare("Linear", lin, F.linear, [lin.weight, lin.bias])
    compare("LayerNormLinear", lnl,
            lambda x, g, b, w, c: F.linear(F.layer_norm(x, (hidden,), g, b, 1e-5), w, c),
            [lnl.layer_norm_weight, lnl.layer_norm_bias, lnl.weight, lnl.bias])
    version = getattr(transformer_engine, "__version__", None)
    for what, call in (("torch's own cuDNN, with TE imported,", torch_cudnn),
                       ("DotProductAttention", te_attention)):
        try:
            call(torch, te, dev, errs)
        except Exception as e:  # noqa: BLE001 - the kernel cannot run: said with its first line
            return {"status": "fail", "version": version, "errors": errs,
                    "why": f"{what} raised {type(e).__name__}: "
                           f"{(str(e).strip().splitlines() or [''])[0]}"}
    # NaN compares false with any tolerance: a non-finite error is a failure, named as such
    finite = all(math.isfinite(e) for e in errs.values())
    within = all(e < (2e-2 if k.startswith("DotProductAttention.d") else 1e-2)
                 for k, e in errs.items())
    return {"status": "pass" if finite and within else "fail", "version": version,
            "rel_err": max(e for k, e in errs.items() if k.endswith(".out")),
            "grad_rel_err": max(e for k, e in errs.items() if not k.endswith(".out")),
            "errors": errs, "finite": finite}


def torch_cudnn(torch, te, dev, errs) -> None:
    """torch's own cuDNN once TE is imported: its version check, and on a GPU one cuDNN SDPA
    call. TE loads a cuDNN of its own choosing RTLD_GLOBAL; where that is another copy than
    torch's (a system libcudnn9 beside the nvidia-cudnn wheel), torch's check raised "compiled
    against (9, 19, 0) but found runtime version (9, 14, 0)" on an H100 node
    (bench/results/2026-12-06-h100-te-cudnn) while TE's own calls passed."""
    torch.backends.cudnn.version()  # raises on a mismatch
    attention = getattr(torch.nn, "attention", None)
    if dev.type != "cuda" or not hasattr(attention, "SDPBackend"):
        return
    q = torch.randn(1, 2, 128, 64, device=dev, dtype=torch.bfloat16)
    with attention.sdpa_kernel(attention.SDPBackend.CUDNN_ATTENTION):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


def te_attention(torch, te, dev, errs, batch=2, seq=256, heads=4, head_dim=128) -> None:
    """te.DotProductAttention (causal, bshd, bf16; head dim 128 as Megatron's GPT models) forward
    and backward against fp32 SDPA on the same values; its errors added to `errs`."""
    F, bf16 = torch.nn.functional, torch.bfloat16
    q, k, v = (torch.randn(batch, seq, heads, head_dim, device=dev, dtype=bf16,
                           requires_grad=True) for _ in range(3))
    m = te.DotProductAttention(heads, head_dim, attn_mask_type="causal", qkv_format="bshd")
    o = m(q, k, v)  # [batch, seq, heads * head_dim]
    dy = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), dy)
    q32, k32, v32 = (x.detach().float().transpose(1, 2).requires_grad_() for x in (q, k, v))
    ref = F.scaled_dot_product_attention(q32, k32, v32, is_causal=True).transpose(1, 2)
    refs = torch.autograd.grad(ref.reshape(o.shape), (q32, k32, v32), dy.float())
    errs["DotProductAttention.out"] = rel_err(torch, o, ref.reshape(o.shape))
    for label, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        errs[f"DotProductAttention.{label}"] = rel_err(torch, g, r.transpose(1, 2))


# cuDNN's own status in a kernel's error: the library failed inside the call, not the build's
# numbers; its debug log names the library (a sub-library cuDNN could not load, an engine)
CUDNN_FIX = ("cuDNN failed inside the call; a second cuDNN beside torch's (a system libcudnn9 "
             "package) is the usual cause: CUDNN_PATH=<site-packages>/nvidia/cudnn points TE at "
             "torch's (megatron-env's TE build does so itself), CUDNN_LOGERR_DBG=1 "
             "CUDNN_LOGDEST_DBG=stderr names the library that failed")


def judge(rep: dict) -> list[dict]:
    gpu = f"GPU{rep['index']} ({rep['name']})"
    model = next((k for k in EXPECTED if k in rep["name"]), None)
    fs = []
    if rep["gemm_rel_err"] > 1e-2:
        fs.append(finding("gpu.gemm", "fail", f"{gpu}: bf16 GEMM wrong (rel err "
                          f"{rep['gemm_rel_err']:.1e})", fix="drain the node; run dcgmi diag -r 3"))
    if model is None:
        fs.append(finding("gpu.speed", "skip", f"{gpu}: no expectation for this model; measured "
                          f"{rep['gemm_bf16_tflops']} TFLOP/s, {rep['copy_tbs']} TB/s"))
    else:
        want_tf, want_bw = EXPECTED[model]
        for what, got, want, unit in (("bf16 GEMM", rep["gemm_bf16_tflops"], want_tf, "TFLOP/s"),
                                      ("copy", rep["copy_tbs"], want_bw, "TB/s")):
            ratio = got / want
            status = "pass" if ratio >= WARN else "warn" if ratio >= FAIL else "fail"
            fs.append(finding("gpu.speed", status, f"{gpu}: {what} {got} {unit} "
                              f"({ratio:.0%} of {want} for {model})",
                              fix="" if status == "pass" else
                              "check clocks and throttling (invoke check: gpu.throttle)"))
    if (att := rep.get("attention")) and att.get("fastest"):
        fs.append(attention_finding(gpu, att))
    for name, k in rep["kernels"].items():
        if k["status"] == "skip":
            fs.append(finding(f"kernel.{name}", "skip", f"{gpu}: {name}: {k['why']}"))
            continue
        if "rel_err" not in k:  # it could not even run
            fs.append(finding(f"kernel.{name}", "fail", f"{gpu}: {name}: {k['why']}",
                              fix=CUDNN_FIX if "cudnn" in k["why"].lower() else
                              f"rebuild and reinstall {name} (invoke build)"))
            continue
        errs = f"rel err {k['rel_err']:.1e}" + (
            f", gradients {k['grad_rel_err']:.1e}" if "grad_rel_err" in k else "")
        if k["status"] == "pass":
            fs.append(finding(f"kernel.{name}", "pass", f"{gpu}: {name} matches PyTorch ({errs})"))
        else:
            fs.append(finding(f"kernel.{name}", "fail",
                              f"{gpu}: {name} differs from PyTorch ({errs})",
                              fix=f"rebuild {name} for this GPU's arch (invoke build)"))
    return fs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=8192, help="GEMM edge (default 8192)")
    p.add_argument("--out", default="runs/gpu_health")
    p.add_argument("--head-dims", default="128",
                   help="attention head dims to time, comma-separated (the profile's)")
    p.add_argument("--no-attention", action="store_true", help="leave the attention timing out")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"findings": [finding("gpu.present", "fail", "no CUDA GPU visible to "
                                               "torch", fix="run on a GPU node")]}))
        return 1
    local = os.environ.get("LOCAL_RANK")
    indices = [int(local)] if local is not None else list(range(torch.cuda.device_count()))
    head_dims = tuple(int(x) for x in args.head_dims.split(",") if x)
    reports = [gpu_report(torch, i, args.size, head_dims, not args.no_attention)
               for i in indices]
    findings = [f for r in reports for f in judge(r)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = f"-rank{local}" if local is not None else ""
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
           "cuda": torch.version.cuda, "gpus": reports, "findings": findings}
    (out / f"results{suffix}.json").write_text(json.dumps(doc, indent=2) + "\n")
    for r in reports:
        print(f"GPU{r['index']} {r['name']}: bf16 GEMM {r['gemm_bf16_tflops']} TFLOP/s, "
              f"copy {r['copy_tbs']} TB/s, kernels "
              + ", ".join(f"{k}={v['status']}" for k, v in r["kernels"].items()))
        if a := r.get("attention"):
            print(f"GPU{r['index']} attention (head dim {a['head_dims'][0]}, causal bf16, fwd+bwd, "
                  "TFLOP/s): " + ", ".join(f"{k} {v}" for k, v in sorted(
                      a["backends"].items(), key=lambda kv: -kv[1]))
                  + f"; fastest {a['fastest']}")
    for f in findings:
        print(f"{f['id']:<18} {f['status']:<5} {f['summary']}")
    failed = any(f["status"] == "fail" for f in findings)
    print(f"gpu_health: {'fail' if failed else 'pass'}; {len(reports)} GPU(s); "
          f"results in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
