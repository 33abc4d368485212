#!/usr/bin/env python3
# ruff: noqa: E501  (the harmless lines are quoted as their threads printed them, unwrapped)
"""Fail-closed cases the code was not written against: secrets, redirects, altered files.

An outside measurement: every case below is new (not in tests/redact_formats.py, the tests or
the fixtures), and every command runs as a user runs it, `python -m megatron_env ...` in a
child process, with the secret planted where that command reads (the environment, a raw
`env > env.txt` snapshot, a job log). `--tree DIR` measures another source tree (a checkout of
another revision) with the same cases.

1. secrets: each shape (a vendor format, or a secret in a config/command surrounding) planted
   in the environment under names of no meaning (NCCL_FRESH_VALUE, MEGATRON_ENV_FRESH,
   SLURM_FRESH_CONF, FRESH_ANY) for `report`, `report --json`, `collect` (its output and the
   files it writes), `check --json`; in a raw env dump for `check --json --snapshot`; in three
   job logs (on the error line, as a JSON log record, on the line before the error) for
   `triage` and `triage --json`. A leak: any 12 characters of a secret in a row in the output
   (the whole secret when shorter). Harmless: real output lines from public threads (cited),
   through `redact.text` and as variables through `report --json`; characters masked counted.
2. redirects: PIP_INDEX_URL with user:pass to a local server A (127.0.0.1); redirects to B
   (127.0.0.2, other port), to C (127.0.0.1, other port), and a chain A -> B -> A; the real
   `sources.index.fetch` (what a kernel build's sdist fetch calls). Counted: Authorization
   headers a server received that the user did not give it.
3. files: a collected snapshot without its completion marker, with a truncated file; an
   environment stamp nested 100000 deep, a directory, a FIFO, binary (`report --prefix`);
   what a command accepts without refusing or naming the file is counted as trusted.

    python bench/fresh_cases.py > bench/results/2026-12-04-cpu/fresh_cases.json
    python bench/fresh_cases.py --tree /tmp/other-checkout --only redirects,files
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import difflib
import http.server
import json
import os
import random
import ssl
import string
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent

B62 = string.ascii_letters + string.digits
B64 = B62 + "+/"
B64URL = B62 + "-_"
HEX = "0123456789abcdef"
UPPER_DIGITS = string.ascii_uppercase + string.digits
LOWER_DIGITS = string.ascii_lowercase + string.digits
BASE32_LOWER = string.ascii_lowercase + "234567"
PW = B62 + "!#%&*+-.:;=?^_~"  # what a password form accepts; no quote, space or backslash


def r(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def pw(rng: random.Random, n: int = 20) -> str:
    chars = [rng.choice(string.ascii_lowercase), rng.choice(string.ascii_uppercase),
             rng.choice(string.digits), rng.choice("!#%&*+-.:;=?^_~")]
    chars += [rng.choice(PW) for _ in range(n - 4)]
    rng.shuffle(chars)
    return "".join(chars)


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


# ------------------------------------------------------------------------- 1. secret shapes
# name -> rng -> (secrets that must not survive, text as it is written). None of these vendors
# or surroundings is in tests/redact_formats.py or tests/test_redact*.py.

Shape = Callable[[random.Random], tuple[list[str], str]]
Doc = dict[str, Any]
Routes = dict[str, tuple[int, dict[str, str], bytes]]


def _tok(prefix: str, alphabet: str, n: int, suffix: str = "") -> Shape:
    def gen(rng: random.Random) -> tuple[list[str], str]:
        t = prefix + r(rng, alphabet, n) + suffix
        return [t], t
    return gen


def _around(template: str, body: Callable[[random.Random], str]) -> Shape:
    def gen(rng: random.Random) -> tuple[list[str], str]:
        s = body(rng)
        return [s], template.format(s=s, u=_uuid(rng))
    return gen


def _sentry_org(rng: random.Random) -> tuple[list[str], str]:
    head = base64.b64encode(json.dumps({"iat": rng.randint(1, 2**31), "url": "https://sentry.io",
                                        "org": "acme"}).encode()).decode().rstrip("=")
    tail = r(rng, B64URL, 43)
    return [tail], f"sntrys_{head}_{tail}"


def _json_escaped(rng: random.Random) -> tuple[list[str], str]:
    s = "".join(rng.choice(B64) if i % 9 else "/" for i in range(1, 45))
    esc = s.replace("/", "\\/")  # PHP's json_encode, some Java serialisers
    return [s, esc], '{"id":17,"api_key":"' + esc + '","ok":true}'


def _ssh_one_line(rng: random.Random) -> tuple[list[str], str]:
    body = [r(rng, B64, 70) for _ in range(3)]
    return body, ("-----BEGIN OPENSSH PRIVATE KEY----- b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ "
                  + " ".join(body) + " -----END OPENSSH PRIVATE KEY-----")


def _wrapped(rng: random.Random) -> tuple[list[str], str]:
    s = r(rng, B62, 80)
    # a terminal or a log collector wrapped the line at 80 columns, in the middle of the token
    line = "[rank0]: export UPLOAD_TOKEN=" + s
    return [s], line[:80] + "\n" + line[80:]


def _pair(prefix: str, n1: int, n2: int) -> Shape:
    def gen(rng: random.Random) -> tuple[list[str], str]:
        a, b = prefix + r(rng, B62, n1), r(rng, B62, n2)
        return [a, b], f"{a}:{b}"
    return gen


def _double_encoded(rng: random.Random) -> tuple[list[str], str]:
    s = pw(rng, 22)
    enc = quote(quote(s, safe=""), safe="")
    return [s, quote(s, safe=""), enc], ("GET /login?next=https%3A%2F%2Falice%3A" + enc
                                         + "%40h.internal%2Fcb HTTP/1.1")


def _form(rng: random.Random) -> tuple[list[str], str]:
    s = pw(rng, 24)
    return [s, quote(s, safe="")], ("body: grant_type=client_credentials&client_id=trainer"
                                    "&client_secret=" + quote(s, safe=""))


def _teams(rng: random.Random) -> tuple[list[str], str]:
    h = r(rng, HEX, 32)
    return [h], (f"https://acme.webhook.office.com/webhookb2/{_uuid(rng)}@{_uuid(rng)}"
                 f"/IncomingWebhook/{h}/{_uuid(rng)}")


def _s3_presigned(rng: random.Random) -> tuple[list[str], str]:
    sig, tok = r(rng, HEX, 64), r(rng, B64, 120)
    return [sig, tok, quote(tok, safe="")], (
        "https://bucket.s3.amazonaws.com/ckpt/iter_0001000.pt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=ASIA" + r(rng, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)
        + "%2F20261204%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Security-Token="
        + quote(tok, safe="") + "&X-Amz-Signature=" + sig)


SHAPES: dict[str, Shape] = {
    # vendor formats with no rule in the table
    "deepseek-sk-hex32": _tok("sk-", HEX, 32),
    "perplexity": _tok("pplx-", B62, 48),
    "xai": _tok("xai-", B62, 80),
    "cerebras": _tok("csk-", LOWER_DIGITS, 48),
    "fireworks": _tok("fw_", B62, 24),
    "modal-token-secret": _tok("as-", B62, 22),
    "langsmith": lambda g: ([t := f"lsv2_pt_{r(g, HEX, 32)}_{r(g, HEX, 10)}"], t),
    "pinecone": lambda g: ([t := f"pcsk_{r(g, B62, 5)}_{r(g, B62, 60)}"], t),
    "sentry-user-token": _tok("sntryu_", HEX, 64),
    "sentry-org-token": _sentry_org,
    "flyio": _tok("fo1_", B64URL, 43),
    "supabase": _tok("sbp_", HEX, 40),
    "netlify": _tok("nfp_", B62, 36),
    "render": _tok("rnd_", B62, 32),
    "airtable-pat": lambda g: ([t := f"pat{r(g, B62, 14)}.{r(g, HEX, 64)}"], t),
    "asana-pat": lambda g: ([t := f"2/{r(g, string.digits, 16)}/{r(g, string.digits, 16)}:"
                                  f"{r(g, HEX, 32)}"], t),
    "mapbox-secret": lambda g: ([t := "sk.eyJ1IjoiYWNtZSIsImEiOiJ" + r(g, B62, 20) + "."
                                      + r(g, B64URL, 22)], t),
    "planetscale": _tok("pscale_pw_", B64URL, 43),
    "prefect": _tok("pnu_", B62, 36),
    "dynatrace": lambda g: ([t := f"dt0c01.{r(g, UPPER_DIGITS, 24)}.{r(g, UPPER_DIGITS, 64)}"],
                            t),
    "contentful": _tok("CFPAT-", B64URL, 43),
    "figma": _tok("figd_", B64URL, 40),
    "azure-devops-pat": _tok("", BASE32_LOWER, 52),
    "bitbucket-app-password": _tok("ATBB", B62, 32, "E3A1F2C9"),
    "alibaba-keyid-secret": _pair("LTAI", 20, 30),
    "tencent-secret-id": _tok("AKID", B62, 32),
    "backblaze-app-key": _tok("K005", B64, 27),
    "brevo": lambda g: ([t := f"xkeysib-{r(g, HEX, 64)}-{r(g, B62, 16)}"], t),
    "twitch-oauth": _tok("oauth:", LOWER_DIGITS, 30),
    "tailscale": lambda g: ([t := f"tskey-auth-k{r(g, B62, 17)}CNTRL-{r(g, B62, 33)}"], t),
    "ngrok": lambda g: ([t := f"2{r(g, B62, 26)}_{r(g, B62, 21)}"], t),
    "onepassword-service-account": _tok("ops_eyJ", B64URL, 200),
    "google-refresh-token": _tok("1//0", B64URL, 99),
    "slack-config-refresh": _tok("xoxe.xoxp-1-", B62, 160),
    "ngc-legacy-key": lambda g: ([t := base64.b64encode(g.randbytes(63)).decode()], t),
    "gitlab-feed-token": _tok("glft-", B64URL, 20),
    "hf-token-60-letters": _tok("hf_", string.ascii_letters, 60),
    "wandb-local-key": _tok("local-", HEX, 40),
    # secrets in the configuration and command surroundings a user pastes
    "npmrc-uuid-authtoken": _around("//registry.internal/:_authToken={s}", _uuid),
    "kaggle-json-hex-key": _around('{{"username":"alice","key":"{s}"}}',
                                   lambda g: r(g, HEX, 32)),
    "authorization-token-hex": _around("Authorization: Token {s}", lambda g: r(g, HEX, 40)),
    "kubectl-from-literal": _around("kubectl create secret generic db "
                                    "--from-literal=username=ci --from-literal=password={s}", pw),
    "kubectl-docker-registry": _around(
        "kubectl create secret docker-registry regcred --docker-server=nvcr.io "
        "--docker-username='$oauthtoken' --docker-password={s}", lambda g: r(g, B64URL, 60)),
    "aws-configure-set": _around("aws configure set aws_secret_access_key {s}",
                                 lambda g: r(g, B64, 40)),
    "hf-cli-login-unprefixed": _around("huggingface-cli login --token {s} --add-to-git-credential",
                                       lambda g: r(g, B62, 37)),
    "git-clone-oauth2": _around("git clone https://oauth2:{s}@gitlab.internal/g/r.git",
                                lambda g: r(g, B64URL, 20)),
    "git-clone-x-access-token": _around("git clone https://x-access-token:{s}@git.internal/o/r",
                                        lambda g: r(g, B62, 40)),
    "docker-run-e-password": _around("docker run -e MYSQL_ROOT_PASSWORD={s} -d mysql:8", pw),
    "docker-run-e-neutral-name": _around("docker run --rm -e APP_SEED={s} img:1",
                                         lambda g: r(g, B62, 32)),
    "ssh-private-key-one-line": _ssh_one_line,
    "python-os-environ": _around("os.environ['CO_API_KEY'] = '{s}'", lambda g: r(g, B62, 40)),
    "python-os-environ-uri": _around(
        'os.environ["MLFLOW_TRACKING_URI"] = "https://alice:{s}@mlflow.internal"', pw),
    "json-escaped-slashes": _json_escaped,
    "url-double-encoded-userinfo": _double_encoded,
    "form-body-client-secret": _form,
    "toml-uv-index-url": _around('[[tool.uv.index]]\nname = "internal"\n'
                                 'url = "https://ci:{s}@pypi.internal/simple"', pw),
    "ini-pip-conf": _around("[global]\nindex-url = https://ci:{s}@pypi.internal/simple", pw),
    "xml-maven-settings": _around("<server><id>internal</id><username>ci</username>"
                                  "<password>{s}</password></server>", pw),
    "xml-nuget-attribute": _around('<add key="ClearTextPassword" value="{s}" />', pw),
    "hcl-consul-token": _around('consul {{\n  address = "127.0.0.1:8500"\n  token = "{s}"\n}}',
                                _uuid),
    "mongodb-srv": _around("mongodb+srv://trainer:{s}@cluster0.ab1cd.mongodb.net/db"
                           "?retryWrites=true", pw),
    "redis-empty-user": _around("redis://:{s}@cache.internal:6379/0", lambda g: r(g, B62, 32)),
    "amqps-broker": _around("amqps://trainer:{s}@b-1234.mq.us-east-1.amazonaws.com:5671",
                            lambda g: r(g, B62, 24)),
    "sentry-dsn": _around("https://{s}@o123456.ingest.sentry.io/7654321",
                          lambda g: r(g, HEX, 32)),
    "azure-connection-string": _around(
        "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={s}==;"
        "EndpointSuffix=core.windows.net", lambda g: r(g, B64, 86)),
    "teams-webhook": _teams,
    "mattermost-webhook": _around("https://chat.internal/hooks/{s}",
                                  lambda g: r(g, LOWER_DIGITS, 26)),
    "ifttt-webhook": _around("https://maker.ifttt.com/trigger/done/with/key/{s}",
                             lambda g: r(g, B64URL, 22)),
    "pushover-query": _around("https://api.pushover.net/1/messages.json?token={s}&message=done",
                              lambda g: r(g, LOWER_DIGITS, 30)),
    "s3-presigned-url": _s3_presigned,
    # unfair? a line wrapped inside the token: no redaction sees the two halves as one value
    "wrapped-line-token": _wrapped,
}
UNFAIR = {"wrapped-line-token"}

ENV_NAMES = ("NCCL_FRESH_VALUE", "MEGATRON_ENV_FRESH", "SLURM_FRESH_CONF", "TORCH_FRESH_ARG",
             "FRESH_ANY")


def _flat(x: str) -> str:
    return x.replace("\n", " ")


def _logs(x: str) -> dict[str, str]:
    """Three job logs that fail on a CUDA error, each holding the text another way."""
    err = "RuntimeError: CUDA error: an illegal memory access was encountered"
    tb = ("[rank1]: Traceback (most recent call last):\n"
          '[rank1]:   File "pretrain_gpt.py", line 250, in <module>\n')
    return {
        "error-line": f"{tb}[rank1]: {err} ({_flat(x)})\n",
        "json-record": json.dumps({"level": "error", "rank": 1, "msg": err, "detail": x}) + "\n",
        "line-before": f"[rank1]: using config {_flat(x)}\n{tb}[rank1]: {err}\n",
    }


def leaked(out: str, secrets: list[str]) -> bool:
    for s in secrets:
        if len(s) <= 12:
            if s in out:
                return True
            continue
        if any(s[i:i + 12] in out for i in range(len(s) - 11)):
            return True
    return False


def _base_env(home: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "UV_PYTHON_DOWNLOADS")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1", PIP_CONFIG_FILE=os.devnull,
               NO_COLOR="1")
    return env


def run_cli(tree: Path, args: list[str], env: dict[str, str], timeout: float = 60) -> Doc:
    env = {**env, "PYTHONPATH": str(tree)}
    try:
        p = subprocess.run([sys.executable, "-m", "megatron_env", *args], cwd=tree, env=env,
                           capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        return {"rc": p.returncode, "out": p.stdout + p.stderr}
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (
            e.stdout or "")
        return {"rc": "timeout", "out": out}


def _one_shape(tree: Path, name: str, seed: int, snap_base: Path) -> Doc:
    rng = random.Random(f"{seed}:{name}")
    secrets, x = SHAPES[name](rng)
    with tempfile.TemporaryDirectory(prefix="fresh-") as td:
        tmp = Path(td)
        (tmp / "home").mkdir()
        base = _base_env(tmp / "home")
        env = {**base, **{k: x for k in ENV_NAMES}}
        outs: dict[str, str] = {}
        outs["report"] = run_cli(tree, ["report"], env)["out"]
        outs["report --json"] = run_cli(tree, ["report", "--json"], env)["out"]
        c = run_cli(tree, ["collect", "--out", str(tmp / "c")], env)
        outs["collect"] = c["out"] + "".join(
            f.read_text(errors="replace") for f in sorted((tmp / "c").glob("*")) if f.is_file())
        outs["check --json"] = run_cli(tree, ["check", "--json"], env)["out"]
        snap = tmp / "snap"
        subprocess.run(["cp", "-a", str(snap_base), str(snap)], check=True)
        # a raw `env > env.txt` (what a user hands over), not one written by collect
        (snap / "env.txt").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        outs["check --json --snapshot"] = run_cli(
            tree, ["check", "--json", "--snapshot", str(snap)], base)["out"]
        for form, text in _logs(x).items():
            log = tmp / f"{form}.log"
            log.write_text(text)
            outs[f"triage [{form}]"] = run_cli(tree, ["triage", str(log)], base)["out"]
            outs[f"triage --json [{form}]"] = run_cli(tree, ["triage", str(log), "--json"],
                                                      base)["out"]
    leaks = {cmd: leaked(out, secrets) for cmd, out in outs.items()}
    # the planted text reached the output (masked or not): a cell where it did not proves nothing
    reached = {cmd: ("illegal memory access" if cmd.startswith("triage") else "FRESH_") in out
                    and ("line-before" not in cmd) for cmd, out in outs.items()}
    # what was printed, the secret replaced by its shape's name: for the report to developers
    shown = {}
    for cmd, out in outs.items():
        if leaks[cmd]:
            lines = [ln for ln in out.splitlines() if leaked(ln, secrets)]
            text = "\n".join(lines[:3])
            for s in sorted(secrets, key=len, reverse=True):
                text = text.replace(s, f"<{name}>")
            for s in secrets:  # partial windows left: mark them too
                for i in range(max(0, len(s) - 11)):
                    w = s[i:i + 12]
                    if w in text:
                        text = text.replace(w, f"<12+ chars of {name}>")
            shown[cmd] = text[:600]
    return {"shape": name, "unfair": name in UNFAIR, "cells": len(outs),
            "leaked_in": sorted(c for c, v in leaks.items() if v),
            "not_reached": sorted(c for c, v in reached.items() if not v), "printed": shown}


# ----------------------------------------------------------------- harmless real values
# Lines from public threads, cited; none from tests/fixtures.

HARMLESS_SOURCES: dict[str, str] = {
    "https://github.com/NVIDIA/nccl/issues/952": """\
<cluster_name>:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read
<cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
<cluster_name>:921:1146 [2] NCCL INFO Channel 00/0 : 10[2] -> 9[1] via P2P/IPC/read
<cluster_name>:924:1152 [5] NCCL INFO Channel 00/0 : 13[5] -> 12[4] via P2P/IPC/read""",
    "https://github.com/NVIDIA/nccl/issues/687": """\
cosmos-hpc-100a45:985927:986028 [3] NCCL INFO Channel 00 : 3[4a000] -> 6[44000] [send] via NET/IB/0/GDRDMA
cosmos-hpc-100a45:985925:986027 [1] NCCL INFO Channel 00 : 1[a000] -> 0[7000] via P2P/IPC/read
cosmos-hpc-100a55:3138488:3138580 [0] NCCL INFO Channel 01 : 4[7000] -> 7[4a000] via P2P/IPC/read
cosmos-hpc-100a55:3138491:3138597 [3] NCCL INFO Channel 00 : 7[4a000] -> 2[44000] [send] via NET/IB/0/GDRDMA
cosmos-hpc-100a45:985924:986013 [0] NCCL INFO Connected all rings
cosmos-hpc-100a55:3138488:3138580 [0] NCCL INFO Connected all rings""",
    "https://github.com/NVIDIA/nccl/issues/398": """\
ip-172-31-0-112:8166:8166 [7] ofi_init:700 NCCL WARN NET/OFI Only EFA provider is supported
ip-172-31-0-112:8162:8162 [3] NCCL INFO NET/IB : No device found.
ip-172-31-0-112:8162:8162 [3] NCCL INFO NET/Socket : Using [0]ens5:172.31.0.112<0>
ip-172-31-0-112:8159:8218 [0] NCCL INFO Setting affinity for GPU 0 to ffffffff,ffffffff,ffffffff
ip-172-31-0-112:8159:8218 [0] NCCL INFO NCCL_TREE_THRESHOLD set by environment to 0.
ip-172-31-13-129:8537:8596 [0] NCCL INFO Setting affinity for GPU 0 to ffffffff,ffffffff,ffffffff""",
    "https://github.com/NVIDIA/nccl/issues/514": """\
ip-172-31-0-226:4886:4946 [0] NCCL INFO Channel 00/08 :    0   7   6   5   4   3   2   1   8  15  14  13  12  11  10   9  16  23  22  21
ip-172-31-0-226:4886:4946 [0] NCCL INFO Channel 01/08 :    0   3  10  15  14  13  12   9   8  11  18  23  22  21  20  17  16  19  26  31""",
    "https://github.com/NVIDIA/nccl/issues/1412": """\
swat1-04:2017630:2017671 [2] NCCL INFO Init timings: rank 2 nranks 16 total 1.08 (kernels 0.51, bootstrap 0.22, allgathers 0.01, topo 0.28, graphs 0.04, connections 0.02, rest 0.01)
swat1-04:2017630:2017675 [6] NCCL INFO ncclCommInitRank comm 0x8ec0ac0 rank 6 nranks 16 cudaDev 6 nvmlDev 6 busId c8000 commId 0x49bbd7790311d5eb - Init COMPLETE
swat1-04:2017630:2017673 [4] NCCL INFO ncclCommInitRank comm 0x8e48640 rank 4 nranks 16 cudaDev 4 nvmlDev 4 busId 88000 commId 0x49bbd7790311d5eb - Init COMPLETE
swat1-04:2017630:2017669 [0] NCCL INFO ncclCommInitRank comm 0x8d57d40 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 7000 commId 0x49bbd7790311d5eb - Init COMPLETE
swat1-04:2017630:2017670 [1] NCCL INFO ncclCommInitRank comm 0x8d93f80 rank 1 nranks 16 cudaDev 1 nvmlDev 1 busId b000 commId 0x49bbd7790311d5eb - Init COMPLETE""",
    "https://github.com/NVIDIA/nccl/issues/300": """\
[1,0]<stdout>:5873af64cf59:10158:10560 [0] NCCL INFO Bootstrap : Using [0]lo:127.0.0.1<0>
[1,0]<stdout>:5873af64cf59:10158:10560 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
[1,0]<stdout>:NCCL version 2.5.6+cuda10.2
[1,3]<stdout>:5873af64cf59:10161:10551 [3] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>""",
    "https://github.com/NVIDIA/nccl/issues/302": """\
[155] crow-ib-new-nccl-256-info-19:5330:5330 [3] NCCL INFO Bootstrap : Using [0]eth0:10.100.62.64<0>
[155] crow-ib-new-nccl-256-info-19:5330:5330 [3] NCCL INFO NET/IB : Using [0]mlx5_1:1/IB [1]mlx5_3:1/IB [2]mlx5_0:1/IB [3]mlx5_2:1/RoCE [4]mlx5_4:1/IB ; OOB eth0:10.100.62.64<0>
[155] crow-ib-new-nccl-256-info-19:5330:5499 [3] NCCL INFO Setting affinity for GPU 3 to 0fffff00,000fffff
[155] crow-ib-new-nccl-256-info-19:5330:5499 [3] NCCL INFO threadThresholds 8/8/64 | 2048/8/64
[155] crow-ib-new-nccl-256-info-19:5330:5499 [3] NCCL INFO Trees [0] 154/-1/-1->155->153|153->155->154/-1/-1 [1] 153/-1/-1->155->154|154->155->153/-1/-1
[155] crow-ib-new-nccl-256-info-19:5330:5499 [3] NCCL INFO Ring 00 : 155[3d000] -> 157[b2000] via P2P/IPC""",
    "https://github.com/NVIDIA/nccl/issues/1066": """\
gcn6:1080060:1080060 [0] NCCL INFO Bootstrap : Using eno1np0:172.18.62.6<0>
gcn6:1080060:1080060 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/RoCE [RO]; OOB eno1np0:172.18.62.6<0>
NCCL version 2.12.12+cuda11.7
gcn6:1080061:1080359 [0] misc/nvmlwrap.cc:181 NCCL WARN nvmlDeviceGetHandleByPciBusId() failed: Not Found
gcn6:1080061:1080359 [0] NCCL INFO Setting affinity for GPU 0 to 0f,fffc0000
gcn6:1080061:1080359 [0] NCCL INFO Trees [0] -1/-1/-1->1->0 [1] 0/-1/-1->1->-1""",
    "https://github.com/NVIDIA/nccl/issues/983": """\
e0a95b6643f4:12381:12391 [0] NCCL INFO                             + NET[12.5] - NET/2 (88b97a0003a1420c/1/12.500000)
e0a95b6643f4:12381:12391 [0] NCCL INFO + SYS[9.0] - CPU/0
e0a95b6643f4:12381:12391 [0] NCCL INFO GPU/1A000 :GPU/1A000 (0/5000.000000/LOC) CPU/0 (2/12.000000/PHB) CPU/1 (3/9.000000/SYS) NET/0 (5/12.000000/PHB)""",
    "https://github.com/thunderbird/thunderbird-website/issues/48": """\
Collecting staticjinja from https://github.com/Ceasar/staticjinja/archive/3476a3977a5dc67b24cd6a9eff874e2cfbc1d35d.tar.gz#egg=staticjinja (from -r requirements.txt (line 1))
  Using cached https://files.pythonhosted.org/packages/7f/ff/ae64bacdfc95f27a016a7bed8e8686763ba4d277a78ca76f32659220a731/Jinja2-2.10-py2.py3-none-any.whl
  Using cached https://files.pythonhosted.org/packages/9a/35/d86c6d3bd31e2e9c8351c8766ef3688c75d56bc5233ed49061e522efc3cc/webassets-0.12.1.tar.gz
  Using cached https://files.pythonhosted.org/packages/b8/ad/c6f60602d3ee3d92fbed87675b6fb6a6f9a38c223343ababdb44ba201f10/Babel-2.6.0-py2.py3-none-any.whl
  Using cached https://files.pythonhosted.org/packages/40/4a/893f8ee79460865f5bafb8a8fa90cbc5b099585cedbe9179c83511aab319/WebOb-1.7.3-py2.py3-none-any.whl""",
    "https://github.com/linkedin/qark/issues/292": """\
        Expected sha256 151b7eefd035c56b2b2e1eb9963c90c6302dc15fbd8c1c0a83a163ff2c7d7743
        Expected     or 1553d1e99f035ace1c0544050622b7bc963374a00c467edafac50ad7bd276aef
        Expected     or 1b0493c091a1898f1136e3f4f991a784437fac3673780ff9de3bcf46c80b6b50
        Expected     or 2ba8a45822b7aee805ab49abfe7eec16b90587f7f26df20c71dd89e45a97076f""",
    "https://github.com/SatSale/SatSale/pull/87": """\
    Jinja2<3.0,>=2.10.1 from https://files.pythonhosted.org/packages/7e/c2/1eece8c95ddbc9b1aeb64f5783a9e07a286de42191b7204d67b7496ddf35/Jinja2-2.11.3-py2.py3-none-any.whl#sha256=03e47ad063331dd6a3f04a43eddca8a966a26ba0c5b7207a9a9e4e08f1b29419 (from Flask==1.1.4->-r requirements.txt (line 5))""",
    "https://github.com/noes14155/Telegrambot-with-GPT/issues/36": """\
        Expected sha256 29653ffc526b4b2485130b71f38bc43b75ad1b6898b3fe8d99ba456db9a102a3
             Got        bd7b1ae7297cec3ac2e9d457c962ccf0cd5112c7d6bd93344921a27fb260ccbc""",
    "https://github.com/pypa/pipenv/issues/5466": """\
An error occurred while installing idna==3.4 ; python_version >= '3.5' --hash=sha256:814f528e8dead7d329833b91c5faa87d60bf71824cd12a7530b5526063d02cb4 --hash=sha256:90b77e79eaa3eba6de819a0c442c0b4ceefc341a7a2ab77d7562bf49f425c5c2! Will try again.
An error occurred while installing requests==2.28.1 ; python_version >= '3.7' and python_version < '4' --hash=sha256:8fefa2a1a1365bf5520aac41836fbee479da67864514bdb821f31ce07ce65349 --hash=sha256:7c5599b102feddaa661c826c56ab4fee28bfd17f5abca1ebbe3e7f19d7c97983! Will try again.
An error occurred while installing robotframework==6.0.1 --hash=sha256:b2d9a82912dfd27aae7afaad64771c58f5d948ca9d64e3ae72b16721b5e022ea --hash=sha256:5f665413845dfea603de1ed0d0ba8928748ccd2f9a558889822916d778731fbb! Will try again.""",
    "https://github.com/tomquist/AstraMeter/issues/158": """\
[pipenv.exceptions.InstallError]:   Using cached https://www.piwheels.org/simple/jsonpath-ng/jsonpath_ng-1.7.0-py3-none-any.whl (30 kB)
[pipenv.exceptions.InstallError]:     jsonpath-ng==1.7.0 from https://www.piwheels.org/simple/jsonpath-ng/jsonpath_ng-1.7.0-py3-none-any.whl#sha256=2448bb37fe9635efaf83ea120ff2f936e76bcc5c3f02002c2bcca1784948129d (from -r /tmp/pipenv-ukgjj10v-requirements/pipenv-gb_uxmxo-hashed-reqs.txt (line 4)):
[pipenv.exceptions.InstallError]:         Expected sha256 898c93fc173f0c336784a3fa63d7434297544b7198124a68f9a3ef9597b0ae6e
[pipenv.exceptions.InstallError]:              Got        2448bb37fe9635efaf83ea120ff2f936e76bcc5c3f02002c2bcca1784948129d""",
    "https://github.com/runpod-workers/worker-stable_diffusion_v1/issues/17": """\
102.6         Expected sha256 402f40adfc6f418f9dae9ab402e773cfed9beae52333f6d86ae3107a1b9527e7
102.6              Got        a61ed6be3ef0c42ee7c1cdad1eaf95b1b99bc5c713f1283e3aa907a8723dda80""",
    "https://github.com/abey79/vsketch/issues/144": """\
    PySide2<6.0.0,>=5.15.2 from https://files.pythonhosted.org/packages/81/73/830023aa8f06d9b04bf45146fd95f1a0f8644f196713fe98bc678e35ab6c/PySide2-5.15.2-5.15.2-cp35.cp36.cp37.cp38.cp39-none-win_amd64.whl#sha256=1316aa22dd330df096daf7b0defe9c00297a66e0b4907f057aaa3e88c53d1aff (from vsketch):
             Got        7b87ec873f61ed69045ba1599e4e9ad6fc8a3aad60470168c701bd5b2d04725a""",
    "https://github.com/pydantic/pydantic/issues/6004": """\
    pydantic!=1.7,!=1.7.1,!=1.7.2,!=1.7.3,!=1.8,!=1.8.1,<2.0.0,>=1.6.2 from https://files.pythonhosted.org/packages/e7/a3/329824b0e46edcb2c51f0fa73678f24aba083289697a0db3036f4f30e1ed/pydantic-1.10.8-cp39-cp39-macosx_10_9_x86_64.whl (from fastapi):
        Expected sha256 3e59417ba8a17265e632af99cc5f35ec309de5980c440c255ab1ca3ae96a3e0e
             Got        7ea23932f08249b40c8f7153e9f7006c5a30c85fe3eb79910b58cc5bdcf624dc""",
    "https://github.com/pypi/warehouse/issues/1056": """\
    https://github.com/dstufft/pyramid_debugtoolbar/archive/no-inline.zip#egg=pyramid_debugtoolbar --hash=sha256:c9f39f5434661ae238f9113faea235be5902331a04e54497a680f893212dad41
    pip-tools>=1.0 from https://pypi.python.org/packages/py2.py3/p/pip-tools/pip_tools-1.6-py2.py3-none-any.whl#md5=ba5581892a6966aec3a5128819ce6bc7 (from -r requirements/dev.txt (line 1))""",
    "https://github.com/kubernetes/kubernetes/issues/17460": """\
NAME                  READY     STATUS             RESTARTS   AGE
elasticsearch-attiy   0/1       CrashLoopBackOff   25         1h
elasticsearch-lkl4i   0/1       CrashLoopBackOff   25         1h
frontend-81lqv        1/1       Running            0          1h
frontend-ddanc        1/1       Running            0          1h
Image(s):                       eu.gcr.io/foo/foo_elasticsearch:latest
Node:                           gke-small-cluster-7834f89-node-wke5/10.210.0.1""",
    "https://github.com/portainer/portainer/issues/5314": """\
name:         centos-new-6846f658db-w4qhj
Node:         k-master/81.27.98.186
              pod-template-hash=6846f658db
Annotations:  cni.projectcalico.org/podIP: 10.1.73.142/32
Controlled By:  ReplicaSet/centos-new-6846f658db
    Container ID:   containerd://bb2ef7c54ebaa63d601705ac318660308d0364fa99113042cc3ad1c610ae7e44
    Image ID:       docker.io/library/centos@sha256:5528e8b1b1719d34604c87e11dcd1c0a20bedf46e83b5632cdeac91b8c04efc1
      Started:      Wed, 14 Jul 2021 19:52:22 +0000
      /var/run/secrets/kubernetes.io/serviceaccount from kube-api-access-cjw6x (ro)""",
    "https://github.com/tarantool/tarantool-operator/pull/88": """\
     Normal   Pulling           39m                    kubelet, minikube  Pulling image "vanyarock01/test-app:0.1.0-1-g4577716"
     Normal   Created           37m (x5 over 39m)      kubelet, minikube  Created container pim-storage
     Warning  BackOff           4m25s (x157 over 38m)  kubelet, minikube  Back-off restarting failed container""",
    "https://github.com/kubernetes/kubernetes/issues/67063": """\
ova-tiller-binding-kube-oketest  11m
ova-admin       NodePort  10.96.41.43    <none>       8080:30638/TCP   11m
ova-memcached1  NodePort  10.96.78.45    <none>       11211:30606/TCP  11m""",
    "https://github.com/kubernetes/kubernetes/issues/49873": """\
Annotations:    kubernetes.io/created-by={"kind":"SerializedReference","apiVersion":"v1","reference":{"kind":"ReplicationController","namespace":"default","name":"my-tengine-v2","uid":"8cf90c68-75f3-11e7-b80d-6c92bf4...
    Container ID:       docker://4a00fbf3fe812a0473a9c90e583b613eb1c2c2cf89203925ab7e5f2b0deea722
    Image ID:           docker-pullable://bj01rg.jcloud.com:5000/tengine-2.2.0@sha256:f0b1bf5909ca06c3b77fa6c7fe43f0ed6c8d014d57ad533fc3e284fda4efd3b9""",
    "https://github.com/wolfcw/libfaketime/issues/79": """\
6m          6m         1         jenkins1-controller-pca1x   Pod       spec.containers{jenkins1}           Created   {kubelet kn01.dwpptp.londondc.com}   Created with docker id c67b4f729dd6
5h          1m         74        jenkins1-controller-pca1x   Pod       spec.containers{jenkins1}           Pulled    {kubelet kn01.dwpptp.londondc.com}   Container image "gf01:5000/jenkins:1.592" already present on machine
W0105 13:26:02.546595    4300 cmd.go:182] log is DEPRECATED and will be removed in a future version.""",
}


def harmless_values() -> list[tuple[str, str]]:
    """(source, value): each line, and each whitespace-separated word of 8+ characters."""
    out: list[tuple[str, str]] = []
    for src, block in HARMLESS_SOURCES.items():
        for line in block.splitlines():
            out.append((src, line))
            out += [(src, w) for w in line.split() if len(w) >= 8]
    seen: set[str] = set()
    unique = []
    for s, v in out:
        if v not in seen:
            seen.add(v)
            unique.append((s, v))
    return unique


def masked_chars(value: str, out: str) -> int:
    """Characters of `value` that do not come through in `out` (a mask replaced them)."""
    if value in out:
        return 0
    m = difflib.SequenceMatcher(None, value, out, autojunk=False)
    return len(value) - sum(b.size for b in m.get_matching_blocks())


_REDACT = """
import json, sys
from megatron_env import redact
vals = json.load(sys.stdin)
print(json.dumps([redact.text(v, {}) for v in vals]))
"""


def harmless(tree: Path) -> Doc:
    vals = harmless_values()
    texts = [v for _, v in vals]
    p = subprocess.run([sys.executable, "-c", _REDACT], input=json.dumps(texts), text=True,
                       cwd=tree,
                       capture_output=True, env={**os.environ, "PYTHONPATH": str(tree),
                                                 "PYTHONDONTWRITEBYTECODE": "1"}, check=True)
    redacted = json.loads(p.stdout)
    masked_text = [(v, o, masked_chars(v, o)) for v, o in zip(texts, redacted, strict=True)]
    # the single-line values as variables through `report --json`
    lines = [v for v in texts if "\n" not in v][:400]
    with tempfile.TemporaryDirectory(prefix="fresh-h-") as td:
        env = _base_env(Path(td)) | {f"NCCL_HARMLESS_{i}": v for i, v in enumerate(lines)}
        rep = run_cli(tree, ["report", "--json"], env)["out"]
    try:
        doc = json.loads(rep[rep.index("{"):rep.rindex("}") + 1])
        got = doc.get("variables", {})
    except ValueError:
        got = {}
    masked_report = [(v, got.get(f"NCCL_HARMLESS_{i}", ""), masked_chars(
        v, str(got.get(f"NCCL_HARMLESS_{i}", "")))) for i, v in enumerate(lines)]
    def summary(rows: list[tuple[str, str, int]]) -> Doc:
        bad = [{"value": v, "printed": o, "masked_chars": n} for v, o, n in rows if n]
        return {"values": len(rows), "chars": sum(len(v) for v, _, _ in rows),
                "values_changed": len(bad), "chars_masked": sum(n for _, _, n in rows),
                "changed": bad}
    return {"sources": sorted(HARMLESS_SOURCES), "redact.text": summary(masked_text),
            "report --json variables": summary(masked_report)}


# ---------------------------------------------------------------------------- 2. redirects

class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def _serve(host: str, routes: Routes, log: list[Doc],
           tls: ssl.SSLContext | None = None) -> _Server:
    class H(http.server.BaseHTTPRequestHandler):
        def _any(self) -> None:
            addr = self.server.server_address
            port = addr[1] if isinstance(addr, tuple) else addr
            log.append({"server": f"{host}:{port}", "path": self.path,
                        "authorization": self.headers.get("Authorization")})
            code, headers, body = routes.get(self.path.split("?")[0], (404, {}, b""))
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        do_GET = do_HEAD = _any

        def log_message(self, *a: object) -> None:
            pass
    srv = _Server((host, 0), H)
    if tls:
        srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


_FETCH = """
import sys, hashlib
from pathlib import Path
from megatron_env.sources import index, index_config
from megatron_env.errors import UserError
cfg = index_config.configured()
try:
    f = index.fetch("freshpkg", "freshpkg-1.0.tar.gz", sys.argv[1], Path(sys.argv[2]), cfg)
    print("fetched", hashlib.sha256(Path(sys.argv[2]).read_bytes()).hexdigest() == sys.argv[1])
except UserError as e:
    print("error:", e)
"""


def redirects(tree: Path) -> Doc:
    import hashlib
    payload = b"fresh sdist bytes\n"
    sha = hashlib.sha256(payload).hexdigest()
    user, password = "ci", "Fr3sh-" + r(random.Random(7), B62, 20)
    given = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    results = []
    scenarios = ["page A->B (other host+port)", "page A->C (same host, other port)",
                 "file A->B (CDN)", "page A->B->A (chain back)", "file A->B->C->A (chain back)",
                 "https page A->http B", "https file A->http C (same host, other port)"]
    certdir = Path(tempfile.mkdtemp(prefix="fresh-tls-"))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(certdir / "key.pem"), "-out", str(certdir / "cert.pem"),
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certdir / "cert.pem", certdir / "key.pem")
    for sc in scenarios:
        log: list[Doc] = []
        a_routes: Routes = {}
        b_routes: Routes = {}
        c_routes: Routes = {}
        https = sc.startswith("https")
        a = _serve("127.0.0.1", a_routes, log, tls if https else None)
        b = _serve("127.0.0.2", b_routes, log)
        c = _serve("127.0.0.1", c_routes, log)
        scheme = "https" if https else "http"
        A = f"{scheme}://127.0.0.1:{a.server_address[1]}"
        B = f"http://127.0.0.2:{b.server_address[1]}"
        C = f"http://127.0.0.1:{c.server_address[1]}"
        page = "/simple/freshpkg/"
        def listing(base: str) -> bytes:
            return (f'<html><body><a href="{base}/files/freshpkg-1.0.tar.gz#sha256={sha}">'
                    "freshpkg-1.0.tar.gz</a></body></html>").encode()
        html = {"Content-Type": "text/html"}
        wheel = (200, {"Content-Type": "application/octet-stream"}, payload)
        if sc.startswith("https page"):
            a_routes[page] = (302, {"Location": B + page}, b"")
            b_routes[page] = (200, html, listing(B))
            b_routes["/files/freshpkg-1.0.tar.gz"] = wheel
        elif sc.startswith("https file"):
            a_routes[page] = (200, html, listing(A))
            a_routes["/files/freshpkg-1.0.tar.gz"] = (302, {"Location": C + "/plain/x"}, b"")
            c_routes["/plain/x"] = wheel
        elif sc.startswith("page A->B->A"):
            a_routes[page] = (302, {"Location": B + "/mirror/freshpkg/"}, b"")
            b_routes["/mirror/freshpkg/"] = (302, {"Location": A + "/real/freshpkg/"}, b"")
            a_routes["/real/freshpkg/"] = (200, html, listing(A))
            a_routes["/files/freshpkg-1.0.tar.gz"] = wheel
        elif sc.startswith("page A->B"):
            a_routes[page] = (301, {"Location": B + page}, b"")
            b_routes[page] = (200, html, listing(B))
            b_routes["/files/freshpkg-1.0.tar.gz"] = wheel
        elif sc.startswith("page A->C"):
            a_routes[page] = (302, {"Location": C + page}, b"")
            c_routes[page] = (200, html, listing(C))
            c_routes["/files/freshpkg-1.0.tar.gz"] = wheel
        elif sc.startswith("file A->B->C->A"):
            a_routes[page] = (200, html, listing(A))
            a_routes["/files/freshpkg-1.0.tar.gz"] = (302, {"Location": B + "/cdn/x"}, b"")
            b_routes["/cdn/x"] = (307, {"Location": C + "/cdn/y"}, b"")
            c_routes["/cdn/y"] = (302, {"Location": A + "/blob/freshpkg-1.0.tar.gz"}, b"")
            a_routes["/blob/freshpkg-1.0.tar.gz"] = wheel
        else:  # file A->B
            a_routes[page] = (200, html, listing(A))
            a_routes["/files/freshpkg-1.0.tar.gz"] = (302, {"Location": B + "/cdn/freshpkg"},
                                                      b"")
            b_routes["/cdn/freshpkg"] = wheel
        with tempfile.TemporaryDirectory(prefix="fresh-r-") as td:
            env = _base_env(Path(td)) | {
                "PIP_INDEX_URL": f"{scheme}://{user}:{password}@127.0.0.1:{a.server_address[1]}"
                                 "/simple", "PYTHONPATH": str(tree), "NO_PROXY": "*",
                "PIP_CERT": str(certdir / "cert.pem")}
            p = subprocess.run([sys.executable, "-c", _FETCH, sha, str(Path(td) / "out.tgz")],
                               env=env, capture_output=True, text=True, timeout=60, cwd=tree)
        for s in (a, b, c):
            s.shutdown()
            s.server_close()
        a_name = f"127.0.0.1:{a.server_address[1]}"
        elsewhere = [x for x in log if x["server"] != a_name and x["authorization"]]
        leaked = [x for x in elsewhere if x["authorization"] == given]
        results.append({
            "scenario": sc, "outcome": (p.stdout + p.stderr).strip()[-300:].replace(
                password, "<password>"),
            "requests": [{**x, "authorization": None if not x["authorization"] else
                          ("the user's credentials" if x["authorization"] == given else "other"),
                          "server": "A" if x["server"] == a_name else
                          "B" if x["server"].startswith("127.0.0.2") else "C"} for x in log],
            "credentials_sent_elsewhere": len(leaked),
            # an https -> http redirect is to be refused: any request over plain http counts
            "plain_http_requests_after_https": sum(
                1 for x in log if https and x["server"] != a_name) if https else None})
    subprocess.run(["rm", "-rf", str(certdir)], check=True)
    return {"cases": len(results), "credentials_sent_elsewhere": sum(
        x["credentials_sent_elsewhere"] for x in results),
        "https_to_http_followed": sum(bool(x["plain_http_requests_after_https"]) for x in results),
        "scenarios": results}


# -------------------------------------------------------------------------------- 3. files

def files(tree: Path, snap_base: Path) -> Doc:
    cases: list[Doc] = []
    with tempfile.TemporaryDirectory(prefix="fresh-f-") as td:
        tmp = Path(td)
        env = _base_env(tmp / "home")
        (tmp / "home").mkdir()

        def snap_case(name: str, altered: str, change: Callable[[Path], object]) -> None:
            d = tmp / f"snap{len(cases)}"  # a neutral name: the output may print the path
            subprocess.run(["cp", "-a", str(snap_base), str(d)], check=True)
            change(d)
            res = run_cli(tree, ["check", "--json", "--snapshot", str(d)], env)
            out = res["out"]
            # a verdict (exit 0 or 1: findings) given without naming the altered file
            named = altered in out
            cases.append({"case": name, "command": "check --json --snapshot", "rc": res["rc"],
                          "names_the_file": named,
                          "trusted": res["rc"] in (0, 1) and not named,
                          "printed": out.strip()[-400:]})

        snap_case("snapshot-without-meta.json", "meta.json", lambda d: (d / "meta.json").unlink())
        snap_case("snapshot-meta.json-truncated", "meta.json", lambda d: (d / "meta.json")
                  .write_text((d / "meta.json").read_text()[:40]))
        snap_case("snapshot-nvcc-version-truncated", "nvcc-version.txt",
                  lambda d: (d / "nvcc-version.txt").write_text(
                      (d / "nvcc-version.txt").read_text()[:30]))
        snap_case("snapshot-nvml.json-truncated", "nvml.json", lambda d: (d / "nvml.json")
                  .write_text((d / "nvml.json").read_text()[:25]))
        snap_case("snapshot-env.txt-binary", "env.txt", lambda d: (d / "env.txt").write_bytes(
            bytes(range(256)) * 4))

        # setup's step stamp (<prefix>.setup/lock.json), read by `report` and by `setup`
        # (--dry-run: it reads every stamp and runs nothing)
        def stamp_case(name: str, make: Callable[[Path], object]) -> None:
            for args in (["report", "--json", "--prefix"], ["setup", "--dry-run", "--json",
                                                             "--prefix"]):
                prefix = tmp / f"p{len(cases)}" / "env"
                (prefix / "bin").mkdir(parents=True)
                stamps = prefix.with_name("env.setup")
                stamps.mkdir()
                make(stamps / "lock.json")
                before = sorted(os.listdir(stamps))
                res = run_cli(tree, [*args, str(prefix)], env, timeout=20)
                left = sorted(set(os.listdir(stamps)) - set(before))
                out = res["out"]
                bug = res["rc"] in (70, "timeout") or "Traceback" in out
                named = "lock.json" in out
                cases.append({"case": f"stamp-{name}", "command": " ".join(args) + " P",
                              "rc": res["rc"], "bug_or_hang": bug, "names_the_file": named,
                              "left_behind": left, "trusted": bool(bug or not named),
                              "printed": out.strip()[-400:]})

        stamp_case("nested-list-100000", lambda p: p.write_text("[" * 100000 + "]" * 100000))
        stamp_case("nested-object-100000", lambda p: p.write_text('{"a":' * 100000 + "1"
                                                                    + "}" * 100000))
        stamp_case("directory", lambda p: p.mkdir())
        stamp_case("fifo", lambda p: os.mkfifo(p))
        stamp_case("binary", lambda p: p.write_bytes(random.Random(3).randbytes(4096)))
        stamp_case("json-list", lambda p: p.write_text('["digest", "0123456789abcdef"]'))
        stamp_case("digest-not-a-string", lambda p: p.write_text('{"digest": [1, 2]}'))
    return {"cases": len(cases), "trusted": sum(c["trusted"] for c in cases), "results": cases,
            "not_tried": "a real `bundle --with-builds` run (it needs the profile's lock wheels;"
                         " the slot choice it calls is measured instead)"}


_CACHE_WHEEL = """
import hashlib, io, json, os, sys, zipfile
from pathlib import Path
cache = Path(sys.argv[1])
os.environ["MEGATRON_ENV_CACHE"] = str(cache)
from megatron_env import digest, profile
from megatron_env.bundle import make
from megatron_env.kernels import build
from megatron_env.sources import patches
prof = profile.load("core_v0.19.0-cu130")
pkg = next(iter(build.packages(prof).values()))
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w") as z:  # a real (small) wheel: module, METADATA, RECORD
    z.writestr(pkg.name + "/__init__.py", "x = 1\\n")
    z.writestr(pkg.name + "-1.0.dist-info/METADATA", "Name: " + pkg.name + "\\nVersion: 1.0\\n")
    z.writestr(pkg.name + "-1.0.dist-info/RECORD", "")
wheel = buf.getvalue()
key = {"source": pkg.source.digest, "python": make.py_tag(prof.python), "cuda": prof.cuda,
       "patches": digest.of_files(patches.series(pkg.name, pkg.pin)),
       "torch": prof.torch + "+cu130", "archs": sorted(prof.archs) if pkg.cuda else [],
       "cxx11_abi": 1, "switches": pkg.switches, "build_options": list(pkg.build_options)}
slot = cache / "wheels" / (pkg.name + "-fresh")
slot.mkdir(parents=True)
whl = slot / (pkg.name + "-1.0-cp312-cp312-linux_x86_64.whl")
whl.write_bytes(wheel)
(slot / "meta.json").write_text(json.dumps({"key": key,
                                            "wheel_sha256": hashlib.sha256(wheel).hexdigest()}))
before = [a for a, _ in make._builds(prof)]
data = bytearray(wheel)
data[len(data) // 2] ^= 1  # one byte changed after the build recorded it
whl.write_bytes(bytes(data))
after = [a for a, _ in make._builds(prof)]
print(json.dumps({"kernel": pkg.name, "taken_intact": bool(before), "taken_altered": bool(after),
                  "slot_left": slot.exists()}))
"""


def cache_wheel(tree: Path) -> Doc:
    """A cached kernel wheel with one byte changed: does the slot choice of `bundle
    --with-builds` (bundle.make._builds, called in-process: a real bundle needs the profile's
    lock wheels) still take it?"""
    with tempfile.TemporaryDirectory(prefix="fresh-c-") as td:
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        p = subprocess.run([sys.executable, "-c", _CACHE_WHEEL, td], cwd=tree, env=env,
                           capture_output=True, text=True, timeout=120)
    try:
        res = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"case": "cache-wheel-one-byte-changed", "error": (p.stdout + p.stderr)[-600:]}
    return {"case": "cache-wheel-one-byte-changed", "command": "bundle.make._builds (in-process)",
            **res, "trusted": res["taken_altered"]}


# ------------------------------------------------------------------------------------- main

def _snapshot_base(tree: Path, where: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="fresh-s-") as home:
        res = run_cli(tree, ["collect", "--out", str(where)], _base_env(Path(home)))
    if not (where / "meta.json").exists():
        raise SystemExit(f"collect did not write a snapshot: {res['out'][-300:]}")
    return where


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", default=str(ROOT), help="source tree to measure")
    ap.add_argument("--only", default="secrets,harmless,redirects,files")
    ap.add_argument("--seed", type=int, default=20261204)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--revision", help="the tree's revision, when it is an export, not a checkout")
    a = ap.parse_args()
    tree = Path(a.tree).resolve()
    only = set(a.only.split(","))
    rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() if not a.revision \
        else a.revision
    doc: Doc = {"tree": "this checkout" if tree == ROOT else "another tree", "revision": rev or "not a git checkout",
                 "python": sys.version.split()[0], "seed": a.seed}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="fresh-base-") as td:
        snap = _snapshot_base(tree, Path(td) / "snap")
        if "secrets" in only:
            with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
                rows = list(pool.map(lambda n: _one_shape(tree, n, a.seed, snap), SHAPES))
            fair = [x for x in rows if not x["unfair"]]
            cmds = sorted({c for x in rows for c in x["leaked_in"]})
            doc["secrets"] = {
                "shapes": len(rows), "cells": sum(x["cells"] for x in rows),
                "shapes_leaked": sum(bool(x["leaked_in"]) for x in rows),
                "shapes_leaked_fair": sum(bool(x["leaked_in"]) for x in fair),
                "cells_leaked": sum(len(x["leaked_in"]) for x in rows),
                "cells_not_reached": sum(len(x["not_reached"]) for x in rows),
                "leaks_by_command": {c: sum(c in x["leaked_in"] for x in rows) for c in cmds},
                "unfair": sorted(UNFAIR), "env_names": list(ENV_NAMES), "results": rows}
        if "harmless" in only:
            doc["harmless"] = harmless(tree)
        if "redirects" in only:
            doc["redirects"] = redirects(tree)
        if "files" in only:
            doc["files"] = files(tree, snap)
            c = cache_wheel(tree)
            doc["files"]["results"].append(c)
            doc["files"]["cases"] += 1
            doc["files"]["trusted"] += bool(c.get("trusted"))
    doc["seconds"] = round(time.time() - t0, 1)
    json.dump(doc, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
