"""Patch series: `patches/<package>/<pin>/NNNN-what-it-fixes.patch`, applied in order.

Every patch starts with a header saying what it fixes and why (text before the first `diff`).
A series is applied to a fresh copy of the pristine source and checked patch by patch before
the copy is used: a patch that does not apply fails naming the patch, the file and the hunk, and
the caller's source is never left half-patched.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from megatron_env import proc, project
from megatron_env.errors import UserError


def root() -> Path:
    """The project's patches/ (read when asked, never at import: see megatron_env.project)."""
    return project.root() / "patches"


def __getattr__(name: str) -> Path:
    """`PATCHES_DIR`, as before: the same directory as `root()`, computed when read."""
    if name == "PATCHES_DIR":
        return root()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def series(package: str, pin: str, patches_root: Path | None = None) -> list[Path]:
    d = (patches_root or root()) / package / pin
    return sorted(d.glob("[0-9][0-9][0-9][0-9]-*.patch")) if d.is_dir() else []


def header(patch: Path) -> str:
    text = patch.read_text()
    return text.split("\ndiff --git", 1)[0].strip() if "diff --git" in text else ""


def _show(path: Path) -> str:
    top = project.root()
    return str(path.relative_to(top)) if path.is_relative_to(top) else str(path)


def _where(output: str) -> str:
    """'error: patch failed: a/b.py:42' -> 'b.py, hunk at line 42'."""
    m = re.search(r"patch failed: (\S+):(\d+)", output)
    if m:
        return f"{m.group(1)}, hunk at line {m.group(2)}"
    m = re.search(r"error: (\S+): (No such file or directory|does not exist in index)", output)
    return f"{m.group(1)} (file missing)" if m else output.strip().splitlines()[-1][:200]


def apply_series(source: Path, dest: Path, patches: list[Path]) -> None:
    """Copy `source` to `dest` and apply `patches` there; on failure `dest` does not exist."""
    for p in patches:
        if not header(p):
            raise UserError(f"{_show(p)} has no header saying what it fixes",
                            fix="start the patch with a few lines of why, before `diff --git`",
                            kind="patch.header")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    # Inside another git work tree (this checkout's .megatron-env/), `git apply` would patch
    # paths relative to that repository and silently skip ours: stop git looking upwards.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(dest.parent)}
    env.pop("GIT_DIR", None)
    try:
        for p in patches:
            check = proc.run(["git", "apply", "--check", "-v", "--", p], cwd=dest, timeout=120,
                             env=env)
            if check.missing:
                raise UserError("git is not installed", fix="install git", kind="tool.no-git")
            if not check.ok:
                raise UserError(
                    f"patch {_show(p)} does not apply: {_where(check.output)}",
                    fix="refresh the patch against the pinned source (nothing was modified)",
                    kind="patch.apply")
            done = proc.run(["git", "apply", "-v", "--", p], cwd=dest, timeout=120, env=env)
            if not done.ok or "Skipped patch" in done.output:
                raise UserError(f"patch {p.name} failed: {_where(done.output)}", kind="patch.apply")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
