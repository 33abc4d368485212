"""Evidence quoted by what it is: each token of a text that triage quotes but did not parse
(the rest of NCCL's `Last error:`, a CUDA error's trailing text, a user's exception message, an
argv list) passes a value test, or is masked.

The passes before (structure, shape) mask what they recognise as a secret; a secret in a syntax
nobody wrote a rule for (a tool's own option, a label and separator of another language, a
connection syntax, a repr) is still one token of a kind that log text does not hold. So here,
text that leaves the tool as evidence keeps only the tokens that read as one of the harmless
kinds, each judged alone after its wrapping punctuation is cut (`(`, `'`, `,` ...):
- words and identifiers (`ProcessGroupNCCL`, `ncclUnhandledCudaError`, `fp8_e4m3`, `c10d`):
  pieces (cut at `_ - . / : @ = , + ~ # ? & %`) each a word that reads as words, a number, a
  word with its number (`H100`, `mlx5`, `cu130`, `5ms`, `sm90a`) or a piece of at most 4
  characters;
- numbers, sizes, times and versions (`12.5GiB`, `10:00:01.123`, `2.11.0+cu130`), paths and
  hosts (made of those pieces), hex (digests, addresses, UUIDs), the harmless generated grammars
  of the shape pass (megatron_env.redact.shape.harmless_id);
- the masks the passes before made.
Any other token is masked: mixed letters, digits and symbols in one piece (`Xk9vQ2mZ`), a
random-looking run, and a quoted value after an assignment-like token (`x='...'`, `key: "..."`)
unless it is a number, a switch, a path or one identifier of letters.
"""

from __future__ import annotations

import functools
import re

from megatron_env.redact.shape import (
    KEPT_ID,
    REDACTED,
    harmless_id,
    harmless_whole,
    nic,
    reads_as_words,
)

# a mask the passes before made, never judged again (`<redacted>`, `<redacted: 24 chars>`)
_MASK = re.compile(r"<redacted(?::[ \t]*\d+ chars)?>|\*\*\*")
# and what stands as it is: a mask, an id in its place (`request_id=...`; shape.KEPT_ID)
_STANDS = re.compile(_MASK.pattern + "|" + KEPT_ID.pattern)
_SPLIT = re.compile(r"(\s+)")
_WRAP = "\"'`()[]{}<>,;:.!?"
_PIECES = re.compile(r"[_\-./:@=,+~#?&%*|\\$^\[\](){}<>'\"!;`]+")
_WORD_NUMBER = re.compile(r"[A-Za-z]{1,12}\d{1,6}[A-Za-z]{0,3}|\d{1,6}[A-Za-z]{1,6}\d{0,3}")
_HEX = re.compile(r"(?:0[xX])?[0-9a-fA-F]+")
_NUMBER = re.compile(r"[-+]?\d+(?:[.,:]\d+)*(?:[eE][-+]?\d+)?%?")
# `key=` / `key: ` then a quote: a value given to a name, as a repr or a config writes it
_ASSIGNED = re.compile(r"([\w.\-\]]+[ \t]*(?:=|:[ \t]))([bru]{0,2})(['\"])((?:(?!\3)[^\n])*)\3")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_.]*")


# words as code joins them (`nvmlDev`, `PyTorchJob`, `busId`, `NCCL`): at most a few changes
# of case, each starting a word
_CAMEL = re.compile(r"[A-Z]*[a-z]*(?:[A-Z][a-z]+){0,3}[A-Z]{0,4}")
# a serial number, a part number (`DEL2212S020`, `PKXZ12345678`): capitals and digits in runs
_SERIAL = re.compile(r"[A-Z]{1,6}\d{2,10}(?:[A-Z]{1,2}\d{1,6})?")


@functools.lru_cache(maxsize=1 << 16)
def _piece(p: str) -> bool:
    """A piece of a token (no joining characters): harmless or not."""
    if len(p) <= 4 or p.isdigit() or _NUMBER.fullmatch(p) or _WORD_NUMBER.fullmatch(p) or (
            _SERIAL.fullmatch(p)) or nic(p):
        return True
    if p.isalpha():
        return reads_as_words(p) or len(p) <= 12 and _CAMEL.fullmatch(p) is not None
    if p[:2] in ("0x", "0X"):
        return _HEX.fullmatch(p) is not None
    return len(p) >= 6 and _HEX.fullmatch(p) is not None and not (
        any(c.isupper() for c in p) and any(c.islower() for c in p))


# symbols that join no words, paths, hosts or numbers, standing between letters or digits: what
# a generated password holds (`%` of a percent-encoding and of a printf format excepted)
# (`$WORK` a variable's reference, `%ib0` an IPv6 address's zone)
_INNER_SYMBOL = re.compile(r"[A-Za-z0-9](?:[!#^*&|]|\$(?![A-Z_{])|%(?!(?:ib|en|eth|bond|mlx|lo)"
                           r"[A-Za-z0-9_]*(?![^<>\]\s,;)])))[A-Za-z0-9]")
_PERCENT_CODE = re.compile(r"%[0-9A-Fa-f]{2}|%[hpdsi](?![A-Za-z0-9])")


@functools.lru_cache(maxsize=1 << 16)
def harmless(token: str) -> bool:
    """Whether one token (no spaces) reads as one of the harmless kinds (module docstring)."""
    core = token.strip(_WRAP)
    if not core or _MASK.fullmatch(core) or harmless_id(core) or harmless_whole(core):
        return True
    if _INNER_SYMBOL.search(core) and not _PERCENT_CODE.search(core):
        return False  # `hb7j_6E_Ma#Kl%Hh`: a symbol no word or path holds, between characters
    pieces = [p for p in _PIECES.split(core) if p]
    if core.islower() and "-" in core and any(p.isalpha() and len(p) >= 3 for p in pieces):
        # a Kubernetes name (`pytorchjob-example-t8x8pnd8-master-0`): words and the short
        # lower-case suffixes its controllers generate
        return all(_piece(p) or len(p) <= 10 for p in pieces)
    return all(map(_piece, pieces))


def _quoted_value(value: str) -> bool:
    """A quoted value after an assignment that may show: a number, a switch, a path, one
    identifier of letters (`'nccl'`, `'torch.float16'`), or words of several tokens each
    harmless (a message)."""
    v = value.strip()
    if not v or _MASK.fullmatch(v) or _NUMBER.fullmatch(v) or v.lower() in (
            "true", "false", "none", "null", "yes", "no", "on", "off"):
        return True
    if " " in v:
        return all(map(harmless, v.split()))
    if "/" in v or re.search(r"\.[A-Za-z]\w{0,4}$", v):  # a path, a file's name
        return harmless(v)
    return _IDENTIFIER.fullmatch(v) is not None and reads_as_words(v.replace(".", "_"))


def _assigned(m: re.Match[str]) -> str:
    if _quoted_value(m.group(4)):
        return m.group(0)
    return m.group(1) + m.group(2) + m.group(3) + REDACTED + m.group(3)


def _token(tok: str) -> str:
    if harmless(tok):
        return tok
    start = len(tok) - len(tok.lstrip(_WRAP))
    end = len(tok.rstrip(_WRAP))
    if start >= end:
        return tok
    return tok[:start] + REDACTED + tok[end:]


def mask(s: str) -> str:
    """`s` (already through the whole redaction) with every token that is none of the harmless
    kinds masked, and a quoted value after an assignment unless it plainly may show."""
    if "'" in s or '"' in s:
        s = _ASSIGNED.sub(_assigned, s)
    out = []
    pos = 0
    for m in _STANDS.finditer(s):  # masks and placed ids stand; what is between is judged
        out.append("".join(_token(t) if i % 2 == 0 else t
                           for i, t in enumerate(_SPLIT.split(s[pos:m.start()]))))
        out.append(m.group())
        pos = m.end()
    out.append("".join(_token(t) if i % 2 == 0 else t
                       for i, t in enumerate(_SPLIT.split(s[pos:]))))
    return "".join(out)
