"""The environment probe: what an interpreter has, asked of that interpreter itself.

Every question about an environment (its distributions, torch and its CUDA, NCCL and cuDNN,
whether compiled modules import, which GPUs it sees) is answered by running a short program in
it, never by reading files from outside: an adopted container or a venv on another node answers
the same way.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from megatron_env import proc
from megatron_env.errors import UserError

# Both probes end the same way: each module named on the command line imported, its file or
# the error recorded, and the result printed.
_IMPORT_NAMED = r"""
import importlib
for name in sys.argv[1:]:
    try:
        out["imported"][name] = getattr(importlib.import_module(name), "__file__", None)
    except Exception as e:
        out["errors"].append("import %s: %s: %s" % (name, type(e).__name__, e))
print(json.dumps(out))
"""

_PROBE = r"""
import json, os, site, sys, sysconfig
from importlib import metadata
sites = set(site.getsitepackages()) | {sysconfig.get_path(k) for k in ("purelib", "platlib")}
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable,
       "dists": {}, "errors": [], "platlib": sysconfig.get_path("platlib"),
       "sites": sorted(p for p in sites if os.path.isdir(p))}
for d in metadata.distributions():
    name = (d.metadata["Name"] or "").lower().replace("_", "-")
    if name:
        out["dists"][name] = d.version
out["imported"] = {}
if "--no-torch" in sys.argv:
    print(json.dumps(out))
    raise SystemExit(0)
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cxx11_abi"] = int(torch._C._GLIBCXX_USE_CXX11_ABI)  # with cache_tag: a kernel cache key
    out["cache_tag"] = sys.implementation.cache_tag
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:
        out["errors"].append("torch.cuda.nccl.version(): %s" % e)
    try:
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception as e:
        out["errors"].append("torch.backends.cudnn.version(): %s" % e)
except Exception as e:
    out["errors"].append("import torch: %s: %s" % (type(e).__name__, e))
""" + _IMPORT_NAMED

# The same facts from files alone, for `invoke report` (importing torch takes 10-30 s): torch's
# version and CUDA from torch/version.py, its C++ ABI from TorchConfig.cmake, NCCL and cuDNN
# from the nvidia-* wheels it depends on, and where each named module's file is (found by path,
# never imported: importing `a.b` runs `a/__init__.py`, which imports torch).
_METADATA = r"""
import importlib.machinery, json, os, re, site, sys, sysconfig
from importlib import metadata
sites = set(site.getsitepackages()) | {sysconfig.get_path(k) for k in ("purelib", "platlib")}
sites = sorted(p for p in sites if os.path.isdir(p))
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable, "dists": {},
       "errors": [], "platlib": sysconfig.get_path("platlib"), "sites": sites, "found": {},
       "cache_tag": sys.implementation.cache_tag}
for d in metadata.distributions():
    name = (d.metadata["Name"] or "").lower().replace("_", "-")
    if name:
        out["dists"][name] = d.version
def read(path):
    try:
        with open(path) as f:
            return f.read(1 << 20)
    except OSError:
        return ""
for root in sites:
    text = read(os.path.join(root, "torch", "version.py"))
    if text:
        v = re.search(r"^__version__\s*=\s*[\x27\x22]([^\x27\x22]+)", text, re.M)
        c = re.search(r"^cuda\s*(?::\s*\S+\s*)?=\s*[\x27\x22]?([\w.]+)", text, re.M)
        out["torch"] = v.group(1) if v else out["dists"].get("torch")
        out["torch_cuda"] = None if not c or c.group(1) == "None" else c.group(1)
        cmake = read(os.path.join(root, "torch", "share", "cmake", "Torch", "TorchConfig.cmake"))
        abi = re.search(r"_GLIBCXX_USE_CXX11_ABI=(\d)", cmake)
        out["cxx11_abi"] = int(abi.group(1)) if abi else None
        break
for dist, key in (("nvidia-nccl-cu", "nccl"), ("nvidia-cudnn-cu", "cudnn")):
    hit = [v for n, v in out["dists"].items() if n.startswith(dist)]
    out[key] = hit[0] if hit else None
suffixes = importlib.machinery.all_suffixes()
for name in sys.argv[1:]:
    parts = name.split(".")
    for root in sites:
        base = os.path.join(root, *parts)
        hits = [base + s for s in suffixes if os.path.isfile(base + s)]
        if os.path.isfile(os.path.join(base, "__init__.py")):
            hits.append(os.path.join(base, "__init__.py"))
        if hits:
            out["found"][name] = hits[0]
            break
print(json.dumps(out))
"""


def _last_json(python: Path | str, r: proc.Result) -> dict[str, Any]:
    """The JSON object a probe prints as its last line; anything else (nothing printed, a
    line a site hook added after it) is one error naming the interpreter, not a traceback."""
    lines = r.stdout.strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise UserError(f"{python} ran the probe but printed no JSON object last: "
                        f"{(lines or ['nothing'])[-1][:200]!r}",
                        fix="check the interpreter's site hooks (sitecustomize, .pth files) for "
                            "output, or rebuild it with `invoke env`", kind="python.probe-output")
    return doc


def metadata(python: Path | str, *modules: str) -> dict[str, Any]:
    """What `python` has, read from its files without importing anything of it (see _METADATA):
    distributions, torch's version/CUDA/ABI, NCCL and cuDNN wheel versions, module files."""
    r = proc.run([str(python), "-I", "-c", _METADATA, *modules], timeout=120,
                 cwd=tempfile.gettempdir())
    if not r.ok:
        raise UserError(f"{python} does not run: {r.tail(5)}", fix="rebuild with `invoke env`",
                        kind="python.broken")
    return _last_json(python, r)


def probe(python: Path | str, *imports: str, torch: bool = True) -> dict[str, Any]:
    """What `python` has: distributions, its site-packages directories (where a manifest looks
    for RECORDs), and (unless torch=False) torch's facts and `imports`."""
    args = [*imports] if torch else ["--no-torch"]
    # run outside the checkout: "" on sys.path would show its own metadata as installed
    r = proc.run([str(python), "-c", _PROBE, *args], timeout=600, cwd=tempfile.gettempdir())
    if not r.ok:
        raise UserError(f"{python} does not run: {r.tail(5)}", fix="rebuild with `invoke env`",
                        kind="python.broken")
    return _last_json(python, r)


_SITES = r"""
import json, os, site, sysconfig
sites = set(site.getsitepackages()) | {sysconfig.get_path(k) for k in ("purelib", "platlib")}
print(json.dumps({"sites": sorted(p for p in sites if os.path.isdir(p))}))
"""


def sites(python: Path | str) -> list[str]:
    """`python`'s site-packages directories, as `probe` reports them, without reading every
    distribution's metadata (a few hundred files in a full image): a warm setup's Megatron
    re-check needs only where to look for one RECORD."""
    r = proc.run([str(python), "-c", _SITES], timeout=600, cwd=tempfile.gettempdir())
    if not r.ok:
        raise UserError(f"{python} does not run: {r.tail(5)}", fix="rebuild with `invoke env`",
                        kind="python.broken")
    found = _last_json(python, r).get("sites")
    if not isinstance(found, list) or not all(isinstance(x, str) for x in found):
        raise UserError(f"{python} ran the probe but printed no list of site directories",
                        fix="check the interpreter's site hooks (sitecustomize, .pth files)",
                        kind="python.probe-output")
    return found


def missing_modules(python: Path | str,
                    modules: tuple[str, ...] | list[str]) -> tuple[list[str], dict[str, Any]]:
    """(the modules that do not import, in the given order; the probe's facts)."""
    facts = probe(python, *modules)
    return [m for m in modules if m not in facts["imported"]], facts


_TORCH = ("import json, sys, sysconfig, torch; print(json.dumps({'torch': torch.__version__, "
          "'cuda': torch.version.cuda, 'abi': int(torch._C._GLIBCXX_USE_CXX11_ABI), "
          "'tag': sys.implementation.cache_tag, 'platlib': sysconfig.get_path('platlib')}))")


_IMPORTS = r"""
import json, sys
out = {"imported": {}, "errors": []}
try:
    import torch  # extensions need its libraries loaded first
except Exception as e:
    out["errors"].append("import torch: %s: %s" % (type(e).__name__, e))
""" + _IMPORT_NAMED


def imports(python: Path | str,
            modules: tuple[str, ...] | list[str]) -> tuple[list[str], dict[str, Any]]:
    """(the modules that do not import, in order; {imported, errors}): one interpreter that
    imports torch and the modules and nothing else (no distribution listing, no cuDNN or NCCL
    query): what a kernel's install check needs, in the time of one torch import."""
    r = proc.run([str(python), "-c", _IMPORTS, *modules], timeout=600,
                 cwd=tempfile.gettempdir())
    if not r.ok:
        raise UserError(f"{python} does not run: {r.tail(5)}", fix="rebuild with `invoke env`",
                        kind="python.broken")
    facts = _last_json(python, r)
    return [m for m in modules if m not in facts["imported"]], facts


_STAMP = r"""
import glob, json, os, sys, sysconfig
from importlib import util
spec = util.find_spec("torch")
root = os.path.dirname(spec.origin) if spec and spec.origin else None
ns = {}
if root and os.path.exists(os.path.join(root, "version.py")):
    with open(os.path.join(root, "version.py")) as f:
        exec(f.read(), ns)
lib = sorted(glob.glob(os.path.join(root or "/nonexistent", "_C.*.so")))
st = os.stat(lib[0]) if lib else None
print(json.dumps({"torch": ns.get("__version__"), "cuda": ns.get("cuda"),
                  "tag": sys.implementation.cache_tag, "platlib": sysconfig.get_path("platlib"),
                  "stamp": [lib[0], st.st_size, st.st_mtime_ns] if st else None}))
"""


def torch_stamp(python: Path) -> dict[str, Any]:
    """torch's version, CUDA, the Python tag and platlib read from files, without importing
    torch (50 ms instead of seconds), and `stamp`: the path, size and mtime of torch's _C
    extension, which changes whenever torch does (None when torch is not found): a key under
    which torch_facts' C++ ABI can be remembered."""
    r = proc.run([python, "-c", _STAMP], timeout=120, cwd="/")
    if not r.ok:
        raise UserError(f"{python} does not run: {r.tail(3)}",
                        fix="build the environment first (`invoke env`)", kind="python.broken")
    return _last_json(python, r)


def torch_facts(python: Path) -> dict[str, Any]:
    """What a compiled extension depends on: torch's version, its CUDA, C++ ABI, the Python tag."""
    r = proc.run([python, "-c", _TORCH], timeout=300, cwd="/")
    if not r.ok:
        raise UserError(f"{python} cannot import torch: {r.tail(3)}",
                        fix="build the environment first (`invoke env`)",
                        kind="torch.import-failed")
    return _last_json(python, r)


def native_archs(python: Path) -> list[str]:
    """The compute capabilities of the GPUs this environment sees (--arch native)."""
    r = proc.run([python, "-c", "import torch; print(' '.join(sorted({'%d.%d' % "
                  "torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())"
                  "})))"], timeout=300, cwd="/")
    archs = r.stdout.split() if r.ok else []
    if not archs:
        raise UserError("--arch native: no GPU visible to torch here",
                        fix="name the archs (--arch 9.0) or build on a GPU node",
                        kind="build.no-gpu")
    return archs
