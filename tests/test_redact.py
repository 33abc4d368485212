"""One redaction for everything the tool prints or writes: each kind of secret planted, then
looked for in stdout, stderr, the report, the snapshot and the triage output."""

import os
import subprocess
import sys

import pytest

from megatron_env import redact

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


def test_real_job_logs_pass_through_unchanged():
    """The redaction must not eat what triage shows: the corpus holds no secret."""
    for f in sorted((FIXTURES / "job-logs").glob("*.log")):
        text = f.read_text(errors="replace")
        assert redact.text(text, {}) == text, f.name


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
    assert "NCCL_NET_PLUGIN=<redacted>" in (tmp_path / "s" / "env.txt").read_text()
