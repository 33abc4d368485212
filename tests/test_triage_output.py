"""What `invoke triage` prints of the log lines it quotes: redacted whole, then cut.

A real log's error line, lengthened past the cut with a URL whose password straddles the
300th character: cut first, the `@host` that marks it as userinfo would be gone and half the
password would be printed."""

import json
import secrets
import subprocess
import sys

from megatron_env.diagnose import jobs, render

from .conftest import FIXTURES

ROOT = FIXTURES.parent.parent
LOGS = FIXTURES / "job-logs"
SOURCE = "internal-error-rank-prefix-vllm10453.log"  # its line 18 is an NCCL error line


def _log_with_password(tmp_path):
    password = secrets.token_urlsafe(24)
    lines = (LOGS / SOURCE).read_text().splitlines()
    i = next(n for n, x in enumerate(lines) if "NCCL error in:" in x)
    url = f" while talking to https://alice:{password}@store.example.org:29500/v1"
    pad = "x" * max(0, render.EVIDENCE - 10 - len(lines[i]) - len(url) // 3)
    lines[i] = lines[i] + " " + pad + url
    start = lines[i].index(password) - len("[rank1]: ")
    assert start < render.EVIDENCE < start + len(password)  # the cut falls inside it
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    return log, password


def _leaks(text, password):
    return [password[i:i + 6] for i in range(len(password) - 5) if password[i:i + 6] in text]


def test_evidence_is_kept_whole_and_cut_only_after_redaction(tmp_path):
    log, password = _log_with_password(tmp_path)
    found, _, _ = jobs.run([log])
    whole = [e for f in found for e in f.evidence if password in e]
    assert whole, "the events keep the line whole"
    shown = render.shown(found)
    assert not _leaks(json.dumps([f.to_dict() for f in shown]), password)
    assert all(len(e) <= render.EVIDENCE for f in shown for e in f.evidence)


def test_cli_text_and_json_print_nothing_of_the_password(tmp_path):
    log, password = _log_with_password(tmp_path)
    for extra in ([], ["--json"]):
        r = subprocess.run([sys.executable, "-m", "invoke", "triage", str(log), *extra],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stderr
        assert "job.nccl_error" in r.stdout
        assert not _leaks(r.stdout + r.stderr, password), r.stdout
