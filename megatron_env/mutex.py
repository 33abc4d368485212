"""One run at a time per environment: a file lock that says so when it has to wait.

Two `invoke env` or `invoke setup` runs on the same prefix must not build at once; the second
waits for the first and then finds the work done. Waiting silently looks like a hang, so the
waiter says whom it waits for.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from megatron_env import output


@contextmanager
def exclusive(path: Path, waiting: str, echo: output.Echo = output.status) -> Iterator[None]:
    """Hold the lock file `path`; when another process holds it, echo `waiting`, then wait."""
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        echo(waiting)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
