"""A tree with one profile has a default: an unpacked bundle runs its own checks.

A bundle carries the tool's tree with its own profile alone under envs/, not marked default
(it was not the default of the checkout it came from). `invoke check`, `invoke report` and
`invoke preflight --local`, run where the docs tell the operator to `cd`, once stopped with "0
profiles ... say default = true; exactly one must". The tree here is the one `invoke bundle`
writes into its archive (bundle.make._source_tree), for a profile that is not the checkout's
default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_env import profile
from megatron_env.bundle import make

from .conftest import user_error

NOT_DEFAULT = "core_v0.19.0-cu130"


@pytest.fixture(scope="module")
def bundle_tree(tmp_path_factory) -> Path:
    prof = profile.load(NOT_DEFAULT)
    assert not prof.is_default  # the case: the bundled profile was not its checkout's default
    tree = tmp_path_factory.mktemp("unpacked") / "source"
    make._source_tree(prof, tree)
    assert profile.names(tree / "envs") == [NOT_DEFAULT]
    return tree


def invoke(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MEGATRON_ENV_PROJECT"}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [("check", "--json"), ("report",),
                                  ("preflight", "--local", "--no-gpu-health", "--json")])
def test_an_unpacked_bundles_commands_use_its_one_profile(bundle_tree, args):
    r = invoke(bundle_tree, *args)
    assert "exactly one must" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    # check and preflight exit 1 or 2 on a host without a GPU: a verdict, not a refusal
    assert r.returncode in (0, 1, 2) and r.stdout.strip(), r.stderr[-2000:]
    assert NOT_DEFAULT in r.stdout + r.stderr


def test_profiles_marks_the_one_profile_as_the_default(bundle_tree):
    r = invoke(bundle_tree, "profiles")
    assert r.returncode == 0, r.stderr
    assert [ln.split()[:2] for ln in r.stdout.splitlines() if NOT_DEFAULT in ln] == \
        [["*", NOT_DEFAULT]]


def test_the_default_among_profiles(tmp_path):
    """One profile: it, whatever it says. Several: the one that says default = true, and none
    or two that do are refused. None at all: refused, naming where it looked."""
    envs = tmp_path / "envs"
    src = profile.envs_root()
    for name in ("core_v0.4.0-cu121", NOT_DEFAULT):
        (envs / name).mkdir(parents=True)
        (envs / name / "profile.toml").write_text((src / name / "profile.toml").read_text())
    assert profile.load(None, envs).name == "core_v0.4.0-cu121"  # the one marked default
    only = envs / "core_v0.4.0-cu121" / "profile.toml"
    only.write_text(only.read_text().replace("default = true", "default = false"))
    with user_error("profile.default-count") as e:
        profile.load(None, envs)
    assert "0 profiles" in e.value.message
    (envs / NOT_DEFAULT / "profile.toml").unlink()
    assert profile.load(None, envs).name == "core_v0.4.0-cu121"  # alone: the default
    (envs / "core_v0.4.0-cu121" / "profile.toml").unlink()
    with user_error("profile.none") as e:
        profile.load(None, envs)
    assert str(envs) in e.value.message
