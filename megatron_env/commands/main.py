"""The `megatron-env` console command (and `python -m megatron_env`): an argparse front door
made from the same `commands.registry()` as the invoke tasks, so a command and its options are
declared once (megatron_env.commands). Global options: `--project DIR` (where envs/, patches/
and scripts/ are: megatron_env.project), `--cache-dir DIR`, `--version`; `completion
bash|zsh|fish` prints a script."""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Sequence
from typing import NoReturn

from megatron_env import __version__, commands, project
from megatron_env.commands import cli, completion
from megatron_env.errors import UserError

_PROG = "megatron-env"


def _flag(name: str) -> str:
    return "--" + name.rstrip("_").replace("_", "-")


def _add_option(sub: argparse.ArgumentParser, p: inspect.Parameter, help_: str,
                iterable: tuple[str, ...], shorts: set[str], rest: str | None = None) -> None:
    """One keyword parameter as an option; a parameter without default is also positional
    (as invoke takes it; the command's `rest` takes every word left, a list); a first letter
    not yet taken is its short flag (as invoke gives), but cli.SHORTS fixes some by name."""
    flag = _flag(p.name)
    names = [flag]
    if p.name in cli.SHORTS:  # fixed by name (-j: --jobs; --json: none)
        short = f"-{cli.SHORTS[p.name]}" if cli.SHORTS[p.name] else None
    else:
        short = "-" + flag[2]
        if short[1] in cli.SHORTS.values():
            short = None
    if short and short not in shorts:
        shorts.add(short)
        names.insert(0, short)
    meta = p.name.rstrip("_").upper()
    if p.name in iterable:
        sub.add_argument(*names, dest=p.name, action="append", metavar=meta, help=help_)
    elif p.default is False:
        sub.add_argument(*names, dest=p.name, action="store_true", help=help_)
    elif p.annotation in ("bool | None", bool) or (p.default is None and "bool" in
                                                     str(p.annotation)):
        sub.add_argument(flag, dest=p.name, action=argparse.BooleanOptionalAction,
                         default=None, help=help_)
    else:
        kind = int if isinstance(p.default, int) and not isinstance(p.default, bool) else str
        default = None if p.default is inspect.Parameter.empty else p.default
        sub.add_argument(*names, dest=p.name, type=kind, default=default, metavar=meta,
                         help=help_ + (f" (default {default})" if default not in (None, "")
                                       else ""))
        if p.default is inspect.Parameter.empty:
            sub.add_argument(f"_{p.name}", nargs="*" if p.name == rest else "?", metavar=meta,
                             help=argparse.SUPPRESS)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is the front door's: one `error:` line with its `hint:` and
    exit 2 (with --json, the JSON error object on stdout too), never argparse's usage block.
    The command's parsers are made of this class too (add_subparsers takes the parent's)."""

    def error(self, message: str) -> NoReturn:
        raise _usage(message, self.prog)


def _usage(message: str, prog: str) -> UserError:
    sub = prog[len(_PROG):].strip()
    return cli.usage(f"{prog}: {message}",
                     f"`{_PROG} {sub} --help` lists its options" if sub else
                     f"`{_PROG} --help` lists the commands, `{_PROG} COMMAND --help` their "
                     "options")


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog=_PROG, description="Reproducible, verified Megatron-LM training environments.")
    top.add_argument("--project", metavar="DIR",
                     help=f"the directory with envs/, patches/, scripts/ (or {project.ENV}; "
                          "default: the enclosing checkout, else the copy in this package)")
    top.add_argument("--cache-dir", metavar="DIR",
                     help=f"the cache (or {project.CACHE_ENV}; default: .cache in a project, "
                          "else the user's cache directory)")
    top.add_argument("-V", "--version", action="store_true",
                     help="print the tool's version (and git commit in a checkout)")
    subs = top.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in commands.registry().values():
        sub = subs.add_parser(cmd.name, help=cmd.summary, description=cmd.summary)
        shorts = {"-h"}
        for p in inspect.signature(cmd.fn).parameters.values():
            _add_option(sub, p, cli.shown_help(cmd.help[p.name]), cmd.iterable, shorts,
                        cmd.rest)
        sub.set_defaults(_cmd=cmd)
    comp = subs.add_parser("completion", help="print a shell completion script",
                           description="print a shell completion script: "
                                       "eval \"$(megatron-env completion bash)\"; fish: "
                                       "megatron-env completion fish | source")
    comp.add_argument("shell", choices=completion.SHELLS)
    return top


def _version() -> str:
    commit = project.commit()
    return (f"{_PROG} {__version__}" + (f" (git {commit})" if commit else "")
            + f"; project {project.root()} ({project.how()})")


def main(argv: Sequence[str] | None = None) -> int:
    # guarded from the first argument on: Ctrl-C interrupts even where SIGINT was inherited as
    # ignored (`cmd &`), and an interrupt while the options are read is one `error:
    # interrupted` line and 130 too, never a traceback
    return cli.guarded(_main)(list(sys.argv[1:] if argv is None else argv))


def _main(argv: list[str]) -> int:
    pre = _Parser(prog=_PROG, add_help=False)
    pre.add_argument("--project")
    pre.add_argument("--cache-dir")
    # a global option given no value is a usage error said as one (before: argparse's usage
    # block), with --json its JSON error object too (the command is not known yet)
    with cli.json_error("--json" in argv, _PROG):
        known, _ = pre.parse_known_args(argv)
    project.choose(known.project)  # before any module reads the project root
    project.choose_cache(known.cache_dir)
    from megatron_env import commands

    # the command named (the first word that is one), for the JSON error object of --json
    named = next((w for w in argv if w in commands.registry()), _PROG)
    with cli.json_error("--json" in argv, named):
        return _run(argv)


def _run(argv: list[str]) -> int:
    project.root()  # a --project that holds no profile: refused here, before anything runs
    top = parser()
    args = top.parse_args(argv)
    if args.version:
        print(_version())
        return 0
    if args.command == "completion":
        sys.stdout.write(completion.script(top, args.shell, _PROG))
        return 0
    if args.command is None:
        top.print_help()
        return 2
    cmd: cli.Command = args._cmd
    options = {}
    for name in inspect.signature(cmd.fn).parameters:
        value = getattr(args, name)
        positional = getattr(args, f"_{name}", None)
        if value is None and positional not in (None, []):
            value = positional
        elif name == cmd.rest and positional:  # `--logs a b c`: a, then the words left
            value = [value, *positional]
        if value is None and inspect.signature(cmd.fn).parameters[name].default is \
                inspect.Parameter.empty:
            raise _usage(f"{_flag(name)} is required (or give it as the first word after "
                         f"{cmd.name})", f"{_PROG} {cmd.name}")
        options[name] = value
    return cmd.fn(**{k: v for k, v in options.items() if v is not None or
                     inspect.signature(cmd.fn).parameters[k].default is None})


if __name__ == "__main__":
    raise SystemExit(main())
