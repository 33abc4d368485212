"""Kernels built together from one pool of compile jobs (kernels.slots), with real ninja and
real compilers: the compilers running at once (sampled from /proc) never exceed the pool, the
longest waiting object starts first, a failure in one build stops the others, and what finished
stays in the cache. The builder is a plain ninja build of small C++ (and, where nvcc 13 is
installed, CUDA) objects shaped like a kernel build: its driver passes its own -j, as torch's
cpp_extension and CMake do, which the pool's ninja shim replaces by the pool's width."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from megatron_env import proc
from megatron_env.errors import UserError
from megatron_env.kernels import build, together
from megatron_env.kernels import pool as pools
from megatron_env.recipes.recipe import Package, Source

NINJA = proc.which("ninja", path=f"{Path(os.sys.executable).parent}{os.pathsep}"
                                 f"{os.environ.get('PATH', '')}")
NVCC = Path("/usr/local/cuda-13.0/bin/nvcc")
pytestmark = pytest.mark.skipif(not NINJA, reason="needs ninja (pip install ninja)")

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
             # nvcc through the pool's client, as torch (PYTORCH_NVCC) and CMake (its launcher)
             # run it in a pooled build: its host compiler's steps hold no slot of their own
             f"rule nvcc\n  command = $$MEGATRON_ENV_SLOT_CLIENT {NVCC} -O1 -c $in -o $out "
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


def ninja_builder(projects: dict[str, Path], started: list[str],
                  after: dict[str, Path] | None = None):
    """A kernel build of the same shape, with both kinds of driver seen on an H200 node:
    - torch's cpp_extension: the real ninja first on PATH (`uv build` puts the environment's
      bin/ before the shim) and `-j MAX_JOBS` only when MAX_JOBS is a number;
    - a driver calling `ninja -j8` by name (its own number; the shim drops it).
    The cache entry is written only when the build finished. `after`: a build starts its ninja
    only once that file exists (an order between builds that no scheduling can change)."""

    def builder(pkg, python, archs, *, echo, given, cache, child_env, pool):
        started.append(pkg.name)
        wait_for = (after or {}).get(pkg.name)
        deadline = time.monotonic() + 300
        while wait_for is not None and not wait_for.exists():
            if time.monotonic() > deadline:
                raise UserError(f"{pkg.name}: {wait_for} never appeared", kind="build.failed")
            time.sleep(0.05)
        env = {**os.environ, **pool.env, **pools.driver_env({}, pool.width)}
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
    """The compilers running (cc1plus, and nvcc's cicc and ptxas) whose working directory is
    under `within` (tests in parallel, other builds on the machine are not counted), sampled
    from /proc every 20 ms. A job waiting for its slot is a Python process: not counted."""

    COMPILERS = ("cc1plus", "cicc", "ptxas")

    def __init__(self, within: Path) -> None:
        self.within = str(within)
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            n = 0
            for d in Path("/proc").iterdir():
                if not d.name.isdigit():
                    continue
                try:
                    if (d / "comm").read_text().strip() in self.COMPILERS and \
                            os.readlink(d / "cwd").startswith(self.within):
                        n += 1
                except OSError:
                    continue
            self.peak = max(self.peak, n)
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
    # ordered, not raced: `broken` and `long` start once `quick` is cached (on a busy machine
    # `broken` failed before `quick` finished, and `quick` was stopped)
    quick_done = cache / "wheels" / "quick-key" / "meta.json"
    outcomes = together.build_together(
        [pkg("quick"), pkg("broken"), pkg("long")], Path(os.sys.executable), ["9.0"],
        echo=lambda *a: None, cache=cache, jobs=2,
        builder=ninja_builder(projects, started, {"broken": quick_done, "long": quick_done}))
    by = {o.name: o for o in outcomes}
    assert by["quick"].result is not None  # finished: its cache entry stays
    assert (cache / "wheels" / "quick-key" / "meta.json").exists()
    assert by["broken"].error is not None and not by["broken"].stopped
    assert by["long"].result is None and by["long"].stopped  # stopped, not cached
    assert not (cache / "wheels" / "long-key").exists()
    assert len(list(projects["long"].glob("*.o"))) < 40  # stopped midway, not run out
    with pytest.raises(UserError) as e:
        together.raise_for(outcomes)
    assert "broken" in e.value.message and "finished and cached: quick" in e.value.message
    assert "stopped: long" in e.value.message


def test_the_shim_sets_the_width_and_keeps_the_rest(tmp_path):
    d = pools.shim(tmp_path, str(Path(NINJA).parent), 72)
    text = (d / "ninja").read_text()
    assert f"exec '{NINJA}'" in text
    out = tmp_path / "args"
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "ninja").write_text(f'#!/bin/sh\nfor a; do echo "[$a]"; done > {out}\n')
    (fake / "ninja").chmod(0o755)
    (d / "ninja").write_text(text.replace(NINJA, str(fake / "ninja")))
    proc.run([d / "ninja", "-v", "-j", "16", "-C", "x y", "-j8", "all"], timeout=30)
    assert out.read_text().splitlines() == ["[-j72]", "[-v]", "[-C]", "[x y]", "[all]"]


def test_no_ninja_is_refused_with_the_fix(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError) as e:
        pools.shim(tmp_path, str(tmp_path / "empty"), 8)
    assert e.value.kind == "build.no-ninja"


def test_the_no_ninja_warning_says_what_it_means(tmp_path, monkeypatch, capsys):
    """Before: `...needs ninja; found none; the kernels build one after another`, without what
    that costs or the fix (the hint was dropped)."""
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "python").symlink_to(os.sys.executable)  # the environment's bin/ has no ninja
    monkeypatch.setenv("PATH", str(bare))  # nor has anything else on PATH
    pools = []

    def builder(pkg, python, archs, *, echo, given, cache, child_env, pool):
        pools.append(pool)
        return build.Result(pkg.name, cache, False, 0.0, 1.0, None, {})

    outcomes = together.build_together([pkg("a"), pkg("b")], bare / "python", ["9.0"],
                                       echo=lambda *a: None, cache=tmp_path / "cache", jobs=2,
                                       builder=builder)
    assert [o.result is not None for o in outcomes] == [True, True] and pools == [None, None]
    err = capsys.readouterr().err.splitlines()
    (warning,) = [line for line in err if line.startswith("warning:")]
    assert "needs ninja; found none" in warning
    assert "so the 2 kernels build one after another, each with its own compile jobs, " \
           "instead of side by side from one pool of 2; the builds are the same, only " \
           "slower" in warning
    assert err[err.index(warning) + 1].startswith("hint: pip install ninja where the build runs")


def test_pool_width_from_cores_memory_and_cap():
    gib = 2**30
    assert pools.size(16, 125 * gib, "free", 5.0).slots == 16
    assert pools.size(16, 40 * gib, "free", 5.0).slots == 8
    assert pools.size(16, 125 * gib, "free", 5.0, cap=6).slots == 6
    assert pools.size(2, 1 * gib, "free", 5.0).slots == 1
    # apex's extensions wait in the pool holding no slot: as many at once as it has, to 16
    assert together.extensions_at_once(16) == 16
    assert together.extensions_at_once(64) == 16
    assert together.extensions_at_once(2) == 4


def test_a_pooled_plan_hands_the_pool_to_every_compiler(tmp_path):
    """plan() in the pool: the wrappers and the shim first on PATH, MAX_JOBS the pool's width,
    torch's nvcc and CMake's compilers through the slot client, the recipe's nvcc flags as
    they are (no --jobserver: there is none); the cache key is the same as
    without the pool (how many jobs is no input), and the plumbing is not in the plan."""
    from megatron_env import profile

    pk = build.packages(profile.load("core_v0.19.0-cu130"))["flash-attn"]
    facts = {"torch": "2.11.0+cu130", "cuda": "13.0", "tag": "cpython-312", "abi": True,
             "platlib": None}
    if not NVCC.exists():
        pytest.skip("needs a CUDA 13 toolkit")
    pool = pools.Pool({"PATH": f"/slots{os.pathsep}/shim{os.pathsep}/bin",
                       "MEGATRON_ENV_SLOTS": "/s", "MEGATRON_ENV_SLOTS_KERNEL": "flash-attn",
                       "MEGATRON_ENV_SLOT_CLIENT": "/slots/slot", together.MARK: "m"},
                      slots=4, width=24, why="one pool", clients=4, client="/slots/slot")
    py = Path(os.sys.executable)
    pooled = build.plan(pk, py, ["9.0"], facts=facts, cache=tmp_path, pool=pool)
    alone = build.plan(pk, py, ["9.0"], facts=facts, cache=tmp_path)
    assert pooled.env["MAX_JOBS"] == "24"
    assert pooled.env["PATH"].startswith("/slots")
    assert pooled.env["PYTORCH_NVCC"] == f"/slots/slot {pooled.env['CUDA_HOME']}/bin/nvcc"
    assert pooled.env["CMAKE_CUDA_COMPILER_LAUNCHER"] == "/slots/slot"
    # nvcc asks for as many slots as its --split-compile threads, and runs on those it gets
    assert pooled.env["NVCC_APPEND_FLAGS"] == alone.env["NVCC_APPEND_FLAGS"] == "--split-compile=8"
    assert "PYTORCH_NVCC" not in alone.env or alone.env["PYTORCH_NVCC"] == os.environ.get(
        "PYTORCH_NVCC")
    te = build.packages(profile.load("core_v0.19.0-cu130"))["transformer-engine"]
    # empty: TE's build_tools skips it and gives CMake `--parallel <MAX_JOBS>`, the pool's width
    assert te.pool_env == {"NVTE_BUILD_MAX_JOBS": ""}
    assert pooled.key == alone.key
    assert not any("MEGATRON_ENV_" in line or "/slots" in line for line in pooled.lines())


FAKECC = """#!/bin/sh
# fakecc SECONDS -o OUT: a compile job of known length; OUT gets the time it started
date +%s.%N > "$3"
sleep "$1"
"""


def timed_project(root: Path, name: str, seconds: list[float]) -> Path:
    """A ninja build whose objects take the given seconds, each through the pool's client."""
    d = root / name
    d.mkdir(parents=True)
    cc = d / "fakecc"
    cc.write_text(FAKECC)
    cc.chmod(0o755)
    rules = [f"rule cc\n  command = $$MEGATRON_ENV_SLOT_CLIENT {cc} $secs -o $out\n"]
    rules += [f"build o{i}.o: cc\n  secs = {s}\n" for i, s in enumerate(seconds)]
    (d / "build.ninja").write_text("".join(rules))
    return d


def test_the_longest_waiting_object_starts_first_through_the_real_pool(tmp_path):
    """Two slots. `short` asks first (its driver starts 0.5 s earlier) for four objects of
    0.4 s; `long` has one of 2 s. First come, first served would run the short ones first and
    the long one after them; the pool starts the long one as soon as it asks (the slots wait
    for `long`, whose costs are known, before the first grant) and the short ones beside it
    on the other slot."""
    projects = {"short": timed_project(tmp_path / "src", "short", [0.4] * 4),
                "long": timed_project(tmp_path / "src", "long", [2.0])}

    def builder(p, python, archs, *, echo, given, cache, child_env, pool):
        if p.name == "long":
            time.sleep(0.5)
        env = {**os.environ, **pool.env}
        r = proc.run(["ninja", "-j8", "-C", projects[p.name]], env=env, timeout=120)
        assert r.ok, r.tail(5)
        return build.Result(p.name, projects[p.name], False, 0.0, 1.0, None, {})

    pkgs = [Package("short", "1", Source(sha256="0" * 64), gb_per_job=0.1,
                    object_seconds=(("*", 0.4),)),
            Package("long", "1", Source(sha256="1" * 64), gb_per_job=0.1,
                    object_seconds=(("*", 2.0),))]
    outcomes = together.build_together(pkgs, Path(os.sys.executable), ["9.0"],
                                       echo=lambda *a: None, cache=tmp_path / "cache", jobs=2,
                                       builder=builder)
    assert all(o.result for o in outcomes)
    start = {f"{n}/{f.name}": float(f.read_text()) for n, d in projects.items()
             for f in d.glob("*.o")}
    long_at = start["long/o0.o"]
    shorts = sorted(v for k, v in start.items() if k.startswith("short/"))
    # one short object beside the long one, the rest after it: never two before it
    assert shorts[1] > long_at, f"short objects started first: {start}"
    # and never more than two at once: the third short waited for the first to end
    assert shorts[2] >= shorts[0] + 0.35


def test_nvcc_asks_for_its_split_compile_threads_and_runs_on_those_granted():
    from megatron_env.kernels import slot_client as sc

    env = {"NVCC_APPEND_FLAGS": "--split-compile=8 -lineinfo"}
    nvcc = ["/usr/local/cuda/bin/nvcc", "-c", "a.cu", "-o", "a.o"]
    assert sc.split_of(nvcc, env) == 8
    assert sc.split_of(["/usr/bin/g++", "-c", "a.cc"], env) == 1
    assert sc.split_of([*nvcc, "--split-compile", "4"], {}) == 4
    out = sc.resize([*nvcc, "--split-compile", "4"], env, 3)
    assert out[-2:] == ["--split-compile", "3"] and env["NVCC_APPEND_FLAGS"] == \
        "--split-compile=3 -lineinfo"
    assert sc.output_of(nvcc) == "a.o" and sc.output_of(["g++", "-oa.o"]) == "a.o"


def test_a_wide_job_gets_what_is_free_and_the_longest_goes_first():
    from megatron_env.kernels import schedule

    s = schedule.Scheduler(16, widest=8, spare_only=False)
    s.want(1, "a", 50.0)
    s.want(2, "b", 200.0, width=8)
    s.want(3, "b", 190.0, width=8)
    s.want(4, "b", 180.0, width=8)
    assert s.grants(0.0) == [(2, 8), (3, 8)]  # the two longest, eight threads each
    s.done(2)
    assert s.grants(1.0) == [(4, 8)]
    s.done(3)
    assert s.grants(2.0) == [(1, 1)]
    assert s.busy() == 9
    two = schedule.Scheduler(3)  # at most WIDEST (2) slots to one job
    two.want(1, "b", 200.0, width=8)
    two.want(2, "b", 190.0, width=8)
    assert two.grants(0.0) == [(1, 2), (2, 1)]
    spare = schedule.Scheduler(4)  # more than one slot only where no other job waits for it
    for r in range(1, 4):
        spare.want(r, "b", 200.0 - r, width=8)
    assert spare.grants(0.0) == [(1, 2), (2, 1), (3, 1)]
    spare.done(1)
    spare.want(4, "a", 10.0)
    spare.want(5, "a", 9.0)
    assert spare.grants(1.0) == [(4, 1), (5, 1)]  # one slot each: the other waits


def test_probes_try_compiles_and_links_start_at_once_and_hold_no_slot():
    from megatron_env.kernels import schedule

    assert schedule.at_once("") and schedule.at_once("build/lib/x.so")
    assert schedule.at_once("CMakeFiles/cmTC_918dc.dir/CMakeCUDACompilerABI.cu.o")
    assert not schedule.at_once("CMakeFiles/transformer_engine.dir/gemm/g.cu.o")
    s = schedule.Scheduler(1)
    s.want(1, "a", 300.0)
    s.want(2, "a", 200.0)
    assert s.grants(0.0) == [(1, 1)]
    s.want(3, "b", 0.0, at_once=True)
    assert s.grants(0.1) == [(3, 0)]  # the pool is full, the probe runs
    s.done(3)
    assert s.busy() == 1 and s.waiting() == 1

def test_slots_are_held_for_known_long_objects_not_yet_asked_for():
    """A kernel whose costs are known and that has not asked yet: slots stay free for its
    objects that outrank the waiting ones, until it asks or the hold ends; an unknown one
    (None) holds every grant until it asked once."""
    from megatron_env.kernels import schedule

    s = schedule.Scheduler(4, {"long": [300.0, 200.0], "short": [10.0]}, hold_s=30)
    s.want(1, "short", 10.0)
    s.want(2, "short", 10.0)
    s.want(3, "short", 10.0)
    assert [r for r, _n in s.grants(1.0)] == [1, 2]  # two held for "long"
    s.want(4, "long", 300.0)
    assert [r for r, _n in s.grants(2.0)] == [4]  # one still held for its second
    assert [r for r, _n in s.grants(29.0)] == []
    assert [r for r, _n in s.grants(31.0)] == [3]  # the hold is over
    u = schedule.Scheduler(4, {"unknown": None}, hold_s=30)
    u.want(1, "short", 10.0)
    assert u.grants(1.0) == []
    u.want(2, "unknown", 5.0)
    assert [r for r, _n in u.grants(2.0)] == [1, 2]


def test_costs_from_a_recorded_build_chain_its_stages():
    """The recorded H100 setup's logs (bench/results): transformer-engine's CMake objects
    carry the ~60 s its torch extension takes after them on 16 slots; apex's extensions, side
    by side, carry nothing; an object not recorded gates the rest of its kernel."""
    from megatron_env.kernels import ninjalog, schedule

    rec = Path(__file__).parent.parent / "bench" / "results" / "2026-12-05-h100-cold-setup-e883413"

    def logs(k):
        return [(f.name, [s for s in ninjalog.parse(f.read_text()) if s.output.endswith(".o")])
                for f in sorted((rec / k).glob("*.ninja_log"))]

    te = schedule.from_logs("transformer-engine", logs("transformer-engine"), slots=16)
    gelu = te.of("CMakeFiles/transformer_engine.dir/activation/gelu.cu.o")
    assert 144 + 58 < gelu < 144 + 60  # 144 s itself, 937 s of extension / 16 slots after it
    assert te.of("/x/build/temp.linux-x86_64-cpython-312/transformer_engine/pytorch/csrc/"
                 "extensions/pybind.o") < 60
    assert te.of("libtransformer_engine.so") == te.longest
    ax = schedule.from_logs("apex", logs("apex"), slots=16)
    assert ax.of("temp.linux-x86_64-cpython-312/scaled_upper_triang_masked_softmax_cuda/csrc/"
                 "megatron/scaled_upper_triang_masked_softmax_cuda.o") == 104.1
    assert len(ax.ready) == 37 and len(te.ready) == 92
