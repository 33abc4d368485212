"""One redaction for everything the tool prints or writes: each kind of secret planted, then
looked for in stdout, stderr, the report, the snapshot and the triage output."""

import json
import os
import subprocess
import sys

import pytest

from megatron_env import redact
from megatron_env.redact import names

from .conftest import FIXTURES

ROOT = FIXTURES.parent.parent

# one of each kind, built at run time so that no token-shaped string sits in the repository
GITHUB = "ghp_" + "Pl4nted" * 6
GITHUB_PAT = "github_pat_" + "11ABCDEFG0" * 4
GITLAB = "glpat-" + "Pl4ntedGitLab" * 2
HF = "hf_" + "Pl4ntedHuggingFace" * 2
OPENAI = "sk-proj-" + "Pl4ntedOpenAI" * 3
NGC = "nvapi-" + "Pl4nted_NGC-key" * 3
AWS_ID = "AKIA" + "PL4NTEDAWSKEY123"
SLACK = "xoxb-" + "1234567890-" * 2 + "Pl4ntedSlack"
JWT = "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiJwbGFudGVkIn0" + ".Pl4ntedSignature_abcdEFGH"
FORMATS = {"github": GITHUB, "github_pat": GITHUB_PAT, "gitlab": GITLAB, "huggingface": HF,
           "openai": OPENAI, "ngc": NGC, "aws": AWS_ID, "slack": SLACK, "jwt": JWT}
QUERY = {"access_token": "qAccessT0ken", "private_token": "qPrivateT0ken", "auth": "qAuthV4lue",
         "X-Amz-Signature": "a1b2c3d4e5f60718", "X-Amz-Credential": "AKIDqCred2024",
         "sig": "qSigV4lue99", "token": "qT0kenValue", "key": "qKeyV4lue",
         "password": "qPassw0rd", "secret": "qS3cretValue"}
ENTROPY = ("WANDB_API_KEY", "9f8e7D6c5b4a39281706f5e4d3c2b1a0")


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_well_known_token_formats_under_any_name(kind):
    token = FORMATS[kind]
    for line in (f"NCCL_NET_PLUGIN={token}", f"using {token} now", f"'{token}'",
                 f"--header=Authorization:{token}"):
        out = redact.text(line, {})
        assert token not in out and redact.REDACTED in out, (kind, out)


@pytest.mark.parametrize("key", sorted(QUERY))
def test_query_and_pair_values_of_secret_keys(key):
    value = QUERY[key]
    for line in (f"https://host/path?x=1&{key}={value}&y=2", f"https://host/p?{key}={value}",
                 f"SLURM_JOB_COMMENT=run {key}={value} by alice"):
        out = redact.text(line, {})
        assert value not in out, (key, out)
    assert "x=1&" in redact.text(f"https://host/path?x=1&{key}={value}&y=2", {})


def test_url_credentials_always():
    for url in ("https://oauth2:Pl4ntedOauth@gitlab.example/group/repo.git",
                "https://alice:hunter2@mirror.example.org/simple", "git+ssh://bob:pw@h/r.git"):
        out = redact.text(f"megatron: mirroring {url}", {})
        assert "***@" in out and ":" + url.split(":")[2].split("@")[0] + "@" not in out


def test_random_values_of_secret_named_variables_but_not_words():
    name, value = ENTROPY
    out = redact.text(f"export {name}={value}; MY_SECRET: {value[::-1]}", {})
    assert value not in out and value[::-1] not in out
    for keep in ("NCCL_IB_HCA=mlx5_0,mlx5_1", "USE_AUTH=true", "rank 0: SeqNum 1516",
                 "TOKENIZERS_PARALLELISM=false", "NCCL_SOCKET_IFNAME=eth0",
                 "[rank1]: torch.distributed.DistBackendError: NCCL error, NCCL version 2.21.5"):
        assert redact.text(keep, {}) == keep


def test_secret_valued_environment_variables_anywhere():
    env = {"MY_PASSWORD": "plain words here", "HOME": "/home/x"}
    assert "plain words here" not in redact.text("log: plain words here", env)
    assert redact.text("/home/x/log", env) == "/home/x/log"


# The job-log corpus holds no secret, but four of its names were made by a generator (a
# Kubernetes pod, a student id, a temporary directory, a Google Drive id): the shape pass masks
# them, and nothing else (the false-positive rate is measured by bench/redact_corpus.py).
RANDOM_HOSTS = {"mlxlab115rp2n7682d40d9-20250521025625-6dyyd3-8nir8b-worker", "ai22mtech12005",
                "compute_world_size-mpr03nzqvvg3td_nu4r0f6t", "1y7MmnvpzyjPJQsmpSaAXCsa4J7YYBiKp",
                # a wandb run's generated directory name (clean-wandb-...-wandb367.log)
                "run-20190607_153421-jhgjl15c"}


def test_real_job_logs_pass_through_unchanged_but_generated_host_names():
    """The redaction must not eat what triage shows: the corpus holds no secret."""
    for f in sorted((FIXTURES / "job-logs").glob("*.log")):
        text = f.read_text(errors="replace")
        kept = text
        for host in RANDOM_HOSTS:
            kept = kept.replace(host, redact.REDACTED)
        assert redact.text(text, {}) == kept, f.name


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not redact.is_secret_name(k)}
    env.update(extra)
    return env


def _absent(r, secrets):
    for s in secrets:
        assert s not in r.stdout and s not in r.stderr, s


def test_triage_prints_no_planted_secret(tmp_path):
    planted = [*FORMATS.values(), *QUERY.values()]
    log = tmp_path / "job.log"
    log.write_text("".join(
        f"[rank{i}]: RuntimeError: CUDA error: an illegal memory access was encountered "
        f"(see https://h/x?{k}={v}) {t}\n"
        for i, ((k, v), t) in enumerate(zip(QUERY.items(), list(FORMATS.values()) * 2,
                                             strict=False))))
    for args in ([], ["--json"]):
        r = subprocess.run([sys.executable, "-m", "invoke", "triage", str(log), *args], cwd=ROOT,
                           env=_env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 1, r.stderr
        assert "illegal memory access" in r.stdout
        _absent(r, planted)
    assert "see https://h/x?access_token=***" in r.stdout  # the evidence, its secret masked


def test_mirror_credentials_never_reach_the_console(tmp_path):
    token = GITLAB
    r = subprocess.run([sys.executable, "-m", "invoke", "megatron", "--prefix",
                        str(tmp_path / "env")], cwd=ROOT, capture_output=True, text=True,
                       env=_env(MEGATRON_ENV_CACHE=str(tmp_path / "cache"),
                                MEGATRON_ENV_MIRROR_MEGATRON=f"https://oauth2:{token}@127.0.0.1:9/"
                                                             "Megatron-LM.git"), timeout=300)
    assert r.returncode != 0
    assert "mirroring https://***@127.0.0.1:9/Megatron-LM.git" in r.stderr
    _absent(r, [token])
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert token not in f.read_text(errors="replace"), f


def test_collect_writes_no_planted_secret(tmp_path):
    planted = {"NCCL_NET_PLUGIN": GITHUB, "SLURM_JOB_COMMENT": f"run token={QUERY['token']}",
               "NCCL_DEBUG_FILE": f"https://u:{QUERY['password']}@h/x?sig={QUERY['sig']}",
               "TORCH_HOME": f"/cache/{HF}", "CUDA_PLANTED_JWT": JWT}
    r = subprocess.run([sys.executable, "-m", "invoke", "collect", "--out", str(tmp_path / "s")],
                       cwd=ROOT, env=_env(**planted), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    secrets = [GITHUB, QUERY["token"], QUERY["password"], QUERY["sig"], HF, JWT]
    _absent(r, secrets)
    for f in (tmp_path / "s").iterdir():
        text = f.read_text(errors="replace")
        for s in secrets:
            assert s not in text, (f.name, s)
    # a plugin's name that does not parse as one prints as its shape (redact.envtypes)
    assert "NCCL_NET_PLUGIN=<redacted: 46 chars>" in (tmp_path / "s" / "env.txt").read_text()


# Names as they are spelled in the wild, and how secret the value behind each is. Every word of
# redact.py's name sets is here once, so that dropping one is noticed.
STRONG = ["password", "DB_PASSWORD", "PGPASSWORD", "mysqlRootPassword", "passwd", "passphrase",
          "--pass", "secret", "client_secret", "clientSecret", "AWS_SECRET_ACCESS_KEY", "secrets",
          "token", "HF_TOKEN", "accessToken", "identitytoken", "registrytoken", "credential",
          "credentials", "creds", "auth", "authorization", "cookie", "signature", "sig", "sas",
          "apikey", "privatekey", "secretkey", "accesskey", "authkey", "jwt", "gitlab_pat",
          "passin", "passout", "api_key", "access_key", "private_key", "secret_key",
          "account_key", "client_key", "auth_key", "signing_key", "encryption_key", "master_key",
          "storage_key", "subscription_key", "app_key", "consumer_key", "shared_key",
          "deploy_key", "license_key", "sas_key", "secret_id"]
WEAK = ["key", "ssh_key", "private_key_id", "AWS_ACCESS_KEY_ID", "token_id",
        "session_id", "sessionid", "sid", "key_id", "keys", "hf_token_id"]
NOT_SECRET = [f"password_{w}" for w in (
    "file", "files", "path", "paths", "dir", "directory", "env", "var", "name", "names", "type",
    "types", "kind", "length", "len", "size", "min", "max", "count", "num", "prompt", "stdin",
    "policy", "method", "mode", "url", "uri", "endpoint", "host", "enabled", "enable",
    "required", "expiry", "expires", "expiration", "ttl", "timeout", "header", "field", "prefix",
    "suffix", "format", "scheme", "version", "limit", "helper", "manager", "provider", "backend",
    "plugin", "source", "command", "cmd", "ref", "arn", "regex", "pattern", "class",
    "algorithm", "alg", "parallelism", "budget", "location", "store", "ids", "level", "rate",
    "index")] + [f"{w}_auth" for w in (
        "use", "no", "enable", "disable", "with", "without", "skip", "require", "allow", "is",
        "has", "max", "min", "num", "n")] + [f"{w}_key" for w in (
            "cache", "sort", "primary", "foreign", "partition", "routing", "lookup", "hash",
            "dict", "group", "index", "shard", "unique", "row", "column", "object", "bucket",
            "table", "config", "public", "pub", "host", "map", "cursor", "kv", "qk", "query",
            "value", "idempotency", "dedup", "cluster", "node")] + [
    "TOKENIZERS_PARALLELISM", "OLDPWD", "moe_token_dispatcher_type", "tokenizer_model",
    "max_tokens", "kv_channels", "client_id", "", "___", "id"]


@pytest.mark.parametrize("name", STRONG)
def test_strong_names(name):
    assert redact.name_kind(name) == "strong"


def test_pwd_is_odbcs_password_and_the_shells_path():
    """`PWD=` is ODBC's password; the shell's `PWD` is a path, and a path is never masked."""
    assert redact.variables({"PWD": "/home/u/megatron"}) == {"PWD": "/home/u/megatron"}
    assert redact.text("UID=loader\nPWD=sunflower12", {}) == "UID=loader\nPWD=<redacted>"


@pytest.mark.parametrize("name", STRONG + WEAK + ["DB_PWD", "JENKINS_PSW", "oauth2-bearer"])
def test_every_secret_name_holds_a_stem(name):
    """The key rules are scanned for only in lines holding a stem (names.STEMS)."""
    assert redact.name_kind(name) and any(s in name.lower() for s in names.STEMS)


@pytest.mark.parametrize("name", WEAK)
def test_weak_names(name):
    assert redact.name_kind(name) == "weak"


@pytest.mark.parametrize("name", NOT_SECRET)
def test_names_that_are_no_secret(name):
    assert redact.name_kind(name) is None and not redact.is_secret_name(name)


@pytest.mark.parametrize("value", ["true", "False", "none", "NULL", "nil", "yes", "no", "on",
                                   "off", "undefined", "***", "xxx", "-", "<your token>",
                                   "$HF_TOKEN", "${HF_TOKEN}", "%TOKEN%", "...", ""])
def test_placeholders_are_no_secret_values(value):
    assert not redact.secret_value("strong", value)
    assert redact.text(f"--password {value} --token={value}".strip(), {}).count(
        redact.REDACTED) == 0


def test_strong_values_any_weak_values_random_and_not_paths():
    assert redact.secret_value("strong", "hunter2") and redact.secret_value("strong", "hunter/2024")
    # a path is a path whatever it is called (a signature file the tool wrote)
    assert not redact.secret_value("strong", "/out/bundle.sig")
    assert not redact.secret_value(None, "Zr8vQ2mXk9Lp")
    assert redact.secret_value("weak", "Zr8vQ2mXk9Lp")
    for kept in ("hunter", "/etc/ssl/key.pem", "~/.ssh/id_rsa", "./k.pem", "../k"):
        assert not redact.secret_value("weak", kept), kept


def test_random_looking_boundaries():
    assert not redact.random_looking("Ab3dE6g")  # 7 characters: too short
    assert redact.random_looking("Ab3dE6gH")  # 8 distinct, three classes
    assert not redact.random_looking("abcdefghijkl")  # one word-like class
    assert not redact.random_looking("8273645190")  # digits only: one class
    assert redact.random_looking("82736451a0")  # two classes
    assert not redact.random_looking("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa11")  # low entropy
    assert redact.random_looking("a1b2c3d4e5")  # 10 characters, entropy 3.32 >= 0.9*log2(10)
    assert not redact.random_looking("a1a1b2b2c3c3")  # entropy 2.58 < 3.0
    assert redact.random_looking("a1b2c3d4a1b2c3d4")  # entropy exactly 3.0


@pytest.mark.parametrize("prefix", ["xoxa", "xoxb", "xoxe", "xoxp", "xoxr", "xoxs"])
def test_every_slack_prefix(prefix):
    token = prefix + "-" + "1234567890-" + "Pl4ntedSlack"
    assert token not in redact.text(f"slack: {token}", {})
    assert "xoxz-1234567890-Pl4nted" in redact.text("xoxz-1234567890-Pl4nted", {})


@pytest.mark.parametrize("line,masked", [
    ("+ srun python train.py --password Pl4nted.pw --lr 1e-4", "Pl4nted.pw"),
    ("docker login -u bot -p Pl4nted.pw nvcr.io", "Pl4nted.pw"),
    ("podman login --username bot --password=Pl4nted.pw quay.io", "Pl4nted.pw"),
    ("mysql -u root -pPl4nted.pw train", "Pl4nted.pw"),
    ("mariadb -h db -pPl4nted.pw", "Pl4nted.pw"),
    ("curl --user alice:Pl4nted.pw https://h", "Pl4nted.pw"),
    ("h:5:db:u:Pl4nted.pw", "Pl4nted.pw"),
    ("Bearer aaaaaaaaaaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaa"),
    ("gho_" + "Pl4ntedGitHubOAuth0" * 2, "Pl4ntedGitHubOAuth0"),
    ("ghu_" + "Pl4ntedGitHubUser00" * 2, "Pl4ntedGitHubUser00"),
    ("ghs_" + "Pl4ntedGitHubServer" * 2, "Pl4ntedGitHubServer"),
    ("ghr_" + "Pl4ntedGitHubRefres" * 2, "Pl4ntedGitHubRefres"),
    ("sshpass -p Pl4nted.pw ssh node1", "Pl4nted.pw"),
    ("redis-cli -h r -a Pl4nted.pw ping", "Pl4nted.pw"),
    ("curl -u alice:Pl4nted.pw https://h", "Pl4nted.pw"),
    ("wandb login --relogin Pl4nted0wandb", "Pl4nted0wandb"),
    ("openssl rsa -passin pass:Pl4nted.pw", "Pl4nted.pw"),
    ("machine h login u password Pl4nted.pw", "Pl4nted.pw"),
    ("default login u account Pl4nted.pw", "Pl4nted.pw"),
    ("machine h\n  login u\n  password Pl4nted.pw\n", "Pl4nted.pw"),
    ("db.example.com:5432:train:alice:Pl4nted.pw", "Pl4nted.pw"),
    ("10.0.0.5:*:*:svc:Pl4nted\\:pw", "Pl4nted"),
    ("authorization: bearer Pl4ntedBearerT0ken", "Pl4ntedBearerT0ken"),
    ("Proxy-Authorization: Basic dTpQbDRudGVkLnB3", "dTpQbDRudGVkLnB3"),
    ("Cookie: session=Pl4ntedCookie", "Pl4ntedCookie"),
    ('{"private_key_id": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b"}', "9f86d081884c7d659a2f"),
    ("api_key: Pl4ntedK3yValue", "Pl4ntedK3yValue"),
    ("https://h.example/cb#access_token=Pl4ntedFragment", "Pl4ntedFragment"),
    ("https:/alice:Pl4nted.pw@h/r.git", "Pl4nted.pw"),
    ("AIza" + "Pl4ntedGoogleKey0123456789abcdefghi", "Pl4ntedGoogleKey"),
    ("npm_" + "Pl4ntedNpm" * 3 + "abcdef", "Pl4ntedNpm"),
    ("sk_live_" + "Pl4ntedStripe0123", "Pl4ntedStripe"),
    ("dckr_pat_" + "Pl4ntedDockerHub0123456", "Pl4ntedDockerHub"),
    ("pypi-" + "AgEIcHlwaS5vcmc" * 4, "AgEIcHlwaS5vcmcAgEI"),
    ("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7", "MIIEvQIBADANBgkqhkiG9w0BAQEF"),
])
def test_each_structure(line, masked):
    out = redact.text(line, {})
    assert masked not in out and redact.REDACTED in out or "***" in out, out


def test_pem_blocks_real_and_escaped_newlines_and_cut():
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"
    for nl in ("\n", "\\n", "\r\n"):
        block = nl.join(["-----BEGIN EC PRIVATE KEY-----", body, "-----END EC PRIVATE KEY-----"])
        out = redact.text(f"key {block} done", {})
        assert body not in out and out.endswith("-----END EC PRIVATE KEY----- done"), out
    assert body[:20] not in redact.text(f"-----BEGIN PRIVATE KEY-----\n{body[:30]}", {})
    lines = redact.Lines({})
    streamed = [lines(x) for x in ("-----BEGIN CERTIFICATE-----\n", "aGVsbG8=\n", "hello\n",
                                   "-----END CERTIFICATE-----\n", "after\n")]
    assert streamed[1:3] == ["<redacted>\n", "<redacted>\n"] and streamed[4] == "after\n"
    assert streamed[3] == "<redacted>-----END CERTIFICATE-----\n"


def test_json_stays_json_and_keeps_its_layout():
    doc = {"cached": False, "x": {"password": 1234, "pass": 3, "client_secret": "s3cr3tValue",
                                  "cache_key": "flash_attn-3f9a1c2b7d4e5f60718293a4b5c6d7e8"}}
    for indent in (None, 2, 4):
        text = json.dumps(doc, indent=indent) + "\n"
        out = redact.text(text, {"TOKENIZERS_PARALLELISM": "false"})
        back = json.loads(out)
        # a number is a secret only under a password's name (`"pass": 3` is a count)
        assert back["cached"] is False and back["x"]["password"] == redact.REDACTED
        assert back["x"]["pass"] == 3
        assert back["x"]["client_secret"] == redact.REDACTED
        assert back["x"]["cache_key"] == doc["x"]["cache_key"]
        assert out == json.dumps(back, indent=indent) + "\n"
    assert redact.text('[1, "a"]', {}) == '[1, "a"]'
    assert redact.text("[rank0]: x [y]", {}) == "[rank0]: x [y]"


def test_environment_values_of_strong_and_random_weak_names_only():
    env = {"TOKENIZERS_PARALLELISM": "false", "MY_TOKEN": "abcd", "SSH_KEY": "plainword",
           "CI_KEY": "Zr8vQ2mXk9Lp", "X_TOKEN": "abc", "PWD": "/home/x"}
    out = redact.text("false abcd plainword Zr8vQ2mXk9Lp abc /home/x", env)
    assert out == "false <redacted> plainword <redacted> abc /home/x"
    assert redact.variables({"NCCL_SOCKET_IFNAME": "eth0", "HF_TOKEN": "abc",
                             "TORCH_KEY_SIZE": "1024"}) == {
        "HF_TOKEN": "<redacted>", "NCCL_SOCKET_IFNAME": "eth0", "TORCH_KEY_SIZE": "1024"}


def test_an_ids_hex_secret_is_masked_and_an_image_digest_is_no_userinfo():
    # measured on shapes the code had not seen: `<id>/<id>:<32 hex>` (a personal access token
    # of an id and a hex secret) was printed whole, and an image reference's `host:port/name@`
    # before its digest was masked as a URL's user and password
    secret = "9f2c4e1a7b3d5f608e1c2a4b6d8f0e13"
    assert redact.text(f"ASANA=2/1204356789012345/1204356789012346:{secret}") == (
        "ASANA=<redacted>/<redacted>/<redacted>:<redacted>")
    assert secret not in redact.text(f"token 77:{secret} used")
    ref = ("docker-pullable://registry.example.org:5000/tengine-2.2.0@sha256:"
           "6a3c3c1e0f1b5a8e6d7c9b0a2f4e6d8c0b2a4f6e8d0c2b4a6f8e0d2c4b6a8f0e")
    assert redact.text(f"Image ID: {ref}") == f"Image ID: {ref}"
    digest = "sha256:" + "ab" * 32
    assert redact.text(f"commit 0123456789abcdef0123456789abcdef01234567 {digest}") == (
        f"commit 0123456789abcdef0123456789abcdef01234567 {digest}")


def test_a_directory_mktemp_made_is_named_as_it_is():
    # `mktemp -d` names `/tmp/tmp.` and ten random letters and digits: the user's own directory,
    # printed back in an error line (it came out `/tmp/<redacted>/s`)
    line = "error: snapshot /tmp/tmp.jCirdMvqDd/s was changed after it was collected"
    assert redact.text(line) == line
