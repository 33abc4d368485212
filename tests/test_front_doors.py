"""Every command of `commands.registry()`, through both front doors (invoke's tasks and the
`megatron-env` command), generated from the registry rather than listed by hand: `--help`
prints the help and exits 0 without running the command (before: `invoke collect --help`
wrote a snapshot into `./--help`, `invoke bundle --help` started a bundle, `invoke triage
--help` read `--help` as a log); a usage error is one `error:` line with its `hint:` and exit
2, and with `--json` one JSON object on stdout."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_env import commands, project

ROOT = Path(__file__).resolve().parent.parent
EXE = Path(sys.executable).with_name("megatron-env")
NAMES = list(commands.registry())


def _flag(name: str) -> str:
    return "--" + name.rstrip("_").replace("_", "-")


def _required(name: str) -> list[str]:
    cmd = commands.registry()[name]
    return [p for p, v in inspect.signature(cmd.fn).parameters.items()
            if v.default is inspect.Parameter.empty]


@pytest.fixture
def empty(tmp_path):
    """An empty working directory, with the tool's state, cache and the user's directories
    in empty directories of this test too: whatever a command writes shows up in one."""
    dirs = {n: tmp_path / n for n in ("cwd", "state", "cache", "home", "xdg")}
    for d in dirs.values():
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (project.ENV, project.CACHE_ENV)}
    env.update({project.STATE_ENV: str(dirs["state"]), project.CACHE_ENV: str(dirs["cache"]),
                "HOME": str(dirs["home"]), "XDG_CACHE_HOME": str(dirs["xdg"] / "cache"),
                "XDG_DATA_HOME": str(dirs["xdg"] / "data"), "PYTHONPATH": str(ROOT),
                # nothing a command might start reaches a network
                "UV_OFFLINE": "1", "HTTPS_PROXY": "http://127.0.0.1:9",
                "HTTP_PROXY": "http://127.0.0.1:9", "COLUMNS": "120"})
    return tmp_path, dirs["cwd"], env


def _written(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if p.is_file() or p.is_symlink())


def _door(door: str, name: str, *args: str) -> list[str]:
    if door == "invoke":
        return [sys.executable, "-m", "invoke", "-r", str(ROOT), name, *args]
    return [str(EXE), name, *args]


@pytest.mark.parametrize("door, word", [("invoke", "--help"), ("invoke", "-h"),
                                        ("megatron-env", "--help")])
@pytest.mark.parametrize("name", NAMES)
def test_help_prints_help_and_writes_nothing(name, door, word, empty):
    tmp_path, cwd, env = empty
    r = subprocess.run(_door(door, name, word), cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.lower().startswith("usage:"), r.stdout
    for p in inspect.signature(commands.registry()[name].fn).parameters:
        assert _flag(p) in r.stdout, (p, r.stdout)
    assert _written(tmp_path) == [], r.stderr
