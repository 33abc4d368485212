"""invoke tasks, made from megatron_env.commands.registry(): each command and option is declared
there once (the function's keyword parameters, their defaults and their help:
megatron_env.commands.cli); nothing
else lives here."""

import inspect
import signal

import invoke.main
from invoke import Collection, Exit, Task

from megatron_env import commands
from megatron_env.commands import cli, invoke_door


class _Task(Task):
    """invoke's short flags, but those cli.SHORTS fixes (-j: --jobs; --json: none), and -h is
    always the help, as in the `megatron-env` command (before: `invoke lock -h` was --channel)."""

    def arg_opts(self, name, default, taken_names):
        # "-" is no letter: a flag short of letters got `--` (`--=STRING` in preflight's help)
        fixed = {s for s in cli.SHORTS.values() if s} | {"h", "-"}
        opts = super().arg_opts(name, default, taken_names | fixed)
        if name in cli.SHORTS:
            opts["names"] = [opts["names"][0], *filter(None, [cli.SHORTS[name]])]
        return opts

    def get_arguments(self, ignore_unknown_help=None):
        # each said as its flag in invoke's messages, a word for a number a usage error
        return [invoke_door.Flag.of(a, self.name)
                for a in super().get_arguments(ignore_unknown_help)]


def _task(cmd: cli.Command) -> Task:
    params = inspect.signature(cmd.fn).parameters.values()
    positional = [p.name for p in params if p.default is inspect.Parameter.empty]

    def body(c, **options):
        # invoke fills a positional still missing with the next word, `--help` too: that word
        # asks for this task's help, as argparse reads it (never a directory named --help)
        if any(options.get(name) in cli.HELP_WORDS for name in positional):
            invoke_door.task_help(namespace, cmd.name)
            return
        if code := cmd.fn(**options):
            raise Exit(code=code)

    body.__signature__ = inspect.Signature(  # invoke reads options from the signature
        [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD),
         *(p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params)])
    body.__doc__ = cmd.fn.__doc__
    # invoke's help shows no value for a repeatable option: its help line names it
    helps = {k: f"{k.upper()} (repeatable): {v}" if k in cmd.iterable else v
             for k, v in ((k, cli.shown_help(v)) for k, v in cmd.help.items())}
    return _Task(body, name=cmd.name, help=helps, iterable=list(cmd.iterable))


# Ctrl-C interrupts even where SIGINT was inherited as ignored (a job started by a script with &)
signal.signal(signal.SIGINT, signal.default_int_handler)
# invoke's usage errors (unknown flag or task, a value missing or not a number) said as ours
invoke_door.take_over(invoke.main.program)
namespace = Collection(*(_task(cmd) for cmd in commands.registry().values()))
