"""A full filesystem, said the same way wherever it happens.

A write that fails for space (a bundle's archive, a mirror's fetch, an unpack, a build) would
otherwise surface as whatever the failing layer makes of it: git's "protocol error" read as an
unreachable mirror, a bare OSError naming a temporary file. Every place that knows a path turns
it into one `UserError(kind="disk.full")` that names the filesystem (its mount point), what is
free there and, where known, what is needed.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from megatron_env.errors import UserError

NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device": what a child prints


def mount_of(path: str | os.PathLike[str]) -> Path:
    """The mount point holding `path` (or where it would be created)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: str | os.PathLike[str]) -> int:
    return shutil.disk_usage(mount_of(path)).free


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def full(path: str | os.PathLike[str], needed: int | None = None, what: str = "") -> UserError:
    """The error for a filesystem without room for `what` (`needed` bytes, when known)."""
    mount = mount_of(path)
    free = free_bytes(mount)
    need = f"needs {_mib(needed)}, " if needed else ""
    return UserError(f"no space left on {mount} for {what or path} ({need}{_mib(free)} free)",
                     fix=f"free space on {mount} or write elsewhere (--out, --cache-dir, "
                         "--prefix)", kind="disk.full")


def ensure(path: str | os.PathLike[str], needed: int, what: str) -> None:
    """Refuse before writing `needed` bytes under `path` when its filesystem has less free."""
    if free_bytes(path) < needed:
        raise full(path, needed, what)


def full_mounts(limit: int = 2**20) -> list[Path]:
    """The writable filesystems with less than `limit` bytes free: where a write that failed
    for space without naming its file (a `write()` has no path) most likely went."""
    out: list[Path] = []
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) < 4 or "ro" in fields[3].split(","):
            continue
        mount = Path(fields[1].replace("\\040", " "))
        try:
            st = os.statvfs(mount)
        except OSError:
            continue
        if st.f_blocks and st.f_bavail * st.f_frsize < limit and mount not in out:
            out.append(mount)
    return out


def full_anywhere() -> UserError:
    """The error for a failed write whose path is unknown: the nearly full filesystems named."""
    mounts = full_mounts()
    where = ", ".join(map(str, mounts)) or "a filesystem this command writes to"
    return UserError(f"no space left on {where}",
                     fix="free space there or write elsewhere (--out, --cache-dir, --prefix)",
                     kind="disk.full")


def said_full(output: str) -> bool:
    """Whether a child process's output says a write failed for space (its strerror text)."""
    return NO_SPACE in output
