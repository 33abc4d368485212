"""The flash-attn variant patches on the real pinned sdists: they apply, setup.py keeps only the
chosen kernel sources and refuses unknown values, and the patched static_switch.h dispatches to
built kernels only, raising c10::Error (RuntimeError in Python) for the others.

The dispatch check compiles a small host program against the patched header, torch's c10 and
the sdist's own CUTLASS: each kernel is a template declared for every head dim and dtype but
defined only for the built ones, as flash.h and the kernel .cu files do. A branch that still
named a left-out kernel would fail to link, as flash_attn_2_cuda would fail to import.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from megatron_env import profile
from megatron_env.errors import UserError
from megatron_env.kernels import build, source_trees, toolkit
from megatron_env.sources import patches

from .conftest import cache_root

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

PINS = {"2.5.8": "core_v0.4.0-cu121", "2.8.3": "core_v0.19.0-cu130"}
HDIMS = {"2.5.8": (32, 64, 96, 128, 160, 192, 224, 256), "2.8.3": (32, 64, 96, 128, 192, 256)}
PATCH_NAME = "build-only-chosen-head-dims-and-dtypes"

PROGRAM = textwrap.dedent("""\
    #include <c10/util/Exception.h>
    #include <cutlass/numeric_types.h>
    #include <cstdio>
    #include <cstdlib>
    #include <cstring>
    #include "static_switch.h"

    template <typename T, int D> void kernel();  // defined below for the built kernels only
    %(definitions)s

    void dispatch(bool bf16, int d) {
      FP16_SWITCH(!bf16, [&] { HEADDIM_SWITCH(d, [&] { kernel<elem_type, kHeadDim>(); }); });
    }

    int main(int argc, char **argv) {
      for (int i = 1; i + 1 < argc; i += 2) {
        try {
          dispatch(std::strcmp(argv[i], "bf16") == 0, std::atoi(argv[i + 1]));
        } catch (const c10::Error &e) {
          std::printf("error %%s\\n", e.what_without_backtrace());
        }
      }
    }
    """)


@pytest.fixture(scope="module", params=sorted(PINS))
def patched(request, tmp_path_factory):
    """(version, source tree with the series applied) for each pinned flash-attn."""
    version = request.param
    root = tmp_path_factory.mktemp(f"fa-{version}")
    pkg = build.packages(profile.load(PINS[version]))["flash-attn"]
    with pytest.MonkeyPatch.context() as mp:  # the sdist is fetched and hash-checked for real
        # into the test runs' cache: fetched once per machine, checked by sha256 every run
        mp.setenv(build.CACHE_DIR_ENV, str(cache_root() / "kernel-cache"))
        pristine = source_trees.fetch(pkg, echo=lambda *_: None)
    series = patches.series("flash-attn", version)
    assert any(PATCH_NAME in p.name for p in series)
    tree = root / "src"
    patches.apply_series(pristine, tree, series)
    return version, tree


def setup_functions(tree: Path, env: dict[str, str]) -> dict:
    """The patch's kernel_* functions and KERNEL_* tables, taken from the patched setup.py
    (running setup.py itself would start a build)."""
    module = ast.parse((tree / "setup.py").read_text())
    keep = [n for n in module.body
            if (isinstance(n, ast.FunctionDef) and n.name.startswith("kernel_"))
            or (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "").startswith("KERNEL_"))]
    fake_os = type("os", (), {"getenv": staticmethod(lambda k, d=None: env.get(k, d))})
    ns: dict = {"os": fake_os, "re": re}
    exec(compile(ast.Module(keep, []), "setup.py", "exec"), ns)  # noqa: S102
    return ns


def kernel_sources_of(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in (tree / "csrc/flash_attn/src").glob("*.cu"))


def test_setup_keeps_the_chosen_kernels_and_refuses_unknown_values(patched):
    version, tree = patched
    every = kernel_sources_of(tree) + ["csrc/flash_attn/flash_api.cpp"]
    ns = setup_functions(tree, {"FLASH_ATTN_HDIMS": "128", "FLASH_ATTN_DTYPES": "bf16"})
    kept = ns["kernel_sources"](every)
    assert "csrc/flash_attn/flash_api.cpp" in kept
    assert kept and all("hdim128_bf16" in s for s in kept if s.endswith(".cu"))
    per_variant = len([s for s in every if "hdim128_bf16" in s])
    assert len(kept) == per_variant + 1 and per_variant == (3 if version == "2.5.8" else 6)
    flags = ns["kernel_flags"]()
    assert "-DFLASH_ATTN_HDIM128=1" in flags and "-DFLASH_ATTN_HDIM64=0" in flags
    assert "-DFLASH_ATTN_BF16=1" in flags and "-DFLASH_ATTN_FP16=0" in flags
    # unset or "all": everything, as upstream
    everything = setup_functions(tree, {})["kernel_sources"](every)
    assert everything == every
    with pytest.raises(RuntimeError, match="FLASH_ATTN_HDIMS=100: 100 not buildable; choose "
                                           "from 32,64,96,128"):
        setup_functions(tree, {"FLASH_ATTN_HDIMS": "100"})["kernel_sources"](every)
    with pytest.raises(RuntimeError, match="FLASH_ATTN_DTYPES=fp8: fp8 not buildable"):
        setup_functions(tree, {"FLASH_ATTN_DTYPES": "fp8"})["kernel_flags"]()


def test_dispatch_reaches_built_kernels_and_raises_for_the_others(patched, tmp_path):
    version, tree = patched
    ns = setup_functions(tree, {"FLASH_ATTN_HDIMS": "64;128", "FLASH_ATTN_DTYPES": "bf16"})
    built = [(t, int(d)) for d in ns["kernel_variant"]()[0] for t in ns["kernel_variant"]()[1]]
    assert built == [("bf16", 64), ("bf16", 128)]
    cutlass_type = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t"}
    definitions = "\n".join(
        f'template <> void kernel<{cutlass_type[t]}, {d}>() {{ std::printf("ran {t} {d}\\n"); }}'
        for t, d in built)
    src = tmp_path / "dispatch.cpp"
    src.write_text(PROGRAM % {"definitions": definitions})
    torch_dir = Path(torch.__file__).parent
    try:  # CUTLASS's numeric types include the toolkit's vector_types.h
        cuda_home, _ = toolkit.cuda_home(torch.version.cuda)
    except UserError as e:
        pytest.skip(f"no CUDA toolkit here: {e}")
    exe = tmp_path / "dispatch"
    cxx = os.environ.get("CXX", "g++")
    r = subprocess.run([cxx, "-std=c++17", "-O0", *ns["kernel_flags"](),
                        f"-I{tree / 'csrc/flash_attn/src'}", f"-I{tree / 'csrc/cutlass/include'}",
                        f"-I{torch_dir / 'include'}", f"-I{cuda_home / 'include'}", str(src), "-o", str(exe),
                        f"-L{torch_dir / 'lib'}", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}",
                        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]  # no branch names a kernel that is not defined
    out = subprocess.run([str(exe), "bf16", "128", "bf16", "120", "bf16", "64", "bf16", "40",
                          "bf16", "32", "fp16", "128", "bf16", "256"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[:4] == ["ran bf16 128", "ran bf16 128", "ran bf16 64", "ran bf16 64"]
    assert out[4] == ("error flash-attn was built without its head dim 32 kernels, which "
                      "head_size 32 needs (this build has head dims 64 128; dtypes bf16): "
                      'add "32" to hdims under [kernels.flash-attn] in the profile (or ["all"]), '
                      "then run invoke build flash-attn")
    assert out[5] == ("error flash-attn was built without its fp16 kernels (this build has "
                      'head dims 64 128; dtypes bf16): add "fp16" to dtypes under [kernels.flash-attn] '
                      'in the profile (or ["all"]), then run invoke build flash-attn')
    assert out[6].startswith("error flash-attn was built without its head dim 256 kernels")
    assert len(out) == 7
