"""The shared pool of compile jobs as the builds see it: its width, what one kernel's build is
given (`Pool`, typed: together -> build) and how a build driver's ninja is made to run wide.

Every compiler of every kernel waits for a slot of the pool (kernels.slots), so ninja's own -j
only decides how many of its ready objects the pool can choose among: as many as it can show
(together.width). Drivers pass their own -j (torch's cpp_extension `-j MAX_JOBS` for digits,
CMake what it was told): MAX_JOBS is the width, and a `ninja` shim first on PATH replaces any -j
it is given by the width before the real ninja runs. (Not a make jobserver any more: its tokens
go to whoever reads the FIFO first, and ninja 1.13 reads it only when one of its own jobs ends;
the longest objects waited behind the short ones.)
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from megatron_env import proc
from megatron_env.errors import UserError
from megatron_env.kernels.slots import sh_quote
from megatron_env.units import GIB


@dataclass(frozen=True)
class Pool:
    """The pool as one kernel's build is given it (kernels.together to kernels.build): what its
    environment gets, and the numbers its plan says and its driver is told."""

    env: Mapping[str, str]  # the broker's socket and kernel, PATH (wrappers, shim), CC/CXX,
    # the stop marker, MEGATRON_ENV_SLOT_CLIENT
    slots: int  # compile jobs at once, over all the kernels
    width: int  # objects one ninja shows at once (together.width)
    why: str
    clients: int  # extensions a package that builds several at once runs (Recipe.parallel_var)
    client: str  # the slot client: PYTORCH_NVCC and CMake's launchers run through it


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


def driver_env(recipe_says: Mapping[str, str], width: int) -> dict[str, str]:
    """What a build driver is told so that its ninja shows `width` objects at once: MAX_JOBS
    (torch's cpp_extension passes it as -j) and what else the recipe's driver reads
    (Recipe.pool_env)."""
    return {"MAX_JOBS": str(width), **recipe_says}


SHIM = """#!/bin/sh
# ninja at the pool's width: its jobs wait for a slot of the pool (written by megatron-env)
n=$#
while [ "$n" -gt 0 ]; do
  a=$1; shift; n=$((n - 1))
  case $a in
    -j) shift; n=$((n - 1)) ;;
    -j*) ;;
    *) set -- "$@" "$a" ;;
  esac
done
exec {real} -j{width} "$@"
"""


def shim(where: Path, path: str, width: int) -> Path:
    """A directory holding the `ninja` shim (to put first on PATH) for the first ninja on
    `path`, every -j it is given replaced by `width`."""
    real = next((w for d in path.split(os.pathsep) if d and (w := proc.which("ninja", path=d))),
                None)
    if not real:
        raise UserError("the kernels build from one pool of compile jobs, which needs ninja; "
                        "found none", fix="pip install ninja where the build runs (the kernels "
                                          "then build one after another)",
                        kind="build.no-ninja")
    d = where / "bin"
    d.mkdir(parents=True, exist_ok=True)
    f = d / "ninja"
    f.write_text(SHIM.replace("{real}", sh_quote(real)).replace("{width}", str(width)))
    f.chmod(f.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return d
