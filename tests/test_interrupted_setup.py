"""An interrupted environment build (issue 41): Ctrl-C or SIGTERM while uv installs leaves no
half-built environment (the previous one, or none), says what it kept for the next run with its
size, and ends its uv child; a run killed outright (SIGKILL: nothing can be cleaned) is found by
the next run, which says so and removes it. Real uv, real signals, a real package source that
stalls: a socket that listens and never answers, so the install is under way when the signal
comes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_env import proc

from .conftest import in_own_copy

ROOT = Path(__file__).resolve().parent.parent
PROFILE = "core_v0.19.0-cu130"  # Python 3.12: the interpreter running these tests
SIX = ("six==1.16.0 \\\n    --hash=sha256:"
       "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254\n")


@pytest.fixture
def stalled():
    """A package source that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield f"http://127.0.0.1:{s.getsockname()[1]}/simple/"
    s.close()


@pytest.fixture
def proj(tmp_path):
    """A project with one profile whose lock is one small package."""
    if sys.version_info[:2] != (3, 12):
        pytest.skip("the profile's Python (3.12) is not the one running the tests")
    d = tmp_path / "proj" / "envs" / PROFILE
    shutil.copytree(ROOT / "envs" / PROFILE, d)
    (d / "requirements.lock").write_text(SIX)
    return tmp_path / "proj"


def _start(proj: Path, source: str, err: Path, tmp: Path) -> subprocess.Popen:
    with err.open("w") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "megatron_env", "--project", str(proj), "env", "--profile",
             PROFILE, "--python", sys.executable, "--no-index", "--find-links", source],
            cwd=tmp, stdout=subprocess.DEVNULL, stderr=f, start_new_session=True,
            env={**in_own_copy(os.environ), "PYTHONPATH": str(ROOT),
                 "UV_CACHE_DIR": str(tmp / "uv"), "MEGATRON_ENV_CACHE": str(tmp / "cache"),
                 "UV_HTTP_TIMEOUT": "120"})


def _installing(p: subprocess.Popen, err: Path) -> int:
    """The pid of uv's `pip install` child, once it runs."""
    end = time.monotonic() + 120
    while time.monotonic() < end:
        assert p.poll() is None, err.read_text()
        if "with hashes required" in err.read_text():
            for pid in proc.run(["pgrep", "-P", str(p.pid)]).stdout.split():
                if "pip" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    return int(pid)
        time.sleep(0.1)
    pytest.fail(f"uv never started installing: {err.read_text()}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_install_leaves_no_half_built_environment(proj, stalled, tmp_path, sig):
    """Before: SIGTERM ended the process where it stood (the new environment and the uv child
    left behind); Ctrl-C left the half-built environment in the store until some next run."""
    err = tmp_path / "err"
    p = _start(proj, stalled, err, tmp_path)
    uv_pid = _installing(p, err)
    store = proj / ".megatron-env" / f"{PROFILE}.d"
    assert [d for d in store.iterdir() if d.is_dir()]  # the new environment is being made
    os.kill(p.pid, sig)  # the tool only, as a scheduler's SIGTERM or a kill from a shell
    p.wait(timeout=60)
    text = err.read_text()
    assert p.returncode == 128 + sig if sig == signal.SIGTERM else p.returncode == 130, text
    lines = text.strip().splitlines()
    assert lines[-1] == ("error: terminated" if sig == signal.SIGTERM else "error: interrupted")
    assert not (proj / ".megatron-env" / PROFILE).exists()  # no environment at the prefix
    assert not [d for d in store.iterdir() if d.is_dir()], text  # nothing half-built kept
    assert any(line.startswith("interrupted: the unfinished environment") and
               "not made (there was no environment before)" in line for line in lines), text
    (kept,) = [line for line in lines if line.startswith("kept for the next run")]
    assert f"uv's cache {tmp_path / 'uv'} (" in kept and " MiB)" in kept
    assert not Path(f"/proc/{uv_pid}").exists()  # uv ended with it, and was reaped


def test_a_killed_run_is_found_and_removed_by_the_next(proj, stalled, tmp_path):
    err = tmp_path / "err"
    p = _start(proj, stalled, err, tmp_path)
    _installing(p, err)
    os.killpg(p.pid, signal.SIGKILL)  # nothing can clean up after this
    p.wait(timeout=60)
    store = proj / ".megatron-env" / f"{PROFILE}.d"
    (left,) = [d for d in store.iterdir() if d.is_dir()]
    err2 = tmp_path / "err2"
    p = _start(proj, stalled, err2, tmp_path)
    _installing(p, err2)
    os.kill(p.pid, signal.SIGINT)
    p.wait(timeout=60)
    text = err2.read_text()
    assert f"found {left}, an environment an interrupted run left unfinished (" in text
    assert "removing it; the downloads it used are reused from uv's cache" in text
    assert not left.exists()
