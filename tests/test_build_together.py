"""Kernels built together from one jobserver pool, with real ninja (>= 1.13, a jobserver client)
and real compilers: the compile jobs running at once (sampled from /proc: the commands ninja
runs) never exceed the pool, a failure in one build stops the others, and what finished stays
in the cache. The builder is a plain ninja build of small C++ (and, where nvcc 13 is installed,
CUDA) objects shaped like a kernel build: its driver passes its own -j, as torch's
cpp_extension and CMake do, which the pool's ninja shim must take away."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from megatron_env import proc
from megatron_env.errors import UserError
from megatron_env.kernels import build, jobserver, together
from megatron_env.recipes.recipe import Package, Source

NINJA = proc.which("ninja", path=f"{Path(os.sys.executable).parent}{os.pathsep}"
                                 f"{os.environ.get('PATH', '')}")
NVCC = Path("/usr/local/cuda-13.0/bin/nvcc")
pytestmark = pytest.mark.skipif(
    not NINJA or jobserver.ninja_version(NINJA) < jobserver.MIN_NINJA,
    reason="needs ninja >= 1.13 (pip install 'ninja>=1.13')")

HEAVY = """#include <map>
#include <string>
#include <vector>
#include <algorithm>
template <int N> struct F { static long v() { std::map<std::string, std::vector<int>> m;
  m["a"].push_back(N); return F<N - 1>::v() + (long)m.size(); } };
template <> struct F<0> { static long v() { return 0; } };
long f_{i}() { return F<{depth}>::v(); }
"""


def project(root: Path, name: str, objects: int, depth: int = 150, broken: int | None = None,
            cuda: bool = False) -> Path:
    d = root / name
    d.mkdir(parents=True)
    rules = ["rule cxx\n  command = g++ -O1 -c $in -o $out\n",
             f"rule nvcc\n  command = {NVCC} -O1 -c $in -o $out "
             "-gencode arch=compute_90,code=sm_90\n"]
    builds = []
    for i in range(objects):
        ext = "cu" if cuda and i == 0 else "cc"
        text = HEAVY.replace("{i}", str(i)).replace("{depth}", str(depth))
        if i == broken:
            text += "\n#error this object does not compile\n"
        (d / f"o{i}.{ext}").write_text(text)
        builds.append(f"build o{i}.o: {'nvcc' if ext == 'cu' else 'cxx'} o{i}.{ext}\n")
    (d / "build.ninja").write_text("".join(rules + builds))
    return d


def ninja_builder(projects: dict[str, Path], started: list[str]):
    """A kernel build of the same shape, with both kinds of driver seen on an H200 node:
    - torch's cpp_extension: the real ninja first on PATH (`uv build` puts the environment's
      bin/ before the shim) and `-j MAX_JOBS` only when MAX_JOBS is a number;
    - a driver calling `ninja -j8` by name (its own number; the shim drops it).
    The cache entry is written only when the build finished."""

    def builder(pkg, python, archs, *, echo, given, cache, child_env, pool):
        started.append(pkg.name)
        env = {**os.environ, **pool, **jobserver.driver_env({})}
        if pkg.name.startswith("t"):  # torch-like
            env["PATH"] = f"{Path(NINJA).parent}{os.pathsep}{env['PATH']}"
            jobs = env["MAX_JOBS"]
            argv = [NINJA, *(["-j", jobs] if jobs.isdigit() else []), "-C", projects[pkg.name]]
        else:
            argv = ["ninja", "-j8", "-C", projects[pkg.name]]
        r = proc.run(argv, env=env, timeout=600, stream=True, on_line=lambda line: None)
        if not r.ok:
            raise UserError(f"building {pkg.name} failed: {r.tail(3)}", kind="build.failed")
        slot = cache / "wheels" / f"{pkg.name}-key"
        slot.mkdir(parents=True)
        (slot / "meta.json").write_text('{"build_seconds": 1}\n')
        return build.Result(pkg.name, slot, False, 0.0, 1.0, None, {})

    return builder


class Jobs:
    """The commands ninja runs (its children), sampled from /proc every 20 ms; only the ninjas
    building under `within` (tests in parallel, other builds on the machine are not counted)."""

    def __init__(self, within: Path) -> None:
        self.within = str(within).encode()
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            ninjas, parents = set(), []
            for d in Path("/proc").iterdir():
                if not d.name.isdigit():
                    continue
                try:
                    stat = (d / "stat").read_text()
                except OSError:
                    continue
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
                ppid = stat[stat.rindex(")") + 2:].split()[1]
                try:
                    mine = self.within in (d / "cmdline").read_bytes()
                except OSError:
                    mine = False
                if comm == "ninja" and mine:
                    ninjas.add(d.name)
                parents.append(ppid)
            self.peak = max(self.peak, sum(1 for p in parents if p in ninjas))
            self.samples += 1
            time.sleep(0.02)

    def __enter__(self) -> Jobs:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def pkg(name: str) -> Package:
    return Package(name, "1", Source(sha256="0" * 64), gb_per_job=0.1)


def test_two_builds_share_one_pool_of_two_jobs(tmp_path):
    cuda = NVCC.exists()
    projects = {"torchlike": project(tmp_path / "src", "torchlike", 5, cuda=cuda),
                "by-name": project(tmp_path / "src", "by-name", 5)}
    started: list[str] = []
    with Jobs(tmp_path) as jobs:
        outcomes = together.build_together([pkg("torchlike"), pkg("by-name")],
                                           Path(os.sys.executable),
                                           ["9.0"], echo=lambda *a: None,
                                           cache=tmp_path / "cache", jobs=2,
                                           builder=ninja_builder(projects, started))
    assert [o.result is not None for o in outcomes] == [True, True]
    assert sorted(started) == ["by-name", "torchlike"]
    assert jobs.samples > 20
    assert jobs.peak == 2, f"{jobs.peak} compile jobs ran at once in a pool of 2"
    for name in projects:  # every object built
        assert len(list(projects[name].glob("*.o"))) == 5


def test_without_the_pool_the_drivers_own_j_oversubscribes(tmp_path):
    """The control: the same two builds, each with its own -j8 and no pool, run more than two
    compilers at once (so the bound above is the pool's doing)."""
    projects = [project(tmp_path, "a", 5), project(tmp_path, "b", 5)]
    with Jobs(tmp_path) as jobs:
        ps = [proc.run(["ninja", "-j8", "-C", d], timeout=600) for d in projects[:1]]
        threads = [threading.Thread(target=proc.run, args=(["ninja", "-j8", "-C", d],))
                   for d in projects[1:]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert ps[0].ok
    assert jobs.peak > 2


def test_a_failure_stops_the_others_and_keeps_what_finished(tmp_path):
    projects = {"quick": project(tmp_path / "src", "quick", 1, depth=20),
                "broken": project(tmp_path / "src", "broken", 4, broken=3),
                "long": project(tmp_path / "src", "long", 40)}
    started: list[str] = []
    cache = tmp_path / "cache"
    t0 = time.monotonic()
    outcomes = together.build_together(
        [pkg("quick"), pkg("broken"), pkg("long")], Path(os.sys.executable), ["9.0"],
        echo=lambda *a: None, cache=cache, jobs=2, builder=ninja_builder(projects, started))
    took = time.monotonic() - t0
    by = {o.name: o for o in outcomes}
    assert by["quick"].result is not None  # finished: its cache entry stays
    assert (cache / "wheels" / "quick-key" / "meta.json").exists()
    assert by["broken"].error is not None and not by["broken"].stopped
    assert by["long"].result is None and by["long"].stopped  # stopped, not cached
    assert not (cache / "wheels" / "long-key").exists()
    assert len(list(projects["long"].glob("*.o"))) < 40
    assert took < 120
    with pytest.raises(UserError) as e:
        together.raise_for(outcomes)
    assert "broken" in e.value.message and "finished and cached: quick" in e.value.message
    assert "stopped: long" in e.value.message


def test_the_shim_drops_j_and_keeps_the_rest(tmp_path):
    d = jobserver.shim(tmp_path, str(Path(NINJA).parent))
    text = (d / "ninja").read_text()
    assert f"exec '{NINJA}'" in text
    out = tmp_path / "args"
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "ninja").write_text(f'#!/bin/sh\nfor a; do echo "[$a]"; done > {out}\n')
    (fake / "ninja").chmod(0o755)
    (d / "ninja").write_text(text.replace(NINJA, str(fake / "ninja")))
    proc.run([d / "ninja", "-v", "-j", "16", "-C", "x y", "-j8", "all"], timeout=30)
    assert out.read_text().splitlines() == ["[-v]", "[-C]", "[x y]", "[all]"]


def test_an_old_ninja_is_refused_with_the_fix(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "ninja").write_text("#!/bin/sh\necho 1.11.1\n")
    (old / "ninja").chmod(0o755)
    with pytest.raises(UserError) as e:
        jobserver.shim(tmp_path, str(old))
    assert e.value.kind == "build.old-ninja" and "1.11" in e.value.message


def test_an_old_ninja_warning_says_what_it_means(tmp_path, monkeypatch, capsys):
    """Before: `...needs ninja >= 1.13 ...; the kernels build one after another`, without what
    that costs or how to have the pool."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "ninja").write_text("#!/bin/sh\necho 1.11.1\n")
    (old / "ninja").chmod(0o755)
    (old / "python").symlink_to(os.sys.executable)  # the environment's bin/ has no ninja
    monkeypatch.setenv("PATH", f"{old}{os.pathsep}/usr/bin{os.pathsep}/bin")
    pools = []

    def builder(pkg, python, archs, *, echo, given, cache, child_env, pool):
        pools.append(pool)
        return build.Result(pkg.name, cache, False, 0.0, 1.0, None, {})

    outcomes = together.build_together([pkg("a"), pkg("b")], old / "python", ["9.0"],
                                       echo=lambda *a: None, cache=tmp_path / "cache", jobs=2,
                                       builder=builder)
    assert [o.result is not None for o in outcomes] == [True, True] and pools == [None, None]
    err = capsys.readouterr().err.splitlines()
    (warning,) = [line for line in err if line.startswith("warning:")]
    assert "needs ninja >= 1.13" in warning and f"found {old / 'ninja'} 1.11" in warning
    assert "so the 2 kernels build one after another, each with its own compile jobs, " \
           "instead of side by side from one pool of 2; the builds are the same, only " \
           "slower" in warning
    assert err[err.index(warning) + 1].startswith("hint: pip install 'ninja>=1.13' into the ")


def test_pool_width_from_cores_memory_and_cap():
    gib = 2**30
    assert jobserver.size(16, 125 * gib, "free", 5.0).slots == 16
    assert jobserver.size(16, 40 * gib, "free", 5.0).slots == 8
    assert jobserver.size(16, 125 * gib, "free", 5.0, cap=6).slots == 6
    assert jobserver.size(2, 1 * gib, "free", 5.0).slots == 1
    # apex's parallel ninjas each hold an implicit slot: all at once only when they fit
    pk = [Package("a", "1", Source(), parallel_var="P"), pkg("b"), pkg("c")]
    assert together.clients(pk, 16) == {"a": 4, "b": 1, "c": 1}
    assert together.clients(pk, 2) == {"a": 1, "b": 1, "c": 1}


def test_a_pooled_plan_hands_the_pool_to_every_compiler(tmp_path):
    """plan() in the pool: the jobserver in MAKEFLAGS, the shim first on PATH, MAX_JOBS the
    pool's width (a driver's -j is dropped anyway), nvcc joining the pool beside the recipe's
    own flags; the cache key is the same as without the pool (how many jobs is no input)."""
    from megatron_env import profile

    pk = build.packages(profile.load("core_v0.19.0-cu130"))["flash-attn"]
    facts = {"torch": "2.11.0+cu130", "cuda": "13.0", "tag": "cpython-312", "abi": True,
             "platlib": None}
    if not NVCC.exists():
        pytest.skip("needs a CUDA 13 toolkit")
    pool = {"MAKEFLAGS": "-j4 --jobserver-auth=fifo:/x", "PATH": f"/shim{os.pathsep}/bin",
            "MEGATRON_ENV_POOL_SLOTS": "4", "MEGATRON_ENV_POOL_WHY": "one pool",
            "MEGATRON_ENV_POOL_CLIENTS": "1", together.MARK: "m"}
    py = Path(os.sys.executable)
    pooled = build.plan(pk, py, ["9.0"], facts=facts, cache=tmp_path, pool=pool)
    alone = build.plan(pk, py, ["9.0"], facts=facts, cache=tmp_path)
    assert pooled.env["MAKEFLAGS"] == pool["MAKEFLAGS"]
    assert not pooled.env["MAX_JOBS"].isdigit()  # no -j from torch's cpp_extension
    te = build.packages(profile.load("core_v0.19.0-cu130"))["transformer-engine"]
    assert te.pool_env == {"NVTE_BUILD_MAX_JOBS": "0"}  # a bare `cmake --build --parallel`
    assert pooled.env["PATH"].startswith("/shim")
    assert pooled.env["NVCC_APPEND_FLAGS"] == "--split-compile=8 --jobserver"
    assert alone.env.get("NVCC_APPEND_FLAGS") == "--split-compile=8"
    assert "MAKEFLAGS" not in alone.env or alone.env["MAKEFLAGS"] == os.environ.get("MAKEFLAGS")
    assert pooled.key == alone.key
    assert not any("MEGATRON_ENV_" in line for line in pooled.lines())
