"""One pool of compile jobs for every kernel a setup builds: a GNU make jobserver on a FIFO.

Why a jobserver: kernel packages build through different drivers (torch's cpp_extension runs
one ninja per extension, some packages run CMake with ninja first, some build several
extensions at once), and each driver would otherwise take its own -j. ninja >= 1.13 and GNU
make are jobserver clients, and so is nvcc 13 with `--jobserver` (its `--threads` per-arch
processes take tokens): they all draw from the same pool, so N compilers run at most, whoever
started them, and a kernel whose objects are done leaves its share to the others.

Why a FIFO (`--jobserver-auth=fifo:PATH`, make 4.4's style): the pool reaches a compiler through
pip/uv, setuptools and CMake, which close inherited file descriptors; a path in MAKEFLAGS survives
them all.

The rule of the protocol: every client holds one implicit slot without a token. A build
driver counts as `clients` (the number of ninja processes it runs at once); the pool holds
`slots - clients of every running build` tokens, and a build that ends hands its implicit
slots back as tokens. Drivers that pass `-j N` would leave the pool (ninja ignores the
jobserver when -j is given: measured with ninja 1.13.0): a `ninja` shim first on PATH drops
-j before the real ninja runs.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from megatron_env import proc
from megatron_env.errors import UserError

GIB = 2**30
MIN_NINJA = (1, 13)


@dataclass(frozen=True)
class Size:
    slots: int  # compile jobs at once, over all the kernels
    why: str


def size(cores: int, avail: int, source: str, gib_per_job: float,
         cap: int | None = None) -> Size:
    """The pool's width: cores, and memory over the largest per-job memory of the kernels that
    build together (tokens are all alike, so each is sized for the hungriest compiler);
    `cap` (--jobs or MAX_JOBS) bounds it from above."""
    by_mem = max(1, int(avail / GIB / gib_per_job))
    slots = max(1, min(cores, by_mem))
    why = f"{cores} cores, {avail / GIB:.0f} GiB {source} / {gib_per_job:g} GiB a job = {by_mem}"
    if cap is not None:
        slots = min(slots, cap)
        why += f", capped at {cap}"
    return Size(slots, why)


def driver_env(recipe_says: Mapping[str, str]) -> dict[str, str]:
    """What a build driver is told so that it passes ninja no -j (ninja then joins the pool).

    MAX_JOBS not a number: torch's cpp_extension passes `-j MAX_JOBS` only for digits, and a
    setup.py that fills in an unset MAX_JOBS sees it set. Not the shim alone: `uv build` puts
    the environment's bin/ (its real ninja) before the shim on PATH (an H200 run: CMake ran
    `.venv/bin/ninja -j 16`, 43 compilers in a pool of 16). `recipe_says`: what else the
    recipe's driver reads (Recipe.pool_env)."""
    return {"MAX_JOBS": "jobserver", **recipe_says}


def ninja_version(ninja: str) -> tuple[int, ...]:
    r = proc.run([ninja, "--version"], timeout=30)
    try:
        return tuple(int(x) for x in r.stdout.strip().split(".")[:2])
    except ValueError:
        return ()


class Pool:
    """A FIFO jobserver holding `slots - clients` tokens. `add(n)` gives tokens (a build that
    ended: its implicit slots). `close()` removes the FIFO."""

    def __init__(self, where: Path, slots: int, clients: int) -> None:
        self.slots = slots
        self.path = where / "jobserver.fifo"
        where.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        os.mkfifo(self.path, 0o600)
        # read-write: the pool's own end keeps the FIFO open, so a reader never sees EOF
        self._fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        self._lock = threading.Lock()
        self.add(max(0, slots - clients))

    def add(self, tokens: int) -> None:
        with self._lock:
            if tokens > 0:
                os.write(self._fd, b"+" * tokens)

    def env(self) -> dict[str, str]:
        """What a build's environment gets: make's and ninja's MAKEFLAGS."""
        return {"MAKEFLAGS": f"-j{self.slots} --jobserver-auth=fifo:{self.path}"}

    def close(self) -> None:
        os.close(self._fd)
        self.path.unlink(missing_ok=True)


SHIM = """#!/bin/sh
# ninja without -j: the jobserver in MAKEFLAGS decides how many jobs run (written by megatron-env)
n=$#
while [ "$n" -gt 0 ]; do
  a=$1; shift; n=$((n - 1))
  case $a in
    -j) shift; n=$((n - 1)) ;;
    -j*) ;;
    *) set -- "$@" "$a" ;;
  esac
done
exec {real} "$@"
"""


def shim(where: Path, path: str) -> Path:
    """A directory holding the `ninja` shim (to put first on PATH), for the first ninja on
    `path` that is a jobserver client (>= 1.13; an older one earlier on `path` is passed by)."""
    found = [w for d in path.split(os.pathsep) if d and (w := proc.which("ninja", path=d))]
    real = next((w for w in found if ninja_version(w) >= MIN_NINJA), found[0] if found else None)
    if not real or ninja_version(real) < MIN_NINJA:
        raise UserError(f"the kernels build from one pool of jobs, which needs ninja >= 1.13 "
                        f"(a jobserver client); found {real or 'no ninja'}"
                        + (f" {'.'.join(map(str, ninja_version(real)))}" if real else ""),
                        fix="pip install 'ninja>=1.13' into the environment the kernels "
                            "build for (or put one first on PATH) to share one pool",
                        kind="build.old-ninja")
    d = where / "bin"
    d.mkdir(parents=True, exist_ok=True)
    f = d / "ninja"
    f.write_text(SHIM.replace("{real}", _quote(real)))
    f.chmod(f.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return d


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"
