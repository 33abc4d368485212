"""Snapshots and fleets made by hand, told apart from a `collect` cut short.

An operator copies `nvidia-smi -q`, `nvidia-smi topo -m`, `ibstatus`, `ulimit -l` from a node
into a directory (a support ticket, a fleet audit): no meta.json, no in-progress marker. Such a
directory is read as it is, the files it lacks are "not collected" (a skip, never an absent
tool), and the findings say it was not made by `collect`. A directory holding `collect`'s
in-progress marker is a collect cut short and stays refused, as does a collected snapshot
changed afterwards. Every node here is made of real captured outputs (fixtures/h200-1gpu,
fixtures/captures: see its README for their sources)."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_env import profile
from megatron_env.host import checks, snapshot
from megatron_env.host.snapshot import IN_PROGRESS, Snapshot

from .conftest import CAPTURES, H200, user_error

ROOT = Path(__file__).parent.parent
PROFILE = "core_v0.19.0-cu130"  # CUDA 13.0: the H200 node's driver 580.159.04 passes it


def hand_made(dest: Path, **captures: str) -> Path:
    """The H200 node's real outputs as an operator copies them: the files without meta.json,
    plus captures under the names `collect` gives them."""
    dest.mkdir(parents=True)
    for f in H200.iterdir():
        if f.name in snapshot.FILES:
            shutil.copy(f, dest / f.name)
    for name, capture in captures.items():
        shutil.copy(CAPTURES / capture, dest / name)
    return dest


def by_id(found):
    return {f.id: f for f in found}


def test_a_hand_made_snapshot_is_read_and_the_rest_is_not_collected(tmp_path):
    d = hand_made(tmp_path / "node", **{"ibstatus.txt": "ibstatus-cx3-fdr-ok.txt"})
    snap = Snapshot.load(d)
    assert snap.hand_made
    f = by_id(checks.run_all(snap, profile.load(PROFILE)))
    # what was copied is judged
    assert f["driver.version"].status == "pass" and "580.159.04" in f["driver.version"].summary
    assert f["gpu.topology"].status == "pass" and f["gpu.throttle"].status == "pass"
    assert f["net.ib"].status == "pass" and "56 Gb/s" in f["net.ib"].summary
    assert f["limits.memlock"].status == "pass"  # unlimited, as the node printed it
    # what was not is a skip that says so, never an absent tool
    for cid in ("cuda.toolkit", "sys.shm", "nccl.env"):
        assert f[cid].status == "skip" and f[cid].kind == "not-collected", f[cid]
        assert f[cid].summary.startswith("not collected")
    assert "no nvcc on the host" not in f["cuda.toolkit"].summary
    assert f["snapshot"].kind == "hand-made" and "not made by `invoke collect`" in \
        f["snapshot"].summary


def test_a_hand_made_snapshot_without_the_drivers_outputs_has_no_absent_driver(tmp_path):
    """Only `ibstatus` and `ulimit -l` copied: the driver is not known to be absent (setup reads
    kind "absent" to skip the kernel builds for want of a GPU)."""
    d = tmp_path / "node"
    d.mkdir()
    shutil.copy(CAPTURES / "ibstatus-cx3-port2-down.txt", d / "ibstatus.txt")
    shutil.copy(CAPTURES / "ulimit-l-64.txt", d / "ulimit-l.txt")
    f = by_id(checks.evaluate(profile.load(PROFILE), d))
    assert f["driver.version"].status == "skip" and f["driver.version"].kind == "not-collected"
    assert f["net.ib"].status == "fail" and "DOWN" in f["net.ib"].summary
    assert f["limits.memlock"].status == "fail"  # 64 KiB beside a real (if down) IB port
    # the same files in a collected snapshot that recorded no nvidia-smi: absent, a fail
    (d / "meta.json").write_text(json.dumps({"files": {"nvidia-smi.txt": {"status": "missing"}}}))
    f = by_id(checks.evaluate(profile.load(PROFILE), d))
    assert f["driver.version"].status == "fail" and f["driver.version"].kind == "absent"
    assert "snapshot" not in f


def test_the_in_progress_marker_refuses_the_directory_even_with_a_meta_json(tmp_path):
    d = hand_made(tmp_path / "node")
    (d / IN_PROGRESS).touch()
    with user_error("snapshot.incomplete") as e:
        Snapshot.load(d)
    assert IN_PROGRESS in e.value.message and "invoke collect" in e.value.fix
    shutil.copy(H200 / "meta.json", d / "meta.json")  # meta.json written, marker not removed
    with user_error("snapshot.incomplete"):
        Snapshot.load(d)
    (d / IN_PROGRESS).unlink()
    assert not Snapshot.load(d).hand_made


def test_a_directory_of_nothing_a_snapshot_holds_is_still_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("copied the wrong files\n")
    with user_error("snapshot.empty"):
        Snapshot.load(tmp_path)


def test_collect_writes_its_marker_first_and_removes_it_last(tmp_path, monkeypatch):
    """A real collect on this host: while any file is written the marker is there; once it
    returns the marker is gone and meta.json records the files."""
    out = tmp_path / "snap"
    seen: list[tuple[str, bool]] = []
    real = snapshot.files.write_text

    def watched(dest: Path, text: str) -> Path:
        seen.append((dest.name, (out / IN_PROGRESS).exists()))
        return real(dest, text)

    monkeypatch.setattr(snapshot.files, "write_text", watched)
    snapshot.collect(out, echo=lambda *_: None)
    assert seen and all(marked for _, marked in seen), seen
    assert seen[-1][0] == "meta.json"
    assert not (out / IN_PROGRESS).exists()
    snap = Snapshot.load(out)
    assert not snap.hand_made and set(snap.meta()["files"]) == set(snapshot.FILES)


def test_a_collect_cut_short_is_refused_not_read_as_hand_made(tmp_path, monkeypatch):
    """A full disk stops collect after its first files (a real ENOSPC would need a full file
    system; the error is raised where the write would fail): the directory holds the outputs
    and the marker, and is refused, not read as a hand-made snapshot with absent tools."""
    out = tmp_path / "snap"
    real, n = snapshot.files.write_text, []

    def fills(dest: Path, text: str) -> Path:
        n.append(dest)
        if len(n) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(dest, text)

    monkeypatch.setattr(snapshot.files, "write_text", fills)
    with pytest.raises(OSError):
        snapshot.collect(out, echo=lambda *_: None)
    assert len([p for p in out.iterdir() if p.name in snapshot.FILES]) == 2
    with user_error("snapshot.incomplete"):
        Snapshot.load(out)


def test_a_collected_snapshot_changed_afterwards_stays_refused(tmp_path):
    out = tmp_path / "snap"
    snapshot.collect(out, echo=lambda *_: None)
    Snapshot.load(out)
    (out / "ulimit-l.txt").write_text((CAPTURES / "ulimit-l-64.txt").read_text())
    with user_error("snapshot.altered"):
        Snapshot.load(out)


def preflight(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", "preflight", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_preflight_reads_a_fleet_of_hand_made_nodes(tmp_path):
    """Three nodes as an operator copied them: the H200 node's outputs with the HGX H100
    topology, one node with a port trained at half rate. The fleet is read, the slow port's
    node is excluded, and every node says it was not made by collect."""
    root = tmp_path / "fleet"
    for i, ib in enumerate(["ibstatus-cx3-fdr-ok.txt"] * 2 + ["ibstatus-cx3-port2-down.txt"]):
        hand_made(root / f"n{i}", **{"nvidia-smi-topo-m.txt": "topo-8gpu-h100-nv18-nics.txt",
                                     "ibstatus.txt": ib})
    r = preflight("--fleet", str(root), "--json", "--profile", PROFILE)
    assert "holds no node snapshot" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert [n["host"] for n in doc["nodes"]] == ["n0", "n1", "n2"], r.stderr
    assert doc["exclude"] == ["n2"] and r.returncode == 2
    for n in doc["nodes"]:
        kinds = {f["id"].split(": ")[-1]: f.get("kind") for f in n["findings"]}
        assert any(f.get("kind") == "hand-made" for f in n["findings"]), kinds
        assert not any(f.get("kind") == "absent" for f in n["findings"]), n["findings"]
    (root / "n1" / IN_PROGRESS).touch()  # a node whose collect was cut short is not read
    doc = json.loads(preflight("--fleet", str(root), "--json", "--profile", PROFILE).stdout)
    assert [n["host"] for n in doc["nodes"]] == ["n0", "n2"]
