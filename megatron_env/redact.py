"""Secrets out of everything the tool prints or writes for others to read: console lines,
errors, reports, snapshots, logs. One function, `text`, is the last pass all of them take
(`output` routes every line through it; the report, the snapshot's files and the command logs
call it); `variables` is for a mapping of names to values (env.txt, the report's variables);
`Lines` is `text` for a stream read line by line (a command's log), which must remember that it
is inside a PEM block.

Secrets are found by where they stand, not only by their format:
- a PEM block of any kind (`-----BEGIN ... KEY-----` ... `-----END ...-----`), with real
  newlines or `\\n` escapes (a service-account JSON): its body;
- a JSON document: parsed, every string redacted as text, and the value of every secret-named
  key (below) replaced; written back in the same layout, so it stays valid JSON;
- the value that follows a secret-named key, in any spelling: `--password X`, `--api-key=X`,
  `PASSWORD=X`, `password: X`, `"client_secret": "X"`, `'hf_token': 'X'`, `-p X` after a
  `docker|podman|helm|... login`, `-pX` after `mysql`, `sshpass -p X`, `curl -u user:X`;
- `Authorization:`/`Proxy-Authorization:`/`Cookie:`/`X-Api-Key:` headers in any case, with or
  without a scheme (`Basic`, `Bearer`, `token` ...);
- credentials in a URL (`https://user:pass@host`) and query or fragment pairs of secret keys
  (`?token=...`, `#access_token=...`, `&sig=...`);
- netrc entries (`machine h login u password P`), `.pgpass` lines (`host:port:db:user:P`);
- values in well-known token formats under any name and anywhere (a URL's path too): GitHub,
  GitLab, Hugging Face, OpenAI/Anthropic, NGC, AWS key ids, Slack, Google API keys, npm, PyPI,
  Docker Hub, Stripe, JWTs; `Bearer` credentials;
- a line that is nothing but a long base64 run with upper case, lower case and digits (a PEM
  body line seen alone);
- the value of any secret-named variable of the process environment, wherever it appears.

Secret names come in two strengths. Strong (the last word is password, passwd, passphrase,
secret, token, credential(s), auth, authorization, cookie, signature, sig, sas, or the name
ends in api/access/private/secret/account/client + key): every value is masked except the
plainly harmless (`true`, `none`, `$VAR`, `<...>`, empty). Weak (any other `*_key`, `*_id` of a
strong name, `session_id`): masked when the value looks random and is not a path. A name whose
last word says what the value is about rather than the secret itself (`_file`, `_path`,
`_type`, `_dir`, `_length`, `_policy` ...) or whose first word is a switch (`use_`, `no_`,
`enable_`, `max_` ...) is no secret name: `--moe-token-dispatcher-type alltoall`,
`TOKENIZERS_PARALLELISM=false`, `--password-file /run/pw`, `cache_key` stay.

Pure functions (`text` reads os.environ unless given a mapping).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections import Counter
from collections.abc import Mapping

REDACTED = "<redacted>"
_MIN_SECRET = 4  # a shorter environment value would blank out ordinary words

# ----------------------------------------------------------------------------- names

_STRONG_LAST = frozenset({"pass", "creds", "auth", "authorization", "cookie", "signature", "sig",
                          "sas", "jwt", "pat", "passin", "passout"})
_STRONG_ENDS = ("token", "apikey", "accesskey", "secretkey", "privatekey", "authkey",
                "credential", "credentials")
_STRONG_PAIRS = frozenset({"api", "access", "private", "secret", "account", "client", "auth",
                           "signing", "encryption", "master", "storage", "subscription",
                           "app", "consumer", "shared", "deploy", "license", "sas"})
_META_LAST = frozenset({
    "file", "files", "path", "paths", "dir", "directory", "env", "var", "name", "names", "type",
    "types", "kind", "length", "len", "size", "min", "max", "count", "num", "prompt", "stdin",
    "policy", "method", "mode", "url", "uri", "endpoint", "host", "enabled", "enable",
    "required", "expiry", "expires", "expiration", "ttl", "timeout", "header", "field",
    "prefix", "suffix", "format", "scheme", "version", "limit", "helper", "manager",
    "provider", "backend", "plugin", "source", "command", "cmd", "ref", "arn", "regex",
    "pattern", "class", "algorithm", "alg", "parallelism", "budget", "location", "store", "ids",
    "level", "rate", "index"})
_SWITCH_FIRST = frozenset({"use", "no", "enable", "disable", "with", "without", "skip",
                           "require", "allow", "is", "has", "max", "min", "num", "n"})
_NOT_SECRET_KEY = frozenset({"cache", "sort", "primary", "foreign", "partition", "routing",
                             "lookup", "hash", "dict", "group", "index", "shard", "unique",
                             "row", "column", "object", "bucket", "table", "config", "public",
                             "pub", "host", "map", "cursor", "kv", "qk", "query", "value",
                             "idempotency", "dedup", "cluster", "node"})
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


@functools.lru_cache(maxsize=4096)
def name_kind(name: str) -> str | None:
    """"strong", "weak" or None: how secret the value behind this name is (module docstring)."""
    parts = [p.lower() for p in _WORDS.findall(name)]
    if not parts or parts[-1] in _META_LAST or parts[0] in _SWITCH_FIRST and len(parts) > 1:
        return None
    last, before = parts[-1], parts[-2] if len(parts) > 1 else ""
    if last in _STRONG_LAST or last.endswith(_STRONG_ENDS) or any(
            w in p for p in parts for w in ("password", "passwd", "passphrase", "secret")):
        return "strong"
    if last in ("key", "keys"):
        if before in _STRONG_PAIRS:
            return "strong"
        return None if before in _NOT_SECRET_KEY else "weak"
    if last == "id" and (before in ("key", "session") or name_kind(
            "_".join(parts[:-1])) == "strong"):
        return "weak"
    return "weak" if last in ("sessionid", "sid") else None


def is_secret_name(name: str) -> bool:
    return name_kind(name) is not None


_PLAIN = re.compile(r"(?:true|false|none|null|nil|yes|no|on|off|undefined|\*+|x{3,}|-|"
                    r"<[^<>]*>|\$\{?\w+\}?|%\w+%|\.\.\.)", re.I)
_PATH = re.compile(r"(?:~|\.{1,2})?/[\w.@~+-]+(?:/[\w.@~+-]*)*")


def random_looking(value: str) -> bool:
    """A value a person did not type as a word: long, mixed characters, high entropy."""
    if len(value) < 8 or value.isalpha() and value.islower():
        return False
    counts = Counter(value)
    bits = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    classes = sum(any(f(c) for c in value) for f in (str.islower, str.isupper, str.isdigit))
    return bits >= min(3.0, 0.9 * math.log2(len(value))) and classes >= 2


def secret_value(kind: str | None, value: str) -> bool:
    """Whether `value`, standing behind a name of this kind, is to be masked."""
    if kind is None or not value or _PLAIN.fullmatch(value):
        return False
    if kind == "strong":
        return True
    return random_looking(value) and not _PATH.fullmatch(value)


# ----------------------------------------------------------------------------- rules

_PEM = re.compile(r"(-----BEGIN ([A-Z0-9 ]{1,48})-----)([A-Za-z0-9+/=\s:,.\\-]*?)"
                  r"(-----END \2-----|(?=[^A-Za-z0-9+/=\s:,.\\-])|\Z)")
_URL_USERINFO = re.compile(r"(\b[a-z][\w+.-]*:/{1,2})[^/@\s]+@", re.I)  # a Path keeps one /
# `?key=value`, `&key=value`, `#key=value`, `;key=value` (a URL's query, fragment, parameters)
_URL_PAIR = re.compile(
    r"((?<=[?&#;])(?:[\w.-]*[_.-])?(?:access_token|private_token|refresh_token|id_token|token|"
    r"api_?key|apikey|key|secret|client_secret|password|passwd|pwd|auth|authorization|sig|"
    r"signature|x-amz-signature|x-amz-credential|x-amz-security-token|credential|session_?id|"
    r"sas|code)=)(?!(?:true|false|none|null|yes|no|on|off)\b|<redacted>|\*\*\*)([^&\s#\"',;)]{4,})",
    re.I)
# a value: quoted (to its closing quote, escapes skipped; to the line's end when unclosed), else
# a bare word. An HTTP scheme word before it is kept.
_VALUE = (r"(?P<scheme>(?:[Bb]asic|BASIC|[Bb]earer|BEARER|[Tt]oken|TOKEN|[Dd]igest|"
          r"[Nn]egotiate|NTLM|OAuth|AWS4-HMAC-SHA256)[ \t]+)?"
          r"(?:(?P<vq>\\{0,3}[\"'])(?P<qv>(?:(?!(?P=vq))(?:\\.|[^\n]))*)(?P<vc>(?P=vq)|$)"
          r"|(?P<bv><[^<>\n]*>(?=$|[\s\"'`,;&)}\]])|[^\s\"'`,;&)}\]]+))")
_KV = re.compile(
    r"(?P<key>(?<![\w.-])(?:(?P<dash>--?)|(?P<kq>\\{0,3}[\"'])?)(?P<name>[A-Za-z_][\w.-]*)"
    r"(?(kq)(?P=kq)))(?P<sep>[ \t]*[:=][ \t]*|(?(dash)[ \t]+(?!-)|(?!)))(?=" + _VALUE + ")", re.M)
_HEADER = re.compile(r"(?i)\b((?:proxy-)?authorization|cookie|set-cookie|x-api-key|api-key|"
                     r"x-auth-token|private-token|x-goog-api-key)([ \t]*:[ \t]*)"
                     r"((?:basic|bearer|token|digest|negotiate|ntlm|oauth)[ \t]+)?"
                     r"([^\r\n\"'\\]+)")
_LOGIN = re.compile(
    r"(\b(?:docker|podman|buildah|skopeo|nerdctl|helm|oras|crane|regctl|singularity|apptainer|"
    r"cosign|notation)\b[^\n;|&]*?\blogin\b[^\n;|&]*?(?<!\S)(?:-p|--pass)(?:[ \t]+|=)"
    r"|\b(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mysqlcheck|mariadb|mariadb-dump)"
    r"\b[^\n;|&]*?(?<!\S)-p|\bsshpass\b[^\n;|&]*?(?<!\S)-p[ \t]*|\bredis-cli\b[^\n;|&]*?"
    r"(?<!\S)-a[ \t]+|\bwandb[ \t]+login(?:[ \t]+--?[\w-]+)*[ \t]+"
    r"|(?<!\S)(?:-u|--user|--proxy-user|-U)[ \t]+[\"']?[^\s:%\"']+[:%]|\bpass:)"
    r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']+)")
_NETRC = re.compile(r"\b(machine[ \t]+\S+|default)((?:\s+(?:login|account|password|port|macdef)"
                    r"[ \t]+\S+)+)")
_NETRC_PAIR = re.compile(r"((?:account|password)[ \t]+)(\S+)")
_NETRC_LINE = re.compile(r"(?m)^([ \t]*(?:password|account)[ \t]+)(\S+)[ \t]*$")
_PGPASS = re.compile(r"(?m)(?<![^\s=\"'(\[,])((?:[A-Za-z*][\w.*-]*|\d{1,3}(?:\.\d{1,3}){3}):"
                     r"(?:\d{1,5}|\*):[^:\s\"']+:[^:\s\"']+:)((?:\\:|[^:\s\"'])+?)"
                     r"(?=[)\],:]*(?:$|[\s\"']))")
_TOKEN_FORMATS = re.compile(
    r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}|"
    r"glpat-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,}"
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|nvapi-[A-Za-z0-9_-]{20,}|"
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}|xox[abeprs]-[A-Za-z0-9-]{10,}|"
    r"AIza[0-9A-Za-z_-]{35}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}|"
    r"dckr_pat_[A-Za-z0-9_-]{20,}|"
    r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{4,}(?:\.[A-Za-z0-9_-]*)?)(?![\w-])")
_BEARER = re.compile(r"(\b(?:[Bb]earer|BEARER|Basic|token)[ \t]+)([A-Za-z0-9._~+/=-]{16,})"
                     r"(?=$|[\s\"',;)\]}])")
_B64_LINE = re.compile(r"(?m)^([ \t]*)([A-Za-z0-9+/]{40,}={0,2})([ \t]*)$")
# a cheap first look (substring tests, no regex scan): a string with none of these holds
# nothing the rules above would mask
_STEMS = ("pass", "pwd", "secret", "token", "key", "auth", "cred", "sig", "cookie", "sas", "jwt",
          "session", "sid", "bearer", "machine", "default", "login", "mysql", "maria", "redis",
          "private", "pat", "-u", "--user", "code=")
_PREFIXES = ("gho_", "ghp_", "ghu_", "ghs_", "ghr_", "github_", "glpat-", "hf_", "sk-", "sk_",
             "rk_", "nvapi-", "AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA", "xox",
             "eyJ", "AIza", "npm_", "pypi-", "dckr_", "-----BEGIN", "@")


def _suspect(s: str) -> bool:
    low = s.lower()
    return (any(map(low.__contains__, _STEMS)) or any(map(s.__contains__, _PREFIXES))
            or s.count(":") >= 4 or len(s) >= 40 and _B64_LINE.search(s) is not None)


def mask_urls(text: str) -> str:
    """https://user:pass@host/ -> https://***@host/; ?token=abc -> ?token=***."""
    return _URL_PAIR.sub(r"\1***", _URL_USERINFO.sub(r"\1***@", text))


def _pem(m: re.Match[str]) -> str:
    return m.group(1) + REDACTED + (m.group(4) or "")


def _kv(s: str) -> str:
    """Each secret-named key's value masked. The key and its separator are matched, the value
    only looked at: a value that is not masked is searched for keys of its own
    (`NCCL_X=--password P`)."""
    out, pos = [], 0
    for m in _KV.finditer(s):
        if m.start() < pos:
            continue
        value = m.group("qv") if m.group("vq") is not None else m.group("bv")
        if not secret_value(name_kind(m.group("name")), value.strip()):
            continue
        end = m.end("vc") if m.group("vq") is not None else m.end("bv")
        out += [s[pos:m.end()], m.group("scheme") or "", m.group("vq") or "", REDACTED,
                m.group("vc") or ""]
        pos = end
    return "".join(out) + s[pos:] if out else s


def _header(m: re.Match[str]) -> str:
    value = m.group(4).rstrip()
    if not value or value == REDACTED:
        return m.group(0)
    return m.group(1) + m.group(2) + (m.group(3) or "") + REDACTED + m.group(4)[len(value):]


def _netrc(m: re.Match[str]) -> str:
    return m.group(1) + _NETRC_PAIR.sub(lambda p: p.group(1) + REDACTED, m.group(2))


def _b64_line(m: re.Match[str]) -> str:
    v = m.group(2)
    if v.isdigit() or not (any(c.islower() for c in v) and any(c.isupper() for c in v)
                           and any(c.isdigit() for c in v)):
        return m.group(0)
    return m.group(1) + REDACTED + m.group(3)


def _bearer(m: re.Match[str]) -> str:
    if m.group(1).lower().startswith("bearer") or random_looking(m.group(2)):
        return m.group(1) + REDACTED
    return m.group(0)


_LOGIN_WORDS = ("login", "mysql", "maria", "sshpass", "redis", "-u", "--user", "--proxy-user",
                "pass:")
_HEADER_WORDS = ("auth", "cookie", "api-key", "token")


def _structure(s: str) -> str:
    """Every rule but the environment's, on text that is not a JSON document; each rule only
    where its words are (the rules are regex scans, the words substring tests)."""
    low = s.lower()
    if "-----BEGIN" in s:
        s = _PEM.sub(_pem, s)
    if "@" in s or "=" in s:
        s = mask_urls(s)
    if any(map(low.__contains__, _HEADER_WORDS)):
        s = _HEADER.sub(_header, s)
    if any(map(low.__contains__, _LOGIN_WORDS)):
        s = _LOGIN.sub(lambda m: m.group(1) + REDACTED, s)
    if "password" in low or "account" in low:
        s = _NETRC.sub(_netrc, s)
        s = _NETRC_LINE.sub(lambda m: m.group(1) + REDACTED, s)
    if s.count(":") >= 4:
        s = _PGPASS.sub(lambda m: m.group(1) + REDACTED, s)
    if any(map(s.__contains__, _PREFIXES)):
        s = _TOKEN_FORMATS.sub(REDACTED, s)
    if "earer" in low or "Basic" in s or "token" in s:
        s = _BEARER.sub(_bearer, s)
    if "=" in s or ":" in s or "-" in s:  # NAME=X, name: X, --name X
        s = _kv(s)
    return _B64_LINE.sub(_b64_line, s) if len(s) >= 40 else s


def _walk(obj: object, environ: Mapping[str, str], name: object = None) -> object:
    if isinstance(obj, dict):
        return {_text(k, environ) if isinstance(k, str) else k: _walk(v, environ, k)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(x, environ, name) for x in obj]
    kind = name_kind(name) if isinstance(name, str) else None
    if isinstance(obj, str):
        return REDACTED if secret_value(kind, obj.strip()) else _text(obj, environ)
    if kind == "strong" and isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return REDACTED
    return obj


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
    if _suspect(s):
        s = _structure(s)
    return _environment(s, environ)


def text(s: str, environ: Mapping[str, str] | None = None) -> str:
    """`s` with every kind of secret above replaced."""
    return _text(s, os.environ if environ is None else environ)


def variables(environ: Mapping[str, str]) -> dict[str, str]:
    """Each variable, sorted, its value redacted (a secret name's) or passed through `text`."""
    return {k: REDACTED if secret_value(name_kind(k), v) else text(v, environ)
            for k, v in sorted(environ.items())}


def scrub(s: str, environ: Mapping[str, str]) -> str:
    """The last pass over a report or file (kept as a name: `text` with a given environment)."""
    return text(s, environ)


class Lines:
    """`text` for a stream taken line by line (a command's log): the lines of a PEM block that
    began on an earlier line are masked whole until its END line."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = environ
        self.inside = False

    def __call__(self, line: str) -> str:
        if self.inside:
            if "-----END " in line:
                self.inside = False
                return REDACTED + line[line.index("-----END "):]
            return REDACTED + ("\n" if line.endswith("\n") else "")
        if "-----BEGIN " in line and "-----END " not in line:
            self.inside = True
        return text(line, self.environ)
