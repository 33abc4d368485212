"""Kernel recipes: what a compiled package needs to be fetched, built and proven, declared once.

A recipe is a declaration, like a Spack `package.py`: `megatron_env/recipes/<name>.py` defines
one `RECIPE = Recipe(...)`. It says what does not change from one profile to the next: where the
source comes from, the switches the build reads and how they reach it (environment variables or
`--build-option` config settings), the variable it reads the GPU archs from, the memory one
compile job takes, the compiled modules that must import, its variants, and the GPU check that
proves it computes what PyTorch computes. A profile's `[kernels.<name>]` table pins the source
(sdist version + sha256, or git commit + optional tag + submodule commits) and picks variants;
`resolve` joins the two into a `Package`, the one thing the generic build machinery reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from megatron_env.errors import UserError


@dataclass(frozen=True)
class Variant:
    """An optional part of a package (a setup.py switch): what it sets and what it must yield."""

    name: str
    about: str
    env: Mapping[str, str] = field(default_factory=dict)
    build_options: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    default: bool = False  # built when the profile names no variants


@dataclass(frozen=True)
class Choice:
    """A variant with several values at once (Spack's multi-valued variant): the profile lists
    the values to build under `name`, the build reads them joined by commas from `var`.
    "all" (the default) builds every value, as upstream does."""

    name: str
    about: str
    var: str
    values: tuple[str, ...]  # every value some pinned version can build
    default: tuple[str, ...] = ("all",)
    # each value is a compiled module: those chosen must import after install, and every module
    # of a chosen variant that is one of the values must be chosen (else the profile is refused)
    modules: bool = False


@dataclass(frozen=True)
class Resource:
    """Content placed into the source tree in place of a submodule, pinned by a content hash
    (Spack's `resource(..., when=...)`): used when the submodule's own commit cannot be fetched,
    or when the build reads a few of its paths out of a large repository.

    Active when the profile pins the submodule `replaces` at `when`; another pin checks the
    submodule out whole, as before. Exactly one origin:
    - `wheel` (a file name on the package index) + `sha256`: `take` are directories inside it;
    - `repo` + `commit` + `tree`: `take` are paths at that commit, `tree` the git tree id of
      those paths together (what `git write-tree` gives for an index holding only them), so a
      tarball of them (offline) is checked as strictly as the repository itself.
    Offline, MEGATRON_ENV_SOURCE_<NAME> names a local copy: the wheel, or a directory or tar of
    the `take` paths. `why` says why this stands in for the submodule: the plan prints it."""

    name: str  # also the MEGATRON_ENV_SOURCE_<NAME> variable
    path: str  # where `take` lands in the tree (the submodule's path)
    replaces: str  # the submodule (its path in recipe.submodules) this stands in for
    when: str  # ... when the profile pins it at this commit
    take: tuple[str, ...]
    why: str
    wheel: str = ""
    sha256: str = ""
    repo: str = ""
    commit: str = ""
    tree: str = ""

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha256}" if self.wheel else f"tree:{self.tree}"

    @property
    def origin(self) -> str:
        return self.wheel or f"{self.repo}@{self.commit[:12]}"


@dataclass(frozen=True)
class Recipe:
    name: str  # the distribution; also patches/<name>/<pin>/ and the profile's [kernels.<name>]
    about: str
    source: Literal["sdist", "git"]
    sdist: str = ""  # file name of a release's sdist, "{version}" filled in (sdist recipes)
    repo: str = ""  # upstream repository (git recipes); MEGATRON_ENV_MIRROR_<NAME> replaces it
    submodules: Mapping[str, str] = field(default_factory=dict)  # path -> repo; profile pins each
    resources: tuple[Resource, ...] = ()  # content standing in for a submodule at a given pin
    env: Mapping[str, str] = field(default_factory=dict)  # always in the build's environment
    build_options: tuple[str, ...] = ()  # always passed as config setting --build-option
    metadata_env: Mapping[str, str] = field(default_factory=dict)  # reading metadata, no compile
    archs_var: str = ""  # where the build reads the archs (TORCH_CUDA_ARCH_LIST is always set)
    archs_form: Literal["sm", "dotted"] = "sm"  # "80;90" or "8.0;9.0" in archs_var
    nvcc_threads: int = 0  # NVCC_THREADS: archs one nvcc job compiles at once (0: not set)
    gib_per_job: float = 2.0  # memory one compile job takes per arch it compiles at once
    modules: tuple[str, ...] = ()  # compiled modules that must import, whatever the variants
    libraries: tuple[str, ...] = ()  # the wheel's shared objects (a/b: a/b.*.so) when they are
    #                                  not where the modules' names put them
    site_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # VAR -> dirs
    #          relative to the target environment's site-packages (its nvidia-* wheels), joined
    #          with os.pathsep in front of the caller's VAR: headers a build takes from torch's
    variants: tuple[Variant, ...] = ()
    choices: tuple[Choice, ...] = ()
    parallel_var: str = ""  # builds N extensions at once when this variable says N
    gpu_check: str = ""  # the scripts/gpu_health.py result that proves it on a GPU
    proves: str = ""  # what that check compares, in words
    cuda: bool = True  # needs nvcc
    # what its Python package imports at run time (its install_requires but torch, which the
    # environment has): installed beside the wheel, so a bare image imports what was built
    requires: tuple[str, ...] = ()
    # what its build driver must be told, besides MAX_JOBS (the pool's width), so that its
    # ninja shows the shared pool every object (kernels.pool.driver_env)
    pool_env: Mapping[str, str] = field(default_factory=dict)
    # seconds one object takes to compile, by fnmatch pattern on its name under the build
    # directory (first match wins): the shared pool's order for a first build of a pin, when no
    # earlier build of the same pins left its ninja log (kernels.schedule)
    object_seconds: tuple[tuple[str, float], ...] = ()

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    @property
    def default_variants(self) -> list[str]:
        return [v.name for v in self.variants if v.default]


@dataclass(frozen=True)
class Source:
    """An sdist (url or path + sha256) or a git repository at a commit (and optional tag), with
    its submodules pinned as (path, repository, commit)."""

    sha256: str | None = None
    url: str | None = None
    repo: str | None = None
    commit: str | None = None
    tag: str | None = None
    submodules: tuple[tuple[str, str, str], ...] = ()  # checked out whole from git
    resources: tuple[Resource, ...] = ()  # placed from pinned content instead

    @property
    def digest(self) -> str:
        if self.sha256:
            return f"sha256:{self.sha256}"
        return (f"git:{self.commit}" + "".join(f"+{p}@{c}" for p, _r, c in self.submodules)
                + "".join(f"+{r.path}<{r.digest}" for r in self.resources))


@dataclass(frozen=True)
class Package:
    """A recipe resolved against a profile's pins and archs: what one build is given."""

    name: str  # also the patches/<name>/ directory
    pin: str  # version or commit: patches/<name>/<pin>/
    source: Source
    switches: dict[str, str] = field(default_factory=dict)  # build-time environment
    modules: tuple[str, ...] = ()  # compiled modules that must import after install
    cuda: bool = True  # needs nvcc
    gb_per_job: float = 2.0  # memory one compile job can take
    build_options: tuple[str, ...] = ()  # passed as config setting --build-option
    metadata_env: dict[str, str] = field(default_factory=dict)
    variants: tuple[str, ...] = ()
    parallel_var: str = ""  # builds its extensions N at a time when this variable says N
    libraries: tuple[str, ...] = ()  # shared objects the wheel must hold (default: the modules)
    site_paths: dict[str, tuple[str, ...]] = field(default_factory=dict)
    requires: tuple[str, ...] = ()  # run-time requirements (Recipe.requires)
    pool_env: dict[str, str] = field(default_factory=dict)  # Recipe.pool_env
    object_seconds: tuple[tuple[str, float], ...] = ()  # Recipe.object_seconds

    @property
    def wheel_libraries(self) -> tuple[str, ...]:
        """a.b -> a/b (a/b.<abi tag>.so in the wheel)."""
        return self.libraries or tuple(m.replace(".", "/") for m in self.modules)


def source_var(name: str) -> str:
    """MEGATRON_ENV_SOURCE_<NAME>: a path or URL of the pinned sdist (an air-gapped site's copy)."""
    return "MEGATRON_ENV_SOURCE_" + re.sub(r"[^A-Z0-9]", "_", name.upper())


def _archs_text(archs: list[str], form: str) -> str:
    return ";".join(a.replace(".", "") if form == "sm" else a for a in archs)


def resolve(recipe: Recipe, pins: Mapping[str, Any], archs: list[str]) -> Package:
    """The recipe with the profile's pins (a validated [kernels.<name>] table) and archs."""
    chosen = [recipe.variant(n) for n in pins.get("variants", recipe.default_variants)]
    env: dict[str, str] = dict(recipe.env)
    options = list(recipe.build_options)
    modules = list(recipe.modules)
    for v in chosen:
        env.update(v.env)
        options += v.build_options
        modules += [m for m in v.modules if m not in modules]
    picked = []
    for c in recipe.choices:
        values = list(pins.get(c.name, c.default))
        if c.modules and "all" in values:
            continue  # every module the variants switch on: the build's own default, unsaid
        env[c.var] = ",".join(values)
        picked.append(f"{c.name}={','.join(values)}")
        if c.modules:
            if left := [m for m in modules if m in c.values and m not in values]:
                raise UserError(
                    f"{recipe.name}: {c.name} leaves out {', '.join(left)}, which the chosen "
                    f"variants need ({', '.join(v.name for v in chosen)})",
                    fix=f"add {', '.join(left)} to {c.name} in [kernels.{recipe.name}], or "
                        "drop the variant that needs it", kind="recipe.choice-incomplete")
            modules += [m for m in values if m not in modules]
    if recipe.archs_var:
        env[recipe.archs_var] = _archs_text(archs, recipe.archs_form)
    if recipe.nvcc_threads:
        env["NVCC_THREADS"] = str(recipe.nvcc_threads)
    at_once = max(1, min(recipe.nvcc_threads or 1, len(archs)))
    if recipe.source == "sdist":
        version = pins["version"]
        # the file's name on the index; a bundle's copy or MEGATRON_ENV_SOURCE_<NAME> stands in
        # for it where it is fetched (kernels.source_trees.fetch)
        url = recipe.sdist.format(version=version)
        source, pin = Source(sha256=pins["sha256"], url=url), version
    else:
        pinned = pins.get("submodules", {})
        used = tuple(r for r in recipe.resources if pinned.get(r.replaces) == r.when)
        stood_in = {r.replaces for r in used}
        subs = tuple((path, repo, pinned[path]) for path, repo in recipe.submodules.items()
                     if path not in stood_in)
        source = Source(repo=recipe.repo, commit=pins["commit"], tag=pins.get("tag"),
                        submodules=subs, resources=used)
        pin = pins["commit"]
    return Package(recipe.name, pin, source, switches=env, modules=tuple(modules),
                   cuda=recipe.cuda, gb_per_job=recipe.gib_per_job * at_once,
                   build_options=tuple(options), metadata_env=dict(recipe.metadata_env),
                   variants=tuple(v.name for v in chosen) + tuple(picked),
                   parallel_var=recipe.parallel_var, libraries=recipe.libraries,
                   site_paths=dict(recipe.site_paths), requires=recipe.requires,
                   pool_env=dict(recipe.pool_env), object_seconds=recipe.object_seconds)
