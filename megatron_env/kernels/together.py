"""The kernels of one setup built together, from one pool of compile jobs (kernels.jobserver).

Each kernel builds in its own thread through the usual path (build.build_and_install: cache,
lock per key, install, import check), with the pool's variables in its environment. The pool
is as wide as cores and memory allow (--jobs / MAX_JOBS cap it); the kernel known to take
longest (its last build's time in the cache) starts first. Every kernel reports its own
progress. The first failure stops the others: their processes (found by the marker variable in
their environment, whoever started them) are killed, kernels not yet started never start, and
what finished stays in the cache.

When every kernel's driver processes fit in the pool at once (a package may run several ninjas, one
implicit slot each), all start together; otherwise (few cores) each runs one ninja and
min(kernels, slots) build at a time, the next starting in the slot the last one left.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from megatron_env import output
from megatron_env.errors import UserError
from megatron_env.host import resources
from megatron_env.kernels import build, jobserver
from megatron_env.recipes.recipe import Package
from megatron_env.sources.given import Given

MARK = "MEGATRON_ENV_BUILD_ID"


@dataclass(frozen=True)
class Outcome:
    name: str
    result: build.Result | None
    error: UserError | None = None
    stopped: bool = False  # ended because another kernel failed


def expected_seconds(name: str, cache: Path) -> float:
    """The last recorded build time of this kernel in the cache (any key), or 0."""
    best = 0.0
    for meta in cache.glob(f"wheels/{name}-*/meta.json"):
        try:
            best = max(best, float(json.loads(meta.read_text()).get("build_seconds") or 0))
        except (OSError, ValueError, AttributeError):
            continue
    return best


def cap(jobs: int | None, environ: Mapping[str, str]) -> int | None:
    """--jobs, else MAX_JOBS, else None."""
    if jobs:
        return jobs
    value = environ.get("MAX_JOBS", "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"MAX_JOBS={value} is not a positive whole number",
                        fix="set MAX_JOBS to a number of jobs such as 8, or unset it",
                        kind="input.value")
    return int(value)


def clients(pkgs: list[Package], slots: int) -> dict[str, int]:
    """How many ninja processes each kernel runs at once (each holds one implicit slot)."""
    wide = {p.name: (max(1, min(4, slots // 4)) if p.parallel_var else 1) for p in pkgs}
    return wide if sum(wide.values()) <= slots else dict.fromkeys(wide, 1)


def stop(marker: str) -> int:
    """SIGKILL to every process of this user whose environment holds MARK=marker; -> how many.
    Not SIGTERM: ninja 1.13 ends with status 0 on it, and a driver could take that for a
    finished build; killed, every process of the build (uv, setup.py, ninja, nvcc) fails."""
    needle = f"{MARK}={marker}".encode()
    n = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                os.kill(int(d.name), signal.SIGKILL)
                n += 1
        except (OSError, ValueError):
            continue
    return n


def _stop_others(markers: dict[str, str], failed: str, echo: Callable[..., None],
                 told: set[str]) -> None:
    for other, marker in markers.items():
        if other != failed and stop(marker) and other not in told:
            told.add(other)
            echo(f"{other}: stopping it ({failed} failed)")


def _wait(threads: list[threading.Thread], failing: list[str], markers: dict[str, str],
          outcomes: dict[str, Outcome], echo: Callable[..., None]) -> None:
    """Until every build thread ended; once one failed, the others are killed, again and
    again: a build that was just starting is caught too."""
    told: set[str] = set()
    while any(t.is_alive() for t in list(threads)):
        if failing:
            _stop_others({k: v for k, v in markers.items() if k not in outcomes},
                         failing[0], echo, told)
        for t in list(threads):
            t.join(timeout=0.2)


def build_together(pkgs: list[Package], python: Path, archs: list[str], *,
                   echo: Callable[..., None] = output.status, given: Given | None = None,
                   cache: Path, child_env: Mapping[str, str] | None = None,
                   jobs: int | None = None,
                   builder: Callable[..., build.Result | build.Plan] = build.build_and_install
                   ) -> list[Outcome]:
    """Build and install `pkgs` from one pool; -> one outcome each, in `pkgs` order. Raises
    nothing for a build's failure: the caller reads the outcomes. `builder` is
    build.build_and_install (a test gives a plain ninja build of the same shape)."""
    avail, source = resources.memory()
    size = jobserver.size(resources.cores(), avail, source,
                          max(p.gb_per_job for p in pkgs), cap(jobs, os.environ))
    each = clients(pkgs, size.slots)
    order = sorted(pkgs, key=lambda p: -expected_seconds(p.name, cache))
    at_once = len(order) if each and sum(each.values()) <= size.slots else size.slots
    path = f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    outcomes: dict[str, Outcome] = {}
    failed = threading.Event()
    lock = threading.Lock()
    markers = {p.name: uuid.uuid4().hex for p in pkgs}
    failing: list[str] = []
    with tempfile.TemporaryDirectory(prefix="megatron-env-pool-") as tmp:
        try:
            shim = jobserver.shim(Path(tmp), path)
        except UserError as e:  # no jobserver client: each kernel with its own jobs, in turn
            output.warning(f"{e.message}: so the {len(pkgs)} kernels build one after another, "
                           "each with its own compile jobs, instead of side by side from one "
                           f"pool of {size.slots}; the builds are the same, only slower")
            output.hint(e.fix)
            return _in_turn(pkgs, python, archs, echo, given, cache, child_env, builder)
        first = order[:at_once]
        pool = jobserver.Pool(Path(tmp), size.slots, sum(each[p.name] for p in first))
        echo(f"kernels: {len(pkgs)} build(s) from one pool of {size.slots} compile jobs "
             f"({size.why}); order {', '.join(p.name for p in order)}")
        waiting = list(order[at_once:])

        def one(pkg: Package) -> None:
            env = {**pool.env(), "PATH": f"{shim}{os.pathsep}{path}", MARK: markers[pkg.name],
                   "MEGATRON_ENV_POOL_SLOTS": str(size.slots),
                   "MEGATRON_ENV_POOL_WHY": f"one pool of {size.slots} jobs for "
                                            f"{len(pkgs)} kernels: {size.why}",
                   "MEGATRON_ENV_POOL_CLIENTS": str(each[pkg.name])}
            try:
                if failed.is_set():
                    outcomes[pkg.name] = Outcome(pkg.name, None, stopped=True)
                    return
                r = builder(pkg, python, archs, echo=echo, given=given, cache=cache,
                            child_env=child_env, pool=env)
                assert isinstance(r, build.Result)
                outcomes[pkg.name] = Outcome(pkg.name, r)
            except UserError as e:
                stopped = failed.is_set()
                outcomes[pkg.name] = Outcome(pkg.name, None, e, stopped=stopped)
                if not stopped:
                    failing.append(pkg.name)
                    failed.set()
            finally:
                with lock:  # its implicit slots: to the next kernel, or back to the pool
                    if waiting and not failed.is_set():
                        nxt = waiting.pop(0)
                        start(nxt)
                    else:
                        pool.add(each[pkg.name])

        threads: list[threading.Thread] = []

        def start(pkg: Package) -> None:
            t = threading.Thread(target=one, args=(pkg,), name=f"build-{pkg.name}")
            threads.append(t)
            t.start()

        t0 = time.monotonic()
        with lock:
            for p in first:
                start(p)
        _wait(threads, failing, markers, outcomes, echo)
        pool.close()
        for p in waiting:
            outcomes[p.name] = Outcome(p.name, None, stopped=True)
        echo(f"kernels: {len(pkgs)} build(s) ended in {time.monotonic() - t0:.0f} s")
    return [outcomes[p.name] for p in pkgs]


def _in_turn(pkgs: list[Package], python: Path, archs: list[str], echo: Callable[..., None],
             given: Given | None, cache: Path, child_env: Mapping[str, str] | None,
             builder: Callable[..., build.Result | build.Plan]) -> list[Outcome]:
    out: list[Outcome] = []
    for pkg in pkgs:
        if out and out[-1].error:
            out.append(Outcome(pkg.name, None, stopped=True))
            continue
        try:
            r = builder(pkg, python, archs, echo=echo, given=given, cache=cache,
                        child_env=child_env, pool=None)
            assert isinstance(r, build.Result)
            out.append(Outcome(pkg.name, r))
        except UserError as e:
            out.append(Outcome(pkg.name, None, e))
    return out


def raise_for(outcomes: list[Outcome]) -> None:
    """One UserError naming the kernel that failed, those it stopped and those that finished
    (and stay cached); nothing when all finished."""
    bad = [o for o in outcomes if o.error and not o.stopped]
    if not bad:
        stopped = [o.name for o in outcomes if o.result is None]
        if stopped:  # a stop with no failure: cannot happen unless interrupted
            raise UserError(f"kernel builds stopped: {', '.join(stopped)}",
                            kind="build.stopped")
        return
    first = bad[0]
    assert first.error is not None
    done = [o.name for o in outcomes if o.result]
    stopped = [o.name for o in outcomes if o.stopped]
    raise UserError(f"{first.error.message}"
                    + (f"\n(stopped: {', '.join(stopped)}" if stopped else "\n(")
                    + (f"; finished and cached: {', '.join(done)})" if done else ")"),
                    fix=first.error.fix, kind="build.failed")
