"""What the front doors call: one function per command, each returning an exit code.

`tasks.py` parses arguments and calls these; nothing here parses command lines. A `UserError`
raised anywhere below is printed as `error:` plus its `hint:` by `guarded`, with exit status 2.
Every line goes through `output`: status to stderr, results and the summary line to stdout.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

from megatron_env import REPO_ROOT, findings, output, profile
from megatron_env.errors import UserError
from megatron_env.host import checks, snapshot


def guarded(fn: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> int:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            output.error(e.message, e.fix)
            return e.exit_code
        except KeyboardInterrupt:
            output.error("interrupted")
            return 130
        except OSError as e:  # the last net: a path the user named cannot be used as asked
            output.error(f"{e.filename or 'a file'}: {e.strerror or e}",
                         "check that path (a directory where one is needed, writable, on a "
                         "disk with space)")
            return 2

    return wrapper


@guarded
def profiles() -> int:
    items = profile.load_all()
    output.table([("*" if p.is_default else " ", p.name, f"python {p.python}",
                   f"torch {p.torch}", f"cuda {p.cuda}", f"megatron {p.megatron['tag']}")
                  for p in items])
    output.summary(f"{len(items)} profiles under envs/; * marks the default")
    profile.check_default(items)
    return 0


@guarded
def collect(out_dir: str) -> int:
    path = Path(out_dir)
    output.status(f"Collecting host facts into {path}")
    snapshot.collect(path)
    output.summary(f"snapshot written to {path}; analyse it anywhere with "
                   f"`invoke check --snapshot {path}`")
    return 0


@guarded
def check(profile_name: str | None = None, snapshot_dir: str | None = None,
          as_json: bool = False) -> int:
    from megatron_env.host import attention

    prof = profile.load(profile_name)
    found = checks.evaluate(prof, Path(snapshot_dir) if snapshot_dir else None)
    source = snapshot_dir or "this host"
    # the attention backends gpu_health timed on this node (its default --out, or the
    # snapshot's gpu_health.json as a preflight keeps it): the fastest is named
    health = (Path(snapshot_dir) / "gpu_health.json" if snapshot_dir
              else REPO_ROOT / "runs" / "gpu_health" / "results.json")
    if att := attention.from_file(health, prof):
        found.append(att)
    if as_json:
        findings.emit_json(found, profile=prof.name, source=source)
    else:
        findings.print_findings(found, f"Checked {source} against profile {prof.name}")
    return findings.exit_code(found)


@guarded
def setup(profile_name: str | None = None, prefix: str | None = None, dry_run: bool = False,
          only: str | None = None, start: str | None = None, adopt: str | None = None,
          no_builds: bool = False, deep: bool = False, bundle: list[str] | None = None) -> int:
    """The whole chain (see megatron_env.setup.pipeline); one summary table at the end."""
    from megatron_env.pyenv import env as env_mod
    from megatron_env.setup import pipeline

    profile_name = _use_bundle(bundle, profile_name, adopt, None if no_builds else "all")
    prof = profile.load(profile_name)
    ctx = pipeline.Context(prof, Path(prefix).absolute() if prefix else
                           env_mod.default_prefix(prof),
                           adopt=Path(adopt).absolute() if adopt else None,
                           no_builds=no_builds, deep=deep)
    t0 = time.monotonic()
    rows, ok = pipeline.run(ctx, only=only, start=start, dry_run=dry_run)
    if ctx.findings and not only:
        findings.print_findings(ctx.findings, f"check: this host against {prof.name}")
    output.table([(r.step, r.status, f"{r.seconds:.1f}", r.detail) for r in rows],
                 status_col=1)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    verdict = "dry run" if dry_run else "ready" if ok else "stopped"
    output.summary(f"setup {verdict}: {prof.name} at {ctx.prefix}; "
                   + ", ".join(f"{n} {s}" for s, n in counts.items())
                   + f"; {time.monotonic() - t0:.1f} s", status=verdict)
    return 0 if ok else 1


@guarded
def verify(name: str, args: list[str]) -> int:
    from megatron_env.megatron import programs as verify_mod

    return verify_mod.run(name, args)


@guarded
def lock(profile_name: str | None = None, check: bool = False, upgrade: list[str] | None = None,
         python: str | None = None, conda: str | None = None, channels: list[str] | None = None,
         lookup: str | None = None, resolve: bool = False) -> int:
    """Write (or with check=True, verify) the locks of one profile, or of all with check."""
    from megatron_env.pyenv import lock as lock_mod

    if check:
        profs = [profile.load(profile_name)] if profile_name else profile.load_all()
        problems = [p for prof in profs for p in lock_mod.stale(prof)]
        if resolve and not problems:
            problems = [p for prof in profs for p in lock_mod.resolve_check(prof, python)]
        for p in problems:
            output.result(f"{output.paint('stale')} {p}")
        if problems:
            output.hint("run `invoke lock --profile NAME` and commit the result")
            return 1
        output.summary(f"fresh locks of {len(profs)} profile(s) match their inputs"
                       + (" and a new resolution" if resolve else ""), "fresh")
        return 0
    prof = profile.load(profile_name)
    env_file = prof.dir / lock_mod.ENV_FILE
    env_file.write_text(lock_mod.environment_yml(prof))
    res = lock_mod.compile_lock(prof, python=python, upgrade=upgrade)
    lock_mod.conda_lock(prof, solver=conda, lookup=Path(lookup) if lookup else None,
                        channels=channels)
    output.summary(f"locked {prof.name}: {res.packages} packages, every file hashed -> "
                   f"{res.path.relative_to(REPO_ROOT)}")
    return 0


@guarded
def lock_diff(base: str | None = None) -> int:
    from megatron_env.pyenv import lockdiff

    output.result(lockdiff.markdown(lockdiff.diff_all(base)))
    return 0


@guarded
def env(profile_name: str | None = None, prefix: str | None = None, python: str | None = None,
        adopt: bool = False, install_missing: bool = False, conda: str | None = None,
        use_conda: bool | None = None, find_links: list[str] | None = None,
        no_index: bool = False, deep: bool = False, bundle: list[str] | None = None) -> int:
    """Build (or verify) the profile's environment, or check an adopted one."""
    import sys

    from megatron_env.pyenv import env as env_mod

    profile_name = _use_bundle(bundle, profile_name,
                               (python or sys.executable) if adopt else python, None)
    prof = profile.load(profile_name)
    if adopt:
        v = env_mod.adopt(prof, python, install_missing, find_links, no_index)
        f = v.facts
        output.result(f"adopted {f['executable']}: Python {f['python']}, torch {f.get('torch')}"
                      f", CUDA {f.get('torch_cuda')}, cuDNN {f.get('cudnn')}, NCCL "
                      f"{f.get('nccl')}")
        output.table([("", "differs", d) for d in v.differences], status_col=1)
        verdict = "matches" if v.ok else f"{len(v.differences)} difference(s) from"
        output.summary(f"env: the environment {verdict} profile {prof.name}", "matches")
        return 0 if v.ok else 1
    summary = env_mod.build(prof, Path(prefix) if prefix else None, python=python, conda=conda,
                            use_conda=use_conda, find_links=find_links, no_index=no_index,
                            deep=deep)
    output.summary(f"env {summary.line()}")
    return 0


def _interpreter(prof: profile.Profile, prefix: str | None, python: str | None) -> Path:
    from megatron_env.pyenv import env as env_mod

    py = Path(python).absolute() if python else env_mod.python_of(
        Path(prefix) if prefix else env_mod.default_prefix(prof))
    if not py.exists():
        raise UserError(f"no environment at {py}", fix="run `invoke env` (or pass --python)")
    return py


@guarded
def build(which: str = "all", profile_name: str | None = None, prefix: str | None = None,
          arch: str | None = None, dry_run: bool = False, cache_dir: str | None = None,
          python: str | None = None, bundle: list[str] | None = None) -> int:
    """Build, cache, install and verify one kernel recipe (or all the profile pins)."""
    from megatron_env.kernels import build as build_mod
    from megatron_env.pyenv import probe

    if cache_dir:
        os.environ[build_mod.CACHE_DIR_ENV] = cache_dir
    if bundle:  # the environment to build for must be the bundle's Python
        name = _bundle_profile(bundle, profile_name)
        profile_name = _use_bundle(bundle, name,
                                   str(_interpreter(profile.load(name), prefix, python)), which)
    prof = profile.load(profile_name)
    py = _interpreter(prof, prefix, python)
    archs = (probe.native_archs(py) if arch == "native" else
             arch.split(",") if arch else prof.archs)
    chosen = build_mod.selected(prof, which, archs)
    for pkg in chosen:
        res = build_mod.build_and_install(pkg, py, archs, dry_run=dry_run)
        if isinstance(res, build_mod.Result):
            how = "cache hit" if res.cache_hit else f"built in {res.build_seconds:.0f} s"
            output.summary(f"{pkg.name}: {how}, installed and verified "
                           f"({', '.join(res.modules)}) in {res.seconds:.1f} s", "cache hit")
    if dry_run:
        output.summary(f"dry run: {len(chosen)} build plan(s) above, nothing built")
    return 0


@guarded
def build_check(profile_name: str | None = None, python: str | None = None) -> int:
    """Do the compiled modules of the profile's kernels import in the environment? (no build)"""
    from megatron_env.kernels import build as build_mod
    from megatron_env.pyenv import probe

    prof = profile.load(profile_name)
    py = _interpreter(prof, None, python)
    rows, bad = [], 0
    for pkg in build_mod.packages(prof).values():
        missing, _facts = probe.missing_modules(py, pkg.modules)
        bad += bool(missing)
        rows.append((pkg.name, "missing" if missing else "ok",
                     ", ".join(missing or pkg.modules)))
    output.table(rows, status_col=1)
    verdict = "fail" if bad else "pass"
    output.summary(f"build-check: {verdict} for {py}", verdict)
    return 1 if bad else 0


@guarded
def kernels(profile_name: str | None = None) -> int:
    """The declared recipes, and what each profile pins of them (version or commit, variants)."""
    from megatron_env import recipes

    profs = [profile.load(profile_name)] if profile_name else profile.load_all()
    rows = []
    for r in recipes.declared().values():
        rows.append((r.name, f"{r.source:<5}  {r.about}"))
        if r.variants:
            rows.append(("", "variants  " + ", ".join(v.name + ("*" if v.default else "")
                                                      for v in r.variants)))
        for c in r.choices:  # multi-valued: the profile lists values
            rows.append(("", f"{c.name}  {', '.join(c.values)} (default {','.join(c.default)})"))
        for p in profs:
            pins = p.kernels.get(r.name)
            if pins is None:
                rows.append(("", f"{p.name}  not pinned"))
                continue
            pin = pins.get("version") or " @ ".join(filter(None, (pins.get("tag"),
                                                                  pins["commit"][:12])))
            chosen = [*pins.get("variants", r.default_variants)]
            chosen += [f"{c.name}={','.join(pins.get(c.name, c.default))}" for c in r.choices]
            rows.append(("", f"{p.name}  {pin}" + "".join(f" +{v}" for v in chosen)))
    output.table(rows)
    output.summary(f"{len(recipes.declared())} kernel recipes; * marks a default variant; "
                   "`invoke build NAME` builds one")
    return 0


@guarded
def triage(logs: list[str], as_json: bool = False) -> int:
    """Read a failed or hung job's console logs; findings, most likely cause first."""
    from megatron_env.diagnose import joblog
    from megatron_env.diagnose import triage as triage_mod

    lines = joblog.read(logs)
    found = triage_mod.triage(lines)
    sources = sorted({x.source for x in lines})
    if as_json:
        findings.emit_json(found, logs=sources, lines=len(lines))
    else:
        findings.print_findings(found, f"Triage of {len(lines)} lines from {len(sources)} "
                                        f"log(s), most likely cause first")
    return findings.exit_code(found)


@guarded
def bug_report(profile_name: str | None = None, prefix: str | None = None,
               as_json: bool = False) -> int:
    """One block to paste into a bug report (secrets redacted); works before anything is built."""
    from megatron_env.diagnose import report as bug_report_mod
    from megatron_env.pyenv import env as env_mod

    prof = profile.load(profile_name)
    output.status(f"Gathering a report for profile {prof.name} ...")
    bug_report_mod.write(bug_report_mod.main(
        prof, Path(prefix).absolute() if prefix else env_mod.default_prefix(prof), as_json))
    return 0


@guarded
def preflight(fleet_dir: str | None = None, local: bool = False, as_json: bool = False,
              profile_name: str | None = None, python: str | None = None,
              run_dir: str | None = None, slow: str | float | None = None,
              gpu_health: bool = True, size: str | int = 8192, against: str | None = None,
              nccl: bool = False, nccl_args: str = "") -> int:
    """Every node of the allocation through srun (or --local: this node; or --fleet DIR: a
    directory analysed again), then the fleet verdict. Exit 0 pass, 1 warnings, 2 a node fails.
    `against`: a reference fleet directory whose nodes the medians and majorities include (a
    Slurm prolog or HealthCheckProgram judging one node against the last fleet run).
    `nccl`: then scripts/verify_nccl.py through srun across the nodes that did not fail."""
    import sys

    from megatron_env.fleet import analysis
    from megatron_env.fleet import preflight as pf

    try:
        slow = analysis.DEFAULT_SLOW if slow is None else float(slow)
        size = int(size)
    except ValueError as e:
        raise UserError(f"--slow {slow} / --size {size}: {e}",
                        fix="--slow takes a fraction (0.1), --size an integer (8192)") from None
    if not 0 < slow < 1:
        raise UserError(f"--slow {slow}: expected a fraction between 0 and 1",
                        fix="e.g. --slow 0.1 fails GPUs more than 10% below the fleet median")
    expected: list[str] = []
    if fleet_dir:
        root = Path(fleet_dir)
    else:
        root = Path(run_dir) if run_dir else (
            REPO_ROOT / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-preflight")
        if local:
            pf.run_node(root, profile_name, python, health=gpu_health, size=size,
                        echo=output.status)
        else:
            code, expected = pf.launch(root, profile_name, python, health=gpu_health,
                                       size=size, echo=lambda s: output.status(s.rstrip("\n")))
            if code:
                output.warning(f"srun exited {code}; analysing what the nodes wrote")
    nodes = analysis.load(root)
    if local:  # a run directory other nodes also write into: judge this node alone
        nodes = [n for n in nodes if n.host == pf.host_name()]
    hosts = {n.host for n in nodes}
    if against:  # judge these nodes among a reference fleet's, report only these
        nodes += [n for n in analysis.load(Path(against)) if n.host not in hosts]
    prof = profile.load(profile_name or _fleet_profile(nodes))
    rep = analysis.analyse(nodes, prof, slow=slow, expected=expected)
    rep.nodes = [n for n in rep.nodes if n.host in hosts or n.host in expected]
    png = root / "fleet.png"
    try:
        drawn = analysis.plot(nodes, png, slow)
    except OSError:
        drawn = False
    if as_json:
        import json

        sys.stdout.write(json.dumps(rep.to_dict(), indent=2) + "\n")
    else:
        findings.print_fleet(rep.nodes, rep.exclude)
    counts = {s: sum(n.status == s for n in rep.nodes) for s in ("pass", "warn", "fail", "skip")}
    # on stderr: with --json, stdout is the document alone
    output.status(f"preflight: {len(rep.nodes)} node(s) against {prof.name}: "
              + ", ".join(f"{c} {s}" for s, c in counts.items() if c)
              + (f"; plot {png}" if drawn else "; no plot (matplotlib missing or no GPU "
                 "results)") + f"; results in {root}")
    if rep.exclude:
        output.hint(f"srun/sbatch --exclude={','.join(rep.exclude)}")
    if nccl and not (fleet_dir or local):  # only where this run launched the nodes itself
        import shlex

        from megatron_env.fleet import fingerprint

        healthy = [n.host for n in rep.nodes if n.status != "fail"]
        per_node = max((len(analysis.gpus(n)) for n in nodes if n.host in healthy), default=0)
        code = pf.verify_nccl(root, healthy, max(per_node, 1),
                              fingerprint.interpreter(prof, python), shlex.split(nccl_args),
                              echo=lambda s: output.status(s.rstrip("\n")))
        if code is not None:
            output.status(f"verify_nccl: {'pass' if code == 0 else 'fail'} across "
                      f"{len(healthy)} node(s); results in {root / 'nccl'}")
            if code:
                return 2
    elif nccl:
        output.status("verify_nccl: skipped: --nccl runs inside an allocation, after its "
                      "preflight")
    return rep.exit_code


def _fleet_profile(nodes) -> str | None:
    """The profile most nodes' fingerprints name (None: the default profile)."""
    from collections import Counter

    names = Counter(n.fingerprint.get("profile") for n in nodes if n.fingerprint.get("profile"))
    return names.most_common(1)[0][0] if names else None


def _bundle_profile(bundle: list[str], profile_name: str | None) -> str:
    from megatron_env.bundle import layout

    return profile_name or layout.read_manifest(Path(bundle[-1]).absolute())["profile"]["name"]


def _use_bundle(bundle: list[str] | None, profile_name: str | None,
                python: str | None, builds: str | None) -> str | None:
    """With --bundle: check it and point the chain at it (nothing else is reached); `builds`:
    the kernel package to be built (`all`, a name, None)."""
    if not bundle:
        return profile_name
    from megatron_env.bundle import offline

    name, _root = offline.use(bundle, profile_name, python, builds)
    return name


@guarded
def bundle(profile_name: str | None = None, out_file: str | None = None, adopt: bool = False,
           with_builds: bool = False, since: str | None = None,
           without: list[str] | None = None) -> int:
    """One archive with everything the profile's setup needs offline (megatron_env.bundle)."""
    from megatron_env.bundle import make

    if not out_file:
        raise UserError("--out FILE.tar is required", fix="invoke bundle --out my-bundle.tar")
    prof = profile.load(profile_name)
    made = make.make(prof, Path(out_file), adopt=adopt, with_builds=with_builds,
                     since=Path(since) if since else None,
                     without=[n for w in without or () for n in w.split(",") if n])
    output.table([(role, f"{size / 2**20:.1f} MiB") for role, size
                  in sorted(made.by_role.items(), key=lambda x: -x[1])], indent="  ")
    delta = f", {made.reused} files left to its base" if since else ""
    output.summary(f"bundle {made.out}: {prof.name} ({made.manifest['mode']}), "
                   f"{made.written} files{delta}, {made.size / 2**20:.1f} MiB, "
                   f"{made.seconds:.1f} s")
    return 0
