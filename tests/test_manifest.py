"""Manifests and repairs for real: a small venv made by uv from two hashed pins of the default
profile's lock (six, einops), damaged the ways a user or a disk does, checked and repaired."""

import os
import sys
from pathlib import Path

import pytest

from megatron_env import profile
from megatron_env.pyenv import env, lock, manifest, uv
from megatron_env.pyenv.probe import probe

from .conftest import user_error

PINS = {"six", "einops"}


@pytest.fixture
def small_env(tmp_path, monkeypatch):
    """(python, lockfile, sources) of a fresh venv holding six and einops, installed by uv with
    a cache of its own: one test here damages a cache entry, the shared cache must not see it."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    lockfile = tmp_path / "requirements.lock"
    full = profile.load("core_v0.4.0-cu121").lock_file.read_text()
    lockfile.write_text(lock.subset(full, PINS))
    venv = tmp_path / "venv"
    r = env.proc.run([uv.exe(), "venv", "-q", "--python", sys.executable, venv],
                     env=uv.env())
    assert r.ok, r.output
    python = env.python_of(venv)
    env.uv_install_lock(python, lockfile, env.Sources([], False), tmp_path / "uv.log")
    return python, lockfile, env.Sources([], False)


def record(python):
    return manifest.scan(probe(python, torch=False)["sites"])


def einops_file(m):
    files = next(d["files"] for d in m["dists"].values() if d["name"] == "einops")
    return Path(next(p for p, *_ in files if p.endswith("einops/einops.py")))


def test_fresh_install_matches_the_record_and_shares_no_inode_with_uv_cache(small_env):
    python, _, _ = small_env
    m = record(python)
    assert {d["name"] for d in m["dists"].values()} == PINS
    assert manifest.stat_check(m) == [] and manifest.hash_check(m) == []
    # --link-mode copy: an edit here cannot reach uv's cache (hardlinks would have nlink > 1)
    assert all(os.stat(p).st_nlink == 1 for d in m["dists"].values() for p, *_ in d["files"])


@pytest.mark.parametrize("damage", ["edit", "delete", "replace", "delete-package"])
def test_damage_is_named_then_repaired_from_the_lock(small_env, damage):
    python, lockfile, sources = small_env
    m = record(python)
    f = einops_file(m)
    good = f.read_bytes()
    if damage == "edit":  # in place, same inode, same size: only mtime (and content) change
        with open(f, "r+b") as fh:
            fh.write(b"#" + good[1:2])
    elif damage == "delete":
        f.unlink()
    elif damage == "replace":
        tmp = f.with_name("x.tmp")
        tmp.write_bytes(good)
        os.utime(tmp, ns=(os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns))
        os.replace(tmp, f)
    else:
        import shutil

        shutil.rmtree(f.parent)
    diffs = manifest.stat_check(m)
    assert diffs and {(d.package, d.kind) for d in diffs} <= {("einops", "changed"),
                                                             ("einops", "missing")}
    assert any(d.file == str(f) for d in diffs)
    lines = []
    env.repair(python, lockfile, manifest.packages(diffs), sources, lines.append)
    assert f.read_bytes() == good
    assert manifest.hash_check(record(python)) == []
    assert any("repairing einops" in line for line in lines)


def test_deep_check_catches_what_stat_cannot(small_env):
    python, _, _ = small_env
    m = record(python)
    f = einops_file(m)
    st = os.stat(f)
    data = bytearray(f.read_bytes())
    data[0:1] = b"#"
    with open(f, "r+b") as fh:  # same size, then the old mtime put back
        fh.write(data)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert manifest.stat_check(m) == []
    assert [(d.kind, d.package, d.file) for d in manifest.hash_check(m)] == [
        ("hash", "einops", str(f))]


def test_corrupt_uv_cache_entry_is_detected_and_refreshed(small_env, tmp_path):
    """A file of uv's cache edited in place: the next environment installed from that cache gets
    it (uv trusts its unpacked entries); its RECORD hash names it, and the repair refreshes it."""
    python, lockfile, sources = small_env
    good = einops_file(record(python)).read_bytes()
    cache = Path(os.environ["UV_CACHE_DIR"])
    cached = [p for p in cache.rglob("einops/einops.py") if p.read_bytes() == good]
    assert cached, "uv keeps the unpacked wheel in its cache"
    for p in cached:
        p.write_bytes(good + b"\n# corrupted in the cache\n")
    other = tmp_path / "other"
    assert env.proc.run([uv.exe(), "venv", "-q", "--python", sys.executable, other],
                        env=uv.env()).ok
    env.uv_install_lock(env.python_of(other), lockfile, env.Sources([], False),
                    tmp_path / "uv2.log")
    m = record(env.python_of(other))
    bad = manifest.hash_check(m)
    assert [(d.kind, d.package) for d in bad] == [("hash", "einops")]
    assert bad[0].file.endswith("einops/einops.py")
    env.repair(env.python_of(other), lockfile, manifest.packages(bad), sources, print)
    assert einops_file(m).read_bytes() == good
    assert manifest.hash_check(record(env.python_of(other))) == []


def test_a_package_the_lock_does_not_install_is_not_repaired_blindly(small_env):
    python, lockfile, sources = small_env
    with user_error("env.repair-refused") as e:
        env.repair(python, lockfile, ["megatron-core"], sources, print)
    assert "megatron-core" in e.value.message


def test_a_bytecode_cache_an_image_stripped_is_not_damage(small_env):
    """pip records each `__pycache__/*.pyc` it compiled, with no hash; images strip them (seen
    on the H200 node's adopted environment: pandas, httpx, transformers). Python rewrites them at
    will, so they are not content: absent or rewritten, neither check names them."""
    python, _, _ = small_env
    info = next(Path(d) for d in probe(python, torch=False)["sites"]
                for d in Path(d).glob("einops-*.dist-info"))
    with open(info / "RECORD", "a", encoding="utf-8") as fh:
        fh.write("einops/__pycache__/einops.cpython-312.pyc,,\n")
    m = record(python)
    assert manifest.stat_check(m) == [] and manifest.hash_check(m) == []
    einops_file(m).write_text("# damaged\n")  # the source it caches is still checked
    assert [d.kind for d in manifest.hash_check(m)] == ["hash"]


def test_adopted_deep_check_stops_on_pinned_packages_and_names_the_sites_own(
        small_env, tmp_path, monkeypatch, capsys):
    """--verify-deep on an adopted environment: a changed file of a package the lock pins (einops)
    stops the chain; one the lock does not pin (the H200 image's certifi CA bundle, here a package
    outside the lock's subset: six is removed from the pins) is a warning naming it."""
    from megatron_env.megatron import checkout
    from megatron_env.setup import pipeline, steps

    python, lockfile, _ = small_env
    prof = profile.load("core_v0.4.0-cu121")
    prof_dir = tmp_path / "prof"
    prof_dir.mkdir()
    (prof_dir / profile.LOCK_FILE).write_text(lock.subset(lockfile.read_text(), {"einops"}))
    monkeypatch.setattr(type(prof), "dir", property(lambda _self: prof_dir))
    sites = probe(python, torch=False)["sites"]
    # megatron.core cannot import here (no torch): the import probe is the boundary
    core = checkout.source_dir(prof) / "megatron" / "core" / "__init__.py"
    monkeypatch.setattr(checkout, "check_import", lambda _py, *_: {
        "sites": sites, "imported": {"megatron.core": str(core)}})
    ctx = pipeline.Context(prof, tmp_path / "env", adopt=Path(python), deep=True,
                           no_builds=True)  # no kernels here: the stack without them
    ctx.stamps.mkdir(parents=True)
    steps.verify_stack(ctx)  # the first run records the adopted environment's manifest
    m = record(python)
    six = Path(next(p for d in m["dists"].values() if d["name"] == "six"
                    for p, *_ in d["files"] if p.endswith("six.py")))
    six.write_text(six.read_text() + "# a site's own change\n")
    steps.verify_stack(ctx)
    err = capsys.readouterr().err
    assert "warning: 1 package(s)" in err and "six" in err and "einops" not in err
    einops_file(m).write_text("# damaged\n")
    with user_error("env.changed") as e:
        steps.verify_stack(ctx)
    assert "einops" in e.value.message
