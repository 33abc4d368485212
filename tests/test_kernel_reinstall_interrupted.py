"""A kernel put back from the wheel cache is all or nothing (issue 49): a file of the kernel
deleted from the live environment, `invoke setup` reinstalling its cached wheel in place, and
an interrupt (Ctrl-C to the whole process group, or SIGTERM to the tool alone) at several points
after it said "cache hit, installing": the kernel is afterwards either exactly as it was (the
deleted file still gone, every other file the same inode and bytes) and the message says the
reinstall was undone, or installed whole. Before, uv's uninstall and install were cut where
they stood: part of the kernel's files gone, its RECORD naming files that were not there.

The real tool on the setup chain's tiny world with the kernel stand-in (tests/kernelstandin.py:
a C extension built through the recipe, the wheel cache and the pool), here with 1,500 more
modules so that uv's uninstall and install take long enough to be cut in the middle.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from . import kernelstandin
from .conftest import INTERRUPTS, interrupt, until_said
from .test_setup_chain import invoke, make_world

pytestmark = pytest.mark.slow

FILES = 1500
SAID = "tinykern: cache hit, installing"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The chain's world with the big kernel stand-in, set up once (its wheel cached)."""
    root = tmp_path_factory.mktemp("kernreinstall")
    work, env = make_world(root)
    sdist, sha = kernelstandin.make_sdist(root, modules=FILES)
    kernelstandin.add_to(work, work / "envs/tiny/profile.toml", sha)
    env = {**env, kernelstandin.SOURCE_VAR: str(sdist)}
    r = invoke(work, env, "setup", "--profile", "tiny")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    yield work, env
    shutil.rmtree(root, ignore_errors=True)


def state(pkg: Path) -> dict[str, tuple[int, str]]:
    """Every file of the package directory: name -> (inode, sha256)."""
    return {p.name: (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(pkg.iterdir()) if p.is_file()}


def answers(python: Path) -> bool:
    """The compiled module imports and answers, asked from outside the tool."""
    r = subprocess.run([python, "-c", "import tinykern._C as k; assert k.answer() == 42"],
                       capture_output=True, cwd="/")
    return r.returncode == 0


@pytest.mark.parametrize("sig,after", INTERRUPTS)
def test_an_interrupted_kernel_reinstall_leaves_it_as_it_was_or_installed(world, tmp_path, sig,
                                                                         after):
    work, env = world
    prefix = (work / ".megatron-env" / "tiny").resolve()
    python = prefix / "bin" / "python"
    site = next(prefix.glob("lib/python*/site-packages"))
    pkg = site / "tinykern"
    gone = pkg / "m0700.py"
    gone.unlink(missing_ok=True)
    before = state(pkg)
    assert len(before) == FILES + 2  # the other modules, __init__.py, _C and _built_for.py
    err, out = tmp_path / "err", tmp_path / "out"
    with err.open("w") as f, out.open("w") as o:
        p = subprocess.Popen([sys.executable, "-m", "invoke", "setup", "--profile", "tiny"],
                             cwd=work, env=env, stdout=o, stderr=f, start_new_session=True)
    until_said(p, err, SAID, 300, "setup never reinstalled the kernel")
    interrupt(p, sig, after)
    p.wait(timeout=300)
    text = err.read_text()
    now = state(pkg) if pkg.is_dir() else {}
    undone = "the reinstall of tinykern was undone" in text
    # 130/143: the tool's "interrupted"/"terminated"; or the signal came after the command had
    # said "setup ready" (its handlers given back): the process ends by the signal itself
    assert p.returncode in (0, 130, 143) or (p.returncode == -sig
                                             and "setup ready" in out.read_text()), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    if undone:
        assert now == before, (f"said undone, but {len(now)} files of {len(before)} remain "
                               f"or differ:\n{text[-3000:]}")
        assert "the environment is as it was before the repair" in text
    else:
        assert set(now) == {*before, gone.name}, f"{len(now)} files of {FILES + 3}:\n{text}"
        assert all(now[n][1] == before[n][1] for n in before), text
        assert answers(python), text[-3000:]
    assert not [p for p in (prefix, site) if (p / ".megatron-env-repair").exists()]
    # the next setup puts back whatever is left, and the kernel answers
    r = invoke(work, env, "setup", "--profile", "tiny")
    assert r.returncode == 0 and gone.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    assert answers(python)
