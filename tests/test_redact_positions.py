"""Credentials by where they are given, in any syntax, and generated names that stay readable
(tests/redact_positions.py is the generator; bench/redact_positions.py the benchmark).

The tune side of the grid (what the redaction was fixed on) must not leak at all; the held
side (never looked at while fixing) and hypothesis draws over every position, value kind and
carrier hold floors: at most 5% of cases print any part of their value, at most 2% of the
generated harmless names are masked. A regression on either side fails here.
"""

from __future__ import annotations

import json
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_env import redact

from . import redact_positions as gen

EXAMPLES = int(os.environ.get("MEGATRON_ENV_REDACT_EXAMPLES", "300"))
DRAWS = settings(max_examples=EXAMPLES, deadline=None,
                 derandomize="MEGATRON_ENV_REDACT_EXAMPLES" not in os.environ)


def _out(case: gen.Case) -> str:
    return gen.carry(case.carrier, case.text, lambda t: redact.text(t, {}),
                     lambda: redact.Lines({}))


def _leaks(cases: list[gen.Case]) -> list[tuple[str, str, str]]:
    return [(c.position.name, c.kind, c.carrier) for c in cases
            if gen.leaked(_out(c), c.text, gen.secret_forms(c.position, c.value))]


def test_the_generator_is_as_large_as_asked():
    positions = {p.name for p in gen.POSITIONS}
    assert len(positions) == len(gen.POSITIONS) >= 120
    cases = gen.grid("tune") + gen.grid("held")
    assert len(cases) >= 150 * len(gen.CARRIERS)
    assert {c.side for c in cases} == {"tune", "held"}
    assert len(gen.harmless("tune")) + len(gen.harmless("held")) >= 100
    # the split is a fixed function of the names, never of a result
    assert gen.split("position:7z-a") == gen.split("position:7z-a")


def test_the_tune_grid_leaks_nothing():
    assert _leaks(gen.grid("tune")) == []


def test_the_held_grid_stays_under_its_floor():
    cases = gen.grid("held")
    leaks = _leaks(cases)
    assert len(leaks) <= 0.05 * len(cases), leaks[:20]


@pytest.mark.parametrize("side", ["tune", "held"])
def test_generated_harmless_names_stay_readable(side):
    texts = gen.harmless(side)
    masked = [h.text for h in texts if redact.text(h.text, {}) != h.text]
    assert len(masked) <= 0.02 * len(texts), masked[:10]
    if side == "tune":
        assert masked == []


def _draw_case(pos: gen.Position, kind: str, carrier: str, seed: int) -> gen.Case:
    value = gen.VALUE_KINDS[kind][0](random.Random(seed))
    return gen.Case(pos, kind, carrier, value, gen._fill(pos, value))


@st.composite
def _case(draw: st.DrawFn) -> gen.Case:
    pos = draw(st.sampled_from(gen.POSITIONS))
    kind = draw(st.sampled_from([k for k in gen.VALUE_KINDS if gen.fits(pos, k)]))
    return _draw_case(pos, kind, draw(st.sampled_from(gen.CARRIERS)),
                      draw(st.integers(0, 2**32)))


@DRAWS
@given(case=_case())
def test_drawn_tune_positions_never_leak(case):
    """Any value drawn into a tune position with a tune value kind, in any carrier."""
    if case.side == "tune":
        out = _out(case)
        assert not gen.leaked(out, case.text, gen.secret_forms(case.position, case.value)), (
            case.text, out)


def test_drawn_positions_stay_under_the_floor():
    """Values drawn (other than the grid's) into every position, kind and carrier: at most 5%
    print any part of their value."""
    rng = random.Random(4343)
    cases = []
    for _ in range(EXAMPLES * 2):
        pos = rng.choice(gen.POSITIONS)
        kind = rng.choice([k for k in gen.VALUE_KINDS if gen.fits(pos, k)])
        cases.append(_draw_case(pos, kind, rng.choice(gen.CARRIERS), rng.getrandbits(32)))
    leaks = _leaks(cases)
    assert len(leaks) <= 0.05 * len(cases), leaks[:20]


@DRAWS
@given(family=st.sampled_from(sorted(gen.HARMLESS)), seed=st.integers(0, 2**32),
       place=st.sampled_from(sorted(gen.PLACES)))
def test_drawn_harmless_names_are_kept(family, seed, place):
    text = gen.PLACES[place](family, gen.HARMLESS[family](random.Random(seed)))
    assert redact.text(text, {}) == text


def test_a_stream_keeps_two_lines_of_context():
    """`Lines` masks a value whose label stood one or two lines before (a blank between)."""
    scrub = redact.Lines({})
    out = [scrub(x) for x in ["Please use the following password to proceed to installation:\n",
                              "\n", "sunflower12\n", "step 3 loss 2.1\n"]]
    assert out == [out[0], "\n", redact.REDACTED + "\n", "step 3 loss 2.1\n"]


def test_a_json_number_under_a_passwords_name_and_the_reports_pin():
    doc = json.dumps({"password": 482913, "pass": 3, "passes": 7,
                      "kernels": [{"name": "flash-attn", "pin": "2.7.4", "modules": []}]})
    out = json.loads(redact.text(doc, {}))
    assert out["password"] == redact.REDACTED and out["pass"] == 3 and out["passes"] == 7
    assert out["kernels"][0]["pin"] == "2.7.4"


def test_triage_evidence_is_redacted_with_the_lines_before_it():
    """A finding's evidence lines are one stream: a value on the line after its label (here
    pydantic's location line, then its input) is masked."""
    from megatron_env.diagnose import render
    from megatron_env.findings import Finding, Status

    f = Finding("job.python", Status.FAIL, "a validation error", [
        "1 validation error for Settings", "password",
        "  String should have at least 20 characters [type=string_too_short, "
        "input_value='sunflower12', input_type=str]"], "fix the settings")
    shown = render.shown([f])[0]
    assert "sunflower" not in "\n".join(shown.evidence)
    assert shown.evidence[:2] == f.evidence[:2]


# each tool's password option as its manual writes it: a tool lost from the table shows here
TOOL_LINES = [
    "7z x -pS3cretVal archive.7z", "7za a -tzip -pS3cretVal out.zip dir", "rar a -pS3cretVal a.rar f",
    "unrar e -pS3cretVal a.rar", "zip -P S3cretVal -r a.zip d", "unzip -P S3cretVal a.zip",
    "zipcloak -P S3cretVal a.zip", "ssh-keygen -t rsa -N S3cretVal -f k",
    "ssh-keygen -p -P S3cretVal -N new -f k", "ldapsearch -x -D cn=a -w S3cretVal",
    "ldapadd -x -D cn=a -w S3cretVal -f a.ldif", "ldapdelete -D cn=a -w S3cretVal cn=b",
    "ldappasswd -x -D cn=a -w S3cretVal -s N3wSecret uid=b",
    "pkcs11-tool --login --pin S3cretVal -O", "softhsm2-util --init-token --slot 0 --label a "
    "--so-pin S3cretVal --pin S3cretVal", "openssl enc -aes-128-cbc -k S3cretVal -in a",
    "keytool -list -keystore k.jks -storepass S3cretVal",
    "keytool -importkeystore -srcstorepass S3cretVal -deststorepass S3cretVal",
    "gpg --batch --passphrase S3cretVal -c f", "sqlcmd -S db -U sa -P S3cretVal",
    "bcp t out f.dat -S db -U sa -P S3cretVal", "mongosh -u root -p S3cretVal",
    "mongodump -u root -p S3cretVal --out d", "cqlsh db -u cassandra -p S3cretVal",
    "ipmitool -H bmc -U admin -P S3cretVal sel list", "snmpget -v3 -u u -A S3cretVal sw sysName.0",
    "snmpwalk -v3 -l authPriv -u u -a SHA -A S3cretVal -x AES -X S3cretVal sw",
    "mosquitto_sub -h mq -u u -P S3cretVal -t x", "sshpass -p S3cretVal ssh h",
    "az login -u bot@corp -p S3cretVal", "rdesktop -u admin -p S3cretVal host",
    "xfreerdp /u:admin /p:S3cretVal /v:host", "pdftk in.pdf output out.pdf owner_pw S3cretVal",
    "rabbitmqctl authenticate_user bob S3cretVal", "net use \\\\srv\\share S3cretVal /user:bob",
    "vault login S3cretVal",
]


@pytest.mark.parametrize("line", TOOL_LINES)
def test_each_tools_password_option(line):
    out = redact.text(line, {})
    assert "S3cret" not in out and "N3wSecret" not in out, out


@pytest.mark.parametrize("line", ["ssh -p 2222 node1", "curl -k https://h/x", "scp -P 2222 a h:",
                                  "zip -r -9 a.zip d", "ssh -N -L 8080:localhost:80 h",
                                  "openssl s_client -connect h:443 -servername h",
                                  "7z a -mx9 out.7z dir", "vault login -method=oidc",
                                  "net use Z: \\\\srv\\share /persistent:yes"])
def test_the_same_option_of_another_tool_is_no_password(line):
    assert redact.text(line, {}) == line


R = redact.REDACTED


@pytest.mark.parametrize(("line", "expected"), [
    ("curl --cookie 'sid=a1b2c3; theme=dark' https://h/", f"curl --cookie '{R}' https://h/"),
    ("curl -s -b 'sid=a1b2c3; theme=dark' https://h/",
     f"curl -s -b 'sid={R}; theme={R}' https://h/"),
    ("curl -b s3ssionval https://h/", f"curl -b {R} https://h/"),
    ("curl -u 'bob:two words' https://h/", f"curl -u 'bob:{R}' https://h/"),
    ("CREATE USER 'a'@'%' IDENTIFIED BY 'two words';", f"CREATE USER 'a'@'%' IDENTIFIED BY '{R}';"),
    ("CREATE USER scott IDENTIFIED BY tiger;", f"CREATE USER scott IDENTIFIED BY {R};"),
    ("ALTER ROLE r WITH PASSWORD \"a b\";", f"ALTER ROLE r WITH PASSWORD \"{R}\";"),
    ('<property name="db.password" value="a b"/>', f'<property name="db.password" value="{R}"/>'),
    ('<property name="db.host" value="db01"/>', '<property name="db.host" value="db01"/>'),
    ("<password>a b</password>", f"<password>{R}</password>"),
    ("<name>fs.s3a.secret.key</name><value>a b</value>",
     f"<name>fs.s3a.secret.key</name><value>{R}</value>"),
    ("ValueError: 'a b' is not valid for 'password'", f"ValueError: '{R}' is not valid for "
                                                      "'password'"),
    ("ValueError: 'a b' is not valid for 'mode'", "ValueError: 'a b' is not valid for 'mode'"),
    ("zip -P 'two words' -r a.zip d", f"zip -P '{R}' -r a.zip d"),
    ("7za a '-ptwo words' a.7z d", f"7za a '-p{R}' a.7z d"),
    ("Popen(['sshpass', '-p', 'two words', 'ssh', 'h'])",
     f"Popen(['sshpass', '-p', '{R}', 'ssh', 'h'])"),
    ("Driver={ODBC Driver 18};Uid=sa;Pwd={a;b c};Encrypt=yes",
     f"Driver={{ODBC Driver 18}};Uid=sa;Pwd={{{R}}};Encrypt=yes"),
])
def test_what_is_masked_and_what_stays_around_it(line, expected):
    """The value, and only the value: its quotes, braces and neighbours stay."""
    assert redact.text(line, {}) == expected
