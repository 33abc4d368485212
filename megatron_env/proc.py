"""The one subprocess runner: every side effect on the host goes through `run`.

Keeping it in one place means one policy for missing tools (reported, never a traceback),
timeouts, captured output and logging, and one seam for tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from megatron_env import interrupts, redact


@dataclass(frozen=True)
class Result:
    """What a command did. `missing` is True when the program does not exist on this host."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    missing: bool = False
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.missing and not self.timed_out

    @property
    def output(self) -> str:
        """stdout and stderr together, as a person would have seen them."""
        return self.stdout + (self.stderr if self.stderr else "")

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.output.rstrip().splitlines()[-lines:])


def which(program: str, path: str | None = None) -> str | None:
    """A program on PATH, else beside the running interpreter (a venv whose bin is not on PATH)."""
    found = shutil.which(program, path=path)
    if found is None and path is None:
        found = shutil.which(program, path=str(Path(sys.executable).parent))
    return found


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 120,
    input: str | None = None,
    log: Path | None = None,
    stream: bool = False,
    on_line: Callable[[str], object] | None = None,
    stdin_file: Path | None = None,
) -> Result:
    """Run `argv`; never raises for a missing program, a failure or a timeout.

    `env` replaces the environment (callers derive it from `os.environ`); `log` receives the
    combined output; `stream` lets the output through to the terminal as it comes (teed into
    `log`), or, with `on_line`, hands each line to that callback instead (build progress).
    `stdin_file`: a file fed to the program's standard input (a large one, read as it goes).
    """
    args = tuple(str(a) for a in argv)
    exe = args[0]
    if os.sep not in exe and which(exe, path=(env or os.environ).get("PATH")) is None:
        return Result(args, 127, "", f"{exe}: command not found", missing=True)
    child: subprocess.Popen[str] | None = None
    try:
        if stream:
            return _run_streaming(args, cwd, env, timeout, log, on_line)
        with (stdin_file.open("rb") if stdin_file is not None and input is None
              else contextlib.nullcontext(subprocess.PIPE if input is not None
                                          else subprocess.DEVNULL)) as stdin:
            with interrupts.held():  # the child is held before an interrupt is raised
                child = subprocess.Popen(args, cwd=cwd, env=dict(env) if env is not None else None,
                                         stdin=stdin, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, errors="replace")
            try:
                out, err = child.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                # killed and reaped; not read to its end (a grandchild may hold the pipe open):
                # the output so far is what communicate gathered before the timeout
                child.kill()
                child.wait()
                so_far = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (
                    e.stdout or "")
                return Result(args, 124, so_far, f"{exe}: timed out after {timeout}s",
                              timed_out=True)
    except FileNotFoundError:
        return Result(args, 127, "", f"{exe}: command not found", missing=True)
    except PermissionError as e:
        return Result(args, 126, "", f"{exe}: {e}")
    except BaseException:  # an interrupt or SIGTERM of this process: the child goes with it
        if child is not None and child.poll() is None:  # (a streamed run kills its own)
            child.kill()
            child.wait()
        raise
    _interrupted(child.returncode)
    result = Result(args, child.returncode, out, err)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(redact.text(f"$ {' '.join(args)}\n{result.output}"))
    return result


def feed(argv: Sequence[str | os.PathLike[str]], produce: Callable[[IO[bytes]], object], *,
         env: Mapping[str, str] | None = None) -> Result:
    """Run `argv` with `produce` writing its standard input as a stream (a tar of gigabytes
    into mksquashfs -tar): nothing of it is held here. The child's output goes to a temporary
    file (a pipe it filled would stall it while this process writes); a child that stops
    reading ends the feed, and its exit status and output say why."""
    args = tuple(str(a) for a in argv)
    with tempfile.TemporaryFile() as out:
        p: subprocess.Popen[bytes] | None = None
        try:
            try:
                with interrupts.held():  # the child is held before an interrupt is raised
                    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=out,
                                         stderr=subprocess.STDOUT,
                                         env=dict(env) if env is not None else None,
                                         preexec_fn=_DIE_WITH_PARENT)
            except FileNotFoundError:
                return Result(args, 127, "", f"{args[0]}: command not found", missing=True)
            assert p.stdin is not None
            try:
                produce(p.stdin)
                p.stdin.close()
            except BrokenPipeError:
                pass  # the child stopped reading: its status and output say why
            rc = p.wait()
        except BaseException:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
            raise
        _interrupted(rc)
        out.seek(0)
        return Result(args, rc, out.read().decode(errors="replace"), "")


def _logged(fh: IO[str], line: str) -> IO[str] | None:
    """`line` written to the log `fh`; None (no more logging) where the log cannot be written:
    a log on the disk the child is filling (beside the environment uv installs) must not end
    the run in this process's own write error. The output is still kept in memory and shown."""
    try:
        fh.write(line)
        fh.flush()
    except OSError:
        with contextlib.suppress(OSError):
            fh.close()
        return None
    return fh


def _interrupted(returncode: int) -> None:
    """A child killed by SIGINT was interrupted, not failed: Ctrl-C reaches the whole
    foreground group, and the child may die of it before Python raises in this process. Its
    failure must not be read as the tool's own (git's "protocol error" as an unreachable
    mirror): the interrupt goes on up as one."""
    if returncode == -signal.SIGINT:
        raise KeyboardInterrupt


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to send SIGTERM to this child when its parent dies, even of SIGKILL: a killed
    `invoke`/`nox` must not leave a build or a torchrun (with its ranks) running on the node."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_DIE_WITH_PARENT = _die_with_parent if sys.platform == "linux" else None


def _run_streaming(args: tuple[str, ...], cwd: str | Path | None, env: Mapping[str, str] | None,
                   timeout: float | None, log: Path | None,
                   on_line: Callable[[str], object] | None = None) -> Result:
    lines: list[str] = []
    scrub = redact.Lines()  # one per stream: a PEM block's lines are masked until its END
    fh: IO[str] | None = log.open("w") if log is not None else None
    p: subprocess.Popen[str] | None = None
    try:
        with interrupts.held():  # the child is held before an interrupt is raised
            p = subprocess.Popen(
                args,
                preexec_fn=_DIE_WITH_PARENT,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
            )
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            shown = scrub(line)
            if fh:
                fh = _logged(fh, shown)
            if on_line is None:
                sys.stderr.write(shown)  # progress of a tool: status, not a result
                sys.stderr.flush()
            else:
                on_line(line)
        rc = p.wait(timeout=timeout)
        _interrupted(rc)
    except BaseException:  # an interrupt or SIGTERM of this process: the child goes with it
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        raise
    finally:
        if fh:
            fh.close()
    return Result(args, rc, "".join(lines), "")

