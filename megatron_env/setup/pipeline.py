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
from dataclasses import dataclass
from typing import TypeVar

from megatron_env import mutex
from megatron_env.errors import UserError
from megatron_env.host import checks
from megatron_env.setup import state
from megatron_env.setup.state import Action, Outcome
from megatron_env.setup.steps import (  # the chain's names, used from here
    STEPS,
    Context,
    Row,
    Step,
    chain_digest,
    steps,
)

__all__ = ["STEPS", "Context", "Decision", "Row", "Step", "chosen_steps", "decide", "execute",
           "one_step", "predict", "run", "steps"]


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
            d = chain_digest(upstream, step.inputs(ctx))
            if stamp is not None and stamp.digest == d:
                out.append(Decision(step, Action.VERIFY, d, stamp.detail, upstream))
            else:
                out.append(Decision(step, Action.RUN, d, missing or "its inputs changed",
                                    upstream))
        here = out[-1]
        upstream = chain_digest(upstream, (here.digest or "") if here.action in (
            Action.RUN, Action.VERIFY) else _passed_on(ctx, here, stamped))
    return out


def _passed_on(ctx: Context, d: Decision, stamped: str) -> str:
    """What a step that does not run now passes on to the chain: its stamp's digest; an
    unchosen step without a stamp (never run, or its last run failed) passes on the digest it
    would be stamped with, so that `invoke megatron` and a later `invoke setup`, whose lock step
    then runs with the same inputs, agree on the megatron step's digest (it was installed twice).
    A skipped step passes on its stamp only (nothing when it has none), and so does an
    unchosen one that this machine would skip: as it does in the full chain."""
    if stamped or d.action is not Action.UNCHOSEN or d.step.inputs is None:
        return stamped
    if d.step.skip and d.step.skip(ctx):
        return stamped
    try:
        return chain_digest(d.upstream, d.step.inputs(ctx))
    except UserError:
        return ""  # its inputs cannot be read now: as a step that never ran


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
    return chain_digest(upstream, step.inputs(ctx)) if step.inputs else None


def execute(ctx: Context, decisions: list[Decision]) -> tuple[list[Row], bool]:
    """Carry the decisions out in order; the first failure stops the chain: every step after
    it, skipped ones too, is reported as not run and nothing of it runs (a skipped step between
    them does not let a later one run on a state the failed step left). A step that fails, or
    crashes with any other exception (a bug, Ctrl-C), loses its stamp: the next run runs it
    again. The chain's digest is carried along as the steps leave it (a step's inputs may
    change while it runs: the steps after it are stamped with what is there now)."""
    rows: list[Row] = []
    ran: list[str] = []  # stamped steps that ran in this run
    upstream = ""
    failed = False
    for d in decisions:
        name = d.step.name
        if failed:
            if d.action is not Action.UNCHOSEN:
                rows.append(Row(name, Outcome.NOT_RUN, 0.0, "an earlier step failed"))
            continue
        if d.action in (Action.UNCHOSEN, Action.SKIP):
            stamp, _ = state.read(ctx.stamps, name)
            upstream = chain_digest(upstream, _passed_on(
                ctx, Decision(d.step, d.action, None, d.why, upstream),
                stamp.digest if stamp else ""))
            if d.action is Action.SKIP:
                rows.append(Row(name, Outcome.SKIPPED, 0.0, d.why))
            continue
        t0 = time.monotonic()
        try:
            now = _inputs_now(upstream, d.step, ctx)
            upstream = chain_digest(upstream, now or "")
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
            failed = True
            rows.append(Row(name, Outcome.FAILED, time.monotonic() - t0,
                            e.message + (f"\nhint: {e.fix}" if e.fix else ""), e.kind or ""))
        except BaseException:
            state.remove(ctx.stamps, name)  # what it left is unknown: it runs next time
            raise
    return rows, not failed


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


def chosen_steps(only: str | None, start: str | None) -> list[str]:
    for name in (only, start):
        if name and name not in STEPS:
            raise UserError(f"unknown step {name!r}; steps: {', '.join(STEPS)}",
                            fix="pass --only or --from one of those steps (`setup --dry-run` "
                                "shows the plan)", kind="input.value")
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
    chosen = chosen_steps(only, start)
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
            except BaseException:  # a refusal, a crash or Ctrl-C: the step runs next time
                state.remove(ctx.stamps, name)
                raise
            if (now := _inputs_now(d.upstream, d.step, ctx)) is not None:
                state.write(ctx.stamps, name, now, detail)
            return result
    except UserError:
        if made:  # a refused first run leaves nothing behind (no stamps directory, no lock)
            shutil.rmtree(ctx.stamps, ignore_errors=True)
        raise
