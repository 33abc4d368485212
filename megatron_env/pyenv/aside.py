"""A repair in place is all or nothing: the files of the distributions about to be reinstalled
into a live environment are set aside first (hard links: no copy of torch's gigabytes), and
put back when the reinstall does not finish (Ctrl-C, SIGTERM, uv failing): the environment is
then exactly as it was before the repair, never half uninstalled. On success they are dropped.

Both ways a live environment is reinstalled into go through here: a lock package repaired
(env.repair) and a kernel's wheel installed, from the wheel cache or just built
(kernels/build.py). One reinstall at a time per process (the kernels install from threads of
one pool): a put-back removes what appeared beside the files it restores, and a set-aside
directory left by a killed run is removed by the next; across processes the callers' own locks
keep them apart (the environment's, the setup state's). The directory goes where the caller
says: a repair's in the environment's root, a kernel's in the site-packages it installs into.

A run killed outright (SIGKILL) cannot put anything back: its set-aside directory is removed by
the next repair (which holds the environment's lock, so that run is dead), and the stat check
of the next setup finds what is missing and repairs it.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from megatron_env import files, interrupts, output
from megatron_env.pyenv import manifest

ASIDE = ".megatron-env-repair"  # in the environment's root, beside bin/ and lib/

_ONE_AT_A_TIME = threading.Lock()


def root_of(python: Path) -> Path:
    """The root of the environment `python` runs (<root>/bin/python): where the files set
    aside go, on the file system of its packages (hard links, no copy)."""
    return Path(python).parent.parent


def _installed(sites: list[str], names: set[str]) -> tuple[list[str], list[str]]:
    """(the files the distributions `names` have under `sites` now, those their RECORDs name
    but that are gone)."""
    m = manifest.scan(sites, names)
    return ([f[0] for d in m["dists"].values() for f in d["files"]],
            [p for d in m["dists"].values() for p in d["absent"]])


@contextmanager
def reinstalling(root: Path, sites: list[str], names: set[str],
                 echo: output.Echo = output.status) -> Iterator[None]:
    """Around the reinstall of `names` into the environment at `root` (site-packages
    `sites`): on any exception inside, what the reinstall did to those distributions is
    undone, the reason said, and the exception goes on up."""
    with _ONE_AT_A_TIME, _set_aside(root, sites, names, echo):
        yield


@contextmanager
def _set_aside(root: Path, sites: list[str], names: set[str],
               echo: output.Echo) -> Iterator[None]:
    where = root / ASIDE
    files.remove(where)  # a killed repair's (the environment's lock is held: it is dead)
    where.mkdir()
    try:
        kept, absent = _installed(sites, names)
        # what the directories holding them held besides (uv's temporary files, a half-written
        # package of the reinstall are removed on the way back; nothing else is touched)
        listed = {d: sorted(os.listdir(d)) for d in {os.path.dirname(p) for p in kept}}
        index = {}
        for i, path in enumerate(kept):
            try:
                os.link(path, where / str(i))
            except OSError:  # a file system without hard links
                shutil.copy2(path, where / str(i))
            index[str(i)] = path
        (where / "index.json").write_text(json.dumps({"files": index, "absent": absent,
                                                      "listed": listed}))
    except BaseException:  # interrupted before the reinstall began: nothing was changed
        with interrupts.held():
            shutil.rmtree(where, ignore_errors=True)
        raise
    try:
        yield
    except BaseException as e:
        with interrupts.held():  # a second Ctrl-C cuts neither the putting back nor its word
            _put_back(sites, names, where, index, absent, listed)
            why = ("interrupted" if isinstance(e, KeyboardInterrupt) else "failed")
            echo(f"repair {why}: the reinstall of {', '.join(sorted(names))} was undone, "
                 f"{len(index)} file(s) put back: the environment is as it was before the "
                 "repair (the next run repairs it)")
        raise
    finally:
        with interrupts.held():  # an interrupt as the repair ends leaves no set-aside behind
            shutil.rmtree(where, ignore_errors=True)


def _put_back(sites: list[str], names: set[str], where: Path, index: dict[str, str],
              absent: list[str], listed: dict[str, list[str]]) -> None:
    """Remove whatever of `names` is installed now (a new RECORD's files, an unfinished
    dist-info, uv's temporary files beside them), then move every set-aside file back."""
    now, _gone = _installed(sites, names)
    for path in {*now, *absent}:
        Path(path).unlink(missing_ok=True)
    for d, before in listed.items():
        try:
            extra = set(os.listdir(d)) - set(before)
        except OSError:
            continue  # removed by the uninstall: made again below
        for name in extra:
            files.remove(Path(d) / name)
    for n, path in index.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        os.replace(where / n, path)
    had = {str(Path(p).parent) for p in index.values() if p.endswith(".dist-info/RECORD")}
    for info in manifest.dist_infos(sites).values():  # one the reinstall began and not ended
        if _named(info) in names and str(info) not in had:
            shutil.rmtree(info, ignore_errors=True)


def _named(info: Path) -> str:
    """The normalized distribution name of a `<name>-<version>.dist-info` directory."""
    return manifest.normalize(info.name[: -len(".dist-info")].rsplit("-", 1)[0])
