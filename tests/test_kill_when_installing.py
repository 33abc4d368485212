"""The mid-install kill of tests/conftest.py: a process that ends before its install starts
fails the test at once with what it said, not after the whole poll (600 s by default: seen
when a setup under a loaded machine ended early and its test sat out the poll)."""

import subprocess
import sys

import pytest

from .conftest import kill_when_installing


def test_a_process_that_ended_before_installing_fails_at_once_with_its_output(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "print('error: something went wrong'); "
                          "raise SystemExit(3)"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    with pytest.raises(pytest.fail.Exception) as e:
        kill_when_installing(p, tmp_path / "store", timeout=30)
    assert "ended (exit 3)" in str(e.value) and "something went wrong" in str(e.value)
