"""The setup chain stops at its first failure, whatever came before or after it.

`execute` once stopped only when the row just before a step had failed: a skipped step (no
GPU, --no-builds) between a failure and the megatron step let the megatron step run on the
state the failed step left. The property below runs every sequence of step outcomes (done, up
to date, skipped, failed, crashed) through the real `decide` and `execute` with stamps on disk;
the last test drives the chain's real lock step into an unexpected exception."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_env import profile
from megatron_env.errors import UserError
from megatron_env.setup import pipeline, state
from megatron_env.setup.pipeline import Step
from megatron_env.setup.state import Outcome

OUTCOMES = ["done", "up to date", "skipped", "failed", "crashed"]


class Crash(RuntimeError):
    """An exception no step raises on purpose (a bug in a step, not a refusal)."""


def _chain(plan: list[str], ran: list[str], ready: bool) -> list[Step]:
    """Steps that end as `plan` says once `ready` has stamped them all."""

    def mk(i: int, outcome: str) -> Step:
        name = f"s{i}"

        def run(ctx: object) -> str:
            ran.append(name)
            if not ready and outcome == "failed":
                raise UserError(f"{name} broke", fix="fix it", kind="test.fail")
            if not ready and outcome == "crashed":
                raise Crash(name)
            return f"{name} ran"

        return Step(name, run, lambda ctx: f"{name}-inputs",
                    skip=lambda ctx: "no GPU" if not ready and outcome == "skipped" else None,
                    # done: its re-check finds a reason, so the stamped step runs again
                    verify=lambda ctx: "stale" if outcome != "up to date" else None)

    return [mk(i, o) for i, o in enumerate(plan)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=9))
def test_the_first_failure_stops_the_chain_for_every_sequence_of_outcomes(plan):
    with tempfile.TemporaryDirectory() as tmp:
        ctx = SimpleNamespace(stamps=Path(tmp), echo=lambda *a, **k: None)
        ran: list[str] = []
        chain = _chain(plan, ran, ready=True)  # every step stamped first
        rows, ok = pipeline.execute(ctx, pipeline.decide(ctx, [s.name for s in chain], chain))
        assert ok and [r.status for r in rows] == [Outcome.DONE] * len(plan)

        ran.clear()
        chain = _chain(plan, ran, ready=False)
        stop = next((i for i, o in enumerate(plan) if o in ("failed", "crashed")), len(plan))
        decisions = pipeline.decide(ctx, [s.name for s in chain], chain)
        if stop < len(plan) and plan[stop] == "crashed":
            with pytest.raises(Crash):
                pipeline.execute(ctx, decisions)
            rows = []
        else:
            rows, ok = pipeline.execute(ctx, decisions)
            assert ok is (stop == len(plan))
            want = {"done": Outcome.DONE, "up to date": Outcome.UP_TO_DATE,
                    "skipped": Outcome.SKIPPED, "failed": Outcome.FAILED}
            assert [r.status for r in rows] == [want[o] for o in plan[:stop + 1]] + \
                [Outcome.NOT_RUN] * (len(plan) - stop - 1)
            assert all(r.detail == "an earlier step failed" for r in rows[stop + 1:])
        # nothing after the first failure ran; up to it, what had to run ran
        assert ran == [f"s{i}" for i, o in enumerate(plan[:stop + 1])
                       if o in ("done", "failed", "crashed")]
        # the failed or crashed step lost its stamp; every other step keeps its own
        for i in range(len(plan)):
            stamped = state.read(ctx.stamps, f"s{i}")[0] is not None
            assert stamped is (i != stop), (i, plan)


def test_a_skipped_step_after_a_failure_lets_nothing_after_it_run(tmp_path):
    """The issue's sequence: lock failed, env not run, the builds skipped (a CPU host), and the
    megatron step ran on the old environment."""
    ctx = SimpleNamespace(stamps=tmp_path, echo=lambda *a, **k: None)
    ran: list[str] = []
    plan = ["done", "failed", "done", "skipped", "skipped", "skipped", "done", "done"]
    for ready in (True, False):
        ran.clear()
        chain = _chain(plan, ran, ready)
        rows, ok = pipeline.execute(ctx, pipeline.decide(ctx, [s.name for s in chain], chain))
    assert not ok and ran == ["s0", "s1"]
    assert [r.status.value for r in rows] == ["done", "failed"] + ["not run"] * 6


def test_a_real_step_that_crashes_loses_its_stamp_and_the_chain_stops(tmp_path, monkeypatch):
    """The real lock step over a lock file that is not text (refused as input.encoding since
    issue 49; it crashed with a UnicodeDecodeError before): the lock step fails, its stamp
    goes, and the env step after it never runs."""
    envs = tmp_path / "envs"
    shutil.copytree(profile.envs_root() / "core_v0.4.0-cu121", envs / "core_v0.4.0-cu121")
    prof = profile.load("core_v0.4.0-cu121", envs)
    ctx = pipeline.Context(prof, tmp_path / "prefix", echo=lambda *a, **k: None)
    ctx.stamps.mkdir()
    real = {s.name: s for s in pipeline.steps()}
    envs_ran: list[str] = []
    chain = [real["lock"], Step("env", lambda c: envs_ran.append("env") or "built",
                                real["env"].inputs)]
    rows, ok = pipeline.execute(ctx, pipeline.decide(ctx, ["lock", "env"], chain))
    assert ok and [r.status for r in rows] == [Outcome.DONE, Outcome.DONE]
    assert state.read(ctx.stamps, "lock")[0] is not None

    prof.lock_file.write_bytes(prof.lock_file.read_bytes() + b"\n# \xff\xfe not utf-8\n")
    envs_ran.clear()
    rows, ok = pipeline.execute(ctx, pipeline.decide(ctx, ["lock", "env"], chain))
    assert not ok and [r.status for r in rows] == [Outcome.FAILED, Outcome.NOT_RUN]
    assert state.read(ctx.stamps, "lock")[0] is None
    assert envs_ran == []


def test_a_front_door_step_that_crashes_loses_its_stamp(tmp_path, monkeypatch):
    """`invoke env` through one_step: a crash in its body takes the stamp away as a refusal
    does, so the next setup runs the step instead of trusting it."""
    ran: list[str] = []
    chain = _chain(["done"], ran, ready=True)
    monkeypatch.setattr(pipeline, "steps", lambda: chain)
    ctx = SimpleNamespace(stamps=tmp_path / "p.setup", prefix=tmp_path / "p",
                          echo=lambda *a, **k: None)
    assert pipeline.one_step(ctx, "s0", lambda: (1, "made")) == 1
    assert state.read(ctx.stamps, "s0")[0] is not None
    with pytest.raises(Crash):
        pipeline.one_step(ctx, "s0", lambda: (_ for _ in ()).throw(Crash("s0")))
    assert state.read(ctx.stamps, "s0")[0] is None
