"""Content digests: the one way anything here turns inputs into a key.

Lock headers, cache keys, patch series and setup stamps all name their inputs by these, so two
machines given the same inputs (a CPU login node and a GPU node) compute the same key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def of(doc: Any) -> str:
    """'sha256:<hex>' of a JSON document (keys sorted: the order they were built in is no input)."""
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def of_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def of_file(path: Path) -> str:
    """The file's content digest, or 'missing' (a file that is absent is an input too)."""
    return of_bytes(path.read_bytes()) if path.exists() else "missing"


def of_files(paths: Iterable[Path]) -> str:
    """Names and contents in the given order (a patch series: renaming or reordering counts)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def hexpart(d: str, n: int) -> str:
    """The first n hex digits of a digest, for names (cache slots, mirror directories)."""
    return d.removeprefix("sha256:")[:n]
