"""bench/device_cold_setup.py: the GPU record's driver, as far as a CPU machine can run it.

Its readers are held to a real record (bench/results/2026-12-05-h100-cold-setup-f0008dd: a
captured cold setup, its load samples and the numbers result.json took from them); its runner
to real process groups; the bundle's parts to every way of cutting it; the pack to the size one
file may have on the way back from the node.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "bench" / "results" / "2026-12-05-h100-cold-setup-f0008dd"

_spec = importlib.util.spec_from_file_location("device_cold_setup",
                                               ROOT / "bench" / "device_cold_setup.py")
assert _spec and _spec.loader
dcs = importlib.util.module_from_spec(_spec)
sys.modules["device_cold_setup"] = dcs
_spec.loader.exec_module(dcs)


def test_setup_facts_read_the_recorded_cold_setup() -> None:
    want = json.loads((RECORD / "result.json").read_text())
    got = dcs.setup_facts((RECORD / "setup-1.txt").read_text())
    assert got["verdict"] == "ready" and got["exit"] == 0
    assert got["reported_s"] == want["cold_s"]
    assert got["process_s"] == pytest.approx(want["cold_process_s"])
    assert got["user_s"] == pytest.approx(want["user_s"])
    assert got["sys_s"] == pytest.approx(want["sys_s"])
    assert {k: v for k, v in got["steps_s"].items() if k in want["steps_s"]} == want["steps_s"]
    assert got["kernels_s"].keys() == want["kernels_s"].keys()
    assert all(abs(got["kernels_s"][k] - v) < 1 for k, v in want["kernels_s"].items())


def test_setup_facts_of_a_warm_rerun() -> None:
    want = json.loads((RECORD / "result.json").read_text())["warm_s"]
    got = [dcs.setup_facts((RECORD / f"setup-warm-{i}.txt").read_text()) for i in (1, 2)]
    assert [g["verdict"] for g in got] == ["ready", "ready"]
    assert [g["reported_s"] for g in got] == want["reported"][1:]
    assert [g["process_s"] for g in got] == pytest.approx(want["process"][1:])


def test_load_facts_match_the_record() -> None:
    want = json.loads((RECORD / "result.json").read_text())
    got = dcs.load_facts((RECORD / "load.txt").read_text())
    assert got["samples"] == want["load_samples"]
    assert got["mean_compilers"] == pytest.approx(want["mean_compilers"], abs=0.01)


@given(st.lists(st.sampled_from(["load1", "running/total", "waiting", "extra"]), unique=True),
       st.lists(st.tuples(st.integers(0, 64), st.integers(0, 10**6)), min_size=1, max_size=30))
def test_load_facts_find_their_columns_by_name(others: list[str],
                                               rows: list[tuple[int, int]]) -> None:
    head = ["epoch", *others, "compilers", "mem_used_mib"]
    lines = [" ".join(head)] + [" ".join(["1796486685", *("7" for _ in others), str(c), str(m)])
                                for c, m in rows]
    got = dcs.load_facts("\n".join(lines) + "\n")
    assert got["samples"] == len(rows)
    assert got["peak_compilers"] == max(c for c, _ in rows)
    assert got["peak_mem_used_mib"] == max(m for _, m in rows)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def test_run_ends_the_whole_group_when_it_times_out(tmp_path: Path) -> None:
    """A command past its timeout is ended with every process it started (a compiler a build
    left running would skew the next phase), and its log says so."""
    pidfile = tmp_path / "child.pid"
    log = tmp_path / "log.txt"
    r = dcs.run(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], log, timeout=2)
    assert r["rc"] == 124
    child = int(pidfile.read_text())
    for _ in range(50):
        if _gone(child):
            break
        time.sleep(0.1)
    assert _gone(child)
    text = log.read_text()
    assert "timed out after 2 s" in text and text.rstrip().endswith("exit 124")


def test_run_records_exit_and_times(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    r = dcs.run(["sh", "-c", "echo hello; exit 3"], log, timeout=60)
    facts = dcs.setup_facts(log.read_text())
    assert r["rc"] == 3 == facts["exit"]
    assert facts["process_s"] == pytest.approx(r["seconds"], abs=0.001)
    assert "hello" in log.read_text()
    assert dcs.run(["/nonexistent/tool"], log, timeout=5)["rc"] == 127


@settings(max_examples=30)
@given(st.binary(min_size=0, max_size=5000), st.lists(st.integers(0, 5000), max_size=5))
def test_join_rebuilds_the_bundle_from_any_cut(tmp_path_factory: pytest.TempPathFactory,
                                               data: bytes, cuts: list[int]) -> None:
    d = tmp_path_factory.mktemp("join")
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    parts = []
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        (d / f"p{i}").write_bytes(data[a:b])
        parts.append(d / f"p{i}")
    assert dcs.join(parts, d / "b.tar") == hashlib.sha256(data).hexdigest()
    assert (d / "b.tar").read_bytes() == data


def test_start_refuses_a_wrong_sha256_and_leaves_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    part = tmp_path / "b.tar.part0"
    part.write_bytes(b"not the bundle")
    work = tmp_path / "work"
    rc = dcs.main(["start", "--work", str(work), "--bundle", str(part), "--adopt", "python3",
                   "--sha256", "0" * 64])
    err = capsys.readouterr().err
    assert rc == 2 and not work.exists()
    assert err.startswith("error: the joined bundle has sha256 ") and "\nhint: " in err
    rc = dcs.main(["start", "--work", str(work), "--bundle", str(tmp_path / "absent"),
                   "--adopt", "python3"])
    assert rc == 2 and not work.exists()
    assert "bundle part(s) missing" in capsys.readouterr().err


def test_start_replaces_only_its_own_work_directory(tmp_path: Path) -> None:
    work = tmp_path / "someone-elses"
    work.mkdir()
    (work / "keep").write_text("x")
    part = tmp_path / "p"
    part.write_bytes(b"b")
    rc = dcs.main(["start", "--fresh", "--work", str(work), "--bundle", str(part),
                   "--adopt", "python3"])
    assert rc == 2 and (work / "keep").read_text() == "x"


def _record(work: Path, finished: bool) -> None:
    (work / "results" / "cold1" / "build-logs").mkdir(parents=True)
    shutil.copy(RECORD / "setup-1.txt", work / "results" / "cold1" / "setup-cold1.txt")
    shutil.copy(RECORD / "load.txt", work / "results" / "cold1" / "load-cold1.txt")
    (work / "config.json").write_text(json.dumps({"profile": "p", "started": time.time()}))
    (work / "phases.json").write_text(json.dumps([{"phase": "cold1", "rc": 0}]))
    (work / "progress.txt").write_text("12:00:00 1 cold1 end rc=0\n"
                                       + ("12:00:01 2 finished\n" if finished else ""))


def test_collect_packs_what_comes_back_in_one_file(tmp_path: Path) -> None:
    """Build logs that would take the archive past what one file may carry back go as their
    last MiB; the transcripts stay whole; summary.json says what was measured."""
    work, out = tmp_path / "work", tmp_path / "out"
    _record(work, finished=True)
    for i in range(6):  # incompressible, 18 MiB together
        (work / "results" / "cold1" / "build-logs" / f"k{i}.log").write_bytes(os.urandom(3 << 20))
    k0 = (work / "results" / "cold1" / "build-logs" / "k0.log").read_bytes()
    (work / "results" / "cold1" / "build-logs" / "small.log").write_text("built\n")
    rc = dcs.main(["collect", "--work", str(work), "--out", str(out), "--wait", "0"])
    assert rc == 0
    target = out / "device-run.tar.gz"
    assert target.stat().st_size <= dcs.PACK_LIMIT
    with tarfile.open(target) as tar:
        names = set(tar.getnames())
        tail = tar.extractfile("device-run/results/cold1/build-logs/k0.log.last-MiB")
        assert tail is not None and tail.read() == k0[-(1 << 20):]
    assert "device-run/results/cold1/setup-cold1.txt" in names
    assert "device-run/results/cold1/build-logs/small.log" in names
    assert not any(n.endswith("k0.log") for n in names)
    doc = json.loads((out / "summary.json").read_text())
    assert doc["finished"] is True
    assert doc["setups"]["cold1/setup-cold1"]["reported_s"] == 540.2
    assert doc["load"]["cold1/load-cold1"]["samples"] == 263


def test_collect_of_a_record_whose_driver_is_gone(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    _record(work, finished=False)
    rc = dcs.main(["collect", "--work", str(work), "--out", str(out), "--wait", "30"])
    assert rc == 3
    doc = json.loads((out / "summary.json").read_text())
    assert doc["finished"] is False and "driver is gone" in doc["note"]
    assert "record stopped" in capsys.readouterr().err
    with tarfile.open(out / "device-run.tar.gz") as tar:
        assert "device-run/results/cold1/setup-cold1.txt" in tar.getnames()


def test_probe_output_is_what_the_probe_printed(tmp_path: Path) -> None:
    """A version probe's line in versions.json: the program's own words, without run()'s
    command line and trailer or a licence line."""
    log = tmp_path / "versions.txt"
    log.write_text("earlier probes\n")
    at = log.stat().st_size
    dcs.run([sys.executable, "-c", "import sys; print('Python', sys.version.split()[0]); "
             "print('Copyright (c) someone'); print(); print('second line')"], log, timeout=60)
    with open(log) as f:
        f.seek(at)
        got = dcs.probe_output(f.read())
    assert got == f"Python {sys.version.split()[0]} | second line"
