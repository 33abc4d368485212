"""The kernel build pipeline for real, on a small C++ torch extension package made here:
fetch and hash check, patches, derived flags, wheel, content-addressed cache, install, import."""

import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
from pathlib import Path

import pytest

from megatron_env import files, units
from megatron_env.kernels import build, progress, source_trees, toolkit
from megatron_env.pyenv import uv
from megatron_env.recipes import recipe

from .conftest import user_error

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

# pybind11 (from torch's include directory) and c10's TORCH_CHECK rather than torch/extension.h:
# the machinery under test is the same (torch's BuildExtension, its flags and libraries), and a
# compile takes seconds instead of a minute of parsing every torch header on two cores.
# fail_int is flash-attn's left-out kernel check: a TORCH_CHECK that formats an int. With a
# static libstdc++ inside the extension it crashed (H200) or lost the message; linked right it
# raises.
CPP = textwrap.dedent("""\
    #include <pybind11/pybind11.h>
    #include <c10/util/Exception.h>
    void fail_int(int v) { TORCH_CHECK(false, "built without head dim ", v, " kernels"); }
    int answer() { return 41; }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); m.def("fail_int", &fail_int); }
    """)
SETUP = textwrap.dedent("""\
    import os
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension
    ext = [CppExtension("tinyext._C", ["csrc/tiny.cpp"])] if os.environ.get("TINY_EXT") == "1" else []
    setup(name="tinyext", version="1.0", packages=["tinyext"], ext_modules=ext,
          cmdclass={"build_ext": BuildExtension})
    """)
PATCH = textwrap.dedent("""\
    Subject: the answer is 42

    Why: the test checks that the series reaches the compiled code.

    diff --git a/csrc/tiny.cpp b/csrc/tiny.cpp
    --- a/csrc/tiny.cpp
    +++ b/csrc/tiny.cpp
    @@ -1,5 +1,5 @@
     #include <pybind11/pybind11.h>
     #include <c10/util/Exception.h>
     void fail_int(int v) { TORCH_CHECK(false, "built without head dim ", v, " kernels"); }
    -int answer() { return 41; }
    +int answer() { return 42; }
     PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); m.def("fail_int", &fail_int); }
    """)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """An sdist, its sha256, a patch series, and a venv that sees this interpreter's torch."""
    root = tmp_path_factory.mktemp("build")
    sdist = make_sdist(root, "tinyext-1.0", {"csrc/tiny.cpp": CPP, "tinyext/__init__.py": "",
                                             "setup.py": SETUP})
    patches = root / "patches" / "tinyext" / "1.0"
    patches.mkdir(parents=True)
    (patches / "0001-answer-42.patch").write_text(PATCH)
    return {"root": root, "sdist": sdist, "sha": hashlib.sha256(sdist.read_bytes()).hexdigest(),
            "patches": root / "patches", "python": venv_seeing_torch(root / "venv")}


def make_sdist(root: Path, name: str, files: dict[str, str]) -> Path:
    """root/name.tar.gz holding `files` (relative path -> text) under name/."""
    src = root / name
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    sdist = root / f"{name}.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname=name)
    return sdist


def venv_seeing_torch(venv: Path) -> Path:
    """A venv with setuptools and wheel that also sees this interpreter's packages (torch),
    as a profile's environment would have torch: -> its python."""
    subprocess.run([uv.exe(), "venv", "-q", "--python", sys.executable, venv], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([uv.exe(), "pip", "install", "-q", "--python", venv / "bin" / "python",
                    "setuptools", "wheel"], check=True)
    return venv / "bin" / "python"


def package(world, sha=None):
    return recipe.Package("tinyext", "1.0", recipe.Source(sha256=sha or world["sha"],
                                                        url=str(world["sdist"])),
                         switches={"TINY_EXT": "1"}, modules=("tinyext._C",), cuda=False,
                         gb_per_job=1.0)


def answer(python):
    r = subprocess.run([python, "-c", "import torch, tinyext._C as c; print(c.answer())"],
                       capture_output=True, text=True, cwd="/")
    return r.stdout.strip()


def test_build_cache_install_verify_then_cache_hit_without_compiler(world, tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    said = []
    plan = build.build_and_install(package(world), world["python"], [], dry_run=True,
                                   patch_root=world["patches"], echo=said.append)
    assert isinstance(plan, build.Plan) and not list((tmp_path / "cache").glob("wheels/*"))
    assert any("0001-answer-42.patch" in s for s in said)
    assert any(s.strip().startswith("jobs     MAX_JOBS=") for s in said)
    res = build.build_and_install(package(world), world["python"], [],
                                  patch_root=world["patches"], echo=said.append)
    assert not res.cache_hit and res.build_seconds > 0 and res.log.exists()
    assert not list((tmp_path / "cache" / "build").iterdir())  # the build tree is gone
    meta = json.loads(next((tmp_path / "cache").glob("wheels/*/meta.json")).read_text())
    assert meta["max_jobs"] >= 1 and "GiB a job" in meta["why_jobs"]
    assert meta["key"]["source"] == f"sha256:{world['sha']}"  # what bundles select builds by
    assert "tinyext._C" in res.modules
    assert answer(world["python"]) == "42"  # the patch reached the compiled code
    # an int formatted into a TORCH_CHECK's message raises, whole, and the extension carries
    # no libstdc++ of its own (the H200's static copy: ~100 exported basic_ostream symbols)
    r = subprocess.run([world["python"], "-c", "import torch, tinyext._C as c; c.fail_int(64)"],
                       capture_output=True, text=True, cwd="/")
    assert r.returncode == 1 and "RuntimeError: built without head dim 64 kernels" in r.stderr, \
        (r.returncode, r.stderr[-2000:])
    from megatron_env.kernels import libstdcxx
    assert libstdcxx.own_copies(res.wheel) == {}
    # a second node (or run) with the same inputs: no compiler may run
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("PATH", "/usr/local/nocompiler:" + "/nonexistent")
    again = build.build_and_install(package(world), world["python"], [],
                                    patch_root=world["patches"], echo=said.append)
    assert again.cache_hit and again.build_seconds is None and again.log is None
    assert answer(world["python"]) == "42"
    assert any("cache hit" in s for s in said)
    # the same wheel is installed already: not rewritten (apex's 43 MB took seconds), and
    # torch's facts come from the cache (no torch import before the one import check)
    assert any("is installed already (same files)" in s for s in said), said
    assert list((tmp_path / "cache" / "facts").glob("*.json"))
    # a changed file of the installed package: reinstalled, not trusted
    so = next(Path(again.modules["tinyext._C"]).parent.glob("_C*.so"))
    so.write_bytes(so.read_bytes() + b"\0")
    said.clear()
    build.build_and_install(package(world), world["python"], [], patch_root=world["patches"],
                            echo=said.append)
    assert any("cache hit, installing" in s for s in said), said
    assert answer(world["python"]) == "42"


NODE = textwrap.dedent("""\
    import json, sys
    from pathlib import Path
    from megatron_env.kernels import build
    from megatron_env.recipes import recipe
    from megatron_env.pyenv import uv
    w = json.loads(sys.argv[1])
    pkg = recipe.Package("tinyext", "1.0", recipe.Source(sha256=w["sha"], url=w["sdist"]),
                        switches={"TINY_EXT": "1"}, modules=("tinyext._C",), cuda=False,
                        gb_per_job=1.0)
    r = build.build_and_install(pkg, Path(sys.argv[2]), [], patch_root=Path(w["patches"]))
    print("RESULT", "hit" if r.cache_hit else "built")
    """)


def test_two_nodes_building_the_same_key_at_once_compile_it_once(world, tmp_path):
    # Two processes (two nodes on a shared cache directory), each with its own environment,
    # start together: one compiles, the other waits for the lock and installs the cached wheel.
    pythons = [venv_seeing_torch(tmp_path / name) for name in ("node-a", "node-b")]
    w = json.dumps({k: str(world[k]) for k in ("sha", "sdist", "patches")})
    env = {**os.environ, build.CACHE_DIR_ENV: str(tmp_path / "cache"),
           "PYTHONPATH": str(Path(build.__file__).parent.parent)}
    nodes = [subprocess.Popen([sys.executable, "-c", NODE, w, py], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for py in pythons]
    outs = [p.communicate(timeout=600)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs
    results = sorted(line.split()[1] for out in outs for line in out.splitlines()
                     if line.startswith("RESULT"))
    assert results == ["built", "hit"], outs
    assert sum("another build of this key is running" in out for out in outs) == 1, outs
    assert len(list((tmp_path / "cache" / "logs").glob("*.log"))) == 1  # one compiler run
    assert [answer(py) for py in pythons] == ["42", "42"]


def test_compile_error_names_the_log_and_leaves_no_build_tree(world, tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    root = tmp_path / "patches"
    (root / "tinyext" / "1.0").mkdir(parents=True)
    # the error stands before any header, which the compiler then never parses
    (root / "tinyext" / "1.0" / "0001-typo.patch").write_text(PATCH.replace(
        "@@ -1,5 +1,5 @@\n #include <pybind11/pybind11.h>",
        "@@ -1,5 +1,6 @@\n+#include \"no_such_header.h\"\n #include <pybind11/pybind11.h>"))
    key = build.build_and_install(package(world), world["python"], [], dry_run=True,
                                  patch_root=root, echo=lambda *_: None).key
    # a killed build's leftovers on this host (its pid gone): provably dead, removed
    stale = tmp_path / "cache" / "build" / f"{key}.tmp-{files.host()}-999999-0123abcd"
    (stale / "csrc").mkdir(parents=True)
    with user_error("build.failed") as e:
        build.build_and_install(package(world), world["python"], [], patch_root=root,
                                echo=lambda *_: None)
    assert "tinyext" in e.value.message  # names the package
    log = Path(e.value.fix.removeprefix("full log: "))
    assert "error" in log.read_text()  # the compiler's own message is kept
    assert not list((tmp_path / "cache" / "build").iterdir())
    assert not list((tmp_path / "cache" / "wheels").glob("*/*.whl"))


def test_python_only_build_is_a_failure(world, tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    pkg = package(world)
    python_only = recipe.Package(pkg.name, pkg.pin, pkg.source, switches={}, modules=pkg.modules,
                                cuda=False, gb_per_job=1.0)  # the switch never arrives
    with user_error("build.python-only") as e:
        build.build_and_install(python_only, world["python"], [], patch_root=world["patches"],
                                echo=lambda *_: None)
    assert "tinyext" in e.value.message and "_C" in e.value.message  # names the missing module
    # a later run (after the fix) must build again, not install the crippled wheel from cache
    assert not list((tmp_path / "cache").glob("wheels/*/*.whl"))


def test_hash_mismatch_is_refused(world, tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    with user_error("source.sha256") as e:
        build.build_and_install(package(world, sha="0" * 64), world["python"], [],
                                patch_root=world["patches"], echo=lambda *_: None)
    assert world["sha"] in e.value.message and "0" * 64 in e.value.message  # both hashes
    assert not list((tmp_path / "cache").glob("sdists/*.tar.gz"))


def test_patch_that_does_not_apply_names_it_and_builds_nothing(world, tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    root = tmp_path / "patches"
    series = root / "tinyext" / "1.0"
    series.mkdir(parents=True)
    (series / "0001-answer-42.patch").write_text(PATCH)
    (series / "0002-stale.patch").write_text(PATCH.replace("41", "40"))
    with user_error("patch.apply") as e:
        build.build_and_install(package(world), world["python"], [], patch_root=root,
                                echo=lambda *_: None)
    assert all(w in e.value.message for w in ("0002-stale.patch", "csrc/tiny.cpp", "line 1"))
    assert not list((tmp_path / "cache").glob("wheels/*/*.whl"))
    # neither a patched tree (the series is applied once, before any build) nor a build tree
    assert not list((tmp_path / "cache").glob("patched/*")) + list(
        (tmp_path / "cache").glob("build/*"))


def test_git_source_with_a_moved_tag_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    work = tmp_path / "apex"
    work.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    (work / "setup.py").write_text("")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "one"]):
        subprocess.run([*git, *args], cwd=work, check=True)
    pinned = subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, capture_output=True,
                            text=True).stdout.strip()
    (work / "setup.py").write_text("# moved\n")
    subprocess.run([*git, "commit", "-qam", "two"], cwd=work, check=True)
    subprocess.run([*git, "tag", "25.09"], cwd=work, check=True)
    pkg = recipe.Package("apex", pinned, recipe.Source(repo=str(work), commit=pinned, tag="25.09"))
    with user_error("source.tag-moved") as e:
        source_trees.fetch(pkg, echo=lambda *_: None)
    assert "25.09" in e.value.message and pinned in e.value.message  # the tag and the pin
    ok = recipe.Package("apex", pinned, recipe.Source(repo=str(work), commit=pinned))
    tree = source_trees.fetch(ok, echo=lambda *_: None)
    assert (tree / "setup.py").read_text() == ""


def test_max_jobs_comes_from_memory_not_cores(monkeypatch):
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(build.resources, "memory", lambda: (40 * units.GIB, "free"))
    monkeypatch.setattr(build.resources, "cores", lambda: 64)
    assert build.max_jobs(9.0).max_jobs == 4  # 40 GiB / 9 GiB a job, not 64 cores
    assert build.max_jobs(3.0).max_jobs == 13
    monkeypatch.setattr(build.resources, "cores", lambda: 2)
    assert build.max_jobs(3.0).max_jobs == 2  # and never more than the cores
    monkeypatch.setattr(build.resources, "memory", lambda: (4 * units.GIB, "free"))
    assert build.max_jobs(9.0).max_jobs == 1  # at least one
    monkeypatch.setenv("MAX_JOBS", "7")
    assert (build.max_jobs(9.0).max_jobs, build.max_jobs(9.0).why) == (7, "MAX_JOBS set")


def test_profile_packages_derive_switches_and_modules():
    from megatron_env import profile

    pk = build.packages(profile.load("core_v0.4.0-cu121"))
    assert pk["flash-attn"].switches["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert pk["flash-attn"].switches["FLASH_ATTN_CUDA_ARCHS"] == "80;90"
    assert pk["flash-attn"].source.sha256 == (
        "2e5b2bcff6d5cff40d494af91ecd1eb3c5b4520a6ce7a0a8b1f9c1ed129fb402")
    assert pk["apex"].switches == {"APEX_CPP_EXT": "1", "APEX_CUDA_EXT": "1",
                                   "APEX_FAST_LAYER_NORM": "1", "TORCH_CUDA_ARCH_LIST": "8.0;9.0"}
    # what Megatron core_v0.4.0 imports from apex: the modules of the three variants it picks
    assert pk["apex"].modules == (
        "apex_C", "amp_C", "fused_layer_norm_cuda", "fused_weight_gradient_mlp_cuda",
        "scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda",
        "scaled_softmax_cuda", "fast_layer_norm")
    assert pk["flash-attn"].modules == ("flash_attn_2_cuda",)
    hopper = build.packages(profile.load("core_v0.4.0-cu121"), ["9.0"])["flash-attn"]
    assert hopper.switches["FLASH_ATTN_CUDA_ARCHS"] == "90"
    # memory a compile job needs grows with the archs nvcc compiles at once (NVCC_THREADS=2)
    assert (hopper.gb_per_job, pk["flash-attn"].gb_per_job) == (5.0, 10.0)


def test_cuda_home_skips_a_wrapper_script_and_refuses_a_major_mismatch(tmp_path, monkeypatch):
    # An nvcc that is a two-line wrapper in a bin/ without a toolkit around it (as in
    # /usr/local/bin/nvcc -> exec /usr/local/cuda-13.0/bin/nvcc) is no CUDA_HOME: its parent has
    # no include/cuda_runtime.h, and a build against it fails at the first #include.
    release = Path(__file__).parent / "fixtures" / "h200-live" / "nvcc-version.txt"
    kit, wrapper = tmp_path / "cuda-13.0", tmp_path / "local"
    for home in (kit, wrapper):
        (home / "bin").mkdir(parents=True)
    (kit / "include").mkdir()
    (kit / "include" / "cuda_runtime.h").write_text("")
    (kit / "bin" / "nvcc").write_text(f"#!/bin/sh\ncat '{release}'\n")
    (wrapper / "bin" / "nvcc").write_text(f"#!/bin/sh\nexec '{kit}/bin/nvcc' \"$@\"\n")
    for f in (kit / "bin" / "nvcc", wrapper / "bin" / "nvcc"):
        f.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(wrapper))
    monkeypatch.setenv("CUDA_PATH", str(kit))
    assert toolkit.cuda_home("13.0") == (kit, "13.0")
    with user_error("toolkit.missing") as e:
        toolkit.cuda_home("12.1")
    # each candidate with why it was not taken
    assert "local (no include/cuda_runtime.h)" in e.value.message
    assert "cuda-13.0 (nvcc 13.0)" in e.value.message


def test_time_left_guess_on_the_real_h200_flash_attn_progress():
    # `invoke build flash-attn` on an H200 (bench/results/2026-12-02-h200-1gpu/flash-attn):
    # the guess from each progress line against the time the build really took from there.
    text = (Path(__file__).parent / "fixtures" / "build-progress" /
            "flash-attn-2.8.3-h200.txt").read_text()
    points = [(int(d), int(t), int(n)) for d, n, t in
              re.findall(r"compiled (\d+)/(\d+) objects, (\d+) s", text)]
    end = points[-1][1]
    early = progress.progress_line("flash-attn", 4, 73, 179)
    assert early == "flash-attn: compiled 4/73 objects, 179 s"  # no guess from the ramp-up
    guessed = 0
    for done, t, total in points[:-1]:
        line = progress.progress_line("flash-attn", done, total, t)
        if m := re.search(r"about (\d+) (min|s) left", line):
            left = int(m.group(1)) * (60 if m.group(2) == "min" else 1)
            # within a factor of 2.5 either way (the last objects, flash-attn's backward
            # kernels, are the slowest: the guess runs short near the end)
            assert 0.4 <= left / (end - t) <= 2.5, line
            guessed += 1
    assert guessed >= 30


def test_switches_a_setup_py_reads_from_argv_arrive_as_build_options(world, tmp_path,
                                                                     monkeypatch):
    # apex before 2025-07 reads --cpp_ext/--cuda_ext from sys.argv only: a recipe passes such
    # switches as the config setting --build-option, which setuptools appends to bdist_wheel.
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    src = tmp_path / "tinyext-1.0"
    with tarfile.open(world["sdist"]) as tar:
        tar.extractall(tmp_path, filter="data")
    (src / "setup.py").write_text(SETUP.replace(
        'if os.environ.get("TINY_EXT") == "1" else []',
        'if "--tiny_ext" in sys.argv else []\nif "--tiny_ext" in sys.argv:\n'
        '    sys.argv.remove("--tiny_ext")').replace("import os", "import sys"))
    sdist = tmp_path / "tinyext-argv.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname="tinyext-1.0")
    r = recipe.Recipe("tinyext", "a test recipe", "sdist", modules=("tinyext._C",),
                      cuda=False, variants=(recipe.Variant("ext", "the C++ module",
                                                           build_options=("--tiny_ext",)),))
    monkeypatch.setenv(recipe.source_var("tinyext"), str(sdist))
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    pkg = recipe.resolve(r, {"version": "1.0", "sha256": sha, "variants": ["ext"]}, [])
    said = []
    res = build.build_and_install(pkg, world["python"], [], patch_root=world["patches"],
                                  echo=said.append)
    assert "tinyext._C" in res.modules and answer(world["python"]) == "42"
    assert "  options  --build-option=--tiny_ext" in said
    without = recipe.resolve(r, {"version": "1.0", "sha256": sha, "variants": []}, [])
    with user_error("build.python-only") as e:
        build.build_and_install(without, world["python"], [], patch_root=world["patches"],
                                echo=lambda *_: None)
    assert "tinyext" in e.value.message and "_C" in e.value.message
