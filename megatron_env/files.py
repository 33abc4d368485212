"""Files the tool publishes, and the filesystems they land on.

A cache may be shared by every node of a cluster and written by many of them at once, so
everything the tool writes into a cache, a bundle or an environment is published one way:
written under `<name>.tmp-<host>-<pid>-<random>` beside its place, synced (the file, or every
file of a tree, then the directory), and renamed into place. A reader sees the old thing or the
new one, never half of one. A temporary is removed by a later run only when it is provably
dead: made on this host by a process that is gone, or older than STALE_HOURS (another node's
process cannot be asked; no write takes that long). One alive-check serves every such decision.

A full filesystem is said the same way wherever it happens: a write that fails for space (a
bundle's archive, a mirror's fetch, an unpack, a build) would otherwise surface as whatever the
failing layer makes of it (git's "protocol error", a raw list from shutil). Every place that
knows a path turns it into one `UserError(kind="disk.full")` naming the filesystem (its mount
point), what is free there and, where known, what is needed.

A state file the tool wrote (a stamp, a manifest, a build's meta.json) is read with
`read_json`: whatever it holds (truncated, garbage, nested past any depth, a directory in its
place) it is either a JSON value or absent with the reason, never an exception.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from megatron_env import digest
from megatron_env.errors import UserError

STALE_HOURS = 24.0  # a temporary older than this is dead whichever host made it
_TMP = re.compile(r"\.tmp-(?:(?P<host>[A-Za-z0-9._]+)-)?(?P<pid>\d+)(?:-[0-9a-f]{8})?(?:-old)?$")
_host: list[str] = []  # set once by a front door (set_host); else the system's name


def set_host(name: str) -> None:
    """Name this node in temporaries (a front door's choice; tests pose as two hosts)."""
    _host[:] = [re.sub(r"[^A-Za-z0-9.]", "_", name) or "host"]


def host() -> str:
    """This node's name as temporaries carry it (no dashes: they separate the fields)."""
    return _host[0] if _host else re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (one we may not signal exists too)."""
    if pid <= 0:
        return True  # not a process we can ask about: never called dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temp_for(dest: Path) -> Path:
    """A name beside `dest` no other run (this host or another) can hold."""
    return dest.with_name(f"{dest.name}.tmp-{host()}-{os.getpid()}-{secrets.token_hex(4)}")


def dead(path: Path, now: float | None = None) -> bool:
    """A temporary no living run owns: this host's with its process gone, or any older than
    STALE_HOURS. A name without a host (older versions) is dead only by age: it may be
    another node's."""
    m = _TMP.search(path.name)
    if not m:
        return False
    try:
        age = (now or time.time()) - path.lstat().st_mtime
    except FileNotFoundError:
        return False
    if age > STALE_HOURS * 3600:
        return True
    return m.group("host") == host() and not alive(int(m.group("pid")))


def remove(path: Path) -> None:
    """A file, link or tree gone (nothing when it is already)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            path.unlink()


def sweep(parent: Path, name: str = "") -> list[Path]:
    """Remove the dead temporaries of `name` (of every name when empty) in `parent`; -> them."""
    gone = []
    for p in parent.glob(f"{name}*.tmp-*" if name else "*.tmp-*"):
        if (not name or p.name.startswith(f"{name}.tmp-")) and dead(p):
            remove(p)
            gone.append(p)
    return gone


def discard(path: Path) -> None:
    """A published path taken out of use: renamed aside first (no run can mistake a half-removed
    tree for a published one), then removed."""
    aside = temp_for(path).with_name(temp_for(path).name + "-old")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    remove(aside)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir()
                 else os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # a filesystem that cannot sync a directory says EINVAL
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def sync(path: Path) -> None:
    """`path` on disk: a file, or every file and directory of a tree (links are names only)."""
    if path.is_symlink():
        return
    if path.is_dir():
        for root, _dirs, names in os.walk(path):
            for n in names:
                if not os.path.islink(os.path.join(root, n)):
                    _fsync(Path(root, n))
            _fsync(Path(root))
    else:
        _fsync(path)


def no_space(e: BaseException) -> bool:
    """An error that means a full filesystem: ENOSPC/EDQUOT, or shutil's list of them."""
    if isinstance(e, shutil.Error):
        rows = e.args[0] if e.args and isinstance(e.args[0], list) else []
        return any(NO_SPACE in str(r) or os.strerror(errno.EDQUOT) in str(r) for r in rows)
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def publishing(dest: Path, *, tree: bool = False,
               lost: Callable[[], object] = lambda: None) -> Iterator[Path]:
    """Yield a private temporary beside `dest` (an empty directory with `tree`) for the caller to
    fill; when the block ends without error it is synced and renamed to `dest`, else removed.
    A file replaces what is at `dest` (a directory standing in its place is discarded first); a
    tree never replaces one: when `dest` exists (another run published it first) ours is
    dropped (`lost` is called), so a caller that found `dest` bad discards it before. A full
    disk is `full`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_for(dest)
    try:
        if tree:
            tmp.mkdir()
        yield tmp
        sync(tmp)
        if tree:
            try:
                os.rename(tmp, dest)
            except OSError:
                if not dest.exists():
                    raise
                lost()  # ENOTEMPTY/EEXIST: another run published it first, whole
        else:
            if dest.is_dir() and not dest.is_symlink():
                discard(dest)
            os.replace(tmp, dest)
        _fsync(dest.parent)
    except (OSError, shutil.Error) as e:
        if no_space(e):
            raise full(dest.parent, what=dest.name) from None
        raise
    finally:
        remove(tmp)


@contextlib.contextmanager
def scratch(beside: Path) -> Iterator[Path]:
    """A private working directory beside `beside` (on its filesystem, named as a temporary
    so that `sweep` can remove it after a kill), removed at the end. A full disk is `full`."""
    beside.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_for(beside)
    tmp.mkdir()
    try:
        yield tmp
    except (OSError, shutil.Error) as e:
        if no_space(e):
            raise full(beside.parent, what=beside.name) from None
        raise
    finally:
        remove(tmp)


def write_bytes(dest: Path, data: bytes) -> Path:
    """`data` published at `dest` whole (see `publishing`)."""
    with publishing(dest) as tmp:
        tmp.write_bytes(data)
    return dest


def write_text(dest: Path, text: str) -> Path:
    return write_bytes(dest, text.encode())


def seal(tree: Path, marker: str, what: str) -> None:
    """Mark `tree` complete with the digest of its content (`unsealed` checks it at each use);
    `what` names the pinned input it was made from."""
    (tree / marker).write_text(json.dumps({"of": what, "tree": digest.of_tree(tree, {marker})})
                               + "\n")


def unsealed(tree: Path, marker: str) -> str | None:
    """None when `tree` is as it was sealed. Else it is discarded and the reason returned: ""
    when it was absent or unmarked (cut short, or from an older version), "changed since it was
    made" when a file was edited, added, removed or made executable."""
    doc, _why = read_json(tree / marker)
    if not isinstance(doc, dict) or not isinstance(doc.get("tree"), str):
        discard(tree)
        return ""
    if digest.of_tree(tree, {marker}) == doc["tree"]:
        return None
    discard(tree)
    return "changed since it was made"


#: the largest state file (stamp, manifest, meta.json) read: the tool writes a few KiB
STATE_MAX_BYTES = 64 * 1024 * 1024


def read_text(path: Path, fix: str = "restore it as UTF-8 text (from git, or the command "
                                        "that wrote it)") -> str:
    """The UTF-8 text of an input file (a lock, a profile's files): bytes that are not UTF-8
    are the user's file, said as one UserError naming it and where the bad byte is, never a
    UnicodeDecodeError from deep in a parser."""
    raw = path.read_bytes()
    try:  # newlines as Path.read_text reads them
        return raw.decode().replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path} is not UTF-8 text (line {line}, byte {e.start}: "
                        f"{raw[e.start:e.start + 1]!r})", fix=fix, kind="input.encoding") from None


def read_json(path: Path) -> tuple[Any, str]:
    """(the JSON value in `path`, "") or (None, why it is absent or unusable): a missing file,
    a directory in its place, unreadable bytes, text that is not JSON or nests too deep."""
    try:
        # a FIFO or a device in its place would block or never end: only a regular file is read,
        # opened without blocking and bounded
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, f"{path} is not a regular file"
            if st.st_size > STATE_MAX_BYTES:
                return None, f"{path} is larger than any file the tool writes ({st.st_size} bytes)"
            with os.fdopen(fd, "rb", closefd=False) as f:
                raw = f.read(STATE_MAX_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None, f"no {path.name}"
    except OSError as e:
        return None, f"{path} cannot be read ({e.strerror or e})"
    try:
        return json.loads(raw.decode()), ""
    except UnicodeDecodeError:
        return None, f"{path} is not text"
    except RecursionError:
        return None, f"{path} nests deeper than any file the tool writes"
    except ValueError as e:
        return None, f"{path} is not JSON ({e})"


def size_of(path: Path, seconds: float = 0.0) -> tuple[int, bool]:
    """(bytes under `path`, whether all were counted): links counted as links (never
    followed), unreadable parts skipped; with `seconds`, the walk stops after that long (a
    large cache on a slow filesystem, counted while the user waits) and says so."""
    try:
        st = path.lstat()
    except OSError:
        return 0, True
    if not path.is_dir() or path.is_symlink():
        return st.st_size, True
    total, end = 0, time.monotonic() + seconds
    for root, dirs, names in os.walk(path, onerror=lambda e: None):
        for n in dirs + names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, n)).st_size
        if seconds and time.monotonic() > end:
            return total, False
    return total, True


# --- full filesystems -------------------------------------------------------------------------


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


def _size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:,.1f} GiB"
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def full(path: str | os.PathLike[str], needed: int | None = None, what: str = "",
         fix: str = "") -> UserError:
    """The error for a filesystem without room for `what` (`needed` bytes, when known), said
    the same way by every writer: `no space on <mount> for <what>: N needed, M free`."""
    mount = mount_of(path)
    free = free_bytes(mount)
    need = f"{_size(needed)} needed, " if needed else ""
    return UserError(f"no space on {mount} for {what or path}: {need}{_size(free)} free",
                     fix=fix or f"free space on {mount} or write elsewhere (--out, --cache-dir, "
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
    return UserError(f"no space on {where}",
                     fix="free space there or write elsewhere (--out, --cache-dir, --prefix)",
                     kind="disk.full")


def said_full(output: str) -> bool:
    """Whether a child process's output says a write failed for space (its strerror text), the
    words compared across line breaks: uv wraps its causes to the terminal's width, and a long
    path put the break inside "No space / left on device" (CI, 2026-12-06)."""
    return NO_SPACE in " ".join(output.split())


def child_full(output: str, where: str | os.PathLike[str], what: str) -> None:
    """A child process that failed writing under `where` for space (its output says so) is a
    full filesystem, said as `full`, not as whatever the child's failure would otherwise read
    as (an unreachable index, a failed fetch)."""
    if said_full(output):
        raise full(where, what=what)
