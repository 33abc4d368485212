"""Interrupts, closed pipes, full disks and bugs end as people expect (issue 27 item 3):
SIGINT -> `interrupted`, exit 130, never another error's hint; a reader that went away -> no
message, exit 141; a full filesystem -> its mount point named; any other exception -> one line
naming it as a bug, exit 70. Real processes, real signals, a real tmpfs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from megatron_env import files, proc
from megatron_env.commands import cli
from megatron_env.sources import repos

from .conftest import FIXTURES, user_error

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def _start(code_or_argv, **env: str) -> subprocess.Popen:
    argv = [PY, "-c", textwrap.dedent(code_or_argv)] if isinstance(code_or_argv, str) \
        else [PY, *code_or_argv]
    return subprocess.Popen(argv, cwd=ROOT, env=_env(**env), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(p: subprocess.Popen, path: Path, text: str, limit: float = 60) -> None:
    end = time.monotonic() + limit
    while text not in (path.read_text() if path.exists() else ""):
        assert p.poll() is None, f"ended before {text!r}: {p.communicate()}"
        assert time.monotonic() < end, f"no {text!r} within {limit} s"
        time.sleep(0.1)


# a guarded command whose child is a git fetch that hangs (ext:: runs a local program as the
# remote): what `invoke bundle` does when it reaches Megatron's mirror
FETCH = """
import sys
from pathlib import Path
from megatron_env.commands import cli
from megatron_env.sources import repos
Path(sys.argv[1]).write_text("fetching")
sys.exit(cli.guarded(lambda: repos.mirror("megatron", "ext::sh -c sleep% 60") and 0)())
"""
GIT_EXT = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.ext.allow",
           "GIT_CONFIG_VALUE_0": "always"}


def _descendants(pid: int) -> list[str]:
    return proc.run(["pgrep", "-P", str(pid)]).stdout.split()


def test_sigint_during_a_git_fetch_is_an_interrupt_not_an_unreachable_mirror(tmp_path):
    """Ctrl-C reaches the whole foreground group, git too. Before: git's failure was read as the mirror's ("protocol error ... hint: set
    MEGATRON_ENV_MIRROR_MEGATRON"), exit 2."""
    mark = tmp_path / "mark"
    p = subprocess.Popen([PY, "-c", FETCH, str(mark)], cwd=ROOT, start_new_session=True,
                         env=_env(MEGATRON_ENV_CACHE=str(tmp_path / "cache"), **GIT_EXT),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(p, mark, "fetching")
    end = time.monotonic() + 30
    while not (proc.run(["pgrep", "-P", str(p.pid), "git"]).stdout.split()):
        assert time.monotonic() < end and p.poll() is None, p.communicate()
        time.sleep(0.1)
    # git has started its remote helper (ext:: runs `sh -c sleep 60` under it): the fetch is
    # under way when the interrupt comes
    git = proc.run(["pgrep", "-P", str(p.pid), "git"]).stdout.split()[0]
    while not _descendants(int(git)):
        assert time.monotonic() < end and p.poll() is None, p.communicate()
        time.sleep(0.01)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert err.strip().splitlines()[-1] == "error: interrupted", err
    assert "MIRROR" not in err and "hint" not in err


def _catches_sigint(pid: int) -> bool:
    """The process has a handler for SIGINT (/proc/PID/status SigCgt: a bit per signal)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # it ended
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


def test_sigint_inherited_as_ignored_still_interrupts():
    """A job started with `&` by a script inherits SIGINT ignored; the front door restores it
    (before: the signal was swallowed, a complete bundle and exit 0)."""
    code = """
    import sys, time
    from megatron_env.commands import main
    sys.argv = ["megatron-env", "triage", "-"]
    sys.exit(main.main())
    """
    p = subprocess.Popen([PY, "-c", textwrap.dedent(code)], cwd=ROOT, env=_env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    # once the front door has taken SIGINT back (caught, no longer ignored), send it: while it
    # reads stdin, or after it refused `-`, either way SIGINT must not be ignored
    end = time.monotonic() + 60
    while p.poll() is None and not _catches_sigint(p.pid):
        assert time.monotonic() < end, "SIGINT still ignored after 60 s"
        time.sleep(0.01)
    if p.poll() is None:
        os.kill(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 130, err
        assert "interrupted" in err
    else:  # `-` is not a log here yet: the handler is then checked in-process below
        p.communicate()
        before = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            seen = []
            cli.guarded(lambda: seen.append(signal.getsignal(signal.SIGINT)) or 0)()
            assert seen == [signal.default_int_handler]
        finally:
            signal.signal(signal.SIGINT, before)


def test_a_child_killed_by_sigint_raises_keyboardinterrupt():
    with pytest.raises(KeyboardInterrupt):
        # a Python child: a shell cannot undo a SIGINT ignored on entry (CI may start so)
        proc.run([sys.executable, "-c", "import os, signal, time; "
                  "signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.kill(os.getpid(), signal.SIGINT); time.sleep(5)"])
    assert proc.run(["sh", "-c", "exit 130"]).returncode == 130  # an exit status is not a signal


def test_sigint_early_in_bundle_leaves_nothing(tmp_path):
    """The real `bundle` command, interrupted while it builds the tool's wheel."""
    out = tmp_path / "b.tar"
    errfile = tmp_path / "err"
    with errfile.open("w") as err:
        p = subprocess.Popen([PY, "-m", "megatron_env", "bundle", "--adopt", "--out", str(out)],
                             cwd=ROOT, env=_env(), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=err)
        _wait_for(p, errfile, "tool:")
        os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=60)
    text = errfile.read_text()
    assert p.returncode == 130, text
    assert text.strip().splitlines()[-1] == "error: interrupted"
    assert not list(tmp_path.glob("b.tar*")) and not list(tmp_path.glob(".bundle-*"))


@pytest.mark.parametrize("argv", [["check"], ["check", "--json"],
                                  ["triage", str(FIXTURES / "job-logs")]])
def test_a_closed_stdout_ends_quietly(argv):
    """`cmd | head -1` where head is gone before the first line: no `Broken pipe` error, no
    `Exception ignored` at exit, status 141 (as a program killed by SIGPIPE)."""
    r, w = os.pipe()
    os.close(r)  # the reader went away
    p = subprocess.run([PY, "-m", "megatron_env", *argv], cwd=ROOT, env=_env(), stdout=w,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(w)
    assert p.returncode == 141, p.stderr
    assert "error" not in p.stderr.lower() and "Exception" not in p.stderr


def test_a_bug_is_one_line_exit_70_and_the_traceback_only_when_asked(capsys, monkeypatch):
    def broken() -> int:
        return {}["profile"]

    monkeypatch.delenv("MEGATRON_ENV_DEBUG", raising=False)
    assert cli.guarded(broken)() == 70
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: bug: KeyError at test_signals_pipes_disk.py:")
    assert "invoke report" in lines[1] and len(lines) == 2
    assert "Traceback" not in err
    monkeypatch.setenv("MEGATRON_ENV_DEBUG", "1")
    assert cli.guarded(broken)() == 70
    assert "Traceback" in capsys.readouterr().err


@pytest.fixture
def full_tmpfs(tmp_path):
    """A 1 MiB tmpfs, filled: a real ENOSPC (root only; CI runs as root)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = proc.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)])
    if not r.ok:
        pytest.skip(f"cannot mount a tmpfs here: {r.tail(1)}")
    try:
        with (mnt / "fill").open("wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        (mnt / "fill").unlink()
        (mnt / "fill").write_bytes(b"\0" * (1024 * 1024 - 8192))  # nearly full: a few KiB left
        yield mnt
    finally:
        proc.run(["umount", "-l", str(mnt)])


def test_full_disk_names_the_filesystem_for_a_write_without_a_path(full_tmpfs):
    """collect writes its files with write(), whose OSError names no file."""
    p = subprocess.run([PY, "-m", "megatron_env", "collect", "--out", str(full_tmpfs / "s")],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert f"error: no space on {full_tmpfs}" in p.stderr
    assert "Traceback" not in p.stderr


def test_full_disk_during_a_mirror_fetch_is_not_an_unreachable_mirror(full_tmpfs, tmp_path,
                                                                      monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    proc.run(["git", "init", "-q", str(src)])
    (src / "blob").write_bytes(os.urandom(3 * 2**20))  # more than the filesystem holds
    proc.run(["git", "-C", str(src), "add", "blob"])
    proc.run(["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t", "commit",
              "-qm", "blob"])
    monkeypatch.setenv(repos.CACHE_ENV, str(full_tmpfs / "cache"))
    with user_error("disk.full") as e:
        repos.mirror("megatron", str(src))
    assert str(full_tmpfs) in e.value.message


def test_ensure_refuses_before_writing(full_tmpfs):
    with user_error("disk.full") as e:
        files.ensure(full_tmpfs / "out" / "b.tar", 5 * 2**20, "bundle b.tar")
    assert f"no space on {full_tmpfs} for bundle b.tar: 5 MiB needed" in e.value.message
    files.ensure(full_tmpfs, 10, "a few bytes")  # room for that
