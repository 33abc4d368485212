"""Several logs named on the command line: `megatron-env triage a.log b.log` (separate words)
reads every one, as the comma list does (`invoke triage a.log,b.log`: invoke's parser reads a
second word as the name of the next task, so it takes one word). Run through the real commands
on two real fixture logs: a run that ended well and one that ran out of GPU memory."""

import json
import subprocess
import sys

from .conftest import FIXTURES

ROOT = FIXTURES.parent.parent
LOGS = FIXTURES / "job-logs"
CLEAN = LOGS / "clean-lightning-max-epochs-reached-lightning14428.log"
OOM = LOGS / "cuda-oom-training-log-deepspeedexamples279.log"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)


def _wc(path) -> int:
    return path.read_bytes().count(b"\n")


def _doc(r: subprocess.CompletedProcess[str]) -> dict:
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def test_two_words_read_both_logs_as_the_comma_list_does():
    alone = _doc(_run("-m", "megatron_env", "triage", str(CLEAN), "--json"))
    assert alone["lines"] == _wc(CLEAN)
    words = _run("-m", "megatron_env", "triage", str(CLEAN), str(OOM), "--json")
    doc = _doc(words)
    assert doc["logs"] == [str(CLEAN), str(OOM)]
    assert doc["lines"] == _wc(CLEAN) + _wc(OOM)
    ids = [f["id"] for f in doc["findings"]]
    assert "job.cuda_oom" in ids and words.returncode == 1, (ids, words.stderr)
    comma = _run("-m", "invoke", "triage", f"{CLEAN},{OOM}", "--json")
    assert comma.returncode == words.returncode
    assert _doc(comma) == doc
    flag = _run("-m", "megatron_env", "triage", "--logs", str(CLEAN), str(OOM), "--json")
    assert _doc(flag) == doc


def test_a_missing_second_word_is_one_line_and_exit_2(tmp_path):
    gone = tmp_path / "gone.log"
    r = _run("-m", "megatron_env", "triage", str(CLEAN), str(gone))
    assert r.returncode == 2
    assert r.stderr.startswith(f"error: {gone}: no such file") and "Traceback" not in r.stderr
    assert r.stdout == ""
