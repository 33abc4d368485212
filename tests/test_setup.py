"""`invoke setup` end to end on a CPU machine, with a local bare repository and a tag standing in
for Megatron-LM upstream: tag checks, patches, stamps, a kill mid-step, changed pins."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import in_own_copy, kill_when_installing, statuses
from .gitrepo import git, repo_with
from .test_lock import copy_repo

pytestmark = pytest.mark.slow
PROFILE = "core_v0.4.0-cu121"

FILES = {
    "megatron/core/__init__.py": "__version__ = '0.4.0'\n",
    "megatron/core/datasets/__init__.py": "",
    "megatron/core/datasets/helpers.cpp": textwrap.dedent("""\
        #include <pybind11/pybind11.h>
        int build_sample_idx(int a, int b) { return a + b; }
        PYBIND11_MODULE(helpers, m) { m.def("build_sample_idx", &build_sample_idx); }
        """),
    "setup.py": textwrap.dedent("""\
        import pybind11
        from setuptools import Extension, setup
        setup(name="megatron-core", version="0.4.0", packages=["megatron.core", "megatron.core.datasets"],
              ext_modules=[Extension("megatron.core.datasets.helpers",
                                     ["megatron/core/datasets/helpers.cpp"],
                                     include_dirs=[pybind11.get_include()], language="c++")])
        """),
}

PATCH = """Subject: mark the tree as patched

Why: the test needs to see that the series was applied before the install.

diff --git a/megatron/core/__init__.py b/megatron/core/__init__.py
--- a/megatron/core/__init__.py
+++ b/megatron/core/__init__.py
@@ -1 +1,2 @@
 __version__ = '0.4.0'
+PATCHED = {n}
"""


def make_upstream(root: Path) -> tuple[Path, Path, str]:
    """A work tree with one commit tagged core_v0.4.0, and a bare repository made from it."""
    work = root / "megatron-work"
    commit = repo_with(work, FILES, "megatron")
    git("tag", "core_v0.4.0", cwd=work)
    bare = root / "Megatron-LM.git"
    git("clone", "-q", "--bare", work, bare, cwd=root)
    return work, bare, commit


def make_repo(root: Path, upstream: tuple[Path, Path, str]) -> Path:
    """A copy of this checkout whose default profile pins the upstream's tag and commit."""
    _work, bare, commit = upstream
    r = copy_repo(root)
    prof = r / "envs" / PROFILE / "profile.toml"
    text = prof.read_text().replace("38879f8b3f0edc4ed4f50ac2f3271010b12c549f", commit)
    prof.write_text(text.replace("https://github.com/NVIDIA/Megatron-LM.git", str(bare)))
    series = r / "patches" / "megatron" / "core_v0.4.0"
    series.mkdir(parents=True)
    (series / "0001-mark-patched.patch").write_text(PATCH.format(n=1))
    return r


@pytest.fixture
def upstream(tmp_path):
    return make_upstream(tmp_path)


@pytest.fixture
def repo(tmp_path, upstream):
    return make_repo(tmp_path, upstream)


@pytest.fixture(scope="module")
def built(tmp_path_factory, wheelhouse):
    """(repo, upstream, the first setup's result): one environment built for the tests that
    need one built, not a torch environment each (the killed-run test makes its own)."""
    root = tmp_path_factory.mktemp("setup")
    up = make_upstream(root)
    r = make_repo(root, up)
    yield r, up, setup(r, wheelhouse)
    shutil.rmtree(root, ignore_errors=True)  # a 5 GB environment: gone when its tests are


def setup(repo, wheelhouse, *args, wait=True):
    env = {**in_own_copy(os.environ), "PYTHONPATH": str(repo), "COLUMNS": "250",
           "UV_FIND_LINKS": str(wheelhouse), "UV_NO_INDEX": "1"}
    cmd = [sys.executable, "-m", "invoke", "setup", "--profile", PROFILE, *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=1800)


def python(repo):
    return repo / ".megatron-env" / PROFILE / "bin" / "python"


def test_setup_end_to_end_then_up_to_date_then_downstream_only(built, wheelhouse):
    repo, _upstream, r = built
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert statuses(r.stdout) == {
        "check": "done", "lock": "done", "env": "done", "sources": "skipped",
        "patches": "skipped", "builds": "skipped", "megatron": "done", "verify": "done"}
    assert "no GPU" in r.stdout  # the reason the kernel builds are skipped here
    out = subprocess.run([python(repo), "-c", "import megatron.core as m, "
                          "megatron.core.datasets.helpers as h; print(m.PATCHED, "
                          "h.build_sample_idx(2, 3))"], capture_output=True, text=True, cwd="/")
    assert out.stdout.split() == ["1", "5"], out.stderr
    again = setup(repo, wheelhouse)
    assert again.returncode == 0
    s = statuses(again.stdout)
    assert s["lock"] == s["env"] == s["megatron"] == "up to date"
    assert s["verify"] == "up to date"  # nothing changed: megatron.core is not imported again
    # a changed pin (the patch series) re-runs only what is downstream of it
    series = repo / "patches" / "megatron" / "core_v0.4.0"
    (series / "0001-mark-patched.patch").write_text(PATCH.format(n=2))
    plan = setup(repo, wheelhouse, "--dry-run")
    assert statuses(plan.stdout)["megatron"] == "would run"
    assert statuses(plan.stdout)["env"] == "up to date"
    third = setup(repo, wheelhouse)
    s = statuses(third.stdout)
    assert (s["lock"], s["env"], s["megatron"], s["verify"]) == (
        "up to date", "up to date", "done", "done"), third.stdout[-3000:]
    out = subprocess.run([python(repo), "-c", "import megatron.core as m; print(m.PATCHED)"],
                         capture_output=True, text=True, cwd="/")
    assert out.stdout.strip() == "2"
    # a package deleted from the environment: named, reinstalled from the lock, imports proven
    site = next((repo / ".megatron-env" / PROFILE).resolve().glob("lib/python3.10/site-packages"))
    shutil.rmtree(site / "einops")
    fourth = setup(repo, wheelhouse)
    s = statuses(fourth.stdout)
    assert fourth.returncode == 0 and (s["env"], s["megatron"], s["verify"]) == (
        "done", "up to date", "done"), fourth.stdout[-3000:]
    assert "einops: missing" in " ".join(fourth.stderr.split())  # progress goes to stderr
    assert "repaired" in fourth.stdout
    assert subprocess.run([python(repo), "-c", "import einops"], cwd="/").returncode == 0


def test_moved_tag_is_refused_with_both_shas(built, wheelhouse):
    repo, (work, bare, pinned), _ = built
    (work / "megatron/core/__init__.py").write_text("__version__ = '0.4.1'\n")
    git("commit", "-qam", "moved", cwd=work)
    git("tag", "-f", "core_v0.4.0", cwd=work)
    git("push", "-q", "--force", str(bare), "refs/tags/core_v0.4.0", cwd=work)
    moved = git("rev-parse", "HEAD", cwd=work)
    # another patch in the series: the megatron step runs again and fetches from upstream
    # (the tag is checked before any patch is applied, so this one is never reached)
    extra = repo / "patches" / "megatron" / "core_v0.4.0" / "0009-also.patch"
    extra.write_text(PATCH.format(n=9))
    try:
        r = setup(repo, wheelhouse)
    finally:  # the tag back where the profile pins it, for the tests after this one
        extra.unlink()
        git("tag", "-f", "core_v0.4.0", pinned, cwd=work)
        git("push", "-q", "--force", str(bare), "refs/tags/core_v0.4.0", cwd=work)
    assert r.returncode == 1
    s = statuses(r.stdout)
    assert s["megatron"] == "failed" and s["verify"] == "not run"
    flat = " ".join(r.stdout.split())
    assert pinned in flat and moved in flat and "the tag moved" in flat


def test_patch_that_does_not_apply_names_patch_file_and_hunk(built, wheelhouse):
    repo = built[0]
    series = repo / "patches" / "megatron" / "core_v0.4.0"
    kept = {p.name for p in (repo / ".megatron-env" / f"{PROFILE}.megatron").iterdir()}
    broken = series / "0002-broken.patch"
    broken.write_text(PATCH.replace("@@ -1 +1,2 @@", "@@ -1 +1,2 @@")
                      .replace(" __version__ = '0.4.0'", " __version__ = 'something else'"))
    try:
        r = setup(repo, wheelhouse)
    finally:
        broken.unlink()
    assert r.returncode == 1
    flat = " ".join(r.stdout.split())
    assert "0002-broken.patch does not apply" in flat
    assert "megatron/core/__init__.py, hunk at line 1" in flat
    store = repo / ".megatron-env" / f"{PROFILE}.megatron"
    assert {p.name for p in store.iterdir()} == kept  # nothing half-built was left


def test_killed_during_a_step_then_rerun_ends_verified(repo, wheelhouse):
    p = setup(repo, wheelhouse, wait=False)
    store = repo / ".megatron-env" / f"{PROFILE}.d"
    kill_when_installing(p, store)  # while the env step installs
    assert not python(repo).exists()  # nothing half-built is in use
    r = setup(repo, wheelhouse)
    assert r.returncode == 0, r.stdout[-3000:]
    assert statuses(r.stdout)["verify"] == "done"
    assert len([d for d in store.iterdir() if d.is_dir()]) == 1
