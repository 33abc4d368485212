"""The environment's layers, one command each: `lock`, `lock-diff`, `env`, `build` and
`build-check`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_env import output, project
from megatron_env.commands import cli, places
from megatron_env.commands.cli import command, json_error
from megatron_env.errors import UserError
from megatron_env.findings import Status
from megatron_env.profile import Profile, load_all
from megatron_env.profile import load as load_profile

if TYPE_CHECKING:
    from megatron_env.bundle.offline import Bundle


@command(iterable=("upgrade_package", "channel"),
         profile="profile name (default: the default profile; with --check or --refresh: all)",
         check="exit 1 naming every lock that no longer matches its inputs or its seal "
               "(a pin or hash edited by hand); no network",
         resolve="with --check: resolve again (network) and fail on any difference",
         refresh="re-resolve without the old pins: every package the profile does not pin "
                 "moves to its newest allowed version (no file changes when nothing did)",
         upgrade_package="move this one pin to its newest allowed version (repeatable)",
         python="interpreter of the profile's Python version to resolve with",
         conda="conda/mamba/micromamba executable for conda-lock",
         channel="conda channel or mirror overriding the profile's (repeatable)",
         pypi_to_conda_lookup_file="local name-mapping file for conda-lock's pip section")
def lock(profile: str | None = None, check: bool = False, upgrade_package: list[str] | None = None,
         python: str | None = None, conda: str | None = None, channel: list[str] | None = None,
         pypi_to_conda_lookup_file: str | None = None, resolve: bool = False,
         refresh: bool = False) -> int:
    """Resolve a profile into hashed locks (requirements.lock, environment.yml, conda-lock.yml)."""
    from megatron_env.pyenv import lock, lock_conda

    if check:
        profs = [load_profile(profile)] if profile else load_all()
        problems = [p for prof in profs for p in lock.stale(prof)]
        if resolve and not problems:
            problems = [p for prof in profs for p in lock.resolve_check(prof, python)]
        for p in problems:
            output.result(f"{output.paint('stale')} {p}")
        if problems:
            output.hint("run `invoke lock --profile NAME` and commit the result")
            return 1
        output.summary(f"fresh locks of {len(profs)} profile(s) match their inputs"
                       + (" and a new resolution" if resolve else ""), "fresh")
        return 0
    if refresh and upgrade_package:
        raise UserError("--refresh moves every package; --upgrade-package moves one",
                        fix="pass one of them", kind="input.conflict")
    if project.how() == "shipped":  # the package's own copy: never write into site-packages
        raise UserError(f"the profiles in use are the copy shipped with the package "
                        f"({project.root()}); `lock` writes locks next to them",
                        fix="run it in a checkout of megatron-env, or pass --project DIR "
                            f"(or {project.ENV}) naming one", kind="project.read-only")
    profs = [load_profile(profile)] if profile or not refresh else load_all()
    lookup = Path(pypi_to_conda_lookup_file) if pypi_to_conda_lookup_file else None
    for prof in profs:
        lock_conda.write_environment_yml(prof)
        res = lock.compile_lock(prof, python=python, upgrade=upgrade_package, refresh=refresh)
        lock_conda.conda_lock(prof, solver=conda, lookup=lookup, channels=channel)
        output.summary(f"locked {prof.name}: {res.packages} packages, every file hashed -> "
                       f"{res.path.relative_to(project.root())}"
                       + " (unchanged)" * (not res.changed))
    return 0


@command(name="lock-diff", base="git revision to compare with (default: merge base with main)",
         markdown="print the markdown body of a pull request (the default)",
         json="print the stable JSON document instead (docs/locks.md)",
         profile="this profile only (default: every profile)",
         offline="do not read the package index: sizes and yanked flags left out",
         index_url="the index to read sizes and yanked flags from (default: the installer's: "
                   "uv's, then pip's configuration)",
         max_bytes="with --markdown: cut the body at a table row to at most this many bytes "
                   "(a pull-request comment's limit), saying so at its end")
def lock_diff(base: str | None = None, markdown: bool = False, json: bool = False,
              profile: str | None = None, offline: bool = False,
              index_url: str | None = None, max_bytes: int = 0) -> int:
    """What the lock changes do: packages moved, download size, yanked files, kernel rebuilds."""
    from megatron_env.kernels import build
    from megatron_env.pyenv import lockdiff, lockdiff_markdown
    from megatron_env.sources import index_config

    with json_error(json, "lock-diff"):
        if markdown and json:
            raise UserError("--markdown and --json both given", fix="pass one of them",
                            kind="input.conflict")
        if profile:
            load_profile(profile)  # an unknown name: one clear line
        url = None if offline else index_url or index_config.installer_index()
        report = lockdiff.report(base, profile, kernel_keys=build.static_key_docs, index_url=url)
    text = lockdiff_markdown.render(report, json)
    if max_bytes and not json:
        text = lockdiff_markdown.cut(text, max_bytes, "_(truncated at a table row: the full diff "
                                                      "is in the job summary)_")
    output.result(text)
    return 0


@command(iterable=("find_links", "bundle", "expect_sha256"),
         python="interpreter of the profile's Python for the venv (default: found)",
         adopt="check an existing environment (--python, or this interpreter) instead",
         install_missing="with --adopt: install what the lock has and it lacks",
         use_conda="force the conda path (--no-use-conda forces uv)",
         find_links="a wheelhouse directory to install from (repeatable)",
         no_index="install only from --find-links")
def env(profile: str | None = None, prefix: str | None = None, python: str | None = None,
        adopt: bool = False, install_missing: bool = False, conda: str | None = None,
        use_conda: bool | None = None, find_links: list[str] | None = None,
        no_index: bool = False, verify_deep: bool = False,
        bundle: list[str] | None = None, expect_sha256: list[str] | None = None,
        trust: str | None = None) -> int:
    """Build the profile's environment from its locks and verify it (seconds when unchanged)."""

    from megatron_env.pyenv import env

    python = os.path.abspath(python) if python else None  # probes run in another directory
    b = use_bundle(bundle, profile, (python or sys.executable) if adopt else python,
                    None, "--adopt --python PYTHON", provenance=(expect_sha256, trust))
    prof = b.profile if b else load_profile(profile)
    if b:
        find_links, no_index = [*(find_links or []), *b.find_links], True
    if adopt:
        v = env.adopt(prof, python, install_missing, find_links, no_index,
                      child_env=b.child_env() if b else None)
        f = v.facts
        output.result(f"adopted {f['executable']}: Python {f['python']}, torch {f.get('torch')}"
                      f", CUDA {f.get('torch_cuda')}, cuDNN {f.get('cudnn')}, NCCL "
                      f"{f.get('nccl')}")
        output.table([("", "differs", d.text) for d in v.differences], status_col=1)
        verdict = "matches" if v.ok else f"{len(v.differences)} difference(s) from"
        output.summary(f"env: the environment {verdict} profile {prof.name}", "matches")
        return 0 if v.ok else 1
    from megatron_env.setup import pipeline

    ctx = pipeline.Context(prof, Path(prefix).absolute() if prefix else env.default_prefix(prof),
                           bundle=b)
    places.announce(prefix=ctx.prefix, cache=ctx.cache)

    def build_env() -> tuple[env.Summary, str]:
        s = env.build(prof, ctx.prefix, python=python, conda=conda, use_conda=use_conda,
                      find_links=find_links, no_index=no_index, deep=verify_deep,
                      conda_lock=b.conda_lock if b else None, child_env=ctx.child_env)
        return s, f"{s.action} by invoke env ({s.mode}), {len(s.facts.get('dists', {}))} packages"

    # the setup chain's env step, done with this command's options: its stamp is written, so
    # the next `invoke setup` finds the environment up to date instead of building it again
    with places.saying_what_is_kept(ctx.cache):
        summary = pipeline.one_step(ctx, "env", build_env)
    output.summary(f"env {summary.line()}")
    return 0


def _interpreter(prof: Profile, prefix: str | None, python: str | None) -> Path:
    from megatron_env.pyenv import env

    py = env.interpreter(Path(prefix).absolute() if prefix else env.default_prefix(prof),
                         python)
    if not py.exists():
        raise UserError(f"no environment at {py}", fix="run `invoke env` (or pass --python)",
                        kind="env.missing")
    return py


@command(iterable=("bundle", "expect_sha256"),
         what="a kernel recipe (`invoke kernels` lists them) or all the profile pins",
         prefix=f"the environment to build for (default {cli.ENVS}/<profile>)",
         python="build for this interpreter instead (an adopted environment)",
         arch="compute capabilities, e.g. 9.0 or 8.0,9.0, or native (default: profile)",
         dry_run="print the build plan (sources, patches, flags, cache key) and stop",
         cache_dir="wheel cache shared by the nodes (default .cache, or MEGATRON_ENV_CACHE)")
def build(what: str, profile: str | None = None, prefix: str | None = None,
          python: str | None = None, arch: str | None = None, dry_run: bool = False,
          cache_dir: str | None = None, bundle: list[str] | None = None,
          expect_sha256: list[str] | None = None, trust: str | None = None) -> int:
    """Build a kernel recipe from pinned, patched sources; cache by content; install; verify."""
    from megatron_env.kernels import build
    from megatron_env.pyenv import env, probe
    from megatron_env.setup import pipeline
    from megatron_env.sources import repos

    cache = Path(cache_dir).absolute() if cache_dir else repos.cache_dir()
    # with --bundle the environment to build for must be the bundle's Python: the bundle names
    # the profile, whose environment it is (manifest and profile read once)
    b = use_bundle(bundle, profile, lambda prof: str(_interpreter(prof, prefix, python)), what,
                    "--python PYTHON", build_cache=cache, provenance=(expect_sha256, trust))
    prof = b.profile if b else load_profile(profile)
    py = _interpreter(prof, prefix, python)
    archs = (probe.native_archs(py) if arch == "native" else
             arch.split(",") if arch else prof.archs)
    chosen = build.selected(prof, what, archs)
    ctx = pipeline.Context(prof, Path(prefix).absolute() if prefix else env.default_prefix(prof),
                           bundle=b, cache=cache)
    if not dry_run:
        places.announce(prefix=None if python else ctx.prefix, cache=cache)

    def build_all() -> tuple[None, str]:
        done = []
        for pkg in chosen:
            res = build.build_and_install(pkg, py, archs, dry_run=dry_run, given=ctx.given,
                                          cache=cache, child_env=ctx.child_env)
            if isinstance(res, build.Result):
                how = "cache hit" if res.cache_hit else f"built in {res.build_seconds:.0f} s"
                output.summary(f"{pkg.name}: {how}, installed and verified "
                               f"({', '.join(res.modules)}) in {res.seconds:.1f} s", "cache hit")
                done.append(f"{pkg.name} {how}")
        return None, "; ".join(done) + " (invoke build)"

    with places.saying_what_is_kept(cache):
        if what == "all" and not (dry_run or python or arch):
            pipeline.one_step(ctx, "builds", build_all)  # the chain's builds step: one stamp
        else:  # a part of the step, or another target: its own work, no stamp
            build_all()
    if dry_run:
        output.summary(f"dry run: {len(chosen)} build plan(s) above, nothing built")
    return 0


@command(name="build-check", python="check this interpreter instead of the profile's env")
def build_check(profile: str | None = None, python: str | None = None) -> int:
    """Do the compiled modules of the profile's kernels import in the environment?"""
    from megatron_env.kernels import build
    from megatron_env.pyenv import probe

    prof = load_profile(profile)
    py = _interpreter(prof, None, python)
    rows, bad = [], 0
    for pkg in build.packages(prof).values():
        missing, _facts = probe.missing_modules(py, pkg.modules)
        bad += bool(missing)
        rows.append((pkg.name, "missing" if missing else "ok",
                     ", ".join(missing or pkg.modules)))
    output.table(rows, status_col=1)
    verdict = Status.FAIL if bad else Status.PASS
    output.summary(f"build-check: {verdict} for {py}", verdict.value)
    return verdict.exit_code


def use_bundle(bundle: list[str] | None, profile: str | None,
               python: str | Path | Callable[[Profile], str | Path] | None, builds: str | None,
               adopt_flag: str, build_cache: Path | None = None,
               provenance: tuple[list[str] | None, str | None] = (None, None)
               ) -> Bundle | None:
    """With --bundle: check it; -> the `Bundle` value the command passes down (None without).
    `python`: the interpreter it must serve (or a function of the profile giving it); `builds`:
    the kernel package to be built (`all`, a name, None); `adopt_flag`: how this command takes
    an existing interpreter; `provenance`: (--expect-sha256, --trust), checked before anything
    is unpacked. What uv and pip, the child processes, must be told travels with the value
    (`Bundle.child_env`, given to each child process): nothing is set here."""
    sums, trust = provenance
    if not bundle:
        if sums or trust:  # ignored, the user would think a check passed that never ran
            given = "--trust" if trust else "--expect-sha256"
            raise UserError(f"{given} checks a bundle and no --bundle was given: nothing "
                            "would be checked", fix=f"pass the bundle it vouches for "
                            f"(--bundle B.tar {given} ...), or leave {given} out",
                            kind="input.usage")
        return None
    from megatron_env.bundle import offline
    from megatron_env.bundle import provenance as prov

    output.status("bundle: " + prov.check([Path(p).absolute() for p in bundle], sums or (),
                                          Path(trust) if trust else None))
    return offline.use(bundle, profile, python, builds, adopt_flag=adopt_flag,
                       build_cache=build_cache)
