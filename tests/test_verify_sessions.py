"""megatron_env.megatron.programs: what the nox verification sessions run, and a real gloo run through it."""

import json
import sys

import pytest

from megatron_env.megatron import programs

from .conftest import user_error


def test_parse_splits_our_options_from_the_programs():
    o = programs.parse(["--current", "--nproc", "4", "--backend", "gloo", "--", "--nproc", "x"])
    assert o.current and o.nproc == 4
    assert o.passthrough == ["--backend", "gloo", "--nproc", "x"]
    with user_error("input.value") as e:
        programs.parse(["--nproc", "zero"])
    assert "--nproc zero" in e.value.message


def test_command_shapes(tmp_path):
    o = programs.parse(["--nproc", "8", "--sizes", "1M:1G"])
    cmd = programs.command("verify_nccl", o, "/env/bin/python", tmp_path)
    assert cmd[:4] == ["/env/bin/python", "-m", "torch.distributed.run", "--nproc_per_node=8"]
    assert cmd[4].endswith("scripts/verify_nccl.py")
    assert cmd[5:] == ["--sizes", "1M:1G", "--out", str(tmp_path)]
    health = programs.command("verify_cuda", programs.parse([]), "/env/bin/python", tmp_path)
    assert health[1].endswith("scripts/gpu_health.py") and "torch.distributed.run" not in health


def test_missing_environment_says_what_to_do(monkeypatch, tmp_path):
    from megatron_env.pyenv import env

    monkeypatch.setattr(env, "env_root", lambda: tmp_path)
    with user_error("env.missing") as e:
        programs.interpreter(programs.parse(["--profile", "core_v0.4.0-cu121"]))
    assert "invoke setup" in e.value.fix


def test_verify_nccl_session_runs_gloo_for_real(tmp_path):
    pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    code = programs.run("verify_nccl", ["--python", sys.executable, "--nproc", "2", "--run-dir",
                                      str(run_dir), "--backend", "gloo", "--sizes", "1K:8K",
                                      "--iters", "2", "--warmup", "1"])
    assert code == 0
    assert (run_dir / "command.txt").read_text().startswith(sys.executable)
    assert "verify_nccl: pass" in (run_dir / "verify_nccl.log").read_text()
    doc = json.loads((run_dir / "results.json").read_text())
    assert doc["topology"]["world_size"] == 2 and doc["findings"][0]["status"] == "pass"
