"""Pass 2, shape: what the structural rules left, judged by what it looks like.

A secret nobody wrote a rule for (a new vendor's key, a password in a log line, a token in a URL
path) still looks like what it is: a run of characters nobody typed as words. Every chunk of a
line (a run without spaces, quotes or brackets) is cut into segments at the characters that
join things (`/ : @ = & ? # , ;`); a segment that looks random is masked, and so is a run of
short segments that looks random once joined (`Xk9@Lm2p` is two segments, one password).

Looks random (`random_segment`): the segment's pieces (cut at `- _ . + ~`) that are no
harmless form are cut into units the way words are (`Process`, `Group`, `NCCL`, `2024`), and
the characters no word explains are counted: letters outside the letter pairs common in
English and code (`_BIGRAMS`), units of one or two letters between changes of case or class
(`Kq8Pz`), digits inside letters (`a8x3`; `python3` and `5ms` keep theirs). At least MIN_RANDOM
of them making RANDOM_SHARE of the judged characters (or 8 making most of them) is random. A
short word or acronym with its number (`nvcc`, `cx3`, `16gpu`) and a piece of one or two
repeated characters (`yyyy`, `abab`) are explained whole. A base64 blob is judged by what it
decodes to where it decodes to text: a secret in it masks it, words keep it.

Harmless forms, never masked: hex (digests, git SHAs, addresses, UUIDs, GPU-/MIG- UUIDs, MACs,
PCI bus ids), numbers, sizes, times and versions (digits with at most a few letters: `1e-4`,
`12.5GiB`, `2.11.0+cu130`, `cu130`), words and identifiers (`ProcessGroupNCCL`, `mlx5_0`,
`expandable_segments`), host names and paths (made of those), NIC names, tempfile and
mktemp names, NCCL's `host:pid:tid` prefix, mangled C++ symbols, the masks themselves; and
generated names by their grammar and where they are printed (`_GENERATED_PIECE`, `_KEPT`): a
pod's ReplicaSet hash and suffix, Ray submission ids, SRI and go.sum digests, base32 and Nix
base32 store hashes, S3's extended request ids, trackers' run ids and dashboards' uids in their
URLs, uv's archive ids, conda build strings, `git describe`'s `g<sha>`. Hex is
harmless here only because a git SHA and a W&B key look the same: a hex key is masked by where it
stands (pass 1: a key's name, a login command), never by its shape.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import re
from collections import Counter
from collections.abc import Callable
from urllib.parse import unquote

REDACTED = "<redacted>"
MIN_RANDOM = 10  # characters: a shorter run says too little; a 12-character secret is masked
RANDOM_SHARE = 0.4  # of a segment's judged characters, unexplained by words: generated

# a chunk: what stands between spaces, quotes, brackets and the like
_CHUNK = re.compile(r"[^\s\"'`<>()\[\]{},;|\\]{10,}")
_SEGMENT_SEP = re.compile(r"([/:@=&?#%*!^$])")
_PIECE_SEP = re.compile(r"[-_.+~]+")
_UNITS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_HEX = re.compile(r"(?:0[xX])?(?:[0-9a-f]+|[0-9A-F]+)")
# upper case, lower case and a digit: what base64 of text nearly always holds
_MIXED = re.compile(r"(?=.*[a-z])(?=.*[A-Z])(?=.*[0-9])")
_WORD = re.compile(r"[A-Za-z]{3,}")
_LETTER_RUNS = re.compile(r"[A-Za-z]+")
_NUMBERISH = re.compile(r"[0-9]*(?:[A-Za-z]{1,3}[0-9]+)*[A-Za-z]{0,5}")
# letter pairs that make up 95% of those in the identifiers, comments and docstrings of
# Python 3.11's standard library (bench/redact_bigrams.py computes them): a random string of
# letters hits one of them one time in three, words nineteen times in twenty
_BIGRAM_TEXT = (
    "abacadagaiakalamanaparasatauavaybabebibjblbobubycacechcickclcocrctcudadddedidodrdsdueaec"
    "edeeefegelemenepeqeresetevewexeyfafefffiflfofrfugegiglgngrgsguhahehihoiaibicidieifigilim"
    "inioipirisitivixizjekelaldlelflilllolsltlulymambmemimmmompmsmunancndnenfngninknlnnnonsnt"
    "nunvobocodofoiolomonoooporosotouovowpapepiplpoppprptpupyqurarcrdrergrirmrnrorrrsrtrurysa"
    "scseshsisospssstsusytatctethtitltotptrtstttutyubueufuiulumunupurusutvaveviwawewhwiwowrxc"
    "xtypysytze")
_BIGRAMS = frozenset(_BIGRAM_TEXT[i:i + 2] for i in range(0, len(_BIGRAM_TEXT), 2))
# a host name: lower-case labels joined by dots, the last one a word (`svc.cluster.local`)
_HOST = re.compile(r"(?:[\w-]+=)?[a-z0-9-]+(?:\.[a-z0-9-]+)+\.[a-z]{2,}(?::\d+)?")
# a temporary name Python's tempfile made (`tmpa8x_3kz9`), or Rust's tempfile crate, which uv
# copies a wheel's files through (`.tmpAbC9xY`: 6 letters or digits): random, but a tool's
_TEMP = re.compile(r"tmp[a-z0-9_]{8}|tmp[A-Za-z0-9]{6}")
# and one mktemp(1) made (`tmp.Xk3aB9qLm2`), judged whole: its dot would cut it in two pieces
_MKTEMP = re.compile(r"tmp\.[A-Za-z0-9]{10}")
_NIC = re.compile(r"(?:en|ib|eth|wl|ww|bond)[a-z]?\d+(?:[a-z]{1,3}\d+)*")
# a C++ symbol as a backtrace prints it, mangled (`_ZN6c10...`)
_MANGLED = re.compile(r"_Z[A-Za-z0-9_]+(?:\+0x[0-9a-f]+)?")
# NCCL's line prefix, `host:pid:tid`: the host as the scheduler named it
_NCCL_PREFIX = re.compile(r"[\w.-]+:\d+:\d+")
_USER_PASS = re.compile(r"[^:\s]+:\S+")
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
_B64 = re.compile(r"(?:[A-Za-z0-9+/]{12,}|[A-Za-z0-9_-]{12,})={0,2}")
# A hex body after a number and a colon (`2/1204/1207:<32 hex>`) is the secret of an id, not a
# digest (a digest is labelled by a word: `sha256:`). A vendor's prefix glued to hex (`sbp_<40
# hex>`) is not judged here: tools name things the same way (`worker-<56 hex>`,
# `horovod_<32 hex>`), so those keys are masked only by where they stand (pass 1).
LONG_HEX = 32
_ID_HEX = re.compile(rf"\d:[0-9a-fA-F]{{{LONG_HEX}}}")


# generated names by their grammar: a digest in lower-case base32 (Spack's, torch inductor's)
# or Nix's base32 (`/nix/store/<32>-name`), 160 or 256 bits; `git describe`'s `g<sha>` and a
# version's `+git<sha>`; a conda build string's `py312h<7 hex>`; a Ray submission id
_GENERATED_PIECE = re.compile(r"[a-z2-7]{32}|[a-z2-7]{52}|[0-9a-df-np-sv-z]{32}|[0-9a-df-np-sv-z]"
                              r"{52}|g(?:it)?[0-9a-f]{7,40}|(?:[a-z]+[0-9]*)?h[0-9a-f]{7}|"
                              r"raysubmit")


def _harmless_piece(p: str) -> bool:
    """A piece that is a recognised harmless form: hex, a number, a size or version part, a
    network interface's name (`enp220s0np0`, `ib0`), a temporary file's, a generated name's
    (`_GENERATED_PIECE`)."""
    if not p or _HEX.fullmatch(p) or _NIC.fullmatch(p) or _TEMP.fullmatch(p) or (
            _GENERATED_PIECE.fullmatch(p)) or harmless_id(p):
        return True
    digits = sum(c.isdigit() for c in p)
    return digits * 2 >= len(p) and _NUMBERISH.fullmatch(p) is not None and len(
        _LETTER_RUNS.findall(p)) <= 2


def _unexplained(p: str) -> int:
    """Characters of `p` that no word explains: letters outside the common letter pairs of
    written English and code (`_BIGRAMS`), units of one or two letters between others (`Kq8Pz`:
    Kq, 8, Pz), digits inside letters (`a8x`; `python3` and `5ms` keep theirs). A piece of one
    short word or acronym and a number is explained whole."""
    units = _UNITS.findall(p)
    letters = [u for u in units if not u.isdigit()]
    if len(letters) <= 1 and len(units) <= 2 and len(p) <= 8:
        return 0  # an acronym or a short word, with its number: `nvcc`, `mlp`, `cx3`, `16gpu`
    junk = 0
    for i, u in enumerate(units):
        if u.isdigit():
            junk += len(u) if 0 < i < len(units) - 1 else 0
        elif 0 < i < len(units) - 1 and units[i - 1].isdigit() and units[i + 1].isdigit():
            junk += len(u)  # letters between digits: `7qpk7`
        elif len(u) <= 2:
            junk += len(u)
        else:
            low = u.lower()
            misses = sum(low[j:j + 2] not in _BIGRAMS for j in range(len(low) - 1))
            junk += round(len(u) * misses / (len(u) - 1))
    return junk


@functools.lru_cache(maxsize=1 << 16)  # logs repeat their words: each is judged once
def _score(seg: str) -> tuple[int, int]:
    """(unexplained characters, judged characters) over the pieces of `seg` that are no
    harmless form."""
    if _MKTEMP.fullmatch(seg):
        return 0, 0
    junk = size = 0
    for p in _PIECE_SEP.split(seg):
        if p and not _harmless_piece(p) and len(set(p)) >= min(5, len(p) - 1):  # not `yyyy`
            size += len(p)
            junk += _unexplained(p)
    return junk, size


def _random(junk: int, size: int) -> bool:
    return junk >= MIN_RANDOM and junk >= RANDOM_SHARE * size or junk >= 8 and junk >= 0.6 * size


def random_segment(seg: str) -> bool:
    """Whether `seg` (no spaces, no joining characters) looks generated (module docstring): at
    least MIN_RANDOM characters no word explains, and they are RANDOM_SHARE of what is judged
    (or 8 of them, and most of it)."""
    return _random(*_score(seg))


def random_looking(value: str) -> bool:
    """A value a person did not type as words: long, mixed characters, high entropy; used for
    a value behind a weak secret name (pass 1), where shorter values are judged too."""
    if len(value) < 8 or value.isalpha() and value.islower():
        return False
    motif = next((n for n in range(2, 5) if value == (value[:n] * len(value))[:len(value)]), 0)
    if motif:  # a short motif repeated (`Xk9Xk9Xk9Xk9`): typed to fill a length, not a word
        return sum(any(f(c) for c in value[:motif]) for f in (str.isalpha, str.isdigit,
                                                              lambda c: not c.isalnum())) >= 2
    counts = Counter(value)
    bits = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    classes = sum(any(f(c) for c in value) for f in (str.islower, str.isupper, str.isdigit))
    return bits >= min(3.0, 0.9 * math.log2(len(value))) and classes >= 2


def _decoded(seg: str, redact: Callable[[str], str]) -> str | None:
    """What a base64 blob holds, judged: "secret" when the text it decodes to holds one (a
    service-account JSON, a docker `auths` entry's `user:password`, a kubeconfig's key),
    "harmless" when it decodes to text that holds none (DeepSpeed's `--world_info`, a JSON of
    host names), None when it is no base64 of text (then its shape decides)."""
    if not _B64.fullmatch(seg):
        return None
    try:
        raw = base64.b64decode(seg + "=" * (-len(seg) % 4), altchars=b"-_" if (
            "-" in seg or "_" in seg) else None, validate=True)
        plain = raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not all(c.isprintable() or c in "\n\r\t" for c in plain):
        return None
    if redact(plain) != plain or _USER_PASS.fullmatch(plain):
        return "secret"
    # text with words in it; a number alone (a Discord token's first part) says nothing
    return "harmless" if _WORD.search(plain) else None


def harmless_whole(chunk: str) -> bool:
    """A chunk kept whole by what it is: a host name, a mangled C++ symbol, NCCL's
    `host:pid:tid`."""
    return _HOST.fullmatch(chunk) is not None or _MANGLED.fullmatch(chunk) is not None or (
        _NCCL_PREFIX.fullmatch(chunk) is not None)


def nic(piece: str) -> bool:
    """A network interface's name (`enp220s0np0`, `enP43105s1`, `ib0`)."""
    return _NIC.fullmatch(piece.lower()) is not None


def _whole(chunk: str, redact: Callable[[str], str]) -> str | None:
    """The verdict on a chunk as a whole, where it has one: kept (a host name, a mangled C++
    symbol, NCCL's `host:pid:tid`, base64 of harmless text) or masked (base64 or
    percent-encoding of a secret); None: judged segment by segment."""
    if harmless_whole(chunk):
        return chunk
    decoded = _decoded(chunk, redact) if len(chunk) >= 12 else None
    if decoded == "harmless":
        return chunk
    if decoded == "secret" or "%" in chunk and _PERCENT.search(chunk) and redact(
            unquote(chunk)) != unquote(chunk):
        return REDACTED
    return None


def _runs(segs: list[str], marks: list[str]) -> list[bool]:
    """Which segments to mask: neighbouring segments that read as generated are one run,
    masked together when one of them is random or when they are random joined (`Xk9@Lm2p`,
    base64 cut by `/`); a short clean segment inside a run (`GNVO`, `v1`) neither breaks nor
    joins it, and is masked with it unless it is one case of letters (`status`)."""
    masked = [False] * len(segs)
    i = 0
    while i < len(segs):
        if marks[i] not in ("random", "junky"):
            i += 1
            continue
        j, members = i, []
        while j < len(segs) and marks[j] != "clean":
            if marks[j] != "neutral":
                members.append(j)
            j += 1
        if "random" in (marks[k] for k in members) or random_segment(
                "-".join(segs[k] for k in members)):
            for k in range(i, j):
                masked[k] = k in members or not _plain(segs[k])
        i = j
    return masked


@functools.lru_cache(maxsize=1 << 16)
def _clean(chunk: str) -> bool:
    """A chunk with nothing to judge further: no segment reads as generated, nothing to decode
    (most chunks of a log; remembered, since logs repeat them)."""
    if _B64.fullmatch(chunk) or "%" in chunk or _ID_HEX.search(chunk):
        return False
    for seg in _SEGMENT_SEP.split(chunk)[0::2]:
        if _mark(seg) in ("random", "junky") or len(seg) >= 12 and _MIXED.search(seg):
            return False
    return True


def _chunk(chunk: str, redact: Callable[[str], str]) -> str:
    """One chunk (a mask `<redacted>` never stands inside one: `<` and `>` end it)."""
    if _clean(chunk):
        return chunk
    whole = _whole(chunk, redact)
    if whole is not None:
        return whole
    parts = _SEGMENT_SEP.split(chunk)  # segment, sep, segment, ...
    segs = parts[0::2]
    marks = [_mark(seg) for seg in segs]
    for k, seg in enumerate(segs):  # base64 judged by what it decodes to, where it can be
        if marks[k] == "random" and _decoded(seg, redact) == "harmless":
            marks[k] = "clean"
        elif marks[k] != "random" and len(seg) >= 12 and _MIXED.search(seg) and _decoded(
                seg, redact) == "secret":
            marks[k] = "random"
    for k in range(1, len(segs)):  # an id's hex secret: `<number>:<32 hex or more>`
        if parts[2 * k - 1] == ":" and segs[k - 1].isdigit() and len(segs[k]) >= LONG_HEX \
                and _HEX.fullmatch(segs[k]):
            marks[k] = "random"
            j = k - 1  # with the ids it is issued under (`2/<user>/<app>:`): one token
            while j >= 0 and segs[j].isdigit():
                marks[j] = "random"
                j -= 1
    masked = _runs(segs, marks)
    if not any(masked):
        return chunk
    return "".join(REDACTED if i % 2 == 0 and masked[i // 2] else part
                   for i, part in enumerate(parts))


def _plain(seg: str) -> bool:
    """A word of one case or a number (`status`, `GNVO`, `443`), not a mix (`016M5NID`)."""
    return not seg or seg.isdigit() or seg.isalpha() and (seg.islower() or seg.isupper())


def reads_as_words(seg: str) -> bool:
    """Neither random nor a part of something random: written by a person or a tool's namer."""
    junk, size = _score(seg)
    return junk < 2 or junk < RANDOM_SHARE * size


def _mark(seg: str) -> str:
    """random (masked alone), junky (reads as generated, too short alone), neutral (short and
    clean: `v1`, `GNVO`, empty), clean (words, harmless forms)."""
    junk, size = _score(seg)
    if _random(junk, size):
        return "random"
    if junk >= 2 and junk >= RANDOM_SHARE * size:
        return "junky"
    return "neutral" if len(seg) <= 8 else "clean"


# ------------------------------------------------------------------ generated ids, a family
# Ids that tools generate are recognised by their alphabet, their length and, where the grammar
# has one, a check of their own: a time-ordered id's time lies in a plausible range (ULID: 48
# bits of milliseconds in Crockford base32, 2015-2040), a content id decodes to a multihash of
# the length its code says (CIDv0 `Qm...` in base58, CIDv1 `b...` in base32). A random
# upper-case secret of a ULID's alphabet and length passes about one time in 1,500 (its first
# character and its time), a CID's multihash bytes about never. Ids whose grammar has no check
# (a KSUID: 27 base62, any time passes one time in 14; a snowflake, a serial, a request id in
# base64) are kept by their place (`KEPT_ID`: after a key that names an id) or by their kind
# (digits, hex: harmless forms already).
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
_CID0 = re.compile(r"Qm[1-9A-HJ-NP-Za-km-z]{44}")
_CID1 = re.compile(r"b[a-z2-7]{58,}")
_MS_2015, _MS_2040 = 1_420_070_400_000, 2_208_988_800_000


def _number(s: str, alphabet: str) -> int:
    n = 0
    for c in s:
        n = n * len(alphabet) + alphabet.index(c)
    return n


def harmless_id(tok: str) -> bool:
    """A generated id by its grammar and its own check (above): a ULID whose time is
    2015-2040, a CIDv0/CIDv1 that decodes to a sha2-256 multihash."""
    n = len(tok)
    if n == 26 and _ULID.fullmatch(tok):
        return _MS_2015 <= _number(tok[:10], _CROCKFORD) <= _MS_2040
    if n == 46 and _CID0.fullmatch(tok):
        return _number(tok, _B58).to_bytes(35, "big")[1:3] == b"\x12\x20"
    if n >= 59 and _CID1.fullmatch(tok):
        try:
            raw = base64.b32decode(tok[1:].upper() + "=" * (-len(tok[1:]) % 8))
        except (binascii.Error, ValueError):
            return False
        return raw[:1] == b"\x01" and b"\x12\x20" in raw[1:4] and len(raw) >= 36
    return False


# an id by its place: the value after a key that names an id of a request, a trace, a run, a
# job ... (never a credential's: `session_id`, `secret_id`, `key_id` are not among them)
_ID_KEY = (r"(?i:\b(?:x-)?(?:request|req|trace|span|correlation|run|job|task|object|build|"
           r"commit|instance|device|container|pod|image|event|message|upload|operation|"
           r"execution|submission|workflow|artifact|deployment|revision|amz-request|"
           r"amz-cf|cf-ray|activity|invocation|transaction|serial)[ _-]?(?:id|number|no)\b)")
KEPT_ID = re.compile(_ID_KEY + r"[\"']?[ \t]*[:=][ \t]*[\"']?[A-Za-z0-9+/_=.-]{4,96}")


# generated names by their grammar where they are printed, kept whole: a Kubernetes pod's
# ReplicaSet hash and suffix (its alphabet has no vowels, no 0, 1, 3), a Ray submission id, SRI
# and go.sum digests (`sha512-<base64>`, `h1:<base64>`), S3's extended request id, a tracker's
# run id and a dashboard's uid in their URL paths, uv's archive ids, macOS's temporary folders
_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
_KEPT = re.compile(
    rf"(?<![\w-])[a-z0-9]+(?:-[a-z0-9]+)*-{_SAFE}{{6,10}}-{_SAFE}{{5}}(?![\w-])"
    r"|(?<![\w-])raysubmit_[A-Za-z0-9]{16}(?![A-Za-z0-9])"
    r"|(?<![\w-])(?:sha(?:1|256|384|512)-|h1:)[A-Za-z0-9+/]{27,86}={0,2}(?![\w+/=-])"
    r"|(?i:x-amz-id-2|extended request id)[\"']?[ \t]*[:=][ \t]*[\"']?[A-Za-z0-9+/]{40,}={0,2}"
    r"|/runs/[a-z0-9]{8}(?![\w-])|/(?:d|d-solo|uid)/[A-Za-z0-9_-]{9,14}(?=/|\?|[\s\"']|$)"
    r"|/archive-v0/(?:[A-Za-z0-9_-]{21}|[A-Za-z0-9_-]{16})(?![\w-])|/var/folders/\w{2}/\w{30}/T/"
    r"|" + KEPT_ID.pattern)
_KEPT_HINT = ("-", "raysubmit", "h1:", "amz", "equest", "/runs/", "/d", "/uid/", "archive",
              "/var/folders/", "id", "Id", "ID", "erial", "umber")


def _chunks(s: str, redact: Callable[[str], str]) -> str:
    return _CHUNK.sub(lambda m: _chunk(m.group(), redact), s)


def mask(s: str, redact: Callable[[str], str]) -> str:
    """`s` with every random-looking segment masked (module docstring); `redact` is the whole
    redaction, for what a base64 blob decodes to. A generated name in its place (`_KEPT`) is
    held out: looked for only in a line where something was to be masked."""
    if len(s) < MIN_RANDOM:
        return s
    done = _chunks(s, redact)
    if done == s or not any(map(s.__contains__, _KEPT_HINT)):
        return done
    out, pos = [], 0
    for m in _KEPT.finditer(s):
        out += [_chunks(s[pos:m.start()], redact), m.group()]
        pos = m.end()
    return "".join(out) + _chunks(s[pos:], redact) if out else done
