"""The kernels of one setup built together, from one pool of compile jobs (kernels.slots).

Each kernel builds in its own thread through the usual path (build.build_and_install: cache,
lock per key, install, import check), with the pool's variables in its environment. The pool
is as wide as cores and memory allow (--jobs / MAX_JOBS cap it); every compiler of every kernel
asks it for a slot, and the waiting object with the longest remaining work starts first
(kernels.schedule), from each kernel's object costs: those its previous build of the same pins
recorded (the ninja logs kept beside its wheel in the cache), else its recipe's estimate.
Every kernel starts at once (a waiting compile job holds no slot) and reports its own
progress. The first failure stops the others: their processes (found by the marker variable in
their environment, whoever started them) are killed, and what finished stays in the cache.
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

from megatron_env import digest, files, output
from megatron_env.errors import UserError
from megatron_env.host import resources
from megatron_env.kernels import build, ninjalog, pool, schedule, slots
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


def extensions_at_once(slots: int) -> int:
    """How many extensions a package that builds several at once (Recipe.parallel_var) runs in
    the pool: all it has, up to 16; their objects wait in the pool, each holding no slot, so
    the pool sees them all and picks the longest."""
    return max(4, min(16, slots))


def width(slots: int) -> int:
    """ninja's -j in the pool: its jobs mostly wait for a slot, asleep; as many as it can
    show, so the pool chooses among them all."""
    return 4 * slots + 8


COSTS_DIR = "object-costs"


def _costs_file(pkg: Package, cache: Path) -> Path:
    return cache / COSTS_DIR / f"{pkg.name}-{digest.hexpart(digest.of(pkg.source.digest), 16)}.json"


def _keep_costs(pkg: Package, cache: Path, runs: dict[str, list[list[object]]]) -> None:
    """What each object of this build took in the pool (slots.record), for the next build of
    the same pins: its ninja logs count the wait for a slot too."""
    if runs:
        files.write_text(_costs_file(pkg, cache), json.dumps(
            {"source": pkg.source.digest, "runs": runs}, indent=0))


def _pool_record(pkg: Package, cache: Path) -> list[tuple[str, list[ninjalog.Step]]] | None:
    doc, _why = files.read_json(_costs_file(pkg, cache))
    if not isinstance(doc, dict) or doc.get("source") != pkg.source.digest:
        return None
    try:  # an object's cost: its seconds times the slots (threads) it ran on
        return [(name, [ninjalog.Step(str(o), float(a), float(a) + (float(b) - float(a))
                                      * max(1, int(n))) for o, a, b, n in rows])
                for name, rows in doc["runs"].items()]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def costs(pkg: Package, cache: Path, slots: int) -> schedule.Costs:
    """pkg's object costs: the pool's record of the last build of the same pins, else the
    newest build in the cache of the same pins (the same source digest: another torch or arch
    list changes little of what takes long) with ninja logs (from before the pool: theirs
    hold no wait), else the recipe's declared estimate."""
    if runs := _pool_record(pkg, cache):
        return schedule.from_logs(pkg.name, runs, pkg.object_seconds, slots)
    best: tuple[str, Path] | None = None
    for meta in cache.glob(f"wheels/{pkg.name}-*/meta.json"):
        doc, _why = files.read_json(meta)
        logs = meta.parent / "ninja-logs"
        if (isinstance(doc, dict) and isinstance(doc.get("key"), dict)
                and doc["key"].get("source") == pkg.source.digest and logs.is_dir()):
            when = str(doc.get("built_at", ""))
            if best is None or when > best[0]:
                best = (when, logs)
    if best is not None:
        try:
            runs = [(f.name, ninjalog.parse(f.read_text(errors="replace"), f.name))
                    for f in sorted(best[1].glob("*.ninja_log"))]
            return schedule.from_logs(pkg.name, [(n, [s for s in r if s.output.endswith(".o")])
                                                 for n, r in runs],
                                      pkg.object_seconds, slots)
        except (OSError, ninjalog.NinjaLogError):
            pass  # unreadable: the estimate
    return schedule.Costs(pkg.name, {}, pkg.object_seconds, "declared")


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
          outcomes: dict[str, Outcome], echo: Callable[..., None],
          ended: list[threading.Event], failed: threading.Event) -> None:
    """Until every build thread ended; once one failed, the others are killed, again and
    again: a build that was just starting is caught too. Interrupted (Ctrl-C, SIGTERM):
    every build is stopped and each started thread let end (`ended`: its last act) before
    the interrupt goes on up: a kernel's install puts back what it had begun
    (pyenv/aside.py), and nothing runs on after the tool said "interrupted". Not
    Thread.join there: on Python 3.11 a join cut by Ctrl-C marks the running thread ended."""
    told: set[str] = set()
    try:
        while any(t.is_alive() for t in list(threads)):
            if failing:
                _stop_others({k: v for k, v in markers.items() if k not in outcomes},
                             failing[0], echo, told)
            for t in list(threads):
                t.join(timeout=0.2)
    except BaseException:
        failed.set()
        for marker in markers.values():
            stop(marker)
        for t, end in zip(threads, ended, strict=True):
            if t.ident is not None:
                end.wait()
        raise


def _ended_by(name: str, e: UserError | KeyboardInterrupt, failed: threading.Event,
              failing: list[str]) -> Outcome:
    """A build thread's outcome when its build raised: the first failure stops the others
    (`failed`); a failure after that, or an interrupt (its child died of the Ctrl-C the main
    thread got too), is a stop."""
    if isinstance(e, KeyboardInterrupt):
        return Outcome(name, None, stopped=True)
    if failed.is_set():
        return Outcome(name, None, e, stopped=True)
    failing.append(name)
    failed.set()
    return Outcome(name, None, e)


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
    size = pool.size(resources.cores(), avail, source,
                          max(p.gb_per_job for p in pkgs), cap(jobs, os.environ))
    known = {p.name: costs(p, cache, size.slots) for p in pkgs}
    path = f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    outcomes: dict[str, Outcome] = {}
    failed = threading.Event()
    markers = {p.name: uuid.uuid4().hex for p in pkgs}
    failing: list[str] = []
    ended = {p.name: threading.Event() for p in pkgs}  # each thread's last act
    with tempfile.TemporaryDirectory(prefix="megatron-env-pool-") as tmp:
        try:
            shim = pool.shim(Path(tmp), path, width(size.slots))
        except UserError as e:  # no ninja: each kernel with its own jobs, in turn
            output.warning(f"{e.message}: so the {len(pkgs)} kernels build one after another, "
                           "each with its own compile jobs, instead of side by side from one "
                           f"pool of {size.slots}; the builds are the same, only slower")
            output.hint(e.fix)
            return _in_turn(pkgs, python, archs, echo, given, cache, child_env, builder)
        wrappers = slots.bin_dir(Path(tmp), path)
        compilers = slots.env_compilers(Path(tmp), os.environ, path)
        broker = slots.Broker(Path(tmp), size.slots, known,
                              schedule.expected(known, size.slots))
        echo(f"kernels: {len(pkgs)} build(s) from one pool of {size.slots} compile jobs "
             f"({size.why}), longest remaining work first; object costs: "
             + ", ".join(f"{k} {'from its last build' if c.source == 'log' else 'estimated'}"
                         for k, c in known.items()))

        def one(pkg: Package) -> None:
            given_pool = pool.Pool(
                env={**broker.env(pkg.name), **compilers,
                     "PATH": f"{wrappers}{os.pathsep}{shim}{os.pathsep}{path}",
                     MARK: markers[pkg.name],
                     "MEGATRON_ENV_SLOT_CLIENT": str(wrappers / "slot")},
                slots=size.slots, width=width(size.slots),
                why=f"one pool of {size.slots} jobs for {len(pkgs)} kernels: {size.why}",
                clients=extensions_at_once(size.slots), client=str(wrappers / "slot"))
            try:
                if failed.is_set():
                    outcomes[pkg.name] = Outcome(pkg.name, None, stopped=True)
                    return
                r = builder(pkg, python, archs, echo=echo, given=given, cache=cache,
                            child_env=child_env, pool=given_pool)
                assert isinstance(r, build.Result)
                outcomes[pkg.name] = Outcome(pkg.name, r)
            except (UserError, KeyboardInterrupt) as e:
                outcomes[pkg.name] = _ended_by(pkg.name, e, failed, failing)
            finally:
                broker.forget(pkg.name)
                ended[pkg.name].set()

        threads = [threading.Thread(target=one, args=(p,), name=f"build-{p.name}")
                   for p in pkgs]
        t0 = time.monotonic()
        try:
            for t in threads:
                t.start()
            _wait(threads, failing, markers, outcomes, echo, [ended[p.name] for p in pkgs],
                  failed)
        finally:
            broker.close()
        for p in pkgs:
            o = outcomes.get(p.name)
            if o and o.result and not o.result.cache_hit:
                _keep_costs(p, cache, slots.record(broker.grants, p.name))
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
