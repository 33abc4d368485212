"""The setup chain's steps: what each one is made from (`inputs`), does (`run`), when it cannot
run here (`skip`) and how a stamped one is re-checked (`verify`). pipeline.py decides and runs
them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_env import digest, findings, output
from megatron_env.errors import UserError
from megatron_env.findings import Finding
from megatron_env.kernels import build, gpu_proof, imports, source_trees
from megatron_env.megatron import checkout
from megatron_env.profile import Profile
from megatron_env.pyenv import audit, env, lock, manifest, probe
from megatron_env.recipes.recipe import Package
from megatron_env.setup.state import Outcome
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
    jobs: int | None = None  # --jobs: caps the kernels' shared pool of compile jobs
    deep: bool = False  # re-hash every installed file and import again (--verify-deep)
    bundle: Bundle | None = None  # where sources, wheels and the conda layer come from offline
    kernels: dict[str, Package] = field(default_factory=dict)  # resolved once, below
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
        return env.setup_dir(self.prefix)

    @property
    def python(self) -> Path:
        return self.adopt or env.python_of(self.prefix)


@dataclass(frozen=True)
class Row:
    step: str
    status: Outcome
    seconds: float
    detail: str
    kind: str = ""  # a failed step's error kind (disk.full, lock.stale ...): what a program reads


def chain_digest(*parts: str) -> str:
    """A step's input digest (16 hex digits) from its parts: one definition for the steps'
    inputs and the chain that links them (pipeline.decide)."""
    return digest.hexpart(digest.of(list(parts)), 16)


# --- the steps: (inputs, run, skip-reason) ---------------------------------------------------


def _check_run(ctx: Context) -> str:
    """The host's findings are gathered before any step is decided (`run`); this reports them."""
    failed = [f.id for f in ctx.findings if f.status == "fail"]
    return findings.summary_line(ctx.findings) + (f" ({', '.join(failed)})" if failed else "")


def _lock_inputs(ctx: Context) -> str:
    p = ctx.profile
    return chain_digest(*(digest.of_file(f) for f in (p.path, p.lock_file,
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
        return adopt_checked(ctx)
    b = ctx.bundle
    s = env.build(ctx.profile, ctx.prefix, deep=ctx.deep, echo=ctx.echo,
                  find_links=b.find_links if b else None, no_index=bool(b),
                  conda_lock=b.conda_lock if b else None, child_env=ctx.child_env)
    env.forget_adopted(ctx.prefix)  # built here: its own interpreter serves it again
    return f"{s.action}: Python {s.facts['python']}, torch {s.facts.get('torch')}, CUDA " \
           f"{s.facts.get('torch_cuda')}, {len(s.facts['dists'])} packages"


def adopt_checked(ctx: Context) -> str:
    """An existing environment: Python, torch and its CUDA must match; other packages may differ
    from the lock (an NGC container has its own), and each difference is listed. Once it
    serves, the prefix records it (env.record_adopted): every command that runs the
    environment's interpreter (preflight, report, the nox sessions) runs this one."""
    assert ctx.adopt is not None  # the env step adopts only with --adopt
    v = audit.verify(ctx.adopt, ctx.profile, ctx.profile.lock_file)
    f = v.facts
    if fatal := v.text(audit.STACK):
        raise UserError(f"{ctx.adopt} cannot serve profile {ctx.profile.name}: {fatal}",
                        fix="adopt an environment with the profile's Python, torch and CUDA, "
                            "or build one (without --adopt)", kind="env.stack-mismatch")
    others = v.text() or "none"
    env.record_adopted(ctx.prefix, ctx.adopt, probe.torch_stamp(ctx.adopt))
    return (f"adopted {f['executable']}: Python {f['python']}, torch {f.get('torch')}, CUDA "
            f"{f.get('torch_cuda')}, NCCL {f.get('nccl')}, cuDNN {f.get('cudnn')}; "
            f"other differences from the lock: {others}")


def _torch_change(before: str | None, now: str | None) -> str:
    """A replaced torch said by name: `torch 2.1.0 -> 2.2.0`, or, the version the same, that
    its compiled core is another build's."""
    if before == now:
        return f"torch {now} replaced by another build of it (its compiled core changed)"
    return f"torch {before or '(version not recorded)'} -> {now or '(none)'}"


def _env_inputs(ctx: Context) -> str:
    return chain_digest(digest.of_file(ctx.profile.lock_file), str(ctx.adopt or ""))


def _env_verify(ctx: Context) -> str | None:
    """The manifest's stat check: why the env step must run again (it then repairs what changed
    from the lock), or None when every installed file is as the build left it."""
    if ctx.adopt:
        if env.adopted(ctx.prefix) != env.interpreter(ctx.prefix, ctx.adopt):
            return f"{ctx.prefix} does not record {ctx.adopt} as its interpreter"
        # torch's compiled core by path, size and mtime (read from files, ~50 ms): a torch
        # replaced since the adoption is checked against the profile again, and the builds
        # step's inputs hold the adopted torch (its kernels are built for the new one)
        now, then = probe.torch_stamp(ctx.adopt), env.adopted_torch(ctx.prefix)
        if now.get("stamp") != then["stamp"]:
            return (f"the torch of {ctx.adopt} changed since it was adopted: "
                    f"{_torch_change(then.get('torch'), now.get('torch'))}")
        return None
    if ctx.deep:
        return "--verify-deep given"
    diffs = env.changes(ctx.prefix)
    if diffs is None:
        return "the environment has no manifest yet"
    return f"changed since its build: {'; '.join(manifest.summarize(diffs))}" if diffs else None


def _no_gpu_or_toolkit(ctx: Context) -> str | None:
    """Why kernels cannot be built here, from the check step's findings (None: they can). A
    kernel without CUDA code (Recipe.cuda false) builds on any machine with a compiler."""
    if not any(k.cuda for k in _kernel_packages(ctx)):
        return None
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
    if not ctx.kernels:
        return f"profile {ctx.profile.name} builds no kernels"
    return _no_gpu_or_toolkit(ctx)


def kernels_not_installed(ctx: Context) -> str | None:
    """Quick (no import): why the kernels the builds step made are no longer what it left in
    the environment's interpreter (None: every one is there). Its stamp stands for them: a
    kernel uninstalled, a file of its RECORD deleted (a compiled module's .so), or an
    installed distribution without the shared object a declared module needs runs the step
    again, which reinstalls the cached wheel (seconds) or builds it when the cache lost it."""
    kernels = _kernel_packages(ctx)
    if not ctx.python.exists():
        return f"no interpreter at {ctx.python}"
    names = {manifest.normalize(k.name) for k in kernels}
    dists = {d["name"]: d for d in manifest.scan(probe.sites(ctx.python), names)["dists"].values()}
    problems = []
    for k in kernels:
        d = dists.get(manifest.normalize(k.name))
        if d is None:
            problems.append(f"{k.name} is not installed for {ctx.python}")
            continue
        if d["absent"]:
            more = f" and {len(d['absent']) - 2} more" if len(d["absent"]) > 2 else ""
            problems.append(f"{k.name} is missing {', '.join(d['absent'][:2])}{more}")
            continue
        have = [f[0] for f in d["files"] if f[0].endswith(".so")]
        if lost := [lib for lib in k.wheel_libraries
                    if not any(f"/{lib}." in p or p.endswith(f"/{lib}.so") for p in have)]:
            problems.append(f"{k.name} {d['version']} has no compiled {', '.join(lost)}")
    return "; ".join(problems) or None


def _kernel_packages(ctx: Context) -> list[Package]:
    return list(ctx.kernels.values())


def _builds_inputs(ctx: Context) -> str:
    """What the builds are made from, as the build cache's key names it (build.recipe_inputs:
    one definition for both), with the lock (torch's pin) and an adopted interpreter."""
    p = ctx.profile
    kernels = {k.name: build.recipe_inputs(k, patches.series(k.name, k.pin), p.archs)
               for k in _kernel_packages(ctx)}
    # adopted: the torch the adoption recorded (the env step records a replaced one once the
    # profile accepts it): kernels built against the torch it replaced are built again
    adopted = [digest.of(env.adopted_torch(ctx.prefix))] if ctx.adopt else []
    return chain_digest(digest.of(kernels), digest.of_file(p.lock_file), str(ctx.adopt or ""),
                        *adopted)


def _sources_inputs(ctx: Context) -> str:
    return chain_digest(*(k.source.digest for k in _kernel_packages(ctx)))


def _sources_verify(ctx: Context) -> str | None:
    """A stamped fetch holds while each pristine tree is complete (its marker, written last)."""
    gone = [k.name for k in _kernel_packages(ctx)
            if not (source_trees.pristine_path(k, ctx.cache) / ".megatron-env-pristine").exists()]
    return f"no complete source tree of {', '.join(gone)} in {ctx.cache}" if gone else None


def _sources_run(ctx: Context) -> str:
    return "; ".join(f"{k.name} {k.source.digest[:19]} at "
                     f"{source_trees.fetch(k, ctx.echo, given=ctx.given, cache=ctx.cache)}"
                     for k in _kernel_packages(ctx))


def _patches_inputs(ctx: Context) -> str:
    return chain_digest(*(digest.of([k.source.digest,
                                     digest.of_files(patches.series(k.name, k.pin))])
                          for k in _kernel_packages(ctx)))


def _patches_verify(ctx: Context) -> str | None:
    """A stamped series holds while each patched tree is complete: nothing is applied again."""
    gone = [k.name for k in _kernel_packages(ctx)
            if not (source_trees.patched_path(k, patches.series(k.name, k.pin), ctx.cache)
                    / ".megatron-env-patched").exists()]
    return f"no complete patched tree of {', '.join(gone)} in {ctx.cache}" if gone else None


def _patches_run(ctx: Context) -> str:
    """Each package's series applied once, into the tree its build copies (source_trees.patched)."""
    done = []
    for k in _kernel_packages(ctx):
        series = patches.series(k.name, k.pin)
        tree = source_trees.patched(k, series, ctx.echo, given=ctx.given, cache=ctx.cache)
        done.append(f"{k.name}: {len(series)} patch(es) applied in {tree}")
    return "; ".join(done)


def _builds_run(ctx: Context) -> str:
    """Every kernel from one pool of compile jobs (kernels.together); a failure stops the
    others and keeps what finished in the cache."""
    from megatron_env.kernels import together  # the pool's scheduler: only when building

    outcomes = together.build_together(_kernel_packages(ctx), ctx.python, ctx.profile.archs,
                                       echo=ctx.echo, given=ctx.given, cache=ctx.cache,
                                       child_env=ctx.child_env, jobs=ctx.jobs)
    together.raise_for(outcomes)
    out = []
    for o in outcomes:
        assert o.result is not None
        r = o.result
        how = "from cache" if r.cache_hit else f"built in {r.build_seconds:.0f} s"
        out.append(f"{o.name} {how}, {len(r.modules)} compiled module(s) import")
    return "; ".join(out)


def _megatron_inputs(ctx: Context) -> str:
    m = ctx.profile.megatron
    series = checkout.patch_series(ctx.profile)
    return chain_digest(m["repo"], m["tag"], m["commit"], digest.of_files(series),
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
        return chain_digest(str(ctx.adopt))
    return chain_digest((env.read_stamp(ctx.prefix) or {}).get("manifest", ""))


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


def verify_stack(ctx: Context) -> str:
    """The whole stack proven in the environment's interpreter, in one run of it: torch,
    Megatron from its pinned checkout with its dataset helpers, every compiled module of each
    kernel the setup built, and (a built environment) every package of the lock installed."""
    kernels = [] if _builds_skip(ctx) else _kernel_packages(ctx)
    wanted = tuple(m for k in kernels for m in k.modules)
    facts = checkout.check_import(ctx.python, wanted)
    if failed := [m for m in wanted if m not in facts["imported"]]:
        raise UserError(f"compiled modules of the kernels do not import for {ctx.python}: "
                        f"{', '.join(failed)}: " + "; ".join(facts["errors"])[-600:],
                        fix="run `invoke setup` again (it reinstalls the kernels from the "
                            "wheel cache); if it says so again, rebuild them with `invoke build "
                            "all`", kind="verify.kernel-import-failed")
    if wrong := checkout.not_pinned(ctx.profile, facts["imported"]["megatron.core"]):
        raise UserError(wrong, fix="remove the other Megatron from PYTHONPATH or the "
                                   "environment, then run `invoke setup` again",
                        kind="verify.megatron-not-pinned")
    if not ctx.adopt:  # an adopted one may lack lock packages: the env step listed them
        locked = lock.parse_lock(ctx.profile.lock_file.read_text())
        if absent := sorted(n for n in locked if n not in facts.get("dists", {})):
            raise UserError(f"packages of the lock are not installed for {ctx.python}: "
                            + ", ".join(absent), fix="run `invoke setup --verify-deep` (it "
                            "repairs the environment from the lock)", kind="verify.lock-missing")
    if ctx.adopt:
        if ctx.deep and (m := manifest.load(ctx.stamps / ADOPTED_MANIFEST)):
            # The lock's packages are what training imports: a change there stops the chain.
            # The rest is the site's own (an image's replaced CA bundle, its other tools): named.
            pinned = {manifest.normalize(n) for n in
                      lock.parse_lock(lock.read(ctx.profile.lock_file))}
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
    proof = _gpu_proof(ctx, [k.name for k in kernels])
    core = Path(facts["imported"]["megatron.core"])
    built = {m for k in kernels for m in k.modules}
    if kernels and (gone := imports.not_built(
            core.parent.parent, [k.name for k in kernels], built)):
        raise UserError("Megatron imports compiled modules the setup did not build: "
                        + ", ".join(f"{m} ({at})" for m, at in sorted(gone.items())),
                        fix=f"add them to their kernel's table in {ctx.profile.path} (the "
                            "choice that lists its modules)", kind="verify.kernel-module-missing")
    where = core.parent.parent.parent.name
    return f"import torch {facts.get('torch')} (CUDA {facts.get('torch_cuda')}), " \
           f"megatron.core from {where} and its dataset helpers" + (
               f", {len(wanted)} compiled module(s) of {len(kernels)} kernel(s)"
               if kernels else "") + proof + ": ok"


def _has_gpu(ctx: Context) -> bool:
    """The check step found a driver and GPUs (an absent driver is no GPU)."""
    drv = next((f for f in ctx.findings if f.id == "driver.version"), None)
    return drv is not None and drv.kind != "absent" and drv.status != "skip"


def _gpu_proof(ctx: Context, kernels: list[str]) -> str:
    """On a GPU, one small call of each built kernel that has a GPU check (gpu_proof); a kernel
    that computes wrong, or cannot run, stops the chain. -> what the verify row says of it."""
    wanted = gpu_proof.checks(kernels)
    if not wanted or not _has_gpu(ctx):
        return ""
    got = gpu_proof.run(ctx.python, wanted)
    if bad := {k: v for k, v in got.items() if v[0] not in ("pass", "skip")}:
        raise UserError("kernels do not compute what PyTorch computes on this GPU: "
                        + "; ".join(f"{k}: {summary}" for k, (_s, summary) in sorted(
                            bad.items())),
                        fix="rebuild them for this GPU's arch (`invoke build all`), then run "
                            "`invoke setup` again", kind="verify.kernel-gpu-check")
    passed = [k for k, (status, _s) in got.items() if status == "pass"]
    return f", {len(passed)} of {len(wanted)} kernel(s) checked on the GPU"


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
        Step("sources", _sources_run, _sources_inputs, skip=_builds_skip,
             verify=_sources_verify),
        Step("patches", _patches_run, _patches_inputs, skip=_builds_skip,
             verify=_patches_verify),
        Step("builds", _builds_run, _builds_inputs, skip=_builds_skip,
             verify=kernels_not_installed),
        Step("megatron", _megatron_run, _megatron_inputs, verify=_megatron_verify),
        Step("verify", verify_stack, _verify_inputs, verify=_verify_again,
             recheck_after_run=True),
    ]


