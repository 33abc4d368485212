"""The replay of a recorded cold setup (bench/setup_replay.py) predicts the device's own runs
before it judges a scheduling change: the H100 record of ac60c25 (builds 496.4 s with the
recipes' declared costs; 569 s in a second build of the same pins with the first's recorded
costs), within 3% and 5%."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "bench" / "results" / "2026-12-06-h100-ac60c25"


def _replay() -> ModuleType:
    spec = importlib.util.spec_from_file_location("setup_replay", ROOT / "bench" / "setup_replay.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["setup_replay"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_replay_predicts_both_recorded_runs() -> None:
    out = _replay().replay(RECORD)
    run1, run2 = out["run1_ac60c25_declared"], out["run2_ac60c25_recorded"]
    assert run1["measured_s"] == 496.4 and abs(run1["error"]) <= 0.03, run1
    assert run2["measured_s"] == 569.0 and abs(run2["error"]) <= 0.05, run2
    # the record's own shape, read from it: flash-attn's ninja 35.7 s after apex's
    starts = out["model"]["ninja_start_s"]
    assert abs(starts["flash-attn"] - starts["apex"] - 35.7) < 0.1
    assert run1["two_slot_grants"] == 0 and run2["two_slot_grants"] > 0


def test_the_pool_now_builds_a_second_time_no_slower_and_nearer_its_bound() -> None:
    out = _replay().replay(RECORD)
    first, second = out["run1_now_declared"], out["run2_now_recorded"]
    assert second["builds_s"] <= first["builds_s"]
    assert first["builds_s"] < out["run1_ac60c25_declared"]["builds_s"]
    assert second["builds_s"] < out["run2_ac60c25_recorded"]["builds_s"]
    assert second["two_slot_grants"] == 0


def test_declared_costs_rank_the_recorded_long_objects_without_ties() -> None:
    """A first build's order (each recipe's object_seconds): the record's objects of a minute
    or more each get a priority of their own, and the longest the highest of its kernel."""
    from megatron_env import recipes
    from megatron_env.kernels import schedule

    rec = _replay().load(RECORD / "cold1")
    for k, kern in rec.kernels.items():
        costs = schedule.Costs(k, {}, recipes.get(k).object_seconds, "declared")
        objs = [o for g in kern.steps for s in g if s.kind == "ninja" for o in s.objs]
        long = [o for o in objs if o.seconds >= 60]
        prios = [costs.of(o.output) for o in long]
        assert len(set(prios)) == len(prios), (k, sorted(zip(prios, [o.key for o in long], strict=True)))
        longest = max(objs, key=lambda o: o.seconds)
        assert costs.of(longest.output) == max(costs.of(o.output) for o in objs), k
