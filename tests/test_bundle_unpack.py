"""Unpacking a bundle archive off the happy path, with real tar files, real processes and a real
cache directory: a tampered copy never takes the key of the good bundle, members the manifest
does not list are refused by name before anything is written outside a private directory, four
processes racing over one cache all succeed with one unpack, a killed unpack leaves nothing a
later run does not clean, truncated and foreign files are named as what they are, and `invoke
bundle` refuses an --out that is its --since input or a directory, with nothing changed."""

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from megatron_env import files
from megatron_env.bundle import layout, make, offline, unpack
from megatron_env.bundle import manifest as manifest_format
from megatron_env.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
FILES = {"source/README.md": b"the tool's tree\n", "tool/megatron_env-0.1.0-py3-none-any.whl":
         b"a wheel", "git/megatron-0123456789ab.git/HEAD": b"ref: refs/heads/pinned\n"}


def manifest(files: dict[str, bytes], **extra) -> dict:
    return {"format": manifest_format.FORMAT,
            "profile": {"name": "p", "digest": "d", "python": "3.10", "torch": "2.1.0",
                        "cuda": "12.1"}, "python": "3.10",
            "platform": {"system": "linux", "machine": "x86_64"}, "with_builds": False,
            "mode": "adopt", "made_at": "now", "base": None, "git": [], "sources": [],
            "files": {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b),
                          "role": layout.role(n)} for n, b in sorted(files.items())}, **extra}


def write_bundle(path: Path, files: dict[str, bytes], doc: dict | None = None,
                 members: list[tuple[tarfile.TarInfo, bytes | None]] = ()) -> Path:
    """A bundle archive as `make` writes it (manifest.json first), with `files` as members
    (their bytes may differ from what `doc` says: a tampered copy), then extra `members`."""
    doc = doc or manifest(files)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        raw = json.dumps(doc, indent=1).encode()
        info = tarfile.TarInfo(layout.MANIFEST)
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGATRON_ENV_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "bundles").glob("*.tmp-*")) \
        if (cache / "bundles").exists() else []


def entries(cache: Path) -> list[Path]:
    return [p for p in (cache / "bundles").glob("*") if (p / layout.MANIFEST).exists()] \
        if (cache / "bundles").exists() else []


def test_a_tampered_copy_is_refused_and_the_good_bundle_then_unpacks(cache, tmp_path):
    """Same manifest, one member changed: refused by name, nothing published under the key they
    share; the good bundle then unpacks, verified (before: refused for ever)."""
    good = write_bundle(tmp_path / "good.tar", FILES)
    bad_files = {**FILES, "source/README.md": b"the tool's TREE\n"}  # same size, other bytes
    bad = write_bundle(tmp_path / "bad.tar", bad_files, manifest(FILES))
    with pytest.raises(UserError) as e:
        offline.unpacked([bad], lambda *_: None)
    assert "does not match its manifest (1 changed: source/README.md)" in e.value.message
    assert entries(cache) == [] and leftovers(cache) == []
    said = []
    root = offline.unpacked([good], said.append)
    assert (root / "source/README.md").read_bytes() == FILES["source/README.md"]
    assert said == [f"bundle: unpacking good.tar into {root}"]
    offline.verify(root, layout.read_manifest(root))
    # a published entry changed later is not trusted: it is unpacked again from the archive
    (root / "source/README.md").write_bytes(b"edited in the cache\n")
    said.clear()
    assert offline.unpacked([good], said.append) == root
    assert "changed since it was unpacked" in said[0]
    assert said[1] == f"bundle: unpacking good.tar into {root}"
    assert (root / "source/README.md").read_bytes() == FILES["source/README.md"]


def _info(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x", link: str = ""
          ) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize("member, named, why", [
    ("absolute", None, "is an absolute path"),
    (_info("source/../../escape.txt"), "source/../../escape.txt", "is a path with `..`"),
    (_info("tool/extra-1.0-py3-none-any.whl", data=b"an extra wheel"),
     "tool/extra-1.0-py3-none-any.whl", "is not listed in its manifest.json"),
    (_info("source/link", tarfile.SYMTYPE, link="/etc/passwd"), "source/link",
     "is a link (to /etc/passwd)"),
    (_info("source/hard", tarfile.LNKTYPE, link="source/README.md"), "source/hard", "is a link"),
    (_info("source/fifo", tarfile.FIFOTYPE), "source/fifo", "is a device, fifo or other"),
    (_info("source/dev", tarfile.CHRTYPE), "source/dev", "is a device, fifo or other"),
    (_info("source/README.md", data=b"again"), "source/README.md", "is in the archive twice"),
])
def test_a_member_the_manifest_does_not_allow_refuses_the_bundle_by_name(
        cache, tmp_path, member, named, why):
    if member == "absolute":  # a path outside the cache that must not appear
        outside = tmp_path / "outside" / "planted.txt"
        member, named = _info(str(outside)), str(outside)
    b = write_bundle(tmp_path / "b.tar", FILES, members=[member])
    with pytest.raises(UserError) as e:
        offline.unpacked([b], lambda *_: None)
    assert e.value.message == (f"{b}: member {named} {why}" + e.value.message.split(why)[1])
    assert "the bundle is refused, nothing was unpacked" in e.value.message
    assert entries(cache) == [] and leftovers(cache) == []
    assert not (tmp_path / "outside").exists() and not (tmp_path / "escape.txt").exists()


def test_members_are_checked_without_tarfiles_data_filter(monkeypatch):
    """Python 3.10.0-3.10.11 have no filter="data": the checks stand on their own."""
    from megatron_env.sources import archive

    assert archive.problem(_info("/abs")[0]) == "an absolute path"
    assert archive.problem(_info("a/../../b")[0]) == "a path with `..`"
    assert archive.problem(_info("a/l", tarfile.SYMTYPE, link="../../x")[0], links=True) == \
        "a link pointing outside (../../x)"
    assert archive.problem(_info("a/l", tarfile.SYMTYPE, link="b/c")[0], links=True) is None
    assert archive.problem(_info("a/ok")[0]) is None


def test_a_directory_bundle_with_an_extra_wheel_is_refused(cache, tmp_path):
    root = offline.unpacked([write_bundle(tmp_path / "b.tar", FILES)], lambda *_: None)
    (root / "tool" / "evil-1.0-py3-none-any.whl").write_bytes(b"planted")
    with pytest.raises(UserError, match=r"holds 1 file\(s\) its manifest does not list: "
                                        r"tool/evil-1.0-py3-none-any.whl"):
        offline.verify(root, layout.read_manifest(root))


CHILD = """
import os, sys, time
from pathlib import Path
from megatron_env.bundle import offline, unpack
if sys.argv[3] == "nolock":  # a filesystem whose locks do not reach other nodes: rename alone
    import contextlib
    unpack._courtesy_lock = lambda path, echo: contextlib.nullcontext()
Path(sys.argv[2] + f".ready-{os.getpid()}").touch()
while not Path(sys.argv[2]).exists():
    time.sleep(0.002)
root = offline.unpacked([Path(sys.argv[1])], lambda s: print(s, file=sys.stderr, flush=True))
offline.verify(root, offline.read_manifest(root))
print(root)
"""


def _big_files(n: int, size: int) -> dict[str, bytes]:
    return {**FILES, **{f"wheels/w{i}-1.0-py3-none-any.whl": os.urandom(size) for i in range(n)}}


def _race(bundle: Path, cache: Path, go: Path, lock: str) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, "MEGATRON_ENV_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, bundle, go, lock], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    deadline = time.monotonic() + 60
    while len(list(go.parent.glob(go.name + ".ready-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # all four start unpacking at once
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


@pytest.mark.parametrize("lock", ["lock", "nolock"])
def test_four_processes_unpack_one_bundle_into_one_cache_three_times(tmp_path, lock):
    """With the file lock one process unpacks and three wait and reuse; without it (NFS across
    nodes) they race and the rename decides. Either way all succeed and nothing is left."""
    bundle = write_bundle(tmp_path / "b.tar", _big_files(6, 4 << 20))
    for round_ in range(3):
        cache = tmp_path / f"cache{round_}"
        results = _race(bundle, cache, tmp_path / f"go{round_}", lock)
        assert [r.returncode for r in results] == [0] * 4, [r.stderr for r in results]
        assert len({r.stdout for r in results}) == 1  # one entry for all
        unpacks = sum(r.stderr.count("bundle: unpacking b.tar") for r in results)
        lost = sum(r.stderr.count("bundle: another run published") for r in results)
        assert unpacks - lost == 1, [r.stderr for r in results]  # one rename won
        if lock == "lock":
            assert unpacks == 1, [r.stderr for r in results]
        assert leftovers(cache) == [] and len(entries(cache)) == 1


def test_a_killed_unpack_leaves_a_temp_dir_that_the_next_run_removes(tmp_path):
    bundle = write_bundle(tmp_path / "b.tar", _big_files(24, 8 << 20))  # ~200 MB to unpack
    cache = tmp_path / "cache"
    env = {**os.environ, "MEGATRON_ENV_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    go = tmp_path / "go"
    go.touch()
    p = subprocess.Popen([sys.executable, "-c", CHILD, bundle, go, "lock"], env=env,
                         stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    tmp = []
    while time.monotonic() < deadline and not any(d.glob("wheels/*") for d in tmp):
        tmp = list((cache / "bundles").glob("*.tmp-*")) if (cache / "bundles").exists() else []
        time.sleep(0.001)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    assert leftovers(cache) == [tmp[0].name] and entries(cache) == []
    again = subprocess.run([sys.executable, "-c", CHILD, bundle, go, "lock"], env=env,
                           capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"bundle: removed {tmp[0].name}, left by a run that was killed" in again.stderr
    assert leftovers(cache) == [] and len(entries(cache)) == 1


def test_stale_temp_dirs_of_other_hosts_go_after_hours_and_living_ones_stay(tmp_path):
    root = tmp_path / "bundles"
    old_other = root / "k1.tmp-othernode-123"
    new_other = root / "k2.tmp-othernode-123"
    mine_alive = root / f"k3.tmp-{files.host()}-{os.getpid()}"
    for d in (old_other, new_other, mine_alive):
        d.mkdir(parents=True)
    hours = time.time() - (unpack.STALE_HOURS + 1) * 3600
    os.utime(old_other, (hours, hours))
    assert unpack.sweep(root) == [old_other]
    assert new_other.exists() and mine_alive.exists()


def test_truncated_and_foreign_files_are_named_as_what_they_are(cache, tmp_path):
    good = write_bundle(tmp_path / "good.tar", _big_files(1, 1 << 16))
    data = good.read_bytes()
    for cut in (len(data) // 2 + 100, (len(data) // 2) // 512 * 512):
        short = tmp_path / f"short{cut}.tar"
        short.write_bytes(data[:cut])
        with pytest.raises(UserError) as e:
            offline.unpacked([short], lambda *_: None)
        assert e.value.message.startswith(f"{short} is truncated (copy it again)"), e.value
        assert leftovers(cache) == [] and entries(cache) == []
    z = tmp_path / "z.tar"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("a", "b")
    text = tmp_path / "t.tar"
    text.write_text("not a tar\n")
    empty = tmp_path / "e.tar"
    empty.touch()
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as tar:
        tar.add(ROOT / "README.md", arcname="README.md")
    for path, what in ((z, "a zip archive"), (text, "a text file"), (empty, "an empty file"),
                       (plain, "a tar archive without manifest.json first")):
        with pytest.raises(UserError) as e:
            offline.unpacked([path], lambda *_: None)
        assert e.value.message == f"{path} is not a megatron-env bundle: it is {what}"


def _invoke(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=300)


def test_bundle_out_equal_to_since_or_a_directory_is_refused_with_nothing_changed(tmp_path):
    base = write_bundle(tmp_path / "b.tar", FILES)
    before = base.read_bytes()
    link = tmp_path / "link.tar"
    link.symlink_to(base)
    for out in (base, link):
        r = _invoke("bundle", "--adopt", "--since", str(base), "--out", str(out))
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"--out {out} is the bundle given to --since ({base})" in " ".join(r.stderr.split())
        assert base.read_bytes() == before
    d = tmp_path / "outdir"
    d.mkdir()
    r = _invoke("bundle", "--adopt", "--out", str(d))
    assert r.returncode == 2 and f"--out {d} is a directory" in " ".join(r.stderr.split())
    assert list(d.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "b.tar", "link.tar", "outdir"]  # no .part, no staging directory


def test_check_out_sees_through_symlinks_and_relative_paths(tmp_path, monkeypatch):
    base = write_bundle(tmp_path / "b.tar", FILES)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="is the bundle given to --since"):
        make.check_out(Path("b.tar"), [Path("./sub/../b.tar")])
    assert make.check_out(Path("other.tar"), [base]) == tmp_path / "other.tar"


def tiny_wheel(where: Path, name: str = "tinytool", version: str = "1.0") -> Path:
    """A real, minimal pure-Python wheel that pip installs."""
    import base64

    files = {f"{name}/__init__.py": b"X = 1\n",
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()}"
        f",{len(b)}\n" for n, b in files.items()) + f"{name}-{version}.dist-info/RECORD,,\n"
    path = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, b in {**files, f"{name}-{version}.dist-info/RECORD": record.encode()}.items():
            z.writestr(n, b)
    return path


def test_the_tools_offline_install_takes_exactly_the_manifests_wheels(tmp_path):
    """scripts/install_tool.py: tool/ must hold what manifest.json lists, with those sha256;
    an extra or changed wheel refuses the install by name, nothing installed; the bundle as
    made installs with pip --no-index --require-hashes."""
    from megatron_env.bundle import tool

    d = tmp_path / "b"
    (d / "tool").mkdir(parents=True)
    tiny_wheel(d / "tool")
    tool.requirements(d / "tool")
    assert (d / "tool" / "requirements.txt").read_text().startswith("tinytool==1.0 --hash=sha256:")
    files = {f"tool/{p.name}": p.read_bytes() for p in (d / "tool").iterdir()}
    doc = manifest(files, python=f"{sys.version_info[0]}.{sys.version_info[1]}")
    (d / "manifest.json").write_text(json.dumps(doc))
    script = ROOT / "scripts" / "install_tool.py"
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}

    def install(bundle: Path, venv: Path):
        return subprocess.run([sys.executable, script, bundle, venv], capture_output=True,
                              text=True, env=env, timeout=300)

    extra = tiny_wheel(d / "tool", "planted")
    r = install(d, tmp_path / "v1")
    assert r.returncode == 2 and "1 not in manifest.json: tool/planted-1.0-py3-none-any.whl" in \
        r.stderr and not (tmp_path / "v1").exists(), r.stderr
    extra.unlink()
    wheel = d / "tool" / "tinytool-1.0-py3-none-any.whl"
    good = wheel.read_bytes()
    wheel.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    r = install(d, tmp_path / "v2")
    assert r.returncode == 2 and "1 changed: tool/tinytool-1.0-py3-none-any.whl" in r.stderr
    wheel.write_bytes(good)
    archive = write_bundle(tmp_path / "b.tar", files, doc)
    for bundle, venv in ((d, tmp_path / "v3"), (archive, tmp_path / "v4")):
        r = install(bundle, venv)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"megatron-env installed into {venv} from 2 checked files" in r.stdout
        check = subprocess.run([venv / "bin" / "python", "-c", "import tinytool; print(tinytool.X)"],
                               capture_output=True, text=True)
        assert check.stdout == "1\n", check.stderr


def test_a_dead_pid_is_stale_only_on_the_host_that_named_it(tmp_path):
    """pids are per host: a dead pid of this host frees its directory at once; the same pid
    under another host's name, or under no host's (older versions, on any node of a shared
    cache), waits for STALE_HOURS; a name that is no temporary directory is never stale."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead = int(child.stdout)  # exited: os.kill(dead, 0) fails unless the pid was reused
    made = {name: tmp_path / name for name in (
        f"k1.tmp-{files.host()}-{dead}", f"k2.tmp-{dead}", f"k3.tmp-othernode-{dead}",
        f"k4.tmp-{files.host()}-{os.getpid()}", "k5.tmp-x", "k6")}
    for d in made.values():
        d.mkdir()
    assert [n for n, d in made.items() if unpack.stale(d)] == [
        f"k1.tmp-{files.host()}-{dead}"]
    later = time.time() + (unpack.STALE_HOURS + 1) * 3600
    assert [n for n, d in made.items() if unpack.stale(d, now=later)] == [
        f"k1.tmp-{files.host()}-{dead}", f"k2.tmp-{dead}", f"k3.tmp-othernode-{dead}",
        f"k4.tmp-{files.host()}-{os.getpid()}"]
    assert not unpack.stale(tmp_path / f"k7.tmp-{files.host()}-{dead}")  # gone meanwhile
