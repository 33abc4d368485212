"""invoke tasks: argument parsing only; the work happens in megatron_env.commands."""

from invoke import Exit, task

from megatron_env import commands


def _done(code: int) -> None:
    if code:
        raise Exit(code=code)


@task
def profiles(c):
    """List the profiles under envs/ (* marks the default)."""
    _done(commands.profiles())


@task(help={"out": "directory to write the snapshot into"})
def collect(c, out):
    """Record this host's GPU, driver, network and limits facts into a snapshot directory."""
    _done(commands.collect(out))


@task(help={"profile": "profile name (default: the default profile)",
            "snapshot": "analyse a snapshot directory instead of this host",
            "json": "print {\"findings\": [...]} on stdout instead of a table"})
def check(c, profile=None, snapshot=None, json=False):
    """Check whether this host (or a snapshot) can train the profile's stack at full speed."""
    _done(commands.check(profile, snapshot, json))


@task(help={"profile": "profile name (default: the default profile)"})
def setup(c, profile=None):
    """Check the host, then build the profile's environment (steps not built yet are listed)."""
    _done(commands.setup(profile))
