"""Ready means proven: `invoke setup` exits 0 only when every part the profile declares is
there and works in the interpreter the environment records (built or adopted): each kernel
installed with its files and its compiled modules importing, Megatron importing from its pinned
checkout, the lock's packages installed. A stamp stands for a check and never outranks it:
whatever a step made that is gone or changed, that step runs again (a kernel from the wheel
cache in seconds, not a rebuild).

The real tool on the setup chain's tiny world (tests/test_setup_chain.py: real uv, git and
editable install, a stand-in torch wheel) plus a real compiled kernel (tests/kernelstandin.py:
a C extension built through the recipe, the wheel cache and the pool, as flash-attn is on a
GPU node). Each rule of the state machine does something a user or a site does (setup, set up
adopted, uninstall a kernel, delete its .so, remove Megatron's install or a lock package,
replace the interpreter, interrupt a setup, `clean`, change a pin); the invariant after each
setup: exit 0 implies every declared part verifies, checked from outside the tool.

MEGATRON_ENV_READY_EXAMPLES raises the number of sequences (default 3: well under a minute
here for the machine; the single scenarios below add about as much).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
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

from megatron_env.pyenv import uv

from . import kernelstandin
from .test_setup_chain import Chain, invoke, make_world, statuses

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The chain's world with the kernel stand-in pinned in its profile, and an interpreter
    to adopt (a venv holding the lock's wheels, as an image's own environment would)."""
    root = tmp_path_factory.mktemp("ready")
    work, env = make_world(root)
    sdist, sha = kernelstandin.make_sdist(root)
    kernelstandin.add_to(work, work / "envs/tiny/profile.toml", sha)
    env = {**env, kernelstandin.SOURCE_VAR: str(sdist)}
    yield work, env
    shutil.rmtree(root, ignore_errors=True)


def adoptable(where: Path, env: dict) -> Path:
    """A venv of this Python with the lock's wheels (the stand-in torch, tinytop): -> python."""
    subprocess.run([uv.exe(), "venv", "-q", "--python", sys.executable, where], check=True,
                   env=env)
    py = where / "bin" / "python"
    subprocess.run([uv.exe(), "pip", "install", "-q", "--python", py, "torch", "tinytop"],
                   check=True, env=env)
    return py


class Node(Chain):
    """One checkout of the world; `args` are what every setup of it is given (--adopt)."""

    def __init__(self, work: Path, env: dict, adopt: Path | None = None):
        super().__init__(work, env)
        self.adopt = adopt
        self.args: tuple[str, ...] = ("--adopt", str(adopt)) if adopt else ()

    def setup(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("setup", *self.args, *args)

    def python(self) -> Path:
        return self.adopt or self.prefix / "bin" / "python"

    def site(self) -> Path:
        out = subprocess.run([self.python(), "-c", "import sysconfig; "
                              "print(sysconfig.get_path('platlib'))"],
                             capture_output=True, text=True, check=True)
        return Path(out.stdout.strip())

    def proven(self, answer: int = 42) -> list[str]:
        """What does not work of what the profile declares, asked of the interpreter from
        outside the tool (empty: all of it works)."""
        probe = ("import importlib, json, sys\n"
                 "from importlib import metadata\n"
                 "bad = []\n"
                 "for m in sys.argv[1:]:\n"
                 "    try:\n"
                 "        mod = importlib.import_module(m)\n"
                 "    except Exception as e:\n"
                 "        bad.append(f'{m}: {e}')\n"
                 "import tinykern._C as k\n"
                 f"assert k.answer() == {answer}, k.answer()\n"
                 "import megatron.core as c\n"
                 "print(json.dumps({'bad': bad, 'core': c.__file__, 'patched': c.PATCHED,\n"
                 "    'dists': sorted(d.metadata['Name'] for d in metadata.distributions())}))\n")
        py = self.python()
        if not py.exists():
            return [f"no interpreter at {py}"]
        # an adopted image may lack packages of the lock (the env step lists them: an NGC
        # container has its own set); a built environment has every one
        lock = [] if self.adopt else ["tinytop"]
        r = subprocess.run([py, "-c", probe, "torch", *lock, kernelstandin.MODULE,
                            "megatron.core.datasets.helpers"], capture_output=True, text=True,
                           cwd="/")
        if r.returncode != 0:
            return [r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "no output"]
        doc = json.loads(r.stdout.splitlines()[-1])
        bad = list(doc["bad"])
        checkout = (self.work / ".megatron-env" / "tiny.megatron").resolve()
        if not Path(doc["core"]).resolve().is_relative_to(checkout):
            bad.append(f"megatron.core from {doc['core']}, not under {checkout}")
        return bad


def test_kernels_uninstalled_from_an_adopted_node_are_put_back_from_the_wheel_cache(world,
                                                                                    tmp_path):
    """The H100 record's converge/: kernels uninstalled from the adopted interpreter, setup
    state kept. Setup said "builds up to date", "setup ready" and `import flash_attn` failed.
    Now the builds step sees the kernel gone and reinstalls the cached wheel (no compiler)."""
    work, env = world
    n = fresh_node(world, "adopted", adopt=adoptable(tmp_path / "image", env))
    first = n.setup()
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert statuses(first.stdout)["builds"] == "done", first.stdout
    assert n.proven() == []
    subprocess.run([uv.exe(), "pip", "uninstall", "-q", "--python", n.python(),
                    kernelstandin.NAME], check=True, env=env)
    assert n.proven() != []
    n.env = {**n.env, "CC": "/bin/false"}  # no compiler may run: the cached wheel is installed
    again = n.setup()
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    s = statuses(again.stdout)
    assert s["builds"] == "done" and "tinykern is not installed" in again.stderr, again.stderr
    assert "cache hit, installing" in again.stderr
    assert n.proven() == []
    assert statuses(n.setup().stdout)["builds"] == "up to date"


def test_a_deleted_kernel_so_runs_the_builds_step_again(world):
    n = fresh_node(world, "so")
    assert n.setup().returncode == 0
    so = next((n.site() / "tinykern").glob("_C*.so"))
    so.unlink()
    plan = n.setup("--dry-run")
    assert statuses(plan.stdout)["builds"] == "would run", plan.stdout
    assert "tinykern is missing" in " ".join(plan.stdout.split()), plan.stdout
    r = n.setup()
    assert r.returncode == 0 and n.proven() == [], r.stdout[-3000:]


def test_preflight_local_runs_the_adopted_interpreter(world, tmp_path):
    """`invoke preflight --local` ran <prefix>/bin/python, which an adopted environment has not
    (exit 127 on every adopted node); it runs the interpreter the setup recorded."""
    work, env = world
    py = adoptable(tmp_path / "image", env)
    n = fresh_node(world, "preflight", adopt=py)
    assert n.setup().returncode == 0
    run_dir = tmp_path / "run"
    r = invoke(n.work, n.env, "preflight", "--local", "--json", "--profile", "tiny",
               "--run-dir", str(run_dir))
    node = json.loads(next(run_dir.glob("*/node.json")).read_text())
    assert node["python"] == str(py), r.stdout[-2000:] + r.stderr[-2000:]
    fp = json.loads(next(run_dir.glob("*/fingerprint.json")).read_text())
    assert fp["torch"] == "2.1.0" and not any("no interpreter" in e for e in fp["errors"]), fp
    # report and build-check ask the same interpreter
    bc = invoke(n.work, n.env, "build-check", "--profile", "tiny")
    assert bc.returncode == 0 and str(py) in bc.stdout, bc.stdout + bc.stderr


def test_a_relative_python_is_the_one_named(world, tmp_path):
    """`--python ./relative/path` said "command not found" and hinted a rebuild."""
    work, env = world
    py = adoptable(work.parent / "relimage", env)
    n = fresh_node(world, "relative", adopt=py)
    assert n.setup().returncode == 0
    rel = os.path.relpath(py, n.work)
    bc = invoke(n.work, n.env, "build-check", "--profile", "tiny", "--python", rel)
    assert bc.returncode == 0, bc.stdout + bc.stderr
    ad = invoke(n.work, n.env, "env", "--profile", "tiny", "--adopt", "--python", rel)
    assert ad.returncode == 0 and f"adopted {py}" in ad.stdout, ad.stdout + ad.stderr
    run_dir = tmp_path / "run"
    invoke(n.work, n.env, "preflight", "--local", "--profile", "tiny", "--python", rel,
           "--run-dir", str(run_dir))
    fp = json.loads(next(run_dir.glob("*/fingerprint.json")).read_text())
    assert fp["torch"] == "2.1.0" and fp["python"] == str(py), fp


def test_only_check_does_not_say_ready(world):
    n = fresh_node(world, "onlycheck")
    r = n.setup("--only", "check")
    assert r.returncode == 0 and "setup ready" not in r.stdout, r.stdout
    assert "setup done (--only check" in r.stdout, r.stdout


def fresh_node(world, name: str, adopt: Path | None = None) -> Node:
    work, env = world
    dest = work.parent / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(work, dest, ignore=shutil.ignore_patterns(".megatron-env", ".cache"),
                    symlinks=True)
    return Node(dest, {**env, "PYTHONPATH": str(dest)}, adopt)


KERNEL_PATCH = """Subject: the answer is 43

Why: a changed patch series is a changed pin: the builds step must build and install it.

diff --git a/csrc/k.c b/csrc/k.c
--- a/csrc/k.c
+++ b/csrc/k.c
@@ -1,5 +1,5 @@
 #include <Python.h>
-static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
+static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(43); }
 static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "42"}, {0}};
 static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_C", 0, -1, methods};
 PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&mod); }
"""

EXAMPLES = int(os.environ.get("MEGATRON_ENV_READY_EXAMPLES", "3"))
SETUPS: list[tuple[str, int]] = []  # (args, exit) of every full setup the machine checked


class ReadyMeansProven(RuleBasedStateMachine):
    """Invariant: a full `invoke setup` that exits 0 (says "ready") leaves every declared part
    working, whatever was done to the node before; and from any state one setup gets there."""

    world: tuple[Path, dict] | None = None
    image: Path | None = None  # the interpreter an adopting node adopts

    @initialize(adopt=st.booleans())
    def start(self, adopt):
        assert self.world is not None and self.image is not None
        self.n = fresh_node(self.world, "machine", adopt=self.image if adopt else None)
        if adopt:  # every sequence starts from the image as it was made
            shutil.rmtree(self.image.parent.parent, ignore_errors=True)
            adoptable(self.image.parent.parent, self.n.env)
        self.answer = 42
        self.n.log.append(f"-- {'adopted' if adopt else 'built'} node")

    def check_ready(self, r: subprocess.CompletedProcess, what: str) -> None:
        SETUPS.append((what, r.returncode))
        if r.returncode == 0:
            broken = self.n.proven(self.answer)
            assert broken == [], ("\n".join(self.n.log) + f"\nsetup {what} said ready, but: "
                                  f"{broken}\n{r.stdout[-3000:]}{r.stderr[-2000:]}")

    @rule(args=st.sampled_from([(), (), ("--verify-deep",), ("--dry-run",),
                                ("--only", "builds"), ("--from", "megatron")]))
    def setup(self, args):
        r = self.n.setup(*args)
        if not args or args == ("--verify-deep",):
            self.check_ready(r, " ".join(args))

    @rule(how=st.sampled_from(["uninstall", "so", "record"]))
    def break_kernel(self, how):
        self.n.log.append(f"kernel: {how}")
        py = self.n.python()
        if not py.exists():
            return
        if how == "uninstall":
            subprocess.run([uv.exe(), "pip", "uninstall", "-q", "--python", py,
                            kernelstandin.NAME], env=self.n.env, capture_output=True)
            return
        pkg = self.n.site() / "tinykern"
        for f in pkg.glob("_C*.so") if how == "so" else pkg.parent.glob("tinykern-*/RECORD"):
            f.unlink()

    @rule(what=st.sampled_from(["megatron-pth", "checkout", "lock-package", "interpreter"]))
    def remove(self, what):
        self.n.log.append(f"removed {what}")
        py = self.n.python()
        if what == "megatron-pth" and py.exists():
            (self.n.site() / "megatron_core.pth").unlink(missing_ok=True)
        elif what == "checkout":
            shutil.rmtree(self.n.work / ".megatron-env" / "tiny.megatron", ignore_errors=True)
        elif what == "lock-package" and py.exists():
            subprocess.run([uv.exe(), "pip", "uninstall", "-q", "--python", py, "tinytop"],
                           env=self.n.env, capture_output=True)
        elif what == "interpreter":  # a new image at the same path, or the venv made anew
            where = py.parent.parent.resolve()
            if py.exists() or self.n.adopt:
                shutil.rmtree(where, ignore_errors=True)
                subprocess.run([uv.exe(), "venv", "-q", "--python", sys.executable, where],
                               env=self.n.env, capture_output=True, check=True)
                if self.n.adopt:
                    subprocess.run([uv.exe(), "pip", "install", "-q", "--python", py, "torch",
                                    "tinytop"], env=self.n.env, capture_output=True, check=True)

    @rule(sig=st.sampled_from([signal.SIGINT, signal.SIGTERM, signal.SIGKILL]),
          after=st.floats(0.2, 4.0))
    def interrupt(self, sig, after):
        self.n.log.append(f"setup interrupted by {sig.name} after {after:.2f} s")
        p = subprocess.Popen([sys.executable, "-m", "invoke", "setup", *self.n.args,
                              "--profile", "tiny"], cwd=self.n.work, env=self.n.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        time.sleep(after)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, sig)
        p.wait(timeout=120)

    @rule()
    def clean(self):
        self.n.run("clean")

    @rule()
    def change_pin(self):
        """The kernel's patch series toggled: another build, another answer."""
        d = self.n.work / "patches" / kernelstandin.NAME / kernelstandin.VERSION
        patch = d / "0001-answer-43.patch"
        if patch.exists():
            patch.unlink()
            self.answer = 42
        else:
            d.mkdir(parents=True, exist_ok=True)
            patch.write_text(KERNEL_PATCH)
            self.answer = 43
        self.n.log.append(f"kernel pin changed: answer {self.answer}")

    def teardown(self):
        if getattr(self, "n", None) is None:
            return
        try:
            r = self.n.setup()
            assert r.returncode == 0, ("\n".join(self.n.log) + "\nno convergence:\n"
                                       + r.stdout[-3000:] + r.stderr[-3000:])
            self.check_ready(r, "(last)")
        finally:
            shutil.rmtree(self.n.work, ignore_errors=True)


def test_setup_exit_0_means_every_declared_part_works(world, tmp_path):
    ReadyMeansProven.world = world
    ReadyMeansProven.image = tmp_path / "image" / "bin" / "python"
    SETUPS.clear()
    t0 = time.monotonic()
    run_state_machine_as_test(ReadyMeansProven, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=6, deadline=None, derandomize=False,
        suppress_health_check=list(HealthCheck)))
    ready = sum(code == 0 for _what, code in SETUPS)
    print(f"\n{len(SETUPS)} full setups checked ({ready} said ready) in "
          f"{time.monotonic() - t0:.0f} s (max_examples={EXAMPLES})")


def test_bench_converge_records_a_node_that_converges(world, tmp_path):
    """bench/converge.py on an adopted node with the kernel stand-in: the kernel really is
    uninstalled, setup puts it back, its module imports, preflight --local runs the adopted
    interpreter (gpu.health skips: no GPU here); with --no-builds it says the kernels were
    skipped and removes nothing."""
    work, env = world
    n = fresh_node(world, "bench", adopt=adoptable(tmp_path / "image", env))
    assert n.setup().returncode == 0
    bench = Path(__file__).resolve().parent.parent / "bench" / "converge.py"
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, bench, "--out", out, "--", *n.args, "--profile", "tiny"],
                       cwd=n.work, env=n.env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / "converge.json").read_text())
    assert {k: doc[k] for k in ("kernels_removed", "setup_exit", "imports_after",
                                "preflight_local_adopted")} == {
        "kernels_removed": True, "setup_exit": 0, "imports_after": True,
        "preflight_local_adopted": "skip"}, doc
    assert doc["python"] == str(n.adopt) and doc["seconds"] > 0
    assert "tinykern is not installed" in (out / "2-setup.txt").read_text()
    assert "Uninstalled 1 package" in (out / "1-uninstall.txt").read_text()
    assert n.proven() == []
    skipped = tmp_path / "skipped"
    r = subprocess.run([sys.executable, bench, "--out", skipped, "--", *n.args, "--profile",
                        "tiny", "--no-builds"], cwd=n.work, env=n.env, capture_output=True,
                       text=True, timeout=600)
    doc = json.loads((skipped / "converge.json").read_text())
    assert r.returncode == 0 and doc["kernels_removed"] is False, r.stdout + r.stderr
    assert doc["kernels_skipped"] == "--no-builds given" and doc["imports_after"] is None
    assert n.proven() == []  # nothing was removed
