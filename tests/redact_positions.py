"""Credentials by where they are given, and generated names that are no credential, for the
redaction's generated tests (tests/test_redact_positions.py) and its benchmark
(bench/redact_positions.py).

A POSITION is a place a credential is given in some syntax: a tool's own password option
(`7z a -pX`, `ldapsearch -w X`), a label (`Passwort: X`, `'password' => 'X'`), a value on the
line after its label (a YAML block scalar, a signature after a signing debug line), a config or
connection syntax (`<property name="...password" value="X"/>`, `Pwd={X}`), a repr (`{b'password':
b'X'}`). Its template holds `{v}` where the value goes raw and `{q}` where it goes shell-quoted
when it holds a space. A VALUE KIND is what stands there: a word, a sentence, digits, Cyrillic,
hex, a random string, a low-entropy repeated motif. A CARRIER is how the text reaches the
redaction: alone, after a log line's prefix, streamed line by line (`redact.Lines`), inside a JSON
document. A case leaks when any part of its value (a word of 4 characters or more, or any 6 in a
row of one) is in the output and was not already in the text around it.

HARMLESS is a table of generated names tools print (pods, run URLs, store hashes, digests, temp
directories ...), each a grammar drawn by a seed, in the places they are printed.

The split is fixed before any tuning (`split`): a position, a value kind and a harmless family's
seed each fall in "tune" or "held" by a hash of their name/number; the redaction is only ever
fixed on the tune side, and the held side is the figure reported.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import random
import shlex
import string
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

B62 = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
B32 = "abcdefghijklmnopqrstuvwxyz234567"
NIX32 = "0123456789abcdfghijklmnpqrsvwxyz"


def split(name: str) -> str:
    """"tune" or "held", by a hash of `name`: about 55% tune. Fixed: never chosen by result."""
    return "tune" if hashlib.sha256(name.encode()).digest()[0] < 141 else "held"


def r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


# ----------------------------------------------------------------------------- value kinds

_WORDS = ["sunflower", "marigold", "lighthouse", "peppermint", "butterscotch", "dragonfly",
          "waterfall", "moonbeam", "tangerine", "snowdrift", "blueberry", "cornflower",
          "thunderbolt", "honeycomb", "riverbank", "starlight", "wildfire", "nightingale"]
_CYRILLIC = ["солнышко", "ромашка", "берёзка", "медвежонок", "снежинка", "колокольчик",
             "черёмуха", "земляника"]


def _word(rng: random.Random) -> str:
    return rng.choice(_WORDS) + rng.choice(["", str(rng.randint(1, 99)), "!"])


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.sample(_WORDS, rng.randint(3, 4)))


def _digits(rng: random.Random) -> str:
    return str(rng.randint(1, 9)) + r(rng, string.digits, rng.randint(5, 9))


def _cyrillic(rng: random.Random) -> str:
    return rng.choice(_CYRILLIC) + rng.choice(["", str(rng.randint(10, 99))])


def _hex(rng: random.Random) -> str:
    return r(rng, HEX, rng.choice([16, 24, 32, 40, 64]))


def _random(rng: random.Random) -> str:
    return r(rng, B62, 1) + r(rng, B62 + "!#%^*_+-.~", rng.randint(11, 23))


def _motif(rng: random.Random) -> str:
    m = r(rng, string.ascii_letters, rng.randint(1, 2)) + r(rng, string.digits + "!#", 1)
    return (m * 8)[:rng.randint(12, 16)]


# name -> (generator, holds a space)
VALUE_KINDS: dict[str, tuple[Callable[[random.Random], str], bool]] = {
    "word": (_word, False), "sentence": (_sentence, True), "digits": (_digits, False),
    "cyrillic": (_cyrillic, False), "hex": (_hex, False), "random": (_random, False),
    "motif": (_motif, False)}


# ----------------------------------------------------------------------------- positions

@dataclass(frozen=True)
class Position:
    """A place a credential is given. `template` holds {v} (raw) or {q} (shell-quoted when it
    holds a space); `spaces`: whether a value with spaces fits it (quoted or to the line's end);
    `kinds`: the value kinds it takes (None: all that fit); `lines`: several lines (a config
    file, a value on the line after its label)."""
    family: str
    name: str
    template: str
    spaces: bool = False
    kinds: tuple[str, ...] | None = None
    encode: str = ""  # how the value is written: "" raw, "url" percent-encoded, "b64"

    @property
    def lines(self) -> bool:
        return "\n" in self.template


def _p(family: str, name: str, template: str, **kw: object) -> Position:
    spaces = "{q}" in template or bool(kw.pop("spaces", False))
    return Position(family, name, template, spaces, **kw)  # type: ignore[arg-type]


POSITIONS: tuple[Position, ...] = (
    # a tool's own password option
    _p("tool", "7z-a", "7z a -p{v} -mhe=on backup.7z data/"),
    _p("tool", "7z-x", "7z x -p{v} -o./out archive.7z"),
    _p("tool", "7za-quoted", "7za a '-p{v}' out.7z ckpt/", spaces=True),
    _p("tool", "zip-P", "zip -P {q} -r ckpt.zip checkpoints/"),
    _p("tool", "unzip-P", "unzip -o -P {q} weights.zip -d /data"),
    _p("tool", "rar-a", "rar a -p{v} -r logs.rar logs/"),
    _p("tool", "unrar-x", "unrar x -p{v} dataset.rar"),
    _p("tool", "ssh-keygen-N", "ssh-keygen -t ed25519 -N {q} -f ~/.ssh/id_deploy -C ci"),
    _p("tool", "ssh-keygen-P", "ssh-keygen -p -f ~/.ssh/id_rsa -P {q} -N ''"),
    _p("tool", "ldapsearch-w", 'ldapsearch -x -H ldap://ldap.corp.example -D '
                               '"cn=admin,dc=corp,dc=example" -w {q} -b "dc=corp,dc=example"'),
    _p("tool", "ldapmodify-w", "ldapmodify -x -D cn=admin,dc=example,dc=org -w {q} -f add.ldif"),
    _p("tool", "ldapwhoami-w", "ldapwhoami -H ldaps://ds01 -D uid=svc,ou=people,dc=lab -w {q}"),
    _p("tool", "pkcs11-pin", "pkcs11-tool --module /usr/lib/softhsm/libsofthsm2.so --login "
                             "--pin {q} --list-objects"),
    _p("tool", "pkcs11-so-pin", "pkcs11-tool --init-token --slot 0 --so-pin {q} --label hsm"),
    _p("tool", "sshpass-argv", "Popen(['sshpass', '-p', '{v}', 'ssh', 'node07', 'nvidia-smi'])",
       spaces=True),
    _p("tool", "sshpass-argv-json", '"args": ["sshpass", "-p", "{v}", "rsync", "-a", "a/", '
                                    '"node2:/b/"]', spaces=True),
    _p("tool", "openssl-K", "openssl enc -aes-256-cbc -K {v} -iv 00112233445566778899aabbccddeeff "
                            "-in a.bin -out a.enc", kinds=("hex", "digits", "random", "word")),
    _p("tool", "openssl-k", "openssl enc -aes-256-cbc -salt -k {q} -in data.tar -out data.enc"),
    _p("tool", "openssl-pass", "openssl enc -d -aes256 -pbkdf2 -pass pass:{v} -in s.enc"),
    _p("tool", "openssl-passout", "openssl pkcs12 -export -in c.pem -out c.p12 -passout pass:{v}"),
    _p("tool", "curl-u-glued", "curl -sS -ualice:{v} https://api.example.com/v1/jobs"),
    _p("tool", "curl-u-quoted", 'curl -u "alice:{v}" https://artifacts.example.com/x.tar',
       spaces=True),
    _p("tool", "curl-user", "curl --user 'bot:{v}' -X POST https://ci.example.com/hook",
       spaces=True),
    _p("tool", "curl-b", "curl -b 'session={v}' https://grafana.example.com/api/search",
       spaces=True),
    _p("tool", "curl-cookie", 'curl --cookie "sid={v}; theme=dark" https://lab.example.com/',
       spaces=True),
    _p("tool", "gcloud-set-env", "gcloud run deploy api --image gcr.io/p/api:1 --set-env-vars "
                                 "MODE=prod,DB_PASS={v} --region us-east1"),
    _p("tool", "gcloud-fn-env", 'gcloud functions deploy fn --runtime python312 '
                                '--set-env-vars="API_SECRET={v}"', spaces=True),
    _p("tool", "az-settings", "az webapp config appsettings set -g rg -n app --settings "
                              "DB_PASSWORD={q}"),
    _p("tool", "az-env-vars", "az containerapp create -n app -g rg --env-vars "
                              "SECRET_KEY={v} LOG_LEVEL=info"),
    _p("tool", "heroku-config", "heroku config:set DATABASE_PASSWORD={q} -a trainer"),
    _p("tool", "docker-env", "docker run --rm --env DB_PASSWORD={q} nvcr.io/nvidia/pytorch:25.01"),
    _p("tool", "fly-secrets", "fly secrets set API_TOKEN={v} --app infer"),
    _p("tool", "sql-identified", "CREATE USER 'app'@'%' IDENTIFIED BY '{v}';", spaces=True),
    _p("tool", "sql-alter-identified", 'ALTER USER trainer IDENTIFIED BY "{v}";', spaces=True),
    _p("tool", "sql-grant-identified", "GRANT ALL ON db.* TO 'u'@'localhost' IDENTIFIED BY '{v}'",
       spaces=True),
    _p("tool", "sql-with-password", "CREATE ROLE loader WITH LOGIN PASSWORD '{v}';",
       spaces=True),
    _p("tool", "keytool-storepass", "keytool -importcert -keystore t.jks -storepass {q} "
                                    "-file ca.crt -noprompt"),
    _p("tool", "keytool-keypass", "keytool -genkeypair -alias a -keypass {q} -keystore k.jks"),
    _p("tool", "gpg-passphrase", "gpg --batch --pinentry-mode loopback --passphrase {q} -d k.gpg"),
    _p("tool", "sqlcmd-P", "sqlcmd -S tcp:db01,1433 -U sa -P {q} -Q 'SELECT 1'"),
    _p("tool", "mongosh-p", "mongosh mongodb://db01:27017/admin -u root -p {q}"),
    _p("tool", "ipmitool-P", "ipmitool -I lanplus -H bmc07 -U admin -P {v} chassis power status"),
    _p("tool", "snmpwalk-A", "snmpwalk -v3 -l authPriv -u mon -a SHA -A {v} -x AES -X {v} sw01"),
    _p("tool", "mosquitto-P", "mosquitto_pub -h mq -u sensor -P {q} -t t/1 -m up"),
    _p("tool", "rabbitmqctl-add", "rabbitmqctl add_user trainer {q}"),
    _p("tool", "rabbitmqctl-change", "rabbitmqctl change_password guest {q}"),
    _p("tool", "kubectl-literal", "kubectl create secret generic db --from-literal=password={v}"),
    _p("tool", "sshpass-glued", "sshpass -p{v} scp ckpt.pt node3:/data/"),
    _p("tool", "svn-password", "svn checkout --username ci --password {q} https://svn.example/r"),
    _p("tool", "smbclient-U", "smbclient //nas/share -U alice%{v} -c ls"),
    _p("tool", "net-user", "net user trainer {v} /add"),
    _p("tool", "sshpass-env", "SSHPASS={q} sshpass -e ssh node4"),
    # labels and separators
    _p("label", "de-passwort", "Passwort: {v}", spaces=True),
    _p("label", "de-kennwort", "Kennwort = {v}", spaces=True),
    _p("label", "fr-mot-de-passe", "mot de passe : {v}", spaces=True),
    _p("label", "es-contrasena", "contraseña: {v}", spaces=True),
    _p("label", "ru-parol", "пароль: {v}", spaces=True),
    _p("label", "zh-mima", "密码：{v}", spaces=True),
    _p("label", "ja-password", "パスワード: {v}", spaces=True),
    _p("label", "pt-senha", "senha = {v}", spaces=True),
    _p("label", "nl-wachtwoord", "wachtwoord: {v}", spaces=True),
    _p("label", "pl-haslo", "hasło: {v}", spaces=True),
    _p("label", "php-arrow", "'password' => '{v}',", spaces=True),
    _p("label", "ruby-arrow", ':password => "{v}",', spaces=True),
    _p("label", "perl-arrow", "password => {v}"),
    _p("label", "table-row", "  password           {v}"),
    _p("label", "table-pipe", "| db_password | {v} |", spaces=True),
    _p("label", "nbsp-eq", "PASSWORD=\u00a0{v}"),
    _p("label", "nbsp-colon", "api_key:\u00a0{v}"),
    _p("label", "colon-sentence", "INFO bootstrap: admin password: {v}", spaces=True),
    _p("label", "mysql-temp", "[Note] A temporary password is generated for root@localhost: {v}",
       spaces=True),
    _p("label", "quoted-spaces", 'db.connect(host="db", password="{v}", port=5432)', spaces=True),
    _p("label", "quoted-single", "--password '{v}' --user admin", spaces=True),
    _p("label", "secret-id", "Secret ID: {v}", spaces=True),
    _p("label", "client-secret-label", "Client secret   : {v}", spaces=True),
    _p("label", "root-password-label", "Root password is: {v}", spaces=True),
    _p("label", "weak-session", "session_id={v}", kinds=("motif", "random", "hex")),
    _p("label", "weak-key", "ROUTER_KEY={v}", kinds=("motif", "random")),
    _p("label", "sshpass-var", "export SSHPASS={q}"),
    _p("label", "psk", 'psk="{v}"', spaces=True),
    _p("label", "requirepass", "requirepass {v}"),
    _p("label", "masterauth", "masterauth {v}"),
    # over two lines: the value on a line after its label
    _p("multi", "decoded", "$ kubectl get secret db -o jsonpath='{{.data.password}}' | "
                           "base64 -d\n{v}", spaces=True),
    _p("multi", "decoded-echo", "+ echo $DB_SECRET_B64 | base64 --decode\n{v}", spaces=True),
    _p("multi", "botocore-signature", "DEBUG:botocore.auth:StringToSign:\nAWS4-HMAC-SHA256\n"
                                      "DEBUG:botocore.auth:Signature:\n{v}",
       kinds=("hex",)),
    _p("multi", "signature-label", "2026-12-05 10:00:01,120 DEBUG signing request\nSignature:\n{v}",
       kinds=("hex", "random")),
    _p("multi", "yaml-block", "db:\n  password: |\n    {v}\n  host: db01", spaces=True),
    _p("multi", "yaml-folded", "auth:\n  client_secret: >-\n    {v}\n", spaces=True),
    _p("multi", "label-alone", "Password:\n{v}", spaces=True),
    _p("multi", "jenkins-initial", "Please use the following password to proceed to "
                                   "installation:\n\n{v}\n", spaces=True),
    _p("multi", "generated-secret", "Generated secret for client 'trainer':\n  {v}", spaces=True),
    _p("multi", "pydantic", "1 validation error for Settings\npassword\n  String should have at "
                            "least 20 characters [type=string_too_short, input_value='{v}', "
                            "input_type=str]", spaces=True),
    # config and connection syntaxes
    _p("config", "toml-multi", 'password = """\n{v}\n"""', spaces=True),
    _p("config", "toml-literal-multi", "token = '''\n{v}'''", spaces=True),
    _p("config", "toml-basic", 'password = "{v}"', spaces=True),
    _p("config", "xml-property", '<property name="javax.jdo.option.ConnectionPassword" '
                                 'value="{v}"/>', spaces=True),
    _p("config", "xml-add", '<add key="DbPassword" value="{v}" />', spaces=True),
    _p("config", "xml-hadoop", "<property>\n  <name>fs.s3a.secret.key</name>\n  <value>{v}</value>"
                               "\n</property>", spaces=True),
    _p("config", "xml-element", "<server><id>nexus</id><password>{v}</password></server>",
       spaces=True),
    _p("config", "odbc-ini", "[train]\nDriver=PostgreSQL Unicode\nServername=db01\nUID=loader\n"
                             "PWD={v}", spaces=True),
    _p("config", "odbc-braces", "Driver={{ODBC Driver 18 for SQL Server}};Server=tcp:db,1433;"
                                "Uid=sa;Pwd={{{v}}};Encrypt=yes", spaces=True),
    _p("config", "ado-password", "Server=db01;Database=train;User Id=sa;Password={v};",
       spaces=True),
    _p("config", "oracle-jdbc", "url=jdbc:oracle:thin:scott/{v}@db01:1521/ORCLPDB1"),
    _p("config", "oracle-jdbc-log", "connecting to jdbc:oracle:thin:loader/{v}@//db01:1521/svc"),
    _p("config", "url-encoded-dsn", "https://app.example.com/connect?next=%2Fhome&dsn={e}&x=1",
       encode="url-dsn"),
    _p("config", "npmrc-password", "//npm.example.com/:username=ci\n"
                                   "//npm.example.com/:_password={b}", encode="b64"),
    _p("config", "npmrc-auth", "registry=https://npm.example.com/\n_auth={b}", encode="b64auth"),
    _p("config", "pypirc", "[distutils]\nindex-servers = pypi\n\n[pypi]\nusername = __token__\n"
                           "password = {v}", spaces=True),
    _p("config", "pip-conf-continuation", "[global]\nextra-index-url =\n    https://pypi.org/simple"
                                          "\n    https://ci:{v}@pkgs.example.com/simple"),
    _p("config", "k8s-secret-data", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\n"
                                    "type: Opaque\ndata:\n  settings.ini: {b}", encode="b64"),
    _p("config", "k8s-secret-string", "kind: Secret\ntype: Opaque\nstringData:\n"
                                      "  app.conf: {v}", spaces=True),
    _p("config", "properties", "spring.datasource.password={v}", spaces=True),
    _p("config", "my-cnf", "[client]\nuser=root\npassword=\"{v}\"", spaces=True),
    _p("config", "rclone", "[s3]\ntype = s3\npass = {v}", spaces=True),
    _p("config", "libpq", "psql 'host=db01 user=loader password={v} dbname=train'"),
    # reprs
    _p("repr", "bytes-dict", "{{b'user': b'loader', b'password': b'{v}'}}", spaces=True),
    _p("repr", "bytes-dict-dq", '{{b"passwd": b"{v}", b"host": b"db01"}}', spaces=True),
    _p("repr", "value-before-key", "ValueError: '{v}' is not a valid value for 'password'",
       spaces=True),
    _p("repr", "jsonschema", "ValidationError: '{v}' is too short. Failed validating "
                             "'minLength' in schema['properties']['password']", spaces=True),
    _p("repr", "json-number-password", '{{"user": "loader", "password": {v}}}',
       kinds=("digits",)),
    _p("repr", "json-number-passcode", '{{"passcode": {v}, "ok": true}}', kinds=("digits",)),
    _p("repr", "json-number-passwd", '{{"passwd": {v}}}', kinds=("digits",)),
    _p("repr", "namedtuple", "Credentials(username='loader', password='{v}')", spaces=True),
    _p("repr", "dict-repr", "{{'host': 'db01', 'db_password': '{v}', 'port': 5432}}",
       spaces=True),
)


def _fill(pos: Position, value: str) -> str:
    enc = ""
    if pos.encode == "url-dsn":
        enc = quote(f"postgresql://loader:{value}@db01:5432/train", safe="")
    b = ""
    if pos.encode == "b64":
        b = base64.b64encode(value.encode()).decode()
    elif pos.encode == "b64auth":
        b = base64.b64encode(f"ci:{value}".encode()).decode()
    q = shlex.quote(value) if " " in value else value
    return pos.template.format(v=value, q=q, e=enc, b=b)


def secret_forms(pos: Position, value: str) -> list[str]:
    """The forms of `value` that must not come out: as written and as encoded."""
    forms = [value]
    if pos.encode == "url-dsn":
        forms.append(quote(value, safe=""))
    if pos.encode in ("b64", "b64auth"):
        forms.append(_fill(pos, value).rsplit("=", 1)[-1].rsplit(": ", 1)[-1])
    return forms


def fits(pos: Position, kind: str) -> bool:
    if pos.kinds is not None:
        return kind in pos.kinds
    return pos.spaces or not VALUE_KINDS[kind][1]


# ----------------------------------------------------------------------------- carriers

CARRIERS = ("alone", "log", "stream", "json")


def carry(carrier: str, text: str, redact_text: Callable[[str], str],
          lines: Callable[[], Callable[[str], str]]) -> str:
    """`text` through the redaction the way `carrier` brings it."""
    if carrier == "alone":
        return redact_text(text)
    if carrier == "log":
        return redact_text("2026-12-05T10:00:01Z node03 job[4121]: " + text)
    if carrier == "stream":
        streamed = lines()
        return "".join(streamed(x) for x in
                       f"step 41 loss 2.31\n{text}\nstep 42 loss 2.30\n".splitlines(True))
    return redact_text(json.dumps({"step": 3, "log": text}))


def leaked(out: str, text: str, forms: list[str]) -> list[str]:
    """Parts of the value (forms) in `out` that were not in the text around the value."""
    around = text
    for f in sorted(forms, key=len, reverse=True):
        around = around.replace(f, " ")
    out_plain = out + json.dumps(out)  # a JSON carrier escapes Cyrillic and quotes
    with contextlib.suppress(ValueError, AttributeError):
        out_plain += json.loads(out).get("log", "") if out.lstrip().startswith("{") else ""
    found = []
    for f in forms:
        for word in f.split():
            n = min(6, len(word))
            if len(word) < 4:
                continue
            for i in range(len(word) - n + 1):
                w = word[i:i + n]
                if w in out_plain and w not in around:
                    found.append(w)
                    break
    return found


@dataclass(frozen=True)
class Case:
    position: Position
    kind: str
    carrier: str
    value: str
    text: str

    @property
    def side(self) -> str:
        sides = {split("position:" + self.position.name), split("kind:" + self.kind)}
        return "tune" if sides == {"tune"} else "held"


def grid(side: str, seed: int = 43, draws: int = 1) -> list[Case]:
    """Every position x value kind x carrier of `side` ("tune": tune positions with tune value
    kinds; "held": the rest), `draws` values each."""
    rng = random.Random(f"{seed}:{side}")
    cases = []
    for pos in POSITIONS:
        for kind in VALUE_KINDS:
            if not fits(pos, kind):
                continue
            for carrier in CARRIERS:
                for _ in range(draws):
                    value = VALUE_KINDS[kind][0](rng)
                    c = Case(pos, kind, carrier, value, _fill(pos, value))
                    if c.side == side:
                        cases.append(c)
    return cases


# ----------------------------------------------------------------------------- harmless

def _pod(rng: random.Random) -> str:
    hash_alpha = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' SafeEncodeString alphabet
    app = rng.choice(["trainer", "megatron-worker", "inference-api", "coredns", "nccl-test"])
    return f"{app}-{r(rng, hash_alpha, rng.choice([9, 10]))}-{r(rng, hash_alpha, 5)}"


def _node(rng: random.Random) -> str:
    return rng.choice([
        f"aks-gpupool-{r(rng, string.digits, 8)}-vmss{r(rng, '0123456789abcdefghijklmnopqrstuvwxyz', 6)}",
        f"gke-train-cluster-a3-highgpu-{r(rng, HEX, 8)}-{r(rng, B32[:26], 4)}",
        f"ip-10-{rng.randint(0, 255)}-{rng.randint(0, 255)}-{rng.randint(1, 254)}."
        f"ec2.internal"])


def _tracker(rng: random.Random) -> str:
    return rng.choice([
        f"https://wandb.ai/nlp-lab/gpt-pretrain/runs/{r(rng, string.ascii_lowercase + string.digits, 8)}",
        f"wandb: 🚀 View run at https://wandb.ai/team/proj/runs/{r(rng, string.ascii_lowercase + string.digits, 8)}",
        f"http://mlflow.internal:5000/#/experiments/{rng.randint(1, 99)}/runs/{r(rng, HEX, 32)}",
        f"https://www.comet.com/lab/megatron/{r(rng, HEX, 32)}"])


def _ray(rng: random.Random) -> str:
    sid = "raysubmit_" + r(rng, B62, 16)
    return rng.choice([sid, f"Job '{sid}' submitted successfully",
                       f"ray job logs {sid} --follow"])


def _grafana(rng: random.Random) -> str:
    uid = r(rng, B62, rng.choice([9, 14]))
    return rng.choice([f"https://grafana.example.com/d/{uid}/gpu-utilisation?orgId=1",
                       f"logger=context level=info msg=\"Request Completed\" method=GET path=/api/dashboards/uid/{uid} status=200"])


def _store(rng: random.Random) -> str:
    return rng.choice([
        f"/nix/store/{r(rng, NIX32, 32)}-python3-3.12.{rng.randint(1, 9)}",
        f"/opt/spack/opt/spack/linux-ubuntu22.04-zen2/gcc-11.4.0/"
        f"openmpi-4.1.6-{r(rng, B32, 32)}/bin/mpirun",
        f"/tmp/torchinductor_root/{r(rng, B32, 2)}/c{r(rng, B32, 2)}{r(rng, B32, 49)}.py",
        f"~/.cache/uv/archive-v0/{r(rng, B62 + '-_', 21)}",
        f"cache hit {r(rng, NIX32, 32)}.narinfo"])


def _b64(rng: random.Random, n: int) -> str:
    """Base64 of `n` random bytes (a digest's or a request id's body)."""
    return base64.b64encode(bytes(rng.getrandbits(8) for _ in range(n))).decode()


def _digest(rng: random.Random) -> str:
    return rng.choice([
        f'"integrity": "sha512-{_b64(rng, 64)}"', f"sha256-{_b64(rng, 32)}",
        f"sha384-{_b64(rng, 48)}", f"golang.org/x/net v0.{rng.randint(1, 40)}.0 h1:{_b64(rng, 32)}",
        f'<script src="/app.js" integrity="sha384-{_b64(rng, 48)}"></script>'])


def _s3(rng: random.Random) -> str:
    return rng.choice([
        f"x-amz-request-id: {r(rng, HEX.upper(), 16)}",
        f"(Request ID: {r(rng, HEX.upper(), 16)}, S3 Extended Request ID: {_b64(rng, 56)})",
        f"x-amz-id-2: {_b64(rng, 56)}"])


def _conda(rng: random.Random) -> str:
    return rng.choice([
        f"numpy-1.26.4-py312h{r(rng, HEX, 7)}_{rng.randint(0, 3)}",
        f"pytorch-2.5.1-cuda12{rng.randint(0, 6)}_py312h{r(rng, HEX, 7)}_{rng.randint(300, 315)}",
        f"libgcc-ng 13.2.0 h{r(rng, HEX, 7)}_{rng.randint(0, 9)} conda-forge",
        f"tqdm-4.66.{rng.randint(1, 5)}-pyhd8ed1ab_0.conda"])


def _describe(rng: random.Random) -> str:
    return rng.choice([
        f"v{rng.randint(0, 3)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}-{rng.randint(1, 400)}-g"
        f"{r(rng, HEX, rng.choice([7, 8, 10, 12]))}",
        f"core_r0.{rng.randint(8, 14)}.0-{rng.randint(1, 90)}-g{r(rng, HEX, 9)}-dirty",
        f"2.{rng.randint(0, 9)}.0a0+git{r(rng, HEX, 7)}"])


def _tempdir(rng: random.Random) -> str:
    suffix = r(rng, string.ascii_lowercase + string.digits + "_", 8)
    return rng.choice([
        f"/tmp/tmp{suffix}/bundle-core.tar.sig",
        f"/tmp/megatron-env-{suffix}/out/bundle.tar.sig",
        f"/tmp/pytest-of-root/pytest-{rng.randint(0, 40)}/test_bundle0/b.sig",
        f"/tmp/bundle-{r(rng, B62, 6)}/signature.sig",
        f"/var/folders/{r(rng, string.ascii_lowercase + string.digits, 2)}/"
        f"{r(rng, string.ascii_lowercase + string.digits + '_', 30)}/T/tmp{suffix}"])


# family -> generator; each draw is one value, printed in each of PLACES
HARMLESS: dict[str, Callable[[random.Random], str]] = {
    "pod": _pod, "node": _node, "tracker": _tracker, "ray": _ray, "grafana": _grafana,
    "store": _store, "digest": _digest, "s3": _s3, "conda": _conda, "describe": _describe,
    "tempdir": _tempdir}

# where a generated name is printed: a log line, a JSON field that names what it is, a variable
PLACES: dict[str, Callable[[str, str], str]] = {
    "log": lambda fam, v: f"2026-12-05 10:00:01 INFO {v}",
    "json": lambda fam, v: json.dumps({"kind": fam, "signature" if fam == "tempdir" else "id": v,
                                       "n": 1}),
    "env": lambda fam, v: f"{fam.upper()}_REF={v}"}


@dataclass(frozen=True)
class Harmless:
    family: str
    seed: int
    place: str
    text: str

    @property
    def side(self) -> str:
        return split(f"harmless:{self.family}:{self.seed}")


def harmless(side: str, per_family: int = 20) -> list[Harmless]:
    """`per_family` seeds of each family whose seed falls on `side`, each in every place."""
    out = []
    for fam, gen in HARMLESS.items():
        n = seed = 0
        while n < per_family:
            seed += 1
            if split(f"harmless:{fam}:{seed}") != side:
                continue
            n += 1
            v = gen(random.Random(f"{fam}:{seed}"))
            out += [Harmless(fam, seed, place, mk(fam, v)) for place, mk in PLACES.items()]
    return out
