"""Redaction edges that mutation testing (`nox -s mutants`) found unguarded: each test names the
behaviour it protects. Tokens are built at run time, so no token-shaped string sits in the
repository."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_env import redact
from megatron_env.redact import structure

NO_ENV: dict[str, str] = {}
BOT_TOKEN = "AB" + "Cd3fGh1jKl" * 3  # a chat bot API's token after /bot<id>:
HOOK_PATH = "T0" + "AB12CD3/B0EF45GH6/" + "aB3dE5fG7hJ9" * 2  # a chat webhook's secret path


def test_a_table_rule_applies_every_row_whose_words_the_line_holds() -> None:
    """The one-scan hint of a rule table must not skip a row: each row whose words occur is
    applied, one whose words do not is not (built here, since the tables are built at import)."""
    rule = structure._hinted([
        (("alpha",), re.compile(r"alpha=\w+"), lambda m: "alpha=A"),
        (("beta", "gamma"), re.compile(r"gamma=\w+"), lambda m: "gamma=G"),
        (("delta",), re.compile(r"\w+"), lambda m: "X"),
    ])
    assert rule("alpha=1 gamma=2 rest") == "alpha=A gamma=G rest"
    assert rule("gamma=2") == "gamma=G"
    assert rule("nothing here") == "nothing here"
    assert rule("ALPHA=1") == "ALPHA=1"  # the words are case-sensitive, as the docstring says


def test_basic_followed_by_a_word_is_prose_not_a_credential() -> None:
    """`Basic authentication failed` is an error message: kept whole (a credential after
    `Basic ` is masked whatever it looks like, a lower-case word of up to 16 letters is not)."""
    assert redact.text("Basic authentication failed", NO_ENV) == "Basic authentication failed"
    assert redact.text("Basic characterization", NO_ENV) == "Basic characterization"  # 16
    assert redact.text("Basic characterizations", NO_ENV) == "Basic <redacted>"  # 17


def test_token_before_a_plain_value_is_kept() -> None:
    """`token X` is masked only when X looks random: a parser's `unexpected token config.yaml`
    stays, while `Basic config.yaml` (a credential position) is masked."""
    assert redact.text("unexpected token config.yaml", NO_ENV) == "unexpected token config.yaml"
    assert redact.text("Basic config.yaml", NO_ENV) == "Basic <redacted>"


@pytest.mark.parametrize("url, masked", [
    (f"https://api.telegram.org/bot123456:{BOT_TOKEN}/sendMessage",
     "https://api.telegram.org/bot123456:<redacted>/sendMessage"),
    (f"https://hooks.slack.com/services/{HOOK_PATH}", "https://hooks.slack.com/services/<redacted>"),
])
def test_a_token_in_a_url_path_is_masked_and_the_path_before_it_kept(url: str, masked: str) -> None:
    """The part of the path that leads to the token stays (it says which service), the token
    itself is replaced, never prefixed to the mask."""
    assert redact.text(url, NO_ENV) == masked


def test_cut_masks_the_given_environment() -> None:
    """`cut` redacts with the mapping it is given (a report's recorded environment), not the
    process environment."""
    env = {"DB_PASSWORD": "hunter2hunter2"}
    assert redact.cut("login with hunter2hunter2", 80, env) == "login with <redacted>"


LINE = "a password=s3cr3tvalue9 b password=an0thersecret c"


def test_cut_never_leaves_half_a_mask() -> None:
    """A cut inside the second mask drops that mask's start; a cut right after a whole mask
    keeps it; a mask at index 1 is dropped when cut."""
    assert redact.text(LINE, NO_ENV) == "a password=<redacted> b password=<redacted> c"
    assert redact.cut(LINE, 38, NO_ENV) == "a password=<redacted> b password="
    assert redact.cut(LINE, 22, NO_ENV) == "a password=<redacted> "
    assert redact.cut("(Kx8vQ2mZ9pL4nR7tY3wB5jH)", 5, NO_ENV) == "("


def test_variables_and_scrub_use_the_given_environment() -> None:
    """A report's recorded environment is what `variables` and `scrub` mask against: a secret
    variable's value is masked wherever it shows, also under a harmless name."""
    env = {"A": "hunter2hunter2", "DB_PASSWORD": "hunter2hunter2"}
    assert redact.variables(env) == {"A": "<redacted>", "DB_PASSWORD": "<redacted>"}
    assert redact.scrub("x hunter2hunter2", env) == "x <redacted>"


def header(s: str) -> str:
    return structure._HEADER.sub(structure._header, s)


def test_a_header_value_is_replaced_keeping_its_name_scheme_and_trailing_space() -> None:
    """The header rule masks only the value: the name, the separator, an auth scheme and the
    trailing blanks stay; an empty or already masked value is left as it is."""
    assert header("Authorization: Bearer abcdefgh12345678  ") == (
        "Authorization: Bearer <redacted>  ")
    assert header("X-Api-Key:   x") == "X-Api-Key:   <redacted>"
    assert header("Authorization: Basic <redacted>") == "Authorization: Basic <redacted>"
    assert header("Authorization: ") == "Authorization: "


def test_a_header_name_in_an_argv_list_marks_the_next_item_secret() -> None:
    """`x-<anything>key` is a header name even where the name rules do not know it: the item
    after it in an argv list is masked."""
    assert structure.header_name_kind("x-hubkey") == "strong"
    assert structure.header_name_kind("path") is None
    assert redact.text("('x-hubkey', 'plainword')", NO_ENV) == "('x-hubkey', '<redacted>')"


def test_an_unterminated_pem_block_keeps_its_begin_line_and_adds_nothing() -> None:
    """A PEM block cut before its END line: the BEGIN marker stays, the body is one mask."""
    pem = "-----BEGIN PRIVATE KEY-----" + "MIIEvQIBADANBg"
    assert redact.text(pem, NO_ENV) == "-----BEGIN PRIVATE KEY-----<redacted>"


@pytest.mark.parametrize("seg, plain", [
    ("", True), ("443", True), ("status", True), ("GNVO", True),
    ("016M5NID", False), ("Status", False), ("v1", False),
])
def test_a_plain_segment_is_a_number_or_a_word_of_one_case(seg: str, plain: bool) -> None:
    """Next to a masked run, only a plain segment (a number, a one-case word) stays; a mix of
    cases or of digits and letters is masked with the run."""
    from megatron_env.redact import shape
    assert shape._plain(seg) is plain


@pytest.mark.parametrize("seg, words", [
    ("macOS", False), ("busId", False),  # 2 unexplained of 5: at both bounds
    ("HTMLParser", False), ("mysqladmin", False),  # 4 of 10: at RANDOM_SHARE exactly
    ("--benchmark", True),  # 2 or more, but under RANDOM_SHARE
])
def test_reads_as_words_at_its_thresholds(seg: str, words: bool) -> None:
    """A path component reads as words when fewer than 2, or under RANDOM_SHARE, of its judged
    characters are unexplained; at either bound it does not (a secret-named value is then no
    longer trusted as a file name)."""
    from megatron_env.redact import shape
    junk, size = shape._score(seg)
    assert junk >= 2 and (junk < shape.RANDOM_SHARE * size) is words  # the case it stands for
    assert shape.reads_as_words(seg) is words


def test_a_secret_line_masks_the_rest_of_the_line_keeping_its_indent_and_blanks() -> None:
    """`name: value` on a line of its own (YAML, an env file): a secret name's value is masked to
    the end of the line, the indentation and trailing blanks stay; another name's value stays."""
    line = structure._LINE
    assert line.sub(structure._line, "  password: correct horse battery staple  ") == (
        "  password: <redacted>  ")
    assert line.sub(structure._line, "  build_dir: /tmp/out") == "  build_dir: /tmp/out"


def test_a_base64_line_is_masked_between_its_blanks_and_digits_alone_are_not() -> None:
    """A line that is one long base64 blob of mixed case and digits (a key file's body) is one
    mask, its surrounding blanks kept; a line of digits is a number."""
    import base64
    blob = base64.b64encode(bytes(range(7, 52))).decode()
    b64 = structure._B64_LINE
    assert b64.sub(structure._b64_line, f"  {blob} ") == "  <redacted> "
    assert b64.sub(structure._b64_line, "1" * 44) == "1" * 44


# the word before `_key` that makes the key one a service issued (names._STRONG_PAIRS beyond the
# ones test_redact.STRONG spells): such a key is masked whatever its value looks like
PAIRED_KEYS = ["admin", "service", "user", "webhook", "bot", "integration", "ingest", "write",
               "read", "project", "personal", "crypt", "hmac", "aes", "fernet", "age", "sk",
               "jwt", "session"]


@pytest.mark.parametrize("word", PAIRED_KEYS)
def test_a_key_named_for_what_it_opens_is_masked_even_when_its_value_reads_as_a_word(word):
    """`READ_KEY=hunter` is a password-like key: masked; a plain `SSH_KEY=hunter` (a weak name)
    keeps a value that reads as a word, so only the pair's strength masks it."""
    for name in (f"{word.upper()}_KEY", f"--{word}-key", f"{word}Key"):
        sep = " " if name.startswith("--") else "="
        assert redact.text(f"{name}{sep}hunter", NO_ENV) == f"{name}{sep}<redacted>"
    assert redact.text("SSH_KEY=hunter", NO_ENV) == "SSH_KEY=hunter"  # the weak contrast


hex_body = st.text("0123456789abcdef", min_size=1).map(lambda s: (s * 64)[:64])


@settings(max_examples=25)
@given(body=hex_body)
def test_a_vendor_prefix_masks_a_hex_body_the_shape_pass_would_keep(body):
    """Keys whose body is hex after a known prefix (a digest-like body the shape pass keeps):
    masked by the prefix alone, so every prefix of the vendor table must be in its hints."""
    for token in (f"glimt-{body[:24]}", f"shpat_{body[:32]}", f"shpca_{body[:32]}",
                  f"PMAK-{body[:24]}"):
        assert redact.text(f"log: {token} here", NO_ENV) == "log: <redacted> here", token
