"""What the redaction must leave alone: a harmless corpus of real values from the fixtures
(tests/fixtures/harmless/values.txt, drawn by bench/redact_corpus.py --write: lock pins and
hashes, NCCL log words, a snapshot's values, nvidia-smi -q values, job-log words) comes through
unchanged alone, in a log line, as an environment variable and as a JSON value; and a value is
judged by what it is, not by its field's name (a count called "pass", a signature file's
path, a profile whose file name says "password")."""

from __future__ import annotations

import json

import pytest

from megatron_env import findings, redact

from .conftest import FIXTURES

VALUES = [v for v in (FIXTURES / "harmless" / "values.txt").read_text().splitlines()
          if v and not v.startswith("#")]


def _forms(v: str) -> list[str]:
    return [v, f"[rank0]: step 10 {v} done", f"PLANTED_REF={v}",
            json.dumps({"value": v, "n": 1}, indent=2)]


def test_the_corpus_is_large():
    assert len(VALUES) >= 200
    assert len(set(VALUES)) == len(VALUES)


@pytest.mark.parametrize("value", VALUES)
def test_harmless_values_come_through(value):
    assert [redact.text(f, {}) for f in _forms(value)] == _forms(value)


def test_counts_and_booleans_are_never_masked_whatever_their_field():
    doc = findings.to_json([findings.Finding("env.torch", "pass", "torch 2.11.0")],
                           pass_rate=1.0)
    out = json.loads(redact.text(doc, {}))
    assert out["summary"]["pass"] == 1 and out["summary"]["fail"] == 0
    assert json.loads(redact.text('{"pass": 12, "passes": 3, "pin": 2, "token": true, '
                                  '"secret": null, "retries": 4}', {})) == {
        "pass": 12, "passes": 3, "pin": 2, "token": True, "secret": None, "retries": 4}


def test_a_number_under_a_passwords_name_is_masked():
    """A PIN or a numeric password is a number: under password, passwd, passcode it is masked;
    under an ambiguous name (`pass`, a count) it is not."""
    for name in ("password", "passwd", "passcode", "db_password"):
        assert json.loads(redact.text(json.dumps({name: 483920, "pass": 3}), {})) == {
            name: redact.REDACTED, "pass": 3}


def test_paths_the_tool_wrote_are_kept_whatever_their_field():
    for sig in ("/tmp/out/bundle-core.tar.sig", "out/bundle.tar.sig", "bundle.tar.sig",
                "/tmp/tmpk3x_9q2a/bundle-core.tar.sig", "/tmp/bundle-Xk9aB2/out/b.tar.sig",
                "/var/folders/x7/2kq9vd1n5l3b0c8w6m4r_zpt0000gn/T/tmpa8x_3kz9/b.sig"):
        doc = json.dumps({"bundle": "/tmp/out/bundle-core.tar", "signature": sig})
        assert json.loads(redact.text(doc, {}))["signature"] == sig
    line = "error: profiles/my_password_profile.toml: cannot be read"
    assert redact.text(line, {}) == line
    assert redact.text("my_password_profile.toml: 3 read", {}) == "my_password_profile.toml: 3 read"


def test_what_is_spelled_as_a_secret_is_still_masked_under_those_names():
    out = json.loads(redact.text(json.dumps(
        {"pass": "hunter2", "signature": "Zr8vQ2mXk9LpWq7T", "password": "Tr0ub4dor/3"}), {}))
    assert out == {"pass": redact.REDACTED, "signature": redact.REDACTED,
                   "password": redact.REDACTED}


@pytest.mark.parametrize("line", [
    "google-auth                    2.29.0", "SecretStorage                  3.3.3",
    "google-auth==2.29.0", "google-auth 2.29.0", "keyring 24.3.0", "passlib==1.7.4",
    "tokenizers         0.21.0", "| pass | 3 |", "auth_plugin   none"])
def test_a_packages_version_stays_whatever_the_package_is_called(line):
    """`pip list` rows and pins: a package named for auth or secrets has a version, no secret."""
    assert redact.text(line, {}) == line


@pytest.mark.parametrize("line", [
    "  job.clean  pass  the log ends normally: `Trainer.fit` stopped: `max_steps=1000` reached.",
    "  env.torch  pass  torch 2.11.0: found",
    "tests that pass on the last run:", ])
def test_a_status_word_pass_is_no_passwords_label(line):
    """`pass` is a status in the tool's own rows; a sentence's label is a password's noun."""
    assert redact.text(line, {}) == line
    scrub = redact.Lines({})
    assert [scrub(x) for x in (line + "\n", "next line\n")] == [line + "\n", "next line\n"]


# llama-recipes' summary at the end of a fine-tuning run, as printed in
# https://github.com/meta-llama/llama-cookbook/pull/428 (the PR's test output)
LLAMA_RECIPES_SUMMARY = """\
max training steps reached, stopping training, total_train_steps:  6
Key: avg_train_prep, Value: 1.2784380912780762
Key: avg_train_loss, Value: 0.24563908576965332
Key: avg_eval_prep, Value: 1.301121473312378
Key: avg_eval_loss, Value: 0.26322659850120544
Key: avg_epoch_time, Value: 27.707596888765693
Key: avg_checkpoint_time, Value: 1.0763725992292166
"""


def test_a_metrics_name_behind_a_weak_label_is_no_secret():
    """`Key: <metric>, Value: <number>`: a weak name's value of several words is judged word by
    word (none looks random here), while one random word behind it is still masked."""
    assert redact.text(LLAMA_RECIPES_SUMMARY, {}) == LLAMA_RECIPES_SUMMARY
    scrub = redact.Lines({})
    lines = LLAMA_RECIPES_SUMMARY.splitlines(keepends=True)
    assert [scrub(x) for x in lines] == lines
    assert "Q7xk2Lm9Pz4Rt8" not in redact.text("Key: Q7xk2Lm9Pz4Rt8, Value: 1", {})
