"""`invoke setup`: the chain of steps from a bare node to a verified Megatron environment.

    check -> lock -> env -> sources -> patches -> builds -> megatron -> verify

Each step has an input digest (its own inputs plus the digest of the step before it), so a
changed pin re-runs the steps downstream of it and nothing else. A step that succeeded writes a
stamp with its digest; on the next run a stamped step is only verified (seconds). A failed step
stops the chain with its message, log tail and fix; the next run resumes there. Steps that need
what this machine lacks (a GPU, the profile's CUDA toolkit) or that this version does not have
yet are reported as skipped with the reason.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import checks, env, lock, manifest, megatron, patches, waiting
from .errors import UserError
from .findings import Finding
from .profile import Profile

STEPS = ["check", "lock", "env", "sources", "patches", "builds", "megatron", "verify"]


@dataclass
class Context:
    profile: Profile
    prefix: Path
    echo: Callable[..., None] = print
    findings: list[Finding] = field(default_factory=list)
    snapshot_dir: Path | None = None
    adopt: Path | None = None  # an existing interpreter to use instead of building one
    no_builds: bool = False  # leave flash-attn and apex out (reported as skipped)
    deep: bool = False  # re-hash every installed file and import again (--verify-deep)

    @property
    def stamps(self) -> Path:
        return self.prefix.with_name(self.prefix.name + ".setup")

    @property
    def python(self) -> Path:
        return self.adopt or env.python_of(self.prefix)


@dataclass
class Row:
    step: str
    status: str  # done, up to date, skipped, failed, would run, not run
    seconds: float
    detail: str


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


# --- the steps: (inputs, run, skip-reason) ---------------------------------------------------


def _check_run(ctx: Context) -> str:
    ctx.findings = checks.evaluate(ctx.profile, ctx.snapshot_dir)
    from .report import summary_line

    failed = [f.id for f in ctx.findings if f.status == "fail"]
    return summary_line(ctx.findings) + (f" ({', '.join(failed)})" if failed else "")


def _lock_inputs(ctx: Context) -> str:
    p = ctx.profile
    return _digest(_file(p.path), _file(p.dir / lock.LOCK_FILE), _file(p.dir / lock.ENV_FILE))


def _lock_run(ctx: Context) -> str:
    problems = lock.stale(ctx.profile)
    if problems:
        raise UserError("; ".join(problems),
                        fix=f"run `invoke lock --profile {ctx.profile.name}` and commit the locks")
    return f"{lock.LOCK_FILE} and {lock.ENV_FILE} match {ctx.profile.path.name}"


def _env_run(ctx: Context) -> str:
    if ctx.adopt:
        return _adopt(ctx)
    s = env.build(ctx.profile, ctx.prefix, deep=ctx.deep, echo=ctx.echo)
    return f"{s.action}: Python {s.facts['python']}, torch {s.facts.get('torch')}, CUDA " \
           f"{s.facts.get('torch_cuda')}, {len(s.facts['dists'])} packages"


def _adopt(ctx: Context) -> str:
    """An existing environment: Python, torch and its CUDA must match; other packages may differ
    from the lock (an NGC container has its own), and each difference is listed."""
    v = env.verify(ctx.adopt, ctx.profile, ctx.profile.dir / lock.LOCK_FILE)
    f = v.facts
    if fatal := v.text(env.STACK):
        raise UserError(f"{ctx.adopt} cannot serve profile {ctx.profile.name}: {fatal}",
                        fix="adopt an environment with the profile's Python, torch and CUDA, "
                            "or build one (without --adopt)")
    others = v.text() or "none"
    return (f"adopted {f['executable']}: Python {f['python']}, torch {f.get('torch')}, CUDA "
            f"{f.get('torch_cuda')}, NCCL {f.get('nccl')}, cuDNN {f.get('cudnn')}; "
            f"other differences from the lock: {others}")


def _env_inputs(ctx: Context) -> str:
    return _digest(_file(ctx.profile.dir / lock.LOCK_FILE), str(ctx.adopt or ""))


def _env_verify(ctx: Context) -> str | None:
    """The manifest's stat check: why the env step must run again (it then repairs what changed
    from the lock), or None when every installed file is as the build left it."""
    if ctx.adopt:
        return None
    if ctx.deep:
        return "--verify-deep given"
    diffs = env.changes(ctx.prefix)
    if diffs is None:
        return "the environment has no manifest yet"
    return f"changed since its build: {'; '.join(manifest.summarize(diffs))}" if diffs else None


def _no_gpu_or_toolkit(ctx: Context) -> str | None:
    """Why kernels cannot be built here, from the check step's findings (None: they can)."""
    reasons = []
    by_id = {f.id: f for f in ctx.findings}
    drv = by_id.get("driver.version")
    if drv and "no NVIDIA driver" in drv.summary:
        reasons.append("no GPU")
    tk = by_id.get("cuda.toolkit")
    if tk and tk.status in ("fail", "skip"):
        reasons.append(f"no CUDA {ctx.profile.cuda} toolkit ({tk.summary.split(':')[0]})")
    return "; ".join(reasons) or None


def _builds_skip(ctx: Context) -> str | None:
    if ctx.no_builds:
        return "--no-builds given"
    return _no_gpu_or_toolkit(ctx)


def _kernel_packages(ctx: Context):
    from . import build

    return build.packages(ctx.profile).values()


def _builds_inputs(ctx: Context) -> str:
    p = ctx.profile
    return _digest(json.dumps([p.flash_attn, p.apex, p.archs], sort_keys=True),
                   *(patches.digest(patches.series(k.name, k.pin)) for k in _kernel_packages(ctx)),
                   _file(p.dir / lock.LOCK_FILE), str(ctx.adopt or ""))


def _sources_run(ctx: Context) -> str:
    from . import build

    return "; ".join(f"{k.name} {k.source.digest[:19]} at {build.fetch(k, ctx.python, ctx.echo)}"
                     for k in _kernel_packages(ctx))


def _patches_run(ctx: Context) -> str:
    from . import build

    done = []
    for k in _kernel_packages(ctx):
        series = patches.series(k.name, k.pin)
        scratch = build.cache_dir() / "build" / f"check-{k.name}-{time.time_ns()}"
        patches.apply_series(build.fetch(k, ctx.python, ctx.echo), scratch, series)
        shutil.rmtree(scratch, ignore_errors=True)
        done.append(f"{k.name}: {len(series)} patch(es) apply")
    return "; ".join(done)


def _builds_run(ctx: Context) -> str:
    from . import build

    out = []
    for k in _kernel_packages(ctx):
        r = build.build_and_install(k, ctx.python, ctx.profile.archs, echo=ctx.echo)
        how = "from cache" if r.cache_hit else f"built in {r.build_seconds:.0f} s"
        out.append(f"{k.name} {how}, {len(r.modules)} compiled module(s) import")
    return "; ".join(out)


def _megatron_inputs(ctx: Context) -> str:
    m = ctx.profile.megatron
    series = megatron.patch_series(ctx.profile)
    return _digest(m["repo"], m["tag"], m["commit"], patches.digest(series),
                   _file(ctx.profile.dir / lock.LOCK_FILE))


def _megatron_run(ctx: Context) -> str:
    src = megatron.prepare(ctx.profile, echo=ctx.echo)
    megatron.install(ctx.profile, ctx.python, src, echo=ctx.echo)
    n = len(megatron.patch_series(ctx.profile))
    return f"{ctx.profile.megatron['tag']} @ {ctx.profile.megatron['commit'][:12]}, " \
           f"{n} patch(es), installed editable with its dataset helpers"


ADOPTED_MANIFEST = "adopted-manifest.json"


def _verify_inputs(ctx: Context) -> str:
    """What the imports were proven for: the built environment's manifest (a repair writes a new
    one), or the adopted interpreter (whose own manifest `_verify_again` checks)."""
    if ctx.adopt:
        return _digest(str(ctx.adopt))
    return _digest((env.read_stamp(ctx.prefix) or {}).get("manifest", ""))


def _verify_again(ctx: Context) -> str | None:
    """Why the imports must be proven again (None: nothing changed since they were)."""
    if ctx.deep:
        return "--verify-deep given"
    if not ctx.adopt:
        return None  # the env step has checked the manifest that this step's digest names
    m = manifest.load(ctx.stamps / ADOPTED_MANIFEST)
    if m is None:
        return "no manifest of the adopted environment"
    diffs = manifest.stat_check(m)
    return ("the adopted environment changed: " + "; ".join(manifest.summarize(diffs))
            if diffs else None)


def _verify_run(ctx: Context) -> str:
    facts = megatron.check_import(ctx.python)
    if ctx.adopt:
        if ctx.deep and (m := manifest.load(ctx.stamps / ADOPTED_MANIFEST)):
            bad = manifest.hash_check(m)
            if bad:
                raise UserError(f"files of {ctx.adopt}'s environment differ from their wheels' "
                                "RECORD: " + "; ".join(manifest.summarize(bad)),
                                fix="reinstall those packages in the adopted environment")
        manifest.save(manifest.scan(facts["sites"]), ctx.stamps / ADOPTED_MANIFEST)
    where = Path(facts["imported"]["megatron.core"]).parent.parent.parent.name
    return f"import torch {facts.get('torch')} (CUDA {facts.get('torch_cuda')}), " \
           f"megatron.core from {where} and its dataset helpers: ok"


@dataclass
class Step:
    name: str
    run: Callable[[Context], str]
    inputs: Callable[[Context], str] | None = None  # None: always runs (cheap, host state)
    skip: Callable[[Context], str | None] | None = None
    # quick re-check of a stamped step: raises when broken; a returned text says why it runs again
    verify: Callable[[Context], str | None] | None = None


def steps() -> list[Step]:
    return [
        Step("check", _check_run),
        Step("lock", _lock_run, _lock_inputs),
        Step("env", _env_run, _env_inputs, verify=_env_verify),
        Step("sources", _sources_run, skip=_builds_skip),
        Step("patches", _patches_run, skip=_builds_skip),
        Step("builds", _builds_run, _builds_inputs, skip=_builds_skip),
        Step("megatron", _megatron_run, _megatron_inputs,
             verify=lambda c: megatron.check_installed(c.python, c.profile)),
        Step("verify", _verify_run, _verify_inputs, verify=_verify_again),
    ]


def _read(stamps: Path, step: str) -> dict | None:
    try:
        return json.loads((stamps / f"{step}.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def run(ctx: Context, *, only: str | None = None, start: str | None = None,
        dry_run: bool = False) -> tuple[list[Row], bool]:
    """Run the chain; returns the rows of the summary table and whether it ended well."""
    for name in (only, start):
        if name and name not in STEPS:
            raise UserError(f"unknown step {name!r}; steps: {', '.join(STEPS)}")
    chosen = [only] if only else STEPS[STEPS.index(start):] if start else STEPS
    if dry_run:  # a plan writes nothing (the prefix may be read-only)
        return _chain(ctx, chosen, dry_run=True)
    try:
        ctx.stamps.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {ctx.stamps}: {e.strerror}",
                        fix="choose a writable --prefix") from None
    with waiting.exclusive(ctx.stamps / ".lock", "waiting: another run is working on the setup "
                           f"of {ctx.prefix} (it holds {ctx.stamps / '.lock'})", ctx.echo):
        return _chain(ctx, chosen, dry_run=False)


def _chain(ctx: Context, chosen: list[str], *, dry_run: bool) -> tuple[list[Row], bool]:
    rows: list[Row] = []
    upstream = ""
    ok = True
    for step in steps():
        if step.name not in chosen:
            stamp = _read(ctx.stamps, step.name)
            upstream = _digest(upstream, stamp["digest"] if stamp else "")
            continue
        if not ok:
            rows.append(Row(step.name, "not run", 0.0, "an earlier step failed"))
            continue
        t0 = time.monotonic()
        try:
            if step.name != "check" and not ctx.findings and "check" not in chosen:
                _check_run(ctx)  # the skip reasons below need the host's facts
            reason = step.skip(ctx) if step.skip else None
            if reason:
                rows.append(Row(step.name, "skipped", time.monotonic() - t0, reason))
                continue
            digest = _digest(upstream, step.inputs(ctx)) if step.inputs else None
            stamp = _read(ctx.stamps, step.name)
            fresh = digest is not None and stamp is not None and stamp["digest"] == digest
            if dry_run:
                status = "up to date" if fresh else "would run"
                why = ("stamp matches its inputs" if fresh else "no stamp" if stamp is None
                       or digest is None else "its inputs changed")
                if digest is None:
                    why = "runs every time (host state)"
                rows.append(Row(step.name, status, 0.0, why))
                upstream = _digest(upstream, digest or "")
                if step.name == "check":
                    _check_run(ctx)
                continue
            again = step.verify(ctx) if fresh and step.verify else None
            if again:
                ctx.echo(f"{step.name}: {again}; running it again")
            if fresh and not again:
                rows.append(Row(step.name, "up to date", time.monotonic() - t0,
                                stamp.get("detail", "")))
            else:
                detail = step.run(ctx)
                rows.append(Row(step.name, "done", time.monotonic() - t0, detail))
                if digest is not None:
                    (ctx.stamps / f"{step.name}.json").write_text(json.dumps(
                        {"digest": digest, "detail": detail,
                         "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
            upstream = _digest(upstream, digest or "")
        except UserError as e:
            if not dry_run:
                (ctx.stamps / f"{step.name}.json").unlink(missing_ok=True)
            rows.append(Row(step.name, "failed", time.monotonic() - t0,
                            e.message + (f"\nfix: {e.fix}" if e.fix else "")))
            ok = False
    return rows, ok

