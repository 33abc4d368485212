"""The suite does not depend on the state of the checkout it runs in.

A checkout where `invoke setup` ran holds an environment, setup stamps and a prepared Megatron
checkout under .megatron-env/, and downloads under .cache/. Tests ran the tool against them:
`test_mirror_credentials_never_reach_the_console`'s `invoke megatron` found the prepared
checkout, skipped the mirror it tests and stopped on "no environment". Every test now runs the
tool against a state directory of its own (conftest.own_state, MEGATRON_ENV_STATE)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from megatron_env import profile
from megatron_env.megatron import checkout
from megatron_env.pyenv import env
from megatron_env.sources import repos

from .conftest import in_own_copy
from .test_lock import copy_repo

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = "core_v0.4.0-cu121"


def test_the_tools_state_is_the_tests_own(own_state):
    prof = profile.load(DEFAULT)
    for where in (env.env_root(), env.default_prefix(prof), checkout.source_dir(prof),
                  repos.cache_dir()):
        # never the checkout's own state (its basetemp may lie inside the checkout, as nox's
        # does: the test's state is then under ROOT, but not where the tool keeps its own)
        assert where.is_relative_to(own_state), where
        assert not any(where.is_relative_to(ROOT / d) for d in (".megatron-env", ".cache")), where
    r = subprocess.run([sys.executable, "-c", "from megatron_env.pyenv import env; "
                        "print(env.env_root())"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert Path(r.stdout.strip()) == own_state / ".megatron-env", r.stderr


def _set_up(repo: Path) -> None:
    """What `invoke setup` leaves that the megatron step reads: the prepared checkout (its
    stamp written last, as checkout.prepare writes it)."""
    prof = profile.load(DEFAULT, repo / "envs")
    key = checkout.key(prof)
    src = repo / ".megatron-env" / f"{prof.name}.megatron" / key
    (src / "megatron" / "core").mkdir(parents=True)
    (src / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    (src / checkout.STAMP).write_text(json.dumps(
        {"tag": prof.megatron["tag"], "commit": prof.megatron["commit"], "patches": [],
         "patch_digest": ""}) + "\n")


def test_a_checkout_where_setup_ran_does_not_change_what_a_test_sees(tmp_path):
    """The same `invoke megatron` in a checkout holding a prepared Megatron: with the test's
    own state it mirrors (what the redaction test needs); run against the checkout's state,
    as tests once were, it stops on "no environment" without mirroring."""
    repo = copy_repo(tmp_path)
    shutil.copytree(ROOT / "patches", repo / "patches")  # the checkout's key names its series
    _set_up(repo)
    mirror = {"MEGATRON_ENV_MIRROR_MEGATRON": "http://127.0.0.1:9/Megatron-LM.git"}

    def megatron(environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "invoke", "megatron", "--profile", DEFAULT,
                               "--prefix", str(tmp_path / "env")], cwd=repo,
                              env={**environ, "PYTHONPATH": str(repo), **mirror},
                              capture_output=True, text=True, timeout=300)

    own = megatron(dict(os.environ))
    assert own.returncode != 0 and "mirroring http://127.0.0.1:9/Megatron-LM.git" in own.stderr
    checkouts = megatron(in_own_copy(os.environ))
    assert "mirroring" not in checkouts.stderr
    assert "no environment at" in checkouts.stdout + checkouts.stderr
