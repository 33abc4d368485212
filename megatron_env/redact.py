"""Secrets out of everything the tool prints or writes for others to read: console lines,
errors, reports, snapshots, logs. One function, `text`, is the last pass all of them take
(`output` routes every line through it; the report, the snapshot's files and the command logs
call it); `variables` is for a mapping of names to values (env.txt, the report's variables).

What counts as a secret, wherever it stands:
- credentials in a URL (`https://user:pass@host`, `https://oauth2:TOKEN@host`): always;
- the value of a query or `key=value` pair whose key looks secret (`access_token`,
  `private_token`, `auth`, `X-Amz-Signature`, `sig`, `token`, `key`, `password`, `secret` ...);
- a value in a well-known token format, under any name: GitHub (`ghp_`, `gho_`, `ghu_`,
  `ghs_`, `ghr_`, `github_pat_`), GitLab (`glpat-`), Hugging Face (`hf_`), OpenAI (`sk-`),
  NGC (`nvapi-`), AWS access key ids (`AKIA...`), Slack (`xox[baprs]-`), JWTs (`eyJ...`),
  `Bearer` tokens;
- `NAME=value` where NAME looks like a secret's and value looks random (high entropy);
- the value of any secret-named variable of the process environment, wherever it appears.
Pure functions (`text` reads os.environ unless given a mapping).
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Mapping

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|PRIVATE|"
                          r"(?:^|_)(?:API_?)?KEYS?(?:_|$)|SIGNATURE|(?:^|_)SIG(?:_|$)", re.I)
_URL_USERINFO = re.compile(r"(\b[a-z][\w+.-]*://)[^/@\s]+@", re.I)
# `?key=value`, `&key=value`, `key=value` in a comment or argument: a secret-looking key
_PAIR_SECRET = re.compile(
    r"((?:^|(?<=[\s?&;,\"'(]))(?:[\w.-]*[_.-])?(?:access_token|private_token|refresh_token|"
    r"id_token|token|api_?key|apikey|key|secret|client_secret|password|passwd|pwd|auth|"
    r"authorization|sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|"
    r"credential|session_?id|sas)=)(?!(?:true|false|none|null|yes|no|on|off)\b|<redacted>|\*\*\*)"
    r"([^&\s#\"',;)]{4,})", re.I)
_TOKEN_FORMATS = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}|glpat-[A-Za-z0-9_-]{20,}|"
    r"hf_[A-Za-z0-9]{30,}|sk-(?:proj-|svcacct-|admin-|ant-)?[A-Za-z0-9_-]{20,}|"
    r"nvapi-[A-Za-z0-9_-]{20,}|(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}|"
    r"xox[baprs]-[A-Za-z0-9-]{10,}|"
    r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})(?![\w-])")
_BEARER = re.compile(r"(\b(?:Bearer|Basic|token)\s+)([A-Za-z0-9._~+/=-]{16,})")
_NAMED_VALUE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)(=|: ?)([\"']?)([^\s\"',;&]{8,})")
_MIN_SECRET = 4  # shorter values would blank out ordinary words


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def random_looking(value: str) -> bool:
    """A value a person did not type as a word: long, mixed characters, high entropy."""
    if len(value) < 8 or value.isalpha() and value.islower():
        return False
    counts = Counter(value)
    bits = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    classes = sum(any(f(c) for c in value) for f in (str.islower, str.isupper, str.isdigit))
    return bits >= 3.0 and classes >= 2


def mask_urls(text: str) -> str:
    """https://user:pass@host/ -> https://***@host/; ?token=abc -> ?token=***."""
    return _PAIR_SECRET.sub(r"\1***", _URL_USERINFO.sub(r"\1***@", text))


def _named(m: re.Match[str]) -> str:
    name, sep, quote, value = m.groups()
    if is_secret_name(name) and random_looking(value):
        return f"{name}{sep}{quote}{REDACTED}"
    return m.group(0)


def text(s: str, environ: Mapping[str, str] | None = None) -> str:
    """`s` with every kind of secret above replaced."""
    if not s:
        return s
    s = mask_urls(s)
    s = _TOKEN_FORMATS.sub(REDACTED, s)
    s = _BEARER.sub(lambda m: m.group(1) + REDACTED, s)
    if "=" in s or ":" in s:
        s = _NAMED_VALUE.sub(_named, s)
    for name, value in (os.environ if environ is None else environ).items():
        if len(value) >= _MIN_SECRET and value in s and is_secret_name(name):
            s = s.replace(value, REDACTED)
    return s


def variables(environ: Mapping[str, str]) -> dict[str, str]:
    """Each variable, sorted, its value redacted (secret-named) or passed through `text`."""
    return {k: REDACTED if is_secret_name(k) else text(v, environ)
            for k, v in sorted(environ.items())}


def scrub(s: str, environ: Mapping[str, str]) -> str:
    """The last pass over a report or file (kept as a name: `text` with a given environment)."""
    return text(s, environ)
