"""The setup chain's decision code without tools: `decide`, `execute` and `predict` over steps
whose inputs and bodies are plain functions, stamps in a temporary directory. Fast (no
subprocess); these are the tests that must kill mutants of setup/pipeline.py and setup/state.py
(tests/test_setup_chain.py drives the real tool)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_env.errors import UserError
from megatron_env.setup import pipeline, state
from megatron_env.setup.pipeline import Step
from megatron_env.setup.state import Action, Outcome, Stamp

NAMES = ["check", "lock", "env", "sources", "patches", "builds", "megatron", "verify"]


class World:
    """Inputs, skips and verify verdicts of a chain of fake steps, and what ran."""

    def __init__(self, tmp: Path, skip: set[str] = frozenset()):
        self.inputs = {n: f"{n}-1" for n in NAMES if n not in ("check", "sources", "patches")}
        self.skip = set(skip)
        self.broken: dict[str, str] = {}  # step -> the reason its verify gives
        self.raises: set[str] = set()  # steps whose verify raises
        self.fails: set[str] = set()  # steps whose run fails
        self.ran: list[str] = []
        self.ctx = SimpleNamespace(stamps=tmp, echo=lambda *a, **k: None)

    def chain(self) -> list[Step]:
        def mk(name: str) -> Step:
            def run(ctx):
                if name in self.fails:
                    raise UserError(f"{name} broke", fix="fix it", kind="test.fail")
                if name in self.inputs:  # the host-state steps run every time
                    self.ran.append(name)
                self.broken.pop(name, None)
                return f"{name} ran"

            def verify(ctx):
                if name in self.raises:
                    raise UserError(f"{name} is gone", kind="test.gone")
                return self.broken.get(name)

            return Step(name, run,
                        (lambda ctx: self.inputs[name]) if name in self.inputs else None,
                        skip=lambda ctx: "no GPU" if name in self.skip else None,
                        verify=verify, recheck_after_run=name == "verify")

        return [mk(n) for n in NAMES]

    def decide(self, chosen=NAMES) -> dict[str, pipeline.Decision]:
        return {d.step.name: d for d in pipeline.decide(self.ctx, list(chosen), self.chain())}

    def execute(self, chosen=NAMES) -> dict[str, Outcome]:
        self.ran = []
        rows, _ok = pipeline.execute(self.ctx, pipeline.decide(self.ctx, list(chosen),
                                                                self.chain()))
        return {r.step: r.status for r in rows}


@pytest.fixture
def world(tmp_path):
    return World(tmp_path)


def ready(w: World) -> None:
    rows = w.execute()
    assert all(s in (Outcome.DONE, Outcome.SKIPPED) for s in rows.values()), rows


STAMPED = [n for n in NAMES if n not in ("check", "sources", "patches")]


@settings(max_examples=60, deadline=None)
@given(chosen=st.sets(st.sampled_from(NAMES), min_size=1),
       skip=st.sets(st.sampled_from(["sources", "patches", "builds"])))
def test_a_ready_chain_is_up_to_date_whatever_is_chosen(tmp_path_factory, chosen, skip):
    """The digest of a step does not depend on which steps are chosen: after a full run, every
    stamped step is to be verified only, for any --only/--from/front door (the mutation
    `unchosen steps pass "" instead of their stamp` re-runs megatron on `invoke megatron`)."""
    w = World(tmp_path_factory.mktemp("c"), skip)
    ready(w)
    full = w.decide()
    got = w.decide(sorted(chosen, key=NAMES.index))
    for name in chosen:
        want = Action.SKIP if name in skip else Action.VERIFY if name in STAMPED else Action.RUN
        assert got[name].action is want, (name, got[name])
        assert got[name].digest == full[name].digest


def test_invoke_megatron_after_setup_is_up_to_date_and_setup_after_it_too(world):
    world.skip = {"sources", "patches", "builds"}  # no GPU here: the builds are skipped
    ready(world)
    assert world.execute(["megatron"]) == {"megatron": Outcome.UP_TO_DATE}
    rows = world.execute()
    assert world.ran == [] and rows["megatron"] is Outcome.UP_TO_DATE


def test_invoke_megatron_after_a_failed_lock_then_setup_installs_megatron_once(world):
    """`invoke megatron` while the lock step had no stamp (its last run failed), then `invoke
    setup`: the two disagreed on the megatron step's digest and Megatron was installed twice."""
    world.skip = {"sources", "patches", "builds"}
    world.fails = {"lock"}
    world.execute()  # the lock step fails: no stamp of it
    world.fails = set()
    assert world.execute(["megatron"]) == {"megatron": Outcome.DONE}
    rows = world.execute()
    assert rows["lock"] is Outcome.DONE and rows["megatron"] is Outcome.UP_TO_DATE, rows
    assert world.ran.count("megatron") == 0


def test_a_skipped_step_passes_on_its_stamp_as_an_unchosen_one_does(world):
    """--no-builds after a run that built: the builds' stamp still describes what is installed,
    so the steps after them are not re-run."""
    ready(world)
    world.skip = {"sources", "patches", "builds"}
    rows = world.execute()
    assert rows["builds"] is Outcome.SKIPPED and rows["megatron"] is Outcome.UP_TO_DATE
    assert world.ran == []


@pytest.mark.parametrize("changed", STAMPED)
def test_a_changed_input_reruns_its_step_and_everything_after_it(world, changed):
    ready(world)
    world.inputs[changed] += "-moved"
    d = world.decide()
    at = NAMES.index(changed)
    for i, name in enumerate(NAMES):
        if name not in STAMPED:
            continue
        assert d[name].action is (Action.RUN if i >= at else Action.VERIFY), name
        if i >= at:
            assert d[name].why == "its inputs changed"
    rows = world.execute()
    assert world.ran == [n for n in STAMPED if NAMES.index(n) >= at]
    assert all(rows[n] is Outcome.DONE for n in world.ran)
    assert all(a.action is not Action.RUN or a.step.inputs is None
               for a in world.decide().values())


def test_stamps_record_the_digest_the_next_decision_computes(world):
    ready(world)
    for name, d in world.decide().items():
        stamp, why = state.read(world.ctx.stamps, name)
        if name in STAMPED:
            assert why == "" and stamp.digest == d.digest and stamp.detail == f"{name} ran"
        else:
            assert stamp is None and why == "no stamp"


def test_no_stamp_means_run_and_says_so(world):
    d = world.decide()
    assert d["lock"].action is Action.RUN and d["lock"].why == "no stamp"
    assert d["check"].action is Action.RUN and d["check"].digest is None


@settings(max_examples=80, deadline=None)
@given(junk=st.one_of(st.binary(max_size=64),
                      st.sampled_from([b"", b"{}", b"[]", b"null", b'{"digest": 1}',
                                       b'{"digest": "abc"}', b'{"digest": "' + b"g" * 16 + b'"}',
                                       b'{"digest": "0123456789abcdef", "detail": 3}',
                                       b'{"digest": "0123456789abcdef"'])))
def test_a_bad_stamp_is_absent_with_a_reason_never_a_crash(tmp_path_factory, junk):
    w = World(tmp_path_factory.mktemp("s"))
    ready(w)
    state.path(w.ctx.stamps, "env").write_bytes(junk)
    try:
        Stamp.parse(junk.decode())
    except (UnicodeDecodeError, state.BadStamp):
        pass
    else:  # some bytes are a valid stamp (of another digest): then it is just stale
        return
    d = w.decide()["env"]
    assert d.action is Action.RUN and ("not a stamp" in d.why or "cannot be read" in d.why)
    rows = w.execute()
    assert rows["env"] is Outcome.DONE and w.ran[0] == "env"
    assert all(a.action is not Action.RUN or a.step.inputs is None
               for a in w.decide().values())


@given(digest=st.text("0123456789abcdef", min_size=16, max_size=16), detail=st.text(),
       at=st.text())
def test_a_stamp_reads_back_as_written(digest, detail, at):
    s = Stamp(digest, detail, at)
    assert Stamp.parse(s.text()) == s


def test_a_stamp_is_frozen_and_validated():
    for bad in ("xyz", "abc", "0" * 15, "0" * 17, "0" * 15 + "G", 16):
        with pytest.raises(state.BadStamp):
            Stamp(bad)  # type: ignore[arg-type]
    with pytest.raises(state.BadStamp):
        Stamp("0" * 16, detail=3)  # type: ignore[arg-type]
    with pytest.raises(state.BadStamp):
        Stamp.parse(json.dumps({"digest": "0" * 16, "at": 5}))
    s = Stamp("0" * 16)
    with pytest.raises(AttributeError):
        s.digest = "1" * 16  # type: ignore[misc]


def test_a_verify_that_finds_a_reason_runs_the_step(world):
    ready(world)
    world.broken["megatron"] = "megatron-core is not installed"
    rows = world.execute()
    assert rows["megatron"] is Outcome.DONE and rows["env"] is Outcome.UP_TO_DATE
    # the verify step re-proves what the run before it changed
    assert rows["verify"] is Outcome.DONE and world.ran == ["megatron", "verify"]
    assert world.execute()["verify"] is Outcome.UP_TO_DATE


def test_a_verify_that_raises_runs_the_step_instead_of_failing(world):
    ready(world)
    world.raises.add("megatron")
    world.broken["megatron"] = None  # run clears nothing here: it raises until it ran
    real = world.chain

    def chain():  # once the step ran, its re-check passes again
        steps = real()
        for s in steps:
            if s.name == "megatron":
                run = s.run
                s.run = lambda ctx, run=run: (world.raises.discard("megatron"), run(ctx))[1]
        return steps

    world.chain = chain
    rows = world.execute()
    assert rows["megatron"] is Outcome.DONE and all(s is not Outcome.FAILED for s in rows.values())


def test_a_failure_stops_the_chain_and_takes_the_stamp_away(world):
    ready(world)
    world.inputs["megatron"] += "-moved"
    world.fails.add("megatron")
    rows = world.execute()
    assert rows["megatron"] is Outcome.FAILED and rows["verify"] is Outcome.NOT_RUN
    assert state.read(world.ctx.stamps, "megatron")[0] is None
    assert state.read(world.ctx.stamps, "env")[0] is not None
    world.fails.clear()
    rows = world.execute()
    assert rows["megatron"] is Outcome.DONE and world.ran == ["megatron", "verify"]


def test_a_failure_reports_the_hint(world):
    world.fails.add("lock")
    rows, ok = pipeline.execute(world.ctx, pipeline.decide(world.ctx, NAMES, world.chain()))
    assert not ok
    failed = [r for r in rows if r.status is Outcome.FAILED]
    assert [r.step for r in failed] == ["lock"] and failed[0].detail == "lock broke\nhint: fix it"
    assert [r.status for r in rows][2:] == [Outcome.NOT_RUN] * 6


@pytest.mark.parametrize("changes", ["megatron", "verify"])
def test_inputs_changed_by_an_earlier_step_of_the_run_rerun_a_stamped_step(world, changes):
    """The env step writes the manifest the verify step's digest names: a step whose inputs
    an earlier step of the same run changed runs, and its stamp names them as they are now."""
    ready(world)
    world.broken["env"] = "changed since its build"
    chain = world.chain

    def with_side_effect():
        steps = chain()
        env = next(s for s in steps if s.name == "env")
        run = env.run
        env.run = lambda ctx: (world.inputs.__setitem__(changes, "moved"), run(ctx))[1]
        return steps

    world.chain = with_side_effect
    rows = world.execute()
    assert rows["env"] is Outcome.DONE and rows["verify"] is Outcome.DONE
    assert rows["megatron"] is (Outcome.DONE if changes == "megatron" else Outcome.UP_TO_DATE)
    world.chain = chain
    assert world.execute()["verify"] is Outcome.UP_TO_DATE


def test_predict_says_what_would_run_and_why_writing_nothing(world):
    ready(world)
    world.broken["env"] = "changed since its build: einops: missing"
    world.ran = []
    before = {p.name: p.read_bytes() for p in world.ctx.stamps.iterdir()}
    rows = {r.step: r for r in pipeline.predict(world.ctx, pipeline.decide(
        world.ctx, NAMES, world.chain()))}
    assert rows["env"].status is Outcome.WOULD_RUN and "einops: missing" in rows["env"].detail
    assert rows["lock"].status is Outcome.UP_TO_DATE and rows["megatron"].status is \
        Outcome.UP_TO_DATE
    assert rows["verify"].status is Outcome.WOULD_RUN  # env would run before it
    assert rows["check"].status is Outcome.WOULD_RUN
    assert world.ran == []
    assert {p.name: p.read_bytes() for p in world.ctx.stamps.iterdir()} == before


def test_unchosen_steps_are_neither_run_nor_reported(world):
    rows = world.execute(["lock", "env"])
    assert list(rows) == ["lock", "env"] and world.ran == ["lock", "env"]


def test_unknown_step_is_refused_with_a_kind():
    from .conftest import user_error

    with user_error("input.value"):
        pipeline.chosen_steps("nope", None)
    assert pipeline.chosen_steps(None, "megatron") == ["megatron", "verify"]
    assert pipeline.chosen_steps("env", None) == ["env"]
    assert pipeline.chosen_steps(None, None) == NAMES


def test_one_step_writes_the_stamp_the_chain_would(world, monkeypatch):
    """A front door doing one step its own way (invoke env): the next setup verifies it."""
    monkeypatch.setattr(pipeline, "steps", world.chain)
    world.ctx.prefix = world.ctx.stamps
    assert pipeline.one_step(world.ctx, "env", lambda: ("result", "built by invoke env")) == \
        "result"
    d = world.decide()
    # the lock has no stamp yet: it passes on the digest it would be stamped with, so the full
    # chain, whose lock step runs with the same inputs, finds env up to date (not built twice)
    assert d["env"].action is Action.VERIFY
    rows = world.execute()
    assert rows["lock"] is Outcome.DONE and rows["env"] is Outcome.UP_TO_DATE, rows
    assert pipeline.one_step(world.ctx, "env", lambda: (1, "again")) == 1
    assert world.decide()["env"].action is Action.VERIFY
    assert state.read(world.ctx.stamps, "env")[0].detail == "again"
    with pytest.raises(UserError):
        pipeline.one_step(world.ctx, "env", lambda: (_ for _ in ()).throw(
            UserError("no", kind="test.fail")))
    assert state.read(world.ctx.stamps, "env")[0] is None
