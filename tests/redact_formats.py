"""Secrets as vendors issue them, and the surroundings they stand in, for the generated tests of
the redaction (tests/test_redact_vendors.py) and its benchmarks (bench/redact_*.py).

FORMATS is a table: name -> (generator, where). A generator takes a random.Random and returns
(secrets, text): the parts that must not survive (12 characters of one in a row) and the text
as it is written (a token, a URL, a JSON key file). `where` says which surroundings may hold it:
"any" (a log line, a value under any name, a URL, base64 ...), or "named" for the formats that
look like harmless values (40 hex characters are a W&B key and a git SHA; a UUID is a Heroku key
and a GPU's id): those are only secrets by where they stand, so they are planted under a name
that says so or after the command that takes one (`wandb login`).

The shapes follow each vendor's documentation of its token format (prefix, alphabet, length);
the random bodies are drawn, never copied from a real key.
"""

from __future__ import annotations

import base64
import json
import random
import shlex
import string
from collections.abc import Callable
from urllib.parse import quote

B62 = string.ascii_letters + string.digits
B64 = B62 + "+/"
B64URL = B62 + "-_"
HEX = "0123456789abcdef"
UPPER_DIGITS = string.ascii_uppercase + string.digits
BECH32 = "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"
# printable, no space, quote or backslash: what a password may hold and a shell line carries
PASSWORD = B62 + "!#$%&()*+,-./:;<=>?@[]^_{|}~"

Gen = Callable[[random.Random], tuple[list[str], str]]


def r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _token(prefix: str, alphabet: str, lo: int, hi: int | None = None, suffix: str = "") -> Gen:
    def gen(rng: random.Random) -> tuple[list[str], str]:
        t = prefix + r(rng, alphabet, rng.randint(lo, hi or lo)) + suffix
        return [t], t
    return gen


def _uuid(rng: random.Random) -> str:
    h = r(rng, HEX, 32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _b64(raw: str | bytes) -> str:
    return base64.b64encode(raw.encode() if isinstance(raw, str) else raw).decode()


def _jwt(rng: random.Random) -> tuple[list[str], str]:
    head = base64.urlsafe_b64encode(b'{"alg":"RS256","typ":"JWT"}').decode().rstrip("=")
    body = base64.urlsafe_b64encode(json.dumps(
        {"sub": r(rng, B62, 12), "iat": rng.randint(1, 2**31)}).encode()).decode().rstrip("=")
    sig = r(rng, B64URL, 43)
    return [body, sig], f"{head}.{body}.{sig}"


def _discord_bot(rng: random.Random) -> tuple[list[str], str]:
    ident = _b64(str(rng.randint(10**17, 10**18))).rstrip("=")
    t = f"{ident}.{r(rng, B64URL, 6)}.{r(rng, B64URL, 38)}"
    return [t], t


def _telegram(rng: random.Random) -> tuple[list[str], str]:
    t = f"{rng.randint(10**8, 10**10)}:AA{r(rng, B64URL, 33)}"
    return [t.split(":")[1]], t


def _url(template: str, body: Gen) -> Gen:
    def gen(rng: random.Random) -> tuple[list[str], str]:
        secrets, t = body(rng)
        return secrets, template.format(t=t, n=rng.randint(10**17, 10**18),
                                        a=r(rng, UPPER_DIGITS, 10))
    return gen


def _pem(kind: str) -> Gen:
    def gen(rng: random.Random) -> tuple[list[str], str]:
        lines = [r(rng, B64, 64) for _ in range(rng.randint(1, 4))] + [r(rng, B64, 24) + "=="]
        block = "\n".join([f"-----BEGIN {kind}-----", *lines, f"-----END {kind}-----"])
        return [x.rstrip("=") for x in lines], block
    return gen


def _service_account(rng: random.Random) -> tuple[list[str], str]:
    secrets, block = _pem("PRIVATE KEY")(rng)
    key_id = r(rng, HEX, 40)
    doc = {"type": "service_account", "project_id": "train-" + r(rng, string.digits, 6),
           "private_key_id": key_id, "private_key": block + "\n",
           "client_email": "bot@train.iam.gserviceaccount.com"}
    return [*secrets, key_id], json.dumps(doc)


def _jwk(rng: random.Random) -> tuple[list[str], str]:
    d = r(rng, B64URL, 43)
    doc = {"kty": "EC", "crv": "P-256", "x": r(rng, B64URL, 43), "y": r(rng, B64URL, 43), "d": d}
    return [d], json.dumps(doc)


def _jwk_oct(rng: random.Random) -> tuple[list[str], str]:
    k = r(rng, B64URL, 22)
    return [k], json.dumps({"kty": "oct", "alg": "HS256", "k": k})


def _neptune(rng: random.Random) -> tuple[list[str], str]:
    t = _b64(json.dumps({"api_address": "https://app.neptune.ai",
                         "api_url": "https://app.neptune.ai", "api_key": _uuid(rng)}))
    return [t], t


def _kubeconfig(rng: random.Random) -> tuple[list[str], str]:
    key = _b64("-----BEGIN RSA PRIVATE KEY-----\n" + r(rng, B64, 64) + "\n"
               "-----END RSA PRIVATE KEY-----\n")
    return [key], key


def _docker_auth(rng: random.Random) -> tuple[list[str], str]:
    pw = r(rng, B62, rng.randint(8, 20))
    auth = _b64(f"bot:{pw}")
    return [auth, pw], auth


def _password(rng: random.Random) -> tuple[list[str], str]:
    # at least one of each class, like the rules a password form enforces
    n = rng.randint(12, 40)
    chars = [rng.choice(string.ascii_lowercase), rng.choice(string.ascii_uppercase),
             rng.choice(string.digits), rng.choice("!#$%&*+-.:;<=>?@^_~")]
    chars += [rng.choice(PASSWORD) for _ in range(n - 4)]
    rng.shuffle(chars)
    t = "".join(chars)
    return [t], t


_WORDS = ["correct", "horse", "battery", "staple", "orbit", "maple", "violet", "canyon", "ember",
          "harbor", "lantern", "meadow", "pepper", "quartz", "river", "saddle", "timber"]


def _passphrase(rng: random.Random) -> tuple[list[str], str]:
    """Words a person can remember, joined, and a year: no shape gives it away."""
    t = rng.choice("-_.").join(rng.sample(_WORDS, 4)) + str(rng.randint(1990, 2030))
    return [t], t


def _random(alphabet: str, lo: int = 12, hi: int = 64) -> Gen:
    def gen(rng: random.Random) -> tuple[list[str], str]:
        t = r(rng, alphabet, rng.randint(lo, hi))
        return [t], t
    return gen


_PREFIXED: dict[str, tuple[str, str, int, int]] = {
    # name: (prefix, alphabet, min length, max length) of the random body
    "aws-access-key-id": ("AKIA", "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16, 16),
    "aws-temporary-key-id": ("ASIA", "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16, 16),
    "aws-secret-access-key": ("", B64, 40, 40),
    "aws-session-token": ("IQoJb3JpZ2luX2VjE", B64, 180, 300),
    "gcp-api-key": ("AIza", B64URL, 35, 35),
    "gcp-oauth-client-secret": ("GOCSPX-", B64URL, 28, 28),
    "gcp-access-token": ("ya29.", B64URL, 60, 150),
    "azure-storage-key": ("", B64, 86, 86),
    "azure-client-secret": ("", B62 + "_.~-", 40, 40),
    "github-ghp": ("ghp_", B62, 36, 36), "github-gho": ("gho_", B62, 36, 36),
    "github-ghu": ("ghu_", B62, 36, 36), "github-ghs": ("ghs_", B62, 36, 36),
    "github-ghr": ("ghr_", B62, 36, 36), "github-pat": ("github_pat_11", B62 + "_", 80, 80),
    "gitlab-pat": ("glpat-", B64URL, 20, 20), "gitlab-runner": ("glrt-", B64URL, 20, 27),
    "gitlab-deploy": ("gldt-", B64URL, 20, 20),
    "slack-bot": ("xoxb-1234567890-1234567890123-", B62, 24, 24),
    "slack-user": ("xoxp-1234567890-1234567890-1234567890123-", HEX, 32, 32),
    "slack-app": ("xapp-1-A0123456789-1234567890123-", HEX, 64, 64),
    "stripe-secret": ("sk_live_", B62, 24, 99), "stripe-restricted": ("rk_live_", B62, 24, 99),
    "stripe-webhook": ("whsec_", B62, 32, 32), "twilio-api-key": ("SK", HEX, 32, 32),
"mailgun": ("key-", HEX, 32, 32),
    "openai": ("sk-", B62, 48, 48), "openai-project": ("sk-proj-", B64URL, 120, 156),
    "anthropic": ("sk-ant-api03-", B64URL, 93, 93), "huggingface": ("hf_", string.ascii_letters,
                                                                     34, 34),
    "huggingface-org": ("api_org_", string.ascii_letters, 34, 34),
    "comet": ("", B62, 25, 25), "npm": ("npm_", B62, 36, 36),
    "pypi": ("pypi-AgEIcHlwaS5vcmc", B64URL, 70, 150), "docker-hub": ("dckr_pat_", B64URL, 27, 27),
    "jfrog-api-key": ("AKCp8", B62, 68, 68), "jfrog-identity": ("cmVmdGtuOjAxOjE", B62, 50, 50),
    "databricks": ("dapi", HEX, 32, 32), "heroku-v2": ("HRKU-AA", B64URL, 58, 58),
    "digitalocean": ("dop_v1_", HEX, 64, 64), "shopify": ("shpat_", HEX, 32, 32),
    "square-access": ("EAAA", B64URL, 60, 60), "square-oauth-secret": ("sq0csp-", B64URL, 43, 43),
    "atlassian": ("ATATT3xFfGF0", B64URL + "=", 170, 180), "okta": ("00", B64URL, 40, 40),
    "vault-service": ("hvs.", B64URL, 90, 100), "vault-legacy": ("s.", B62, 24, 24),
    "age-secret-key": ("AGE-SECRET-KEY-1", BECH32, 58, 58), "ngc": ("nvapi-", B64URL, 64, 64),
    "linear": ("lin_api_", B62, 40, 40), "notion": ("ntn_", B62, 46, 46),
    "grafana-service-account": ("glsa_", B62, 32, 32), "cloudflare": ("", B64URL, 40, 40),
    "newrelic": ("NRAK-", UPPER_DIGITS, 27, 27), "doppler": ("dp.st.", B62, 43, 43),
    "pulumi": ("pul-", HEX, 40, 40),
    "postman": ("PMAK-", HEX, 24, 24), "replicate": ("r8_", B62, 37, 37),
    "groq": ("gsk_", B62, 52, 52), "mistral": ("", B62, 32, 32),
    "fernet": ("", B64URL, 43, 43),
    "supabase": ("sbp_", HEX, 40, 40), "sentry-user": ("sntryu_", HEX, 64, 64),
    "wandb-local": ("local-", HEX, 40, 40), "perplexity": ("pplx-", HEX, 48, 48),
}

FORMATS: dict[str, tuple[Gen, str]] = {
    name: (_token(p, a, lo, hi, "=" if name == "fernet" else ""), "any")
    for name, (p, a, lo, hi) in _PREFIXED.items()}
FORMATS.update({
    "mailchimp": (_token("", HEX, 32, 32, "-us6"), "any"),
    "sendgrid-full": (lambda g: ([t := f"SG.{r(g, B64URL, 22)}.{r(g, B64URL, 43)}"], t), "any"),
    "terraform-cloud-full": (lambda g: ([t := f"{r(g, B62, 14)}.atlasv1.{r(g, B64URL, 67)}"], t),
                             "any"),
    "langsmith": (lambda g: ([t := f"lsv2_pt_{r(g, HEX, 32)}_{r(g, HEX, 10)}"], t), "any"),
    "airtable-pat": (lambda g: ([t := f"pat{r(g, B62, 14)}.{r(g, HEX, 64)}"], t), "any"),
    "grafana-sa-full": (lambda g: ([t := f"glsa_{r(g, B62, 32)}_{r(g, HEX, 8)}"], t), "any"),
    "asana-pat": (lambda g: ([t := f"2/{r(g, '0123456789', 16)}/{r(g, '0123456789', 16)}:"
                              f"{r(g, HEX, 32)}"], t), "any"),
    "discord-bot": (_discord_bot, "any"), "telegram-bot": (_telegram, "any"),
    "jwt": (_jwt, "any"), "jwk-ec": (_jwk, "any"), "jwk-oct": (_jwk_oct, "any"),
    "pem-private-key": (_pem("PRIVATE KEY"), "any"),
    "ssh-private-key": (_pem("OPENSSH PRIVATE KEY"), "any"),
    "gcp-service-account": (_service_account, "any"), "neptune": (_neptune, "any"),
    "kubeconfig-client-key": (_kubeconfig, "any"), "docker-auth": (_docker_auth, "any"),
    "slack-webhook": (_url("https://hooks.slack.com/services/T{a}/B{a}/{t}",
                           _token("", B62, 24, 24)), "any"),
    "discord-webhook": (_url("https://discord.com/api/webhooks/{n}/{t}",
                             _token("", B64URL, 68, 68)), "any"),
    "telegram-bot-url": (_url("https://api.telegram.org/bot{t}/sendMessage", _telegram), "any"),
    "conda-channel-token": (_url("https://conda.anaconda.org/t/{t}/nvidia",
                                 lambda g: ([t := "nv-" + _uuid(g)], t)), "any"),
    "huggingface-in-url": (_url("https://huggingface.co/{t}/resolve/main/config.json",
                                _token("hf_", string.ascii_letters, 20, 50)), "any"),
    "password": (_password, "named"), "passphrase": (_passphrase, "named"),
    "random-base62": (_random(B62), "any"), "random-base64": (_random(B64, 16), "any"),
    "random-base36": (_random(string.ascii_lowercase + string.digits, 16), "any"),
    "random-upper-digits": (_random(UPPER_DIGITS, 16), "any"),
    "random-letters": (_random(string.ascii_letters, 16), "any"),
    # look like harmless values (or, a password, like punctuated text): secrets only where
    # they stand
    "wandb": (_token("", HEX, 40, 40), "named"),
    "twilio-auth-token": (_token("", HEX, 32, 32), "named"),
    "heroku-v1": (lambda g: ([t := _uuid(g)], t), "named"),
    "random-hex": (_random(HEX, 16), "named"),
    "random-lowercase": (_random(string.ascii_lowercase, 16, 40), "named"),
})


# ------------------------------------------------------------------------------ surroundings
# name -> (wrap(rng, text) -> line(s), named): `named` surroundings say by a name or a command
# that a secret stands there; the others hold it with no name, or under a name of no meaning.

SECRET_NAMES = ["WANDB_API_KEY", "HF_TOKEN", "DB_PWD", "JENKINS_PSW", "client_secret",
                "apiKey", "x-api-key", "TWILIO_AUTH_TOKEN", "HEROKU_API_KEY", "password",
                "MY_SERVICE_CREDENTIALS", "secret", "access_token", "storage_account_key"]
PLAIN_NAMES = ["NCCL_PLANTED", "MEGATRON_ENV_EXTRA", "value", "data", "x", "CONFIG", "arg",
               "TORCH_THING", "msg", "payload"]


def _name(rng: random.Random, named: bool) -> str:
    return rng.choice(SECRET_NAMES if named else PLAIN_NAMES + SECRET_NAMES)


def _host(rng: random.Random) -> str:
    return rng.choice(["h.example", "mirror.internal:8443", "10.0.0.7", "[fd00::1]:8080"])


Wrap = Callable[[random.Random, str, bool], str]
SURROUNDINGS: dict[str, tuple[Wrap, bool]] = {
    "env": (lambda g, x, n: f"{_name(g, n)}={x}", True),
    "export": (lambda g, x, n: f"export {_name(g, n)}='{x}'", True),
    "log": (lambda g, x, n: f"[rank3]:W1204 10:00:01 train.py:88] step 10: {x} (retrying)",
            False),
    "json": (lambda g, x, n: json.dumps({"step": 1, _name(g, n): x, "ok": True}, indent=2),
             True),
    "json-value": (lambda g, x, n: json.dumps({"cmd": ["run", x], "n": 3}), False),
    "yaml": (lambda g, x, n: f"config:\n  {_name(g, n)}: {x}\n  lr: 1e-4", True),
    "python-repr": (lambda g, x, n: repr({_name(g, n): x, "n": 1}), True),
    "python-bytes": (lambda g, x, n: f"{_name(g, n)} = {x.encode()!r}", True),
    "python-auth": (lambda g, x, n: f"requests.get(url, auth=('alice', {x!r}))", True),
    "grpc-metadata": (lambda g, x, n: repr([("authorization", "Bearer " + x),
                                            ("x-request-id", "17")]), True),
    "argv-list": (lambda g, x, n: repr(["curl", "--oauth2-bearer", x, "https://h/x"]), True),
    "argv-any-flag": (lambda g, x, n: repr(["tool", "--" + _name(g, n).lower(), x]), True),
    # as `set -x` prints a command: quoted where the shell needs it
    "cmdline": (lambda g, x, n: "+ srun python pretrain_gpt.py --lr 1e-4 "
                f"--{_name(g, n)} {shlex.quote(x)}", True),
    "wandb-login": (lambda g, x, n: f"$ wandb login --relogin {shlex.quote(x)}", True),
    # percent-encoded as a URL must be, but a raw `@` as people write it
    "url-userinfo": (lambda g, x, n: "pip install -i https://alice:"
                     f"{quote(x, safe='@')}@{_host(g)}/simple pkg", True),
    "url-path": (lambda g, x, n: f"GET https://{_host(g)}/v1/{x}/status 200", False),
    "url-query": (lambda g, x, n: f"fetch https://{_host(g)}/p?{_name(g, n)}={quote(x, safe='')}"
                  "&page=2", True),
    "url-fragment": (lambda g, x, n: f"redirect to https://{_host(g)}/cb#{x}", False),
    "base64": (lambda g, x, n: "payload " + _b64(f"{_name(g, True)}={x}"), False),
    "base64-json": (lambda g, x, n: _b64(json.dumps({_name(g, True): x})), False),
    # longer than the 300 characters triage quotes: a cut before redaction ends in the secret
    "long-line": (lambda g, x, n: "[rank0]: RuntimeError: " + "y" * g.randint(200, 299)
                  + f" {_name(g, n)}={x} after", True),
    "long-line-url": (lambda g, x, n: "[rank0]: RuntimeError: " + "y" * g.randint(240, 270)
                      + f" https://alice:{quote(x, safe='@')}@{_host(g)}/simple", True),
}


def plant(rng: random.Random, fmt: str, where: str) -> tuple[list[str], str] | None:
    """(secrets, text): format `fmt` drawn and put in surrounding `where`; None where the
    format cannot stand there (a named-only format with no name; a block in a one-line form)."""
    gen, kind = FORMATS[fmt]
    wrap, named = SURROUNDINGS[where]
    secrets, x = gen(rng)
    if kind == "named" and not named:
        return None
    if "\n" in x and where not in ("json", "json-value", "python-repr", "log", "base64",
                                   "base64-json"):
        x = x.replace("\n", "\\n")
    return secrets, wrap(rng, x, kind == "named")
