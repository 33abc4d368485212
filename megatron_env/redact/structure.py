"""Pass 1, structure: the positions where secrets stand, whatever they look like.

A password can be `hunter2`: no shape pass sees it, so the places a secret is written are
masked first, each a rule of a table below:
- a PEM block of any kind, with real newlines or `\\n` escapes (a service-account JSON);
- the value after a secret-named key in any spelling (`--password X`, `--api-key=X`, `PWD=X`,
  `password: X`, `"client_secret": "X"`, `b'X'`, `auth=('user', 'X')`, `'password' => 'X'`,
  `{b'password': b'X'}`, ODBC's `Pwd={X}`), a label in any language and of up to four words
  (`Passwort: X`, `mot de passe : X`, `Secret ID: X`; after a colon, the rest of the line), a
  table's row (`password    X`, `| password | X |`), a directive (`requirepass X`), each also
  after what a log puts before a line; a password's label in a sentence (`A temporary password
  is generated for root@localhost: X`); quoted name-value pairs
  (an argv list `['curl', '--oauth2-bearer', 'X']`, gRPC metadata `[('authorization', 'X')]`);
- commands that take a secret by position or glued to a flag (`docker login -p X`, `mysql -pX`,
  `mc alias set NAME URL KEY SECRET`, `wandb login X`, `curl -u user:X`, `pass:X`);
- HTTP headers (`Authorization:`, `Cookie:`, `X-Api-Key:` ...) and `Basic`/`Bearer` credentials
  with no header before them;
- URLs: userinfo (a raw `@` in the password too), query and fragment pairs of secret keys, path
  segments that are tokens (`/t/<token>/` of a conda channel, `/bot<id>:<token>/`, webhooks);
- connect strings (`user/password@//host`), netrc entries, `.pgpass` lines;
- the vendor token formats of `FORMATS`, under any name and anywhere;
- a tool's own password options, SQL's `IDENTIFIED BY`, XML properties (megatron_env.redact.
  options).
Each rule runs only where its words are (substring tests first, regex scans after).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from megatron_env.redact import options
from megatron_env.redact.names import ASCII_STEMS, STEMS, name_kind
from megatron_env.redact.shape import REDACTED, random_looking, reads_as_words

# (words that must be in the line, the rule): a rule is scanned for only where its words are
Rule = tuple[tuple[str, ...], Callable[[str], str]]

_PLAIN = re.compile(r"(?:true|false|none|null|nil|yes|no|on|off|undefined|\*+|x{3,}|-|"
                    r"<[^<>]*>|\$\{?\w+\}?|%\w+%|\.\.\.|[0-9]{1,3})", re.I)
PATH = re.compile(r"(?:~|\.{1,2})?/[\w.@~+-]+(?:/[\w.@~+-]*)*")
# a file's path as a tool writes it: from the root, the home or `.`, or ending in a file name
# with its extension (`out/bundle.tar.sig`); `planted/aws+secret/KEY` is no path
_EXT = (r"\.(?:sig|json|toml|yaml|yml|txt|log|tar|gz|zst|xz|whl|pem|crt|key|pub|asc|lock|md|py|"
        r"sh|cfg|ini|conf)")
_FILE = re.compile(r"(?:~|\.{1,2})?/[\w.@~+-]+(?:/[\w.@~+-]+)*/?|[\w.+-]+(?:/[\w.@~+-]+)*" + _EXT)


_ROOTED = re.compile(r"(?:~|\.{1,2})?/[\w.@~+-]+(?:/[\w.@~+-]+){2,}/?|(?:~|\.{1,2})?/[\w.@~+-]+"
                     r"(?:/[\w.@~+-]+)+" + _EXT)


def _a_path(value: str) -> bool:
    """A path, whatever it is called (`"signature": "out/bundle.sig"`): spelled as one, each
    part written as words (`Tr0ub4dor/3` is a password, not a directory); or rooted, three
    parts deep or ending in a file's name, its top folder a word: a temporary folder's random
    suffix is part of a path (`/tmp/bundle-x8K2q9/b.sig`)."""
    if _FILE.fullmatch(value) is None:
        return False
    if _ROOTED.fullmatch(value) and reads_as_words(value.lstrip("~./").split("/", 1)[0]):
        return True
    return all(map(reads_as_words, value.split("/")))


# a version: a package's in `pip list` (`google-auth   2.29.0`) or a pin (`google-auth==2.29.0`)
_VERSION = re.compile(r"=?=?v?\d+(?:\.\d+){1,3}(?:(?:a|b|rc|\.?post|\.?dev)\d*)?(?:\+[\w.]+)?")


def secret_value(kind: str | None, value: str) -> bool:
    """Whether `value`, standing behind a name of this kind, is to be masked. A path is a path
    and a version a version whatever it is called; a weak name's value only when it (or one of
    its words) looks random."""
    if kind is None or not value or _PLAIN.fullmatch(value) or _VERSION.fullmatch(value) or (
            _a_path(value)):
        return False
    if kind == "strong":
        return True
    # a weak name's value of several words (`Key: avg_train_loss, Value: 0.24`, a metric's
    # name and its number) is judged word by word: masked when one of them looks random
    return any(random_looking(word.strip(",;")) for word in value.split())


# ----------------------------------------------------------------------------- vendor formats
# (vendor, literals, regex): a token that says what it is by its prefix; the regex is scanned
# for only in a line holding one of the literals. The shape pass would mask most of them anyway;
# these are here for the ones whose body alone looks harmless (hex after a word) or is short.
FORMATS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("github", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
     r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{22,}"),
    ("gitlab", ("glpat-", "glrt-", "gldt-", "glptt-", "glft-", "glimt-", "gloas-", "glcbt-",
                "glsoat-", "glagent-"),
     r"gl(?:pat|rt|dt|ptt|ft|imt|oas|cbt|soat|agent)-[A-Za-z0-9_-]{16,}"),
    ("huggingface", ("hf_", "api_org_"), r"hf_[A-Za-z0-9]{16,}|api_org_[A-Za-z0-9]{16,}"),
    ("openai/anthropic", ("sk-",), r"sk-(?:ant-|proj-|svcacct-|admin-)?[A-Za-z0-9_-]{16,}"),
    ("stripe", ("_live_", "_test_", "whsec_"),
     r"(?:sk|rk|pk|whsec)_(?:live|test)_[A-Za-z0-9]{12,}|whsec_[A-Za-z0-9]{16,}"),
    ("ngc", ("nvapi-",), r"nvapi-[A-Za-z0-9_-]{20,}"),
    ("aws", ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA", "ABIA", "ACCA"),
     r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|ABIA|ACCA)[A-Z0-9]{16}"),
    ("slack", ("xox", "xapp-"), r"xox[abeprs]-[A-Za-z0-9-]{10,}|xapp-[0-9]-[A-Za-z0-9-]{10,}"),
    ("google", ("AIza", "GOCSPX-", "ya29."),
     r"AIza[0-9A-Za-z_-]{30,}|GOCSPX-[A-Za-z0-9_-]{16,}|ya29\.[A-Za-z0-9_-]{16,}"),
    ("npm/pypi/docker", ("npm_", "pypi-", "dckr_pat_"),
     r"npm_[A-Za-z0-9]{30,}|pypi-[A-Za-z0-9_-]{30,}|dckr_pat_[A-Za-z0-9_-]{16,}"),
    ("shopify", ("shpat_", "shpca_", "shppa_", "shpss_"), r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"),
    ("digitalocean", ("_v1_",), r"do[opr]_v1_[a-f0-9]{64}"),
    ("databricks", ("dapi",), r"dapi[a-f0-9]{32}(?:-\d)?"),
    ("mailgun/mailchimp", ("key-", "-us"), r"key-[a-f0-9]{32}|[a-f0-9]{32}-us\d{1,2}"),
    ("twilio", ("SK", "AC"), r"(?:SK|AC)[a-f0-9]{32}"),
    ("sendgrid", ("SG.",), r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"),
    ("vault", ("hvs.", "hvb.", "hvr."), r"hv[sbr]\.[A-Za-z0-9_-]{20,}"),
    ("age", ("AGE-SECRET-KEY-",), r"AGE-SECRET-KEY-1[0-9A-Z]{50,}"),
    ("artifactory", ("AKC", "cmVmdGtuOjAx"), r"AKC[a-zA-Z0-9]{20,}|cmVmdGtuOjAx[A-Za-z0-9]{20,}"),
    ("atlassian", ("ATATT",), r"ATATT[A-Za-z0-9_=-]{20,}"),
    ("heroku", ("HRKU-",), r"HRKU-[A-Za-z0-9_-]{20,}"),
    ("pulumi/postman/newrelic", ("pul-", "PMAK-", "NRAK-"),
     r"pul-[a-f0-9]{40}|PMAK-[a-f0-9]{24}(?:-[a-f0-9]{34})?|NRAK-[A-Z0-9]{27}"),
    # keys whose body is hex after a short prefix: the shape pass keeps a hex body (a digest),
    # and tools name their things the same way (`worker-<hex>`), so the prefix must be known
    ("hex-bodied keys", ("sbp_", "sntry", "lsv2_", "local-", "pplx-", "glsa_", "pat"),
     r"sbp_[a-f0-9]{40}|sntry[usa]_[a-f0-9]{64}|lsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}"
     r"|local-[a-f0-9]{40}|pplx-[a-f0-9]{48}|glsa_[A-Za-z0-9]{32}_[a-f0-9]{8}"
     r"|pat[A-Za-z0-9]{14}\.[a-f0-9]{64}"),
    ("jwt", ("eyJ",), r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{4,}(?:\.[A-Za-z0-9_-]*)?"),
)


def _hinted(rows: list[tuple[tuple[str, ...], re.Pattern[str], Callable[[re.Match[str]], str]]]
            ) -> Callable[[str], str]:
    """One rule for a table: a single scan for any row's words (as written: the patterns are
    case-sensitive), then each row whose words the line holds (most lines hold none)."""
    hint = re.compile("|".join(re.escape(w) for words, _, _ in rows for w in words))

    def rule(s: str) -> str:
        if hint.search(s) is None:
            return s
        for words, pattern, repl in rows:
            if any(map(s.__contains__, words)):
                s = pattern.sub(repl, s)
        return s
    return rule


def _masked(m: re.Match[str]) -> str:
    return REDACTED


_FORMAT_RULE = _hinted([
    (literals, re.compile(r"(?<![A-Za-z0-9])(?:" + regex + r")(?![\w-])"), _masked)
    for _, literals, regex in FORMATS])


# ----------------------------------------------------------------------------- positions

_PEM = re.compile(r"(-----BEGIN ([A-Z0-9 ]{1,48})-----)([A-Za-z0-9+/=\s:,.\\-]*?)"
                  r"(-----END \2-----|(?=[^A-Za-z0-9+/=\s:,.\\-])|\Z)")
# the userinfo ends at the last `@` before the host: a raw `@` in a password is the password's
_URL_USERINFO = re.compile(r"(\b[a-z][\w+.-]*:/{1,2})(?:[^/\s?#\"'<>:@]*:[^\s\"'<>]*|"
                           r"[^/\s?#\"'<>]*)@(?=[\w\[.-])(?!(?:sha|blake|md5)\w*:)", re.I)
_URL_PAIR = re.compile(
    r"((?<=[?&#;])(?:[\w.-]*[_.-])?(?:access_token|private_token|refresh_token|id_token|token|"
    r"api_?key|apikey|key|secret|client_secret|password|passwd|pwd|auth|authorization|sig|"
    r"signature|x-amz-signature|x-amz-credential|x-amz-security-token|credential|session_?id|"
    r"sas|code)=)(?!(?:true|false|none|null|yes|no|on|off)\b|<redacted>|\*\*\*)([^&\s#\"',;)]{4,})",
    re.I)
# path segments that are tokens: a conda channel's /t/<token>/, a bot API's /bot<id>:<token>,
# what follows a chat webhook's /services/ or /webhooks/
_URL_PATH = re.compile(r"(:/{1,2}[^\s\"']*?/t/)([^/\s\"']{6,})|(/bot\d+:)([^/\s\"']+)|"
                       r"(:/{1,2}[^\s\"']*?/(?:services|webhooks?|webhookb2|IncomingWebhook|hooks)/)"
                       r"([^\s\"'?#<>]{8,})", re.I)
_CONNECT = re.compile(r"(?:(?<![\w/.:-])|(?<=:thin:)|(?<=:oci:))([A-Za-z_][\w.$-]*/)([^\s/@\"']+)"
                      r"(@(?://|[\w.-]+:\d+))")
_VALUE = (r"(?P<scheme>(?:[Bb]asic|BASIC|[Bb]earer|BEARER|[Tt]oken|TOKEN|[Dd]igest|"
          r"[Nn]egotiate|NTLM|OAuth|AWS4-HMAC-SHA256)[ \t]+)?(?P<pre>[bBrRuU]{0,2}(?=[\"']))?"
          r"(?:(?P<vq>\\{0,3}[\"'])(?P<qv>(?:(?!(?P=vq))(?:\\.|[^\n]))*)(?P<vc>(?P=vq)|$)"
          r"|(?P<tv>[(\[](?:[ \t]*[bBrRuU]{0,2}(?:'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\")"
          r"[ \t]*,?)+[ \t]*[)\]])"
          r"|(?P<brv>\{[^{}\n]*\})(?=$|[\s;,\"'])"
          r"|(?P<bv><[^<>\n]*>(?=$|[\s\"'`,;&)}\]])|[^\s\"'`,;&)}\]]*))")
# a key in any spelling: `--name`, `name`, `"name"`, `b'name'`, a label in any language; its
# separator `=`, `:`, `=>`, a full-width colon, `is:`, with spaces or no-break spaces around
_KV = re.compile(
    r"(?P<key>(?<![\w.-])(?:(?P<dash>--?)|[bBuU]?(?P<kq>\\{0,3}[\"'])?)(?P<name>[^\W\d][\w.-]*)"
    r"(?(kq)(?P=kq)))(?P<sep>[ \t\u00a0]*(?:=>|->|:=|[:=\uff1a])[ \t\u00a0]*|[ \t]+is[ \t]*:[ \t]*|"
    r"(?(dash)[ \t]+(?!-)|(?!)))(?=" + _VALUE + ")", re.M)
_SPACE = re.compile(r"[\s\"'`]")
# `NAME=value` (an env file) or `name: value` (YAML) on a line of its own, or after what a log
# puts before a line's text (`2026-12-05T10:00:01Z node3 job[41]: `, `INFO x: `, `| `): the value
# is the rest of the line, whatever characters it holds; the name may be a label of up to four
# words (`Client secret : X`, `mot de passe : X`), its separator `=`, `=>`, `:`, a full-width
# colon, a no-break space, or two spaces and more (a table's row)
_LINE = re.compile(r"([ \t]*(?:export[ \t]+|-[ \t]+)?([^\W\d][\w.-]*(?:[ \t][^\W\d][\w.-]*){0,3})"
                   r"(?:[ \t\u00a0]*(?:=>?|\uff1a)|[ \t]*:(?:[ \t\u00a0]+|(?=[^\x00-\x7f]))"
                   r"|[ \t]{2,}|\t)[ \t\u00a0]*)(?![ \t\u00a0]*[\"'])([^\r\n]+)")
# a directive and its one value, alone on a line: `requirepass X` (a plain word as the name,
# `password changed`, is a sentence and no directive); a table's row `| password | X |`
_DIRECTIVE = re.compile(r"([ \t]*([^\W\d][\w.-]*)[ \t]+)(\S+)[ \t]*$", re.M)
_TABLE = re.compile(r"([ \t]*\|[ \t]*([^\W\d][\w.-]*(?:[ \t][^\W\d][\w.-]*){0,3})[ \t]*\|"
                    r"[ \t]*)([^|\n]*?)(?=[ \t]*\|)")
# where a log's prefix ends: `]: `, `x: `, `| `
_PREFIX_ENDS = (": ", ":\t", "| ")
# a password's label in a sentence, its value after the sentence's colon at the line's end:
# `A temporary password is generated for root@localhost: X`
_SENTENCE = re.compile(r"(?i)(?:passw|passphrase|passcode|пароль|密码|kennwort|contrase|senha|"
                       r"wachtwoord)[^\W\d_]*"
                       r"((?:[ \t]+[\w@.'-]+){1,6}?[ \t]*:[ \t]+)(\S[^\n]*?)[ \t]*$", re.M)
# (the noun, not `pass`: a status word in a table's row, `job.clean  pass  ...: X`)
_SENTENCE_WORDS = ("passw", "passphrase", "passcode", "пароль", "密码", "kennwort", "contrase",
                   "senha", "wachtwoord")
_PLAIN_NAMES = frozenset({"password", "passwd", "token", "secret", "pass", "auth", "cookie",
                          "signature", "credentials", "credential", "authorization", "key"})
_QUOTED = re.compile(r"([bBrRuU]{0,2})([\"'])((?:(?!\2)(?:\\.|[^\n]))*)\2")
# a quoted name, a comma, a quoted value: argv lists and (name, value) tuples
_PAIR = re.compile(r"([\"'])-{0,2}([A-Za-z_][\w.-]*)\1[ \t]*,[ \t]*(?=[bBrRuU]{0,2}([\"'])"
                   r"((?:(?!\3)(?:\\.|[^\n]))*)\3)")
# a JSON Web Key's private members, in text that is no whole JSON document
_JWK = re.compile(r"([\"'](?:d|p|q|dp|dq|qi|k|oth)[\"'][ \t]*:[ \t]*[\"'])([^\"'\\]+)")
_HEADER = re.compile(r"(?i)\b((?:proxy-)?authorization|cookie|set-cookie|x-api-key|api-key|"
                     r"x-auth-token|private-token|x-goog-api-key|x-[\w-]*(?:token|key|secret))"
                     r"([ \t]*:[ \t]*)((?:basic|bearer|token|digest|negotiate|ntlm|oauth)[ \t]+)?"
                     r"([^\r\n\"'\\]+)")
# (words, what precedes the secret): the secret is the next word; each row is scanned for only
# in a line holding one of its words
_COMMANDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("login",), r"\b(?:docker|podman|buildah|skopeo|nerdctl|helm|oras|crane|regctl|singularity|"
                 r"apptainer|cosign|notation)\b[^\n;|&]*?\blogin\b[^\n;|&]*?(?<!\S)(?:-p|--pass)"
                 r"(?:[ \t]+|=)"),
    (("mysql", "maria"), r"\b(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mysqlcheck|"
                         r"mariadb|mariadb-dump)\b[^\n;|&]*?(?<![^\s'\"])-p"),
    (("sshpass",), r"\bsshpass\b[^\n;|&]*?(?<!\S)-p[ \t]*"),
    (("redis",), r"\bredis-cli\b[^\n;|&]*?(?<!\S)-a[ \t]+"),
    (("wandb",), r"\bwandb[ \t]+login(?:[ \t]+--?[\w-]+)*[ \t]+"),
    (("-u ", "-u\t", "-U ", "--user", "--proxy-user"),
     r"(?<!\S)(?:-u|--user|--proxy-user|-U)[ \t]+[\"']?[^\s:%\"']+[:%]"),
    (("pass:",), r"\bpass:"),
    (("mc ",), r"\bmc[ \t]+(?:alias[ \t]+set|config[ \t]+host[ \t]+add)[ \t]+\S+[ \t]+\S+[ \t]+"
               r"(?:\S+[ \t]+)?"),
    (("configure",), r"\bconfigure[ \t]+set[ \t]+[\w.]*(?:secret|token|password|key)[\w.]*[ \t]+"),
    (("htpasswd",), r"\bhtpasswd\b[^\n;|&]*?-\w*b\w*[ \t]+\S+[ \t]+\S+[ \t]+"),
)


def _after(m: re.Match[str]) -> str:
    return m.group(1) + REDACTED


_COMMAND_RULE = _hinted([
    (words, re.compile("(" + before + r")(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']+)"), _after)
    for words, before in _COMMANDS])


_MC_KEY = re.compile(r"(\bmc[ \t]+(?:alias[ \t]+set|config[ \t]+host[ \t]+add)[ \t]+\S+[ \t]+"
                     r"\S+[ \t]+)(\S+)(?=[ \t]+\S)")
_NETRC = re.compile(r"\b(machine[ \t]+\S+|default)((?:\s+(?:login|account|password|port|macdef)"
                    r"[ \t]+\S+)+)")
_NETRC_PAIR = re.compile(r"((?:account|password)[ \t]+)(\S+)")
_NETRC_LINE = re.compile(r"(?m)^([ \t]*(?:password|account)[ \t]+)(\S+)[ \t]*$")
_PGPASS = re.compile(r"(?m)(?<![^\s=\"'(\[,])((?:[A-Za-z*][\w.*-]*|\d{1,3}(?:\.\d{1,3}){3}):"
                     r"(?:\d{1,5}|\*):[^:\s\"']+:[^:\s\"']+:)((?:\\:|[^:\s\"'])+?)"
                     r"(?=[)\],:]*(?:$|[\s\"']))")
_BEARER = re.compile(r"(\b(?:[Bb]earer|BEARER|[Bb]asic|BASIC|token)[ \t]+)"
                     r"([A-Za-z0-9._~+/=-]{8,})(?=$|[\s\"',;)\]}])")
_B64_LINE = re.compile(r"(?m)^([ \t]*)([A-Za-z0-9+/]{40,}={0,2})([ \t]*)$")


def _pem(m: re.Match[str]) -> str:
    return m.group(1) + REDACTED + (m.group(4) or "")


def _mask_quoted(m: re.Match[str]) -> str:
    return m.group(1) + m.group(2) + REDACTED + m.group(2)


def _kv(s: str) -> str:
    """Each secret-named key's value masked. The key and its separator are matched, the value
    only looked at: a value that is not masked is searched for keys of its own
    (`NCCL_X=--password P`)."""
    out, pos = [], 0
    for m in _KV.finditer(s):
        if m.start() < pos:
            continue
        kind = name_kind(m.group("name"))
        if kind is None:
            continue
        if m.group("tv") is not None:  # auth=('user', 'pass'): every quoted item
            tv = m.group("tv")
            masked = _QUOTED.sub(_mask_quoted, tv) if kind == "strong" else tv
            out += [s[pos:m.end()], m.group("scheme") or "", masked]
            pos = m.end("tv")
            continue
        if m.group("brv") is not None:  # ODBC's `Pwd={...}`: what the braces hold
            if kind == "strong" and len(m.group("brv")) > 2:
                out += [s[pos:m.end()], "{", REDACTED, "}"]
                pos = m.end("brv")
            continue
        value = m.group("qv") if m.group("vq") is not None else m.group("bv")
        end = m.end("vc") if m.group("vq") is not None else m.end("bv")
        if m.group("vq") is None and kind == "strong" and secret_value(kind, value or "x"):
            # a secret's bare value ends at a space, not at `&`, `,` or `)` it may hold; after
            # a label's colon (`admin password: a whole sentence`) at the line's end; in a
            # connection string (`;Password=a b;`) at its `;`
            sep = m.group("sep")
            line_end = s.find("\n", end)
            line_end = len(s) if line_end < 0 else line_end
            if m.group("dash") is None and sep[-1:].isspace() and sep.strip() in (
                    ":", "\uff1a", "is:", "is :"):
                end = len(s[:line_end].rstrip())
            elif sep == "=" and s[m.start() - 1:m.start()] == ";":
                stop = s.find(";", end, line_end)
                end = line_end if stop < 0 else stop
            else:
                space = _SPACE.search(s, end)
                end = space.start() if space else len(s)
            value = s[m.end("bv") - len(value):end]
        if not secret_value(kind, value.strip()):
            continue
        out += [s[pos:m.end()], m.group("scheme") or "", m.group("pre") or "",
                m.group("vq") or "", REDACTED, m.group("vc") or ""]
        pos = end
    return "".join(out) + s[pos:] if out else s


def _label(label: str) -> str | None:
    """How secret the value behind a label of one to four words is (`Client secret`, `mot de
    passe`, `Root password is`)."""
    words = label.split()
    if len(words) > 1 and words[-1].lower() in ("is", "was"):
        words = words[:-1]
    return name_kind("_".join(words))


def _line(m: re.Match[str]) -> str:
    if " " in m.group(2).strip() and "=" in m.group(1)[m.end(2) - m.start(1):]:
        return m.group(0)  # words before `=` are a sentence's (`a password=X b`), no label
    value = m.group(3).rstrip()
    if not secret_value(_label(m.group(2)), value):
        return m.group(0)
    return m.group(1) + REDACTED + m.group(3)[len(value):]


def _directive(m: re.Match[str]) -> str:
    name = m.group(2)
    if name.lower() in _PLAIN_NAMES or name_kind(name) != "strong" or not secret_value(
            "strong", m.group(3)):
        return m.group(0)
    return m.group(1) + REDACTED


def _sentence(m: re.Match[str]) -> str:
    start = m.start()
    while start > 0 and (m.string[start - 1].isalpha()):
        start -= 1
    word = m.string[start:m.start(1)]
    if name_kind(word) != "strong" or not secret_value("strong", m.group(2)):
        return m.group(0)
    return m.group(0)[:m.start(2) - m.start()] + REDACTED


def _starts(s: str, begin: int, end: int) -> list[int]:
    """Where a line's text may begin: the line's start, and after a log's prefix."""
    out = [begin]
    for sep in _PREFIX_ENDS:
        i = s.find(sep, begin, end)
        while i > begin:
            if sep == "| " or s[i - 1] in ")]" or s[i - 1].isalnum() or s[i - 1] == "_":
                out.append(i + len(sep))
            i = s.find(sep, i + 1, end)
    return sorted(set(out))


_LineRule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def _at_line_starts(s: str, rules: tuple[_LineRule, ...]) -> str:
    """Each rule tried where a line's text may begin (`_starts`); the first that changes a
    line is its change (each takes a value to the line's end)."""
    out, pos, begin = [], 0, 0
    while begin <= len(s):
        end = s.find("\n", begin)
        end = len(s) if end < 0 else end
        done = False
        for at in _starts(s, begin, end):
            for pattern, repl in rules:
                m = pattern.match(s, at, end)
                if m is None:
                    continue
                new = repl(m)
                if new != m.group(0):
                    out += [s[pos:m.start()], new]
                    pos, done = m.end(), True
                    break
            if done:
                break
        begin = end + 1
    return "".join(out) + s[pos:] if out else s


def _table(m: re.Match[str]) -> str:
    value = m.group(3).strip()
    if not secret_value(_label(m.group(2)), value):
        return m.group(0)
    return m.group(1) + REDACTED


def _pairs(s: str) -> str:
    """The quoted value after a quoted secret name and a comma masked; the value is only looked
    at, so it may be the name of the next pair (`'curl', '--oauth2-bearer', 'X'`)."""
    out, pos = [], 0
    for m in _PAIR.finditer(s):
        if m.start() < pos or m.group(4).startswith("-") or not secret_value(name_kind(
                m.group(2)) or header_name_kind(m.group(2)), m.group(4).strip()):
            continue  # (an option after a command's name is the next pair's name)
        start = m.end() + s[m.end():].index(m.group(3))
        out += [s[pos:start + 1], REDACTED]
        pos = start + 1 + len(m.group(4))
    return "".join(out) + s[pos:] if out else s


def header_name_kind(name: str) -> str | None:
    """"strong" when `name` is a header that carries a credential (the header rule's names)."""
    return "strong" if _HEADER.match(name + ": x") else None


def _header(m: re.Match[str]) -> str:
    value = m.group(4).rstrip()
    if not value or value == REDACTED:
        return m.group(0)
    return m.group(1) + m.group(2) + (m.group(3) or "") + REDACTED + m.group(4)[len(value):]


def _netrc(m: re.Match[str]) -> str:
    return m.group(1) + _NETRC_PAIR.sub(lambda p: p.group(1) + REDACTED, m.group(2))


def _b64_line(m: re.Match[str]) -> str:
    v = m.group(2)
    if v.isdigit() or _a_path(v) or not (any(c.islower() for c in v) and any(c.isupper() for c in v)
                           and any(c.isdigit() for c in v)):
        return m.group(0)
    return m.group(1) + REDACTED + m.group(3)


def _bearer(m: re.Match[str]) -> str:
    """`Bearer X` and `Basic X` are credentials whatever X looks like (but a word: `Basic
    authentication`); `token X` when X looks random."""
    v = m.group(2)
    word = v.isalpha() and len(v) <= 16 and (v.islower() or v.istitle())
    if not word and not m.group(1).lower().startswith("token") or random_looking(v):
        return m.group(1) + REDACTED
    return m.group(0)


def _url_path(m: re.Match[str]) -> str:
    for lead in (1, 3, 5):
        if m.group(lead) is not None:
            return m.group(lead) + REDACTED
    return m.group(0)  # pragma: no cover (one alternative always matches)


def mask_urls(text: str) -> str:
    """https://user:pass@host/ -> https://***@host/; ?token=abc -> ?token=***."""
    return _URL_PAIR.sub(r"\1***", _URL_USERINFO.sub(r"\1***@", text))


_LINE_RULES: tuple[_LineRule, ...] = ((_LINE, _line), (_DIRECTIVE, _directive),
                                       (_TABLE, _table))

RULES: tuple[Rule, ...] = (
    (("-----begin",), lambda s: _PEM.sub(_pem, s)),
    (("kty",), lambda s: _JWK.sub(lambda m: m.group(1) + REDACTED, s)),
    (("@", "="), mask_urls),
    (("/t/", "/bot", "hook", "/services/"), lambda s: _URL_PATH.sub(_url_path, s)),
    (("@",), lambda s: _CONNECT.sub(lambda m: m.group(1) + REDACTED + m.group(3), s)),
    (("auth", "cookie", "api-key", "token", "key:", "secret"), lambda s: _HEADER.sub(_header, s)),
    (("mc ",), lambda s: _MC_KEY.sub(lambda m: m.group(1) + REDACTED, s)),
    (("",), _COMMAND_RULE),
    (("",), options.mask),  # its words are its own
    (("password", "account"), lambda s: _NETRC_LINE.sub(
        lambda m: m.group(1) + REDACTED, _NETRC.sub(_netrc, s))),
    ((":",), lambda s: _PGPASS.sub(lambda m: m.group(1) + REDACTED, s) if s.count(":") >= 4
     else s),
    (("",), _FORMAT_RULE),
    (("earer", "basic", "token"), lambda s: _BEARER.sub(_bearer, s)),
    (STEMS, _pairs),
    (_SENTENCE_WORDS, lambda s: _SENTENCE.sub(_sentence, s) if ": " in s else s),
    (STEMS, lambda s: _at_line_starts(s, _LINE_RULES)),
    (STEMS, _kv),
)


def mask(s: str) -> str:
    """Every rule of RULES, each where its words are."""
    low = s.lower()
    stems: bool | None = None  # looked for once: three rules share them
    for words, rule in RULES:
        if words is STEMS:
            if stems is None:
                stems = any(map(low.__contains__, ASCII_STEMS if low.isascii() else STEMS))
            hit = stems
        else:
            hit = any(map(low.__contains__, words))
        if hit:
            done = rule(s)
            if done != s:
                s, low = done, done.lower()
    return _B64_LINE.sub(_b64_line, s) if len(s) >= 40 else s
