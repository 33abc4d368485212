"""`invoke env` for real: the default profile (Python 3.10, torch 2.1.0 for CUDA 12.1) built from
its lock, verified, rebuilt only when the lock changes, and never left broken.

Heavy: downloads the lock's wheels once (about 2.6 GB) into a wheelhouse, which then serves as the
only package source (`--no-index --find-links`), as on an air-gapped cluster.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from megatron_env import profile
from megatron_env.pyenv import lock

from .conftest import OWN_STATE, free_port, kill_when_installing
from .test_lock import copy_repo, invoke

pytestmark = pytest.mark.slow
PROFILE = "core_v0.4.0-cu121"


@pytest.fixture(autouse=True)
def _state_in_the_copy(own_state, monkeypatch):
    """The environment these tests build is read back from the copy's .megatron-env/."""
    for name in OWN_STATE:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """One checkout whose environment the tests here build, damage and repair in turn; removed
    when they are done (its environment is 5 GB: the run's disk peak holds one at a time)."""
    root = tmp_path_factory.mktemp("envrepo")
    yield copy_repo(root)
    shutil.rmtree(root, ignore_errors=True)


def env(repo, wheelhouse, *args, extra_env=None):
    return invoke(repo, "env", "--profile", PROFILE, "--no-index", "--find-links",
                  str(wheelhouse), *args, env=extra_env)


def prefix_of(repo):
    return repo / ".megatron-env" / PROFILE


def torch_facts(prefix):
    r = subprocess.run([prefix / "bin" / "python", "-c",
                        "import torch; print(torch.__version__, torch.version.cuda)"],
                       capture_output=True, text=True, cwd="/")
    return r.stdout.strip()


def touch_lock(repo, note):
    """A lock change with the same pins: the environment must be rebuilt from it."""
    f = repo / "envs" / PROFILE / profile.LOCK_FILE
    f.write_text(f.read_text() + f"# {note}\n")


def test_build_verify_and_up_to_date(repo, wheelhouse):
    r = env(repo, wheelhouse)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "built at" in r.stdout and "CUDA 12.1" in r.stdout and "torch 2.1.0+cu121" in r.stdout
    assert "found on" in r.stderr  # says which interpreter made the venv
    prefix = prefix_of(repo)
    assert torch_facts(prefix) == "2.1.0+cu121 12.1"
    target = prefix.resolve()
    again = env(repo, wheelhouse)
    assert again.returncode == 0 and "up to date" in again.stdout
    assert prefix.resolve() == target  # nothing rebuilt, nothing moved


def test_tampered_wheel_is_refused_and_the_old_env_still_works(repo, wheelhouse, tmp_path):
    """A wheelhouse whose six wheel was changed (a copy of the shared one: the shared one stays
    intact for every other test and run)."""
    before = prefix_of(repo).resolve()
    house = tmp_path / "wheelhouse"
    house.mkdir()
    for whl in wheelhouse.glob("*.whl"):
        if not whl.name.startswith("six-"):
            (house / whl.name).symlink_to(whl)
    six = next(wheelhouse.glob("six-*.whl"))
    with zipfile.ZipFile(six) as zi, zipfile.ZipFile(house / six.name, "w") as zo:
        for item in zi.infolist():
            data = zi.read(item.filename)
            zo.writestr(item, data + b"\n# modified\n" if item.filename == "six.py" else data)
    touch_lock(repo, "tampered-wheel test")
    # no cache: uv's cache would serve the genuine six it installed before
    r = env(repo, house, extra_env={"UV_NO_CACHE": "1"})
    assert r.returncode == 2, r.stdout[-2000:]
    assert "Traceback" not in r.stderr
    assert "does not match the hash in the lock" in r.stderr and "six" in r.stderr
    assert "nothing was changed" in r.stderr
    assert prefix_of(repo).resolve() == before
    assert torch_facts(prefix_of(repo)) == "2.1.0+cu121 12.1"
    assert [d for d in before.parent.iterdir() if d.is_dir()] == [before]


def test_killed_mid_install_then_two_reruns_at_once_end_verified(repo, wheelhouse):
    """A run killed while it installs leaves the old environment in use; then two runs start
    at once (two nodes of one job): one builds, the other waits for it and finds it done
    (one environment build serves both cases)."""
    before = prefix_of(repo).resolve()
    touch_lock(repo, "interrupted-run test")
    p = subprocess.Popen([sys.executable, "-m", "invoke", "env", "--profile", PROFILE,
                          "--no-index", "--find-links", str(wheelhouse)], cwd=repo,
                         env={**os.environ, "PYTHONPATH": str(repo)}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    store = before.parent
    kill_when_installing(p, store, old=before)
    assert prefix_of(repo).resolve() == before  # the old environment is untouched
    assert torch_facts(prefix_of(repo)) == "2.1.0+cu121 12.1"
    cmd = [sys.executable, "-m", "invoke", "env", "--profile", PROFILE, "--no-index",
           "--find-links", str(wheelhouse)]
    procs = [subprocess.Popen(cmd, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sorted("built at" in o for o in outs) == [False, True]
    assert any("up to date" in o for o in outs)
    assert any("waiting: another run is working on" in o for o in outs)
    after = prefix_of(repo).resolve()
    assert after != before and torch_facts(prefix_of(repo)) == "2.1.0+cu121 12.1"
    assert [d for d in store.iterdir() if d.is_dir()] == [after]  # leftovers removed


def test_refusals(repo, wheelhouse):
    other = invoke(repo, "env", "--profile", "core_v0.19.0-cu130", "--prefix",
                   str(prefix_of(repo)))
    assert other.returncode == 2 and f"holds the environment of profile {PROFILE}" in other.stderr
    wrong = env(repo, wheelhouse, "--prefix", str(repo / "elsewhere"), "--python", sys.executable)
    if not sys.version.startswith("3.10."):
        assert wrong.returncode == 2 and "the profile needs 3.10" in wrong.stderr
    lockfile = repo / "envs" / PROFILE / profile.LOCK_FILE
    pinned = lockfile.read_text()
    touch_lock(repo, "disk test")
    try:
        full = env(repo, wheelhouse, extra_env={"MEGATRON_ENV_MIN_FREE_GB": "1000000"})
    finally:  # the lock as the environment was built from it: no rebuild for the next tests
        lockfile.write_text(pinned)
    assert full.returncode == 2 and "1,000,000.0 GiB needed," in full.stderr
    assert "no space on " in full.stderr and "for a new environment" in full.stderr
    assert torch_facts(prefix_of(repo)) == "2.1.0+cu121 12.1"


def test_adopt_reports_every_difference(repo, wheelhouse):
    ok = invoke(repo, "env", "--profile", PROFILE, "--adopt", "--python",
                str(prefix_of(repo) / "bin" / "python"))
    touched = "matches profile" in ok.stdout
    assert ok.returncode == 0 and touched, ok.stdout
    # the interpreter running the tests is not the profile's stack
    here = invoke(repo, "env", "--profile", PROFILE, "--adopt", "--python", sys.executable)
    assert here.returncode == 1
    assert "differs" in here.stdout and "torch" in here.stdout


def test_conda_path_builds_the_env_in_a_conda_prefix(wheelhouse, tmp_path, monkeypatch):
    # The profile's conda-lock.yml (solved here against a channel built by the test, through the
    # mirror override) gives the prefix Python 3.10 and nvcc 12.1; the uv lock goes on top.
    pytest.importorskip("rattler")
    from pathlib import Path

    from megatron_env import profile

    from .conda_channel import lock_offline

    repo = copy_repo(tmp_path / "repo")
    base = Path(lock.find_python("3.10")[0]).resolve()
    prof = profile.load_file(repo / "envs" / PROFILE / "profile.toml")
    conda_lock, stub = lock_offline(prof, tmp_path, monkeypatch, python=base)
    assert conda_lock is not None
    r = env(repo, wheelhouse, "--conda", str(stub))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "conda: installing conda-lock.yml" in r.stderr and "(conda)" in r.stdout
    prefix = prefix_of(repo)
    assert (prefix / "conda-meta" / "cuda-nvcc-12.1.105-0.json").exists()
    nvcc = subprocess.run([prefix / "bin" / "nvcc"], capture_output=True, text=True)
    assert "release 12.1" in nvcc.stdout
    assert torch_facts(prefix) == "2.1.0+cu121 12.1"


def site_packages(repo):
    return next(prefix_of(repo).resolve().glob("lib/python3.10/site-packages"))


def test_environment_shares_no_inode_with_uv_cache(repo, wheelhouse):
    """uv's link mode is copy: an edit in the environment cannot reach the cache (or, through
    it, the next environment built from it)."""
    torch_init = site_packages(repo) / "torch" / "__init__.py"
    assert torch_init.stat().st_nlink == 1
    assert (prefix_of(repo).resolve() / ".megatron-env-manifest.json").is_file()


@pytest.mark.parametrize("damage", ["delete-package", "replace-file", "break-torch"])
def test_warm_run_names_and_repairs_what_changed(repo, wheelhouse, damage):
    assert env(repo, wheelhouse).returncode == 0  # built from the lock as it is now
    site = site_packages(repo)
    if damage == "delete-package":
        shutil.rmtree(site / "einops")
        words, probe = "einops: missing", "import einops"
    elif damage == "replace-file":
        f = site / "six.py"
        tmp = f.with_name("six.py.new")
        tmp.write_text(f.read_text().replace("PY3 = ", "PY3 = not "))
        os.replace(tmp, f)
        words, probe = f"six: changed {f}", "import six; assert six.PY3"
    else:
        f = site / "torch" / "__init__.py"
        with open(f, "a") as fh:  # in place: same inode
            fh.write("\nraise ImportError('broken on purpose')\n")
        words, probe = "torch: changed", "import torch"
    r = env(repo, wheelhouse)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    flat = " ".join(r.stderr.split())  # what differs is progress: stderr; the result: stdout
    assert words in flat and "repaired at" in r.stdout, flat[-2000:] + r.stdout[-1000:]
    assert "up to date" not in r.stdout
    assert subprocess.run([prefix_of(repo) / "bin" / "python", "-c", probe], cwd="/").returncode == 0
    again = env(repo, wheelhouse)
    assert again.returncode == 0 and "up to date" in again.stdout


def test_verify_deep_finds_an_edit_that_stat_cannot_see(repo, wheelhouse):
    assert env(repo, wheelhouse).returncode == 0
    f = site_packages(repo) / "einops" / "einops.py"
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[0:1] = b"#" if data[0:1] != b"#" else b" "
    with open(f, "r+b") as fh:
        fh.write(data)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "up to date" in env(repo, wheelhouse).stdout  # size, mtime and inode all unchanged
    deep = env(repo, wheelhouse, "--verify-deep")
    assert deep.returncode == 0, deep.stdout[-3000:] + deep.stderr[-2000:]
    flat = " ".join(deep.stderr.split())
    assert f"einops: hash {f}" in flat and "repaired at" in deep.stdout
    clean = env(repo, wheelhouse, "--verify-deep")
    assert clean.returncode == 0 and "verified at" in clean.stdout


def test_verify_nccl_on_torch_210_gloo_without_numpy(repo, wheelhouse, tmp_path):
    """The default profile's torch 2.1.0: its gloo has no _allgather_base, and numpy is hidden."""
    from .test_verify_nccl import run_gloo

    r = run_gloo(prefix_of(repo) / "bin" / "python", tmp_path / "run", 2, free_port())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["results"] and all(c["all_gather"] is True for c in doc["correctness"])
    assert {row["op"] for row in doc["results"]} >= {"all_reduce", "all_gather", "broadcast"}
