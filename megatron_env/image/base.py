"""The base system under the environment: an OCI layout directory, an image tarball
(docker-archive or oci-archive), a root file system tarball, or, with none given, a minimal
Debian made by mmdebstrap. Read once, as a stream, for the two facts the environment needs of
it: an interpreter of the profile's Python (the environment's venv points at it) and a C
library new enough for the lock's wheels. Either missing is said before anything is built.

Why the base's own interpreter: a relocatable CPython (uv's, python-build-standalone) is a
download this tool never makes, and an interpreter copied from the build host would make the
image depend on that host. Debian ships one Python per release, so the default base serves a
profile whose Python is one of those (SUITES); any other needs a --base that has it.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import re
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from megatron_env import digest, files, output, proc
from megatron_env.errors import UserError
from megatron_env.image import oci
from megatron_env.image.tarlayer import CHUNK, LayerWriter

# The Debian release that ships each Python as its python3 (what mmdebstrap can install)
SUITES = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}
MIRROR_ENV = "MEGATRON_ENV_DEBIAN_MIRROR"  # another Debian mirror for the default base
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LIBC = ("lib/x86_64-linux-gnu/libc.so.6", "usr/lib/x86_64-linux-gnu/libc.so.6",
         "lib64/libc.so.6", "usr/lib64/libc.so.6")
_LIBC_VERSION = re.compile(rb"GNU C Library [^\n]{0,80}? version (\d+\.\d+)")
_LIBC_FILE = re.compile(r"^libc-(\d+\.\d+)\.so$")
FORMS = ("an OCI layout directory", "a docker-archive or oci-archive tarball",
         "a root file system tarball")
_FIX = ("give " + ", ".join(FORMS[:-1]) + " or " + FORMS[-1] + " (skopeo copy docker://IMAGE "
        "oci:DIR makes a layout from a registry image)")


@dataclass
class Base:
    """What the image is built on: its layers, its config's environment and what it holds."""

    layers: list[oci.Layer]
    env: dict[str, str]
    python: str  # the interpreter's path in the image, e.g. /usr/bin/python3.11
    glibc: str
    record: dict[str, Any] = field(default_factory=dict)


def not_image(what: str) -> UserError:
    return UserError(f"--base {what} is not an image", fix=_FIX, kind="image.base-not-image")


# --- what a base holds ----------------------------------------------------------------------


@dataclass
class _Facts:
    pythons: dict[str, str] = field(default_factory=dict)  # path in the image -> its kind
    glibc: str | None = None


def _norm(name: str) -> str:
    name = name[2:] if name.startswith("./") else name
    return name.lstrip("/").rstrip("/")


def _scan(tar: tarfile.TarFile, minor: str, facts: _Facts) -> None:
    """Note the interpreters of `minor` and the C library's version in one layer's stream."""
    wanted = {f"{d}/python{minor}" for d in ("usr/bin", "usr/local/bin", "bin")}
    for m in tar:
        name = _norm(m.name)
        head, _, leaf = name.rpartition("/")
        if leaf.startswith(".wh."):  # a whiteout removes what a lower layer had
            gone = f"{head}/{leaf[4:]}" if head else leaf[4:]
            facts.pythons.pop(gone, None)
            continue
        if name in wanted and (m.isfile() or m.issym() or m.islnk()):
            facts.pythons[name] = "file" if m.isfile() else "link"
        elif (v := _LIBC_FILE.match(leaf)) and head.endswith(("lib/x86_64-linux-gnu", "lib64")):
            facts.glibc = v.group(1)
        elif name in _LIBC and m.isfile() and m.size < 64 << 20:
            f = tar.extractfile(m)
            if f is not None and (v2 := _LIBC_VERSION.search(f.read())):
                facts.glibc = v2.group(1).decode()


def _open_layer(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, mode="r|*", bufsize=CHUNK)
    except tarfile.TarError:
        raise UserError(f"{path.name}: a layer that is neither tar nor gzip (zstd layers are not "
                        "read)", fix="copy the base with skopeo copy --dest-compress-format "
                                     "gzip oci:DIR", kind="image.base-not-image") from None


def facts_of(layers: list[oci.Layer], minor: str) -> _Facts:
    facts = _Facts()
    for layer in layers:
        with _open_layer(layer.path) as tar:
            try:
                _scan(tar, minor, facts)
            except (tarfile.TarError, EOFError, OSError, zlib_error) as e:
                raise UserError(f"{layer.path}: a damaged layer ({e})", fix=_FIX,
                                kind="image.base-not-image") from None
    return facts


try:
    from zlib import error as zlib_error
except ImportError:  # pragma: no cover - zlib is part of every CPython that runs this tool
    zlib_error = OSError  # type: ignore[misc,assignment]


def check_runs(facts: _Facts, minor: str, need_glibc: str, where: str) -> tuple[str, str]:
    """(interpreter path, glibc) of a base the environment can run on, else one line why not."""
    if facts.glibc is None:
        raise UserError(f"--base {where} has no GNU C library (lib/x86_64-linux-gnu/libc.so.6); "
                        "the lock's manylinux wheels need one",
                        fix="use a glibc-based image (Debian, Ubuntu, RHEL; not Alpine)",
                        kind="image.base-cannot-run")
    if _ver(facts.glibc) < _ver(need_glibc):
        raise UserError(f"--base {where} has glibc {facts.glibc}; the lock's wheels need "
                        f"{need_glibc} or newer (manylinux_{need_glibc.replace('.', '_')})",
                        fix="use a newer base (Debian 10+, Ubuntu 20.04+, RHEL 8+)",
                        kind="image.base-cannot-run")
    if not facts.pythons:
        raise UserError(f"--base {where} has no python{minor}; the environment's venv needs an "
                        f"interpreter of the profile's Python {minor} in the base",
                        fix=f"use a base with python{minor} in /usr/bin or /usr/local/bin",
                        kind="image.base-cannot-run")
    first = sorted(facts.pythons, key=lambda p: (not p.startswith("usr/bin"), p))[0]
    return "/" + first, facts.glibc


def _ver(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


# --- the forms of --base --------------------------------------------------------------------


def load(given: str | None, minor: str, need_glibc: str, work: Path, cache: Path, epoch: int,
         echo: output.Echo = output.status) -> Base:
    """The base as layers in `work` (or the cache), checked for the environment."""
    if given is None:
        layer, record = debian(minor, cache, epoch, echo)
        layers, env, where = [layer], {"PATH": DEFAULT_PATH}, f"debian {record['suite']}"
    else:
        layers, env, record = _given(given, work, cache, epoch, echo)
        where = given
    echo(f"base: reading {len(layers)} layer(s) of {where} for python{minor} and glibc")
    facts = facts_of(layers, minor)
    python, glibc = check_runs(facts, minor, need_glibc, where)
    return Base(layers, env, python, glibc, {**record, "python": python, "glibc": glibc})


def _given(given: str, work: Path, cache: Path, epoch: int, echo: output.Echo
           ) -> tuple[list[oci.Layer], dict[str, str], dict[str, Any]]:
    p = Path(given)
    if "://" in given or not p.exists():
        what = "does not exist" if "://" not in given else "is a reference, not a local image"
        raise UserError(f"--base {given}: unknown form ({what})", fix=_FIX,
                        kind="image.base-unknown-form")
    if p.is_dir():
        if not (p / "oci-layout").is_file() or not (p / "index.json").is_file():
            raise not_image(f"{given} (a directory without oci-layout and index.json)")
        layers, env = _from_layout(p, given)
        return layers, env, {"form": "oci-layout", "digest": _manifest_digest(p, given)}
    if not p.is_file():
        raise UserError(f"--base {given}: unknown form (not a directory or a regular file)",
                        fix=_FIX, kind="image.base-unknown-form")
    try:
        names = _names(p)
    except (tarfile.TarError, OSError, EOFError, zlib_error):
        raise not_image(f"{given} (not a tar archive)") from None
    if "oci-layout" in names and "index.json" in names:
        layout = work / "base-layout"
        _extract_layout(p, layout, given)
        layers, env = _from_layout(layout, given)
        return layers, env, {"form": "oci-archive", "sha256": digest.file_hex(p),
                             "digest": _manifest_digest(layout, given)}
    if "manifest.json" in names and any(n.endswith((".tar", "/layer.tar")) or
                                        n.startswith("blobs/") for n in names):
        layers, env = _from_docker_archive(p, work, given, echo)
        return layers, env, {"form": "docker-archive", "sha256": digest.file_hex(p)}
    if {"etc", "usr"} & {n.split("/")[0] for n in names}:
        sha = digest.file_hex(p)
        layer = _cached_rootfs(p, sha, cache, epoch, echo)
        return [layer], {"PATH": DEFAULT_PATH}, {"form": "rootfs", "sha256": sha}
    raise not_image(f"{given} (a tar archive that is no image and no root file system)")


def _names(p: Path) -> set[str]:
    """The top-level names of a tar archive (and its few top files), read as a stream."""
    out: set[str] = set()
    with tarfile.open(p, mode="r|*", bufsize=CHUNK) as tar:
        for m in tar:
            n = _norm(m.name)
            out.add(n)
            out.add(n.split("/")[0])
    if not out:
        raise tarfile.TarError("empty")
    return out


def _manifest_digest(layout: Path, given: str) -> str:
    return str(oci.pick_manifest(oci.read_json(layout / "index.json", given), given)["digest"])


def _from_layout(layout: Path, given: str) -> tuple[list[oci.Layer], dict[str, str]]:
    entry = oci.pick_manifest(oci.read_json(layout / "index.json", given), given)
    mpath = oci.blob_path(layout, str(entry.get("digest", "")))
    manifest = oci.read_json(mpath, f"{given}: manifest")
    if manifest.get("mediaType", entry.get("mediaType")) == oci.MEDIA_INDEX:
        entry = oci.pick_manifest(manifest, given)
        manifest = oci.read_json(oci.blob_path(layout, str(entry.get("digest", ""))), given)
    try:
        config = oci.read_json(oci.blob_path(layout, manifest["config"]["digest"]),
                               f"{given}: config")
        diff_ids = config["rootfs"]["diff_ids"]
        descs = manifest["layers"]
        if len(diff_ids) != len(descs):
            raise ValueError("diff_ids and layers differ in number")
        layers = []
        for d, diff in zip(descs, diff_ids, strict=True):
            path = oci.blob_path(layout, d["digest"])
            if not path.is_file():
                raise ValueError(f"blob {d['digest']} is missing")
            mt = d.get("mediaType", oci.MEDIA_LAYER_GZIP)
            if mt == oci.DOCKER_LAYER_GZIP:
                mt = oci.MEDIA_LAYER_GZIP
            layers.append(oci.Layer(path, d["digest"], diff, int(d["size"]), mt, "base"))
        env = _env_of(config)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"--base {given}: not a complete image ({e})", fix=_FIX,
                        kind="image.base-not-image") from None
    for layer in layers:
        if digest.file_hex(layer.path) != layer.digest.split(":", 1)[1]:
            raise UserError(f"--base {given}: blob {layer.digest} does not match its digest",
                            fix="copy the base again (skopeo copy)", kind="image.base-not-image")
    return layers, env


def _env_of(config: dict[str, Any]) -> dict[str, str]:
    env = {}
    for item in (config.get("config") or {}).get("Env") or []:
        k, sep, v = str(item).partition("=")
        if sep:
            env[k] = v
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def _safe(name: str) -> bool:
    parts = _norm(name).split("/")
    return bool(parts) and ".." not in parts and not name.startswith("/")


def _extract_layout(p: Path, layout: Path, given: str) -> None:
    """An oci-archive's layout files (only regular files under blobs/ and the two documents)."""
    with tarfile.open(p, mode="r|*", bufsize=CHUNK) as tar:
        for m in tar:
            n = _norm(m.name)
            if not m.isfile() or not _safe(m.name):
                continue
            if n in ("oci-layout", "index.json") or re.fullmatch(r"blobs/sha256/[0-9a-f]{64}", n):
                dest = layout / n
                dest.parent.mkdir(parents=True, exist_ok=True)
                f = tar.extractfile(m)
                if f is None:
                    raise not_image(given)
                with open(dest, "wb") as out:
                    shutil.copyfileobj(f, out, CHUNK)


def _from_docker_archive(p: Path, work: Path, given: str, echo: output.Echo
                         ) -> tuple[list[oci.Layer], dict[str, str]]:
    """`docker save`'s form: manifest.json names a config and layer tars (kept as they are,
    gzip-compressed here as OCI layers: their diff_ids are the config's)."""
    with tarfile.open(p, mode="r:*") as tar:
        def member(name: str) -> IO[bytes]:
            if not _safe(name):
                raise not_image(f"{given} (a path outside the archive: {name})")
            f = tar.extractfile(name)
            if f is None:
                raise not_image(f"{given} ({name} is not a file)")
            return f

        try:
            doc = _load_json(member("manifest.json"))
            entry = doc[0]
            config = _load_json(member(entry["Config"]))
            names = list(entry["Layers"])
            diff_ids = config["rootfs"]["diff_ids"]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise UserError(f"--base {given}: a docker-archive without a readable manifest "
                            f"({e})", fix=_FIX, kind="image.base-not-image") from None
        layers = []
        for i, (name, diff) in enumerate(zip(names, diff_ids, strict=False)):
            echo(f"base: layer {i + 1}/{len(names)} of {given}")
            dest = work / f"base-{i}.tar.gz"
            got_diff, size, blob = _gzip_stream(member(name), dest)
            if got_diff != diff:
                raise UserError(f"--base {given}: layer {name} does not match its diff_id",
                                fix="save the image again", kind="image.base-not-image")
            layers.append(oci.Layer(dest, blob, diff, size, oci.MEDIA_LAYER_GZIP, "base"))
    return layers, _env_of(config)


def _load_json(f: IO[bytes]) -> Any:
    import json

    return json.loads(f.read(oci.MAX_JSON))


def _gzip_stream(src: IO[bytes], dest: Path) -> tuple[str, int, str]:
    """src (a tar, or already gzip) as a gzip blob at dest -> (diff_id, size, digest)."""
    head = src.read(2)
    with open(dest, "wb") as out:
        if head == b"\x1f\x8b":  # already compressed: kept as it is
            out.write(head)
            shutil.copyfileobj(src, out, CHUNK)
        else:
            with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
                gz.write(head)
                shutil.copyfileobj(src, gz, CHUNK)
    raw = hashlib.sha256()
    with gzip.open(dest, "rb") as plain:
        while chunk := plain.read(CHUNK):
            raw.update(chunk)
    return "sha256:" + raw.hexdigest(), dest.stat().st_size, "sha256:" + digest.file_hex(dest)


# --- a root file system tarball as one reproducible layer -----------------------------------


def rootfs_layer(src: Path, dest: Path, epoch: int, echo: output.Echo) -> oci.Layer:
    """Its entries sorted, times the epoch, owners kept (a base system's groups matter), hard
    links written as the files they name (sorting may put a link before its target)."""
    plain = dest.with_name(dest.name + ".plain.tar")
    try:
        with open(src, "rb") as f:
            magic = f.read(6)
        openers: dict[bytes, Callable[[Path, str], IO[bytes]]] = {
            b"\x1f\x8b": gzip.open, b"BZ": bz2.open, b"\xfd7": lzma.open}  # type: ignore[dict-item]
        opener = openers.get(magic[:2])
        if opener is not None:  # random access below: decompressed once, not per member
            echo(f"base: decompressing {src.name}")
            with opener(src, "rb") as z, open(plain, "wb") as out:
                shutil.copyfileobj(z, out, CHUNK)
            src = plain
        with tarfile.open(src, "r:") as tar:
            members: dict[str, tarfile.TarInfo] = {}
            for m in tar.getmembers():
                n = _norm(m.name)
                if n and _safe(m.name):
                    members[n] = m  # a later entry of the same name wins, as on extraction
            with LayerWriter(dest, epoch, check_driver=False) as w:
                for name in sorted(members):
                    _copy_member(tar, members, name, w)
                written = w.close()
    finally:
        plain.unlink(missing_ok=True)
    return oci.Layer(dest, written.digest, written.diff_id, written.size, oci.MEDIA_LAYER_GZIP,
                     "base")


def _copy_member(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str,
                 w: LayerWriter) -> None:
    m = members[name]
    owner = (m.uid, m.gid)
    if m.isdir():
        w.directory(name, m.mode, owner)
    elif m.issym():
        w.symlink(name, m.linkname, owner)
    elif m.islnk():
        target = members.get(_norm(m.linkname))
        if target is None or not target.isfile():
            return  # a link to nothing in the archive: extraction would fail too
        f = tar.extractfile(target)
        if f is not None:
            w.stream(name, f, target.size, target.mode, owner)
    elif m.isfile():
        f = tar.extractfile(m)
        if f is not None:
            w.stream(name, f, m.size, m.mode, owner)
    elif m.ischr() or m.isblk() or m.isfifo():
        w.special(name, m)


def _cached_rootfs(p: Path, sha: str, cache: Path, epoch: int, echo: output.Echo) -> oci.Layer:
    """A root file system tarball's layer, made once per (its sha256, the epoch) and kept."""
    key = digest.hexpart(digest.of({"sha256": sha, "epoch": epoch, "format": 1}), 16)
    dest = cache / "image" / "base" / f"rootfs-{key}.tar.gz"
    meta = dest.with_suffix(".json")
    if dest.is_file() and meta.is_file():
        doc, _why = files.read_json(meta)
        if isinstance(doc, dict) and doc.get("size") == dest.stat().st_size:
            echo(f"base: {p.name} from the cache")
            return oci.Layer(dest, str(doc["digest"]), str(doc["diff_id"]), int(doc["size"]),
                             oci.MEDIA_LAYER_GZIP, "base")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with files.publishing(dest) as tmp:
        made = rootfs_layer(p, tmp, epoch, echo)
    files.write_text(meta, _json({"digest": made.digest, "diff_id": made.diff_id,
                                  "size": made.size}))
    return oci.Layer(dest, made.digest, made.diff_id, made.size, oci.MEDIA_LAYER_GZIP, "base")


# --- the default base: a minimal Debian -----------------------------------------------------


def debian(minor: str, cache: Path, epoch: int, echo: output.Echo
           ) -> tuple[oci.Layer, dict[str, Any]]:
    """mmdebstrap's minbase of the Debian release whose python3 is `minor`, with it installed;
    made once per (release, mirror, epoch) and kept in the cache, with the packages it holds."""
    suite = SUITES.get(minor)
    if suite is None:
        have = ", ".join(f"{s} {v}" for v, s in SUITES.items())
        raise UserError(f"no Debian release ships Python {minor} as its python3 ({have}); the "
                        "default base cannot run this profile's environment",
                        fix=f"pass --base an image that has python{minor} (an NGC PyTorch or "
                            "CUDA image of that Python: skopeo copy docker://IMAGE oci:DIR)",
                        kind="image.base-cannot-run")
    mirror = os.environ.get(MIRROR_ENV, "")
    include = [f"python{minor}"]
    key = digest.hexpart(digest.of({"suite": suite, "mirror": mirror, "include": include,
                                    "epoch": epoch, "variant": "minbase", "format": 1}), 16)
    dest = cache / "image" / "base" / f"debian-{suite}-{key}.tar.gz"
    meta = dest.with_suffix(".json")
    if dest.is_file() and meta.is_file():
        record, _why = files.read_json(meta)
        if isinstance(record, dict) and isinstance(record.get("layer"), dict):
            lay = record["layer"]
            echo(f"base: debian {suite} from the cache ({len(record.get('packages', []))} "
                 "packages)")
            return (oci.Layer(dest, lay["digest"], lay["diff_id"], int(lay["size"]),
                              oci.MEDIA_LAYER_GZIP, "base"), record)
    exe = proc.which("mmdebstrap")
    if exe is None:
        raise UserError("the default base needs mmdebstrap (a minimal Debian) and it is not "
                        "installed", fix="apt-get install mmdebstrap, or pass --base IMAGE",
                        kind="image.tool-missing")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with files.scratch(dest) as tmp:
        raw = tmp / "rootfs.tar"
        argv = [exe, "--variant=minbase", f"--include={','.join(include)}",
                "--mode=" + ("root" if os.geteuid() == 0 else "unshare"), "--format=tar",
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*", suite, str(raw)]
        if mirror:
            argv.append(mirror)
        echo(f"base: mmdebstrap {suite} with {', '.join(include)} (about a minute)")
        r = proc.run(argv, env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}, timeout=1800)
        if not r.ok:
            files.child_full(r.output, tmp, "the base system")
            raise UserError(f"mmdebstrap {suite} failed: {r.tail(4)}",
                            fix=f"check that the Debian archive is reachable ({MIRROR_ENV} "
                                "names a mirror) or pass --base IMAGE", kind="image.base-failed")
        packages = installed_packages(raw)
        layer = rootfs_layer(raw, tmp / dest.name, epoch, echo)
        record = {"form": "debian", "suite": suite, "mirror": mirror or "mmdebstrap's default",
                  "include": include, "packages": packages,
                  "layer": {"digest": layer.digest, "diff_id": layer.diff_id,
                            "size": layer.size}}
        with files.publishing(dest) as t:
            os.replace(tmp / dest.name, t)
        files.write_text(meta, _json(record))
    return oci.Layer(dest, layer.digest, layer.diff_id, layer.size, oci.MEDIA_LAYER_GZIP,
                     "base"), record


def _json(doc: Any) -> str:
    import json

    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def installed_packages(rootfs_tar: Path) -> list[str]:
    """`name=version` of every package dpkg's status file in the tarball says is installed."""
    with tarfile.open(rootfs_tar, "r:") as tar:
        for m in tar:
            if _norm(m.name) == "var/lib/dpkg/status" and m.isfile():
                f = tar.extractfile(m)
                return _status(f.read().decode(errors="replace")) if f else []
    return []


def _status(text: str) -> list[str]:
    out = []
    for para in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", para, re.M))
        if "installed" in fields.get("Status", "").split() and "Package" in fields:
            out.append(f"{fields['Package']}={fields.get('Version', '?')}")
    return sorted(out)

