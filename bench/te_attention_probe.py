"""Why does TE's cuDNN fused attention fail with CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED?

    python bench/te_attention_probe.py --out DIR      (the environment's interpreter, on a GPU node)

Each step that imports torch runs in a fresh subprocess of this interpreter (120 s timeout), so a
failure or a preload cannot colour the next. DIR gets probe.json (also printed) and the raw text of
every step and of the system facts; the exit status is 0 whatever attention does. Per step: which
files TE's Python loader picked (transformer_engine.common._*_LIB_CTYPES), the CUDA libraries
mapped (/proc/self/maps), and the file each global-scope cuDNN symbol resolves to: TE builds
cudnn-frontend with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING and cudnn_dlhandle = nullptr, so its
backend calls are dlsym(RTLD_DEFAULT, ...), while torch binds them through its own DT_NEEDED.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

TIMEOUT = 120
LIBS = re.compile(r"libcudnn|libnvrtc|libcublas|libcudart|libcuda\.so")
SYMBOLS = ("cudnnBackendFinalize", "cudnnBackendCreateDescriptor", "cudnnGetVersion", "cudnnCreate",
           "nvrtcVersion")
ERRORS = re.compile(r"Unable to load|cannot open shared|SUBLIBRARY|VERSION_MISMATCH|Reason:|E! |"
                    r"Library configuration")
TE_BACKEND = re.compile(r"Available backends|Selected backend|No dot product attention")
B, S, H, D = 2, 512, 8, 128  # batch, seq, heads, head dim; bf16, causal
MARK = "PROBE-RESULT "


def site_dir() -> str:
    """The site-packages holding nvidia/: torch's, else sysconfig's (the one TE's loader reads)."""
    spec = importlib.util.find_spec("torch")
    dirs = [str(Path(spec.origin).parent.parent)] if spec and spec.origin else []
    dirs += [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    return next((d for d in dirs if os.path.isdir(os.path.join(d, "nvidia"))), dirs[0])


SITE = site_dir()
NV = os.path.join(SITE, "nvidia")
NVRTC = sorted(p for d in ("cu13", "cuda_nvrtc") for p in glob.glob(
    os.path.join(NV, d, "lib", "libnvrtc*.so.*[0-9]")) if ".alt." not in p)
# name, what it tests, extra environment, libraries preloaded RTLD_GLOBAL after `import torch`,
# steps in order ("import_te"; "te": TE fused attention fwd+bwd; "sdpa": torch's cuDNN SDPA)
CASES = [
    ("sdpa_cudnn", "control: torch's own cuDNN SDPA alone", {}, [], ["sdpa"]),
    ("te", "TE as installed, then torch's SDPA in the same process", {}, [], ["te", "sdpa"]),
    ("te_ld_debug", "TE as installed under LD_DEBUG=libs: which cuDNN files are initialised",
     {"LD_DEBUG": "libs"}, [], ["te"]),
    ("sdpa_then_te", "gpu_health's order: import TE, torch's cuDNN SDPA, then TE", {}, [],
     ["import_te", "sdpa", "te"]),
    ("te_cudnn_path", "CUDNN_PATH=<site>/nvidia/cudnn: TE's loader takes pip's libcudnn.so.9",
     {"CUDNN_PATH": os.path.join(NV, "cudnn")}, [], ["te"]),
    ("te_preload_cudnn", "pip's libcudnn.so.9 RTLD_GLOBAL before TE: first in the global scope",
     {}, [os.path.join(NV, "cudnn", "lib", "libcudnn.so.9")], ["te"]),
    ("te_preload_nvrtc", "pip's libnvrtc and nvrtc-builtins RTLD_GLOBAL before TE", {}, NVRTC,
     ["te"]),
    ("te_ld_library_path", "LD_LIBRARY_PATH starts with nvidia/cudnn/lib and nvidia/cu13/lib",
     {"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [
         os.path.join(NV, "cudnn", "lib"), os.path.join(NV, "cu13", "lib"),
         os.environ.get("LD_LIBRARY_PATH")]))}, [], ["te"]),
]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:600] if text else ''}"


# ---- in a child process -----------------------------------------------------------------------
def mapped() -> list[str]:
    """Distinct paths of the CUDA/cuDNN libraries mapped in this process, in map order."""
    with open("/proc/self/maps") as f:
        paths = [parts[5].strip() for parts in (ln.split(None, 5) for ln in f) if len(parts) == 6]
    return list(dict.fromkeys(p for p in paths if LIBS.search(os.path.basename(p))))


def global_owners() -> dict:
    """The file each symbol resolves to in the global scope (what dlsym(RTLD_DEFAULT) finds
    first; None: not there, so TE's lookup falls back to its own DT_NEEDED libraries)."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

    main = ctypes.CDLL(None)
    dladdr = getattr(main, "dladdr", None) or ctypes.CDLL("libdl.so.2").dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    out: dict = {}
    for sym in SYMBOLS:
        fn, info = getattr(main, sym, None), DlInfo()
        if fn is not None:
            dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info))
        out[sym] = fn and (info.fname or b"?").decode()
    if out["cudnnGetVersion"]:
        main.cudnnGetVersion.restype = ctypes.c_size_t
        out["global cudnnGetVersion()"] = int(main.cudnnGetVersion())
    return out


def import_te(res: dict) -> bool:
    """Import TE's PyTorch part; record its version, what its loader picked, maps and symbols."""
    try:
        import transformer_engine
        import transformer_engine.common as tec
        import transformer_engine.pytorch  # noqa: F401 - loads libtransformer_engine
    except Exception as exc:  # noqa: BLE001 - missing or broken: the JSON says which
        res["import_te"] = {"ok": False, "error": first_line(exc)}
        return False
    res["te_version"] = getattr(transformer_engine, "__version__", None)
    res["te_loader"] = {n: [getattr(x, "_name", repr(x)) for x in (v if isinstance(v, (
        list, tuple)) else [v])] for n, v in vars(tec).items() if n.endswith("_LIB_CTYPES")}
    res["maps_after_te_import"], res["global_after_te_import"] = mapped(), global_owners()
    return True


def attend(torch, step: str) -> dict:
    """One causal bf16 attention forward + backward: "te" (TE's DotProductAttention, the fused
    cuDNN backend forced by NVTE_* in the environment) or "sdpa" (torch's own cuDNN SDPA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    shape = (B, S, H, D) if step == "te" else (B, H, S, D)
    qkv = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3)]
    if step == "te":
        import transformer_engine.pytorch as te
        te.DotProductAttention(H, D, attn_mask_type="causal", qkv_format="bshd")(
            *qkv).float().sum().backward()
    else:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(
                *qkv, is_causal=True).float().sum().backward()
    torch.cuda.synchronize()
    return {"grad_finite": bool(torch.isfinite(qkv[0].grad).all())}


def child(steps: list[str]) -> dict:
    import ctypes

    import torch
    res: dict = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    for path in filter(None, os.environ.get("PROBE_PRELOAD", "").split(os.pathsep)):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            res.setdefault("preloaded", []).append(path)
        except OSError as exc:
            res.setdefault("preload_errors", []).append(first_line(exc))
    res["maps_after_torch"] = mapped()
    te_ok = None
    for step in steps:
        if step in ("import_te", "te") and te_ok is None:
            te_ok = import_te(res)
        if step == "import_te":
            continue
        t0 = time.time()
        if step == "te" and not te_ok:
            res[step] = {"ok": None, "error": "transformer_engine.pytorch does not import"}
        elif not torch.cuda.is_available():
            res[step] = {"ok": None, "error": "no GPU (torch.cuda.is_available() is False)"}
        else:
            try:
                res[step] = {"ok": True, **attend(torch, step)}
            except Exception as exc:  # noqa: BLE001 - the failure is the finding
                res[step] = {"ok": False, "error": first_line(exc)}
        res[step]["seconds"] = round(time.time() - t0, 2)
    res["maps_at_end"], res["global_at_end"] = mapped(), global_owners()
    # last: asking torch for its cuDNN version loads libcudnn_graph, which must not precede TE
    res["cudnn_torch"] = torch.backends.cudnn.version()
    res["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return res


# ---- in the parent ----------------------------------------------------------------------------
def sh(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT)
        return p.stdout + p.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"<{cmd[0]}: {exc}>"


def system_facts(out: Path) -> dict:
    """Library files in site-packages and on the system, the loader cache, packages and TE's own
    linkage (readelf -d, ldd); raw text into out/system.txt and out/ldconfig.txt."""
    ldconfig = sh([shutil.which("ldconfig") or "/sbin/ldconfig", "-p"])
    (out / "ldconfig.txt").write_text(ldconfig)
    dpkg = sh(["dpkg-query", "-W", "-f=${Package} ${Version}\n"])
    pats = (os.path.join(NV, "**", "lib*.so*"), "/usr/local/cuda*/lib64/*",
            "/usr/local/cuda*/targets/*/lib/*", "/usr/lib/x86_64-linux-gnu/*", "/usr/lib64/*")
    files = sorted({p for pat in pats for p in glob.glob(pat, recursive=True)
                    if LIBS.search(os.path.basename(p))})
    dists, claims = {}, {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or "?"
        if re.search(r"nvidia|torch|transformer", name, re.I):
            dists[name] = dist.version
            for f in dist.files or []:
                if re.search(r"cudnn.*\.so", str(f)):
                    claims.setdefault(str(f), []).append(name)
    spec = importlib.util.find_spec("transformer_engine")
    linkage = {p: sh(["readelf", "-d", p]) + sh(["ldd", p])
               for d in ((spec.submodule_search_locations or []) if spec else [])
               for p in glob.glob(os.path.join(d, "**", "*transformer_engine*.so"), recursive=True)}
    facts = {
        "site": SITE,
        "env": {k: v for k, v in os.environ.items()
                if re.match(r"(LD_|CUDA|CUDNN|NVRTC|NV_|NVTE_|NCCL_VERSION|PYTHONPATH)", k)},
        "lib_files": {p: os.path.realpath(p) if os.path.islink(p) else os.path.getsize(p)
                      for p in files},
        "ldconfig": [ln.strip() for ln in ldconfig.splitlines() if LIBS.search(ln)],
        "dpkg": [ln for ln in dpkg.splitlines() if re.search(r"cudnn|nvrtc|cublas|cudart", ln)],
        "pip": dists,
        "cudnn_files_claimed_by_several_dists": {f: d for f, d in claims.items() if len(d) > 1},
        "te_linkage": {p: [ln.strip() for ln in t.splitlines() if LIBS.search(ln) or "PATH" in ln]
                       for p, t in linkage.items()}}
    raw = [json.dumps(facts, indent=1), "# dpkg-query", dpkg]
    raw += [f"# readelf -d; ldd {p}\n{t}" for p, t in linkage.items()]
    (out / "system.txt").write_text("\n".join(raw))
    return facts


def run_case(out: Path, name: str, env: dict, preload: list[str], steps: list[str]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(steps)]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env={**os.environ, **env, "PROBE_PRELOAD": os.pathsep.join(
            preload)}, capture_output=True, text=True, errors="replace", timeout=TIMEOUT)
        stdout, stderr, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as exc:
        stdout, stderr = (b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
                          for b in (exc.stdout, exc.stderr))
        rc = f"timeout after {TIMEOUT} s"
    (out / f"{name}.stdout.txt").write_text(stdout)
    (out / f"{name}.stderr.txt").write_text(stderr)
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
    res = json.loads(lines[-1][len(MARK):]) if lines else {
        "error": f"no result (rc {rc}); stderr tail: {stderr.strip()[-600:]}"}
    res.update(rc=rc, seconds=round(time.time() - t0, 1))
    err = stderr.splitlines()
    for key, pattern in (("stderr_errors", ERRORS), ("te_backend_lines", TE_BACKEND)):
        res[key] = list(dict.fromkeys(ln.strip()[:400] for ln in err if pattern.search(ln)))[:20]
    if "LD_DEBUG" in env:
        res["initialised"] = list(dict.fromkeys(ln.split("calling init:")[1].strip()
                                                for ln in err if "calling init:" in ln
                                                and re.search(r"cudnn|nvrtc", ln)))
    return res


def status(res: dict, step: str) -> str:
    r = res.get(step) or res.get("import_te")
    if r is None:  # the child died or timed out before reporting
        return f"NO RESULT: {res.get('error')}"
    return {True: "pass", None: f"not run: {r.get('error')}"}.get(r.get("ok"),
                                                                   f"FAIL: {r.get('error')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory for probe.json and the raw text")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(MARK + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    if not args.out:
        ap.error("--out is required")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"python": sys.executable,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "shape": dict(batch=B, seq=S, heads=H, head_dim=D, dtype="bf16", causal=True),
                    "system": system_facts(out)}
    report["facts"] = facts = run_case(out, "facts", {}, [], ["import_te"])
    log = {"CUDNN_LOGERR_DBG": "1", "CUDNN_LOGDEST_DBG": "stderr", "CUDNN_FRONTEND_LOG_INFO": "1",
           "CUDNN_FRONTEND_LOG_FILE": "stderr", "NVTE_DEBUG": "1", "NVTE_DEBUG_LEVEL": "2",
           "NVTE_FUSED_ATTN": "1", "NVTE_FLASH_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"}
    if (facts.get("cudnn_torch") or 0) >= 90000:  # CUDNN_LOGLEVEL_DBG exists since cuDNN 9.0
        log["CUDNN_LOGLEVEL_DBG"] = "2"
    report["log_env"], report["cases"] = log, {}
    for name, what, env, preload, steps in CASES:
        report["cases"][name] = {"tests": what, **run_case(out, name, {**log, **env}, preload,
                                                           steps)}
    te = report["cases"]["te"]
    report["summary"] = {
        "import_te": status(facts, "import_te") if "import_te" in facts else "pass",
        **{n: {s: status(report["cases"][n], s) for s in steps if s != "import_te"}
           for n, _, _, _, steps in CASES},
        "te_loader_cudnn": (te.get("te_loader") or {}).get("_CUDNN_LIB_CTYPES"),
        "global_cudnnBackendFinalize_after_te_import":
            (te.get("global_after_te_import") or {}).get("cudnnBackendFinalize"),
        "cudnn_files_mapped_after_te": [p for p in te.get("maps_at_end", []) if "libcudnn" in p]}
    text = json.dumps(report, indent=1)
    (out / "probe.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
