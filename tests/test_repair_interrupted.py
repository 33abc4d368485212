"""A repair in place is all or nothing (issue 49): a file deleted from a package of the live
environment, `invoke env` reinstalling that package, and an interrupt (Ctrl-C to the whole
process group, or SIGTERM to the tool alone) at several points after uv's "Prepared 1 package":
the package is afterwards either exactly as it was (the deleted file still gone, every other
file the same inode and bytes) and the message says the repair was undone, or repaired whole.
Before, torch's directory went from 97 to 86 entries and the message named only uv's cache.

Real uv on the setup chain's tiny world, with one more locked package of 1,500 files so that
uv's uninstall and install take long enough to be cut in the middle.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import INTERRUPTS, interrupt, until_said
from .test_setup_chain import invoke, make_wheel, make_world

pytestmark = pytest.mark.slow

FILES = 1500
BIG = {"bigpkg/__init__.py": "", **{f"bigpkg/m{i:04d}.py": f"X = {i}\n" * 20
                                    for i in range(FILES)}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("repair")
    work, env = make_world(root)
    make_wheel(root / "wheels", "bigpkg", "1.0", BIG)
    prof = work / "envs/tiny/profile.toml"
    prof.write_text(prof.read_text().replace('packages = ["torch", "tinytop"]',
                                             'packages = ["torch", "tinytop", "bigpkg"]'))
    r = invoke(work, env, "lock", "--profile", "tiny", "--python", sys.executable)
    assert r.returncode == 0, r.stdout + r.stderr
    r = invoke(work, env, "env", "--profile", "tiny")
    assert r.returncode == 0, r.stdout + r.stderr
    yield work, env
    shutil.rmtree(root, ignore_errors=True)


def state(pkg: Path) -> dict[str, tuple[int, str]]:
    """Every file of the package directory: name -> (inode, sha256)."""
    return {p.name: (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(pkg.iterdir()) if p.is_file()}


@pytest.mark.parametrize("sig,after", INTERRUPTS)
def test_an_interrupted_repair_leaves_the_package_as_it_was_or_repaired(world, tmp_path, sig,
                                                                        after):
    work, env = world
    site = next((work / ".megatron-env" / "tiny").resolve().glob("lib/python*/site-packages"))
    pkg = site / "bigpkg"
    gone = pkg / "m0700.py"
    gone.unlink(missing_ok=True)
    before = state(pkg)
    assert len(before) == FILES  # the other files, and __init__.py
    err = tmp_path / "err"
    with err.open("w") as f:
        p = subprocess.Popen([sys.executable, "-m", "invoke", "env", "--profile", "tiny"],
                             cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=f,
                             start_new_session=True)
    until_said(p, err, "Prepared 1 package", 120, "uv never prepared the package")
    interrupt(p, sig, after)
    p.wait(timeout=120)
    text = err.read_text()
    now = state(pkg)
    undone = "repair interrupted: the reinstall of bigpkg was undone" in text
    if p.returncode == 0:  # the signal came after the repair had finished
        assert "repaired" in text and not undone, text
    else:
        # 130/143: the tool's "interrupted" exit. -SIGINT: seen once in CI under load (2026-12-06),
        # a Ctrl-C just after uv's "Installed 1 package" ended the tool by the signal itself,
        # without its "interrupted" line (a shell still reads 130); the environment checks
        # below held. Read since: `guarded` restores the handlers it set as the command returns,
        # and Python ends by SIGINT when a KeyboardInterrupt arrives after that (invoke's own
        # exit, interpreter shutdown): the command had finished. Not reproduced on purpose; the
        # state is what is tested.
        assert p.returncode in (130, 143) or (sig == signal.SIGINT
                                               and p.returncode == -signal.SIGINT), text
    if undone:
        assert now == before, (f"said undone, but {len(now)} files of {len(before) + 1} "
                               f"remain or differ:\n{text[-2000:]}")
        assert "the environment is as it was before the repair" in text
    else:
        assert set(now) == {*before, gone.name}, f"{len(now)} files of {FILES + 1}:\n{text}"
        assert all(now[n][1] == before[n][1] for n in before), text
    assert not (site.parent.parent.parent / ".megatron-env-repair").exists()
    # the next run repairs whatever is left, and the environment checks
    r = invoke(work, env, "env", "--profile", "tiny")
    assert r.returncode == 0 and gone.exists(), r.stdout + r.stderr
