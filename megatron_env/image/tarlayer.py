"""One layer of an image, written once as a stream: tar -> sha256 (the diff_id) -> gzip ->
sha256 (the blob's digest) -> file. Nothing of a layer is held in memory but one chunk.

Reproducible by construction: the caller adds entries in sorted order, every entry gets the
same owner (0:0, no names) and the same mtime (the image's epoch), gzip writes no name and no
time. Each file's bytes pass a check for the build's own paths (an image must not name the
directory it was built in) and a file named like an NVIDIA driver library is refused: the
host's container hooks bring the driver, a baked one is the classic version mismatch.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from megatron_env.errors import UserError

CHUNK = 1 << 20
GZIP_LEVEL = 6  # gzip's own default: the level is part of the bytes, so it is fixed here
# Libraries of the NVIDIA driver (libnvidia-container mounts them from the host)
DRIVER_LIB = re.compile(r"^(libcuda|libcudadebugger|libnvidia-[a-z0-9-]+|libnvcuvid|"
                        r"libnvoptix|libnvidia)\.so(\.|$)")


@dataclass(frozen=True)
class Written:
    """A finished layer: its blob's digest and size, and the digest of the uncompressed tar."""

    digest: str
    diff_id: str
    size: int
    entries: int


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes to `out`."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        data = bytes(b)
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


class _Checked(io.RawIOBase):
    """A file read for the tar, every chunk searched for the forbidden byte strings."""

    def __init__(self, f: IO[bytes], forbidden: tuple[bytes, ...], name: str) -> None:
        self.f, self.forbidden, self.name = f, forbidden, name
        self.tail = b""
        self.keep = max((len(x) for x in forbidden), default=1) - 1

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        window = self.tail + data
        for bad in self.forbidden:
            if bad in window:
                raise UserError(f"{self.name} would carry a path of the build "
                                f"({bad.decode(errors='replace')}) into the image",
                                fix="this is a bug in megatron-env's image build: run "
                                    "`invoke report` and attach this line to an issue",
                                kind="image.build-path")
        self.tail = window[-self.keep:] if self.keep else b""
        return data


class LayerWriter:
    """Entries in, one gzip blob out (`close` gives its digests). Use as a context manager:
    an exception leaves a partial file for the caller's temporary directory to remove."""

    def __init__(self, dest: Path, epoch: int, forbidden: tuple[bytes, ...] = (),
                 check_driver: bool = True) -> None:
        self.epoch, self.forbidden, self.check_driver = epoch, forbidden, check_driver
        self._file = open(dest, "wb")  # noqa: SIM115 - closed in close()
        self._blob = _Hashing(self._file)
        self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._blob,
                                 compresslevel=GZIP_LEVEL, mtime=0)
        self._tar_hash = _Hashing(self._gz)  # type: ignore[arg-type]
        self._tar = tarfile.open(  # noqa: SIM115 - closed in close(), or abandoned in __exit__
            fileobj=self._tar_hash, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK)
        self.entries = 0
        self._last = ""

    def __enter__(self) -> LayerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:  # abandoned: nothing more is written (the caller removes it)
            stream = getattr(self._tar, "fileobj", None)
            if stream is not None:
                stream.closed = True
            self._tar.closed = True  # type: ignore[attr-defined]
            self._file.close()

    def _info(self, name: str, kind: bytes, mode: int, owner: tuple[int, int] = (0, 0)
              ) -> tarfile.TarInfo:
        if name <= self._last and self.entries:
            raise ValueError(f"layer entries out of order: {name!r} after {self._last!r}")
        self._last = name
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode, ti.mtime = kind, mode & 0o7777, self.epoch
        ti.uid, ti.gid = owner
        ti.uname = ti.gname = ""
        self.entries += 1
        return ti

    def _driver(self, name: str) -> None:
        if self.check_driver and DRIVER_LIB.match(name.rsplit("/", 1)[-1]):
            raise UserError(f"{name} is an NVIDIA driver library; an image must not carry one "
                            "(the host's container runtime brings the driver)",
                            fix="remove it from the environment's packages; the host's "
                                "libnvidia-container or Apptainer's --nv mounts the driver",
                            kind="image.driver-library")

    def directory(self, name: str, mode: int = 0o755, owner: tuple[int, int] = (0, 0)) -> None:
        self._tar.addfile(self._info(name, tarfile.DIRTYPE, mode, owner))

    def symlink(self, name: str, target: str, owner: tuple[int, int] = (0, 0)) -> None:
        self._driver(name)
        ti = self._info(name, tarfile.SYMTYPE, 0o777, owner)
        ti.linkname = target
        self._tar.addfile(ti)

    def hardlink(self, name: str, target: str, owner: tuple[int, int] = (0, 0)) -> None:
        ti = self._info(name, tarfile.LNKTYPE, 0o644, owner)
        ti.linkname = target
        self._tar.addfile(ti)

    def special(self, name: str, info: tarfile.TarInfo) -> None:
        """A device, fifo (a base system's /dev entries), as the base's tar has it."""
        ti = self._info(name, info.type, info.mode, (info.uid, info.gid))
        ti.devmajor, ti.devminor = info.devmajor, info.devminor
        self._tar.addfile(ti)

    def data(self, name: str, data: bytes, mode: int = 0o644) -> None:
        ti = self._info(name, tarfile.REGTYPE, mode)
        ti.size = len(data)
        self._tar.addfile(ti, _Checked(io.BytesIO(data), self.forbidden, name))

    def stream(self, name: str, f: IO[bytes], size: int, mode: int = 0o644,
               owner: tuple[int, int] = (0, 0)) -> None:
        self._driver(name)
        ti = self._info(name, tarfile.REGTYPE, mode, owner)
        ti.size = size
        self._tar.addfile(ti, _Checked(f, self.forbidden, name))

    def file(self, name: str, path: Path) -> None:
        """A file of the staging tree, as the entry `name` (its mode's x bits kept)."""
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            self.symlink(name, str(path.readlink()))
            return
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        with open(path, "rb") as f:
            self.stream(name, f, st.st_size, mode)

    def close(self) -> Written:
        self._tar.close()
        self._gz.close()
        self._file.flush()
        self._file.close()
        return Written("sha256:" + self._blob.sha.hexdigest(),
                       "sha256:" + self._tar_hash.sha.hexdigest(), self._blob.size, self.entries)


def parents(names: list[str]) -> list[str]:
    """Every directory above the given entry names (without a trailing slash), sorted."""
    out: set[str] = set()
    for n in names:
        parts = n.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out.add("/".join(parts[:i]))
    return sorted(out)
