"""Content digests: the one way anything here turns inputs into a key.

Lock headers, cache keys, patch series and setup stamps all name their inputs by these, so two
machines given the same inputs (a CPU login node and a GPU node) compute the same key.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any


def of(doc: Any) -> str:
    """'sha256:<hex>' of a JSON document (keys sorted: the order they were built in is no input)."""
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def of_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def of_file(path: Path) -> str:
    """The file's content digest, or 'missing' (a file that is absent is an input too)."""
    return "sha256:" + file_hex(path) if path.exists() else "missing"


def file_hex(path: Path | str, algo: str = "sha256") -> str:
    """The bare hex digest of a file (what RECORD, locks and conda-lock write), read in chunks:
    a torch wheel is 900 MB, and bundles and --verify-deep hash every file they hold."""
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def copy_hashed(src: IO[bytes], dest: Path) -> tuple[str, int]:
    """Stream `src` into the file `dest`, hashing on the way: -> (sha256 hex, size). A download
    or a tar member is checked without being read twice."""
    h, size = hashlib.sha256(), 0
    with open(dest, "wb") as out:
        while chunk := src.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
            out.write(chunk)
    return h.hexdigest(), size


def of_files(paths: Iterable[Path]) -> str:
    """Names and contents in the given order (a patch series: renaming or reordering counts)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def hexpart(d: str, n: int) -> str:
    """The first n hex digits of a digest, for names (cache slots, mirror directories)."""
    return d.removeprefix("sha256:")[:n]


def of_tree(root: Path, leave_out: Iterable[str] = ()) -> str:
    """A source tree's content: every path under `root` (sorted), its kind, executable bit and
    bytes (a link by its target), without `.git` (a checkout's own bookkeeping, rewritten by
    any `git status`) and the top-level names in `leave_out` (the marker that holds this).
    A file edited, added, removed or made executable changes it."""
    h = hashlib.sha256()
    skip = set(leave_out)
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != ".git")
        rel = os.path.relpath(d, root)
        for n in sorted(names):
            if rel == "." and n in skip:
                continue
            p = os.path.join(d, n)
            key = os.path.normpath(os.path.join(rel, n))
            if os.path.islink(p):
                h.update(f"l {key}\0{os.readlink(p)}\0".encode())
                continue
            x = "x" if os.access(p, os.X_OK) else "f"
            h.update(f"{x} {key}\0{file_hex(p)}\0".encode())
        for x in dirs:
            if os.path.islink(os.path.join(d, x)):
                h.update(f"l {os.path.normpath(os.path.join(rel, x))}\0"
                         f"{os.readlink(os.path.join(d, x))}\0".encode())
        dirs[:] = [x for x in dirs if not os.path.islink(os.path.join(d, x))]
    return "sha256:" + h.hexdigest()
