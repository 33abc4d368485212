"""`invoke report`: the paste-able block, with planted secrets that must never come out."""

import datetime
import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from megatron_env import bug_report as report
from megatron_env import profile, redact
from megatron_env.host import snapshot
from megatron_env.kernels import build

from .conftest import FIXTURES

ROOT = FIXTURES.parent.parent
# planted secrets: none of these strings may appear in any output
PASSWORD = "hunter2-planted-pw"
GIT_TOKEN = "ghp_plantedGitToken0123456789"
HUB_TOKEN = "hf_plantedHubToken987"
AWS = "planted/aws+secret/KEY"
PLANTED = {
    "MEGATRON_ENV_MIRROR_PYPI": f"https://alice:{PASSWORD}@mirror.example.org/simple",
    "MEGATRON_ENV_MIRROR_GITHUB": f"https://{GIT_TOKEN}@github.com/",
    "TORCH_HUB_TOKEN": HUB_TOKEN,
    "NCCL_IB_PRIVATE_KEY": "planted-private-key-value",
    "CUDA_CACHE_PATH": f"/scratch/{AWS}/cache",  # a secret that leaked into another value
    "AWS_SECRET_ACCESS_KEY": AWS,
    "NCCL_DEBUG": "INFO",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "HOME_URL": "https://example.org/?token=plantedQueryToken",
}


def test_variables_redact_by_name_and_mask_urls():
    v = report.variables(PLANTED)
    assert v["MEGATRON_ENV_MIRROR_PYPI"] == "https://***@mirror.example.org/simple"
    assert v["MEGATRON_ENV_MIRROR_GITHUB"] == "https://***@github.com/"
    assert v["TORCH_HUB_TOKEN"] == v["NCCL_IB_PRIVATE_KEY"] == "<redacted>"
    assert v["NCCL_DEBUG"] == "INFO" and v["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert "AWS_SECRET_ACCESS_KEY" not in v and "HOME_URL" not in v  # not asked for
    assert not redact.is_secret_name("CUDA_VISIBLE_DEVICES")
    assert not redact.is_secret_name("NCCL_IB_HCA")
    assert redact.is_secret_name("WANDB_API_KEY") and redact.is_secret_name("HF_TOKEN")


def test_scrub_is_the_last_pass_over_any_text():
    text = f"x {AWS} y https://u:p@h/ z ?token=plantedQueryToken&a=1 {HUB_TOKEN}"
    out = redact.scrub(text, PLANTED)
    assert AWS not in out and HUB_TOKEN not in out and "u:p@" not in out
    assert "plantedQueryToken" not in out and "&a=1" in out


def _report(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(report.PREFIXES)}
    env.update(PLANTED)
    return subprocess.run([sys.executable, "-m", "invoke", "report", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _no_secret_in(r):
    for secret in (PASSWORD, GIT_TOKEN, HUB_TOKEN, AWS, "planted-private-key-value",
                   "plantedQueryToken"):
        assert secret not in r.stdout and secret not in r.stderr, secret


def test_report_where_nothing_is_built(tmp_path):
    r = _report(tmp_path, "--prefix", str(tmp_path / "no-env"))
    assert r.returncode == 0, r.stderr
    _no_secret_in(r)
    out = r.stdout
    assert out.startswith("```\nmegatron-env") and out.rstrip().endswith("```")
    for key in ("os ", "python ", "driver ", "gpus ", "topology ", "nvcc ", "torch ", "profile ",
                "environment ", "megatron ", "patches ", "kernel builds", "invoke check (now)"):
        assert f"\n{key}" in out or f"\n  {key}" in out or key in out, key
    assert "not built (run `invoke setup`" in out and "n/a (no environment)" in out
    prof = profile.load(None)
    for pkg in build.packages(prof).values():  # every kernel package has its row
        assert f"\n  {pkg.name} " in out
    assert prof.megatron["commit"][:12] in out
    assert "; not verified (setup's lock step has no stamp" in out
    assert "  MEGATRON_ENV_MIRROR_PYPI=https://***@mirror.example.org/simple" in out
    assert "  TORCH_HUB_TOKEN=<redacted>" in out and "  NCCL_DEBUG=INFO" in out
    assert "driver.version" in out  # the check findings, run now


def test_report_json_of_an_environment_without_kernels(tmp_path):
    prefix = tmp_path / "env"
    venv.create(prefix, with_pip=False)  # an environment exists, but holds no torch or kernels
    r = _report(tmp_path, "--prefix", str(prefix), "--json")
    assert r.returncode == 0, r.stderr
    _no_secret_in(r)
    doc = json.loads(r.stdout)
    assert doc["python"]["environment"] == ".".join(map(str, sys.version_info[:3]))
    assert "error" not in doc["environment"]
    for k in doc["kernels"]:
        assert k["installed"] is None and k["found"] and not any(k["found"].values())
        assert k["cache_key"] is None and "torch" in k["why"]
    assert doc["variables"]["TORCH_HUB_TOKEN"] == "<redacted>"
    assert {f["id"] for f in doc["check"]} >= {"driver.version", "cuda.toolkit", "nccl.env"}


def test_report_bad_profile_is_one_line(tmp_path):
    r = _report(tmp_path, "--profile", "no-such-profile")
    assert r.returncode == 2 and "no-such-profile" in r.stderr and "Traceback" not in r.stderr


def test_host_facts_from_the_h200_snapshot():

    h = report._host(snapshot.Snapshot.load(FIXTURES / "h200-live"))
    assert (h["driver"], h["driver_cuda"], h["nvcc"]) == ("580.159.04", "13.0", "13.0")
    assert report._gpus(h["gpus"]) == "1 x NVIDIA H200 (140 GiB, sm 9.0)"


def test_a_collected_snapshot_keeps_no_secret(tmp_path, monkeypatch):
    """`invoke collect`'s env.txt is shared with others (preflight runs, reports): a
    secret-named variable it records is `<redacted>`, URL credentials are masked, and the value
    of any secret-named variable is removed wherever it leaked."""
    for k, v in PLANTED.items():
        monkeypatch.setenv(k, v)
    snap = snapshot.collect(tmp_path / "snap", echo=lambda *_: None)
    text = (snap.path / "env.txt").read_text()
    assert "TORCH_HUB_TOKEN=<redacted>" in text and "NCCL_IB_PRIVATE_KEY=<redacted>" in text
    assert "CUDA_CACHE_PATH=/scratch/<redacted>/cache" in text
    for secret in (HUB_TOKEN, AWS, "planted-private-key-value"):
        assert secret not in text
    assert "NCCL_DEBUG=INFO" in text


def fake_torch_env(prefix):
    """A venv whose torch is files only (version.py, TorchConfig.cmake, dist-info): what the
    report reads. Importing it would fail, so a report that imports torch cannot pass."""
    venv.create(prefix, with_pip=False)
    site = next(prefix.glob("lib/python*/site-packages"))
    (site / "torch" / "share" / "cmake" / "Torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('imported by the report')\n")
    (site / "torch" / "version.py").write_text(
        "__version__ = '2.1.0+cu121'\ndebug = False\ncuda: Optional[str] = '12.1'\n")
    (site / "torch" / "share" / "cmake" / "Torch" / "TorchConfig.cmake").write_text(
        'set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=0")\n')
    for name, version in (("torch", "2.1.0+cu121"), ("nvidia_nccl_cu12", "2.18.1"),
                          ("nvidia_cudnn_cu12", "8.9.2.26")):
        d = site / f"{name}-{version}.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / ("flash_attn_2_cuda" + sysconfig.get_config_var("EXT_SUFFIX"))).write_bytes(b"")
    return site


def test_report_reads_versions_from_files_without_importing_torch(tmp_path):
    fake_torch_env(tmp_path / "env")
    r = _report(tmp_path, "--prefix", str(tmp_path / "env"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["torch"] == {"torch": "2.1.0+cu121", "torch_cuda": "12.1", "nccl": "2.18.1",
                            "cudnn": "8.9.2.26"}
    fa = next(k for k in doc["kernels"] if k["name"] == "flash-attn")
    assert fa["found"] == {"flash_attn_2_cuda": True}
    assert fa["cache_key"] or "CUDA" in fa["why"]  # no torch import was needed for either
    deep = _report(tmp_path, "--prefix", str(tmp_path / "env"), "--json", "--imports")
    assert deep.returncode == 0, deep.stderr
    assert json.loads(deep.stdout)["torch"]["torch"] is None  # --imports did import: it failed


def _setup_run(ctx, fail: str | None = None, only: str | None = None):
    """The setup chain's own decide/execute writing and removing its stamps; each step's work
    (a torch environment, a Megatron checkout: hours and a GPU) is a line, or `fail` raises."""
    import dataclasses

    from megatron_env.errors import UserError
    from megatron_env.setup import pipeline

    def work(name):
        def run(_ctx):
            if name == fail:
                raise UserError(f"{name} broke", kind="test.broke")
            return f"{name} done"
        return run

    decisions = [dataclasses.replace(d, step=dataclasses.replace(
        d.step, run=work(d.step.name), verify=lambda _c: "asked to run again"))
        for d in pipeline.decide(ctx, [only] if only else pipeline.STEPS)]
    return pipeline.execute(ctx, decisions)


def _backdate(stamps: Path, seconds: int) -> None:
    """Every stamp's time moved `seconds` into the past, as if written that long ago."""
    for f in stamps.glob("*.json"):
        doc = json.loads(f.read_text())
        at = datetime.datetime.strptime(doc["at"], "%Y-%m-%dT%H:%M:%S%z")
        doc["at"] = (at - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S%z")
        f.write_text(json.dumps(doc))


def test_report_says_megatron_is_not_verified_while_setup_fails(tmp_path):
    from megatron_env.setup import pipeline

    prof = profile.load(None)
    prefix = tmp_path / "env"
    ctx = pipeline.Context(prof, prefix, no_builds=True)
    ctx.stamps.mkdir(parents=True)
    assert report.setup_unverified(prefix) == \
        "setup's lock step has no stamp: it failed or has not run"
    rows, ok = _setup_run(ctx)
    assert ok and {f.stem for f in ctx.stamps.glob("*.json")} >= set(report.SETUP_STAMPED)
    assert report.setup_unverified(prefix) is None
    rows, ok = _setup_run(ctx, fail="env")  # megatron's and verify's stamps stay from before
    assert not ok and (ctx.stamps / "verify.json").exists()
    assert report.setup_unverified(prefix) == \
        "setup's env step has no stamp: it failed or has not run"
    _setup_run(ctx)
    _setup_run(ctx, fail="verify")
    assert report.setup_unverified(prefix).startswith("setup's verify step has no stamp")
    _setup_run(ctx)
    (ctx.stamps / "megatron.json").write_text('{"digest": "a kill -9 cut th')
    assert "megatron.json cannot be read" in report.setup_unverified(prefix)
    (ctx.stamps / "megatron.json").write_text('{"detail": "no digest"}\n')
    assert report.setup_unverified(prefix) == \
        "setup's megatron step: megatron.json is not a stamp"
    (ctx.stamps / "megatron.json").unlink()
    _setup_run(ctx)
    assert report.setup_unverified(prefix) is None
    _backdate(ctx.stamps, seconds=2)  # stamps record the second: those so far are older
    _setup_run(ctx, only="megatron")  # `invoke megatron`: installed again, imports not proven
    assert report.setup_unverified(prefix).startswith(
        "setup's verify step has not run since its megatron step installed Megatron")
    _setup_run(ctx)
    assert report.setup_unverified(prefix) is None
    facts = {"megatron": {"tag": "t", "commit": "c" * 40, "patches": [], "checkout": "x",
                          "installed": "0.4", "unverified": None}}
    assert report.megatron_line(facts["megatron"]).endswith("; verified by setup")
    facts["megatron"]["unverified"] = report.setup_unverified(tmp_path / "other")
    assert report.megatron_line(facts["megatron"]).endswith(
        "; not verified (setup's lock step has no stamp: it failed or has not run)")
