"""Secrets out of everything the tool prints or writes for others to read: console lines,
errors, reports, snapshots, command logs, JSON, evidence quoted from logs. One function, `text`,
is the last pass all of them take (`output` routes every line through it; the report, the
snapshot's files and the command logs call it); `variables` is for a mapping of names to values
(env.txt, the report's variables); `Lines` is `text` for a stream read line by line (a command's
log), which must remember that it is inside a PEM block; `cut` is `text` and then a cut to a
width, for evidence quoted from a line of any length.

It fails closed, in three passes (after pass 0, context, for a text of several lines or a
stream: a value whose label stands on a line before it, megatron_env.redact.context):
1. structure (megatron_env.redact.structure): the positions where secrets stand, whatever they
   look like: flags, `key=value`, URLs, headers, PEM, netrc, connect strings, Python reprs,
   argv lists, commands that take a password, vendor token formats;
2. shape (megatron_env.redact.shape): any token left that looks random is masked unless it is a
   recognised harmless form (hex digests, UUIDs, numbers, versions, words, paths, hosts);
   a base64 blob that decodes to a secret is masked whole;
3. cut (`cut`): only then is a line cut to length, so no cut leaves half a secret unseen.
Plus the environment: the value of any secret-named variable of the process, wherever it shows.

A value is judged by what it is, not by its field's name: in a JSON document booleans are
never masked and numbers only under an unambiguous password's name (`{"password": 1234}`;
`{"pass": 3}` is a count), a path stays a path (`"signature":
"/out/b.sig"`), a file name is no key (`my_password_profile.toml: read`).

Pure functions (`text` reads os.environ unless given a mapping).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

from megatron_env.redact import context, envtypes, shape, structure, tokens
from megatron_env.redact.names import is_secret_name, name_kind
from megatron_env.redact.shape import REDACTED, random_looking
from megatron_env.redact.structure import mask_urls, secret_value

__all__ = ["REDACTED", "Evidence", "Lines", "cut", "is_secret_name", "mask_urls", "name_kind",
           "quoted", "random_looking", "scrub", "secret_value", "text", "variables"]

_MIN_SECRET = envtypes.MIN_SECRET
# a JSON Web Key's private members (RFC 7518 6.2.2, 6.3.2, 6.4.1): short names no rule knows
_JWK_PRIVATE = frozenset({"d", "p", "q", "dp", "dq", "qi", "k", "oth", "r", "t"})
# the names under which a number is a password: unambiguous ones (`pass`, `passes` are counts,
# a report's `pin` is a version pin)
_NUMBER_SECRET = re.compile(r"(?i)(?:password|passwd|passcode|passphrase)$")


def _walk(obj: object, environ: Mapping[str, str], name: object = None,
          jwk: bool = False) -> object:
    if isinstance(obj, dict):
        is_jwk = "kty" in obj
        return {_text(k, environ) if isinstance(k, str) else k: _walk(v, environ, k, is_jwk)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(x, environ, name) for x in obj]
    if isinstance(obj, str):
        if jwk and name in _JWK_PRIVATE and obj:
            return REDACTED
        kind = name_kind(name) if isinstance(name, str) else None
        if secret_value(kind, obj.strip()):
            return REDACTED
        if isinstance(name, str) and envtypes.governed(name) and not envtypes.parses(name, obj):
            return envtypes.shape(obj)  # `{"NCCL_X": "..."}`: a variable's value by its type
        if isinstance(name, str) and kind is None and shape.KEPT_ID.fullmatch(f"{name}={obj}"):
            return obj  # `{"request_id": "..."}`: a generated id in its place
        return _text(obj, environ)
    if isinstance(obj, (int, float)) and not isinstance(obj, bool) and isinstance(name, str) \
            and _NUMBER_SECRET.search(name):
        return REDACTED  # `"password": 1234`: a PIN is a number
    return obj  # a number, a boolean, null: a count (`"pass": 3`), whatever its field is called


def _json(s: str, environ: Mapping[str, str]) -> str | None:
    """`s` redacted as the JSON document it is, in its own layout; None when it is not one."""
    body = s.strip()
    if body[:1] not in "{[" or body[-1:] not in "}]":
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    done = _walk(doc, environ)
    if done == doc:
        return s
    second = body.split("\n", 2)[1] if "\n" in body else ""
    indent = len(second) - len(second.lstrip(" ")) if second else None
    lead, trail = s[:len(s) - len(s.lstrip())], s[len(s.rstrip()):]
    return lead + json.dumps(done, indent=indent) + trail


def _environment(s: str, environ: Mapping[str, str]) -> str:
    for name, value in environ.items():
        if len(value) >= _MIN_SECRET and value in s and secret_value(name_kind(name), value):
            s = s.replace(value, REDACTED)
    return s


def _text(s: str, environ: Mapping[str, str]) -> str:
    if not s:
        return s
    as_json = _json(s, environ)
    if as_json is not None:
        return as_json
    if "\n" in s.rstrip("\n"):
        s = context.mask_text(s)
    s = shape.mask(structure.mask(s), lambda t: _text(t, environ))
    return _environment(envtypes.mask(s), environ)


def text(s: str, environ: Mapping[str, str] | None = None) -> str:
    """`s` with every secret masked: pass 1 (structure), pass 2 (shape), the environment."""
    return _text(s, os.environ if environ is None else environ)


def cut(s: str, width: int, environ: Mapping[str, str] | None = None) -> str:
    """Pass 3: `s` redacted, then cut to `width` characters (a mask is never cut in half). The
    order matters: a line cut first can end inside a secret that no rule then recognises."""
    done = text(s, environ)
    if len(done) <= width:
        return done
    head = done[:width]
    start = head.rfind("<")
    if start != -1 and ">" not in head[start:] and done.startswith(REDACTED, start):
        head = head[:start]
    return head


def variables(environ: Mapping[str, str]) -> dict[str, str]:
    """Each variable, sorted, its value as printed: `<redacted>` for a secret name's (or the
    value of one), its shape (`<redacted: 24 chars>`) where it does not parse as what the
    variable can hold (megatron_env.redact.envtypes: a name it does not know holds nothing
    it can show), else passed through `text`."""
    secrets = {v for k, v in environ.items()
               if len(v) >= _MIN_SECRET and secret_value(name_kind(k), v)}
    return {k: REDACTED if secret_value(name_kind(k), v) or v in secrets else
            text(v, environ) if envtypes.parses(k, v) else envtypes.shape(v)
            for k, v in sorted(environ.items())}


def scrub(s: str, environ: Mapping[str, str]) -> str:
    """The last pass over a report or file (kept as a name: `text` with a given environment)."""
    return text(s, environ)


class Lines:
    """`text` for a stream taken line by line (a command's log): the lines of a PEM block that
    began on an earlier line are masked whole until its END line, and each line is judged with
    the two before it as context (megatron_env.redact.context: a value on the line after its
    label, a YAML or TOML block under a secret's key, a Kubernetes Secret's data)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = environ
        self.inside = False
        self.context = context.Context()

    def __call__(self, line: str) -> str:
        line = self.context(line)
        if self.inside:
            if "-----END " in line:
                self.inside = False
                return REDACTED + line[line.index("-----END "):]
            return REDACTED + ("\n" if line.endswith("\n") else "")
        if "-----BEGIN " in line and "-----END " not in line:
            self.inside = True
        return text(line, self.environ)


def quoted(s: str, environ: Mapping[str, str] | None = None) -> str:
    """`text`, then pass 4 for text quoted from a log that triage did not parse (a finding's
    summary and evidence): every token that is none of the harmless kinds is masked
    (megatron_env.redact.tokens)."""
    return tokens.mask(text(s, environ))


class Evidence(Lines):
    """`Lines` for a finding's evidence, each line then through pass 4 (`quoted`)."""

    def __call__(self, line: str) -> str:
        return tokens.mask(super().__call__(line))
