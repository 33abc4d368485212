"""The job-log corpus (tests/fixtures/job-logs/README.md) against what a correct triage reports
(EXPECT.md), through the checks bench/triage_corpus.py scores: every check of the tune half
holds; of the held-out half, the checks that held when it was measured (the misses are listed
in the README, not hidden here)."""

import importlib.util

import pytest

from megatron_env.diagnose import jobs

from .conftest import FIXTURES

ROOT = FIXTURES.parent.parent
_spec = importlib.util.spec_from_file_location("triage_corpus", ROOT / "bench" / "triage_corpus.py")
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)


def _readme_split() -> dict[str, str]:
    rows = [line.split("|") for line in (corpus.LOGS / "README.md").read_text().splitlines()
            if line.startswith("| ") and line.endswith(" |") and ".log" in line]
    return {r[1].strip(): r[-2].strip() for r in rows}


def test_every_log_has_its_source_and_split():
    split = _readme_split()
    logs = sorted(p.name for p in corpus.LOGS.glob("*.log"))
    assert logs == sorted(split) and len(logs) >= 35
    assert set(split.values()) == {"tune", "heldout"}
    assert {k for k, v in split.items() if v == "heldout"} == set(corpus.HELDOUT)
    assert set(corpus.TUNE) <= {k for k, v in split.items() if v == "tune"}


@pytest.mark.parametrize("name", sorted(corpus.TUNE))
def test_tune_logs_give_what_expect_says(name):
    findings, _, _ = jobs.run([corpus.LOGS / name])
    text = corpus.blob(findings)
    missed = [c for c in corpus.TUNE[name] if not corpus.holds(c, findings, text)]
    assert not missed, text
