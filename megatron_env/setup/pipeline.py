"""`invoke setup`: the chain of steps from a bare node to a verified Megatron environment.

    check -> lock -> env -> sources -> patches -> builds -> megatron -> verify

The host check comes first, as a precondition: its findings say which steps this machine
cannot run. Then `decide` settles every step's action (`state.Action`: run, verify, skip,
unchosen) and why, from stamps, input digests and findings, before anything runs; `execute`
carries the decisions out and `--dry-run` (`predict`) says what they would do. Each step has an
input digest (its own inputs chained with what the steps before it are: their digests when they
run, their stamps when they do not), so a changed pin re-runs the steps downstream of it and
nothing else, whichever steps are chosen. A step that succeeded writes a stamp with its digest
(`state.Stamp`); on the next run a stamped step is only verified (seconds); a re-check that finds
a reason, or fails, runs the step again, and so does a stamped step whose inputs that run
changed (the verify step names the manifest a repair rewrote). From any state the front doors
leave, one run reaches ready and the next finds every step up to date
(tests/test_setup_chain.py). A failed step stops the chain with its message, log tail and hint;
the next run resumes there. Steps that need what this machine lacks (a GPU, the profile's CUDA
toolkit) are reported as skipped with the reason. `one_step` lets a front door that does one
step its own way (`invoke env`, `invoke build all`) write the same stamp.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from megatron_env import digest, findings, mutex, output
from megatron_env.errors import UserError
from megatron_env.findings import Finding
from megatron_env.host import checks
from megatron_env.kernels import build
from megatron_env.megatron import checkout
from megatron_env.profile import Profile
from megatron_env.pyenv import audit, env, lock, manifest
from megatron_env.setup import state
from megatron_env.setup.state import Action, Outcome
from megatron_env.sources import patches, repos
from megatron_env.sources.given import Given

if TYPE_CHECKING:  # the value only: the setup chain does not call into the bundle wing
    from megatron_env.bundle.offline import Bundle

STEPS = ["check", "lock", "env", "sources", "patches", "builds", "megatron", "verify"]


@dataclass
class Context:
    profile: Profile
    prefix: Path
    echo: Callable[..., None] = output.status
    findings: list[Finding] = field(default_factory=list)
    snapshot_dir: Path | None = None
    adopt: Path | None = None  # an existing interpreter to use instead of building one
    no_builds: bool = False  # leave the kernel builds out (reported as skipped)
    deep: bool = False  # re-hash every installed file and import again (--verify-deep)
    bundle: Bundle | None = None  # where sources, wheels and the conda layer come from offline
    kernels: dict[str, build.Package] = field(default_factory=dict)  # resolved once, below
    cache: Path = field(default_factory=repos.cache_dir)  # sources, patched trees, builds

    def __post_init__(self) -> None:
        if not self.kernels:
            self.kernels = dict(self.bundle.kernels if self.bundle
                                else build.packages(self.profile))

    @property
    def given(self) -> Given | None:
        return self.bundle.given if self.bundle else None

    @property
    def child_env(self) -> dict[str, str] | None:
        """What uv and pip are told in the child processes (a bundle's no-index settings)."""
        return self.bundle.child_env(self.cache) if self.bundle else None

    @property
    def stamps(self) -> Path:
        return self.prefix.with_name(self.prefix.name + ".setup")

    @property
    def python(self) -> Path:
        return self.adopt or env.python_of(self.prefix)


@dataclass(frozen=True)
class Row:
    step: str
    status: Outcome
    seconds: float
    detail: str


def _digest(*parts: str) -> str:
    return digest.hexpart(digest.of(list(parts)), 16)


# --- the steps: (inputs, run, skip-reason) ---------------------------------------------------


def _check_run(ctx: Context) -> str:
    """The host's findings are gathered before any step is decided (`run`); this reports them."""
    failed = [f.id for f in ctx.findings if f.status == "fail"]
    return findings.summary_line(ctx.findings) + (f" ({', '.join(failed)})" if failed else "")


def _lock_inputs(ctx: Context) -> str:
    p = ctx.profile
    return _digest(*(digest.of_file(f) for f in (p.path, p.lock_file,
                                                  p.env_file)))


def _lock_run(ctx: Context) -> str:
    problems = lock.stale(ctx.profile)
    if problems:
        raise UserError("; ".join(problems),
                        fix=f"run `invoke lock --profile {ctx.profile.name}` and commit the locks",
                        kind="lock.stale")
    prof = ctx.profile
    return f"{prof.lock_file.name} and {prof.env_file.name} match {prof.path.name}"


def _env_run(ctx: Context) -> str:
    if ctx.adopt:
        return _adopt(ctx)
    b = ctx.bundle
    s = env.build(ctx.profile, ctx.prefix, deep=ctx.deep, echo=ctx.echo,
                  find_links=b.find_links if b else None, no_index=bool(b),
                  conda_lock=b.conda_lock if b else None, child_env=ctx.child_env)
    return f"{s.action}: Python {s.facts['python']}, torch {s.facts.get('torch')}, CUDA " \
           f"{s.facts.get('torch_cuda')}, {len(s.facts['dists'])} packages"


def _adopt(ctx: Context) -> str:
    """An existing environment: Python, torch and its CUDA must match; other packages may differ
    from the lock (an NGC container has its own), and each difference is listed."""
    v = audit.verify(ctx.adopt, ctx.profile, ctx.profile.lock_file)
    f = v.facts
    if fatal := v.text(audit.STACK):
        raise UserError(f"{ctx.adopt} cannot serve profile {ctx.profile.name}: {fatal}",
                        fix="adopt an environment with the profile's Python, torch and CUDA, "
                            "or build one (without --adopt)", kind="env.stack-mismatch")
    others = v.text() or "none"
    return (f"adopted {f['executable']}: Python {f['python']}, torch {f.get('torch')}, CUDA "
            f"{f.get('torch_cuda')}, NCCL {f.get('nccl')}, cuDNN {f.get('cudnn')}; "
            f"other differences from the lock: {others}")


def _env_inputs(ctx: Context) -> str:
    return _digest(digest.of_file(ctx.profile.lock_file), str(ctx.adopt or ""))


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
    if drv and drv.kind == "absent":
        reasons.append("no GPU")
    tk = by_id.get("cuda.toolkit")
    if tk and tk.status in ("fail", "skip"):
        reasons.append(f"no CUDA {ctx.profile.cuda} toolkit ({tk.summary.split(':')[0]})")
    return "; ".join(reasons) or None


def _builds_skip(ctx: Context) -> str | None:
    if ctx.no_builds:
        return "--no-builds given"
    return _no_gpu_or_toolkit(ctx)


def _kernel_packages(ctx: Context) -> list[build.Package]:
    return list(ctx.kernels.values())


def _builds_inputs(ctx: Context) -> str:
    """What the builds are made from, as the build cache's key names it (build.recipe_inputs:
    one definition for both), with the lock (torch's pin) and an adopted interpreter."""
    p = ctx.profile
    kernels = {k.name: build.recipe_inputs(k, patches.series(k.name, k.pin), p.archs)
               for k in _kernel_packages(ctx)}
    return _digest(digest.of(kernels), digest.of_file(p.lock_file), str(ctx.adopt or ""))


def _sources_run(ctx: Context) -> str:
    return "; ".join(f"{k.name} {k.source.digest[:19]} at "
                     f"{build.fetch(k, ctx.echo, given=ctx.given, cache=ctx.cache)}"
                     for k in _kernel_packages(ctx))


def _patches_run(ctx: Context) -> str:
    """Each package's series applied once, into the tree its build copies (build.patched)."""
    done = []
    for k in _kernel_packages(ctx):
        series = patches.series(k.name, k.pin)
        tree = build.patched(k, series, ctx.echo, given=ctx.given, cache=ctx.cache)
        done.append(f"{k.name}: {len(series)} patch(es) applied in {tree}")
    return "; ".join(done)


def _builds_run(ctx: Context) -> str:
    out = []
    for k in _kernel_packages(ctx):
        r = build.build_and_install(k, ctx.python, ctx.profile.archs, echo=ctx.echo,
                                    given=ctx.given, cache=ctx.cache, child_env=ctx.child_env)
        how = "from cache" if r.cache_hit else f"built in {r.build_seconds:.0f} s"
        out.append(f"{k.name} {how}, {len(r.modules)} compiled module(s) import")
    return "; ".join(out)


def _megatron_inputs(ctx: Context) -> str:
    m = ctx.profile.megatron
    series = checkout.patch_series(ctx.profile)
    return _digest(m["repo"], m["tag"], m["commit"], digest.of_files(series),
                   digest.of_file(ctx.profile.lock_file))


def _megatron_verify(ctx: Context) -> str | None:
    return checkout.not_installed(ctx.python, ctx.profile)


def _megatron_run(ctx: Context) -> str:
    src = checkout.prepare(ctx.profile, echo=ctx.echo, given=ctx.given)
    checkout.install(ctx.profile, ctx.python, src, echo=ctx.echo, child_env=ctx.child_env)
    n = len(checkout.patch_series(ctx.profile))
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
    facts = checkout.check_import(ctx.python)
    if ctx.adopt:
        if ctx.deep and (m := manifest.load(ctx.stamps / ADOPTED_MANIFEST)):
            # The lock's packages are what training imports: a change there stops the chain.
            # The rest is the site's own (an image's replaced CA bundle, its other tools): named.
            pinned = {manifest.normalize(n) for n in
                      lock.parse_lock((ctx.profile.lock_file).read_text())}
            diffs = manifest.hash_check(m)
            bad = [d for d in diffs if d.package in pinned]
            if others := [d for d in diffs if d.package not in pinned]:
                output.warning(f"{len(manifest.packages(others))} package(s) of {ctx.adopt}'s "
                               "environment that the lock does not pin differ from their "
                               "wheels' RECORD: " + "; ".join(manifest.summarize(others)))
            if bad:
                raise UserError(f"files of {ctx.adopt}'s environment differ from their wheels' "
                                "RECORD: " + "; ".join(manifest.summarize(bad)),
                                fix="reinstall those packages in the adopted environment",
                                kind="env.changed")
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
    # quick re-check of a stamped step: a returned text says why it runs again (so does a raised
    # UserError: a broken state is repaired by running the step, never a dead end)
    verify: Callable[[Context], str | None] | None = None
    recheck_after_run: bool = False  # a stamped step that runs again when one before it ran


def steps() -> list[Step]:
    return [
        Step("check", _check_run),
        Step("lock", _lock_run, _lock_inputs),
        Step("env", _env_run, _env_inputs, verify=_env_verify),
        Step("sources", _sources_run, skip=_builds_skip),
        Step("patches", _patches_run, skip=_builds_skip),
        Step("builds", _builds_run, _builds_inputs, skip=_builds_skip),
        Step("megatron", _megatron_run, _megatron_inputs, verify=_megatron_verify),
        Step("verify", _verify_run, _verify_inputs, verify=_verify_again,
             recheck_after_run=True),
    ]


@dataclass(frozen=True)
class Decision:
    """What one step will do and why, decided before anything runs."""

    step: Step
    action: Action
    digest: str | None  # the step's input digest (None: no inputs, runs every time)
    why: str
    upstream: str = ""  # the chain's digest before this step (its digest is (upstream, inputs))


def decide(ctx: Context, chosen: list[str], chain: list[Step] | None = None) -> list[Decision]:
    """Each step's action from its stamp, its inputs' digest and the host's findings.

    A step's digest covers its own inputs and what the steps before it are: a step that runs
    now is what its digest says; a step that does not (not chosen, or skipped on this machine)
    is what its stamp says (nothing, without one). So the digest of a step is the same whichever
    steps are chosen: `invoke megatron` and `invoke setup` agree on the megatron step's, and a
    changed pin re-runs everything downstream of it."""
    out: list[Decision] = []
    upstream = ""
    for step in chain if chain is not None else steps():
        stamp, missing = state.read(ctx.stamps, step.name)
        stamped = stamp.digest if stamp else ""
        if step.name not in chosen:
            out.append(Decision(step, Action.UNCHOSEN, None, "not chosen", upstream))
        elif reason := (step.skip(ctx) if step.skip else None):
            out.append(Decision(step, Action.SKIP, None, reason, upstream))
        elif step.inputs is None:
            out.append(Decision(step, Action.RUN, None, "runs every time (host state)", upstream))
        else:
            d = _digest(upstream, step.inputs(ctx))
            if stamp is not None and stamp.digest == d:
                out.append(Decision(step, Action.VERIFY, d, stamp.detail, upstream))
            else:
                out.append(Decision(step, Action.RUN, d, missing or "its inputs changed",
                                    upstream))
        here = out[-1]
        upstream = _digest(upstream, (here.digest or "") if here.action in (
            Action.RUN, Action.VERIFY) else stamped)
    return out


def _again(ctx: Context, d: Decision, now: str | None, ran: list[str]) -> str | None:
    """Why a stamped step runs after all (None: it is up to date)."""
    if now != d.digest:
        return "its inputs changed during this run"
    if d.step.recheck_after_run and ran:
        return f"{', '.join(ran)} ran before it"
    if not d.step.verify:
        return None
    try:
        return d.step.verify(ctx)
    except UserError as e:
        return f"its re-check failed ({e.message})"


def _inputs_now(upstream: str, step: Step, ctx: Context) -> str | None:
    # an earlier step of this run may have made this one's inputs (the env step writes the
    # manifest the verify step names; a repair rewrites it): the stamp records them as they
    # are now, and a stamped step whose inputs changed runs
    return _digest(upstream, step.inputs(ctx)) if step.inputs else None


def execute(ctx: Context, decisions: list[Decision]) -> tuple[list[Row], bool]:
    """Carry the decisions out in order; the first failure stops the chain. The chain's digest
    is carried along as the steps leave it (a step's inputs may change while it runs: the
    steps after it are stamped with what is there now)."""
    rows: list[Row] = []
    ran: list[str] = []  # stamped steps that ran in this run
    upstream = ""
    for d in decisions:
        name = d.step.name
        if d.action in (Action.UNCHOSEN, Action.SKIP):
            stamp, _ = state.read(ctx.stamps, name)
            upstream = _digest(upstream, stamp.digest if stamp else "")
            if d.action is Action.SKIP:
                rows.append(Row(name, Outcome.SKIPPED, 0.0, d.why))
            continue
        if rows and rows[-1].status in (Outcome.FAILED, Outcome.NOT_RUN):
            rows.append(Row(name, Outcome.NOT_RUN, 0.0, "an earlier step failed"))
            continue
        t0 = time.monotonic()
        try:
            now = _inputs_now(upstream, d.step, ctx)
            upstream = _digest(upstream, now or "")
            if d.action is Action.VERIFY:
                again = _again(ctx, d, now, ran)
                if not again:
                    rows.append(Row(name, Outcome.UP_TO_DATE, time.monotonic() - t0, d.why))
                    continue
                ctx.echo(f"{name}: {again}; running it again")
            detail = d.step.run(ctx)
            if now is not None:
                state.write(ctx.stamps, name, now, detail)
                ran.append(name)
            rows.append(Row(name, Outcome.DONE, time.monotonic() - t0, detail))
        except UserError as e:
            state.remove(ctx.stamps, name)
            rows.append(Row(name, Outcome.FAILED, time.monotonic() - t0,
                            e.message + (f"\nhint: {e.fix}" if e.fix else "")))
    return rows, not any(r.status is Outcome.FAILED for r in rows)


def predict(ctx: Context, decisions: list[Decision]) -> list[Row]:
    """What `execute` would do, writing nothing: a stamped step's quick re-check runs (it only
    reads), so a changed environment is predicted to run with the reason it would give."""
    rows = []
    ran: list[str] = []
    for d in decisions:
        if d.action is Action.UNCHOSEN:
            continue
        status, why = {Action.RUN: Outcome.WOULD_RUN, Action.SKIP: Outcome.SKIPPED}.get(
            d.action, Outcome.UP_TO_DATE), d.why
        if d.action is Action.VERIFY and (again := _again(ctx, d, d.digest, ran)):
            status, why = Outcome.WOULD_RUN, again
        if status is Outcome.WOULD_RUN and d.digest is not None:
            ran.append(d.step.name)
        rows.append(Row(d.step.name, status, 0.0, why))
    return rows


def _chosen(only: str | None, start: str | None) -> list[str]:
    for name in (only, start):
        if name and name not in STEPS:
            raise UserError(f"unknown step {name!r}; steps: {', '.join(STEPS)}", kind="input.value")
    return [only] if only else STEPS[STEPS.index(start):] if start else STEPS


@contextmanager
def _held(ctx: Context) -> Iterator[None]:
    """The stamps directory made and held: one run at a time works on a prefix's setup."""
    try:
        ctx.stamps.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {ctx.stamps}: {e.strerror}",
                        fix="choose a writable --prefix", kind="setup.stamps") from None
    with mutex.exclusive(ctx.stamps / ".lock", "waiting: another run is working on the setup "
                           f"of {ctx.prefix} (it holds {ctx.stamps / '.lock'})", ctx.echo):
        yield


def run(ctx: Context, *, only: str | None = None, start: str | None = None,
        dry_run: bool = False) -> tuple[list[Row], bool]:
    """Check the host (a precondition: skip reasons come from its findings), decide every
    step, then run them, or with dry_run only say what would run and why."""
    chosen = _chosen(only, start)
    if dry_run:  # a plan writes nothing (the prefix may be read-only)
        ctx.findings = checks.evaluate(ctx.profile, ctx.snapshot_dir)
        return predict(ctx, decide(ctx, chosen)), True
    with _held(ctx):
        ctx.findings = checks.evaluate(ctx.profile, ctx.snapshot_dir)
        return execute(ctx, decide(ctx, chosen))


T = TypeVar("T")


def one_step(ctx: Context, name: str, body: Callable[[], tuple[T, str]]) -> T:
    """A front door that does one step's work its own way (`invoke env` with its options,
    `invoke build all`) through the chain's stamps: `body` -> (its result, the stamp's detail).
    The stamp it writes is the one `invoke setup` would have written, so the next setup finds
    the step up to date; a failure removes it, as in the chain. A prefix whose stamps cannot be
    written (a read-only mount) is worked on without them."""
    made = not ctx.stamps.exists()
    try:
        ctx.stamps.mkdir(parents=True, exist_ok=True)
    except OSError:
        return body()[0]
    try:
        with _held(ctx):
            (d,) = [x for x in decide(ctx, [name]) if x.step.name == name]
            try:
                result, detail = body()
            except UserError:
                state.remove(ctx.stamps, name)
                raise
            if (now := _inputs_now(d.upstream, d.step, ctx)) is not None:
                state.write(ctx.stamps, name, now, detail)
            return result
    except UserError:
        if made:  # a refused first run leaves nothing behind (no stamps directory, no lock)
            shutil.rmtree(ctx.stamps, ignore_errors=True)
        raise
