"""A big log read on two cores (megatron_env/diagnose/twocore.py) gives what one process gives:
the same findings, the same line count, the same error for a damaged file. The threshold is
set to 0 so that the fixture logs (cited in tests/fixtures/job-logs/README.md) take that path."""

import dataclasses
import gzip

import pytest

from megatron_env.diagnose import jobs, twocore

from .conftest import FIXTURES, user_error

LOGS = FIXTURES / "job-logs"
SOME = sorted(LOGS.glob("*.log"))[::7]  # every seventh: all families, a few seconds


def _run(paths, limit, monkeypatch):
    monkeypatch.setattr(twocore, "MIN_BYTES", limit)
    findings, lines, files = jobs.run(paths)
    return [dataclasses.asdict(f) for f in findings], lines, files


@pytest.mark.parametrize("log", SOME, ids=lambda p: p.name)
def test_two_processes_find_what_one_finds(log, monkeypatch):
    assert _run([log], 0, monkeypatch) == _run([log], 1 << 62, monkeypatch)


def test_several_files_and_a_compressed_one(tmp_path, monkeypatch):
    packed = tmp_path / "rank1.log"  # gzip, known by its magic bytes
    packed.write_bytes(gzip.compress(SOME[1].read_bytes()))
    paths = [SOME[0], packed, SOME[2]]
    one = _run(paths, 1 << 62, monkeypatch)
    assert _run(paths, 0, monkeypatch) == one and one[1] > 0


def test_a_damaged_archive_is_the_same_clear_error(tmp_path, monkeypatch):
    f = tmp_path / "cut.log.gz"
    packed = gzip.compress(b"".join(p.read_bytes() for p in SOME))
    f.write_bytes(packed[:len(packed) // 2])  # cut mid-stream: read a while, then fails
    monkeypatch.setattr(twocore, "MIN_BYTES", 0)
    with user_error("triage.unreadable") as e:
        jobs.run([f])
    assert str(f) in e.value.message
