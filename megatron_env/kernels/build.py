"""Kernel builds from recipes: source -> patches -> wheel -> cache -> install -> verify.

Derived, not guessed: the build environment comes from the profile and the environment's torch
(CUDA_HOME whose nvcc matches torch.version.cuda, the arch list, MAX_JOBS from free memory and
an estimate of memory per compile job, NVCC_THREADS, ninja). The plan is printed before anything
compiles; `--dry-run` stops there. A wheel is built once per distinct input and kept in a
content-addressed cache (shareable by every node of a cluster); a cache hit installs in seconds
without a compiler. After install every compiled module the package must provide is imported:
a build that silently came out Python-only is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_env import digest, files, mutex, output, proc, recipes
from megatron_env.errors import UserError
from megatron_env.host import resources
from megatron_env.kernels import compiler, libstdcxx
from megatron_env.kernels.jobs import Jobs, derive
from megatron_env.kernels.pool import Pool, driver_env
from megatron_env.kernels.source_trees import patched
from megatron_env.kernels.toolkit import cuda_home, site_paths
from megatron_env.profile import Profile
from megatron_env.pyenv import aside, manifest, probe, uv
from megatron_env.recipes import recipe
from megatron_env.recipes.recipe import Package
from megatron_env.sources import patches, repos
from megatron_env.sources.given import Given

CACHE_DIR_ENV = repos.CACHE_ENV


def packages(profile: Profile, archs: list[str] | None = None) -> dict[str, Package]:
    """The kernel packages the profile builds: each [kernels.<name>] table with its recipe
    (but those with `build = false`)."""
    archs = archs or profile.archs
    return {name: recipe.resolve(recipes.get(name), pins, archs)
            for name, pins in profile.kernels.items() if pins.get("build", True)}


def cache_dir() -> Path:
    return repos.cache_dir()

# --- the build environment -------------------------------------------------------------------


@dataclass
class Plan:
    package: Package
    python: Path
    torch: dict[str, Any]
    patches: list[Path]
    env: dict[str, str]
    key: str
    max_jobs: int
    why_jobs: str
    # what the key is made of (bundles select by it)
    key_doc: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> list[str]:
        p = self.package
        out = [f"{p.name} {p.pin}" + (f" +{' +'.join(p.variants)}" if p.variants else ""),
               f"  source   {p.source.url or p.source.repo} ({p.source.digest})",
               *(f"  resource {r.path}/{{{','.join(r.take)}}} from {r.origin} ({r.digest[:19]}), "
                 f"for {r.replaces}@{r.when[:8]}: {r.why}" for r in p.source.resources),
               "  patches  " + (", ".join(x.name for x in self.patches) or "none"),
               f"  torch    {self.torch['torch']} (CUDA {self.torch['cuda']}, "
               f"{self.torch['tag']}, cxx11abi={self.torch['abi']})",
               f"  jobs     MAX_JOBS={self.max_jobs} ({self.why_jobs})"]
        # what the build is given, also where the caller's environment already said the same
        shown = {*p.switches, "CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS",
                 *filter(None, [p.parallel_var])}
        flags = {k: v for k, v in self.env.items()
                 if k in shown or k not in os.environ or os.environ[k] != v}
        out.append("  flags    " + " ".join(f"{k}={v}" for k, v in sorted(flags.items())
                                          if k != "PATH" and not k.startswith("MEGATRON_ENV_")
                                          and k not in POOL_PLUMBING))
        if p.build_options:
            out.append("  options  --build-option=" + " ".join(p.build_options))
        out.append(f"  cache    {self.key}")
        return out


def max_jobs(gb_per_job: float, parallel_var: str = "") -> Jobs:
    """From free memory, not from cores: one nvcc job can take several GiB. A package that
    builds several extensions at once gets both numbers (see jobs.derive)."""
    avail, source = resources.memory()
    return derive(gb_per_job, avail, source, resources.cores(), parallel_var,
                           os.environ)


def recipe_inputs(pkg: Package, series: list[Path], archs: list[str]) -> dict[str, Any]:
    """What a build is made from that the profile decides (its source, patches, archs, switches
    and options): the setup chain's builds step digests this, the cache key adds the torch the
    build is for (cache_key_doc). One definition: the two cannot disagree about what counts."""
    return {"source": pkg.source.digest, "patches": digest.of_files(series),
            "archs": sorted(archs) if pkg.cuda else [],
            "switches": pkg.switches, "build_options": list(pkg.build_options)}


def cache_key_doc(pkg: Package, series: list[Path], torch: str, cuda: str, python_tag: str,
                  abi: object, archs: list[str]) -> dict[str, Any]:
    """What a build's cache key is made of: one definition for the build and for lock-diff."""
    return {**recipe_inputs(pkg, series, archs), "torch": torch, "cuda": cuda,
            "python": python_tag, "cxx11_abi": abi}


def static_key_docs(profile: Profile, torch: str, patch_root: Path
                    ) -> dict[str, dict[str, Any]]:
    """recipe -> its cache key document as far as it is known without an environment: torch is
    the lock's pin (the installed one adds a local tag such as +cu130), CUDA the profile's, the
    Python tag from the profile, the C++ ABI left out (torch decides it at run time). Two of
    these differ exactly when a build's real key will (lock-diff: which kernels every node
    rebuilds)."""
    tag = "cpython-" + profile.python.replace(".", "")  # sys.implementation.cache_tag
    return {name: cache_key_doc(pkg, patches.series(name, pkg.pin, patch_root), torch,
                                profile.cuda, tag, None, profile.archs)
            for name, pkg in packages(profile).items()}


def plan(pkg: Package, python: Path, archs: list[str], patch_root: Path | None = None,
         facts: dict[str, Any] | None = None, cache: Path | None = None,
         pool: Pool | None = None) -> Plan:
    """`facts`: probe.torch_facts(python) when the caller has them already (one torch import);
    `cache`: the build cache (default: cache_dir()); `pool`: the shared pool of compile jobs
    (kernels.together), in place of this build's own job counts."""
    cache = cache or cache_dir()
    facts = facts or torch_facts(python, cache)
    series = patches.series(pkg.name, pkg.pin, patch_root or patches.PATCHES_DIR)
    build_env = {**os.environ, **pkg.switches,
                 "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if pkg.cuda:
        home, _release = cuda_home(facts["cuda"])
        build_env["CUDA_HOME"] = str(home)
        build_env["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
    build_env.update(site_paths(pkg, facts.get("platlib")))
    fixed = libstdcxx.shared_libstdcxx(build_env, cache)
    build_env.update(fixed)
    derived = max_jobs(pkg.gb_per_job, pkg.parallel_var)
    jobs, why = derived.max_jobs, derived.why
    build_env["MAX_JOBS"] = str(jobs)
    if pkg.parallel_var:
        build_env[pkg.parallel_var] = str(derived.extensions)
    if pool:  # one pool of compile jobs for every kernel: its width, not this build's own -j
        build_env.update(pool.env)
        jobs, why = pool.slots, pool.why
        build_env.pop("CMAKE_BUILD_PARALLEL_LEVEL", None)
        build_env.update(driver_env(pkg.pool_env, pool.width))
        if pkg.parallel_var:
            build_env[pkg.parallel_var] = str(pool.clients)
        build_env.update(_slot_launchers(pool.client,
                                         build_env.get("CUDA_HOME") if pkg.cuda else None))
    elif not proc.which("ninja", path=build_env["PATH"]):
        why += "; ninja missing: builds will be serial"
    key_doc = cache_key_doc(pkg, series, facts["torch"], facts["cuda"], facts["tag"],
                            facts["abi"], archs)
    if fixed:  # wheels linked before the fix carry a static libstdc++: another key
        key_doc["libstdcxx"] = "shared"
    key = digest.hexpart(digest.of(key_doc), 32)
    return Plan(pkg, python, facts, series, build_env, f"{pkg.name}-{key}", jobs, why, key_doc)


POOL_PLUMBING = frozenset({"PYTORCH_NVCC", *(f"CMAKE_{lang}_COMPILER_LAUNCHER"
                                              for lang in ("C", "CXX", "CUDA"))})


def _slot_launchers(client: str, cuda_home: str | None) -> dict[str, str]:
    """Where the compilers that PATH does not reach go through the pool's slot client:
    torch's nvcc (PYTORCH_NVCC, a command line in its ninja file) and CMake's compilers
    (CMAKE_<LANG>_COMPILER_LAUNCHER; a compiler inside a granted job takes no second slot).
    nvcc keeps the recipe's --split-compile=N: it asks for N slots and runs on those it gets."""
    out = {f"CMAKE_{lang}_COMPILER_LAUNCHER": client for lang in ("C", "CXX", "CUDA")}
    if cuda_home:
        out["PYTORCH_NVCC"] = f"{client} {Path(cuda_home) / 'bin' / 'nvcc'}"
    return out


def torch_facts(python: Path, cache: Path | None = None) -> dict[str, Any]:
    """probe.torch_facts, remembered in the cache under torch's stamp (its _C extension's path,
    size and mtime): the C++ ABI needs `import torch` (seconds), the rest is read from files.
    A cache hit thus costs no torch import before the install check's one."""
    cheap = probe.torch_stamp(python)
    if not cheap.get("stamp") or not cheap.get("torch"):
        return probe.torch_facts(python)  # its error says what is wrong
    known = (cache or cache_dir()) / "facts" / f"{digest.hexpart(digest.of(cheap), 24)}.json"
    facts, _why = files.read_json(known)
    if isinstance(facts, dict):
        return facts
    facts = probe.torch_facts(python)
    files.write_text(known, json.dumps(facts))
    return facts


def installed_from(wheel: Path, platlib: str | None) -> bool:
    """Is the wheel's content already installed in `platlib`, file for file (the installed
    RECORD names every file of the wheel with the same hash, and each is there at its size)?
    Then a reinstall would rewrite the same bytes: a repeated cache hit skips it."""
    if not platlib:
        return False
    with zipfile.ZipFile(wheel) as z:
        record = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record is None:
            return False
        info = record.rsplit("/", 1)[0]
        want = {tuple(line.split(",")[:3]) for line in z.read(record).decode().splitlines()
                if line and not line.startswith(info + "/")}
    try:
        have = (Path(platlib) / info / "RECORD").read_text().splitlines()
    except OSError:
        return False
    have_set = {tuple(line.split(",")[:3]) for line in have if line}
    if not want <= have_set:
        return False
    for path, _hash, size in want:
        try:
            if size and (Path(platlib) / path).stat().st_size != int(size):
                return False
        except (OSError, ValueError):
            return False
    return True


# --- build, cache, install, verify -----------------------------------------------------------


@dataclass
class Result:
    package: str
    wheel: Path
    cache_hit: bool
    seconds: float
    build_seconds: float | None
    log: Path | None
    modules: dict[str, str]


def build_and_install(pkg: Package, python: Path, archs: list[str], *, dry_run: bool = False,
                      patch_root: Path | None = None, echo: output.Echo = output.status,
                      given: Given | None = None, cache: Path | None = None,
                      child_env: Mapping[str, str] | None = None,
                      pool: Pool | None = None) -> Result | Plan:
    """`given`: a bundle's sources; `cache`: the build cache (default MEGATRON_ENV_CACHE);
    `child_env`: what uv is told besides (a bundle's offline settings); `pool`: the shared
    pool of compile jobs (kernels.together)."""
    t0 = time.monotonic()
    cache = cache or cache_dir()
    p = plan(pkg, python, archs, patch_root, cache=cache, pool=pool)
    for line in p.lines():
        echo(line)
    if dry_run:
        return p
    slot = cache / "wheels" / p.key
    slot.parent.mkdir(parents=True, exist_ok=True)
    built_in = None
    log = None
    with mutex.exclusive(Path(str(slot) + ".lock"), f"{pkg.name}: another build of this key "
                           f"is running ({slot}.lock); waiting for it", echo):  # one per key
        found = compiler.cached(slot)  # checked against its record at every use
        hit = found is not None
        if found is None:
            _sweep(p.key, cache)
            tree = patched(pkg, p.patches, echo, given=given, cache=cache)
            work = files.temp_for(cache / "build" / p.key)
            work.parent.mkdir(parents=True, exist_ok=True)
            log = cache / "logs" / f"{p.key}-{time.strftime('%Y%m%d%H%M%S')}.log"
            try:  # the tree and its objects take GBs: gone on success and on failure alike
                shutil.copytree(tree, work, symlinks=True)
                built_in, wheel = compiler.compile_wheel(pkg.name, p.python, p.env,
                                                         pkg.build_options, work, log, echo)
                if absent := compiler.missing_libraries(wheel, pkg.wheel_libraries):
                    raise UserError(
                        f"{pkg.name}: the wheel has no compiled {', '.join(absent)}; it was "
                        "not cached", fix="a Python-only build is not a build: check the build "
                                          f"log ({log}) for skipped extensions",
                        kind="build.python-only")
                if own := libstdcxx.own_copies(wheel):
                    raise UserError(
                        f"{pkg.name}: {', '.join(own)} carries its own libstdc++ ("
                        f"{max(own.values())} basic_ostream symbols exported); it was not cached: "
                        "a TORCH_CHECK formatting a number can crash in it",
                        fix="the compiler linked libstdc++ statically: give it a libstdc++.so "
                            f"(LDFLAGS=-L<dir>), or use a complete g++ (log: {log})",
                        kind="build.static-libstdcxx")
                with files.publishing(slot, tree=True) as staging:
                    shutil.copy(wheel, staging / wheel.name)
                    timings = compiler.keep_ninja_logs(work, staging / "ninja-logs")
                    (staging / "meta.json").write_text(json.dumps(
                        {"plan": p.lines(), "max_jobs": p.max_jobs, "why_jobs": p.why_jobs,
                         "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         "build_seconds": built_in, "log": str(log), "ninja": timings,
                         "key": p.key_doc, "wheel_sha256": digest.file_hex(wheel)},
                        indent=2) + "\n")
            finally:
                for d in (work, compiler.dist_dir(work)):
                    shutil.rmtree(d, ignore_errors=True)
            found = compiler.cached(slot)
    if found is None:  # published by another run meanwhile, and not intact
        raise UserError(f"{pkg.name}: the cached build {slot} changed while it was being used",
                        fix="run the build again", kind="build.cache-changed")
    wheel = found
    t_install = time.monotonic()
    # all or nothing (pyenv/aside.py): an interrupt or a failure of the (re)install puts the
    # kernel's files back as they were; never half a kernel in the live environment. Set
    # aside in site-packages, which the install must be able to write anyway (an adopted
    # interpreter's root, /usr in a container, may not be writable)
    platlib = p.torch.get("platlib")
    with aside.reinstalling(Path(platlib) if platlib else aside.root_of(python),
                            probe.sites(python), {manifest.normalize(pkg.name)}, echo):
        if hit and installed_from(wheel, platlib):
            echo(f"{pkg.name}: cache hit, {wheel.name} is installed already (same files)")
        else:
            echo(f"{pkg.name}: {'cache hit, installing' if hit else 'installing'} {wheel.name}")
            r = proc.run([uv.exe(), "pip", "install", "--python", python, "--no-deps",
                          "--reinstall", wheel], env=uv.env(**(child_env or {})), timeout=1800)
            uv.raise_for_cache(r)
            if not r.ok:
                raise UserError(f"installing {wheel.name} failed: {r.tail(5)}",
                                kind="build.install-failed")
        _install_requires(pkg, python, child_env)
    t_verify = time.monotonic()
    missing, facts = probe.imports(python, pkg.modules)
    echo(f"{pkg.name}: plan {t_install - t0 - (built_in or 0):.1f} s, install "
         f"{t_verify - t_install:.1f} s, import check {time.monotonic() - t_verify:.1f} s"
         + (f", build {built_in:.0f} s" if built_in else ""))
    if missing:
        raise UserError(f"{pkg.name} installed without its compiled modules "
                        f"{', '.join(missing)}: " + "; ".join(facts["errors"])[-500:],
                        fix="a Python-only build is not a build: check the build log "
                            f"({log or slot / 'meta.json'}) for skipped extensions",
                        kind="build.python-only")
    return Result(pkg.name, wheel, hit, time.monotonic() - t0, built_in, log,
                  facts["imported"])


def _install_requires(pkg: Package, python: Path, child_env: Mapping[str, str] | None) -> None:
    """What the package imports at run time (Recipe.requires), installed where missing; what
    the environment has already satisfied is not moved (uv pip install, no --upgrade)."""
    if not pkg.requires:
        return
    r = proc.run([uv.exe(), "pip", "install", "--python", python, *pkg.requires],
                 env=uv.env(**(child_env or {})), timeout=1800)
    uv.raise_for_cache(r)
    if not r.ok:
        raise UserError(f"{pkg.name} needs {', '.join(pkg.requires)} at run time; installing "
                        f"them failed: {r.tail(5)}",
                        fix="a bundle carries them among its wheels (make it again with this "
                            "version), or install them into the environment",
                        kind="build.requires-failed")


def _sweep(key: str, cache: Path) -> None:
    """Remove what killed builds of this key left: only what is provably dead (the key's lock
    is a courtesy a shared filesystem may not honour across nodes)."""
    for sub in ("build", "wheels"):
        files.sweep(cache / sub, key)


def selected(profile: Profile, which: str, archs: list[str]) -> list[Package]:
    """`all` (the profile's kernels) or one declared recipe, also one the profile does not pin
    (then the error says which lines the profile needs)."""
    pkgs = packages(profile, archs)
    if which == "all":
        return list(pkgs.values())
    recipes.get(which)  # an unknown name: the error lists the declared recipes
    if which not in pkgs and which in profile.kernels:
        raise UserError(f"profile {profile.name} says build = false for {which}",
                        fix=f"remove `build = false` from [kernels.{which}] in {profile.path}",
                        kind="recipe.build-disabled")
    if which not in pkgs:
        raise UserError(f"profile {profile.name} pins no {which}",
                        fix=f"add a [kernels.{which}] table to {profile.path}",
                        kind="recipe.not-pinned")
    return [pkgs[which]]
