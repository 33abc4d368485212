"""conda-lock for real: lock a profile's environment.yml against a channel built here, through
a mirror override, with a local lookup file and no network, then install the lock."""

import re
import shutil
import subprocess

import pytest

from megatron_env import profile
from megatron_env.pyenv import lock_conda

from .conda_channel import lock_offline, solver
from .test_lock import copy_repo, invoke

pytest.importorskip("rattler")


def test_conda_lock_and_install_from_a_local_channel(tmp_path, monkeypatch):
    src = profile.envs_root() / "core_v0.4.0-cu121"
    shutil.copytree(src, tmp_path / "envs" / src.name)
    prof = profile.load_file(tmp_path / "envs" / src.name / "profile.toml")
    # The profile names conda-forge and an NVIDIA label; neither is reachable here: the mirror
    # (as an air-gapped cluster would set it) replaces them.
    said = []
    conda_lock, stub = lock_offline(prof, tmp_path, monkeypatch, echo=said.append)
    assert conda_lock is not None, said
    text = conda_lock.read_text()
    assert "cuda-nvcc-12.1.105-0.tar.bz2" in text and "12.4.131" not in text
    assert "python-3.10.13-0.tar.bz2" in text
    assert len(re.findall(r"sha256: [0-9a-f]{64}", text)) == 6
    prefix = tmp_path / "prefix"
    res = lock_conda.conda_install(conda_lock, prefix, str(stub))
    assert res.ok, res.output
    nvcc = subprocess.run([prefix / "bin" / "nvcc"], capture_output=True, text=True)
    assert "release 12.1" in nvcc.stdout
    assert sorted(p.name for p in (prefix / "conda-meta").glob("*.json")) == [
        "cuda-cudart-dev-12.1.105-0.json", "cuda-libraries-dev-12.1.1-0.json",
        "cuda-nvcc-12.1.105-0.json", "gxx_linux-64-11.4.0-0.json", "ninja-1.11.1-0.json",
        "python-3.10.13-0.json"]


def test_unreachable_channel_is_one_line_and_the_uv_lock_still_happens(tmp_path):
    repo = copy_repo(tmp_path)
    stub = solver(tmp_path)
    r = invoke(repo, "lock", "--profile", "core_v0.4.0-cu121", "--conda", str(stub),
               "--channel", (tmp_path / "no-such-channel").as_uri())
    assert r.returncode == 0, r.stdout + r.stderr
    failed = [line for line in r.stderr.splitlines() if "conda-lock failed" in line]
    assert len(failed) == 1 and "--channel MIRROR" in failed[0]
    assert "locked core_v0.4.0-cu121: 39 packages" in r.stdout
    assert not (repo / "envs/core_v0.4.0-cu121/conda-lock.yml").exists()


def test_no_solver_is_one_line(tmp_path):
    repo = copy_repo(tmp_path)
    r = invoke(repo, "lock", "--profile", "core_v0.4.0-cu121", env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "conda-lock skipped: no conda, mamba or micromamba" in r.stderr
