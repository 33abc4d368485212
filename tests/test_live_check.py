"""The live host check (`checks.evaluate` without a snapshot, as `invoke setup` and `invoke
check` run it) collects a throw-away snapshot with less work than `invoke collect`: its commands
at once, no fsync, and plain `nvidia-smi` only when NVML reports no driver version. It must
find exactly what a full collect of the same host finds. No GPU here: `nvidia-smi` is a PATH
shim printing the H200 node's real outputs (tests/fixtures/h200-live) and logging each call,
and NVML's facts are that node's nvml.json (or a load failure)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from megatron_env import profile
from megatron_env.host import checks, snapshot

from .conftest import FIXTURES

LIVE = FIXTURES / "h200-live"
PROFILE = "core_v0.19.0-cu130"
NO_NVML = {"error": "NVML init failed: NVML Shared Library Not Found"}


def _node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nvml: dict[str, Any]) -> Path:
    """This host with the H200 node's nvidia-smi and NVML; the file each nvidia-smi call is
    logged to."""
    bindir, log = tmp_path / "bin", tmp_path / "calls.log"
    bindir.mkdir()
    shim = bindir / "nvidia-smi"
    shim.write_text(f"""#!/bin/sh
echo "nvidia-smi $*" >> '{log}'
case "$*" in
  "") cat '{LIVE / "nvidia-smi.txt"}' ;;
  "-q") cat '{LIVE / "nvidia-smi-q.txt"}' ;;
  "topo -m") cat '{LIVE / "nvidia-smi-topo-m.txt"}' ;;
  *) echo "unknown arguments: $*" >&2; exit 2 ;;
esac
""")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(snapshot, "nvml_facts", lambda: nvml)
    log.touch()
    return log


def _dicts(found: list[Any]) -> list[dict[str, Any]]:
    return [f.to_dict() for f in found]


@pytest.mark.parametrize("nvml", ["h200", "none"])
def test_the_live_check_finds_what_a_full_collect_finds(tmp_path, monkeypatch, nvml):
    facts = json.loads((LIVE / "nvml.json").read_text()) if nvml == "h200" else NO_NVML
    log = _node(tmp_path, monkeypatch, facts)
    prof = profile.load(PROFILE)
    full = checks.run_all(snapshot.collect(tmp_path / "full", echo=lambda *_: None), prof)
    assert log.read_text().splitlines().count("nvidia-smi ") == 1  # collect records it all
    log.write_text("")
    live = checks.evaluate(prof)
    assert _dicts(live) == _dicts(full)
    by_id = {f.id: f for f in live}
    assert by_id["driver.version"].status == "pass", by_id["driver.version"]
    assert "580.159.04" in by_id["driver.version"].summary
    calls = log.read_text().splitlines()
    assert calls.count("nvidia-smi -q") == 1 and calls.count("nvidia-smi topo -m") == 1
    # plain nvidia-smi is the driver's fallback: run only when NVML has no driver version
    assert calls.count("nvidia-smi ") == (0 if nvml == "h200" else 1), calls


def test_the_live_check_runs_its_commands_at_once(tmp_path, monkeypatch):
    """Every command of the live check is started before any of them ends: each shim waits
    (up to 20 s) until all three nvidia-smi calls have begun, so run one after another the
    first would time out waiting and the calls would end in the wrong order."""
    log = _node(tmp_path, monkeypatch, NO_NVML)
    shim = tmp_path / "bin" / "nvidia-smi"
    started = tmp_path / "started"
    started.mkdir()
    shim.write_text(shim.read_text().replace(
        f"echo \"nvidia-smi $*\" >> '{log}'\n",
        f"touch '{started}'/\"x$*\"\n"
        f"i=0; while [ $(ls '{started}' | wc -l) -lt 2 ] && [ $i -lt 200 ]; do "
        "sleep 0.1; i=$((i+1)); done\n"
        f"echo \"$(ls '{started}' | wc -l) nvidia-smi $*\" >> '{log}'\n"))
    checks.evaluate(profile.load(PROFILE))
    calls = log.read_text().splitlines()
    # -q and topo -m run together (both saw 2 started); plain nvidia-smi, the fallback, after
    assert sorted(calls[:2]) == ["2 nvidia-smi -q", "2 nvidia-smi topo -m"], calls
    assert calls[2:] == ["3 nvidia-smi "], calls
