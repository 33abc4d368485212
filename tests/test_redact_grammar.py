"""Credentials drawn from a grammar of syntaxes, and generated ids drawn as a family
(tests/redact_grammar.py; bench/redact_grammar.py reports the figures beside detect-secrets and
credsweeper).

Floors, per side of the split (tune: fixed on; held and fresh: never fixed on): at most 0.5% of
tune cases and 5% of held or fresh cases print their secret (or 12 of its characters in a row),
at most 1% of tune ids and 5% of held or fresh ids are masked. A triage of a real log file
carries the continuations triage quotes (NCCL's `Last error:`, a CUDA error's text, a user's
exception message) end to end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_env import redact
from megatron_env.diagnose import jobs, render

from . import redact_grammar as g
from .redact_grammar_carry import carry, evidence

FLOORS = {"tune": 0.005, "held": 0.05, "fresh": 0.05}
ID_FLOORS = {"tune": 0.01, "held": 0.05, "fresh": 0.05}


def test_the_axes_are_split_before_any_result() -> None:
    for axis, values in (("key", g.KEYS), ("sep", g.SEPS), ("quote", g.QUOTES),
                         ("cont", g.CONTS), ("carrier", g.CARRIERS)):
        sides = {g.split(f"{axis}:{v}") for v in values}
        assert sides == {"tune", "held"}, axis  # every axis has a held-out part
        assert not set(values) & set(g.FRESH[axis])
    assert {c.side for c in g.cases("tune", 50)} == {"tune"}
    assert {c.side for c in g.cases("fresh", 50)} == {"fresh"}


@pytest.mark.parametrize("side", ["tune", "held", "fresh"])
def test_secrets_drawn_from_the_grammar_stay_under_the_floor(side: str) -> None:
    cases = g.cases(side)
    leaks = [(c.axes, c.text) for c in cases if g.leaked(carry(c.carrier, c.text), c.value)]
    assert len(leaks) <= FLOORS[side] * len(cases), leaks[:10]


@pytest.mark.parametrize("side", ["tune", "held", "fresh"])
def test_every_case_quoted_as_evidence_stays_under_half_a_percent(side: str) -> None:
    """Each case as a finding's summary and evidence (render.shown): the value test of each
    token (redact.tokens) holds what the passes before miss (mixed letters, digits and
    symbols in short pieces, quoted after an assignment) to at most 0.5%."""
    cases = g.cases(side, 1500)
    leaks = [c.text for c in cases if g.leaked(evidence(c.text), c.value)]
    assert len(leaks) <= 0.005 * len(cases), leaks[:10]


@pytest.mark.parametrize("side", ["tune", "held", "fresh"])
def test_generated_ids_stay_readable(side: str) -> None:
    ids = g.ids(side)

    def out(i: g.Id) -> str:
        return evidence(i.text).split("\n", 1)[1] if i.place == "evidence" else redact.text(
            i.text, {})
    masked = [(i.kind, i.key, i.place, i.text) for i in ids if out(i) != i.text]
    assert len(masked) <= ID_FLOORS[side] * len(ids), masked[:10]


def test_evidence_is_quoted_by_what_it_is_through_a_real_triage(tmp_path: Path) -> None:
    """Continuations triage quotes without parsing them, in a log file, through `triage`'s own
    reading and rendering: no secret of a sample of grammar cases prints."""
    cases = [c for c in g.cases("tune", 400) + g.cases("held", 400)
             if c.cont in ("last-error", "cuda-error")][:60]
    assert len(cases) >= 30
    printed = []
    for i, c in enumerate(cases):
        log = tmp_path / f"rank{i}.log"
        log.write_text(f"[rank{i % 8}]: step 10 loss 2.31\n{c.text}\n")
        found, _, _ = jobs.run([str(log)], [])
        shown = render.shown(found)
        out = json.dumps([[f.summary, f.evidence] for f in shown])
        printed.append(out)
        assert not g.leaked(out, c.value), (c.text, out)
    assert any("<redacted" in out for out in printed)


@pytest.mark.parametrize("side", ["tune", "held"])
def test_no_command_prints_a_secret_drawn_from_the_grammar(side: str, tmp_path: Path) -> None:
    """The issue's places: each case's text planted as an NCCL_/TORCH_ variable, in env.txt, in
    nvidia-smi's output and a job log, through report, report --json, collect (and its files),
    check --json of this host and of a snapshot, triage, triage --json and command logs."""
    from .test_redact_generated import _command_outputs

    cases = g.cases(side, 12, seed=7)
    outs = _command_outputs([([c.value], c.text) for c in cases], tmp_path)
    printed = [(name, c.text) for name, out in outs.items() for c in cases
               if g.leaked(out, c.value)]
    assert printed == []
