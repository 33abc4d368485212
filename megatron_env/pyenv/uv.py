"""Running uv: where its executable is, and the environment every call gets.

uv never downloads an interpreter here (UV_PYTHON_DOWNLOADS=never): an environment is made from
a Python that is already on the machine, or not at all.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from megatron_env import proc
from megatron_env.errors import UserError

# uv's own words when it cannot write a file (uv 0.13: `cause: Read-only file system (os error
# 30) at path "..."`): the path says whether it was the cache
_CANNOT_WRITE = re.compile(r"(Read-only file system|Permission denied) \(os error \d+\) at path "
                           r"\"([^\"]+)\"")


def exe() -> str:
    """uv on PATH, else the one the `uv` Python package ships."""
    found = proc.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        raise UserError("uv is not installed", fix="python3 -m pip install uv",
                        kind="tool.no-uv") from None


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "UV_PYTHON_DOWNLOADS": "never", **extra}


def cache_dir() -> Path | None:
    """uv's cache directory: UV_CACHE_DIR, else what `uv cache dir` says (None: unknown)."""
    if os.environ.get("UV_CACHE_DIR"):
        return Path(os.environ["UV_CACHE_DIR"]).absolute()
    try:
        r = proc.run([exe(), "cache", "dir"], env=env(), timeout=30)
    except UserError:
        return None
    return Path(r.stdout.strip()) if r.ok and r.stdout.strip() else None


def cache_problem(output: str) -> UserError | None:
    """The error for a uv run that failed because its cache cannot be written (a read-only
    mount, a cache shared from another user): uv writes to its cache even to read from it, so
    the fix is another cache, never the index or the interpreter a failed install suggests."""
    m = _CANNOT_WRITE.search(output)
    cache = cache_dir() if m else None
    if not m or cache is None or not Path(m.group(2)).is_relative_to(cache):
        return None
    return UserError(f"uv's cache {cache} cannot be written ({m.group(1).lower()}); uv writes "
                     "to its cache even to read from it",
                     fix="set UV_CACHE_DIR to a writable directory (a shared read-only cache "
                         "cannot be used as it is; UV_NO_CACHE=1 works without one)",
                     kind="uv.cache-read-only")


def raise_for_cache(r: proc.Result) -> None:
    """After a uv run that failed: raise `cache_problem`'s error when its cache was the cause
    (one line at each call site, before the call site's own error)."""
    if not r.ok and (e := cache_problem(r.output)):
        raise e
