"""nox sessions: thin wrappers; the work happens in megatron_env and scripts/."""

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session):
    """Install the tool with its test extras and run the test suite."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", ".")
