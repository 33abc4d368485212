"""Credentials as a grammar of syntaxes, and generated ids as a family, for the redaction's
tests (tests/test_redact_grammar.py) and its benchmark (bench/redact_grammar.py).

tests/redact_positions.py lists the positions somebody thought of; a list measures what was
listed. Here a case is drawn from independent axes, so that their product holds syntaxes
nobody wrote down:
- KEY: the name the value is given under (a credential's name in several spellings, or none:
  a bare value in a message);
- SEP: how the key is joined to its value (`=`, `: `, ` => `, ` := `, a tab, a full-width
  colon, ` is `, a space ...);
- QUOTE: how the value is quoted (bare, single, double, back-ticks, a bytes literal, brackets,
  angle brackets, percent signs);
- CONT: where the pair stands in what triage quotes (the line itself, after NCCL's `Last
  error:`, after a CUDA error's text, in a user's exception message, in an argv list, on the
  line after its label);
- CARRIER: how the text reaches the redaction (alone, after a log prefix, line by line, inside
  a JSON document, as a triage finding's evidence and summary, as the value of an environment
  variable under an NCCL_/TORCH_ name the tool prints).
Every value of every axis falls in "tune" or "held" by a hash of its name (`split`), fixed
before any tuning; a case is "tune" when all its axis values are, "held" otherwise. The
redaction is only ever fixed on tune cases; held cases are the figure reported.

A case leaks when the secret, or any 12 of its characters in a row, is in the output (the
issue's measure); the secret is random per draw (a random string of letters, digits and
symbols, 14-28 characters).

IDS is the family of harmless generated ids (an alphabet at a fixed length after an id's key,
ULIDs, UUIDv7, KSUIDs, snowflakes, CIDs, git and sha256 digests, serials, request ids in
base64), each a grammar with its own axes (the id kind, the key it stands after, the place it
is printed), split the same way.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

B62 = string.ascii_letters + string.digits
SYMBOLS = "!#%^*_+-.~@$&"


def split(name: str) -> str:
    """"tune" or "held", by a hash of `name` (about 55% tune). Fixed: never chosen by result."""
    return "tune" if hashlib.sha256(name.encode()).digest()[0] < 141 else "held"


def r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def secret(rng: random.Random) -> str:
    """A random secret: a letter or digit, then letters, digits and symbols (at least one of
    each class, so that no draw is a word)."""
    n = rng.randint(14, 28)
    body = [rng.choice(string.ascii_lowercase), rng.choice(string.ascii_uppercase),
            rng.choice(string.digits)] + [rng.choice(B62 + SYMBOLS[:6]) for _ in range(n - 4)]
    rng.shuffle(body)
    return rng.choice(B62) + "".join(body)


# ----------------------------------------------------------------------------- the axes

KEYS = ("password", "passwd", "DB_PASSWORD", "db_pass", "apiKey", "api-key", "x-api-key",
        "access_token", "client_secret", "secret", "auth_token", "pwd", "Passwort", "token",
        "private_key", "PGPASSWORD", "bearer", "credentials", "session_token", "mot_de_passe",
        "hmac_secret", "license_key", "signing_key", "sas_token", "")
SEPS = ("=", ": ", " = ", ":", " => ", " := ", "\t", " is ", "\uff1a", " -> ", " ", "=\u00a0",
        ": \u00a0")
QUOTES = ("bare", "single", "double", "backtick", "bytes", "paren", "square", "angle",
          "percent", "brace")
CONTS = ("line", "last-error", "cuda-error", "exception", "argv", "next-line")
CARRIERS = ("alone", "log", "stream", "json", "evidence", "env")
# FRESH: a second held-out part of each axis, added when the first held part had been looked
# at once (its figure printed while the redaction was still being fixed); never looked at
# until the final measurement. A "fresh" case draws at least one axis value from here.
FRESH = {"key": ("kennwort", "db-password", "GITHUB_PAT", "refreshToken", "jwt", "authKey",
                 "ssh_passphrase", "oauth_secret"),
         "sep": (" == ", "::", " <- ", "=>", " |= "),
         "quote": ("triple", "raw", "dollar-brace"),
         "cont": ("warn-suffix", "repr"),
         "carrier": ("summary-only",)}
FRESH_IDS = {"kind": ("b58-22", "b64url-16", "crockford-13"),
             "key": ("message_id", "submission_id", "operation_id", "x-amz-request-id"),
             "place": ("kv-colon",)}


def quote(how: str, v: str) -> str:
    return {"triple": f'"""{v}"""', "raw": f"r'{v}'", "dollar-brace": f"${{{v}}}", "bare": v, "single": f"'{v}'", "double": f'"{v}"', "backtick": f"`{v}`",
            "bytes": f"b'{v}'", "paren": f"({v})", "square": f"[{v}]", "angle": f"<{v}>",
            "percent": f"%{v}%", "brace": f"{{{v}}}"}[how]


def pair(key: str, sep: str, value: str) -> str:
    return f"{key}{sep}{value}" if key else value


def place(cont: str, kv: str, key: str, qv: str, rng: random.Random) -> str:
    """The pair where `cont` puts it, in the text a job log holds."""
    host = f"node{rng.randint(1, 64):02d}"
    if cont == "line":
        return f"connecting with {kv} to {host}"
    if cont == "last-error":
        return (f"{host}:{rng.randint(1000, 99999)}:{rng.randint(1000, 99999)} [0] NCCL INFO "
                f"misc/socket.cc:50 NCCL WARN socket failure\nLast error:\n{kv} refused by "
                f"{host}")
    if cont == "cuda-error":
        return (f"RuntimeError: CUDA error: an illegal memory access was encountered "
                f"(while loading {kv})")
    if cont == "exception":
        return f"ValueError: could not open store with {kv}; retrying"
    if cont == "warn-suffix":
        return f"[W socket.cpp:464] [c10d] The server socket has failed to listen ({kv})."
    if cont == "repr":
        return f"TypeError: Store(host='{host}', {kv}) got an unexpected keyword"
    if cont == "argv":
        opt = ("--" + key.lower().replace("_", "-")) if key else "--value"
        return json.dumps({"argv": ["python", "train.py", opt, qv.strip("'\"`"), "--seed", "1"]})
    return f"{key or 'value'}:\n{qv}"


@dataclass(frozen=True)
class Case:
    key: str
    sep: str
    quote: str
    cont: str
    carrier: str
    value: str
    text: str

    @property
    def axes(self) -> dict[str, str]:
        return {"key": self.key, "sep": self.sep, "quote": self.quote, "cont": self.cont,
                "carrier": self.carrier}

    @property
    def side(self) -> str:
        if any(v in FRESH[axis] for axis, v in self.axes.items()):
            return "fresh"
        held = any(split(f"{axis}:{v}") == "held" for axis, v in self.axes.items())
        return "held" if held else "tune"


def draw(rng: random.Random, fresh: bool = False) -> Case:
    """One case, each axis drawn independently (with `fresh`, from the axes with FRESH's
    values added)."""
    def pick(axis: str, values: tuple[str, ...]) -> str:
        return rng.choice(values + FRESH[axis] if fresh else values)
    key, sep, how = pick("key", KEYS), pick("sep", SEPS), pick("quote", QUOTES)
    cont, carrier = pick("cont", CONTS), pick("carrier", CARRIERS)
    value = secret(rng)
    qv = quote(how, value)
    text = place(cont, pair(key, sep, qv), key, qv, rng)
    return Case(key, sep, how, cont, carrier, value, text)


def cases(side: str, n: int = 1200, seed: int = 52) -> list[Case]:
    """`n` cases of `side` ("tune", "held" or "fresh"), drawn from a fixed seed."""
    rng = random.Random(f"{seed}:{side}")
    out: list[Case] = []
    while len(out) < n:
        c = draw(rng, side == "fresh")
        if c.side == side:
            out.append(c)
    return out


def leaked(out: str, value: str) -> bool:
    """The issue's measure: the secret, or 12 of its characters in a row, in `out` (also as
    JSON escapes it)."""
    flat = out + json.dumps(out)
    windows = {value[i:i + 12] for i in range(max(1, len(value) - 11))}
    return any(w in flat for w in windows)


# ----------------------------------------------------------------------------- ids

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _encode(n: int, alphabet: str, width: int) -> str:
    out = ""
    for _ in range(width):
        n, d = divmod(n, len(alphabet))
        out = alphabet[d] + out
    return out


def _ulid(rng: random.Random) -> str:
    ms = int(time.time() * 1000) - rng.randint(0, 5 * 365 * 86400 * 1000)
    return _encode(ms, CROCKFORD, 10) + r(rng, CROCKFORD, 16)


def _uuid7(rng: random.Random) -> str:
    ms = int(time.time() * 1000) - rng.randint(0, 10 ** 9)
    raw = ms.to_bytes(6, "big") + bytes(rng.getrandbits(8) for _ in range(10))
    b = bytearray(raw)
    b[6] = (b[6] & 0x0F) | 0x70
    b[8] = (b[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(b)))


def _ksuid(rng: random.Random) -> str:
    t = int(time.time()) - 1_400_000_000 - rng.randint(0, 10 ** 8)
    return _encode((t << 128) | rng.getrandbits(128), string.digits + string.ascii_uppercase
                   + string.ascii_lowercase, 27)


def _cid0(rng: random.Random) -> str:
    digest = hashlib.sha256(rng.randbytes(32)).digest()
    return _encode(int.from_bytes(b"\x12\x20" + digest, "big"), B58, 46)


def _cid1(rng: random.Random) -> str:
    codec = rng.choice([b"\x70", b"\x55", b"\x71"])
    raw = b"\x01" + codec + b"\x12\x20" + hashlib.sha256(rng.randbytes(32)).digest()
    return "b" + base64.b32encode(raw).decode().lower().rstrip("=")


def _short(alphabet: str, n: int) -> Callable[[random.Random], str]:
    return lambda rng: r(rng, alphabet, n)


def _b64(n: int) -> Callable[[random.Random], str]:
    return lambda rng: base64.b64encode(rng.randbytes(n)).decode()


# kind -> generator; each a grammar an id takes
ID_KINDS: dict[str, Callable[[random.Random], str]] = {
    "b32-8": _short("abcdefghijklmnopqrstuvwxyz234567", 8),
    "b32-16": _short("abcdefghijklmnopqrstuvwxyz234567", 16),
    "b36-10": _short(string.ascii_lowercase + string.digits, 10),
    "b36-12": _short(string.ascii_lowercase + string.digits, 12),
    "b62-12": _short(B62, 12), "b62-16": _short(B62, 16), "b62-22": _short(B62, 22),
    "ulid": _ulid, "uuid7": _uuid7, "ksuid": _ksuid,
    "snowflake": lambda rng: str(rng.randint(10 ** 17, 10 ** 19)),
    "cid0": _cid0, "cid1": _cid1,
    "git": lambda rng: r(rng, "0123456789abcdef", rng.choice([7, 12, 40])),
    "sha256": lambda rng: "sha256:" + r(rng, "0123456789abcdef", 64),
    "serial-digits": lambda rng: str(rng.randint(10 ** 12, 10 ** 13)),
    "serial-part": lambda rng: r(rng, string.ascii_uppercase, 4) + r(rng, string.digits, 8),
    "reqid-b64": _b64(18), "reqid-b64-24": _b64(24),
    "b58-22": _short(B58, 22), "crockford-13": _short(CROCKFORD, 13),
    "b64url-16": lambda rng: base64.urlsafe_b64encode(rng.randbytes(12)).decode(),
}
ID_KEYS = ("request_id", "x-request-id", "trace_id", "run_id", "job_id", "RequestId",
           "correlation-id", "object_id", "build_id", "event_id", "span_id", "serial_number",
           "instance_id", "execution_id", "artifact_id", "deployment_id")
ID_PLACES = ("log", "json", "evidence", "header")


@dataclass(frozen=True)
class Id:
    kind: str
    key: str
    place: str
    value: str
    text: str

    @property
    def side(self) -> str:
        axes = (("kind", self.kind), ("key", self.key), ("place", self.place))
        if any(v in FRESH_IDS[axis] for axis, v in axes):
            return "fresh"
        held = any(split(f"id-{axis}:{v}") == "held" for axis, v in axes)
        return "held" if held else "tune"


def _id_text(key: str, where: str, v: str) -> str:
    if where == "log":
        return f"2026-12-05 10:00:01 INFO upload done {key}={v} bytes=1024"
    if where == "json":
        return json.dumps({"status": "ok", key: v, "n": 1})
    if where == "header":
        return f"< {key}: {v}"
    if where == "kv-colon":
        return f"upload finished: {key}: {v}, size: 12 MiB"
    return f"RuntimeError: upload failed ({key}: {v})"


def ids(side: str, n: int = 400, seed: int = 52) -> list[Id]:
    rng = random.Random(f"{seed}:ids:{side}")
    out: list[Id] = []
    fresh = side == "fresh"
    kinds = sorted(k for k in ID_KINDS if fresh or k not in FRESH_IDS["kind"])
    keys = ID_KEYS + (FRESH_IDS["key"] if fresh else ())
    places = ID_PLACES + (FRESH_IDS["place"] if fresh else ())
    while len(out) < n:
        kind, key, where = rng.choice(kinds), rng.choice(keys), rng.choice(places)
        v = ID_KINDS[kind](rng)
        i = Id(kind, key, where, v, _id_text(key, where, v))
        if i.side == side:
            out.append(i)
    return out
