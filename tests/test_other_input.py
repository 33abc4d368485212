"""Input that is not what a command expects: a device or huge file as --profile, a snapshot
already in --out, a mirror value that git would read as an option, a complete environment on a
mount nobody may write, a failure whose log lived in a temporary directory."""

import json
import shutil
import venv
from pathlib import Path

import pytest

from megatron_env import digest, profile
from megatron_env.errors import UserError
from megatron_env.pyenv import env, lock, manifest
from megatron_env.sources import repos

from .gitrepo import git, repo_with
from .test_bad_input import DEFAULT, one_line_error
from .test_lock import ROOT, invoke


@pytest.mark.parametrize("value, words", [
    ("/dev/zero", ["neither a profile name nor a profile file", ".toml"]),
    ("envs/../envs", ["neither a profile name nor a profile file"]),
    ("mine.toml", ["neither a profile name nor a profile file", "./my-profile.toml"]),
])
def test_profile_takes_a_name_and_a_path_only_when_it_says_so(value, words):
    r = invoke(ROOT, "check", "--profile", value)
    one_line_error(r, *words)


def test_profile_file_must_be_a_small_regular_file(tmp_path):
    (tmp_path / "zero.toml").symlink_to("/dev/zero")
    r = invoke(ROOT, "check", "--profile", str(tmp_path / "zero.toml"))
    one_line_error(r, "is not a regular file")
    big = tmp_path / "big.toml"
    big.write_text("# x\n" * (profile.MAX_PROFILE_BYTES // 4 + 1))
    with pytest.raises(UserError, match="larger than 1024 KiB"):
        profile.load(str(big))
    real = profile.load(None).path
    assert profile.load(str(real)).name == profile.load(None).name  # a path that says so


def test_collect_never_replaces_a_snapshot_without_force(tmp_path):
    out = tmp_path / "snap"
    first = invoke(ROOT, "collect", "--out", str(out))
    assert first.returncode == 0, first.stderr
    meta = (out / "meta.json").read_text()
    again = invoke(ROOT, "collect", "--out", str(out))
    one_line_error(again, "already holds a snapshot", "--force")
    assert (out / "meta.json").read_text() == meta
    forced = invoke(ROOT, "collect", "--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr


def test_mirror_values_that_begin_with_a_dash_are_refused_by_name(tmp_path, monkeypatch):
    pwned = tmp_path / "pwned"
    monkeypatch.setenv("MEGATRON_ENV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MEGATRON_ENV_MIRROR_MEGATRON", f"--upload-pack=touch {pwned}")
    with pytest.raises(UserError, match="MEGATRON_ENV_MIRROR_MEGATRON=.* starts with '-'"):
        repos.mirror("megatron", "https://example.invalid/x.git", echo=lambda *_: None)
    monkeypatch.delenv("MEGATRON_ENV_MIRROR_MEGATRON")
    with pytest.raises(UserError, match="repository URL '-oProxyCommand=x' starts with '-'"):
        repos.mirror("megatron", "-oProxyCommand=x", echo=lambda *_: None)
    assert not pwned.exists() and not (tmp_path / "cache").exists()


def test_git_reads_paths_after_double_dash(tmp_path, monkeypatch):
    """A local mirror and a checkout go through `git clone -- SRC DEST`: a real repository
    whose directory name starts with '-' (inside an absolute path) is fetched and checked out."""
    src = tmp_path / "-src"
    commit = repo_with(src, {"README": "x\n"})
    git("tag", "v1", cwd=src)
    monkeypatch.setenv("MEGATRON_ENV_CACHE", str(tmp_path / "cache"))
    dest = repos.checkout("thing", str(src), "v1", commit, tmp_path / "-dest",
                          echo=lambda *_: None)
    assert (dest / "README").read_text() == "x\n"


def _complete_env(tmp_path: Path) -> tuple[profile.Profile, Path, Path]:
    """A real (tiny) environment recorded the way `invoke env` records one: a venv in the
    store under its lock digest, its manifest and stamp, the prefix a link to it."""
    prof = profile.load(DEFAULT)
    wanted = digest.of_file(prof.dir / lock.LOCK_FILE)
    prefix = tmp_path / "env"
    store = tmp_path / "env.d"
    target = store / "built"
    venv.create(target, with_pip=False)
    sites = [str(p) for p in target.glob("lib/python*/site-packages")]
    m = manifest.scan(sites)
    (target / env.STAMP).write_text(json.dumps(
        {"profile": prof.name, "lock_digest": wanted, "mode": "uv",
         "manifest": manifest.save(m, target / env.MANIFEST), "facts": {"sites": sites}}))
    prefix.symlink_to(target)
    return prof, prefix, store


def _state(root: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")
            if not p.is_symlink()}


def test_complete_environment_verifies_without_the_lock_or_a_write(tmp_path):
    prof, prefix, store = _complete_env(tmp_path)
    (store / ".lock").mkdir()  # a lock file that cannot be opened, as on a read-only mount
    before = _state(tmp_path)
    s = env.build(prof, prefix, echo=lambda *_: None)
    assert s.action == "up to date"
    assert _state(tmp_path) == before


def test_failure_hint_names_a_log_that_exists(tmp_path):
    """A repair's uv log is written in a temporary directory; the hint must name a file that
    is still there when the person reads it."""
    lockfile = tmp_path / "bad.txt"
    lockfile.write_text("no-such-package-xyz==1.0 --hash=sha256:" + "0" * 64 + "\n")
    venv.create(tmp_path / "v", with_pip=False)
    (tmp_path / "gone").mkdir()
    with pytest.raises(UserError) as e:
        env.uv_install_lock(tmp_path / "v" / "bin" / "python", lockfile, env.Sources([], True),
                        tmp_path / "gone" / "uv.log")
    shutil.rmtree(tmp_path / "gone")  # what the TemporaryDirectory does on the way out
    named = Path(e.value.fix.rsplit("full log: ", 1)[1])
    try:
        assert named.exists() and "no-such-package-xyz" in named.read_text()
    finally:
        named.unlink(missing_ok=True)
