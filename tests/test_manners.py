"""Manners (issue 41): -j means jobs in both front doors and --json has no short flag; --jobs
where nothing compiles says so; completion for bash and fish offers profile, kernel and step
names; a uv cache that cannot be written gets its own hint, not the index's. Real bash, real
fish (where installed), real uv on a real read-only mount."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_env import recipes
from megatron_env.commands import main
from megatron_env.profile import load_all

from .test_console import _complete
from .tmpfs import mounted

ROOT = Path(__file__).resolve().parent.parent
PROFILE = "core_v0.19.0-cu130"  # Python 3.12


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "megatron_env", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **env},
                          capture_output=True, text=True, timeout=300)


def _shorts(parser) -> dict[str, str]:
    return {o: a.dest for a in parser._actions for o in a.option_strings if len(o) == 2}


def test_dash_j_is_jobs_and_json_has_no_short_flag_in_either_front_door():
    """Before: `setup -j` was --json (and invoke gave --jobs -s)."""
    subs = next(a for a in main.parser()._actions if hasattr(a, "choices") and a.choices)
    for name, sub in subs.choices.items():
        shorts = _shorts(sub)
        assert shorts.get("-j") in (None, "jobs"), name
    assert _shorts(subs.choices["setup"])["-j"] == "jobs"
    r = subprocess.run([sys.executable, "-m", "invoke", "setup", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0].rstrip(","): line for line in r.stdout.splitlines()
             if line.strip().startswith("-")}
    assert "--jobs" in lines["-j"] and lines["--json"].lstrip().startswith("--json")


@pytest.mark.parametrize("argv, why", [
    (["--only", "lock"], "the builds step is not part of this run"),
    (["--only", "builds", "--no-builds"], "the builds step skipped: --no-builds given"),
])
def test_jobs_where_nothing_compiles_says_so(argv, why, tmp_path):
    r = _cli("setup", "--profile", PROFILE, "--prefix", str(tmp_path / "e"), "-j", "4", *argv)
    assert r.returncode == 0, r.stderr
    assert f"warning: --jobs 4 changed nothing: no kernel compiles here ({why})" in r.stderr


def _expected() -> dict[str, set[str]]:
    return {"profile": {p.name for p in load_all()}, "kernel": set(recipes.declared())}


def test_bash_completes_profile_kernel_and_step_names():
    """Before: only commands and option names."""
    script = _cli("completion", "bash").stdout
    want = _expected()
    assert set(_complete(script, "megatron-env", "setup", "--profile", "")) == want["profile"]
    assert set(_complete(script, "megatron-env", "check", "-p", "")) == want["profile"]
    assert set(_complete(script, "megatron-env", "build", "")) >= want["kernel"] | {"all"}
    assert set(_complete(script, "megatron-env", "bundle", "--without", "")) == want["kernel"]
    assert _complete(script, "megatron-env", "setup", "--only", "bu") == ["builds"]
    assert _complete(script, "megatron-env", "--cache-dir", "x", "setup", "--dry") == ["--dry-run"]
    assert _complete(script, "megatron-env", "completion", "f") == ["fish"]


def test_fish_completion():
    """Before: `completion fish` was refused (bash and zsh only)."""
    r = _cli("completion", "fish")
    assert r.returncode == 0, r.stderr
    want = _expected()
    lines = r.stdout.splitlines()
    setup_profile = [x for x in lines if "'__fish_seen_subcommand_from setup' -l profile" in x]
    assert len(setup_profile) == 1 and all(p in setup_profile[0] for p in want["profile"])
    fish = shutil.which("fish")
    if fish is None:  # the script's lines are checked above; the shell runs it where it exists
        return

    def complete(line: str) -> list[str]:
        c = subprocess.run([fish, "-c", f"source {script}; complete -C '{line}'"],
                           capture_output=True, text=True, timeout=60)
        assert c.returncode == 0, c.stderr
        return [x.split("\t")[0] for x in c.stdout.splitlines()]

    script = Path(os.environ.get("TMPDIR", "/tmp")) / f"megatron-env-{os.getpid()}.fish"
    script.write_text(r.stdout)
    try:
        assert set(complete("megatron-env setup --profile ")) == want["profile"]
        assert set(complete("megatron-env build ")) == want["kernel"] | {"all"}
        assert "profiles" in complete("megatron-env prof")
        assert complete("megatron-env setup --dry") == ["--dry-run"]
    finally:
        script.unlink()


@pytest.fixture
def read_only_dir(tmp_path):
    with mounted(tmp_path / "ro", "1m", read_only=True) as d:
        yield d


def test_a_read_only_uv_cache_gets_its_own_hint(read_only_dir, tmp_path):
    """Before: `uv venv failed: ... Read-only file system` with `hint: check the interpreter`."""
    if sys.version_info[:2] != (3, 12):
        pytest.skip("the profile's Python (3.12) is not the one running the tests")
    r = _cli("env", "--profile", PROFILE, "--prefix", str(tmp_path / "e"), "--python",
             sys.executable, UV_CACHE_DIR=str(read_only_dir))
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith(("error:", "hint:"))]
    assert lines[0] == (f"error: uv's cache {read_only_dir} cannot be written (read-only file "
                        "system); uv writes to its cache even to read from it"), r.stderr
    assert lines[1].startswith("hint: set UV_CACHE_DIR to a writable directory")
    assert not (tmp_path / "e").exists() and not (tmp_path / "e.d").exists()  # nothing made


def test_a_read_only_uv_cache_is_said_by_bundle_too(read_only_dir, tmp_path):
    """The tool's wheel is built with `uv build`: before, `building the megatron-env wheel
    failed` with a hint about setuptools and the index."""
    r = _cli("bundle", "--adopt", "--profile", PROFILE, "--out", str(tmp_path / "b.tar"),
             UV_CACHE_DIR=str(read_only_dir))
    assert r.returncode == 2, r.stderr
    assert f"error: uv's cache {read_only_dir} cannot be written" in r.stderr
    assert not list(tmp_path.glob("b.tar*"))
