"""The kernel build pipeline on a real CUDA extension: nvcc from the toolkit that matches torch's
CUDA major version, the arch list reaching nvcc, ninja's per-object log kept in the cache.

One tiny kernel for one arch (sm_90), so it compiles in seconds; no GPU is needed to compile,
and the import check after install needs none either. Skipped only where no CUDA toolkit of
torch's major version is installed.
"""

import hashlib
import json
import subprocess
import textwrap

import pytest

from megatron_env.errors import UserError
from megatron_env.kernels import build
from megatron_env.kernels.toolkit import cuda_home
from megatron_env.pyenv import uv
from megatron_env.recipes import recipe
from tests.test_build import make_sdist, venv_seeing_torch

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

KERNEL = textwrap.dedent("""\
    __global__ void add_one(float *x, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) x[i] += 1.0f;
    }
    void launch_add_one(float *x, int n) { add_one<<<(n + 255) / 256, 256>>>(x, n); }
    """)
# pybind11 and c10's TORCH_CHECK rather than torch/extension.h, as tests/test_build.py: the
# machinery under test (torch's BuildExtension with nvcc, its flags and libraries) is the same,
# and the host file compiles in seconds instead of most of a minute parsing every torch header.
# The kernel takes the address of a CUDA float tensor's data (`add_one_(x.data_ptr(), n)`).
BINDING = textwrap.dedent("""\
    #include <pybind11/pybind11.h>
    #include <c10/util/Exception.h>
    #include <cstdint>
    void launch_add_one(float *x, int n);
    void add_one_(std::uintptr_t x, int n) {
      TORCH_CHECK(x != 0 && n >= 0, "a CUDA float tensor's data_ptr() and its numel()");
      launch_add_one(reinterpret_cast<float *>(x), n);
    }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_one_", &add_one_); }
    """)
SETUP = textwrap.dedent("""\
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension
    setup(name="tinycuda", version="1.0", packages=["tinycuda"],
          ext_modules=[CUDAExtension("tinycuda._C", ["csrc/bind.cpp", "csrc/add_one.cu"])],
          cmdclass={"build_ext": BuildExtension})
    """)


def cubin_archs(binary: bytes) -> list[int]:
    """The SM numbers of the device ELFs (e_machine 190, EM_CUDA) embedded in a shared library
    (cuobjdump --list-elf, without cuobjdump: a minimal toolkit has none). The SM number sits in
    e_flags bits 0-7 in the old CUDA ELF ABI and in bits 8-15 in the one nvcc 13 writes."""
    found = []
    at = 0
    while (at := binary.find(b"\x7fELF", at + 1)) != -1:
        if int.from_bytes(binary[at + 18:at + 20], "little") != 190:
            continue
        flags = int.from_bytes(binary[at + 48:at + 52], "little")
        found += [sm for sm in (flags & 0xFF, (flags >> 8) & 0xFF) if sm >= 50]
    return sorted(found)


@pytest.fixture(scope="module")
def toolkit():
    try:
        home, release = cuda_home(torch.version.cuda)
    except UserError as e:
        pytest.skip(f"no CUDA toolkit for torch's CUDA {torch.version.cuda} here: {e.message}")
    return home, release


@pytest.fixture(scope="module")
def cuda_world(tmp_path_factory, toolkit):
    root = tmp_path_factory.mktemp("cuda-build")
    sdist = make_sdist(root, "tinycuda-1.0", {"csrc/add_one.cu": KERNEL, "csrc/bind.cpp": BINDING,
                                              "tinycuda/__init__.py": "", "setup.py": SETUP})
    python = venv_seeing_torch(root / "venv")
    # ninja in the environment, as the profiles have it: torch builds through it, and leaves
    # the .ninja_log this test reads
    subprocess.run([uv.exe(), "pip", "install", "-q", "--python", python, "ninja"], check=True)
    return {"root": root, "sdist": sdist, "python": python,
            "sha": hashlib.sha256(sdist.read_bytes()).hexdigest()}


def test_cuda_extension_builds_for_the_chosen_arch_with_the_matching_toolkit(
        cuda_world, toolkit, tmp_path, monkeypatch):
    home, _release = toolkit
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{cuda_world['python'].parent}:/usr/bin:/bin")  # no nvcc on PATH
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    pkg = recipe.Package("tinycuda", "1.0", recipe.Source(sha256=cuda_world["sha"],
                                                          url=str(cuda_world["sdist"])),
                        modules=("tinycuda._C",), cuda=True, gb_per_job=1.0)
    said: list[str] = []
    res = build.build_and_install(pkg, cuda_world["python"], ["9.0"],
                                  patch_root=tmp_path / "no-patches", echo=said.append)
    flags = next(s for s in said if s.strip().startswith("flags"))
    assert f"CUDA_HOME={home}" in flags and "TORCH_CUDA_ARCH_LIST=9.0" in flags
    assert "tinycuda._C" in res.modules and not res.cache_hit
    log = res.log.read_text()
    assert f"{home}/bin/nvcc" in log  # the toolkit found without PATH or CUDA_HOME
    assert "arch=compute_90,code=sm_90" in log and "sm_80" not in log

    # the wheel carries device code for sm_90 and for nothing else
    slot = res.wheel.parent
    unpacked = tmp_path / "whl"
    subprocess.run([cuda_world["python"], "-m", "zipfile", "-e", res.wheel, unpacked], check=True)
    so = next(unpacked.glob("tinycuda/_C*.so"))
    assert cubin_archs(so.read_bytes()) == [90]

    # ninja's per-object timings outlive the build tree
    meta = json.loads((slot / "meta.json").read_text())
    assert meta["ninja"]["steps"] == 2 and meta["ninja"]["peak_parallel"] >= 1
    slowest = {s["output"] for s in meta["ninja"]["slowest"]}
    assert slowest == {"csrc/add_one.o", "csrc/bind.o"}, slowest
    assert list((slot / "ninja-logs").glob("*.ninja_log"))
