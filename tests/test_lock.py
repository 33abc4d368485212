"""Locks: the committed ones pin what the profile promises; check, diff and re-lock for real."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_env import profile
from megatron_env.pyenv import lock

from .conftest import user_error

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = profile.load("core_v0.4.0-cu121")
CURRENT = profile.load("core_v0.19.0-cu130")


def pins(prof):
    return lock.parse_lock((prof.lock_file).read_text())


def test_default_lock_pins_the_cuda_121_stack():
    p = pins(DEFAULT)
    assert p["torch"] == "2.1.0" and p["triton"] == "2.1.0"
    assert p["nvidia-cuda-runtime-cu12"] == "12.1.105"
    assert p["nvidia-nccl-cu12"] == "2.18.1"
    assert p["nvidia-nvjitlink-cu12"] == "12.1.105"  # floats to 12.9 without the derived constraint
    assert p["setuptools"] == "69.5.1" and p["numpy"].startswith("1.")
    assert {"einops", "regex", "six", "sentencepiece", "nltk", "pybind11", "ninja"} <= set(p)


def test_current_lock_pins_the_cuda_130_stack():
    p = pins(CURRENT)
    assert p["torch"] == "2.11.0" and p["nvidia-cuda-runtime"].startswith("13.0.")
    assert p["nvidia-nccl-cu13"].startswith("2.")


@pytest.mark.parametrize("prof", [DEFAULT, CURRENT], ids=lambda p: p.name)
def test_every_file_is_hashed_and_no_index_is_named(prof):
    text = (prof.lock_file).read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    entries = re.split(r"\n(?=[A-Za-z0-9])", body.strip())
    assert len(entries) == len(pins(prof))
    for entry in entries:
        assert "--hash=sha256:" in entry, entry
    assert not re.search(r"https?://|--index-url|--extra-index-url|--find-links", text)


def test_constraints_are_derived_from_the_cuda_version():
    assert "nvidia-nvjitlink-cu12==12.1.*" in lock.constraints(DEFAULT)
    assert "nvidia-nvjitlink==13.0.*" in lock.constraints(CURRENT)


def test_committed_locks_are_fresh():
    for prof in profile.load_all():
        assert lock.stale(prof) == []


def test_an_environment_yml_edited_or_missing_makes_the_lock_stale(tmp_path):
    """environment.yml is generated from the profile like the lock: one edited by hand (a
    channel added) or deleted is named, while the lock itself is still fresh."""
    src = profile.envs_root() / DEFAULT.name
    shutil.copytree(src, tmp_path / DEFAULT.name)
    prof = profile.load(DEFAULT.name, envs_dir=tmp_path)
    assert lock.stale(prof) == []
    env = prof.env_file
    env.write_text(env.read_text().replace("channels:\n", "channels:\n  - defaults\n", 1))
    assert [str(env) in p for p in lock.stale(prof)] == [True]
    env.unlink()
    assert [str(env) in p for p in lock.stale(prof)] == [True]


def copy_repo(tmp_path: Path) -> Path:
    dst = tmp_path / "repo"
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split()
    if not files:  # a copy of the tree git ignores (mutmut's mutants/): its files as they are
        files = [str(p.relative_to(ROOT)) for d in ("megatron_env", "envs")
                 for p in (ROOT / d).rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith(".")]
        files += ["tasks.py", "pyproject.toml"]
    for rel in files:
        if rel.startswith(("megatron_env/", "envs/")) or rel in ("tasks.py", "pyproject.toml"):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, dst / rel)
    git = ["git", "-C", dst, "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    return dst


def invoke(repo: Path, *args: str, env=None):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=repo, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(repo), **(env or {})},
                          timeout=900)


def test_check_passes_offline_and_names_the_stale_file(tmp_path):
    repo = copy_repo(tmp_path)
    offline = {"UV_OFFLINE": "1", "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    ok = invoke(repo, "lock", "--check", env=offline)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    prof = repo / "envs" / "core_v0.4.0-cu121" / "profile.toml"
    prof.write_text(prof.read_text().replace('"einops", ', '"einops==0.7.0", '))
    bad = invoke(repo, "lock", "--check", env=offline)
    assert bad.returncode == 1
    assert "envs/core_v0.4.0-cu121/requirements.lock" in bad.stdout
    assert "core_v0.19.0-cu130" not in bad.stdout


def test_moving_one_pin_relocks_and_diffs_as_one_row(tmp_path):
    """Real resolution with uv against the package index."""
    repo = copy_repo(tmp_path)
    prof = repo / "envs" / "core_v0.4.0-cu121" / "profile.toml"
    old = lock.parse_lock((repo / "envs/core_v0.4.0-cu121/requirements.lock").read_text())["six"]
    assert old != "1.16.0"
    prof.write_text(prof.read_text().replace('"six", ', '"six==1.16.0", '))
    r = invoke(repo, "lock", "--profile", "core_v0.4.0-cu121")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "found on" in r.stderr and "Python 3.10" in r.stderr  # progress: on stderr
    assert "conda-lock skipped" in r.stderr
    assert invoke(repo, "lock", "--check").returncode == 0
    d = invoke(repo, "lock-diff", "--base", "main")
    assert d.returncode == 0, d.stderr
    rows = [line for line in d.stdout.splitlines() if line.startswith("| ") and "package" not in line]
    assert len(rows) == 1 and rows[0].startswith(f"| six | downgraded | {old} | 1.16.0 | ")
    assert rows[0].endswith(" MB |  |") or rows[0].endswith(" kB |  |")  # sizes from the index
    assert "### core_v0.4.0-cu121 (`envs/core_v0.4.0-cu121/requirements.lock`)" in d.stdout
    assert "core_v0.19.0-cu130" not in d.stdout


def test_missing_interpreter_is_one_clear_error(tmp_path):
    with user_error("lock.no-python") as e:
        lock.find_python("3.99")
    assert "3.99" in e.value.message


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("einops==0.8.2", "einops==0.8.1"), "einops: pin or --hash edited by hand"),
    (lambda t: re.sub(r"(six==1\.17\.0 \\\n    --hash=sha256:)(.)", lambda m: m.group(1) + ("0" if m.group(2) != "0" else "1"), t),
     "six: pin or --hash edited by hand"),
    (lambda t: t.replace("einops==0.8.2 \\", "einops==0.8.2 \\\n    --hash=sha256:" + "ab" * 32 + " \\"),
     "einops: pin or --hash edited by hand"),
])
def test_check_names_a_hand_edited_pin_or_hash(tmp_path, edit, words):
    repo = copy_repo(tmp_path)
    f = repo / "envs" / "core_v0.4.0-cu121" / "requirements.lock"
    text = f.read_text()
    f.write_text(edit(text))
    assert f.read_text() != text
    r = invoke(repo, "lock", "--check")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "envs/core_v0.4.0-cu121/requirements.lock" in r.stdout and words in r.stdout
    assert "Traceback" not in r.stderr


def test_check_resolve_agrees_with_the_committed_lock_and_names_a_resealed_hash(tmp_path):
    """Real resolution against the package index: a hash edited by hand and resealed (so the
    offline check passes) is a difference from what the index serves."""
    repo = copy_repo(tmp_path)
    ok = invoke(repo, "lock", "--check", "--resolve", "--profile", "core_v0.4.0-cu121")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "and a new resolution" in ok.stdout
    f = repo / "envs" / "core_v0.4.0-cu121" / "requirements.lock"
    text = re.sub(r"(six==1\.17\.0 \\\n    --hash=sha256:)[0-9a-f]{64}", lambda m: m.group(1) + "cd" * 32, f.read_text())
    prof = profile.load("core_v0.4.0-cu121")
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    f.write_text(lock.seal(prof, body))
    assert invoke(repo, "lock", "--check", "--profile", "core_v0.4.0-cu121").returncode == 0
    bad = invoke(repo, "lock", "--check", "--resolve", "--profile", "core_v0.4.0-cu121")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "requirements.lock: six: its hashes differ from the index's files" in bad.stdout


def test_hand_edits_names_an_edited_seal_and_an_edited_pin_once(tmp_path):
    """The committed lock is clean; a body-digest changed by hand (every package's own seal
    still matching) is named as an edited seal; a changed --hash is named as that package's
    edit alone (not also as a body-digest mismatch); a lock without its seal says so."""
    text = CURRENT.lock_file.read_text()
    path = tmp_path / "requirements.lock"
    path.write_text(text)
    assert lock.hand_edits(path) == []
    recorded = re.search(r"^# body-digest: (sha256:[0-9a-f]{64})$", text, re.M).group(1)
    path.write_text(text.replace(recorded, "sha256:" + "0" * 64))
    edits = lock.hand_edits(path)
    assert len(edits) == 1 and "body-digest" in edits[0] and "seal" in edits[0]
    first_hash = re.search(r"--hash=sha256:([0-9a-f]{64})", text).group(1)
    path.write_text(text.replace(first_hash, "f" * 64, 1))
    edits = lock.hand_edits(path)
    assert len(edits) == 1 and ": annotated-types: " in edits[0]
    path.write_text(re.sub(r"^# sealed .*\n", "", text, flags=re.M))
    assert len(lock.hand_edits(path)) == 1 and "no seal" in lock.hand_edits(path)[0]


@pytest.mark.parametrize(("old", "new", "jump"), [
    ("0.4.0", "0.5.0", True),    # 0.x: the minor number is the major one
    ("0.4.0", "0.4.9", False),
    ("0.9.2", "1.0.0", True),
    ("1.2.0", "1.9.0", False),   # 1.x and later: only the first number counts
    ("1.9", "2.0", True),
    ("2.0.0", "1.9.0", True),    # a downgrade across majors is a jump too
    ("2.11.0+cu130", "2.11.1", False),
    ("0.4.0", None, False),      # added or removed: no jump to flag
    ("not-a-version", "1.0", False),
])
def test_lockdiff_major_jumps(old, new, jump):
    from megatron_env.pyenv import lockdiff

    assert lockdiff.major(old, new) is jump
