"""How a front-door command is declared and run: its options are the keyword parameters of one
function, each option's meaning is written once (`OPTIONS`, or the command's own `help`), and a
`UserError` raised below it becomes one `error:` line with its `hint:` and exit status 2.

The modules of megatron_env.commands declare the commands with `@command`; `commands.registry()`
lists them (by name, not by import side effects), and tasks.py and the `megatron-env` command
are both made from that list, so no option is declared twice.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_env import files, output
from megatron_env.errors import UserError


def guarded(fn: Callable[..., int]) -> Callable[..., int]:
    """Run a front-door command so that whatever ends it ends in one line and a known status:
    2 for a UserError (its hint), 130 for an interrupt (143 for SIGTERM), 141 when the reader
    of stdout went away (as a program killed by SIGPIPE; nothing printed), 70 for anything else
    (a bug: the line says what to attach; MEGATRON_ENV_DEBUG=1 prints the traceback too)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        with _interruptible():
            try:
                return fn(*args, **kwargs)
            except UserError as e:
                output.error(e.message, e.fix)
                return e.exit_code
            except KeyboardInterrupt as e:
                if isinstance(e, Terminated):
                    output.error("terminated")
                    return 128 + signal.SIGTERM
                output.error("interrupted")
                return 130
            except BrokenPipeError:
                return stdout_closed()
            except OSError as e:  # a path the user named cannot be used as asked
                err = os_error(e)
                output.error(err.message, err.fix)
                return err.exit_code
            except Exception as e:  # noqa: BLE001 - the last net: a bug, said as one
                return _bug(e)

    return wrapper


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's time limit, `kill`): unwound like Ctrl-C, so that what a command
    was making is removed on the way out, then exit 143 as a program killed by it."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


@contextlib.contextmanager
def json_error(enabled: bool, command: str) -> Iterator[None]:
    """With --json, a command that stops on an error still prints one JSON object on stdout
    ({"error": {"kind", "message", "fix"}}) for the program reading it; the error line on
    stderr and the exit status stay `guarded`'s."""
    try:
        yield
    except (UserError, OSError) as e:
        if enabled:
            said = e if isinstance(e, UserError) else os_error(e)  # ENOSPC: disk.full
            err = {"kind": said.kind or "error", "message": said.message, "fix": said.fix}
            output.block(json.dumps({"command": command, "ok": False, "error": err},
                                    indent=1) + "\n")
        raise


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt while a command runs, even where SIGINT was inherited as
    ignored (a job started with `&` by a script): an interrupt is never swallowed. SIGTERM
    raises `Terminated` the same way: its default would end the process where it stands,
    leaving a half-built environment and its children behind."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    before_term = signal.getsignal(signal.SIGTERM) if main else None
    if main:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        if main and before is not None:
            signal.signal(signal.SIGINT, before)
        if main and before_term is not None:
            signal.signal(signal.SIGTERM, before_term)


def stdout_closed() -> int:
    """`cmd | head -1`: the reader is gone. Python's documented recipe: point stdout at
    /dev/null so that the flush at exit cannot raise again; no message (nobody reads it)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 141


def usage(message: str, fix: str) -> UserError:
    """A front door's usage error (an unknown option or command, a value left out or of the
    wrong kind): the same kind and exit status 2 in both doors, whichever parser saw it."""
    return UserError(message, fix=fix, kind="input.usage")


def os_error(e: OSError) -> UserError:
    """An OSError as the one line it is said as (a full disk: `files.full`)."""
    if e.errno == errno.ENOSPC:
        return files.full(e.filename) if e.filename else files.full_anywhere()
    if files.no_space(e):  # shutil's list of (source, target, why): one line, not the list
        return files.full_anywhere()
    return UserError(f"{e.filename or 'a file'}: {e.strerror or e}",
                     fix="check that path (a directory where one is needed, writable, on a "
                         "disk with space)", kind="input.path")


def _bug(e: Exception) -> int:
    if os.environ.get("MEGATRON_ENV_DEBUG") == "1":
        traceback.print_exception(e)
    frames = traceback.extract_tb(e.__traceback__)
    where = ""
    if frames:
        f = frames[-1]
        parts = Path(f.filename).parts
        rel = "/".join(parts[parts.index("megatron_env"):]) if "megatron_env" in parts \
            else Path(f.filename).name
        where = f" at {rel}:{f.lineno}"
    output.error(f"bug: {type(e).__name__}{where}: {e}",
                 "this is a bug in megatron-env, not in your input: run `invoke report` and "
                 "attach its output and this line to an issue (MEGATRON_ENV_DEBUG=1 shows the "
                 "traceback)")
    return 70


#: The words that ask for a command's help, wherever a front door reads them.
HELP_WORDS = ("--help", "-h")

#: Short flags fixed by name, the same in both front doors (others: a letter of the name not
#: yet taken): -j is a number of jobs, as in make and ninja, never --json (which has none).
SHORTS: dict[str, str | None] = {"jobs": "j", "json": None}


#: In an option's help: where environments go by default here (`shown_help` fills it in).
ENVS = "{envs}"


def shown_help(text: str) -> str:
    """An option's help as a front door shows it: ENVS said as the environments root of the
    project in use (a checkout's .megatron-env, or the user's data directory from a wheel),
    so the help names where the tool really writes."""
    if ENVS not in text:
        return text
    from megatron_env import project

    root, home = project.env_root(), Path.home()
    return text.replace(ENVS, f"~/{root.relative_to(home)}" if root.is_relative_to(home)
                        else str(root))


#: What each option means, written once for every command that takes it.
OPTIONS = {
    "profile": "profile name (default: the default profile)",
    "prefix": f"where the environment lives (default {ENVS}/<profile>)",
    "python": "the interpreter to use instead of the profile's environment",
    "json": "print {\"findings\": [...]} on stdout instead of a table",
    "dry_run": "print the plan (what would run and why) and stop",
    "verify_deep": "re-hash every installed file against its RECORD and import again",
    "bundle": "use only this bundle (.tar or unpacked directory; repeat for deltas)",
    "adopt": "use this existing interpreter (an NGC container's python) as the environment",
    "conda": "conda/mamba/micromamba executable for the conda path",
    "expect_sha256": "with --bundle: refuse an archive whose sha256 is not this (repeatable; "
                     "B.tar.sha256 holds it)",
    "trust": "with --bundle: an allowed-signers file; refuse an archive not signed (B.tar.sig) "
             "by one of its keys",
}


@dataclass(frozen=True)
class Command:
    """One front-door command: its function (options = keyword parameters) and their help."""

    name: str
    fn: Callable[..., int]
    help: dict[str, str] = field(default_factory=dict)
    iterable: tuple[str, ...] = ()
    # the option the words after the command fill, as many as given (`megatron-env triage a b`);
    # invoke takes one word there (its parser reads a second word as the next task's name)
    rest: str | None = None

    @property
    def summary(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0]

    def __call__(self, *args: Any, **options: Any) -> int:
        """Run it as the front doors do (guarded: an error is one line and an exit status)."""
        return self.fn(*args, **options)


def command(name: str | None = None, iterable: tuple[str, ...] = (), rest: str | None = None,
            **help: str) -> Callable[[Callable[..., int]], Command]:
    """Declare a command (its function, guarded, with the help of each option); `help` holds the
    meaning of options `OPTIONS` does not have, or that this command takes in another sense.
    Declaring registers nothing: `commands.registry()` lists the commands."""

    def declare(fn: Callable[..., int]) -> Command:
        params = inspect.signature(fn).parameters
        unknown = [k for k in params if k not in help and k not in OPTIONS]
        assert not unknown, f"{fn.__name__}: no help for {unknown}"  # a programming error
        return Command(name or fn.__name__, guarded(fn),
                       {k: help.get(k) or OPTIONS[k] for k in params}, iterable, rest)

    return declare


def table(*commands: Command) -> dict[str, Command]:
    """The commands by name, in the order given (the order of `--help`); a name twice is a
    programming error."""
    out: dict[str, Command] = {}
    for cmd in commands:
        assert cmd.name not in out, f"command {cmd.name} declared twice"
        out[cmd.name] = cmd
    return out
