"""Redaction proven by generation: a random secret of each kind, written the way it stands in
real text (a CLI flag, a login command, a PEM block, a JSON/YAML key, a URL, a netrc/.pgpass/
docker-config line, an HTTP header, a token format), put in random surroundings (an environment
variable, a log line, a JSON document, a command line), must not come out of `redact.text`, nor
out of the real commands (`report`, `report --json`, `collect`, `check --json`, `triage`,
`triage --json`, their error lines, the command logs) that read it from where it was planted.
Harmless look-alikes must come out unchanged.

Examples: MEGATRON_ENV_REDACT_EXAMPLES (default 200) for the text properties,
MEGATRON_ENV_REDACT_COMMAND_EXAMPLES (default 3; each runs every command once) for the commands';
a long run: `MEGATRON_ENV_REDACT_EXAMPLES=5000 MEGATRON_ENV_REDACT_COMMAND_EXAMPLES=100 pytest
tests/test_redact_generated.py --hypothesis-show-statistics`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_env import proc, redact

EXAMPLES = int(os.environ.get("MEGATRON_ENV_REDACT_EXAMPLES", "200"))
TEXT = settings(max_examples=EXAMPLES, deadline=None, derandomize="MEGATRON_ENV_REDACT_EXAMPLES"
                not in os.environ)
COMMANDS = settings(max_examples=int(os.environ.get("MEGATRON_ENV_REDACT_COMMAND_EXAMPLES", "3")),
                    deadline=None,
                    derandomize="MEGATRON_ENV_REDACT_EXAMPLES" not in os.environ,
                    suppress_health_check=list(HealthCheck))
_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_PUNCT = "!@%^*+~._-"


def _random(seed: bytes, n: int, alphabet: str = _ALNUM) -> str:
    """`n` characters that look like a generated secret (hypothesis draws the seed)."""
    out, block = [], seed
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += [alphabet[b % len(alphabet)] for b in block]
    return "".join(out[:n])


@st.composite
def secret(draw, alphabet: str = _ALNUM + _PUNCT, lo: int = 12, hi: int = 40) -> str:
    seed = draw(st.binary(min_size=1, max_size=8))
    n = draw(st.integers(lo, hi))
    first = _random(seed + b"0", 1)  # starts with a letter or digit, like a generated one
    return first + _random(seed, n - 1, alphabet)


def _b64(raw: str) -> str:
    return base64.b64encode(raw.encode()).decode()


# ------------------------------------------------------------------ each kind: (secrets, text)

@st.composite
def flag(draw):
    s = draw(secret())
    name = draw(st.sampled_from(["--password", "--token", "--api-key", "--secret", "--secret-key",
                                 "--client-secret", "--hf-token", "--wandb-api-key",
                                 "--auth-token", "--access-key", "--db-password", "--passphrase",
                                 "-password"]))
    sep = draw(st.sampled_from([" ", "=", "  "]))
    quote = draw(st.sampled_from(["", "'", '"']))
    return [s], f"{name}{sep}{quote}{s}{quote}"


@st.composite
def login(draw):
    s = draw(secret())
    form = draw(st.sampled_from([
        "docker login -u bot -p {s} nvcr.io", "podman login --username bot -p {s} quay.io",
        "helm registry login reg.example -u bot -p {s}", "nerdctl login -p={s} r",
        "mysql -u root -p{s} train", "mariadb -h db -p{s}", "sshpass -p {s} ssh node1",
        "curl -u alice:{s} https://h/x", "redis-cli -h r -a {s} ping",
        "wandb login {s}", "openssl rsa -in k.pem -passin pass:{s}"]))
    return [s], form.format(s=s)


_PEM_KINDS = ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY",
              "ENCRYPTED PRIVATE KEY", "CERTIFICATE", "DSA PRIVATE KEY", "PGP PRIVATE KEY BLOCK"]


@st.composite
def pem(draw):
    seed = draw(st.binary(min_size=1, max_size=8))
    lines = [_random(seed + bytes([i]), 64, _ALNUM + "+/") for i in range(draw(st.integers(1, 4)))]
    last = _random(seed + b"end", draw(st.integers(12, 60)), _ALNUM + "+/") + "=="
    kind = draw(st.sampled_from(_PEM_KINDS))
    nl = draw(st.sampled_from(["\n", "\\n", "\r\n"]))
    block = nl.join([f"-----BEGIN {kind}-----", *lines, last, f"-----END {kind}-----"])
    if draw(st.booleans()):  # inside a service-account JSON, as a file holds it
        return lines, json.dumps({"type": "service_account", "private_key": block.replace(
            "\\n", "\n"), "client_email": "x@p.iam.gserviceaccount.com"})
    return [*lines, last[:-2]], block


@st.composite
def keyed(draw):
    s = draw(secret(_ALNUM + _PUNCT + " ") if draw(st.booleans()) else secret())
    key = draw(st.sampled_from(["private_key_id", "client_secret", "hf_token", "api_key",
                                "password", "db_password", "auth", "access_token", "secret_key",
                                "apiKey", "clientSecret", "WANDB_API_KEY", "refresh_token",
                                "storage_account_key", "PGPASSWORD", "identitytoken"]))
    if key == "private_key_id":
        s = _random(s.encode(), 40, "0123456789abcdef")
    style = draw(st.sampled_from(['"{k}": "{s}"', "'{k}': '{s}'", '{k}: "{s}"', '{k} = "{s}"',
                                  "{k}='{s}'", '\\"{k}\\": \\"{s}\\"']))
    if " " not in s:
        style = draw(st.sampled_from([style, "{k}: {s}", "{k}={s}"]))
    return [s], style.format(k=key, s=s)


@st.composite
def url(draw):
    s = draw(secret(_ALNUM, 20, 40))
    form = draw(st.sampled_from([
        ("https://huggingface.co/hf_{t}/resolve/main/config.json", "hf_"),
        ("https://github.com/ghp_{t}/repo", "ghp_"), ("https://h.example/cb#access_token={s}", ""),
        ("https://h.example/cb#token={s}&state=1", ""), ("https://h/p?x=1&token={s}", ""),
        ("https://alice:{s}@gitlab.example/g/r.git", ""),
        ("https://hooks.example/services/glpat-{t}", "glpat-"),
        ("https://acct.blob.core.windows.net/c/f?sv=2022&sig={s}", "")]))
    template, prefix = form
    t = _random(s.encode(), 36)
    return [prefix + t if prefix else s], template.format(s=s, t=t)


@st.composite
def files(draw):
    s = draw(secret(_ALNUM + "!@%^*+~.-"))
    form = draw(st.sampled_from([
        "machine h.example login u password {s}", "default login anonymous password {s}",
        "machine h\n  login u\n  password {s}\n", "machine api.wandb.ai login user password {s}",
        "db.example.com:5432:train:alice:{s}", "localhost:*:*:postgres:{s}",
        "10.0.0.5:6432:*:svc:{s}"]))
    if draw(st.integers(0, 3)) == 0:
        auth = _b64(f"bot:{s}")
        return [auth, s], json.dumps({"auths": {"nvcr.io": {"auth": auth}}})
    return [s], form.format(s=s)


@st.composite
def header(draw):
    s = draw(secret(_ALNUM + "._~+/-", 16, 48))
    name = draw(st.sampled_from(["Authorization", "authorization", "AUTHORIZATION",
                                 "Proxy-Authorization", "X-Api-Key", "Cookie", "Private-Token"]))
    scheme = draw(st.sampled_from(["Basic ", "Bearer ", "bearer ", "token ", "BEARER ", ""]))
    value = _b64(f"u:{s}") if scheme == "Basic " else s
    form = draw(st.sampled_from(["{h}: {v}", "curl -H '{h}: {v}' https://h", '-H "{h}:{v}"']))
    return [value], form.format(h=name, v=scheme + value)


@st.composite
def token(draw):
    seed = draw(st.binary(min_size=1, max_size=8))
    t = _random(seed, 40)
    fmt = draw(st.sampled_from([
        "ghp_" + t[:36], "gho_" + t[:36], "ghs_" + t[:36], "github_pat_" + t + "_" + t[:20],
        "glpat-" + t[:20], "hf_" + t[:34], "sk-proj-" + t, "nvapi-" + t, "AKIA" + t[:16].upper(),
        "xoxb-" + t[:24], "xoxp-" + t[:24], "xoxa-" + t[:24], "xoxr-" + t[:24], "xoxs-" + t[:24],
        "xoxe-" + t[:24], "AIza" + t[:35], "npm_" + t[:36], "dckr_pat_" + t[:27],
        "eyJhbGciOiJIUzI1NiJ9." + t[:20] + "." + t[20:]]))
    # a JWT's first part is its public header ({"alg":"HS256"}, the same in every such token)
    return [fmt.split(".", 1)[1] if fmt.startswith("eyJ") else fmt], fmt


KINDS = {"flag": flag(), "login": login(), "pem": pem(), "keyed": keyed(), "url": url(),
         "files": files(), "header": header(), "token": token()}
ANY = st.one_of(*KINDS.values())

CONTAINERS = {
    "env": "NCCL_PLANTED={x}",
    "export": "export TORCH_PLANTED='{x}'",
    "log": "[rank3]:W1204 10:00:01 train.py:88] step 10: {x} (retrying)",
    "cmdline": "+ srun --nodes=2 python pretrain_gpt.py --lr 1e-4 {x} --seed 1",
    "json": None,
    "multiline": "INFO start\n{x}\nINFO done",
}


def _contain(where: str, x: str) -> str:
    if where == "json":
        return json.dumps({"step": 1, "cmd": x, "ok": True}, indent=2)
    return CONTAINERS[where].format(x=x)


def _leaks(out: str, secrets: list[str]) -> list[str]:
    """The secrets (or any 12 characters of one in a row) that `out` holds."""
    found = []
    for s in secrets:
        forms = {s, json.dumps(s)[1:-1]}
        windows = {s[i:i + 12] for i in range(max(1, len(s) - 11))} if len(s) > 12 else set()
        if any(f in out for f in forms) or any(w in out for w in windows):
            found.append(s)
    return found


@TEXT
@given(planted=ANY, where=st.sampled_from(sorted(CONTAINERS)))
def test_no_generated_secret_survives_text(planted, where):
    secrets, x = planted
    text = _contain(where, x)
    out = redact.text(text, {})
    assert not _leaks(out, secrets), (text, out)
    # a governed variable's value that does not parse prints as its shape (redact.envtypes)
    assert redact.REDACTED in out or "***" in out or "<redacted: " in out
    if where == "json":
        assert json.loads(out)["step"] == 1  # still a JSON document


@TEXT
@given(planted=ANY)
def test_no_generated_secret_survives_a_streamed_log(planted):
    """A command's log is redacted line by line (`redact.Lines`): a PEM block spans lines."""
    secrets, x = planted
    lines = redact.Lines({})
    out = "".join(lines(line) for line in f"building\n{x}\ndone\n".splitlines(keepends=True))
    assert not _leaks(out, secrets), (x, out)


# ------------------------------------------------------------------ look-alikes kept

LOOKALIKES = [
    "NCCL_IB_HCA=mlx5_0:1,mlx5_1:1", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "TOKENIZERS_PARALLELISM=false", "torch==2.11.0+cu130", "flash-attn 2.7.4.post1",
    "--hash=sha256:3f9a1c2b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8",
    "megatron core_r0.13.0 @ 4c2bd6a7e3a8c0d8f5b1e2a3c4d5e6f708192a3b",
    "commit = \"4c2bd6a7e3a8c0d8f5b1e2a3c4d5e6f708192a3b\"",
    "/home/u/.cache/huggingface/hub/models--gpt2/snapshots/"
    "607a30d783dfa663caf39e06633721c8d4cfcd7e/config.json",
    "node1:12345:12345 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; "
    "OOB ib0:10.0.0.1<0>",
    "node1:12345:12399 [3] NCCL INFO Channel 00/24 : 0 1 2 3 4 5 6 7",
    "GPU 0: NVIDIA H200 (UUID: GPU-8d6a4f5e-1c2b-3a4d-9e8f-7a6b5c4d3e2f)",
    "MIG-5f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", "0000:3B:00.0", "a0:36:9f:12:34:56",
    "\"cache_key\": \"flash_attn-3f9a1c2b7d4e5f60718293a4b5c6d7e8\"",
    "--tokenizer-type GPT2BPETokenizer --tokenizer-model /data/tok.model",
    "--moe-token-dispatcher-type alltoall --moe-token-drop-policy probs",
    "--kv-channels 128 --qk-layernorm --use-flash-attn", "--password-file /run/secrets/db",
    "USE_AUTH=true", "key_size: 4096", "max_tokens=4096", "\"uuid\": \"GPU-8d6a4f5e-1c2b\"",
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "PasswordAuthentication no", "token embeddings: 50304 x 4096", "docker login nvcr.io",
    "psql -h db -p 5432 -U train", "ssh -p 2222 node1", "mkdir -p /tmp/x",
    "2024-05-01 12:00:00,123 INFO step 10 | loss 2.31", "[rank0]: SeqNum=1516, OpType=ALLREDUCE",
]


@TEXT
@given(keep=st.sampled_from(LOOKALIKES), where=st.sampled_from(sorted(CONTAINERS)))
def test_lookalikes_are_kept(keep, where):
    # under an NCCL_/TORCH_ name the value is typed (redact.envtypes: an unknown name shows its
    # value's shape); the look-alikes are judged as text under a name nothing governs
    text = _contain(where, keep).replace("NCCL_PLANTED", "PLANTED_REF").replace(
        "TORCH_PLANTED", "PLANTED_CMD")
    assert redact.text(text, {}) == text


# ------------------------------------------------------------------ the real commands

def _run(fn, **kwargs) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = fn(**kwargs)
    assert isinstance(code, int)
    return out.getvalue() + err.getvalue()


def _flat(x: str) -> str:
    return x.replace("\r\n", " ").replace("\n", " ")


def _command_outputs(planted: list[tuple[list[str], str]], tmp: Path) -> dict[str, str]:
    """Every command's output, with the secrets planted in what each reads."""
    from megatron_env.commands import host as commands

    frags = [x for _, x in planted]
    env = {f"NCCL_PLANTED_{i}": x for i, x in enumerate(frags)}
    env["TORCH_PLANTED_CMD"] = "srun python train.py " + " ".join(map(_flat, frags))
    snap = tmp / "snap"
    snap.mkdir()
    (snap / "env.txt").write_text("".join(f"{k}={_flat(v)}\n" for k, v in env.items()))
    (snap / "nvidia-smi.txt").write_text("".join(f"{_flat(x)}\n" for x in frags))
    (snap / "meta.json").write_text("{}")
    log = tmp / "job.log"
    log.write_text("".join(f"[rank{i}]: RuntimeError: CUDA error: an illegal memory access was "
                           f"encountered ({_flat(x)})\n" for i, x in enumerate(frags)))
    clean = {k: v for k, v in os.environ.items() if not redact.is_secret_name(k)}
    outs: dict[str, str] = {}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        outs["report"] = _run(commands.bug_report)
        outs["report --json"] = _run(commands.bug_report, json=True)
        json.loads(outs["report --json"][:outs["report --json"].rindex("}") + 1]
                   [outs["report --json"].index("{"):])
        outs["collect"] = _run(commands.collect, out=str(tmp / "c")) + "".join(
            f.read_text() for f in (tmp / "c").iterdir())
        outs["check --json"] = _run(commands.check, json=True)
        outs["check --json --snapshot"] = _run(commands.check, json=True, snapshot=str(snap))
        outs["triage"] = _run(commands.triage, logs=str(log))
        outs["triage --json"] = _run(commands.triage, logs=str(log), json=True)
        outs["error lines"] = "".join(_run(commands.triage, logs=_flat(x).replace(",", " "))
                                      for x in frags)
        lines: list[str] = []
        proc.run(["printf", "%s\\n", *frags], log=tmp / "cmd.log")
        proc.run(["printf", "%s\\n", *frags], log=tmp / "stream.log", stream=True,
                 on_line=lines.append)
        outs["command logs"] = (tmp / "cmd.log").read_text() + (tmp / "stream.log").read_text()
    return outs


@COMMANDS
@given(planted=st.tuples(*KINDS.values()))
def test_no_command_prints_a_generated_secret(planted, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planted")
    outs = _command_outputs(list(planted), tmp)
    for name, out in outs.items():
        for secrets, x in planted:
            assert not _leaks(out, secrets), (name, x)
    assert "illegal memory access" in outs["triage"]
    assert "no such file" in outs["error lines"]


def test_commands_keep_lookalikes(tmp_path):
    from megatron_env.commands import host as commands

    env = {"NCCL_IB_HCA": "mlx5_0:1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "TOKENIZERS_PARALLELISM": "false", "NCCL_IB_AUTH_MODE_X": "true"}
    with mock.patch.dict(os.environ, env):
        report = _run(commands.bug_report, json=True)
    doc = json.loads(report[report.index("{"):report.rindex("}") + 1])
    assert doc["variables"]["NCCL_IB_HCA"] == "mlx5_0:1"
    assert doc["variables"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "<redacted>" not in report  # `false` of TOKENIZERS_PARALLELISM is no secret value
