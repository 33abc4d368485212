"""Shared helpers: build snapshot directories from the real captures under fixtures/."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from megatron_env.errors import UserError
from megatron_env.setup.steps import STEPS

from .wheelhouse import cache_root
from .wheelhouse import ensure as ensure_wheelhouse

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURES = FIXTURES / "captures"
H200 = FIXTURES / "h200-1gpu"


@pytest.fixture
def make_snapshot(tmp_path):
    """make_snapshot(base=H200, **{snapshot_name: capture_name or text}) -> a snapshot dir."""
    counter = iter(range(1000))

    def make(base: Path | None = H200, **files: str) -> Path:
        d = tmp_path / f"snap{next(counter)}"
        if base is not None:
            shutil.copytree(base, d)
        else:
            d.mkdir()
        for key, value in files.items():
            name = key.replace("_", "-") + ".txt" if not key.endswith("json") else key
            target = d / name
            if value is None:
                target.unlink(missing_ok=True)
            elif "\n" not in value and (CAPTURES / value).is_file():
                shutil.copy(CAPTURES / value, target)
            else:
                target.write_text(value)
        return d

    return make


_SKIPPED: list[str] = []


def _note_skip(report) -> None:
    # a strict xfail is not a skip: it ran, and it fails the run the day it passes
    if report.skipped and not hasattr(report, "wasxfail"):
        why = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        _SKIPPED.append(f"{report.nodeid}: {why}")


pytest_runtest_logreport = pytest_collectreport = _note_skip


def pytest_sessionfinish(session, exitstatus):
    """With CI set, a skipped test fails the run: CI has every tool the tests need (it installs
    them), so a skip there is a test that silently stopped testing."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller sees every report and decides once
    if os.environ.get("CI") and _SKIPPED and exitstatus == 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line("CI is set and these tests were skipped (a failure here):\n  "
                            + "\n  ".join(_SKIPPED), red=True)
        session.exitstatus = 1


@pytest.fixture(scope="session", autouse=True)
def shared_uv_cache():
    """uv's cache for every test run on this machine: the environments unpack 2.6 GB of wheels
    from the wheelhouse, once per machine instead of once per run. The wheelhouse's path is
    stable (keyed by the lock), so uv's entries for it are reused, not piled up. A test that
    damages a cache entry makes its own cache (tests/test_manifest.py)."""
    old = os.environ.get("UV_CACHE_DIR")
    os.environ["UV_CACHE_DIR"] = str(cache_root() / "uv")
    yield
    if old is None:
        os.environ.pop("UV_CACHE_DIR", None)
    else:
        os.environ["UV_CACHE_DIR"] = old


STATE_ENV = "MEGATRON_ENV_STATE"  # megatron_env.project.STATE_ENV
CACHE_ENV = "MEGATRON_ENV_CACHE"  # megatron_env.sources.repos.CACHE_ENV
OWN_STATE = (STATE_ENV, CACHE_ENV)


@pytest.fixture(scope="session", autouse=True)
def _session_state(tmp_path_factory):
    """What session and module fixtures run against: a state directory of this session (and
    its cache in it), never the checkout's nor a MEGATRON_ENV_CACHE of the user's shell."""
    saved = {k: os.environ.pop(k, None) for k in OWN_STATE}
    os.environ[STATE_ENV] = str(tmp_path_factory.mktemp("tool-state"))
    yield
    for k, v in saved.items():
        os.environ.pop(k, None)
        if v is not None:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def own_state(tmp_path_factory, monkeypatch):
    """Every test runs the tool against its own state, whatever the checkout holds: a checkout
    where `invoke setup` ran has its environment, setup stamps and Megatron checkout under
    .megatron-env/ and its downloads under .cache/, and a test that ran against them saw "up
    to date" or "no environment" where a fresh clone sees neither. The tool's state
    (environments, stamps, the Megatron checkout, run directories, and the cache under it)
    goes to a directory of this test (MEGATRON_ENV_STATE, inherited by the tool's processes);
    a MEGATRON_ENV_CACHE of the user's shell is not used. A test that needs a cache of its
    own sets MEGATRON_ENV_CACHE; one that works in its own copy of the repository and reads
    the state back from there drops both (`in_own_copy`)."""
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv(STATE_ENV, str(tmp_path_factory.mktemp("tool-state")))
    return Path(os.environ[STATE_ENV])


def in_own_copy(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a tool process run in a test's own copy of the repository that keeps its
    state there (.megatron-env/ and .cache/, as a checkout's own setup leaves them)."""
    return {k: v for k, v in env.items() if k not in OWN_STATE}


@pytest.fixture(scope="session")
def wheelhouse():
    """Every wheel of the default profile's lock (about 2.6 GB), kept between runs: the only
    package source of the environment tests (tests/wheelhouse.py)."""
    return ensure_wheelhouse()


def kill_when_installing(proc: subprocess.Popen, store: Path, old: Path | None = None,
                         timeout: float = 600) -> None:
    """SIGKILL `proc`'s process group as soon as a new environment under `store` (a directory
    other than `old`) has started filling its site-packages: an interruption mid-install. A
    process that ended first fails the test at once, with what it said (before: the poll went
    on for `timeout` seconds after it had exited)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        new = [d for d in store.glob("*") if d.is_dir() and d != old] if store.exists() else []
        if any(list(d.glob("lib/python3.10/site-packages/*")) for d in new):
            break
        if proc.poll() is not None:
            said = proc.stdout.read()[-3000:] if proc.stdout else ""
            text = said if isinstance(said, str) else said.decode(errors="replace")
            pytest.fail(f"the process ended (exit {proc.returncode}) before its install "
                        f"started: {text}")
        time.sleep(0.05)
    else:
        pytest.fail("the install never started")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextmanager
def user_error(kind: str) -> Iterator[pytest.ExceptionInfo]:
    """`with user_error("source.sha256") as e:` the block raises a UserError of that kind (tests
    decide by the kind, not by the message's wording; what the message must name is asserted
    on `e.value.message` by the test itself)."""
    with pytest.raises(UserError) as e:
        yield e
    assert e.value.kind == kind, f"{e.value.kind!r} != {kind!r}: {e.value.message}"


def statuses(out: str) -> dict[str, str]:
    """The setup summary's table as {step: status} (`check  done`, `env  up to date`, ...): what
    a user reads of each step, the rows of the steps that ran or were planned."""
    rows = {}
    for line in out.splitlines():
        m = re.match(rf"^({'|'.join(STEPS)})\s+(done|up to date|skipped|failed|not run|"
                     r"would run)\b", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def tiny_profile(python: str, *, purpose: str, repo: str = "https://github.com/NVIDIA/Megatron-LM.git",
                 commit: str = "a" * 40, packages: tuple[str, ...] = ("tinytop",)) -> str:
    """The tests' small profile (CUDA 12.1, torch 2.1.0, Megatron core_v0.4.0, ninja from
    conda-forge): one text for the flows that make a checkout of their own around it."""
    listed = ", ".join(f'"{p}"' for p in packages)
    return f"""description = "tiny: {purpose}"
default = true

[python]
version = "{python}"

[cuda]
version = "12.1"
min_driver = "530.30.02"
archs = ["9.0"]

[torch]
version = "2.1.0"

[megatron]
repo = "{repo}"
tag = "core_v0.4.0"
commit = "{commit}"

[requirements]
packages = [{listed}]

[conda]
channels = ["conda-forge"]
packages = ["ninja"]
"""


def free_port() -> int:
    """A TCP port free on this host now (the kernel's choice for port 0): torchrun's rendezvous
    in two test runs at once on one machine must not meet on a fixed port (EADDRINUSE)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: where an interrupt lands in a repair or reinstall under way: the signal (SIGINT to the
#: process group, as a terminal's Ctrl-C; SIGTERM to the tool, as a scheduler's) and how many
#: seconds after the work began
INTERRUPTS = [(signal.SIGINT, 0.0), (signal.SIGINT, 0.03), (signal.SIGTERM, 0.06),
              (signal.SIGINT, 0.12), (signal.SIGTERM, 0.25), (signal.SIGINT, 0.5)]


def until_said(p: subprocess.Popen, err: Path, words: str, timeout: float, never: str) -> None:
    """Wait (polling every 2 ms) until `err` holds `words`; fail with `never` and the output if
    the process ends first or `timeout` seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if words in err.read_text():
            return
        assert p.poll() is None, err.read_text()
        time.sleep(0.002)
    pytest.fail(f"{never}: {err.read_text()}")


def interrupt(p: subprocess.Popen, sig: int, after: float) -> None:
    """`after` seconds on, SIGINT to `p`'s process group (a terminal's Ctrl-C: its children,
    uv, get it too) or `sig` to `p` alone (a scheduler's SIGTERM to the tool)."""
    time.sleep(after)
    if sig == signal.SIGINT:
        os.killpg(p.pid, sig)
    else:
        os.kill(p.pid, sig)
