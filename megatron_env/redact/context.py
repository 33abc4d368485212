"""Pass 0, context: a secret whose position is given by the lines before it.

A line alone cannot say that it is a secret when its label stands on an earlier line:
- a label alone, or a sentence about a password ending in a colon, and the value on one of the
  next two lines (`Password:` / `X`; Jenkins' `... password to proceed to installation:`, a
  blank line, `X`; botocore's `Signature:` debug line and the signature under it; pydantic's
  `password` and the next line's `input_value='X'`);
- a command that decodes a secret, and its output on the next line (`kubectl get secret ... |
  base64 -d`);
- a block under a secret's key: a YAML block scalar (`password: |`), a TOML multi-line string
  (`password = ` and three quotes), a Kubernetes Secret's `data:`/`stringData:` whose keys
  are file names;
- an XML `<name>` of a secret, its `<value>` on the next line.

`Context` is called on each line in order (a stream's, or a text's split at its newlines) and
returns the line with what its context makes a secret masked; it keeps the two lines before as
context (a label's reach) and, for a block, that it is inside one.
"""

from __future__ import annotations

import re

from megatron_env.redact.names import name_kind
from megatron_env.redact.shape import REDACTED

# what a log puts before a line's text (`2026-12-05T10:00:01Z node3 job[41]: `)
_LOG_PREFIX = r"(?:[^\n]*?[\]\w)]:[ \t]+)??"
_YAML_BLOCK = re.compile(r"^" + _LOG_PREFIX + r"([ \t]*)(?:-[ \t]+)?"
                         r"([^\s:#'\"][^:#]*?|\"[^\"]+\"|'[^']+')[ \t]*:"
                         r"[ \t]*[|>][-+0-9]*[ \t]*(?:#.*)?$")
_TOML_OPEN = re.compile(r"^" + _LOG_PREFIX + r"[ \t]*([\w.\"'-]+)[ \t]*=[ \t]*(\"\"\"|''')(.*)$")
_KEY_LINE = re.compile(r"^[ \t]*(?:-[ \t]+)?[\"']?[\w./-]+[\"']?[ \t]*:(?:[ \t]|$)")
_DATA = re.compile(r"^([ \t]*)(?:data|stringData|binaryData)[ \t]*:[ \t]*$")
_ENTRY = re.compile(r"^([ \t]*)[\"']?[^:\s\"']+[\"']?[ \t]*:[ \t]*")
_INPUT_VALUE = re.compile(r"(\binput_value=)(['\"])((?:(?!\2).)*)\2")
_XML_NAME = re.compile(r"<name>[ \t]*([^<>\s]+)[ \t]*</name>[ \t]*$")
_XML_VALUE = re.compile(r"(<value>)([^<>]+)(?=</value>)")
_DECODE = re.compile(r"\bbase64\b[^\n]*?(?:-d\b|--decode\b|-D\b)|\bopenssl\b[^\n]*?\benc\b"
                     r"[^\n]*?-d\b|\|[ \t]*(?:gpg|sops|age)\b[^\n]*?(?:-d\b|--decrypt\b)")
_DECODERS = ("base64", "openssl", "gpg", "sops", "age -d", "age --decrypt")
_BLOCK_ENDS = (": |", ": >", ":|", ":>")  # a YAML block scalar's header, its indicators cut


def _opens_nothing(r: str) -> bool:
    """A line that opens no context (most lines), said by a few tests of its characters: no
    label's colon at its end, no block's header, words (a space), no TOML string's quotes, no
    XML name, no Secret's kind, no YAML document's start, no decoder."""
    if not r:
        return True
    if r[-1] in ":\uff1a" or r[-1] in "|>-+0123456789" and r.rstrip("-+0123456789").endswith(
            _BLOCK_ENDS) or " " not in r:
        return False
    return not (r.endswith(("</name>", "Secret")) or '""' in r or "''" in r or r.startswith(
        "---") or ("64" in r or "ssl" in r or "gpg" in r or "sops" in r or "age -" in r) and any(
        map(r.__contains__, _DECODERS)))
_SECRETISH = re.compile(r"(?i)secret|passw|passphrase|token|credential|\.data\.|apikey|api_key")
_WORD = re.compile(r"[^\W\d][\w-]*")
_PASSWORD_WORD = re.compile(r"(?i)passw|passphrase|passcode|secret|пароль|密码|kennwort|contrase|"
                            r"senha|wachtwoord")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _strong(name: str) -> bool:
    return name_kind(name.strip("\"' ")) == "strong"


def _label(stripped: str) -> bool:
    """A line that announces a secret on the next lines: a label and a colon (`Password:`,
    `DEBUG:botocore.auth:Signature:`), a short sentence about a password ending in a colon, or
    a secret's name alone (pydantic's location line)."""
    if stripped.endswith((":", "\uff1a")):
        words = _WORD.findall(stripped[:-1])
        if not words or len(words) > 15:
            return False
        if _strong(words[-1]) or len(words) > 1 and _strong("_".join(words[-2:])):
            return True
        return _PASSWORD_WORD.search(stripped) is not None and any(
            _PASSWORD_WORD.search(w) and _strong(w) for w in words)
    return len(stripped) <= 40 and re.fullmatch(r"[A-Za-z_][\w.]*", stripped) is not None \
        and _strong(stripped)


class Context:
    """The redaction's memory across lines (module docstring): call it on each line in turn."""

    def __init__(self) -> None:
        self.block: tuple[str, int | str] | None = None  # ("indent", n) or ("quote", delimiter)
        self.data: int | None = None  # inside a Kubernetes Secret's data, at this indent
        self.secret_doc = False  # a `kind: Secret` document
        self.armed = 0  # lines left in a label's reach
        self.armed_xml = False

    def __call__(self, line: str) -> str:
        if self.block is None and self.data is None and not self.armed and not self.secret_doc \
                and _opens_nothing(line.rstrip()):
            return line
        raw = line.rstrip("\r\n")
        end = line[len(raw):]
        return self._line(raw) + end

    def _line(self, raw: str) -> str:  # noqa: C901 (one branch per context, in order)
        stripped = raw.strip()
        if self.block is not None:
            kind, arg = self.block
            if kind == "quote":
                assert isinstance(arg, str)
                at = raw.find(arg)
                if at < 0:
                    return raw[:_indent(raw)] + REDACTED if stripped else raw
                self.block = None
                return (REDACTED if raw[:at].strip() else raw[:at]) + raw[at:]
            if not stripped:
                return raw
            if _indent(raw) > int(arg):
                return raw[:_indent(raw)] + REDACTED
            self.block = None
        if stripped == "---":
            self.secret_doc, self.data = False, None
        elif stripped.endswith("Secret") and re.search(r"(?:^|\s)kind:[ \t]*Secret$", stripped):
            self.secret_doc = True
        if self.data is not None and stripped:
            if _indent(raw) <= self.data:
                self.data = None
            else:
                m = _ENTRY.match(raw)
                if m and raw[m.end():].strip():
                    value = raw[m.end():].strip()
                    if re.fullmatch(r"[|>][-+0-9]*", value):
                        self.block = ("indent", len(m.group(1)))
                        return raw
                    return raw[:m.end()] + REDACTED
                return raw
        if self.armed:
            self.armed -= 1
            if stripped:
                xml, self.armed_xml, self.armed = self.armed_xml, False, 0
                if xml:
                    return _XML_VALUE.sub(lambda m: m.group(1) + REDACTED, raw)
                if "input_value=" in raw:
                    return _INPUT_VALUE.sub(lambda m: m.group(1) + m.group(2) + REDACTED
                                            + m.group(2), raw)
                if not _KEY_LINE.match(raw) and not _label(stripped):
                    return raw[:_indent(raw)] + REDACTED
        return self._open(raw, stripped)

    def _open(self, raw: str, stripped: str) -> str:
        """Whether this line opens a context for the next ones; the line itself, or with the
        rest of a TOML string's opening line masked."""
        if not stripped or self._label(raw, stripped):
            return raw
        block = self._block(raw, stripped[-1])
        if block is not None:
            return block
        if "</name>" in raw:
            m = _XML_NAME.search(raw)
            if m and _strong(m.group(1)):
                self.armed, self.armed_xml = 1, True
        elif any(map(raw.__contains__, _DECODERS)) and _DECODE.search(raw) and \
                _SECRETISH.search(raw):
            self.armed = 1
        return raw

    def _label(self, raw: str, stripped: str) -> bool:
        """A label whose value is on the next lines, or a Kubernetes Secret's data."""
        if stripped[-1] in ":\uff1a" or stripped.isidentifier() or "." in stripped[:40] and \
                " " not in stripped:
            if self.secret_doc and _DATA.match(raw):
                self.data = _indent(raw)
                return True
            if _label(stripped):
                self.armed = 2
                return True
        return False

    def _block(self, raw: str, last: str) -> str | None:
        """A YAML block scalar or a TOML multi-line string under a secret's key: the line as
        it is to be printed, or None when it opens none."""
        if raw.rstrip().rstrip("-+0123456789").endswith(_BLOCK_ENDS):
            m = _YAML_BLOCK.match(raw)
            if m and _strong(m.group(2)):
                self.block = ("indent", len(m.group(1)))
                return raw
        if ('"""' in raw or "'''" in raw) and "=" in raw:
            t = _TOML_OPEN.match(raw)
            if t and _strong(t.group(1)):
                rest = t.group(3)
                if t.group(2) in rest:
                    return raw
                self.block = ("quote", t.group(2))
                return raw[:t.start(3)] + (REDACTED if rest.strip() else rest)
        return None


def mask_text(s: str) -> str:
    """`s`, a text of several lines, through one `Context`."""
    ctx = Context()
    return "".join(ctx(line) for line in s.splitlines(True))
