"""A small real filesystem for a test: a tmpfs of a given size, read-only when asked (root
only, as CI runs; the test is skipped where mounting is not allowed), unmounted at the end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from megatron_env import proc


@contextlib.contextmanager
def mounted(where: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    options = f"{'ro,' if read_only else ''}size={size}"
    r = proc.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)])
    if not r.ok:
        pytest.skip(f"cannot mount a tmpfs here: {r.tail(1)}")
    try:
        yield where
    finally:
        proc.run(["umount", "-l", str(where)])
