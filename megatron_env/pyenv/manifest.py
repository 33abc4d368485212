"""Environment manifests: what every installed file looked like right after a verified build.

A wheel ships a RECORD naming each file it installs with its sha256 and size. After a build the
manifest keeps, for every such file, the RECORD hash plus what `stat` said (size, mtime, inode).
Two checks follow from it:

- `stat_check`: stat only, no hashing and no imports, so a warm run stays well under a second
  even for a CUDA torch environment of 20,000 files; a deleted, replaced, truncated or edited
  file changes its size, mtime or inode and is named (package, file);
- `hash_check`: every file re-hashed against its RECORD sha256, for `--verify-deep` and right
  after an install (a uv cache entry edited in place would otherwise be installed again and
  again: its RECORD still carries the wheel's original hashes, which is how it is caught).

Pure functions of the file system; the repair (reinstalling a package from the lock) lives in
env.py.
"""

from __future__ import annotations

import base64
import csv
import json
import os
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_env import digest, files

FORMAT = 1

#: A manifest as saved (JSON): {"format", "roots": [site-packages], "bytes", "dists": {dist-info
#: name: {"name", "version", "files": [[path, size, mtime_ns, inode, sha256]], "absent": [path]}}}
Manifest = dict[str, Any]


@dataclass(frozen=True)
class Difference:
    """One file (or package) that no longer is what its build left.

    kind: "missing" (gone), "changed" (size, mtime or inode differ), "hash" (content differs from
    RECORD), "extra" (a package that the build did not install).
    """

    kind: str
    package: str
    file: str = ""

    def line(self) -> str:
        return f"{self.package:<24} {self.kind:<8} {self.file}".rstrip()


def normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _record_hash(value: str) -> str:
    """RECORD's "sha256=<urlsafe base64, no padding>" as hex ("" when the entry has none)."""
    algo, _, b64 = value.partition("=")
    if algo != "sha256" or not b64:
        return ""
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()


def _dist_name(info: Path) -> tuple[str, str]:
    """(normalized name, version) from a .dist-info directory's METADATA (its name as fallback)."""
    name = version = ""
    try:
        with open(info / "METADATA", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("Name:"):
                    name = line[5:].strip()
                elif line.startswith("Version:"):
                    version = line[8:].strip()
                if name and version or line == "\n":
                    break
    except OSError:
        pass
    if not name:
        name, _, version = info.name[: -len(".dist-info")].partition("-")
    return normalize(name), version


def dist_infos(roots: list[str]) -> dict[str, Path]:
    """dist-info directory name -> path, over the site-packages `roots`."""
    out = {}
    for root in roots:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for n in names:
            if n.endswith(".dist-info"):
                out[n] = Path(root, n)
    return out


def _bytecode(record_path: str) -> bool:
    """A RECORD entry for a `__pycache__/*.pyc`: a cache Python rewrites or that an image may
    strip, never content (its .py is checked); pip records these without a hash."""
    return record_path.endswith(".pyc") and "__pycache__/" in record_path


def scan(roots: list[str], names: set[str] | None = None) -> Manifest:
    """The manifest of the distributions installed under `roots` (site-packages directories);
    `names`: of these distributions only."""
    dists: dict[str, dict[str, Any]] = {}
    total = 0
    for info_name, info in sorted(dist_infos(roots).items()):
        name, version = _dist_name(info)
        if names is not None and name not in names:
            continue
        root = str(info.parent)
        files: list[list[Any]] = []
        absent: list[str] = []
        try:
            with open(info / "RECORD", newline="", encoding="utf-8") as fh:
                rows = list(csv.reader(fh))
        except OSError:
            rows = []
        for row in rows:
            if not row or not row[0] or _bytecode(row[0]):
                continue
            path = os.path.normpath(os.path.join(root, row[0]))
            try:
                st = os.stat(path)
            except OSError:
                absent.append(path)
                continue
            total += st.st_size
            files.append([path, st.st_size, st.st_mtime_ns, st.st_ino,
                          _record_hash(row[1]) if len(row) > 1 else ""])
        dists[info_name] = {"name": name, "version": version, "files": files, "absent": absent}
    return {"format": FORMAT, "roots": list(roots), "dists": dists, "bytes": total}


def without(manifest: Manifest, names: set[str]) -> Manifest:
    """The manifest less the distributions called `names` (and their bytes)."""
    dists = {k: d for k, d in manifest["dists"].items() if d["name"] not in names}
    return {**manifest, "dists": dists,
            "bytes": sum(f[1] for d in dists.values() for f in d["files"])}


def stat_check(manifest: Manifest, ignore_extra: Set[str] = frozenset()) -> list[Difference]:
    """Differences visible to `stat` alone: missing or changed files, packages added."""
    out: list[Difference] = []
    for d in manifest["dists"].values():
        for path, size, mtime, ino, _sha in d["files"]:
            try:
                st = os.stat(path)
            except OSError:
                out.append(Difference("missing", d["name"], path))
                continue
            if st.st_size != size or st.st_mtime_ns != mtime or st.st_ino != ino:
                out.append(Difference("changed", d["name"], path))
    for info_name, info in dist_infos(manifest["roots"]).items():
        if info_name not in manifest["dists"]:
            name, _ = _dist_name(info)
            if name not in ignore_extra:
                out.append(Difference("extra", name, str(info)))
    return out


def hash_check(manifest: Manifest, packages: set[str] | None = None) -> list[Difference]:
    """Every file (of `packages`, or all) re-hashed against the sha256 its RECORD gives."""
    out: list[Difference] = []
    for d in manifest["dists"].values():
        if packages is not None and d["name"] not in packages:
            continue
        out += [Difference("missing", d["name"], p) for p in d["absent"]]
        for path, *_stat, sha in d["files"]:
            if not sha:
                continue
            try:
                if digest.file_hex(path) != sha:
                    out.append(Difference("hash", d["name"], path))
            except OSError:
                out.append(Difference("missing", d["name"], path))
    return out


def packages(differences: list[Difference]) -> list[str]:
    return sorted({d.package for d in differences})


def summarize(differences: list[Difference], most: int = 3) -> list[str]:
    """One line per package: what happened to how many files, the first few named."""
    lines = []
    for pkg in packages(differences):
        mine = [d for d in differences if d.package == pkg]
        for kind in sorted({d.kind for d in mine}):
            names = [d.file for d in mine if d.kind == kind]
            shown = ", ".join(names[:most]) + (f" and {len(names) - most} more"
                                               if len(names) > most else "")
            lines.append(f"{pkg}: {kind} {shown}")
    return lines


def save(manifest: Manifest, path: Path) -> str:
    """Write atomically; returns the digest that names this manifest (stamps refer to it)."""
    text = json.dumps(manifest, separators=(",", ":"))
    files.write_text(path, text)
    return digest.of_bytes(text.encode())


def load(path: Path) -> Manifest | None:
    """The manifest at `path`, or None when it is absent or not one (any content: redone)."""
    m, _why = files.read_json(path)
    return m if isinstance(m, dict) and m.get("format") == FORMAT else None
