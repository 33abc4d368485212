"""Run the standalone verification programs of scripts/ inside a profile's environment.

The nox sessions verify_nccl, verify_cuda and smoke_train call `run`; the programs themselves
stay independent of this package (they must also run in an NGC container or on a bare node).
Each run gets its own directory under runs/ holding the program's JSON, logs and plot, and the
command line that produced them.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from megatron_env import REPO_ROOT, output, proc, project
from megatron_env.errors import UserError

SCRIPTS = {"verify_nccl": "verify_nccl.py", "verify_cuda": "gpu_health.py",
           "smoke_train": "smoke_train.py"}
DISTRIBUTED = {"verify_nccl", "smoke_train"}  # launched with torchrun


@dataclass
class Options:
    python: str | None = None  # an interpreter; None: the profile's environment
    current: bool = False  # use the interpreter running nox (an adopted environment)
    profile: str | None = None
    nproc: int | None = None
    run_dir: Path | None = None
    passthrough: list[str] = field(default_factory=list)


def parse(args: list[str]) -> Options:
    """Our options first; everything after them (or after `--`) goes to the program."""
    o = Options()
    it = iter(args)
    for a in it:
        if a == "--":
            o.passthrough += list(it)
        elif a == "--current":
            o.current = True
        elif a in ("--python", "--profile", "--nproc", "--run-dir"):
            value = next(it, None)
            if value is None:
                raise UserError(f"{a} needs a value", fix=f"e.g. {a} VALUE", kind="input.value")
            if a == "--nproc":
                if not value.isdigit() or int(value) < 1:
                    raise UserError(f"--nproc {value}: expected a positive number",
                                    kind="input.value")
                o.nproc = int(value)
            elif a == "--run-dir":
                o.run_dir = Path(value)
            else:
                setattr(o, a[2:], value)
        else:
            o.passthrough.append(a)
    return o


def interpreter(o: Options) -> str:
    """--python (made absolute), --current, else the profile's environment's interpreter,
    built or adopted (env.interpreter)."""
    if o.python:
        return os.path.abspath(o.python)
    if o.current:
        return sys.executable
    from megatron_env import profile
    from megatron_env.pyenv import env

    prof = profile.load(o.profile)
    py = env.interpreter(env.default_prefix(prof))
    if not py.exists():
        raise UserError(
            f"no environment for profile {prof.name} at {py}",
            fix="run `invoke setup` first, or pass --current to use this interpreter "
                "(an NGC container, an adopted environment), or --python PATH",
            kind="env.missing",
        )
    return str(py)


def gpu_count(python: str) -> int:
    r = proc.run([python, "-c", "import torch; print(torch.cuda.device_count())"], timeout=120)
    if r.missing or not r.ok:
        raise UserError(f"{python} cannot import torch: {r.tail(3)}",
                        fix="build the environment with `invoke setup`, or pass --python",
                        kind="torch.import-failed")
    return int(r.stdout.strip().splitlines()[-1])


def command(name: str, o: Options, python: str, run_dir: Path) -> list[str]:
    script = REPO_ROOT / "scripts" / SCRIPTS[name]
    extra = list(o.passthrough)
    if "--out" not in extra:
        extra += ["--out", str(run_dir)]
    if name not in DISTRIBUTED:
        return [python, str(script), *extra]
    nproc = o.nproc or max(gpu_count(python), 1)
    return [python, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", str(script),
            *extra]


def run(name: str, args: list[str]) -> int:
    o = parse(args)
    python = interpreter(o)
    run_dir = o.run_dir or (project.state_root() / "runs"
                            / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}")
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = command(name, o, python, run_dir)
    (run_dir / "command.txt").write_text(shlex.join(argv) + "\n")
    output.status(f"{name}: {shlex.join(argv)}")
    env = dict(os.environ)
    result = proc.run(argv, env=env, timeout=None, log=run_dir / f"{name}.log", stream=True)
    verdict = "passed" if result.ok else "failed"
    output.summary(f"{name}: {verdict}; results in {run_dir}", verdict)
    return result.returncode
