"""How a front-door command is declared and run: its options are the keyword parameters of one
function, each option's meaning is written once (`OPTIONS`, or the command's own `help`), and a
`UserError` raised below it becomes one `error:` line with its `hint:` and exit status 2.

megatron_env.commands declares the commands with `@command`; tasks.py makes invoke tasks of
`COMMANDS`, so no option is declared twice.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

from megatron_env import output
from megatron_env.errors import UserError


def guarded(fn: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> int:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            output.error(e.message, e.fix)
            return e.exit_code
        except KeyboardInterrupt:
            output.error("interrupted")
            return 130
        except OSError as e:  # the last net: a path the user named cannot be used as asked
            output.error(f"{e.filename or 'a file'}: {e.strerror or e}",
                         "check that path (a directory where one is needed, writable, on a "
                         "disk with space)")
            return 2

    return wrapper


#: What each option means, written once for every command that takes it.
OPTIONS = {
    "profile": "profile name (default: the default profile)",
    "prefix": "where the environment lives (default .megatron-env/<profile>)",
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

    @property
    def summary(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0]


COMMANDS: dict[str, Command] = {}


def command(name: str | None = None, iterable: tuple[str, ...] = (),
            **help: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Register a command; `help` holds the meaning of options `OPTIONS` does not have, or that
    this command takes in another sense."""

    def register(fn: Callable[..., int]) -> Callable[..., int]:
        params = inspect.signature(fn).parameters
        unknown = [k for k in params if k not in help and k not in OPTIONS]
        assert not unknown, f"{fn.__name__}: no help for {unknown}"  # a programming error
        wrapped = guarded(fn)
        cmd = Command(name or fn.__name__, wrapped,
                      {k: help.get(k) or OPTIONS[k] for k in params}, iterable)
        COMMANDS[cmd.name] = cmd
        return wrapped

    return register
