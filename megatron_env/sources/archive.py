"""Tar members judged before anything is written: what an archive from elsewhere may hold.

`tarfile`'s filter="data" does this job from Python 3.10.12 on; `requires-python >= 3.10`
admits 3.10.0-3.10.11, where the argument raises TypeError. So every member is checked here
first (absolute paths, `..`, links, devices and fifos are named and refused), and the filter is
used on top where it exists.
"""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath

HAS_FILTER = hasattr(tarfile, "data_filter")


def problem(m: tarfile.TarInfo, links: bool = False) -> str | None:
    """Why the member may not be written (None: a plain file or directory under the target).
    `links`: symbolic links whose target stays inside are allowed (an sdist may have some)."""
    name = m.name
    if name.startswith(("/", "\\")) or PurePosixPath(name).is_absolute() or (
            len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "a path with `..`"
    if m.issym() and links:
        target = PurePosixPath(m.linkname)
        if target.is_absolute() or _escapes(PurePosixPath(name).parent / target):
            return f"a link pointing outside ({m.linkname})"
        return None
    if m.issym() or m.islnk():
        return f"a link (to {m.linkname})"
    if not (m.isfile() or m.isdir()):
        return "a device, fifo or other special file"
    return None


def _escapes(path: PurePosixPath) -> bool:
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else 0 if part in ("", ".") else 1
        if depth < 0:
            return True
    return False


def extract(tar: tarfile.TarFile, dest: Path, what: str) -> None:
    """Every member checked, then extracted (with filter="data" where Python has it).
    Raises ValueError naming the first bad member of `what`."""
    members = tar.getmembers()
    for m in members:
        if why := problem(m, links=True):
            raise ValueError(f"{what}: member {m.name} is {why}")
    if HAS_FILTER:
        tar.extractall(dest, members, filter="data")
    else:  # pragma: no cover - Python 3.10.0-3.10.11: the checks above are the filter
        tar.extractall(dest, members)
