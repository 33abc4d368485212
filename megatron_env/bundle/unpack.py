"""A bundle archive into the cache: each member checked against its manifest, written into a
private directory, verified there, and published by one rename.

Many processes on many nodes may unpack one bundle into one shared cache at once (the first step
of a job on every node). A file lock lets one of them work while the others wait and then reuse
its result; the lock is a courtesy, not the guarantee, since NFS and Lustre may not honour it
across nodes. The guarantee is the rename: every run unpacks into its own
`<key>.tmp-<host>-<pid>`, only a directory that matched its manifest is renamed to `<key>`
(atomic on those filesystems too), and a run that finds `<key>` already there discards its copy
and uses it. So a published entry is only ever a verified one, and a tampered copy never takes
the key of the good bundle it claims to be.

What killed runs leave is removed by later runs: on this host once its process is gone, from
any host after files.STALE_HOURS (another node's process cannot be asked).
"""

from __future__ import annotations

import contextlib
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from megatron_env import digest, files, mutex, output
from megatron_env.bundle.layout import MANIFEST, truncated_error
from megatron_env.bundle.manifest import Manifest
from megatron_env.errors import UserError
from megatron_env.sources import archive

STALE_HOURS = files.STALE_HOURS
stale = files.dead  # the temporaries of killed runs: megatron_env.files decides for every writer


def sweep(root: Path) -> list[Path]:
    """Remove the temporaries killed runs left under `root`; -> those removed."""
    return files.sweep(root)


@contextlib.contextmanager
def _courtesy_lock(path: Path, echo: Callable[[str], object]) -> Iterator[None]:
    """The file lock when the filesystem has one; without it, the rename alone keeps it safe."""
    held = mutex.exclusive(path, f"bundle: another run is unpacking this bundle ({path}); "
                                 "waiting for it", echo)
    try:
        held.__enter__()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        held.__exit__(None, None, None)


def _name(m: tarfile.TarInfo) -> str:
    return PurePosixPath(m.name).as_posix().removeprefix("./")


def check_members(path: Path, tar: tarfile.TarFile, doc: Manifest) -> list[tarfile.TarInfo]:
    """Every member a plain file the manifest lists (or a directory), each once; else the
    bundle is refused by the member's name before anything is written."""
    seen: set[str] = set()

    def refuse(name: str, why: str) -> UserError:
        return UserError(f"{path}: member {name} is {why}; the bundle is refused, nothing was "
                         "unpacked", fix="use the bundle as `invoke bundle` wrote it (copy it "
                                         "again from where it was made)",
                         kind="bundle.unsafe-member")

    try:
        members = tar.getmembers()
    except (EOFError, tarfile.ReadError):
        raise truncated_error(path) from None
    for m in members:
        name = _name(m)
        if why := archive.problem(m):
            raise refuse(m.name, why)
        if m.isdir():
            continue
        if name != MANIFEST and name not in doc.files:
            raise refuse(name, f"not listed in its {MANIFEST}")
        if name in seen:
            raise refuse(name, "in the archive twice")
        seen.add(name)
    return members


def _write(tar: tarfile.TarFile, m: tarfile.TarInfo, target: Path) -> tuple[str, int]:
    """One member's bytes into `target`, hashed on the way; -> (sha256, size)."""
    src = tar.extractfile(m)
    if src is None:
        raise tarfile.ReadError(f"{m.name} has no data")
    target.parent.mkdir(parents=True, exist_ok=True)
    with src:
        return digest.copy_hashed(src, target)


def _extract(paths: list[Path], docs: dict[Path, Manifest], tmp: Path, dest: Path,
             echo: Callable[[str], object]) -> dict[str, tuple[str, int]]:
    """Base first, deltas over it, into `tmp`; -> name -> (sha256, size) of what was written."""
    sums: dict[str, tuple[str, int]] = {}
    for p in paths:
        echo(f"bundle: unpacking {p.name} into {dest}")
        try:
            with tarfile.open(p) as tar:
                for m in check_members(p, tar, docs[p]):
                    name = _name(m)
                    if m.isdir():
                        (tmp / name).mkdir(parents=True, exist_ok=True)
                    elif name != MANIFEST:
                        sums[name] = _write(tar, m, tmp / name)
        except (EOFError, tarfile.ReadError, tarfile.StreamError):
            raise truncated_error(p) from None
        except OSError as e:
            if files.no_space(e):
                raise files.full(tmp.parent, what=f"unpacking {p.name}") from None
            raise UserError(f"cannot unpack {p} into {tmp.parent}: {e.strerror or e}",
                            fix="free space there, or point MEGATRON_ENV_CACHE at a writable "
                                "directory with room", kind="bundle.unpack-failed") from None
    return sums


def mismatch(doc: Manifest, sums: dict[str, tuple[str, int]]) -> tuple[list[str], list[str]]:
    """(changed, missing) files of the manifest, given what each name holds."""
    changed, missing = [], []
    for rel, meta in doc.files.items():
        got = sums.get(rel)
        if got is None:
            missing.append(rel)
        elif got != (meta.sha256, meta.size):
            changed.append(rel)
    return changed, missing


def refusal(where: Path | str, changed: list[str], missing: list[str], done: str) -> UserError:
    parts = []
    if changed:
        parts.append(f"{len(changed)} changed: {', '.join(changed[:8])}")
    if missing:
        parts.append(f"{len(missing)} missing: {', '.join(missing[:8])}")
    return UserError(f"bundle {where} does not match its manifest ({'; '.join(parts)}); {done}",
                     fix="copy the bundle again from where it was made (a delta needs its base "
                         "unpacked first)", kind="bundle.changed")


discard = files.discard  # out of the way by a rename first, then removed


def unpack(paths: list[Path], docs: dict[Path, Manifest], top_raw: bytes, dest: Path,
           echo: Callable[[str], object] = output.status) -> bool:
    """The archives `paths` (base first) unpacked, verified and published at `dest`; -> True
    when this run did it, False when another run's verified entry was there or won the race."""
    root = dest.parent
    root.mkdir(parents=True, exist_ok=True)
    if (dest / MANIFEST).exists():
        return False
    with _courtesy_lock(root / f"{dest.name}.lock", echo):
        if (dest / MANIFEST).exists():
            echo(f"bundle: {dest} was unpacked by another run; using it")
            return False
        for d in sweep(root):
            echo(f"bundle: removed {d.name}, left by a run that was killed")
        if dest.exists() and not (dest / MANIFEST).exists():
            discard(dest)  # half an entry (older versions): never trusted
        # the unpacked size is the manifest's: a full disk is said before the first byte
        files.ensure(root, sum(f.size for f in docs[paths[-1]].files.values()),
                     f"unpacking {paths[-1].name}")
        lost: list[bool] = []
        with files.publishing(dest, tree=True, lost=lambda: lost.append(True)) as tmp:
            sums = _extract(paths, docs, tmp, dest, echo)
            changed, missing = mismatch(docs[paths[-1]], sums)
            if changed or missing:
                raise refusal(paths[-1], changed, missing, "nothing was unpacked or installed")
            for extra in set(sums) - set(docs[paths[-1]].files):  # a base's file dropped
                (tmp / extra).unlink()
            (tmp / MANIFEST).write_bytes(top_raw)
        if lost:
            echo(f"bundle: another run published {dest} first; using it")
        return not lost
