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
import re
import shutil
import tarfile
import time
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from . import (
    digest,
    ninjalog,
    output,
    parsers,
    patches,
    probe,
    proc,
    recipe,
    recipes,
    resources,
    sources,
    uv,
    waiting,
)
from . import jobs as jobs_mod
from .errors import UserError
from .profile import Profile
from .recipe import Package, source_var

CACHE_DIR_ENV = sources.CACHE_ENV
GIB = 2**30


def packages(profile: Profile, archs: list[str] | None = None) -> dict[str, Package]:
    """The kernel packages the profile builds: each [kernels.<name>] table with its recipe."""
    archs = archs or profile.archs
    return {name: recipe.resolve(recipes.get(name), pins, archs)
            for name, pins in profile.kernels.items()}


def cache_dir() -> Path:
    return sources.cache_dir()


# --- sources ---------------------------------------------------------------------------------


def fetch(pkg: Package, python: Path, echo=output.status) -> Path:
    """The pristine source tree, fetched once into the cache and verified by hash or commit."""
    src = pkg.source
    if src.repo:
        dest = cache_dir() / "src" / f"{pkg.name}-{src.commit[:12]}"
        if src.submodules:
            dest = dest.with_name(f"{dest.name}-{digest.hexpart(digest.of(src.digest), 8)}")
        if not (dest / ".megatron-env-pristine").exists():
            for name, repo, commit, tag, path in git_sources(pkg):
                sources.checkout(name, repo, tag, commit, dest / path, echo=echo)
            (dest / ".megatron-env-pristine").write_text(src.digest + "\n")
        return dest
    archive = sdist_archive(pkg)
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        tmp = archive.with_suffix(f".tmp-{os.getpid()}")
        _download(pkg, python, tmp, echo)
        got = digest.hexpart(digest.of_file(tmp), 64)
        if got != src.sha256:
            tmp.unlink()
            raise UserError(f"{pkg.name} source {src.url}: sha256 {got}, the profile pins "
                            f"{src.sha256}", fix="the file was changed or is another version: "
                                                 "use the original sdist")
        os.replace(tmp, archive)
    dest = cache_dir() / "src" / f"{pkg.name}-{src.sha256[:12]}"
    if not (dest / ".megatron-env-pristine").exists():
        tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        tops = list(tmp.iterdir())
        root = tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp
        (root / ".megatron-env-pristine").write_text(src.sha256 + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(root, dest)
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def git_sources(pkg: Package) -> list[tuple[str, str, str, str | None, str]]:
    """(name, repository, commit, tag, path in the tree) of a git-sourced package: the package
    itself, then each submodule at the commit the profile pins (not the parent's index). A
    submodule is named `<package>/<path>`: its MEGATRON_ENV_MIRROR_ variable and its repository
    in a bundle follow from the name."""
    src = pkg.source
    if not src.repo or not src.commit:
        return []
    return [(pkg.name, src.repo, src.commit, src.tag, ""),
            *((f"{pkg.name}/{path}", repo, commit, None, path)
              for path, repo, commit in src.submodules)]


def sdist_archive(pkg: Package) -> Path:
    """Where the cache keeps a package's verified sdist (named by its sha256)."""
    return cache_dir() / "sdists" / f"{pkg.source.sha256}.tar.gz"


def _download(pkg: Package, python: Path, target: Path, echo) -> None:
    url = pkg.source.url or ""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("http", "https", "file"):
        echo(f"{pkg.name}: downloading {url}")
        try:
            urllib.request.urlretrieve(url, target)
        except OSError as e:
            raise UserError(f"cannot download {url}: {e}",
                            fix=f"set {source_var(pkg.name)} to a reachable copy, or pass "
                                "--no-builds to `invoke setup` to go on without the kernels"
                            ) from None
        return
    if Path(url).is_file():
        shutil.copy(url, target)
        return
    # A bare file name: ask the configured package index (pip's configuration) for the sdist.
    # pip runs its setup.py for metadata, which may import torch: hence the environment's own
    # interpreter (pip added to it if missing) and the recipe's metadata_env (no compiling).
    echo(f"{pkg.name}: fetching the {pkg.pin} sdist from the package index")
    if not proc.run([python, "-m", "pip", "--version"], timeout=60).ok:
        proc.run([uv.exe(), "pip", "install", "--python", python, "pip"], env=uv.env(),
                 timeout=600)
    out = target.parent / f"dl-{os.getpid()}"
    r = proc.run([python, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
                  "--no-binary", ":all:", f"{pkg.name}=={pkg.pin}", "-d", out],
                 env={**os.environ, **pkg.metadata_env}, timeout=1800)
    files = list(out.glob("*.tar.gz")) if out.exists() else []
    if not r.ok or not files:
        shutil.rmtree(out, ignore_errors=True)
        raise UserError(f"cannot fetch the {pkg.name} {pkg.pin} sdist: {r.tail(3)}",
                        fix=f"set {source_var(pkg.name)} to the sdist's path or URL, or pass "
                            "--no-builds to `invoke setup` to go on without the kernels")
    shutil.move(files[0], target)
    shutil.rmtree(out, ignore_errors=True)


# --- the build environment -------------------------------------------------------------------


@dataclass
class Plan:
    package: Package
    python: Path
    torch: dict
    patches: list[Path]
    env: dict[str, str]
    key: str
    max_jobs: int
    why_jobs: str
    key_doc: dict = field(default_factory=dict)  # what the key is made of (bundles select by it)

    def lines(self) -> list[str]:
        p = self.package
        out = [f"{p.name} {p.pin}" + (f" +{' +'.join(p.variants)}" if p.variants else ""),
               f"  source   {p.source.url or p.source.repo} ({p.source.digest})",
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
                                          if k not in ("PATH",)))
        if p.build_options:
            out.append("  options  --build-option=" + " ".join(p.build_options))
        out.append(f"  cache    {self.key}")
        return out


def cuda_home(torch_cuda: str | None) -> tuple[Path | None, str | None]:
    """A toolkit whose nvcc has torch's CUDA major version (refuse a major mismatch).

    A home needs bin/nvcc and include/cuda_runtime.h: an nvcc on PATH may be a wrapper script
    in /usr/local/bin, whose parent is no toolkit, and building against it fails only at the
    first #include, minutes in."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if nvcc := proc.which("nvcc"):
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    candidates += ["/usr/local/cuda", *sorted(map(str, Path("/usr/local").glob("cuda-*")),
                                              reverse=True)]
    seen = []
    for home in dict.fromkeys(filter(None, candidates)):
        nvcc_path = Path(home) / "bin" / "nvcc"
        if not nvcc_path.exists():
            continue
        if not (Path(home) / "include" / "cuda_runtime.h").exists():
            seen.append(f"{home} (no include/cuda_runtime.h)")
            continue
        r = proc.run([nvcc_path, "--version"], timeout=60)
        try:
            release = parsers.nvcc_release(r.output)
        except parsers.ParseError:
            seen.append(f"{home} (nvcc --version unreadable)")
            continue
        seen.append(f"{home} (nvcc {release})")
        if torch_cuda and release.split(".")[0] == torch_cuda.split(".")[0]:
            return Path(home), release
    if not torch_cuda:
        raise UserError("torch in the environment is a CPU build: nothing to build CUDA kernels "
                        "for", fix="build the environment of a CUDA profile")
    raise UserError(
        f"no CUDA {torch_cuda.split('.')[0]}.x toolkit for torch's CUDA {torch_cuda}; found: "
        + (", ".join(seen) or "no nvcc at all"),
        fix=f"install the CUDA {torch_cuda} toolkit (the profile's conda environment has it) "
            "and set CUDA_HOME")


def site_paths(pkg: Package, platlib: str | None) -> dict[str, str]:
    """The recipe's site_paths made absolute in the target environment, in front of the
    caller's value: a build that wants torch's own cuDNN/NCCL headers (nvidia-* wheels), not
    whatever a node has on its default include path."""
    out = {}
    for var, rel in pkg.site_paths.items():
        dirs = [Path(platlib or "") / r for r in rel]
        if absent := [str(d) for d in dirs if not platlib or not d.is_dir()]:
            raise UserError(f"{pkg.name} builds against {', '.join(rel)} of the environment's "
                            f"site-packages; not there: {', '.join(absent)}",
                            fix="install torch with its CUDA wheels (nvidia-*) in the environment "
                                "(`invoke env`), or build in the environment that has them")
        out[var] = os.pathsep.join([*map(str, dirs), *filter(None, [os.environ.get(var)])])
    return out


def max_jobs(gb_per_job: float, parallel_var: str = "") -> jobs_mod.Jobs:
    """From free memory, not from cores: one nvcc job can take several GiB. A package that
    builds several extensions at once gets both numbers (see jobs.derive)."""
    avail, source = resources.memory()
    return jobs_mod.derive(gb_per_job, avail, source, resources.cores(), parallel_var,
                           os.environ)


def plan(pkg: Package, python: Path, archs: list[str], patch_root: Path | None = None,
         facts: dict | None = None) -> Plan:
    """`facts`: probe.torch_facts(python) when the caller has them already (one torch import)."""
    facts = facts or probe.torch_facts(python)
    series = patches.series(pkg.name, pkg.pin, patch_root or patches.PATCHES_DIR)
    build_env = {**os.environ, **pkg.switches,
                 "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if pkg.cuda:
        home, _release = cuda_home(facts["cuda"])
        build_env["CUDA_HOME"] = str(home)
        build_env["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
    build_env.update(site_paths(pkg, facts.get("platlib")))
    derived = max_jobs(pkg.gb_per_job, pkg.parallel_var)
    jobs, why = derived.max_jobs, derived.why
    build_env["MAX_JOBS"] = str(jobs)
    if pkg.parallel_var:
        build_env[pkg.parallel_var] = str(derived.extensions)
    if not proc.which("ninja", path=build_env["PATH"]):
        why += "; ninja missing: builds will be serial"
    key_doc = {"source": pkg.source.digest, "patches": digest.of_files(series),
               "torch": facts["torch"], "cuda": facts["cuda"], "python": facts["tag"],
               "cxx11_abi": facts["abi"], "archs": sorted(archs) if pkg.cuda else [],
               "switches": pkg.switches, "build_options": list(pkg.build_options)}
    key = digest.hexpart(digest.of(key_doc), 32)
    return Plan(pkg, python, facts, series, build_env, f"{pkg.name}-{key}", jobs, why, key_doc)


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
                      patch_root: Path | None = None, echo=output.status) -> Result | Plan:
    t0 = time.monotonic()
    p = plan(pkg, python, archs, patch_root)
    for line in p.lines():
        echo(line)
    if dry_run:
        return p
    slot = cache_dir() / "wheels" / p.key
    slot.parent.mkdir(parents=True, exist_ok=True)
    built_in = None
    log = None
    with waiting.exclusive(Path(str(slot) + ".lock"), f"{pkg.name}: another build of this key "
                           f"is running ({slot}.lock); waiting for it", echo):  # one per key
        wheels = list(slot.glob("*.whl"))
        hit = bool(wheels)
        if not hit:
            _sweep(p.key)
            pristine = fetch(pkg, python, echo=echo)
            work = cache_dir() / "build" / f"{p.key}.tmp-{os.getpid()}"
            work.parent.mkdir(parents=True, exist_ok=True)
            log = cache_dir() / "logs" / f"{p.key}-{time.strftime('%Y%m%d%H%M%S')}.log"
            try:  # the tree and its objects take GBs: gone on success and on failure alike
                patches.apply_series(pristine, work, p.patches)
                for x in p.patches:
                    echo(f"{pkg.name}: applied {x.name}")
                built_in, wheel = _compile(p, work, log, echo)
                if absent := _not_in_wheel(wheel, pkg.wheel_libraries):
                    raise UserError(
                        f"{pkg.name}: the wheel has no compiled {', '.join(absent)}; it was "
                        "not cached", fix="a Python-only build is not a build: check the build "
                                          f"log ({log}) for skipped extensions")
                staging = slot.with_name(slot.name + f".tmp-{os.getpid()}")
                staging.mkdir()
                shutil.copy(wheel, staging / wheel.name)
                timings = _keep_ninja_logs(work, staging / "ninja-logs")
                (staging / "meta.json").write_text(json.dumps(
                    {"plan": p.lines(), "max_jobs": p.max_jobs, "why_jobs": p.why_jobs,
                     "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "build_seconds": built_in, "log": str(log), "ninja": timings,
                     "key": p.key_doc},
                    indent=2) + "\n")
                os.replace(staging, slot)
            finally:
                for d in (work, _dist_dir(work)):
                    shutil.rmtree(d, ignore_errors=True)
            wheels = list(slot.glob("*.whl"))
    wheel = wheels[0]
    echo(f"{pkg.name}: {'cache hit, installing' if hit else 'installing'} {wheel.name}")
    r = proc.run([uv.exe(), "pip", "install", "--python", python, "--no-deps", "--reinstall",
                  wheel], env=uv.env(), timeout=1800)
    if not r.ok:
        raise UserError(f"installing {wheel.name} failed: {r.tail(5)}")
    missing, facts = probe.missing_modules(python, pkg.modules)
    if missing:
        raise UserError(f"{pkg.name} installed without its compiled modules "
                        f"{', '.join(missing)}: " + "; ".join(facts["errors"])[-500:],
                        fix="a Python-only build is not a build: check the build log "
                            f"({log or slot / 'meta.json'}) for skipped extensions")
    return Result(pkg.name, wheel, hit, time.monotonic() - t0, built_in, log,
                  facts["imported"])


def _sweep(key: str) -> None:
    """Remove what killed builds of this key left (the caller holds the key's lock, so no
    living build owns any of it)."""
    for pattern in (f"build/{key}.tmp-*", f"wheels/{key}.tmp-*"):
        for d in cache_dir().glob(pattern):
            shutil.rmtree(d, ignore_errors=True)


def _not_in_wheel(wheel: Path, libraries: tuple[str, ...]) -> list[str]:
    """The libraries (a/b) without a shared object in the wheel (a/b.<abi tag>.so, a/b.so)."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    return [lib for lib in libraries
            if not any(n.startswith(lib + ".") and n.endswith(".so") for n in names)]


def _keep_ninja_logs(work: Path, dest: Path) -> dict:
    """Copy each extension's .ninja_log (per object: start, end) out of the build tree before
    it is removed, and summarise them (slowest objects, parallelism): where the time went."""
    found = sorted(work.rglob(".ninja_log"))
    kept = []
    for i, f in enumerate(found):
        dest.mkdir(parents=True, exist_ok=True)
        kept.append(dest / f"{i:02d}-{f.parent.name}.ninja_log")
        shutil.copy(f, kept[-1])
    try:
        return ninjalog.summary(ninjalog.read(kept))
    except ninjalog.NinjaLogError as e:  # a ninja this module does not read: keep the files
        return {"error": str(e)}


def _dist_dir(work: Path) -> Path:
    return work.parent / f"{work.name}-dist"


_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
_EXTENSION = re.compile(r"-DTORCH_EXTENSION_NAME=(\S+)")


class Progress:
    """Objects compiled over the whole build. torch runs one ninja per extension, each counting
    its own [done/total]; several run at once when extensions build in parallel. Its command
    lines name the extension (-DTORCH_EXTENSION_NAME), which keys the counts."""

    def __init__(self) -> None:
        self.extensions: dict[str, tuple[int, int]] = {}

    def feed(self, line: str) -> bool:
        """Take one line of build output; True when it was a ninja step."""
        if not (m := _NINJA.match(line)):
            return False
        ext = m2.group(1) if (m2 := _EXTENSION.search(line)) else ""
        done, total = int(m.group(1)), int(m.group(2))
        self.extensions[ext] = (max(done, self.extensions.get(ext, (0, 0))[0]), total)
        return True

    def line(self, name: str, elapsed: float) -> str:
        done = sum(d for d, _ in self.extensions.values())
        total = sum(n for _, n in self.extensions.values())
        if len(self.extensions) <= 1:
            return _progress_line(name, done, total, elapsed)
        # the total grows as extensions start: no time-left guess from it
        return (f"{name}: compiled {done}/{total} objects of the {len(self.extensions)} "
                f"extensions started, {elapsed:.0f} s")


def _progress_line(name: str, done: int, total: int, elapsed: float) -> str:
    """'compiled 29/73 objects, 470 s, about 12 min left'.

    The guess is the rate so far; before a quarter of the objects it is mostly the ramp-up of
    the parallel jobs (three times too long on an H200 build of 73 objects), so none is given."""
    line = f"{name}: compiled {done}/{total} objects, {elapsed:.0f} s"
    if total / 4 <= done < total:
        left = elapsed / done * (total - done)
        line += f", about {left / 60:.0f} min left" if left >= 90 else f", about {left:.0f} s left"
    return line


def _compile(p: Plan, work: Path, log: Path, echo) -> tuple[float, Path]:
    out = _dist_dir(work)
    shutil.rmtree(out, ignore_errors=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    echo(f"{p.package.name}: building a wheel (log: {log})")
    last = [0.0]
    counts = Progress()

    def progress(line: str) -> None:
        if counts.feed(line) and time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            echo(counts.line(p.package.name, time.monotonic() - t0))

    # switches a setup.py reads from sys.argv only: setuptools appends them to bdist_wheel's
    options = (["--config-setting=--build-option=" + " ".join(p.package.build_options)]
               if p.package.build_options else [])
    r = proc.run([uv.exe(), "build", "--wheel", "--no-build-isolation", "--python", p.python,
                  *options, "--out-dir", out, work], env={**p.env, "UV_PYTHON_DOWNLOADS": "never"},
                 timeout=None, log=log, stream=True, on_line=progress)
    wheels = list(out.glob("*.whl"))
    if not r.ok or not wheels:
        raise UserError(f"building {p.package.name} failed after {time.monotonic() - t0:.0f} s:"
                        f"\n{r.tail(15)}", fix=f"full log: {log}")
    return time.monotonic() - t0, wheels[0]


def selected(profile: Profile, which: str, archs: list[str]) -> list[Package]:
    """`all` (the profile's kernels) or one declared recipe, also one the profile does not pin
    (then the error says which lines the profile needs)."""
    pkgs = packages(profile, archs)
    if which == "all":
        return list(pkgs.values())
    recipes.get(which)  # an unknown name: the error lists the declared recipes
    if which not in pkgs:
        raise UserError(f"profile {profile.name} pins no {which}",
                        fix=f"add a [kernels.{which}] table to {profile.path}")
    return [pkgs[which]]
