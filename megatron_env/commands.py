"""What the front doors call: one function per command, each returning an exit code.

Each command and each of its options is declared once, here: the function's keyword parameters
are the options (names and defaults); megatron_env.cli says how (`@command`, the shared option
meanings, `guarded`). `tasks.py` makes its invoke tasks from `cli.COMMANDS`; nothing here parses
a command line. Every line goes through `output`: status to stderr, results and the summary line
to stdout.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from megatron_env import REPO_ROOT, findings, output, project
from megatron_env.cli import command, guarded
from megatron_env.errors import UserError
from megatron_env.host import checks, snapshot
from megatron_env.profile import Profile, check_default, load_all
from megatron_env.profile import load as load_profile


@command()
def profiles() -> int:
    """List the profiles under envs/ (* marks the default)."""
    items = load_all()
    output.table([("*" if p.is_default else " ", p.name, f"python {p.python}",
                   f"torch {p.torch}", f"cuda {p.cuda}", f"megatron {p.megatron['tag']}")
                  for p in items])
    output.summary(f"{len(items)} profiles under envs/; * marks the default")
    check_default(items)
    return 0


@command(out="directory to write the snapshot into",
         force="replace a snapshot already in that directory")
def collect(out: str, force: bool = False) -> int:
    """Record this host's GPU, driver, network and limits facts into a snapshot directory."""
    path = Path(out)
    output.status(f"Collecting host facts into {path}")
    snapshot.collect(path, force=force)
    output.summary(f"snapshot written to {path}; analyse it anywhere with "
                   f"`invoke check --snapshot {path}`")
    return 0


@command(snapshot="analyse a snapshot directory instead of this host")
def check(profile: str | None = None, snapshot: str | None = None, json: bool = False) -> int:
    """Check whether this host (or a snapshot) can train the profile's stack at full speed."""
    from megatron_env.host import attention

    prof = load_profile(profile)
    found = checks.evaluate(prof, Path(snapshot) if snapshot else None)
    source = snapshot or "this host"
    # the attention backends gpu_health timed on this node (its default --out, or the
    # snapshot's gpu_health.json as a preflight keeps it): the fastest is named
    health = (Path(snapshot) / "gpu_health.json" if snapshot
              else project.state_root() / "runs" / "gpu_health" / "results.json")
    if att := attention.from_file(health, prof):
        found.append(att)
    if json:
        findings.emit_json(found, profile=prof.name, source=source)
    else:
        findings.print_findings(found, f"Checked {source} against profile {prof.name}")
    return findings.exit_code(found)


def _jobs(value: object) -> int | None:
    """--jobs N: a positive whole number, or None when not given."""
    if value is None or value == "":
        return None
    if not str(value).isdigit() or int(str(value)) < 1:
        raise UserError(f"--jobs {value} is not a positive whole number",
                        fix="give --jobs a number of compile jobs such as 8", kind="input.value")
    return int(str(value))


@command(iterable=("bundle", "expect_sha256"), only="run this one step",
         from_="start at this step", no_builds="leave the kernel builds out",
         jobs="at most this many compile jobs at once over all the kernels (default: from "
              "cores and memory; MAX_JOBS also caps it)",
         json="print {\"steps\": [...]} (status, digest, seconds, detail) on stdout")
def setup(profile: str | None = None, prefix: str | None = None, dry_run: bool = False,
          only: str | None = None, from_: str | None = None, adopt: str | None = None,
          no_builds: bool = False, verify_deep: bool = False,
          bundle: list[str] | None = None, expect_sha256: list[str] | None = None,
          trust: str | None = None, json: bool = False, jobs: int | None = None) -> int:
    """check -> lock -> env -> sources -> patches -> builds -> megatron -> verify."""
    from megatron_env.pyenv import env
    from megatron_env.setup import pipeline

    with _json_error(json, "setup"):
        b = _use_bundle(bundle, profile, adopt, None if no_builds else "all", "--adopt PYTHON",
                        provenance=(expect_sha256, trust))
        prof = b.profile if b else load_profile(profile)
        ctx = pipeline.Context(prof, Path(prefix).absolute() if prefix
                               else env.default_prefix(prof),
                               adopt=Path(adopt).absolute() if adopt else None,
                               no_builds=no_builds, deep=verify_deep, bundle=b,
                               jobs=_jobs(jobs))
        t0 = time.monotonic()
        rows, ok = pipeline.run(ctx, only=only, start=from_, dry_run=dry_run)
    if json:
        return _setup_json(ctx, rows, ok, dry_run, time.monotonic() - t0)
    if ctx.findings and not only:
        findings.print_findings(ctx.findings, f"check: this host against {prof.name}")
    output.table([(r.step, r.status.value, f"{r.seconds:.1f}", r.detail) for r in rows],
                 status_col=1)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    verdict = "dry run" if dry_run else "ready" if ok else "stopped"
    output.summary(f"setup {verdict}: {prof.name} at {ctx.prefix}; "
                   + ", ".join(f"{n} {s}" for s, n in counts.items())
                   + f"; {time.monotonic() - t0:.1f} s", status=verdict)
    return 0 if ok else 1


@contextlib.contextmanager
def _json_error(enabled: bool, command: str) -> Iterator[None]:
    """With --json, a command that stops on an error still prints one JSON object on stdout
    ({"error": {"kind", "message", "fix"}}) for the program reading it; the error line on
    stderr and the exit status stay `guarded`'s."""
    try:
        yield
    except (UserError, OSError) as e:
        if enabled:
            import json

            err = ({"kind": e.kind or "error", "message": e.message, "fix": e.fix}
                   if isinstance(e, UserError) else
                   {"kind": "os", "message": f"{e.filename or 'a file'}: {e.strerror or e}",
                    "fix": ""})
            output.block(json.dumps({"command": command, "ok": False, "error": err},
                                    indent=1) + "\n")
        raise


def _setup_json(ctx, rows, ok: bool, dry_run: bool, seconds: float) -> int:
    """setup's rows as JSON, each with the digest its stamp recorded (None when not stamped)."""
    import json

    from megatron_env.setup import state

    def stamped(step: str) -> str | None:
        stamp, _why = state.read(ctx.stamps, step)
        return stamp.digest if stamp else None

    output.block(json.dumps({
        "profile": ctx.profile.name, "prefix": str(ctx.prefix),
        "verdict": "dry run" if dry_run else "ready" if ok else "stopped", "seconds": seconds,
        "steps": [{"step": r.step, "status": r.status.value, "digest": stamped(r.step),
                   "seconds": round(r.seconds, 3), "detail": r.detail} for r in rows],
        "findings": [f.to_dict() for f in ctx.findings]}, indent=1) + "\n")
    return 0 if ok else 1


@command(prefix="the environment to install into (default .megatron-env/<profile>)")
def megatron(profile: str | None = None, prefix: str | None = None) -> int:
    """Check out Megatron-LM at the profile's tag (pinned commit), patch it, install it."""
    return setup(profile, prefix, only="megatron")


@guarded
def verify(name: str, args: list[str]) -> int:
    """A verification program of scripts/ in the profile's environment (the nox sessions)."""
    from megatron_env.megatron import programs

    return programs.run(name, args)


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
    from megatron_env.pyenv import lock

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
        lock.write_environment_yml(prof)
        res = lock.compile_lock(prof, python=python, upgrade=upgrade_package, refresh=refresh)
        lock.conda_lock(prof, solver=conda, lookup=lookup, channels=channel)
        output.summary(f"locked {prof.name}: {res.packages} packages, every file hashed -> "
                       f"{res.path.relative_to(REPO_ROOT)}" + " (unchanged)" * (not res.changed))
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
    from megatron_env.pyenv import lockdiff
    from megatron_env.sources import index

    if markdown and json:
        raise UserError("--markdown and --json both given", fix="pass one of them",
                        kind="input.conflict")
    if profile:
        load_profile(profile)  # an unknown name: one clear line
    report = lockdiff.report(base, profile, kernel_keys=build.static_key_docs,
                             index_url=None if offline else index_url or index.installer_index())
    text = lockdiff.render(report, json)
    if max_bytes and not json:
        text = lockdiff.cut(text, max_bytes, "_(truncated at a table row: the full diff is in "
                                             "the job summary)_")
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
    import sys

    from megatron_env.pyenv import env

    b = _use_bundle(bundle, profile, (python or sys.executable) if adopt else python,
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
        output.table([("", "differs", d) for d in v.differences], status_col=1)
        verdict = "matches" if v.ok else f"{len(v.differences)} difference(s) from"
        output.summary(f"env: the environment {verdict} profile {prof.name}", "matches")
        return 0 if v.ok else 1
    from megatron_env.setup import pipeline

    ctx = pipeline.Context(prof, Path(prefix).absolute() if prefix else env.default_prefix(prof),
                           bundle=b)

    def build_env() -> tuple[env.Summary, str]:
        s = env.build(prof, ctx.prefix, python=python, conda=conda, use_conda=use_conda,
                      find_links=find_links, no_index=no_index, deep=verify_deep,
                      conda_lock=b.conda_lock if b else None, child_env=ctx.child_env)
        return s, f"{s.action} by invoke env ({s.mode}), {len(s.facts.get('dists', {}))} packages"

    # the setup chain's env step, done with this command's options: its stamp is written, so
    # the next `invoke setup` finds the environment up to date instead of building it again
    summary = pipeline.one_step(ctx, "env", build_env)
    output.summary(f"env {summary.line()}")
    return 0


def _interpreter(prof: Profile, prefix: str | None, python: str | None) -> Path:
    from megatron_env.pyenv import env

    py = Path(python).absolute() if python else env.python_of(
        Path(prefix) if prefix else env.default_prefix(prof))
    if not py.exists():
        raise UserError(f"no environment at {py}", fix="run `invoke env` (or pass --python)",
                        kind="env.missing")
    return py


@command(iterable=("bundle", "expect_sha256"),
         what="a kernel recipe (`invoke kernels` lists them) or all the profile pins",
         prefix="the environment to build for (default .megatron-env/<profile>)",
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
    b = _use_bundle(bundle, profile, lambda prof: str(_interpreter(prof, prefix, python)), what,
                    "--python PYTHON", build_cache=cache, provenance=(expect_sha256, trust))
    prof = b.profile if b else load_profile(profile)
    py = _interpreter(prof, prefix, python)
    archs = (probe.native_archs(py) if arch == "native" else
             arch.split(",") if arch else prof.archs)
    chosen = build.selected(prof, what, archs)
    ctx = pipeline.Context(prof, Path(prefix).absolute() if prefix else env.default_prefix(prof),
                           bundle=b, cache=cache)

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

    if what == "all" and not (dry_run or python or arch):
        pipeline.one_step(ctx, "builds", build_all)  # the chain's builds step: stamped as one
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
    verdict = "fail" if bad else "pass"
    output.summary(f"build-check: {verdict} for {py}", verdict)
    return 1 if bad else 0


@command(profile="show this profile's pins only (default: every profile)")
def kernels(profile: str | None = None) -> int:
    """List the kernel recipes with each profile's pins and variants."""
    from megatron_env import recipes

    profs = [load_profile(profile)] if profile else load_all()
    rows = recipes.table(profs)
    output.table(rows)
    output.summary(f"{len(recipes.declared())} kernel recipes; * marks a default variant; "
                   "`invoke build NAME` builds one")
    return 0


@command(logs="log files or directories, comma-separated; quoted globs work (\"logs/*.out\"); "
              "gzip/xz/zstd logs are read as they are; - reads standard input")
def triage(logs: str, json: bool = False) -> int:
    """Say why a distributed job failed or hung, from its console logs (one per rank or node)."""
    from megatron_env.diagnose import jobs

    skipped: list[str] = []
    found, lines, sources = jobs.run([x for x in logs.split(",") if x], skipped)
    for why in skipped:
        output.warning(f"skipped {why}")
    if json:
        findings.emit_json(found, logs=sources, lines=lines)
    else:
        findings.print_findings(found, f"Triage of {lines} lines from {len(sources)} "
                                       f"log(s), most likely cause first")
    return findings.exit_code(found)


@command(name="report", prefix="the environment to report on (default .megatron-env/<profile>)",
         json="print the facts as JSON instead of the block",
         imports="import torch and every compiled module (10-30 s) instead of reading versions "
                 "from the files")
def bug_report(profile: str | None = None, prefix: str | None = None, json: bool = False,
               imports: bool = False) -> int:
    """One block to paste into a bug report: host, GPUs, environment, builds, check, variables."""
    from megatron_env.diagnose import report
    from megatron_env.pyenv import env

    prof = load_profile(profile)
    output.status(f"Gathering a report for profile {prof.name} ...")
    report.write(report.main(
        prof, Path(prefix).absolute() if prefix else env.default_prefix(prof), json,
        imports=imports))
    return 0


@command(fleet="analyse this directory (one sub-directory per host) instead of running",
         local="run the per-node work on this host only (no Slurm), then analyse it",
         json="print {\"nodes\": [...], \"exclude\": [...]} on stdout",
         profile="profile name (default: the fingerprints' profile, else the default)",
         python="the training interpreter to fingerprint and run gpu_health with",
         run_dir="where the nodes write (default runs/<time>-preflight; shared by nodes)",
         slow="fail a GPU this fraction below its model's fleet median (default 0.1)",
         no_gpu_health="leave the per-GPU GEMM/copy run out",
         size="gpu_health's GEMM edge (default 8192)",
         against="a reference fleet directory to judge these nodes among (--local)",
         nccl="then run verify_nccl through srun across the nodes that did not fail",
         nccl_args="options for verify_nccl.py, e.g. \"--sizes 1M:1G\"")
def preflight(fleet: str | None = None, local: bool = False, json: bool = False,
              profile: str | None = None, python: str | None = None, run_dir: str | None = None,
              slow: str | None = None, no_gpu_health: bool = False, size: int = 8192,
              against: str | None = None, nccl: bool = False, nccl_args: str = "") -> int:
    """Find the bad node before the job does: every node through srun, then the fleet verdict."""
    from megatron_env.fleet import preflight

    return preflight.run(fleet=fleet, local=local, as_json=json, profile_name=profile,
                         python=python, run_dir=run_dir, slow=slow, health=not no_gpu_health,
                         size=size, against=against, nccl=nccl, nccl_args=nccl_args)


def _use_bundle(bundle: list[str] | None, profile: str | None, python, builds: str | None,
                adopt_flag: str, build_cache: Path | None = None,
                provenance: tuple[list[str] | None, str | None] = (None, None)):
    """With --bundle: check it; -> the `Bundle` value the command passes down (None without).
    `python`: the interpreter it must serve (or a function of the profile giving it); `builds`:
    the kernel package to be built (`all`, a name, None); `adopt_flag`: how this command takes
    an existing interpreter; `provenance`: (--expect-sha256, --trust), checked before anything
    is unpacked. What uv and pip, the child processes, must be told travels with the value
    (`Bundle.child_env`, given to each child process): nothing is set here."""
    if not bundle:
        return None
    from megatron_env.bundle import offline
    from megatron_env.bundle import provenance as prov

    sums, trust = provenance
    output.status("bundle: " + prov.check([Path(p).absolute() for p in bundle], sums or (),
                                          Path(trust) if trust else None))
    return offline.use(bundle, profile, python, builds, adopt_flag=adopt_flag,
                       build_cache=build_cache)


@command(iterable=("without",), out="the archive to write (FILE.tar)",
         adopt="leave the lock's wheels out: for nodes that adopt their own torch",
         with_builds="add the cached kernel wheels built for this profile",
         since="write only what this older bundle lacks (a delta)",
         without="leave this kernel package out (repeat; its builds then need a bundle that "
                 "has it)",
         sign="sign the archive with this OpenSSH private key (writes FILE.tar.sig)",
         json="print {\"path\", \"sha256\", \"size\", \"files\", ...} on stdout")
def bundle(out: str, profile: str | None = None, adopt: bool = False, with_builds: bool = False,
           since: str | None = None, without: list[str] | None = None,
           sign: str | None = None, json: bool = False) -> int:
    """One archive with everything `invoke setup --bundle` needs on a node without network."""
    from megatron_env.bundle import make
    from megatron_env.bundle import provenance as prov

    with _json_error(json, "bundle"):
        prof = load_profile(profile)
        made = make.make(prof, Path(out), adopt=adopt, with_builds=with_builds,
                         since=Path(since) if since else None,
                         without=[n for w in without or () for n in w.split(",") if n])
        sha = prov.write_sum(made.out)
        sig = prov.sign(made.out, Path(sign)) if sign else None
    if json:
        import json as js

        output.block(js.dumps({
            "path": str(made.out), "sha256": sha, "size": made.size,
            "files": made.written, "reused": made.reused, "profile": prof.name,
            "mode": made.manifest["mode"], "sha256_file": str(prov.sum_file(made.out)),
            "signature": str(sig) if sig else None, "seconds": round(made.seconds, 3)},
            indent=1) + "\n")
        return 0
    output.table([(role, f"{size / 2**20:.1f} MiB") for role, size
                  in sorted(made.by_role.items(), key=lambda x: -x[1])], indent="  ")
    delta = f", {made.reused} files left to its base" if since else ""
    output.summary(f"bundle {made.out}: {prof.name} ({made.manifest['mode']}), "
                   f"{made.written} files{delta}, {made.size / 2**20:.1f} MiB, "
                   f"{made.seconds:.1f} s; sha256 {sha} (in {prov.sum_file(made.out).name}"
                   + (f", signed: {sig.name}" if sig else ", unsigned") + ")")
    return 0
