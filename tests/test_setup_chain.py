"""Any order of the front doors converges: from any state that `invoke setup` (with --from,
--only, --verify-deep, --no-builds, --dry-run), `invoke env`, `invoke megatron`, `invoke build`,
a kill -9 in the middle of any of them, or a hand-deleted stamp or file can leave, one
`invoke setup` reaches ready and the next reports every step up to date.

The real tool (real uv, real git, real editable install) on a small profile made here: a lock
of two tiny wheels in a local find-links directory (one a stand-in named torch: no GPU or CUDA
torch is needed by the chain's logic), and a tiny Megatron-like repository with a tag, a patch
series and an in-tree PEP 660 build backend (the editable install runs without setuptools or an
index). The kernel builds are skipped, as on every machine without a GPU; that is the only
stand-in (there are no kernels to build in the profile).

MEGATRON_ENV_CHAIN_EXAMPLES raises the number of sequences hypothesis runs (default 6, about 40 s here).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)

from .conftest import statuses, tiny_profile
from .gitrepo import git, repo_with

ROOT = Path(__file__).resolve().parent.parent
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
STEPS = ["check", "lock", "env", "sources", "patches", "builds", "megatron", "verify"]
STAMPED = ["lock", "env", "megatron", "verify"]  # check runs every time; the builds: no GPU

pytestmark = pytest.mark.slow


def make_wheel(dest: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A real, installable py3-none-any wheel with METADATA, WHEEL and RECORD."""
    dist = f"{name}-{version}.dist-info"
    data = {k: v.encode() for k, v in files.items()}
    data[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    data[f"{dist}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                             b"Tag: py3-none-any\n")
    record = io.StringIO()
    w = csv.writer(record, lineterminator="\n")
    for path, blob in data.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(blob).digest()).rstrip(b"=").decode()
        w.writerow([path, f"sha256={h}", len(blob)])
    w.writerow([f"{dist}/RECORD", "", ""])
    data[f"{dist}/RECORD"] = record.getvalue().encode()
    out = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, blob in data.items():
            z.writestr(path, blob)
    return out


# torch as the chain asks it: __version__, version.cuda, the C++ ABI flag; no NCCL, no cuDNN
TORCH = {
    "torch/__init__.py": "__version__ = '2.1.0'\nfrom torch import _C, backends, cuda, version\n",
    "torch/version.py": "__version__ = '2.1.0'\ncuda = '12.1'\n",
    "torch/_C.py": "_GLIBCXX_USE_CXX11_ABI = False\n",
    "torch/cuda/__init__.py": "from torch.cuda import nccl\n",
    "torch/cuda/nccl.py": "def version():\n    raise RuntimeError('a stand-in has no NCCL')\n",
    "torch/backends/__init__.py": "from torch.backends import cudnn\n",
    "torch/backends/cudnn.py": "def version():\n    return None\n",
}

# PEP 517/660 hooks in the tree: the editable install is a .pth naming the checkout
BACKEND = textwrap.dedent('''\
    import base64, csv, hashlib, io, os, zipfile
    NAME, VERSION = "megatron_core", "0.4.0"
    DIST = f"{NAME}-{VERSION}.dist-info"

    def _wheel(directory, files):
        files = {**files, f"{DIST}/METADATA": f"Metadata-Version: 2.1\\nName: megatron-core\\n"
                 f"Version: {VERSION}\\n",
                 f"{DIST}/WHEEL": "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
        rec = io.StringIO()
        w = csv.writer(rec, lineterminator="\\n")
        for p, t in files.items():
            h = base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=")
            w.writerow([p, "sha256=" + h.decode(), len(t.encode())])
        w.writerow([f"{DIST}/RECORD", "", ""])
        files[f"{DIST}/RECORD"] = rec.getvalue()
        name = f"{NAME}-{VERSION}-py3-none-any.whl"
        with zipfile.ZipFile(os.path.join(directory, name), "w") as z:
            for p, t in files.items():
                z.writestr(p, t)
        return name

    def get_requires_for_build_wheel(config_settings=None):
        return []

    get_requires_for_build_editable = get_requires_for_build_wheel

    def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
        return _wheel(wheel_directory, {"megatron_core.pth": os.path.abspath(".") + "\\n"})

    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        return build_editable(wheel_directory)
    ''')

MEGATRON = {
    "megatron/core/__init__.py": "__version__ = '0.4.0'\n",
    "megatron/core/datasets/__init__.py": "",
    "megatron/core/datasets/helpers.py": "def build_sample_idx(a, b):\n    return a + b\n",
    "_build/backend.py": BACKEND,
    "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                      'backend-path = ["_build"]\n\n[project]\nname = "megatron-core"\n'
                      'version = "0.4.0"\n',
}

PATCH = """Subject: mark the tree as patched

Why: the test sees that the series was applied before the install.

diff --git a/megatron/core/__init__.py b/megatron/core/__init__.py
--- a/megatron/core/__init__.py
+++ b/megatron/core/__init__.py
@@ -1 +1,2 @@
 __version__ = '0.4.0'
+PATCHED = 1
"""


def make_world(root: Path) -> tuple[Path, dict[str, str]]:
    """(a checkout of this tool holding the tiny profile and its lock, the variables to run it
    with). The lock is made by `invoke lock` from the find-links directory."""
    wheels = root / "wheels"
    wheels.mkdir(parents=True)
    make_wheel(wheels, "torch", "2.1.0", TORCH)
    make_wheel(wheels, "tinytop", "1.0", {"tinytop/__init__.py": "X = 1\n"})
    up = root / "megatron-work"
    commit = repo_with(up, MEGATRON, "megatron")
    git("tag", "core_v0.4.0", cwd=up)
    bare = root / "Megatron-LM.git"
    git("clone", "-q", "--bare", up, bare, cwd=root)
    work = root / "repo"
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, text=True,
                           check=True).stdout.split()
    for rel in files:
        if rel.startswith("megatron_env/") or rel in ("tasks.py", "pyproject.toml"):
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, work / rel)
    (work / "envs/tiny").mkdir(parents=True)
    (work / "envs/tiny/profile.toml").write_text(tiny_profile(
        PY, purpose="the setup chain's test profile", repo=str(bare), commit=commit,
        packages=("torch", "tinytop")))
    (work / "patches/megatron/core_v0.4.0").mkdir(parents=True)
    (work / "patches/megatron/core_v0.4.0/0001-mark-patched.patch").write_text(PATCH)
    # uv 0.13.9 reads no UV_NO_INDEX: an empty local index stands in for "no index" (nothing
    # may come from a real one, not even a newer torch)
    (root / "no-index").mkdir()
    env = {**os.environ, "PYTHONPATH": str(work), "UV_FIND_LINKS": str(wheels),
           "UV_DEFAULT_INDEX": (root / "no-index").as_uri(), "UV_NO_CONFIG": "1",
           "UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1", "COLUMNS": "250",
           "MEGATRON_ENV_MIN_FREE_GB": "0"}
    for name in ("MEGATRON_ENV_CACHE", "MEGATRON_ENV_STATE", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL",
                 "UV_INDEX"):
        env.pop(name, None)
    r = invoke(work, env, "lock", "--profile", "tiny", "--python", sys.executable)
    assert r.returncode == 0, r.stdout + r.stderr
    return work, env


def invoke(work: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)


class Chain:
    """One checkout with the tiny profile, and the front doors as methods."""

    def __init__(self, work: Path, env: dict):
        self.work, self.env = work, env
        self.prefix = work / ".megatron-env" / "tiny"
        self.stamps = work / ".megatron-env" / "tiny.setup"
        self.log: list[str] = []

    def run(self, *args: str) -> subprocess.CompletedProcess:
        self.log.append(" ".join(args))
        return invoke(self.work, self.env, *args, "--profile", "tiny")

    def setup(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("setup", *args)

    def killed(self, args: tuple[str, ...], after: float) -> None:
        self.log.append(f"{' '.join(args)} (kill -9 after {after:.2f} s)")
        p = subprocess.Popen([sys.executable, "-m", "invoke", *args, "--profile", "tiny"],
                             cwd=self.work, env=self.env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(after)
        with contextlib.suppress(ProcessLookupError):  # it ended before the kill
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()

    def python(self) -> Path:
        return self.prefix / "bin" / "python"

    def converges(self) -> None:
        """One setup reaches ready; the next finds every step up to date; Megatron imports,
        patched."""
        first = self.setup()
        trail = "\n".join(self.log)
        assert first.returncode == 0, f"{trail}\n{first.stdout[-3000:]}{first.stderr[-3000:]}"
        s = statuses(first.stdout)
        assert set(s) == set(STEPS) and all(
            v in ("done", "up to date", "skipped") for v in s.values()), f"{trail}\n{s}"
        second = self.setup()
        s = statuses(second.stdout)
        want = {**dict.fromkeys(STAMPED, "up to date"), "check": "done",
                **dict.fromkeys(["sources", "patches", "builds"], "skipped")}
        assert second.returncode == 0 and s == want, \
            f"{trail}\n{second.stdout[-3000:]}{second.stderr[-2000:]}"
        out = subprocess.run([self.python(), "-c", "import megatron.core as m, "
                              "megatron.core.datasets.helpers as h; print(m.PATCHED, "
                              "h.build_sample_idx(2, 3))"], capture_output=True, text=True,
                             cwd="/")
        assert out.stdout.split() == ["1", "5"], out.stderr
        self.log.append("-- converged")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("chain")
    yield make_world(root)
    shutil.rmtree(root, ignore_errors=True)


def fresh(world, name: str) -> Chain:
    """A copy of the world's checkout with nothing set up yet (the lock made once)."""
    work, env = world
    dest = work.parent / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(work, dest, ignore=shutil.ignore_patterns(".megatron-env", ".cache"),
                    symlinks=True)
    return Chain(dest, {**env, "PYTHONPATH": str(dest)})


def test_the_issue_sequence_ends_up_to_date(world):
    """`setup; setup --verify-deep; megatron; setup` ended in `env failed megatron-core
    changed, and the lock does not install it` (the deep re-check had put megatron-core into
    the environment's manifest; `invoke megatron` re-ran for nothing and changed its files);
    neither --verify-deep nor --from megatron cleared it."""
    c = fresh(world, "issue")
    assert c.setup().returncode == 0
    deep = c.setup("--verify-deep")
    assert deep.returncode == 0, deep.stdout[-2000:]
    m = c.run("megatron")
    assert m.returncode == 0 and statuses(m.stdout) == {"megatron": "up to date"}, m.stdout
    last = c.setup()
    assert last.returncode == 0, last.stdout[-3000:]
    assert statuses(last.stdout) == {"check": "done", "lock": "up to date", "env": "up to date",
                                     "sources": "skipped", "patches": "skipped",
                                     "builds": "skipped", "megatron": "up to date",
                                     "verify": "up to date"}
    plan = statuses(c.setup("--dry-run").stdout)
    assert [s for s, v in plan.items() if v == "would run"] == ["check"], plan
    # megatron re-installed on purpose (a new patch series digest would too): still no trap
    (c.stamps / "megatron.json").unlink()
    again = c.run("megatron")
    assert statuses(again.stdout) == {"megatron": "done"}, again.stdout[-2000:]
    c.converges()


def test_a_standalone_env_writes_the_chains_stamp(world):
    c = fresh(world, "standalone")
    r = c.run("env")
    assert r.returncode == 0 and "built at" in r.stdout, r.stdout + r.stderr[-2000:]
    plan = c.setup("--dry-run")
    s = statuses(plan.stdout)
    # the lock was never checked: it runs; env's digest already names what the lock step will
    # be stamped with (the two front doors agree): not built again
    assert s["env"] == "up to date" and s["lock"] == "would run", plan.stdout
    c.converges()
    r = c.run("env")
    assert "up to date" in r.stdout
    assert statuses(c.setup().stdout)["env"] == "up to date"


def test_a_bad_stamp_is_run_again_with_its_reason(world):
    c = fresh(world, "badstamp")
    assert c.setup().returncode == 0
    (c.stamps / "megatron.json").write_text('{"digest": ')
    plan = c.setup("--dry-run")
    assert statuses(plan.stdout)["megatron"] == "would run"
    assert "not a stamp" in " ".join(plan.stdout.split()), plan.stdout
    c.converges()


def test_a_removed_file_of_the_editable_install_runs_the_megatron_step(world):
    """The environment's manifest leaves megatron-core out (the megatron step owns it): its
    own re-check notices the editable install's .pth gone (hypothesis found this one)."""
    c = fresh(world, "pth")
    assert c.setup().returncode == 0
    site = next(c.prefix.resolve().glob("lib/python*/site-packages"))
    (site / "megatron_core.pth").unlink()
    plan = c.setup("--dry-run")
    assert statuses(plan.stdout)["megatron"] == "would run"
    assert "megatron-core is missing" in " ".join(plan.stdout.split()), plan.stdout
    c.converges()


EXAMPLES = int(os.environ.get("MEGATRON_ENV_CHAIN_EXAMPLES", "6"))
SEQUENCES: list[int] = []  # steps of each sequence run (the long run reports them)


class FrontDoors(RuleBasedStateMachine):
    """Rules: the front doors, kill -9 in the middle of one, hand-deleted stamps and files.
    Each sequence ends (teardown) with the convergence check; `converge` checks it midway."""

    world: tuple[Path, dict] | None = None

    @initialize()
    def start(self):
        self.c = fresh(self.world, "machine")
        self.steps = 0

    @rule(args=st.sampled_from([(), ("--verify-deep",), ("--no-builds",), ("--dry-run",),
                                *(("--from", s) for s in STEPS),
                                *(("--only", s) for s in STEPS)]))
    def setup(self, args):
        self.steps += 1
        self.c.setup(*args)

    @rule(door=st.sampled_from([("env",), ("megatron",), ("build", "all"),
                                ("env", "--verify-deep")]))
    def other_door(self, door):
        self.steps += 1
        self.c.run(*door)

    @rule(door=st.sampled_from([("setup",), ("setup", "--verify-deep"), ("megatron",),
                                ("env",), ("setup", "--from", "megatron")]),
          after=st.floats(0.05, 2.0))
    def kill(self, door, after):
        self.steps += 1
        self.c.killed(door, after)

    @rule(step=st.sampled_from(STAMPED), junk=st.booleans())
    def break_stamp(self, step, junk):
        self.steps += 1
        self.c.log.append(f"stamp {step} {'garbled' if junk else 'deleted'}")
        p = self.c.stamps / f"{step}.json"
        if p.exists():
            p.write_text("{not json") if junk else p.unlink()

    @rule(what=st.sampled_from(["manifest", "env-stamp", "package", "link", "checkout",
                                "torch-file", "megatron-pth"]))
    def delete(self, what):
        self.steps += 1
        self.c.log.append(f"deleted {what}")
        real = self.c.prefix.resolve() if self.c.prefix.is_symlink() else None
        site = next(real.glob("lib/python*/site-packages"), None) if real else None
        targets = {
            "manifest": real and real / ".megatron-env-manifest.json",
            "env-stamp": real and real / ".megatron-env.json",
            "package": site and site / "tinytop" / "__init__.py",
            "link": self.c.prefix if self.c.prefix.is_symlink() else None,
            "checkout": self.c.work / ".megatron-env" / "tiny.megatron",
            "torch-file": site and site / "torch" / "version.py",
            "megatron-pth": site and site / "megatron_core.pth",
        }
        t = targets[what]
        if t is not None and (t.exists() or t.is_symlink()):
            shutil.rmtree(t) if t.is_dir() and not t.is_symlink() else t.unlink()

    @rule()
    def converge(self):
        self.steps += 1
        self.c.converges()

    def teardown(self):
        if getattr(self, "c", None) is None:
            return
        try:
            self.c.converges()
            SEQUENCES.append(self.steps)
        finally:
            shutil.rmtree(self.c.work, ignore_errors=True)


def test_any_sequence_of_front_doors_converges(world):
    FrontDoors.world = world
    SEQUENCES.clear()
    run_state_machine_as_test(FrontDoors, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=8, deadline=None,
        suppress_health_check=list(HealthCheck)))
    print(f"\n{len(SEQUENCES)} sequences converged, {sum(SEQUENCES)} rules in all "
          f"(max_examples={EXAMPLES})")
