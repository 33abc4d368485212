"""The front-door commands: one function per command, each returning an exit code.

Each command and each of its options is declared once, in the module of its topic (`host`: a
node and what happened on it; `pyenv`: the environment's layers; `setup`: the chain and the
bundle): the function's keyword parameters are the options (names and defaults); `cli` says how
(`@command`, the shared option meanings, `guarded`). `registry()` lists them by name; tasks.py
and the `megatron-env` command (`main`) are made from that list; nothing registers itself on
import, and importing this package reads no project file (a `--project` is chosen first).
Every line goes through `output`: status to stderr, results and the summary line to stdout.
"""

from __future__ import annotations

from megatron_env.commands.cli import Command


def registry() -> dict[str, Command]:
    """Every command, in the order `--help` lists them."""
    from megatron_env.commands import cli, host, image, places, pyenv, setup

    return cli.table(host.profiles, host.collect, host.check, setup.setup, setup.megatron,
                     pyenv.lock, pyenv.lock_diff, pyenv.env, pyenv.build, pyenv.build_check,
                     host.kernels, host.triage, host.bug_report, host.preflight, setup.bundle,
                     image.image, places.clean)
