"""Pass 1, the positions that tools and syntaxes define for a secret, whatever it looks like.

A password is where a tool takes it: `7z a -pX`, `zip -P X`, `ssh-keygen -N X`, `ldapsearch -w
X`, `pkcs11-tool --pin X`, `openssl enc -K X`, `keytool -storepass X`, `['sshpass', '-p', 'X']`
(an argv list), `curl -ualice:X`, `curl -b 'sid=X'`, `rabbitmqctl add_user NAME X`, SQL's
`IDENTIFIED BY 'X'` and `PASSWORD 'X'`. The same option means something else to another tool
(`ssh -p 22`, `curl -k`, `ssh -N`), so each option is known with its tool, never alone. And the
syntaxes that name a value elsewhere than before it: an XML property (`<property
name="...password" value="X"/>`, `<password>X</password>`, `<name>...secret.key</name><value>X
</value>`), a validation error that quotes the value before it names the key.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from megatron_env.redact.names import name_kind
from megatron_env.redact.shape import REDACTED

# (tool names, options, how the value follows: "next" word or "=", "glued" to the option, or
# "either"); a tool's name is matched as a word, its option as a word of its own
_TOOLS: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (("7z", "7za", "7zr", "7zz", "rar", "unrar"), ("-p",), "glued"),
    (("zip", "unzip", "zipcloak", "funzip"), ("-P", "--password"), "next"),
    (("ssh-keygen",), ("-N", "-P"), "next"),
    (("ldapsearch", "ldapmodify", "ldapadd", "ldapdelete", "ldapwhoami", "ldapcompare",
      "ldapmodrdn", "ldapexop", "ldappasswd"), ("-w",), "next"),
    (("ldappasswd",), ("-s", "-a"), "next"),
    (("pkcs11-tool", "p11tool", "softhsm2-util"), ("--pin", "--so-pin", "--puk", "--new-pin",
                                                   "--new-so-pin"), "next"),
    (("openssl",), ("-K", "-k"), "next"),
    (("keytool",), ("-storepass", "-keypass", "-srcstorepass", "-deststorepass", "-srckeypass",
                    "-destkeypass", "-new"), "next"),
    (("gpg", "gpg2"), ("--passphrase",), "next"),
    (("sqlcmd", "bcp", "osql"), ("-P",), "next"),
    (("mongo", "mongosh", "mongodump", "mongorestore", "mongoexport", "mongoimport",
      "mongostat", "mongotop", "cqlsh", "influx"), ("-p",), "next"),
    (("ipmitool",), ("-P",), "next"),
    (("snmpwalk", "snmpget", "snmpset", "snmpbulkwalk", "snmpbulkget", "snmpgetnext",
      "snmptable", "snmptrap"), ("-A", "-X"), "next"),
    (("mosquitto_pub", "mosquitto_sub", "mosquitto_rr"), ("-P", "--pw"), "next"),
    (("sshpass",), ("-p",), "either"),
    (("az",), ("-p", "--password"), "next"),
    (("rdesktop", "ncftp", "ncftpput", "ncftpget"), ("-p",), "next"),
    (("xfreerdp", "wlfreerdp"), ("/p:",), "glued"),
    (("pdftk",), ("user_pw", "owner_pw"), "next"),
)
# commands that take a secret by position: what precedes it
_POSITIONAL = (
    ("rabbitmqctl", r"\brabbitmqctl[ \t]+(?:add_user|change_password|authenticate_user)[ \t]+"
                    r"\S+[ \t]+"),
    ("net", r"\bnet[ \t]+user[ \t]+(?!/)\S+[ \t]+(?!/)"),
    ("net", r"\bnet[ \t]+use[ \t]+(?:(?:[A-Za-z]:|\*)[ \t]+)?\\\\\S+[ \t]+(?!/)"),
    ("vault", r"\bvault[ \t]+login[ \t]+(?!-)(?=\S+(?:[ \t]|$))(?![\w-]+=)"),
)
_VALUE = r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']+)"


def _tool_rule(tools: tuple[str, ...], options: tuple[str, ...], how: str
               ) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The options' pattern and the tools' name: each option's match is masked only where one
    of `tools` is named before it in the same command (no `;`, `|`, `&` or line end between),
    so that a command's every option is found (`-srcstorepass X -deststorepass Y`)."""
    tool = re.compile(r"(?<![\w.-])(?:" + "|".join(re.escape(t) for t in tools) + r")(?![\w.-])")
    opt = "|".join(re.escape(o) for o in options)
    sep = {"next": r"(?:[ \t]+|=|[\"'][ \t]*,[ \t]*)", "glued": "",
           "either": r"(?:[\"'][ \t]*,[ \t]*|[ \t]*)"}[how]
    # `'-pX Y'`: the option inside the quotes, the value to the closing quote
    return re.compile(rf"((?<![^\s'\"])(?:(['\"]))?(?:{opt}){sep})"
                      + ("" if how == "next" else "(?![ \t])")
                      + r"((?(2)(?:(?=[\"'])" + _VALUE + r"|[^\"'\n]+)|" + _VALUE + "))"), tool


def _option(m: re.Match[str]) -> str:
    """The value after a tool's option masked (its quotes kept); not a variable, a
    placeholder, a next option or openssl's `env:`/`file:` source."""
    before, value = m.group(1), m.group(3)
    if value.startswith(("-", "<", "$", "env:", "file:", "fd:")) and value != "-":
        return m.group(0)
    if value[:1] in "\"'" and len(value) >= 2:
        return before + value[0] + REDACTED + value[-1]
    return before + REDACTED


def _after_tool(tool: re.Pattern[str]) -> Callable[[re.Match[str]], str]:
    def repl(m: re.Match[str]) -> str:
        s = m.string
        start = max(s.rfind(c, 0, m.start()) for c in ";|&\n") + 1
        return _option(m) if tool.search(s, start, m.start()) else m.group(0)
    return repl


_RULES: list[tuple[tuple[str, ...], re.Pattern[str], Callable[[re.Match[str]], str]]] = []
for _tools, _options, _how in _TOOLS:
    _pattern, _named = _tool_rule(_tools, _options, _how)
    _RULES.append((_tools, _pattern, _after_tool(_named)))
_RULES += [((tool,), re.compile("(" + p + ")()(" + _VALUE + ")"), _option)
           for tool, p in _POSITIONAL]

# curl's user:password glued to -u; its cookies: each value of `name=value; ...`
_CURL_USER = re.compile(r"(\bcurl\b[^\n;|&]*?(?<![^\s'\"])-u[^\s:'\"]+:)([^\s'\"]+)")
_CURL_COOKIE = re.compile(r"(\bcurl\b[^\n;|&]*?(?<!\S)(?:-b|--cookie)(?:[ \t]+|=))"
                          r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']+)")
_COOKIE_PAIR = re.compile(r"(=)([^;\"']+)")
# `-u 'user:a password with spaces'` (curl, smbclient's `%`): the password to the closing quote
_USER_QUOTED = re.compile(r"((?<!\S)(?:-u|--user|--proxy-user|-U)[ \t]+([\"'])[^\s:%\"']+[:%])"
                          r"([^\"'\n]*)(?=\2)")
# SQL: IDENTIFIED BY 'X', IDENTIFIED WITH plugin BY 'X', PASSWORD 'X', PASSWORD('X')
# (Oracle's IDENTIFIED BY takes a bare word; the PASSWORD forms a string literal)
_SQL = re.compile(r"(?i)(\bIDENTIFIED(?:[ \t]+WITH[ \t]+\w+)?[ \t]+BY(?:[ \t]+PASSWORD)?[ \t]+)"
                  r"('(?:''|[^'\n])*'|\"[^\"\n]*\"|[^\s;,)\"']+)|"
                  r"(\b(?:WITH|LOGIN|ENCRYPTED|UNENCRYPTED|ROLE|USER)[ \t]+[^\n;]*?"
                  r"\bPASSWORD[ \t]*(?:=[ \t]*)?\(?[ \t]*)('(?:''|[^'\n])*'|\"[^\"\n]*\")")
# XML: an element whose name/key attribute is a secret's name, and its value attribute
_XML_ATTR = re.compile(r"(<[\w:.-]+[^<>]*?\b(?:name|key|id)[ \t]*=[ \t]*([\"'])([^\"'<>]*)\2"
                       r"[^<>]*?\bvalue[ \t]*=[ \t]*([\"']))([^\"'\n]*)(?=\4)")
_XML_ELEMENT = re.compile(r"(<([\w:.-]+)(?:[ \t][^<>]*)?>)([^<>\n]+)(?=</\2>)")
_XML_NAME_VALUE = re.compile(r"(<name>[ \t]*([^<>\n]+?)[ \t]*</name>\s*<value>)([^<>\n]+)"
                             r"(?=</value>)")
# a value quoted before the key it was given for: `'X' is not a valid value for 'password'`,
# jsonschema's `'X' is too short ... schema['properties']['password']`
_BEFORE_KEY = re.compile(r"([\"'])((?:(?!\1)[^\n])+)\1(?=[ \t]+(?:is|was|does|should|must|"
                         r"cannot|can't)\b)")
_QUOTED_NAME = re.compile(r"[\"']([^\"'\n]{1,64})[\"']")


def _secret_name(name: str) -> bool:
    return name_kind(name.strip()) == "strong"


def _cookie(m: re.Match[str]) -> str:
    return m.group(1) + _COOKIE_PAIR.sub(lambda p: p.group(1) + REDACTED, m.group(2)) \
        if "=" in m.group(2) else m.group(1) + REDACTED


def _sql(m: re.Match[str]) -> str:
    before, value = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3),
                                                                              m.group(4))
    return before + (value[0] + REDACTED + value[-1] if value[:1] in "'\"" else REDACTED)


def _xml_attr(m: re.Match[str]) -> str:
    return m.group(1) + REDACTED if _secret_name(m.group(3)) and m.group(5) else m.group(0)


def _xml_element(m: re.Match[str]) -> str:
    value = m.group(3).strip()
    if not value or not _secret_name(m.group(2)) or value == REDACTED:
        return m.group(0)
    return m.group(1) + REDACTED


def _xml_name_value(m: re.Match[str]) -> str:
    return m.group(1) + REDACTED if _secret_name(m.group(2)) else m.group(0)


def _before_key(m: re.Match[str]) -> str:
    line_end = m.string.find("\n", m.end())
    rest = m.string[m.end():None if line_end < 0 else line_end]
    if any(map(_secret_name, _QUOTED_NAME.findall(rest))):
        return m.group(1) + REDACTED + m.group(1)
    return m.group(0)


_VERBS = (" is ", " was ", " does ", " should ", " must ", " can")
# (what a line must hold, the rule): curl's, SQL's, a quoted user:password, XML's, a value
# quoted before its key; each a cheap test of the line (lower-cased) first
_OTHER: tuple[tuple[Callable[[str, str], bool], re.Pattern[str], Callable[[re.Match[str]], str]],
              ...] = (
    (lambda s, low: "curl" in low, _CURL_USER, lambda m: m.group(1) + REDACTED),
    (lambda s, low: "curl" in low, _CURL_COOKIE, _cookie),
    (lambda s, low: "-u" in low, _USER_QUOTED,
     lambda m: m.group(1) + REDACTED if m.group(3) else m.group(0)),
    (lambda s, low: "identified" in low or "password" in low, _SQL, _sql),
    (lambda s, low: "<" in s and "value" in low, _XML_ATTR, _xml_attr),
    (lambda s, low: "</" in s, _XML_ELEMENT, _xml_element),
    (lambda s, low: "<name>" in low, _XML_NAME_VALUE, _xml_name_value),
    (lambda s, low: ("'" in s or '"' in s) and any(map(low.__contains__, _VERBS)), _BEFORE_KEY,
     _before_key),
)
# a tool's name as a word of the line; the rules of the tools a line names
_NAME = re.compile(r"[\w.-]+")
_BY_TOOL: dict[str, list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]]] = {}
for _words, _pattern, _repl in _RULES:
    for _tool in _words:
        _BY_TOOL.setdefault(_tool, []).append((_pattern, _repl))
_TOOL_NAMES = frozenset(_BY_TOOL)


def mask(s: str, low: str | None = None) -> str:
    """Every rule of this module, each where its words are (most lines hold none): a tool's
    options only in a line that names the tool and holds an option."""
    low = s.lower() if low is None else low
    if "-" in s and (" -" in s or "'-" in s or '"-' in s) or "/p:" in s or "_pw" in s or (
            "rabbitmqctl" in s or "net " in s or "vault " in s):
        tools = _TOOL_NAMES.intersection(_NAME.findall(s))
        for tool in sorted(tools):
            for pattern, repl in _BY_TOOL[tool]:
                s = pattern.sub(repl, s)
        if tools:
            low = s.lower()
    for holds, pattern, repl in _OTHER:
        if holds(s, low):
            done = pattern.sub(repl, s)
            if done != s:
                s, low = done, done.lower()
    return s
