"""A wheel compiled from a patched source tree (uv build, no isolation, progress from ninja's
lines), and what it holds: its compiled libraries, the ninja logs of where the time went."""

from __future__ import annotations

import base64
import hashlib
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

from megatron_env import digest, files, output, proc
from megatron_env.errors import UserError
from megatron_env.kernels import ninjalog
from megatron_env.kernels.progress import Progress
from megatron_env.pyenv import uv


def cached(slot: Path) -> Path | None:
    """The wheel of a cache slot when it is intact (`intact`); a slot whose wheel is not is
    discarded with a warning (the caller builds it again), an empty one is None."""
    wheels = sorted(slot.glob("*.whl"))
    if not wheels:
        return None
    meta, _why = files.read_json(slot / "meta.json")
    want = meta.get("wheel_sha256") if isinstance(meta, dict) else None
    if len(wheels) == 1 and intact(wheels[0], want):
        return wheels[0]
    output.warning(f"the cached build {slot} is not the wheel that was built there "
                   "(changed or cut short); building it again")
    files.discard(slot)
    return None


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
    uv.raise_for_cache(r)
    if not r.ok or not wheels:
        raise UserError(f"building {name} failed after {time.monotonic() - t0:.0f} s:"
                        f"\n{r.tail(15)}", fix=f"full log: {log}", kind="build.failed")
    return time.monotonic() - t0, wheels[0]


def intact(wheel: Path, sha256: object) -> bool:
    """Whether a cached wheel is the one that was built: its sha256 as its slot's meta.json
    recorded it; a slot from before that record is held to the wheel's own RECORD (every member
    there with its hash, the archive's CRCs whole). A truncated or edited wheel is neither."""
    if isinstance(sha256, str):
        return digest.file_hex(wheel) == sha256
    try:
        with zipfile.ZipFile(wheel) as z:
            if z.testzip() is not None:
                return False
            record = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
            if record is None:
                return False
            for line in z.read(record).decode().splitlines():
                name, _, rest = line.partition(",")
                algo_hash = rest.partition(",")[0]
                if not algo_hash:
                    continue  # RECORD itself
                algo, _, want = algo_hash.partition("=")
                got = base64.urlsafe_b64encode(hashlib.new(algo, z.read(name)).digest())
                if got.rstrip(b"=").decode() != want:
                    return False
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError):
        return False
    return True
