"""A wheel compiled from a patched source tree (uv build, no isolation, progress from ninja's
lines), and what it holds: its compiled libraries, the ninja logs of where the time went."""

from __future__ import annotations

import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

from megatron_env import output, proc
from megatron_env.errors import UserError
from megatron_env.kernels import ninjalog
from megatron_env.kernels.progress import Progress
from megatron_env.pyenv import uv


def missing_libraries(wheel: Path, libraries: tuple[str, ...]) -> list[str]:
    """The libraries (a/b) without a shared object in the wheel (a/b.<abi tag>.so, a/b.so)."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    return [lib for lib in libraries
            if not any(n.startswith(lib + ".") and n.endswith(".so") for n in names)]


def keep_ninja_logs(work: Path, dest: Path) -> dict[str, Any]:
    """Copy each extension's .ninja_log (per object: start, end) out of the build tree before
    it is removed, and summarise them (slowest objects, parallelism): where the time went."""
    found = sorted(work.rglob(".ninja_log"))
    kept = []
    for i, f in enumerate(found):
        dest.mkdir(parents=True, exist_ok=True)
        kept.append(dest / f"{i:02d}-{f.parent.name}.ninja_log")
        shutil.copy(f, kept[-1])
    try:
        return ninjalog.summary(ninjalog.read(kept))
    except ninjalog.NinjaLogError as e:  # a ninja this module does not read: keep the files
        return {"error": str(e)}


def dist_dir(work: Path) -> Path:
    return work.parent / f"{work.name}-dist"


def compile_wheel(name: str, python: Path, env: dict[str, str], build_options: tuple[str, ...],
                  work: Path, log: Path, echo: output.Echo) -> tuple[float, Path]:
    """uv builds the wheel of `work` with `python`'s packages (no isolation: the build imports
    torch); -> (seconds, the wheel). A failure names the log, which keeps the compiler's words."""
    out = dist_dir(work)
    shutil.rmtree(out, ignore_errors=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    echo(f"{name}: building a wheel (log: {log})")
    last = [0.0]
    counts = Progress()

    def progress(line: str) -> None:
        if counts.feed(line) and time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            echo(counts.line(name, time.monotonic() - t0))

    # switches a setup.py reads from sys.argv only: setuptools appends them to bdist_wheel's
    options = (["--config-setting=--build-option=" + " ".join(build_options)]
               if build_options else [])
    r = proc.run([uv.exe(), "build", "--wheel", "--no-build-isolation", "--python", python,
                  *options, "--out-dir", out, work], env={**env, "UV_PYTHON_DOWNLOADS": "never"},
                 timeout=None, log=log, stream=True, on_line=progress)
    wheels = list(out.glob("*.whl"))
    if not r.ok or not wheels:
        raise UserError(f"building {name} failed after {time.monotonic() - t0:.0f} s:"
                        f"\n{r.tail(15)}", fix=f"full log: {log}", kind="build.failed")
    return time.monotonic() - t0, wheels[0]
