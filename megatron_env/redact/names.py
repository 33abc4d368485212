"""How secret the value behind a name is: `--api-key`, `DB_PWD`, `"client_secret"`.

A name only ever adds masking: whatever its name, a value that looks random is masked by the
shape pass (megatron_env.redact.shape), and a number, a boolean or a path is never masked for
its name (a JSON summary's `"pass": 3`, a `"signature"` file the tool wrote).

Names come in two strengths. Strong (the last word is password, passwd, pwd, psw, secret,
token, credential(s), auth, bearer, cookie, signature, ... or the name ends in api/access/
private/secret/account/client + key): every value is masked except the plainly harmless (`true`,
`$VAR`, `<...>`, a path, empty). Weak (any other `*_key`, `*_id` of a strong name,
`session_id`): masked when the value looks random. A name whose last word says what the value is
about rather than the secret itself (`_file`, `_path`, `_type`, `_length`, `_policy` ...) or
whose first word is a switch (`use_`, `no_`, `max_` ...) is no secret name:
`--moe-token-dispatcher-type alltoall`, `TOKENIZERS_PARALLELISM=false`, `--password-file /run/pw`
stay. A dotted name is judged by its last part: `spring.datasource.password` is a secret name,
the file name `my_password_profile.toml` is not.
"""

from __future__ import annotations

import functools
import re

_STRONG_LAST = frozenset({"pass", "creds", "auth", "authorization", "cookie", "signature", "sig",
                          "sas", "jwt", "pat", "passin", "passout", "pwd", "psw", "pw", "passwd",
                          "bearer", "oauth", "passcode", "privkey", "seckey",
                          "apitoken", "webhook", "dsn", "psk", "sshpass", "requirepass",
                          "masterauth", "passphrase", "storepass", "keypass",
                          # a password's label in other languages
                          "passwort", "kennwort", "contraseña", "contrasena", "пароль", "密码",
                          "密碼", "口令", "パスワード", "비밀번호", "senha", "wachtwoord", "hasło",
                          "haslo", "parola", "şifre", "sifre", "lösenord", "losenord",
                          "salasana", "adgangskode", "passord", "heslo", "jelszó", "κωδικός",
                          "mot_de_passe"})
_STRONG_ENDS = ("token", "apikey", "accesskey", "secretkey", "privatekey", "authkey",
                "credential", "credentials", "password", "secret")
_STRONG_PAIRS = frozenset({"api", "access", "private", "secret", "account", "client", "auth",
                           "signing", "encryption", "master", "storage", "subscription",
                           "app", "consumer", "shared", "deploy", "license", "sas", "admin",
                           "service", "user", "webhook", "bot", "integration", "ingest",
                           "write", "read", "project", "personal", "crypt", "hmac", "aes",
                           "fernet", "age", "sk", "jwt", "session"})
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
# the previous working directory a shell exports, not a password (`PWD` is ODBC's password
# too: the shell's is a path, and a path is never masked)
_NOT_SECRET_NAMES = frozenset({"oldpwd"})
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_RUNS = re.compile(r"[^\W_]+")


# a substring of every secret name (tests/test_redact.py holds them in step): a line with none
# of them holds no secret-named key, and the key rules are not scanned for
STEMS = ("pass", "pw", "psw", "secret", "token", "key", "auth", "cred", "sig", "cookie", "sas",
         "jwt", "_pat", "-pat", "sid", "session", "bearer", "dsn", "webhook", "psk", "kennwort",
         "contrase", "senha", "wachtwoord", "hasło", "haslo", "parola", "şifre", "sifre",
         "lösenord", "losenord", "salasana", "adgangskode", "heslo", "jelsz", "пароль", "密码",
         "密碼", "口令", "パスワード", "비밀번호", "κωδικός")
# the stems a line of ASCII alone may hold
ASCII_STEMS = tuple(s for s in STEMS if s.isascii())


@functools.lru_cache(maxsize=4096)
def name_kind(name: str) -> str | None:
    """"strong", "weak" or None: how secret the value behind this name is (module docstring)."""
    if "." in name.strip("."):  # `fs.s3a.secret.key`: the last part, with its word before a key
        dotted = name.rstrip(".").rsplit(".", 2)
        name = "_".join(dotted[-2:]) if dotted[-1].lower() in ("key", "id") else dotted[-1]
    if name.strip("-_").lower() in _NOT_SECRET_NAMES:
        return None
    parts = [p.lower() for run in _RUNS.findall(name)
             for p in (_WORDS.findall(run) if run.isascii() else [run])]
    if "_".join(parts) in _STRONG_LAST:  # a label of several words: `mot de passe`
        return "strong"
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
    if last == "id" and before == "secret":  # Vault's AppRole secret_id, a "Secret ID" label
        return "strong"
    if last == "id" and (before in ("key", "session") or name_kind(
            "_".join(parts[:-1])) == "strong"):
        return "weak"
    return "weak" if last in ("sessionid", "sid") else None


def is_secret_name(name: str) -> bool:
    return name_kind(name) is not None
