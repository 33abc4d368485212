"""A check's verdict is defined once (findings.Status): its word in text and JSON, its rank and
its exit meaning. These tests hold every reader of a verdict to that one definition, and the
JSON to the exact bytes other programs read."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron_env import findings
from megatron_env.findings import Finding, Status
from megatron_env.fleet.analysis import NodeResult, Report

WORDS = ["pass", "warn", "fail", "skip", "inconclusive"]
statuses = st.sampled_from(list(Status))
finding_lists = st.lists(st.builds(Finding, st.sampled_from(["a.x", "b.y"]), statuses,
                                   st.text(max_size=5)), max_size=6)


def test_the_words_are_the_json_and_text_values() -> None:
    assert [s.value for s in Status] == WORDS
    assert [str(s) for s in Status] == [f"{s}" for s in Status] == WORDS
    assert json.dumps(list(Status)) == json.dumps(WORDS)
    assert sorted(Status, key=lambda s: s.rank) == [Status.FAIL, Status.INCONCLUSIVE,
                                                     Status.WARN, Status.SKIP, Status.PASS]


def test_a_word_becomes_the_member_and_an_unknown_word_is_refused() -> None:
    f = Finding("a.x", "warn", "s")  # type: ignore[arg-type]  # scripts/ and old callers
    assert f.status is Status.WARN
    with pytest.raises(ValueError):
        Finding("a.x", "ok", "s")  # type: ignore[arg-type]


def test_json_is_byte_compatible() -> None:
    doc = findings.to_json([Finding("env.torch", Status.PASS, "torch 2.11.0"),
                            Finding("gpu.x", Status.FAIL, "bad", ["e"], "fix it", "absent")])
    assert doc == """{
  "findings": [
    {
      "id": "env.torch",
      "status": "pass",
      "summary": "torch 2.11.0",
      "evidence": [],
      "fix": ""
    },
    {
      "id": "gpu.x",
      "status": "fail",
      "summary": "bad",
      "evidence": [
        "e"
      ],
      "fix": "fix it",
      "kind": "absent"
    }
  ],
  "summary": {
    "pass": 1,
    "warn": 0,
    "fail": 1,
    "skip": 0,
    "inconclusive": 0
  }
}"""
    assert type(json.loads(doc)["findings"][0]["status"]) is str


@given(finding_lists)
def test_every_reader_follows_the_one_definition(fs: list[Finding]) -> None:
    seen = {f.status.value for f in fs}
    assert findings.exit_code(fs) == (1 if "fail" in seen else 3 if "inconclusive" in seen
                                      else 0)
    judged = seen - {"skip"}
    want = next((w for w in ["fail", "inconclusive", "warn", "pass"] if w in judged),
                "skip" if fs else "pass")
    assert findings.worst(fs) == want
    rows = findings.rows(fs)
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), key=lambda w: Status(w).rank)
    assert all(type(r[1]) is str for r in rows)
    counts = json.loads(findings.to_json(fs))["summary"]
    assert list(counts) == WORDS and sum(counts.values()) == len(fs)
    assert [Finding.from_dict(d, "t") for d in json.loads(findings.to_json(fs))["findings"]] == fs


@given(st.lists(finding_lists, max_size=4))
def test_fleet_exits_on_the_health_scale(nodes: list[list[Finding]]) -> None:
    rep = Report([NodeResult(f"n{i}", fs) for i, fs in enumerate(nodes)])
    worst = {findings.worst(fs).value for fs in nodes}
    assert rep.exit_code == (2 if "fail" in worst else 1 if worst & {"warn", "inconclusive"}
                             else 0)
    assert rep.exclude == [f"n{i}" for i, fs in enumerate(nodes)
                           if findings.worst(fs) is Status.FAIL]
