"""Redaction that fails closed, proven by generation: secrets drawn from the vendor formats of
tests/redact_formats.py (FORMATS, at least 60) and from random strings, put in every
surrounding they may stand in (SURROUNDINGS: a variable under any name, a log line, JSON, YAML,
Python reprs, argv lists, URL userinfo/path/query/fragment, base64, a line longer than the cut),
must not come out of `redact.text`, `redact.Lines`, `redact.cut` nor out of any command that
prints (report, report --json, collect, check --json live and --snapshot of a raw env.txt,
triage, triage --json, error lines, command logs): no 12 characters of a secret in a row.

Examples: MEGATRON_ENV_REDACT_EXAMPLES (default 300) for the text property,
MEGATRON_ENV_REDACT_COMMAND_EXAMPLES (default 4; each plants 6 secrets and runs every command
once) for the commands'; the grid test tries every format in every surrounding once. A long run:
`MEGATRON_ENV_REDACT_EXAMPLES=20000 MEGATRON_ENV_REDACT_COMMAND_EXAMPLES=200 pytest
tests/test_redact_vendors.py --hypothesis-show-statistics`.
"""

from __future__ import annotations

import json
import os
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from megatron_env import redact

from .redact_formats import FORMATS, SURROUNDINGS, plant
from .test_redact_generated import _command_outputs, _leaks

LONG = "MEGATRON_ENV_REDACT_EXAMPLES" in os.environ
TEXT = settings(max_examples=int(os.environ.get("MEGATRON_ENV_REDACT_EXAMPLES", "300")),
                deadline=None, derandomize=not LONG)
COMMANDS = settings(max_examples=int(os.environ.get("MEGATRON_ENV_REDACT_COMMAND_EXAMPLES", "4")),
                    deadline=None, derandomize=not LONG, suppress_health_check=list(HealthCheck))
CUT = 300  # what triage quotes of a line


def _check(secrets: list[str], text: str) -> None:
    out = redact.text(text, {})
    assert not _leaks(out, secrets), (text, out)
    streamed = redact.Lines({})
    lines = "".join(streamed(x) for x in text.splitlines(keepends=True))
    assert not _leaks(lines, secrets), (text, lines)
    for line in text.splitlines():
        cut = redact.cut(line, CUT, {})
        assert len(cut) <= CUT and not _leaks(cut, secrets), (line, cut)


def test_the_table_is_wide():
    assert len(FORMATS) >= 60
    assert len(SURROUNDINGS) >= 20


def test_every_format_in_every_surrounding():
    """The whole grid once, seeded: every row of the table is tried in CI."""
    rng = random.Random(34)
    tried = 0
    for fmt in FORMATS:
        for where in SURROUNDINGS:
            planted = plant(rng, fmt, where)
            if planted is not None:
                _check(*planted)
                tried += 1
    assert tried > 1500


@TEXT
@given(fmt=st.sampled_from(sorted(FORMATS)), where=st.sampled_from(sorted(SURROUNDINGS)),
       seed=st.integers(0, 2**32))
def test_no_generated_secret_survives(fmt, where, seed):
    planted = plant(random.Random(seed), fmt, where)
    assume(planted is not None)
    _check(*planted)


@COMMANDS
@given(plants=st.lists(st.tuples(st.sampled_from(sorted(FORMATS)),
                                 st.sampled_from(sorted(SURROUNDINGS)),
                                 st.integers(0, 2**32)), min_size=6, max_size=6))
def test_no_command_prints_a_generated_secret(plants, tmp_path_factory):
    drawn = [(FORMATS[f][1], plant(random.Random(seed), f, w)) for f, w, seed in plants]
    planted = [p for _, p in drawn if p is not None]
    assume(planted)
    outs = _command_outputs(planted, tmp_path_factory.mktemp("vendors"))
    for name, out in outs.items():
        for kind, p in drawn:
            if p is None or name == "error lines" and kind == "named":
                # the error lines are the text with its commas made spaces: a hex or UUID key
                # loses the name that made it a secret there
                continue
            assert not _leaks(out, p[0]), (name, p[1])
    assert "illegal memory access" in outs["triage"]


@pytest.mark.parametrize("where", ["long-line", "long-line-url"])
def test_triage_quotes_a_long_line_redacted_before_it_is_cut(where, tmp_path):
    """A secret past the 300th character of a line, behind a name no rule knows or in a URL's
    userinfo: a cut first leaves a piece of it that no rule recognises."""
    rng = random.Random(7)
    planted = []
    for fmt in ("passphrase", "password", "random-base62", "aws-secret-access-key"):
        p = plant(rng, fmt, where)
        assert p is not None
        planted.append(p)
    outs = _command_outputs(planted, tmp_path)
    for name in ("triage", "triage --json"):
        for secrets, x in planted:
            assert not _leaks(outs[name], secrets), (name, x)


def test_jwk_private_members_whatever_they_look_like():
    """A JSON Web Key's private members are secrets by where they stand, even one whose shape
    passes (base64 of words decodes to harmless text and is otherwise kept)."""
    k = "c2VjcmV0c2VjcmV0c2VjcmV0"  # base64 of "secretsecretsecret"
    doc = {"kty": "oct", "alg": "HS256", "k": k}
    assert k not in redact.text(json.dumps(doc), {})
    assert k not in redact.text(repr(doc), {})  # a Python repr: no JSON document
    assert redact.text(json.dumps({"k": k}), {}) == json.dumps({"k": k})  # no key: a value


def test_cut_redacts_first_and_never_cuts_a_mask_in_half():
    token = "ghp_" + "Pl4ntedGitHubToken0" * 2
    line = "x" * 20 + " https://alice:" + "hunter2hunter2hunter2" + "@h.example/ " + token
    for width in range(10, len(line)):
        out = redact.cut(line, width, {})
        assert len(out) <= width and "hunter2hunter" not in out and "Pl4ntedGitHub" not in out
        assert not out.endswith(("<", "<r", "<redacted"))
    assert redact.cut("a < b and c > d", 9, {}) == "a < b and"  # a `<` of the text is no mask
    assert redact.cut("short", 300, {}) == "short"
