"""Secrets out of what the tool writes for others to read: the snapshot's env.txt, the report.

A variable whose name looks like a token, key, password or secret has its value replaced by
`<redacted>`; credentials in URLs (`user:pass@`, `?token=`) are masked anywhere. Pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|PRIVATE|"
                          r"(?:^|_)(?:API_?)?KEYS?(?:_|$)|SIGNATURE", re.I)
_URL_USERINFO = re.compile(r"(\b[a-z][\w+.-]*://)[^/@\s]+@", re.I)
_QUERY_SECRET = re.compile(r"([?&](?:token|key|api_key|password|secret|sig|signature)=)[^&\s]+",
                           re.I)
_MIN_SECRET = 4  # shorter values would blank out ordinary words


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def mask_urls(text: str) -> str:
    """https://user:pass@host/ -> https://***@host/; ?token=abc -> ?token=***."""
    return _QUERY_SECRET.sub(r"\1***", _URL_USERINFO.sub(r"\1***@", text))


def variables(environ: Mapping[str, str]) -> dict[str, str]:
    """Each variable, sorted, its value redacted (secret-named) or URL-masked."""
    return {k: REDACTED if is_secret_name(k) else mask_urls(v)
            for k, v in sorted(environ.items())}


def scrub(text: str, environ: Mapping[str, str]) -> str:
    """The last pass: no URL credentials, and no value of a secret-named variable, anywhere."""
    text = mask_urls(text)
    for name, value in environ.items():
        if is_secret_name(name) and len(value) >= _MIN_SECRET:
            text = text.replace(value, REDACTED)
    return text
