"""Torch replaced since adoption (issue 49): an adopted interpreter (`invoke setup --adopt PY`,
recorded in <prefix>.setup/adopted.json) whose torch is replaced by another build after the
setup was ready. Setup must notice, say what changed by name (torch: old -> new), and never say
"ready" on kernels compiled against the old torch: a torch the profile still accepts (same
release, another build: its local version differs) gets its kernels built for it; one the
profile does not accept is refused with a hint, and nothing is called ready.

The real tool on the setup chain's tiny world with the kernel stand-in (tests/kernelstandin.py),
adopting a venv whose stand-in torch has a compiled core on disk (`torch/_C.*.so`, read only by
stat, as the adoption's fingerprint reads real torch's). Which torch a kernel was built for is
asked of the interpreter: the stand-in's wheel records the torch it was built with.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_env.pyenv import uv

from . import kernelstandin
from .conftest import statuses
from .test_ready import Node
from .test_setup_chain import TORCH, make_wheel, make_world

pytestmark = pytest.mark.slow


def torch_wheel(dest: Path, version: str) -> Path:
    """A stand-in torch `version` (its __version__ and metadata) with a compiled core on disk:
    `_C.stamp.so`, matched by the stamp's glob (`_C.*.so`) and never imported (the module
    torch._C stays the stand-in's _C.py)."""
    files = {k: v.replace("'2.1.0'", repr(version)) for k, v in TORCH.items()}
    files["torch/_C.stamp.so"] = f"the compiled core of torch {version}\n"
    dest.mkdir(parents=True, exist_ok=True)
    return make_wheel(dest, "torch", version, files)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("torchswap")
    work, env = make_world(root)
    sdist, sha = kernelstandin.make_sdist(root)
    kernelstandin.add_to(work, work / "envs/tiny/profile.toml", sha)
    yield work, {**env, kernelstandin.SOURCE_VAR: str(sdist)}, root
    shutil.rmtree(root, ignore_errors=True)


def adopted_node(world, name: str) -> Node:
    """A checkout of the world, set up ready on an adopted venv with torch 2.1.0 (stamped)."""
    work, env, root = world
    dest = work.parent / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(work, dest, ignore=shutil.ignore_patterns(".megatron-env", ".cache"),
                    symlinks=True)
    image = root / f"{name}-image"
    subprocess.run([uv.exe(), "venv", "-q", "--python", sys.executable, image], check=True,
                   env=env)
    py = image / "bin" / "python"
    subprocess.run([uv.exe(), "pip", "install", "-q", "--python", py,
                    torch_wheel(root / f"{name}-torch", "2.1.0"), "tinytop"], check=True,
                   env=env)
    n = Node(dest, {**env, "PYTHONPATH": str(dest)}, py)
    first = n.setup()
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert statuses(first.stdout)["builds"] == "done" and n.proven() == []
    return n


def replace_torch(n: Node, root: Path, version: str) -> None:
    """Another torch into the adopted venv, as a user's `pip install torch==...` would."""
    subprocess.run([uv.exe(), "pip", "install", "-q", "--python", n.python(), "--reinstall",
                    torch_wheel(root / f"torch-{version}", version)], check=True, env=n.env)


def kernel_built_for(n: Node) -> str | None:
    """The torch the installed kernel was built against, asked of the interpreter (the
    stand-in's wheel records it at build time; None: no kernel imports)."""
    r = subprocess.run([n.python(), "-c", "from tinykern import _built_for; "
                        "print(_built_for.TORCH)"], capture_output=True, text=True, cwd="/")
    return r.stdout.strip() if r.returncode == 0 else None


def test_a_torch_of_another_build_gets_kernels_built_for_it(world):
    """Same release, another build (a local version): the profile still accepts it. Setup
    names the change and is ready only with the kernel built for the new torch."""
    _work, _env, root = world
    n = adopted_node(world, "samerelease")
    assert kernel_built_for(n) == "2.1.0"
    replace_torch(n, root, "2.1.0+rebuilt")
    r = n.setup()
    said = r.stdout + r.stderr
    assert "torch 2.1.0 -> 2.1.0+rebuilt" in said, said[-3000:]
    if r.returncode == 0:
        assert "setup ready" in r.stdout
        assert kernel_built_for(n) == "2.1.0+rebuilt", said[-3000:]
        assert statuses(r.stdout)["builds"] == "done", r.stdout
    else:
        assert "setup ready" not in r.stdout and "hint: " in said, said[-3000:]


def test_a_torch_the_profile_does_not_accept_is_refused_with_a_hint(world):
    """Another release: setup names the change, refuses, and says nothing is ready."""
    _work, _env, root = world
    n = adopted_node(world, "otherrelease")
    replace_torch(n, root, "2.2.0")
    r = n.setup()
    said = r.stdout + r.stderr
    assert r.returncode != 0 and "setup ready" not in r.stdout, said[-3000:]
    assert "torch 2.1.0 -> 2.2.0" in said, said[-3000:]
    assert re.search(r"^env\s+failed .*\n\s+hint: \S", r.stdout, re.M), r.stdout[-3000:]
    # and again: a second setup does not take the refusal for a pass
    again = n.setup()
    assert again.returncode != 0 and "setup ready" not in again.stdout, again.stdout[-2000:]


def test_the_same_torch_reinstalled_is_named_and_costs_no_compile(world):
    """The same version installed again (its compiled core has a new mtime): named as another
    build of it, checked again; the kernel's key is the same, so its cached build serves
    (no compiler may run) and setup is ready."""
    _work, _env, root = world
    n = adopted_node(world, "reinstalled")
    replace_torch(n, root, "2.1.0")
    n.env = {**n.env, "CC": "/bin/false"}
    r = n.setup()
    said = r.stdout + r.stderr
    assert r.returncode == 0 and "setup ready" in r.stdout, said[-3000:]
    assert "torch 2.1.0 replaced by another build of it" in said, said[-3000:]
    assert kernel_built_for(n) == "2.1.0" and n.proven() == []
