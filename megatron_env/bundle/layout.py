"""Offline bundles: everything one profile's `invoke setup` needs, in one archive with a
manifest; here its layout and the manifest's reading.

Made where the network (or the MEGATRON_ENV_MIRROR_* / MEGATRON_ENV_SOURCE_* mirrors) is, used
where nothing is reachable. Layout of an archive (and of the directory it unpacks to):

    manifest.json        every file below: sha256, size, role; the profile digest; the Python and
                         platform it serves; the tool version; `base` for a delta bundle
    source/              the tool's own tree with this profile, its locks and patch series
                         (run `invoke ... --bundle` from here)
    tool/                megatron-env and its runtime dependencies as wheels for the profile's
                         Python, with the build backend (pip install --no-index --find-links)
    wheels/              every file the lock pins, each checked against the lock's sha256
                         (absent from an `adopt` bundle, made for a node that has its own torch)
    sources/<name>/      kernel sdists, checked against the profile's sha256
    git/<name>-<commit>.git   bare repositories holding only the pinned commit (and its tag):
                         Megatron-LM, every git-sourced kernel package and each submodule it
                         pins (named <package>-<path>)
    resources/<name>/    each recipe resource the profile's kernels use (recipes/recipe.py:
                         `Resource`): the pinned wheel, or a tar.gz of the pinned paths; checked
                         against the manifest here and against the recipe's pin when placed
    builds/<key>/        kernel wheels from the build cache for this profile (--with-builds)

megatron_env.bundle.make writes it; megatron_env.bundle.offline checks and uses it.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

from megatron_env import digest
from megatron_env.bundle.manifest import Manifest
from megatron_env.errors import UserError
from megatron_env.kernels import build
from megatron_env.megatron import checkout
from megatron_env.profile import Profile
from megatron_env.sources import patches

MANIFEST = "manifest.json"
MACHINE = "x86_64"  # the locks are made for linux x86_64 (lock.PLATFORM)
# The places a bundle owns: nothing may lie there that its manifest does not list (source/ is
# left out: the tool writes its checkout and cache there when run from it)
OWNED = ("tool", "wheels", "sources", "resources", "git", "builds", "conda")


def profile_digest(prof: Profile) -> str:
    """The profile, its locks and every patch series it uses: what a bundle was made from."""
    files = [prof.path, prof.lock_file, prof.env_file, prof.conda_lock_file]
    return digest.of({
        "files": {f.name: digest.of_file(f) for f in files},
        "megatron": digest.of_files(checkout.patch_series(prof)),
        "kernels": {k.name: digest.of_files(patches.series(k.name, k.pin))
                    for k in build.packages(prof).values()}})


def py_tag(version: str) -> str:
    return "cpython-" + version.replace(".", "")


def repo_path(name: str, commit: str) -> str:
    """Where a bundle keeps the bare repository of `name` at `commit` (a submodule's name
    `<package>/<path>` flattened)."""
    return f"git/{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}-{commit[:12]}.git"


def role(arcname: str) -> str:
    top = arcname.split("/")[0]
    if top == "source":
        if arcname.startswith("source/envs/"):
            return "lock" if arcname.endswith((".lock", ".yml")) else "profile"
        return "patch" if arcname.startswith("source/patches/") else "tool-source"
    return {"tool": "tool-wheel", "wheels": "env-wheel", "sources": "kernel-source",
            "resources": "resource", "git": "git", "builds": "kernel-build",
            "conda": "conda-package"}.get(top, top)


_MAGIC = [(b"\x1f\x8b", "a gzip file"), (b"PK\x03\x04", "a zip archive"),
          (b"BZh", "a bzip2 file"), (b"\xfd7zXZ\x00", "an xz file"),
          (b"\x28\xb5\x2f\xfd", "a zstd file"), (b"\x7fELF", "an executable (ELF)"),
          (b"%PDF", "a PDF document")]
BLOCK = 512


def _is_tar(head: bytes) -> bool:
    return len(head) >= 262 and head[257:262] == b"ustar"


def what_is(path: Path) -> str:
    """In words, what a file that is not a bundle is (for the error that refuses it)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(BLOCK)
    if size == 0:
        return "an empty file"
    if _is_tar(head):
        return f"a tar archive without {MANIFEST} first"
    for magic, words in _MAGIC:
        if head.startswith(magic):
            return words
    try:
        head.decode("utf-8")
        return "a text file"
    except UnicodeDecodeError:
        return "not a tar archive"


def truncated(path: Path) -> bool:
    """An uncompressed tar cut short: not a whole number of blocks, or no end-of-archive zero
    blocks (tarfile and GNU tar always write two, padded with zeros to a record)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(BLOCK)
        if not _is_tar(head):
            return False
        if size % BLOCK:
            return True
        f.seek(max(0, size - 2 * BLOCK))
        return f.read(2 * BLOCK).strip(b"\0") != b""


def truncated_error(path: Path) -> UserError:
    return UserError(f"{path} is truncated (copy it again): its {path.stat().st_size} bytes "
                     "end inside the archive", fix="copy the bundle again from where it was "
                     "made, and compare its size and sha256 with the original",
                     kind="bundle.truncated")


def read_manifest_bytes(path: Path) -> bytes:
    """manifest.json of an archive (its first member, as `make` writes it) or a directory."""
    try:
        if path.is_dir():
            return (path / MANIFEST).read_bytes()
        if truncated(path):
            raise truncated_error(path)
        with tarfile.open(path) as tar:
            first = tar.next()
            member = first if first is not None and first.name == MANIFEST else \
                tar.getmember(MANIFEST)
            f = tar.extractfile(member)
            if f is None:
                raise KeyError(MANIFEST)
            return f.read()
    except (EOFError, tarfile.ReadError) as e:
        cut = isinstance(e, EOFError) or "end of data" in str(e) or "truncated" in str(e)
        if cut and what_is(path) in (f"a tar archive without {MANIFEST} first", "a gzip file"):
            raise truncated_error(path) from None
        raise UserError(f"{path} is not a megatron-env bundle: it is {what_is(path)}",
                        fix="pass the .tar `invoke bundle` wrote, or the directory it was "
                            "unpacked into", kind="bundle.not-a-bundle") from None
    except (OSError, KeyError, tarfile.TarError) as e:
        what = (what_is(path) if path.is_file() else f"a directory without {MANIFEST}"
                if path.is_dir() else f"unreadable ({type(e).__name__})")
        raise UserError(f"{path} is not a megatron-env bundle: it is {what}",
                        fix="pass the .tar `invoke bundle` wrote, or the directory it was "
                            "unpacked into", kind="bundle.not-a-bundle") from None


def parse_manifest(path: Path, raw: bytes) -> Manifest:
    try:
        doc = json.loads(raw.decode())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise UserError(f"{path}: {MANIFEST} is not JSON ({type(e).__name__})",
                        fix="copy the bundle again from where it was made",
                        kind="bundle.manifest") from None
    return Manifest.parse(doc, str(path))


def read_manifest(path: Path) -> Manifest:
    """The manifest of an archive or of an unpacked bundle directory; a truncated or foreign
    file is named as what it is."""
    if not path.exists():
        raise UserError(f"{path} does not exist", fix="pass the bundle's path",
                        kind="bundle.missing")
    return parse_manifest(path, read_manifest_bytes(path))


def manifest_digest(m: Manifest) -> str:
    return digest.of(m.doc)
