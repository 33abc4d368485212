"""Bad input from a user: one line naming the thing and the fix, a non-zero exit, no traceback,
nothing left behind. Each case was a traceback, a silent pass or a leftover before."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from filelock import FileLock

from megatron_env import profile
from megatron_env.errors import UserError
from megatron_env.sources import repos

from .test_lock import ROOT, copy_repo, invoke

DEFAULT = "core_v0.4.0-cu121"


def one_line_error(r, *words):
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "\nhint: " in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_min_free_gb_not_a_number(tmp_path):
    r = invoke(ROOT, "env", "--profile", DEFAULT, "--prefix", str(tmp_path / "env"),
               env={"MEGATRON_ENV_MIN_FREE_GB": "abc"})
    one_line_error(r, "MEGATRON_ENV_MIN_FREE_GB='abc' is not a number")
    assert list(tmp_path.iterdir()) == []


def test_env_prefix_is_a_regular_file(tmp_path):
    f = tmp_path / "env"
    f.write_text("mine\n")
    r = invoke(ROOT, "env", "--profile", DEFAULT, "--prefix", str(f))
    one_line_error(r, f"{f} is a file", "--prefix")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env"] and f.read_text() == "mine\n"


def test_refused_foreign_prefix_leaves_no_lock_behind(tmp_path):
    d = tmp_path / "env"
    d.mkdir()
    (d / "data.txt").write_text("not an environment\n")
    r = invoke(ROOT, "env", "--profile", DEFAULT, "--prefix", str(d))
    one_line_error(r, "is not an environment made by megatron-env")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env"]  # no env.d/.lock


def test_collect_out_is_a_regular_file(tmp_path):
    f = tmp_path / "snap"
    f.write_text("x")
    r = invoke(ROOT, "collect", "--out", str(f))
    one_line_error(r, f"{f} is a file", "--out")
    assert f.read_text() == "x"


def read_only_dir(tmp_path) -> Path:
    """A directory this process cannot write into: chmod for users; /sys for root."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    if not os.access(d, os.W_OK):
        return d
    d.chmod(0o755)
    return Path("/sys/megatron-env-test")


def test_setup_dry_run_on_a_read_only_prefix_plans_and_writes_nothing(tmp_path):
    ro = read_only_dir(tmp_path)
    prefix = ro / "env"
    r = invoke(ROOT, "setup", "--profile", DEFAULT, "--prefix", str(prefix), "--dry-run",
               env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "setup dry run" in r.stdout
    assert not prefix.exists() and not prefix.with_name("env.setup").exists()
    real = invoke(ROOT, "setup", "--profile", DEFAULT, "--prefix", str(prefix))
    one_line_error(real, "cannot create", "writable --prefix")


def test_snapshot_of_random_bytes_fails(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    for i, name in enumerate(("nvidia-smi.txt", "nvidia-smi-topo-m.txt", "nvidia-smi-q.txt",
                              "ibstatus.txt", "ulimit-l.txt", "nvcc-version.txt", "shm.txt",
                              "ip-br-addr.txt", "env.txt", "nvml.json", "meta.json")):
        # garbage with no printable ASCII: random bytes now and then hold a digit or a word a
        # parser can take (a number for `ulimit -l`), and then something did parse
        (snap / name).write_bytes(bytes(0x80 | b for b in os.urandom(2000 + i)))
    r = invoke(ROOT, "check", "--snapshot", str(snap), env={"COLUMNS": "200"})
    # random bytes where the record collect writes last belongs: an incomplete snapshot
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert f"snapshot {snap} is incomplete" in r.stderr and "collect" in r.stderr
    (snap / "meta.json").write_text('{"files": {}}')  # complete, every other file garbage
    r = invoke(ROOT, "check", "--snapshot", str(snap), env={"COLUMNS": "200"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "snapshot" in r.stdout and "nothing in" in r.stdout and "could be parsed" in r.stdout


def test_a_real_snapshot_is_not_called_garbage():
    r = invoke(ROOT, "check", "--snapshot", str(ROOT / "tests/fixtures/h200-live"),
               "--profile", "core_v0.19.0-cu130")
    assert r.returncode == 0 and "could be parsed" not in r.stdout


def test_python_version_written_as_a_number(tmp_path):
    src = profile.load(DEFAULT).path.read_text()
    p = tmp_path / "x" / "profile.toml"
    p.parent.mkdir()
    p.write_text(src.replace('version = "3.10"', "version = 3.10"))
    with pytest.raises(UserError) as e:
        profile.load_file(p)
    assert "python.version" in e.value.message and 'a string in quotes, e.g. "3.10"' in e.value.message
    assert "got 3.1" not in e.value.message


@pytest.mark.parametrize("defaults", [0, 2])
def test_profiles_complains_unless_exactly_one_default(tmp_path, defaults):
    repo = copy_repo(tmp_path)
    for name in (DEFAULT, "core_v0.19.0-cu130"):
        f = repo / "envs" / name / "profile.toml"
        text = f.read_text().replace("default = true\n", "")
        if defaults == 2:
            text = "default = true\n" + text
        f.write_text(text)
    r = invoke(repo, "profiles")
    one_line_error(r, f"{defaults} profiles under", "default = true", "exactly one must")


def test_empty_mirror_directory_says_so(tmp_path, monkeypatch):
    empty = tmp_path / "mirror.git"
    empty.mkdir()
    monkeypatch.setenv(repos.mirror_var("megatron"), str(empty))
    monkeypatch.setenv(repos.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(UserError) as e:
        repos.mirror("megatron", "https://example.invalid/Megatron-LM.git")
    assert "is a directory but not a git repository (it is empty)" in e.value.message
    assert "git clone --mirror" in e.value.fix
    assert "does not exist" not in e.value.message


def test_second_run_says_it_is_waiting(tmp_path):
    prefix = tmp_path / "env"
    stamps = tmp_path / "env.setup"
    stamps.mkdir()
    held = FileLock(str(stamps / ".lock"))
    held.acquire()
    p = subprocess.Popen([sys.executable, "-m", "invoke", "setup", "--profile", DEFAULT,
                          "--prefix", str(prefix), "--only", "lock"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 120
    while time.time() < deadline and not any("waiting" in line for line in lines):
        time.sleep(0.1)
    assert p.poll() is None, "".join(lines)  # still waiting for the lock
    held.release()
    assert p.wait(timeout=120) == 0
    reader.join(5)
    out = "".join(lines)
    assert "waiting: another run is working on the setup of" in out and "lock" in out


def test_killed_run_leaves_no_verify_child(tmp_path):
    """SIGKILL the process running a verification (as a scheduler or Ctrl-\\ would): torchrun
    and its ranks must go with it instead of running on, holding the GPUs."""
    pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    code = textwrap.dedent(f"""
        from megatron_env.commands import setup
        setup.verify("verify_nccl", ["--current", "--nproc", "2", "--run-dir", {str(run_dir)!r},
                        "--", "--backend", "gloo", "--sizes", "64M:64M", "--iters", "100000"])
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)

    def children():
        r = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True)
        return [int(x) for x in r.stdout.split() if int(x) != parent.pid]

    deadline = time.time() + 120
    while time.time() < deadline and len(children()) < 2:
        time.sleep(0.2)
    assert children(), "the verification never started"
    parent.kill()
    parent.wait()
    deadline = time.time() + 60
    while time.time() < deadline and children():
        time.sleep(0.2)
    left = children()
    for pid in left:  # never leave them running, even when the test fails
        os.kill(pid, 9)
    assert left == []


def test_adopting_a_torch_built_for_another_cuda_is_refused(tmp_path):
    """This interpreter's torch, with a profile that pins the same torch for another CUDA: the
    difference is of kind torch-cuda, and adopt refuses it (it used to pass by message text)."""
    torch = pytest.importorskip("torch")
    from megatron_env.setup import pipeline, steps

    base = profile.load(DEFAULT)
    d = tmp_path / "other"
    d.mkdir()
    text = base.path.read_text()
    want = "11.8" if torch.version.cuda != "11.8" else "12.1"
    text = text.replace('version = "3.10"', f'version = "{sys.version_info[0]}.{sys.version_info[1]}"')
    text = text.replace('version = "12.1"', f'version = "{want}"')
    text = text.replace('version = "2.1.0"', f'version = "{torch.__version__.split("+")[0]}"')
    (d / "profile.toml").write_text(text)
    (d / profile.LOCK_FILE).write_text(base.lock_file.read_text())
    prof = profile.load_file(d / "profile.toml")
    ctx = pipeline.Context(prof, tmp_path / "env", adopt=Path(sys.executable))
    with pytest.raises(UserError) as e:
        steps.adopt_checked(ctx)
    assert f"torch.version.cuda is {torch.version.cuda}, profile wants {want}" in e.value.message


def test_offline_flash_attn_fetch_offers_no_builds(tmp_path, monkeypatch):
    """A node without an index (the H200 node): the sdist fetch fails, and the fix names both
    ways on: a local copy of the sdist, or going on without the kernels."""
    from megatron_env.kernels import build, source_trees
    from megatron_env.recipes import recipe

    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv(recipe.source_var("flash-attn"), raising=False)
    pkg = build.packages(profile.load(DEFAULT))["flash-attn"]
    with pytest.raises(UserError) as e:
        source_trees.fetch(pkg, echo=lambda *_: None)
    assert "cannot fetch the flash-attn" in e.value.message
    assert "MEGATRON_ENV_SOURCE_FLASH_ATTN" in e.value.fix and "--no-builds" in e.value.fix


def test_smoke_train_names_a_broken_transformer_engine(tmp_path):
    """Transformer Engine installed but not importable (its library missing, as after a CUDA
    change): the error is reported, not mistaken for "TE is not installed"."""
    broken = tmp_path / "site" / "transformer_engine"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("from . import transformer_engine_torch  # the .so\n")
    code = ("import sys; sys.path[:0] = [{site!r}, {scripts!r}]; import smoke_train as s; "
            "print(s.te_status())")
    run = subprocess.run([sys.executable, "-c", code.format(site=str(tmp_path / "site"),
                                                            scripts=str(ROOT / "scripts"))],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "(False, \"ImportError: cannot import name 'transformer_engine_torch'" in run.stdout
    absent = subprocess.run([sys.executable, "-c", code.format(site=str(tmp_path / "none"),
                                                               scripts=str(ROOT / "scripts"))],
                            capture_output=True, text=True, cwd=tmp_path)
    assert absent.stdout.strip() == "(False, None)"
