"""The `megatron-env` console command: one project root in a stated order, the argparse front
door made from `commands.registry()`, completion, --version, --json on errors, and the wheel a user
installs (its shipped project copy, runnable from any directory, never written into)."""

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from megatron_env import commands, project
from megatron_env.commands import main, pyenv

from .conftest import FIXTURES, user_error
from .gitrepo import project_files

ROOT = FIXTURES.parent.parent
EXE = Path(sys.executable).with_name("megatron-env")


def _project(d: Path, checkout: bool = False) -> Path:
    (d / "envs" / "p").mkdir(parents=True)
    (d / "envs" / "p" / "profile.toml").write_text("")
    if checkout:  # what marks a checkout of megatron-env (not just a project directory)
        (d / "megatron_env").mkdir()
        (d / "megatron_env" / "__init__.py").write_text("")
    return d


@pytest.fixture
def outside():
    """A fresh directory that no checkout encloses. CI's temporary directories lie inside the
    clone (nox points TMPDIR into its session directory), where the enclosing-checkout rule would
    rightly find the clone."""
    for base in (Path("/var/tmp"), Path("/tmp"), Path("/dev/shm"), Path.home()):
        if (base.is_dir() and os.access(base, os.W_OK) and ROOT not in (base, *base.parents)
                and project._enclosing(base) is None):
            d = Path(tempfile.mkdtemp(dir=base, prefix="megatron-env-test-"))
            yield d
            shutil.rmtree(d, ignore_errors=True)
            return
    pytest.fail("no writable directory outside a checkout")


def test_project_root_order(outside, monkeypatch):
    tmp_path = outside
    given, named, co = (_project(tmp_path / n, checkout=n == "co") for n in ("given", "env", "co"))
    inside = co / "envs" / "p"
    env = {project.ENV: str(named)}
    assert project.resolve(given, env, inside) == (given, "given")  # --project first
    assert project.resolve(None, env, inside) == (named, "given")  # then the variable
    assert project.resolve(None, {}, inside) == (co, "checkout")  # then the enclosing checkout
    # a project directory that is not a checkout does not enclose
    assert project.resolve(None, {}, named / "envs") == (ROOT, "package checkout")
    monkeypatch.setattr(project, "_PACKAGE_CHECKOUT", tmp_path / "site-packages")
    assert project.resolve(None, {}, tmp_path) == (project.SHIPPED, "shipped")
    with user_error("project.missing") as e:
        project.resolve(tmp_path / "nothing", env, inside)
    assert str(tmp_path / "nothing") in e.value.message


def _cli(*args, cwd=ROOT, env=None):
    e = {k: v for k, v in os.environ.items() if k != project.ENV}
    e.update(env or {})
    return subprocess.run([str(EXE), *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=120)


def test_project_counts_when_the_modules_that_read_it_were_imported_first(tmp_path):
    """Nothing reads the project root at import: a program that imports the profile, patch and
    environment modules before calling the front door still gets the --project it gives
    (before: profile.ENVS_DIR settled the root on import, and `--project` was ignored)."""
    shutil.copytree(ROOT / "envs" / "core_v0.4.0-cu121", tmp_path / "envs" / "only-here")
    code = textwrap.dedent(f"""
        import sys
        from megatron_env import profile
        from megatron_env.pyenv import env
        from megatron_env.sources import patches
        from megatron_env.commands import main
        sys.exit(main.main(["--project", {str(tmp_path)!r}, "profiles"]))
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={k: v for k, v in os.environ.items() if k != project.ENV})
    assert r.returncode == 0, r.stderr
    assert "only-here" in r.stdout and "core_v0.19.0-cu130" not in r.stdout, r.stdout


def test_front_door_takes_project_then_variable(tmp_path):
    a, b = _project(tmp_path / "a"), _project(tmp_path / "b")
    r = _cli("--project", str(a), "--version", env={project.ENV: str(b)})
    assert r.returncode == 0 and r.stdout.rstrip().endswith(f"project {a} (given)"), r.stderr
    r = _cli("--version", env={project.ENV: str(b)})
    assert r.stdout.rstrip().endswith(f"project {b} (given)")
    r = _cli("--project", str(tmp_path), "profiles")
    assert r.returncode == 2 and r.stderr.startswith("error: project directory")
    assert "Traceback" not in r.stderr


def test_version_names_the_commit():
    from megatron_env import __version__

    r = _cli("--version")
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    assert r.returncode == 0
    assert r.stdout.startswith(f"megatron-env {__version__} (git {head})"), r.stdout


def test_python_dash_m_help_lists_every_command():
    r = subprocess.run([sys.executable, "-m", "megatron_env", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in (*commands.registry(), "completion"):
        assert re.search(rf"^\s+{re.escape(name)}\s", r.stdout, re.M), name


def test_every_command_and_option_of_the_declaration_is_in_the_front_door():
    top = main.parser()
    subs = next(a for a in top._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(subs.choices) == {*commands.registry(), "completion"}
    for name, cmd in commands.registry().items():
        flags = {o for a in subs.choices[name]._actions for o in a.option_strings}
        dests = {a.dest for a in subs.choices[name]._actions if a.option_strings}
        params = inspect.signature(cmd.fn).parameters
        assert dests - {"help"} == set(params), name
        for p in params:
            assert "--" + p.rstrip("_").replace("_", "-") in flags, (name, p)
    assert "--bundle" in {o for a in subs.choices["setup"]._actions for o in a.option_strings}


def _complete(script: str, *words: str) -> list[str]:
    prog = (f'{script}\nCOMP_WORDS=({" ".join(words)}); COMP_CWORD={len(words) - 1}\n'
            "_megatron_env; printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    r = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_bash_completion(tmp_path):
    r = _cli("completion", "bash")
    assert r.returncode == 0, r.stderr
    (tmp_path / "c.bash").write_text(r.stdout)
    syntax = subprocess.run(["bash", "-n", str(tmp_path / "c.bash")], capture_output=True,
                            text=True)
    assert syntax.returncode == 0, syntax.stderr
    assert _complete(r.stdout, "megatron-env", "prof") == ["profiles"]
    assert set(_complete(r.stdout, "megatron-env", "")) >= set(commands.registry())
    assert _complete(r.stdout, "megatron-env", "--project", "x", "setup", "--dry") == ["--dry-run"]
    assert _complete(r.stdout, "megatron-env", "--project", "") == []  # a directory's name
    assert _complete(r.stdout, "megatron-env", "completion", "z") == ["zsh"]
    assert _cli("completion", "zsh").stdout.startswith("autoload -U +X bashcompinit")


def test_json_errors_are_one_object_on_stdout(tmp_path):
    r = _cli("bundle", str(tmp_path / "b.tar"), "--profile", "no-such", "--json")
    assert r.returncode == 2 and r.stderr.startswith("error: unknown profile")
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["error"]["kind"] == "profile.unknown"
    assert "no-such" in doc["error"]["message"]
    r = _cli("setup", "--profile", "no-such", "--json", "--dry-run")
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["kind"] == "profile.unknown"


def test_setup_json_carries_its_failed_step(tmp_path):
    shutil.copytree(ROOT / "envs", tmp_path / "p" / "envs")
    lock = tmp_path / "p" / "envs" / "core_v0.4.0-cu121" / "requirements.lock"
    lock.write_text(lock.read_text().replace("==", "==9", 1))  # a pin edited by hand
    r = _cli("--project", str(tmp_path / "p"), "setup", "--profile", "core_v0.4.0-cu121",
             "--only", "lock", "--json", "--prefix", str(tmp_path / "env"))
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    (step,) = doc["steps"]
    assert doc["verdict"] == "stopped" and step["step"] == "lock"
    assert step["status"] == "failed" and "edited by hand" in step["detail"]


# --------------------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built (uv build, about 3 s) from a copy of the files git tracks: what a
    release builds, without the build's leftovers in this checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    for f in project_files(ROOT, untracked=False):
        if (ROOT / f).is_file():
            (tmp / "src" / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, tmp / "src" / f)
    uv = Path(sys.executable).with_name("uv")
    r = subprocess.run([str(uv), "build", "-q", "--wheel", "--python", sys.executable,
                        "--out-dir", str(tmp / "dist"), str(tmp / "src")],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"})
    assert r.returncode == 0, r.stderr
    (whl,) = (tmp / "dist").glob("*.whl")
    return whl


def test_wheel_ships_the_project_and_no_path_of_this_machine(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    files = project_files(ROOT, untracked=False)
    for d in ("envs", "patches", "scripts"):
        tracked = [f for f in files if f.startswith(d + "/")]
        assert tracked and {f"megatron_env/_project/{f}" for f in tracked} <= set(names), d
    assert any(n.endswith("/profile.toml") for n in names)
    # this checkout, the build directory and the user's home: paths of the machine that built
    # the wheel, whatever they are called
    machine = [str(ROOT), str(wheel.parent.parent), f"{Path.home()}/"]
    with zipfile.ZipFile(wheel) as z:
        for n in names:
            text = z.read(n).decode(errors="replace")
            assert not [m for m in machine if m in text], n


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel in a fresh venv (--no-deps; its dependencies are the test venv's, reached
    through a .pth placed after the venv's own site-packages, so the wheel's package wins)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(Path(sys.executable).with_name("uv")), "pip", "install", "-q",
                    "--no-deps", "--python", str(py), str(wheel)], check=True, timeout=300)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    Path(site.stdout.strip(), "zz_test_deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_installed_command_runs_from_any_directory(installed, outside):
    tmp_path = outside
    exe = installed / "bin" / "megatron-env"
    env = {k: v for k, v in os.environ.items() if k != project.ENV}
    run = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True, "timeout": 120}
    r = subprocess.run([str(exe), "--version"], **run)
    assert r.returncode == 0, r.stderr
    assert "(shipped)" in r.stdout and str(installed) in r.stdout and "(git " not in r.stdout
    r = subprocess.run([str(exe), "profiles"], **run)
    assert r.returncode == 0, r.stderr
    names = [p.parent.name for p in (ROOT / "envs").glob("*/profile.toml")]
    assert all(n in r.stdout for n in names) and f"{len(names)} profiles" in r.stdout
    # lock would write next to the shipped profiles, inside site-packages: refused
    shipped = next(installed.glob("lib/python*/site-packages/megatron_env/_project"))
    before = {p: p.stat().st_mtime_ns for p in shipped.rglob("*")}
    r = subprocess.run([str(exe), "lock", "--refresh"], **run)
    assert r.returncode == 2 and r.stderr.startswith("error: the profiles in use are the copy")
    assert "--project" in r.stderr
    assert {p: p.stat().st_mtime_ns for p in shipped.rglob("*")} == before
    assert list(tmp_path.iterdir()) == []


def test_lock_refuses_the_shipped_copy(monkeypatch):
    monkeypatch.setattr(project, "_root", (project.SHIPPED, "shipped"))
    for options in ({}, {"refresh": True}):
        with user_error("project.read-only"):
            pyenv.lock.fn.__wrapped__(**options)


def test_a_wheel_install_carries_itself_into_a_bundle(installed, wheel, outside):
    """From a wheel install there is no project to build: the bundle's tool wheel is the
    installed megatron-env packed again (tool.installed_wheel), file for file the wheel that
    was installed, and it installs and runs in a fresh venv outside any checkout."""
    py = installed / "bin" / "python"
    r = subprocess.run([str(py), "-c", "import sys; from pathlib import Path; from "
                        "megatron_env.bundle import tool; print(tool.installed_wheel(Path("
                        "sys.argv[1])))", str(outside)], capture_output=True, text=True,
                       timeout=120, cwd=outside)
    assert r.returncode == 0, r.stderr
    again = Path(r.stdout.strip())
    assert again.parent == outside and again.name == wheel.name
    with zipfile.ZipFile(wheel) as a, zipfile.ZipFile(again) as b:
        first = {n: a.read(n) for n in a.namelist() if not n.endswith(".dist-info/RECORD")}
        second = {n: b.read(n) for n in b.namelist() if not n.endswith(".dist-info/RECORD")}
    assert first == second  # the same files with the same bytes
    venv = outside / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([str(Path(sys.executable).with_name("uv")), "pip", "install", "-q",
                    "--no-deps", "--python", str(venv / "bin" / "python"), str(again)],
                   check=True, timeout=300)  # uv checks each file against the new RECORD
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = subprocess.run([str(venv / "bin" / "megatron-env"), "--version"], cwd=outside,
                       capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != project.ENV})
    assert r.returncode == 0 and "(shipped)" in r.stdout, r.stderr
    reqs = subprocess.run([str(py), "-c", "from megatron_env.bundle import tool; "
                           "print(tool.installed_requirements())"], capture_output=True,
                          text=True, timeout=120, cwd=outside)
    assert reqs.returncode == 0 and "invoke>=2.2" in reqs.stdout, reqs.stderr


def test_a_wheel_install_writes_into_the_user_directories_not_the_working_one(installed,
                                                                             outside):
    """Before: `setup` from a wheel made ./.megatron-env (and ./.cache) wherever it ran."""
    exe = installed / "bin" / "megatron-env"
    work = outside / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in (project.ENV, project.CACHE_ENV, project.STATE_ENV)}
    env.update(XDG_DATA_HOME=str(outside / "data"), XDG_CACHE_HOME=str(outside / "cache"))
    run = {"cwd": work, "env": env, "capture_output": True, "text": True, "timeout": 120}
    r = subprocess.run([str(exe), "setup", "--only", "lock"], **run)
    assert r.returncode == 0, r.stderr
    assert list(work.iterdir()) == []
    envs = outside / "data" / "megatron-env" / "envs"
    cache = outside / "cache" / "megatron-env"
    assert [p.name for p in envs.glob("*.setup")], r.stderr  # the lock step's stamp
    (where,) = [line for line in r.stderr.splitlines() if line.startswith("where: ")]
    assert str(envs) in where and str(cache) in where and "user's directories" in where
    # --cache-dir moves the cache; the line says so
    r = subprocess.run([str(exe), "--cache-dir", str(outside / "c2"), "setup", "--only", "lock"],
                       **run)
    assert r.returncode == 0 and f"cache {outside / 'c2'}" in r.stderr
    assert (outside / "c2" / 'CACHEDIR.TAG').is_file()
    # and clean finds both places, lists them with sizes, then removes them
    r = subprocess.run([str(exe), "clean", "--dry-run"], **run)
    assert r.returncode == 0, r.stderr
    assert "would remove" in r.stdout and str(envs) in r.stdout and "MiB" in r.stdout
    assert [p.name for p in envs.glob("*.setup")]
    r = subprocess.run([str(exe), "clean"], **run)
    assert r.returncode == 0, r.stderr
    assert not list(envs.glob("*.setup")) and list(work.iterdir()) == []
