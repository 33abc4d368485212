"""bench/converge.py reads gpu_health's verdict from the findings gpu_health.py really writes: on
the H100 record's raw preflight output (bench/results/2026-12-06-h100-converge/4-preflight.txt,
captured on the node) it is "pass"; one of those findings failing makes it "fail". (Its first
reader looked for a `gpu.health` finding, which exists only when gpu_health is skipped or dies,
and called a passing node "absent".)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "bench" / "results" / "2026-12-06-h100-converge"


def _reread(tmp_path: Path, edit: tuple[str, str] | None = None) -> tuple[int, dict]:
    out = tmp_path / "record"
    shutil.copytree(RECORD, out)
    if edit:
        raw = (out / "4-preflight.txt").read_text()
        assert edit[0] in raw
        (out / "4-preflight.txt").write_text(raw.replace(edit[0], edit[1], 1))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "converge.py"), "--out", str(out),
                        "--reread"], capture_output=True, text=True, timeout=60)
    return r.returncode, json.loads((out / "converge.json").read_text())


def test_the_device_record_reads_as_pass(tmp_path: Path) -> None:
    code, doc = _reread(tmp_path)
    assert (code, doc["preflight_local_adopted"]) == (0, "pass")
    assert doc["kernels_removed"] and doc["imports_after"] and doc["setup_exit"] == 0


@pytest.mark.parametrize("finding", ["kernel.apex", "gpu.speed"])
def test_one_failing_health_finding_fails_it(tmp_path: Path, finding: str) -> None:
    before = f'"id": "{finding}",\n          "status": "pass"'
    code, doc = _reread(tmp_path, (before, before.replace('"pass"', '"fail"')))
    assert (code, doc["preflight_local_adopted"]) == (1, "fail")


def test_a_failing_host_check_is_not_gpu_health(tmp_path: Path) -> None:
    before = '"id": "sys.shm",\n          "status": "pass"'
    code, doc = _reread(tmp_path, (before, before.replace('"pass"', '"fail"')))
    assert doc["preflight_local_adopted"] == "pass"
