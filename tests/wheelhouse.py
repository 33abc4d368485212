"""The environment tests' wheelhouse: every wheel of the default profile's lock (about 2.6 GB),
downloaded once per lock and kept between runs, the only package source of the environment
tests (as on an air-gapped cluster). Downloaded beside the entry and renamed into place
complete, under a lock: two runs at once never see half a wheelhouse.

`python -m tests.wheelhouse` fills it ahead of the tests: .ci/run starts it while nox builds the
test session's virtual environment, so a cold run's two big downloads overlap (the tests'
`wheelhouse` fixture then finds it, or waits on the lock for the download under way)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

PROFILE = "core_v0.4.0-cu121"


def cache_root() -> Path:
    """Where test runs keep what they download, between runs (MEGATRON_ENV_TEST_CACHE, else
    ~/.cache/megatron-env-tests): entries are keyed by content, so a changed lock gets a new
    one and a stale one is never used."""
    return Path(os.environ.get("MEGATRON_ENV_TEST_CACHE")
                or Path.home() / ".cache" / "megatron-env-tests")


def ensure() -> Path:
    """The wheelhouse of the default profile's lock, downloaded if it is not there yet."""
    from filelock import FileLock

    from megatron_env import digest, profile
    from megatron_env.pyenv import lock

    lockfile = profile.load(PROFILE).lock_file
    wh = cache_root() / f"wheelhouse-{digest.hexpart(digest.of_file(lockfile), 16)}"
    wh.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(wh) + ".lock"):
        if not wh.is_dir():
            part = wh.with_name(wh.name + f".part-{os.getpid()}")
            shutil.rmtree(part, ignore_errors=True)
            r = lock.download_wheels(lockfile, part, "3.10")
            if not r.ok:
                raise RuntimeError(f"downloading the wheelhouse failed:\n{r.output[-2000:]}")
            os.rename(part, wh)
    found, locked = len(list(wh.glob("*.whl"))), len(lock.parse_lock(lockfile.read_text()))
    if found != locked:
        raise RuntimeError(f"{wh} holds {found} wheels, the lock pins {locked}")
    return wh


if __name__ == "__main__":
    try:
        print(ensure())
    except RuntimeError as e:
        sys.exit(f"error: {e}")
