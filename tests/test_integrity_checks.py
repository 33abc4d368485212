"""Integrity checks that no other test held in place: each test here fails when its check is
removed, or its boundary moved by one (each was verified by breaking the code once; the list of
checks, tests and breaks is in docs/reliability.md, "Integrity checks and the tests that hold
them").

Most of these checks have a second line of defence behind them (a listed hash checked before a
download, and the download checked after; a zip's CRCs before its RECORD), so a test that goes
through the first line cannot see the second removed: these go around the first on purpose."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from megatron_env import files, profile
from megatron_env.bundle import layout, make, offline
from megatron_env.bundle.manifest import Manifest
from megatron_env.errors import UserError
from megatron_env.host import checks
from megatron_env.host.snapshot import Snapshot
from megatron_env.kernels import build, compiler, pool, source_trees
from megatron_env.pyenv import env, manifest
from megatron_env.recipes import recipe
from megatron_env.sources import index, index_config, repos

from .conftest import H200, user_error
from .gitrepo import git, repo_with
from .test_bundle_unpack import FILES, cache, write_bundle  # noqa: F401 - cache: the fixture
from .test_bundle_unpack import manifest as bundle_manifest
from .test_index import Index, served, tiny_sdist  # noqa: F401 - served: the fixture


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sdist_in(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    return tiny_sdist(where)


# --- downloads: sources/index.py, kernels/source_trees.py --------------------------------------


def test_a_find_links_file_with_another_hash_is_refused_and_not_published(tmp_path):
    """A find-links directory lists no hash: only the download's own sha256 stands between a
    swapped file and the cache."""
    good = sdist_in(tmp_path / "good")
    links = tmp_path / "links"
    swapped = sdist_in(links)
    swapped.write_bytes(swapped.read_bytes() + b"\0")  # another file under the pinned name
    cfg = index_config.Config([], [str(links)], True)
    with pytest.raises(UserError) as e:
        index.fetch("tinyk", good.name, sha(good.read_bytes()), tmp_path / "out.tar.gz", cfg,
                    echo=lambda *_: None)
    assert e.value.message.startswith(f"{good.name}: no copy with the pinned sha256")
    assert str(swapped) in e.value.message
    assert not list(tmp_path.glob("out.tar.gz*"))


def test_an_index_serving_other_bytes_than_it_lists_is_refused(tmp_path):
    """A file index whose page lists the pinned sha256 but whose file was swapped (a mirror
    that rewrote it): the listing agrees, the bytes do not."""
    good = sdist_in(tmp_path / "good")
    pin = sha(good.read_bytes())
    (tmp_path / "tinyk-1.0.tar.gz").write_bytes(good.read_bytes() + b"\0")
    page = tmp_path / "idx" / "simple" / "tinyk"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="../../../tinyk-1.0.tar.gz#sha256={pin}">'
                                     "tinyk-1.0.tar.gz</a>")
    cfg = index_config.Config([(tmp_path / "idx" / "simple").as_uri()])
    with pytest.raises(UserError) as e:
        index.fetch("tinyk", good.name, pin, tmp_path / "out.tar.gz", cfg, echo=lambda *_: None)
    assert "no copy with the pinned sha256" in e.value.message
    assert not list(tmp_path.glob("out.tar.gz*"))


def test_a_listed_hash_other_than_the_pin_is_not_downloaded(served, tmp_path):  # noqa: F811
    sdist = tiny_sdist(tmp_path)
    Index.files = {sdist.name: sdist}
    with pytest.raises(UserError):
        index.fetch("tinyk", sdist.name, "0" * 64, tmp_path / "x", index_config.Config([served]),
                    echo=lambda *_: None)
    assert [p for p, _accept in Index.seen] == ["/simple/tinyk/"]  # never /files/...


def test_a_local_sdist_with_another_hash_is_refused_and_not_cached(tmp_path, monkeypatch):
    """MEGATRON_ENV_SOURCE_<NAME> names a local copy: no index checks it; the build's own
    sha256 comparison does."""
    good = sdist_in(tmp_path / "good")
    other = sdist_in(tmp_path / "other")
    other.write_bytes(other.read_bytes() + b"\0")
    monkeypatch.setenv(recipe.source_var("tinyk"), str(other))
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    pkg = recipe.Package("tinyk", "1.0", recipe.Source(sha256=sha(good.read_bytes()),
                                                       url=good.name), cuda=False)
    with user_error("source.sha256") as e:
        source_trees.fetch(pkg, lambda *_: None)
    assert sha(other.read_bytes()) in e.value.message
    assert not source_trees.sdist_archive(pkg).exists()


def test_a_tag_that_moved_from_the_pinned_commit_is_refused(tmp_path, monkeypatch):
    """A real repository whose tag was moved to a later commit: the pinned commit is not
    checked out under the tag's name, and the refusal names both commits."""
    monkeypatch.setenv("MEGATRON_ENV_CACHE", str(tmp_path / "cache"))
    up = tmp_path / "upstream"
    pinned = repo_with(up, {"a.txt": "one\n"})
    git("tag", "v1", cwd=up)
    assert repos.checkout("tiny", str(up), "v1", pinned, tmp_path / "ok",
                          echo=lambda *_: None) == tmp_path / "ok"
    (up / "a.txt").write_text("two\n")
    git("commit", "-qam", "two", cwd=up)
    git("tag", "-f", "v1", cwd=up)
    moved = git("rev-parse", "HEAD", cwd=up)
    with user_error("source.tag-moved") as e:
        repos.checkout("tiny", str(up), "v1", pinned, tmp_path / "bad", echo=lambda *_: None)
    assert pinned in e.value.message and moved in e.value.message
    assert not (tmp_path / "bad").exists()


# --- the kernel build cache: kernels/compiler.py ------------------------------------------------


def _wheel(path: Path, members: dict[str, bytes], record: dict[str, bytes]) -> Path:
    """A wheel whose RECORD gives the sha256 of `record`'s bytes (its members may differ)."""
    def b64(d: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()

    rows = [f"{n},sha256={b64(d)},{len(d)}" for n, d in record.items()]
    with zipfile.ZipFile(path, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
        z.writestr("tinyk-1.0.dist-info/RECORD", "\n".join(rows + ["tinyk-1.0.dist-info/RECORD,,"])
                   + "\n")
    return path


def test_a_wheel_rezipped_with_an_edited_member_fails_its_record(tmp_path):
    """An old slot (no recorded sha256) is held to the wheel's RECORD: a member edited and the
    zip written again has whole CRCs, and only the RECORD hash tells."""
    built = {"tinyk/__init__.py": b"ANSWER = 42\n"}
    whl = _wheel(tmp_path / "a.whl", built, built)
    assert compiler.intact(whl, None)
    edited = _wheel(tmp_path / "b.whl", {"tinyk/__init__.py": b"ANSWER = 41\n"}, built)
    with zipfile.ZipFile(edited) as z:
        assert z.testzip() is None  # the archive itself is sound
    assert not compiler.intact(edited, None)


# --- the conda layer of a bundle: bundle/make.py ------------------------------------------------


def _conda_pkg(tmp_path: Path, data: bytes, pinned: bytes) -> dict[str, str]:
    """A conda-lock.yml package entry whose file holds `data` and whose lock pins `pinned`."""
    f = tmp_path / "channel" / "tinyk-1.0-0.conda"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)
    return {"name": "tinyk", "url": f.as_uri(), "path": f.name, "sha256": sha(pinned)}


def test_a_conda_package_with_another_hash_is_refused_and_not_cached(tmp_path):
    pkg = _conda_pkg(tmp_path, b"swapped on the channel", b"the package that was locked")
    with user_error("source.sha256"):
        make.fetch_conda_packages([pkg], lambda *_: None, cache=tmp_path / "cache")
    assert list((tmp_path / "cache" / "conda-pkgs").iterdir()) == []


def test_a_cached_conda_package_that_changed_is_downloaded_again(tmp_path):
    data = b"the package that was locked"
    pkg = _conda_pkg(tmp_path, data, data)
    (got,) = make.fetch_conda_packages([pkg], lambda *_: None, cache=tmp_path / "cache")
    assert got.read_bytes() == data
    got.write_bytes(b"changed in the cache")
    said: list[str] = []
    assert make.fetch_conda_packages([pkg], said.append, cache=tmp_path / "cache") == [got]
    assert got.read_bytes() == data and said == ["conda: 1/1 downloading tinyk-1.0-0.conda"]


# --- environment manifests: pyenv/manifest.py ----------------------------------------------------


def _site(tmp_path: Path, files_: dict[str, bytes], listed: tuple[str, ...] = ()) -> Path:
    """A site-packages with one distribution whose RECORD lists `files_` (with their sha256 as
    installers write it) and `listed` (named, never installed)."""
    site = tmp_path / "site-packages"
    info = site / "tinyk-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyk\nVersion: 1.0\n")
    rows = []
    for rel, data in files_.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={b64},{len(data)}")
    rows += [f"{rel},sha256=AAAA,1" for rel in listed] + ["tinyk-1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return site


def test_a_file_missing_when_the_manifest_was_made_is_reported(tmp_path):
    """A RECORD entry whose file was not there at scan time (an install that lost it): the
    manifest records it as absent and the deep check names it, never a silent pass."""
    site = _site(tmp_path, {"tinyk/__init__.py": b"A = 1\n"}, listed=("tinyk/_C.so",))
    m = manifest.scan([str(site)])
    assert manifest.hash_check(m) == [manifest.Difference(
        "missing", "tinyk", os.path.normpath(site / "tinyk/_C.so"))]


def test_a_file_changed_in_size_alone_is_named_by_stat(tmp_path):
    """Truncated in place, its mtime put back: the inode and mtime agree, the size does not."""
    site = _site(tmp_path, {"tinyk/__init__.py": b"A = 1\n"})
    m = manifest.scan([str(site)])
    f = site / "tinyk/__init__.py"
    st = f.stat()
    os.truncate(f, 2)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_ino == st.st_ino and f.stat().st_mtime_ns == st.st_mtime_ns
    assert manifest.stat_check(m) == [manifest.Difference("changed", "tinyk", str(f))]


def test_content_changed_behind_stats_back_fails_the_deep_check(tmp_path):
    """Same size, same inode, mtime put back: only the RECORD hash tells."""
    site = _site(tmp_path, {"tinyk/__init__.py": b"A = 1\n"})
    m = manifest.scan([str(site)])
    f = site / "tinyk/__init__.py"
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.write(b"A = 2\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert manifest.stat_check(m) == []
    assert manifest.hash_check(m) == [manifest.Difference("hash", "tinyk", str(f))]


def test_a_package_installed_after_the_manifest_is_extra(tmp_path):
    site = _site(tmp_path, {"tinyk/__init__.py": b"A = 1\n"})
    m = manifest.scan([str(site)])
    extra = site / "other-2.0.dist-info"
    extra.mkdir()
    (extra / "METADATA").write_text("Metadata-Version: 2.1\nName: other\nVersion: 2.0\n")
    assert manifest.stat_check(m) == [manifest.Difference("extra", "other", str(extra))]
    assert manifest.stat_check(m, ignore_extra={"other"}) == []


def test_a_record_hash_of_another_algorithm_is_not_taken_for_a_sha256(tmp_path):
    """RECORD may name another hash (PEP 376 allows any hashlib algorithm): it is not decoded
    as a sha256 and then reported as changed content."""
    site = _site(tmp_path, {"tinyk/__init__.py": b"A = 1\n"})
    record = site / "tinyk-1.0.dist-info" / "RECORD"
    b64 = base64.urlsafe_b64encode(hashlib.sha512(b"A = 1\n").digest()).rstrip(b"=").decode()
    record.write_text(record.read_text().replace(
        record.read_text().split("\n")[0], f"tinyk/__init__.py,sha512={b64},6"))
    m = manifest.scan([str(site)])
    assert manifest.hash_check(m) == []


def test_an_environment_from_another_lock_is_not_up_to_date(tmp_path):
    """The quick path of `invoke env` (nothing changed, by stat) holds only for the lock the
    environment was built from: its stamp's lock digest must be the lock's now."""
    site = _site(tmp_path, {"tinyk/__init__.py": b"A = 1\n"})
    prefix = tmp_path / "env"
    prefix.mkdir()
    manifest.save(manifest.scan([str(site)]), prefix / env.MANIFEST)
    (prefix / env.STAMP).write_text(json.dumps({"lock_digest": "built-from", "mode": "uv"}))
    prof = profile.load("core_v0.4.0-cu121")
    assert env.unchanged_summary(prof, prefix, "built-from").action == "up to date"
    assert env.unchanged_summary(prof, prefix, "the lock now") is None


# --- bundles: bundle/unpack.py, bundle/offline.py -----------------------------------------------


def test_a_bundle_without_a_file_its_manifest_lists_is_refused(cache, tmp_path):  # noqa: F811
    short = {k: v for k, v in FILES.items() if k != "source/README.md"}
    bad = write_bundle(tmp_path / "short.tar", short, bundle_manifest(FILES))
    with user_error("bundle.changed") as e:
        offline.unpacked([bad], lambda *_: None)
    assert "1 missing: source/README.md" in e.value.message


def test_a_bundle_file_of_the_right_hash_and_another_size_is_refused(cache, tmp_path):  # noqa: F811
    """The manifest records sha256 and size: a manifest whose size was edited (its hash left)
    does not describe the member."""
    doc = bundle_manifest(FILES)
    doc["files"]["source/README.md"]["size"] += 1
    bad = write_bundle(tmp_path / "resized.tar", FILES, doc)
    with user_error("bundle.changed") as e:
        offline.unpacked([bad], lambda *_: None)
    assert "1 changed: source/README.md" in e.value.message


def _made_for(prof: profile.Profile, python: str) -> Manifest:
    doc = bundle_manifest(FILES)
    doc["profile"] = {"name": prof.name, "digest": layout.profile_digest(prof), "python": python,
                      "torch": prof.torch, "cuda": prof.cuda}
    doc["python"], doc["platform"]["machine"] = python, platform.machine()
    return Manifest.parse(doc, "test")


def test_a_bundle_is_refused_for_a_profile_changed_since_it_was_made(tmp_path):
    """Same name, one byte of the profile changed: the bundle's wheels and locks were made for
    the other one."""
    envs = tmp_path / "envs"
    shutil.copytree(profile.envs_root() / "core_v0.4.0-cu121", envs / "core_v0.4.0-cu121")
    prof = profile.load("core_v0.4.0-cu121", envs)
    here = "{}.{}".format(*sys.version_info[:2])
    doc = _made_for(prof, here)
    offline.check_serves(doc, prof, sys.executable)  # as made: served
    prof.path.write_text(prof.path.read_text() + "\n")
    with user_error("bundle.profile-differs"):
        offline.check_serves(doc, profile.load("core_v0.4.0-cu121", envs), sys.executable)


def test_a_bundle_is_refused_for_another_python(tmp_path):
    prof = profile.load("core_v0.4.0-cu121")
    other = f"3.{sys.version_info[1] - 1}"
    with user_error("bundle.python-mismatch") as e:
        offline.check_serves(_made_for(prof, other), prof, sys.executable)
    assert f"serves Python {other}" in e.value.message


# --- snapshots: host/snapshot.py ----------------------------------------------------------------


def test_a_snapshot_record_naming_a_file_outside_it_is_not_followed(tmp_path):
    """meta.json comes with the snapshot (it is untrusted): an entry `../x` would have the
    check read and hash a file outside the directory; it is passed over."""
    outside = tmp_path / "secret"
    outside.write_text("not the snapshot's\n")
    snap = tmp_path / "snap"
    shutil.copytree(H200, snap)
    meta = json.loads((snap / "meta.json").read_text())
    meta["files"]["../secret"] = {"status": "ok", "sha256": "0" * 64}
    (snap / "meta.json").write_text(json.dumps(meta))
    assert not Snapshot.load(snap).hand_made


# --- host checks: the driver boundary and /dev/shm's ---------------------------------------------


def _driver_snapshot(tmp_path: Path, version: str) -> Path:
    snap = tmp_path / f"drv-{version}"
    snap.mkdir()
    text = (H200 / "nvidia-smi.txt").read_text().replace("580.159.04", version)
    assert version in text
    (snap / "nvidia-smi.txt").write_text(text)
    (snap / "meta.json").write_text('{"files": {}}')
    return snap


@pytest.mark.parametrize("name, version, want", [
    ("core_v0.4.0-cu121", "530.30.02", "pass"),  # the profile's min_driver
    ("core_v0.4.0-cu121", "530.30.01", "warn"),  # one before: minor-version compatibility
    ("core_v0.4.0-cu121", "525.60.13", "warn"),  # the oldest driver of CUDA 12's compatibility
    ("core_v0.4.0-cu121", "525.60.12", "fail"),
    ("core_v0.19.0-cu130", "580.65.06", "pass"),  # CUDA 13.0's minimum is its compat minimum
    ("core_v0.19.0-cu130", "580.65.05", "fail"),
])
def test_the_driver_boundaries_are_inclusive(tmp_path, name, version, want):
    prof = profile.load(name)
    found = checks.evaluate(prof, _driver_snapshot(tmp_path, version))
    assert next(f for f in found if f.id == "driver.version").status == want


@pytest.mark.parametrize("kib, want", [(1024 * 1024 - 4, "fail"), (1024 * 1024, "warn"),
                                       (8 * 1024 * 1024 - 4, "warn"), (8 * 1024 * 1024, "pass")])
def test_the_shm_boundaries(make_snapshot, kib, want):
    """`df -k /dev/shm` as it prints it, at each side of 1 GiB and 8 GiB."""
    df = ("Filesystem     1K-blocks  Used Available Use% Mounted on\n"
          f"shm            {kib:>9}     0 {kib:>9}   0% /dev/shm\n")
    snap = make_snapshot(shm=df)
    found = checks.evaluate(profile.load("core_v0.19.0-cu130"), snap)
    assert next(f for f in found if f.id == "sys.shm").status == want


# --- the build pool's ninja: kernels/pool.py ------------------------------------------------


def _ninja(d: Path, version: str) -> Path:
    """A `ninja` on PATH that answers --version as that release does (an old ninja cannot be
    installed here beside the new one; the choice between them is what is tested)."""
    d.mkdir(parents=True)
    f = d / "ninja"
    f.write_text(f"#!/bin/sh\necho {version}\n")
    f.chmod(0o755)
    return f


@pytest.mark.parametrize("versions, picked", [
    (["1.11.1", "1.13.0"], 0),  # the pool needs no make-jobserver client: the first on PATH
    (["1.13.0", "1.12.1"], 0),
    (["1.13.0"], 0),
])
def test_the_pool_takes_the_first_ninja_on_path(tmp_path, versions, picked):
    found = [_ninja(tmp_path / f"d{i}", v) for i, v in enumerate(versions)]
    shim = pool.shim(tmp_path / "pool", os.pathsep.join(str(f.parent) for f in found), 8)
    assert str(found[picked]) in (shim / "ninja").read_text()


def test_no_ninja_on_path_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    with user_error("build.no-ninja"):
        pool.shim(tmp_path / "pool", str(tmp_path / "d"), 8)


# --- profile files: profile._read_capped ---------------------------------------------------------


def test_a_profile_file_is_read_up_to_its_cap_and_refused_past_it(tmp_path):
    real = (profile.envs_root() / "core_v0.4.0-cu121" / "profile.toml").read_bytes()
    at = tmp_path / "at" / "profile.toml"
    at.parent.mkdir()
    at.write_bytes(real + b"#" * (profile.MAX_PROFILE_BYTES - len(real)))
    assert at.stat().st_size == profile.MAX_PROFILE_BYTES
    assert profile.load_file(at).python == "3.10"
    past = tmp_path / "past" / "profile.toml"
    past.parent.mkdir()
    past.write_bytes(at.read_bytes() + b"#")
    with user_error("profile.too-large"):
        profile.load_file(past)


# --- state files: files.read_json's cap -------------------------------------------------------


def test_a_state_file_is_read_up_to_its_cap_and_refused_past_it(tmp_path):
    at = tmp_path / "at.json"
    body = b'{"a": 1}'
    at.write_bytes(body + b" " * (files.STATE_MAX_BYTES - len(body)))  # whitespace: still JSON
    assert files.read_json(at) == ({"a": 1}, "")
    past = tmp_path / "past.json"
    past.write_bytes(at.read_bytes() + b" ")
    value, why = files.read_json(past)
    assert value is None and "larger than any file the tool writes" in why
