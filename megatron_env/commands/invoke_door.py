"""The `invoke` front door's own usage errors, said as the `megatron-env` command says its own.

invoke's parser ends an unknown flag or task, a flag left without its value, a word where a
number goes (`invoke setup --bogus`, `invoke setp`, `invoke bundle --out`, `invoke preflight
--size many`) with its own message and exit 1, no hint, or a traceback for the number. Here
each is one `error:` line naming the task and the flag, a `hint:` naming the help that lists
what it takes, exit 2, and with `--json` the JSON error object on stdout: the same kind
(input.usage) and the same printing (cli.guarded, cli.json_error) as the other door.

invoke's own entry points (the `invoke` script and `python -m invoke`) run one `Program`,
`invoke.main.program`, and import tasks.py while it runs; tasks.py hands it to `take_over`,
which makes it a `Door` before it parses the tasks. invoke's core options parsed before
tasks.py is imported (`invoke -r` with no directory) stay invoke's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from invoke.exceptions import Exit, ParseError
from invoke.parser.argument import Argument
from invoke.parser.context import ParserContext
from invoke.program import Program

from megatron_env.commands import cli
from megatron_env.errors import UserError

_DOOR = "invoke"


class Refused(ParseError):
    """A word a task's flag does not take (a word where a number goes, an unknown option where
    a positional goes), raised while the flag is set: the parser's context is not at hand
    there, so the task is named here."""

    def __init__(self, message: str, task: str | None) -> None:
        super().__init__(message)
        self.task = task


class Flag(Argument):
    """A task's option as invoke reads it, but said as its flag (`--out`) in invoke's messages
    (before: "Flag <Argument: out (o) *> needed value"); a word where a number goes is
    `Refused` naming the flag (before: a ValueError traceback from int()), and so is an
    option where a value goes, as argparse refuses it (before: `invoke collect --bogus` wrote
    a snapshot into ./--bogus, `invoke setup --prefix --bogus` took it for the prefix).
    `--help` where a positional goes is the task's help (tasks.py)."""

    def __init__(self, task: str | None, **opts: Any) -> None:
        super().__init__(**opts)
        self.task = task

    @classmethod
    def of(cls, arg: Argument, task: str | None) -> Flag:
        return cls(task, names=arg.names, kind=arg.kind, default=arg.default, help=arg.help,
                   positional=arg.positional, optional=arg.optional,
                   incrementable=arg.incrementable, attr_name=arg.attr_name)

    def __repr__(self) -> str:
        return "--" + next(n for n in self.names if len(n) > 1)

    def set_value(self, value: Any, cast: bool = True) -> None:
        if isinstance(value, str) and _option_like(value) and value not in cli.HELP_WORDS:
            raise Refused(f"unknown option {value!r}" if self.positional else
                          f"{self!r} needs a value, not the option {value!r}", self.task)
        try:
            super().set_value(value, cast)
        except ValueError:
            raise Refused(f"{self!r} takes a whole number, not {value!r}", self.task) from None


def _option_like(word: str) -> bool:
    """A word argparse reads as an option, never as a value: '-' first, no space, not a
    number, not '-' alone (`--nccl-args "--sizes 1M:1G"`, `--slow -0.5` and `triage -`,
    standard input, stay values)."""
    if not word.startswith("-") or " " in word or word == "-":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


def valueless(words: list[str], contexts: Mapping[str, ParserContext]) -> None:
    """Refuse a flag that takes a value but was given none, where invoke's parser lets it by:
    a repeatable flag (`--bundle` last, or `--bundle --dry-run`: setup ran without the bundle
    asked for) and a flag given twice (`--out x --out`: the second said nothing). `words` are
    the task words invoke parsed (tasks, their flags and values); a flag's value word and the
    words that fill a task's positionals are never read as a task name."""
    ctx: ParserContext | None = None
    need = 0  # the positionals of ctx not given yet
    words = words[:words.index("--")] if "--" in words else words
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        name = word.partition("=")[0]
        if ctx is not None and (name in ctx.flags or name in ctx.inverse_flags):
            arg = ctx.flags.get(name)
            if arg is None or not arg.takes_value or arg.optional or "=" in word:
                continue
            need -= bool(arg.positional and need)
            after = words[i + 1] if i + 1 < len(words) else None
            if after is None or after in ctx.flags or after in ctx.inverse_flags:
                raise Refused(f"{arg!r} needs a value", ctx.name)
            skip = True
        elif need:
            need -= 1
        elif word in contexts:
            ctx = contexts[word]
            need = len(ctx.positional_args)


def _task(error: ParseError) -> str | None:
    """The task whose words were being read (None: before any task, or no task at all)."""
    if isinstance(error, Refused):
        return error.task
    name = getattr(error.context, "name", None)
    return name if isinstance(name, str) else None


def usage(error: ParseError) -> UserError:
    """invoke's parse error as the door's usage error: the task it was reading named, and the
    hint the help that lists what that task (or invoke) takes."""
    task = _task(error)
    if task:
        return cli.usage(f"{_DOOR} {task}: {error}",
                         f"`{_DOOR} {task} --help` lists its options, `{_DOOR} --list` the "
                         "tasks")
    return cli.usage(f"{_DOOR}: {error}",
                     f"`{_DOOR} --list` lists the tasks, `{_DOOR} TASK --help` their options")


def _said(error: ParseError, argv: list[str]) -> int:
    """Print it as a command's usage error is printed (with --json, the JSON error object on
    stdout too), and the exit status for it."""
    err = usage(error)

    @cli.guarded
    def say() -> int:
        with cli.json_error("--json" in argv, _task(error) or _DOOR):
            raise err

    return say()


class Door(Program):
    """invoke's Program, but a parse error is the door's usage error (`_said`), exit 2."""

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
            valueless(list(self.core.unparsed), self.parser.contexts)
        except ParseError as e:
            raise Exit(code=_said(e, list(self.argv))) from None

    def parse_cleanup(self) -> None:  # `invoke --help bogus`
        try:
            super().parse_cleanup()
        except ParseError as e:
            raise Exit(code=_said(e, list(self.argv))) from None

    # what invoke prints for people (help, the task list, its version): a reader that left
    # (`invoke setup --help | head -1`) ends it as the megatron-env door does, exit 141 and
    # nothing more said (before: a BrokenPipeError traceback)
    def print_help(self) -> None:
        _to_a_reader(super().print_help)

    def print_task_help(self, name: str) -> None:
        _to_a_reader(super().print_task_help, name)

    def list_tasks(self) -> None:
        _to_a_reader(super().list_tasks)

    def print_version(self) -> None:
        _to_a_reader(super().print_version)


def _to_a_reader(show: Callable[..., None], *args: str) -> None:
    try:
        show(*args)
        sys.stdout.flush()
    except BrokenPipeError:
        raise Exit(code=cli.stdout_closed()) from None


def task_help(namespace: Any, task: str) -> None:
    """`invoke TASK --help` where the task's positional took `--help`: that task's help, printed
    as the door prints help (a reader that left: exit 141, said by raising invoke's Exit)."""
    try:
        Door(namespace=namespace).run(["invoke", "--help", task])
    except SystemExit as e:
        if e.code:
            raise Exit(code=int(e.code)) from None


def take_over(program: Program) -> None:
    """Make the Program now loading tasks.py (invoke's own, a plain Program) a `Door`: the
    tasks are parsed after they are loaded, so its parse errors are said as ours. A Program of
    another class (someone's own) is left as it is."""
    if type(program) is Program:
        program.__class__ = Door
