"""The chain and the bundle: `setup` (check -> lock -> env -> sources -> patches -> builds ->
megatron -> verify), `megatron`, the verification programs (`verify`, behind nox's sessions) and
`bundle`; a `--bundle` is checked here once and passed down as a value."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_env import findings, output
from megatron_env.commands import cli, places, pyenv
from megatron_env.commands.cli import command, guarded, json_error
from megatron_env.errors import UserError
from megatron_env.profile import load as load_profile
from megatron_env.units import MIB

if TYPE_CHECKING:
    from megatron_env.setup import pipeline


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

    with json_error(json, "setup"):
        b = pyenv.use_bundle(bundle, profile, adopt, None if no_builds else "all", "--adopt PYTHON",
                        provenance=(expect_sha256, trust))
        prof = b.profile if b else load_profile(profile)
        where = Path(prefix).absolute() if prefix else env.default_prefix(prof)
        ctx = pipeline.Context(prof, where,
                               adopt=env.interpreter(where, adopt) if adopt else None,
                               no_builds=no_builds, deep=verify_deep, bundle=b,
                               jobs=_jobs(jobs))
        if not dry_run:
            places.announce(prefix=ctx.prefix, cache=ctx.cache)
        t0 = time.monotonic()
        with places.saying_what_is_kept(ctx.cache):
            rows, ok = pipeline.run(ctx, only=only, start=from_, dry_run=dry_run)
    if ctx.jobs is not None:
        _jobs_unused(ctx.jobs, rows)
    verdict = _verdict(ok, dry_run, only, from_)
    if json:
        return _setup_json(ctx, rows, verdict, ok, time.monotonic() - t0)
    if ctx.findings and not only:
        findings.print_findings(ctx.findings, f"check: this host against {prof.name}")
    output.table([(r.step, r.status.value, f"{r.seconds:.1f}", r.detail) for r in rows],
                 status_col=1)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    part = (f" (--only {only}" if only else f" (--from {from_}" if from_ else "")
    part += "; `invoke setup` says whether the environment is ready)" if part else ""
    output.summary(f"setup {verdict}{part}: {prof.name} at {ctx.prefix}; "
                   + ", ".join(f"{n} {s}" for s, n in counts.items())
                   + f"; {time.monotonic() - t0:.1f} s", status=verdict)
    return 0 if ok else 1


def _verdict(ok: bool, dry_run: bool, only: str | None, from_: str | None) -> str:
    """The verdict's word: "ready" only for a run of the whole chain that ended well; a part of
    it (--only check, --from megatron) proves nothing about the steps it left out: "done"."""
    if dry_run:
        return "dry run"
    if not ok:
        return "stopped"
    return "done" if only or from_ else "ready"


def _jobs_unused(jobs: int, rows: list[pipeline.Row]) -> None:
    """--jobs caps the kernels' compile jobs: where no kernel compiles in this run (the builds
    step skipped on a host without a GPU toolkit, up to date, left out or not in the run), the
    option did nothing, and that is said rather than left for the user to wonder."""
    from megatron_env.setup.state import Outcome

    row = next((r for r in rows if r.step == "builds"), None)
    if row is not None and row.status in (Outcome.DONE, Outcome.FAILED, Outcome.WOULD_RUN):
        return
    why = (f"the builds step {row.status.value}: {row.detail.splitlines()[0]}" if row
           else "the builds step is not part of this run")
    output.warning(f"--jobs {jobs} changed nothing: no kernel compiles here ({why})")


def _setup_json(ctx: pipeline.Context, rows: list[pipeline.Row], verdict: str, ok: bool,
                seconds: float) -> int:
    """setup's rows as JSON, each with the digest its stamp recorded (None when not stamped)."""
    import json

    from megatron_env.setup import state

    def stamped(step: str) -> str | None:
        stamp, _why = state.read(ctx.stamps, step)
        return stamp.digest if stamp else None

    output.block(json.dumps({
        "profile": ctx.profile.name, "prefix": str(ctx.prefix),
        "verdict": verdict, "seconds": seconds,
        "steps": [{"step": r.step, "status": r.status.value, "digest": stamped(r.step),
                   "seconds": round(r.seconds, 3), "detail": r.detail,
                   **({"kind": r.kind} if r.kind else {})} for r in rows],
        "findings": [f.to_dict() for f in ctx.findings]}, indent=1) + "\n")
    return 0 if ok else 1


@command(prefix=f"the environment to install into (default {cli.ENVS}/<profile>)")
def megatron(profile: str | None = None, prefix: str | None = None) -> int:
    """Check out Megatron-LM at the profile's tag (pinned commit), patch it, install it."""
    return setup(profile, prefix, only="megatron")


@guarded
def verify(name: str, args: list[str]) -> int:
    """A verification program of scripts/ in the profile's environment (the nox sessions)."""
    from megatron_env.megatron import programs

    return programs.run(name, args)


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
    from megatron_env.sources import repos

    with json_error(json, "bundle"):
        prof = load_profile(profile)
        if sign:
            prov.signing_key(Path(sign))  # before the download, not after it
        places.announce(cache=repos.cache_dir(), out=Path(out).absolute())
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
    output.table([(role, f"{size / MIB:.1f} MiB") for role, size
                  in sorted(made.by_role.items(), key=lambda x: -x[1])], indent="  ")
    delta = f", {made.reused} files left to its base" if since else ""
    output.summary(f"bundle {made.out}: {prof.name} ({made.manifest['mode']}), "
                   f"{made.written} files{delta}, {made.size / MIB:.1f} MiB, "
                   f"{made.seconds:.1f} s; sha256 {sha} (in {prov.sum_file(made.out).name}"
                   + (f", signed: {sig.name}" if sig else ", unsigned") + ")")
    return 0

