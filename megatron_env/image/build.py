"""`image`: the profile's lock, Megatron and cached kernels as an OCI layout (and a squashfs),
layer by layer from least to most often changed, each layer kept in the cache under a key of
what made it: a lock change rebuilds the layer that holds the changed package and the small
settings layer, and reuses the rest byte for byte.

Layers: base; torch + nvidia-* (+ triton, cuda-*); the rest of the lock; the built kernels
(when the build cache has them for this profile, else the labels say absent); Megatron at its
pinned commit with the patches; settings (/etc/megatron-env/image.json). The layout is written
into a temporary directory beside --out and renamed into place when whole.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_env import __version__, digest, files, output, proc
from megatron_env.errors import UserError
from megatron_env.image import base as base_mod
from megatron_env.image import envlayers, oci, squash
from megatron_env.image.tarlayer import GZIP_LEVEL, LayerWriter, Written
from megatron_env.profile import Profile
from megatron_env.pyenv import lock, uv
from megatron_env.sources import repos

FORMAT = 1  # of the layers' keys: a change of how a layer is written changes it
# The files' time in the layers that hold content (base, torch, packages, kernels, Megatron):
# the same for every lock, so that a layer's bytes depend only on what it holds and a moved pin
# changes only the layers that hold it. 1980-01-01, the earliest time a zip (a wheel built
# from these files inside the container) can record. SOURCE_DATE_EPOCH, when set, is used instead.
CONTENT_EPOCH = 315532800
SETTINGS_FILE = "etc/megatron-env/image.json"


@dataclass
class Result:
    out: Path
    digest: str
    layers: list[oci.Layer]
    reused: list[str]
    kernels: str
    seconds: float
    sqsh: Path | None = None
    sqsh_sha256: str | None = None
    phases: dict[str, float] = field(default_factory=dict)  # seconds of each part
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(x.size for x in self.layers)

    def as_json(self) -> dict[str, Any]:
        return {"command": "image", "ok": True, "out": str(self.out), "digest": self.digest,
                "size": self.size, "seconds": round(self.seconds, 2), "kernels": self.kernels,
                "layers": [{"what": x.what, "digest": x.digest, "size": x.size,
                            "reused": x.what in self.reused} for x in self.layers],
                "sqsh": str(self.sqsh) if self.sqsh else None,
                "sqsh_sha256": self.sqsh_sha256, "labels": self.labels,
                "phases": {k: round(v, 2) for k, v in self.phases.items()}}


def content_epoch() -> int:
    """The files' time in the content layers: SOURCE_DATE_EPOCH, else CONTENT_EPOCH."""
    given = os.environ.get("SOURCE_DATE_EPOCH")
    return int(given) if given is not None and given.isdigit() else CONTENT_EPOCH


def epoch_of(profile: Profile) -> int:
    """The image's own time (its config's `created`, the settings layer): SOURCE_DATE_EPOCH,
    else the commit time of the profile's lock (the same lock, the same time, on every
    machine)."""
    given = os.environ.get("SOURCE_DATE_EPOCH")
    if given is not None:
        if not given.isdigit():
            raise UserError(f"SOURCE_DATE_EPOCH={given!r} is not a number of seconds",
                            fix="unset it or give seconds since 1970", kind="image.epoch")
        return int(given)
    lockfile = profile.lock_file
    r = proc.run(["git", "log", "-1", "--format=%ct", "--", lockfile.name], cwd=lockfile.parent,
                 timeout=60)
    if r.ok and r.stdout.strip().isdigit():
        return int(r.stdout.strip())
    raise UserError(f"{lockfile} has no commit time (not in a git checkout, or not committed); "
                    "the image's file times come from it",
                    fix="commit the lock, or set SOURCE_DATE_EPOCH", kind="image.epoch")


def check_out(out: Path) -> Path:
    out = out.absolute()
    if out.exists() and not (out.is_dir() and (out / "oci-layout").is_file()):
        raise UserError(f"--out {out} exists and is not an image layout; nothing was written",
                        fix="name a new directory (an earlier image there is replaced whole)",
                        kind="image.out-exists")
    return out


class _Cache:
    """Layers by key, each a blob and a small JSON of its digests, published whole."""

    def __init__(self, root: Path) -> None:
        self.root = root / "image" / "layers"

    def get(self, key: str, what: str) -> oci.Layer | None:
        meta, blob = self.root / f"{key}.json", self.root / f"{key}.tar.gz"
        if not (meta.is_file() and blob.is_file()):
            return None
        doc, _why = files.read_json(meta)
        if not isinstance(doc, dict) or doc.get("size") != blob.stat().st_size:
            return None
        return oci.Layer(blob, str(doc["digest"]), str(doc["diff_id"]), int(doc["size"]),
                         oci.MEDIA_LAYER_GZIP, what)

    def put(self, key: str, what: str, make: Callable[[Path], Written]) -> oci.Layer:
        blob = self.root / f"{key}.tar.gz"
        with files.publishing(blob) as tmp:
            w = make(tmp)
        files.write_text(self.root / f"{key}.json", json.dumps(
            {"digest": w.digest, "diff_id": w.diff_id, "size": w.size, "what": what}) + "\n")
        return oci.Layer(blob, w.digest, w.diff_id, w.size, oci.MEDIA_LAYER_GZIP, what)


def tools(python_version: str) -> dict[str, str]:
    """Every tool whose version shapes the image's bytes."""
    r = proc.run([uv.exe(), "--version"], timeout=30)
    return {"megatron-env": __version__, "uv": r.stdout.strip().split(" ")[-1] if r.ok else "?",
            "python-bytecode": python_version, "zlib": zlib.ZLIB_RUNTIME_VERSION,
            "gzip-level": str(GZIP_LEVEL), "python-tarfile": sys.version.split()[0]}


def _python_version(exe: str) -> str:
    r = proc.run([exe, "-c", "import sys; print(sys.version.split()[0])"], timeout=60)
    return r.stdout.strip() if r.ok else "?"


def build(profile: Profile, out: Path, *, base: str | None = None, sqsh: Path | None = None,
          python: str | None = None, echo: output.Echo = output.status) -> Result:
    t0 = time.monotonic()
    stale = lock.stale(profile)
    if stale:
        raise UserError(f"the lock no longer matches profile {profile.name}: {stale[0]}",
                        fix=f"run `invoke lock --profile {profile.name}` and commit it",
                        kind="image.lock-stale")
    out = check_out(out)
    if sqsh is not None:
        sqsh = sqsh.absolute()
        if sqsh.is_dir():
            raise UserError(f"--sqsh {sqsh} is a directory; the squashfs is one file",
                            fix=f"name a file: --sqsh {sqsh / (profile.name + '.sqsh')}",
                            kind="image.out-exists")
    epoch = epoch_of(profile)
    files_epoch = content_epoch()
    lock_text = profile.lock_file.read_text()
    lock_digest = digest.of_file(profile.lock_file)
    minor = profile.python
    exe, _where = lock.find_python(minor, python)
    pyver = _python_version(exe)
    tag = "cpython-" + minor.replace(".", "")
    cache_root = repos.cache_dir()
    cache = _Cache(cache_root)
    need_glibc = lock.PLATFORM.split("manylinux_", 1)[1].replace("_", ".")
    reused: list[str] = []
    with files.scratch(out) as work:
        forbidden = (str(work).encode(),)
        b = base_mod.load(base, minor, need_glibc, work, cache_root, files_epoch, echo)
        phases = {"base": time.monotonic() - t0}
        common = {"format": FORMAT, "epoch": files_epoch, "python": pyver,
                  "prefix": envlayers.PREFIX, "base-python": b.python,
                  "platform": lock.PLATFORM, "tools": tools(pyver)}
        heavy, rest = envlayers.split_pins(lock_text)

        def env_layer(what: str, names: set[str], with_skeleton: bool) -> oci.Layer:
            # the blocks only: lock.subset keeps the comment lines after the last block taken
            # (the seal names every pin; a key must not change with a pin of another layer)
            sub = "".join(line for line in lock.subset(lock_text, names).splitlines(True)
                          if not line.startswith("#"))
            key = "env-" + digest.hexpart(digest.of({**common, "what": what, "pins": sub,
                                                     "skeleton": with_skeleton}), 24)
            hit = cache.get(key, what)
            if hit is not None:
                echo(f"layer {what}: unchanged (cached)")
                reused.append(what)
                return hit
            stage = work / f"stage-{what}"
            echo(f"layer {what}: installing {len(names)} packages at {envlayers.PREFIX}")
            envlayers.venv(exe, stage, echo)
            if names:
                reqs = work / f"{what}.lock"
                reqs.write_text(sub)
                envlayers.install(stage, [str(reqs)], echo)
            st = envlayers.collect(stage, minor, envlayers.PREFIX)
            echo(f"layer {what}: bytecode for {envlayers.PREFIX}")
            envlayers.compile_bytecode(exe, stage / st.site, stage, envlayers.PREFIX)
            paths = [p for d in sorted(st.dists) for p in envlayers.with_bytecode(
                st, st.dists[d], tag)]
            extra = envlayers.skeleton(minor, b.python) if with_skeleton else {}
            echo(f"layer {what}: writing {len(paths)} files")
            layer = cache.put(key, what, lambda dest: envlayers.write_layer(
                dest, files_epoch, envlayers.PREFIX, stage, paths, st.data, extra, forbidden))
            shutil.rmtree(stage, ignore_errors=True)
            return layer

        layers = list(b.layers)
        t1 = time.monotonic()
        layers.append(env_layer("torch", heavy, True))
        phases["torch"] = time.monotonic() - t1
        t1 = time.monotonic()
        layers.append(env_layer("packages", rest, False))
        phases["packages"] = time.monotonic() - t1
        t1 = time.monotonic()
        kernels, kernel_layer = _kernels(profile, work, exe, minor, tag, files_epoch, common,
                                         cache, forbidden, reused, echo)
        if kernel_layer is not None:
            layers.append(kernel_layer)
        layers.append(_megatron(profile, work, exe, minor, files_epoch, common, cache, forbidden,
                                reused, echo))
        phases["kernels+megatron"] = time.monotonic() - t1
        t1 = time.monotonic()
        labels = {"org.opencontainers.image.created": _iso(epoch),
                  "org.opencontainers.image.title": f"megatron-env {profile.name}",
                  "megatron-env.profile": profile.name,
                  "megatron-env.lock-digest": lock_digest,
                  "megatron-env.version": __version__,
                  "megatron-env.kernels": kernels,
                  "megatron-env.base": json.dumps({k: v for k, v in b.record.items()
                                                   if k != "packages" and k != "layer"},
                                                  sort_keys=True),
                  "megatron-env.tools": json.dumps(common["tools"], sort_keys=True),
                  "megatron-env.megatron": f"{profile.megatron['tag']}@"
                                           f"{profile.megatron['commit']}"}
        env = _env(b.env, profile)
        record = {"profile": profile.name, "lock_digest": lock_digest,
                  "pins": lock.parse_lock(lock_text), "labels": labels, "env": env,
                  "base": b.record, "layers": [x.what for x in layers]}
        settings = _settings(work, record, epoch, forbidden)
        layers.append(settings)
        config = {"architecture": "amd64", "os": "linux", "created": _iso(epoch),
                  "config": {"Env": [f"{k}={v}" for k, v in env.items()], "Labels": labels,
                             "Cmd": ["/bin/sh"], "WorkingDir": "/"},
                  "rootfs": {"type": "layers", "diff_ids": [x.diff_id for x in layers]},
                  "history": [{"created": _iso(epoch), "created_by": f"megatron-env image: "
                               f"{x.what}"} for x in layers]}
        staged = work / "layout"
        echo(f"layout: {len(layers)} layers")
        mdigest = oci.write(staged, layers, config,
                            {"org.opencontainers.image.created": _iso(epoch)})
        _publish(staged, out)
        phases["settings+layout"] = time.monotonic() - t1
        res = Result(out, mdigest, layers, reused, kernels, 0.0, labels=labels, phases=phases)
        if sqsh is not None:
            t1 = time.monotonic()
            squash.write(layers, config, sqsh, files_epoch, echo)
            res.sqsh, res.sqsh_sha256 = sqsh, digest.file_hex(sqsh)
            phases["sqsh"] = time.monotonic() - t1
    res.seconds = time.monotonic() - t0
    return res


def _iso(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _env(base_env: dict[str, str], profile: Profile) -> dict[str, str]:
    env = dict(base_env)
    env["PATH"] = f"{envlayers.PREFIX}/bin:{base_env.get('PATH', base_mod.DEFAULT_PATH)}"
    env["VIRTUAL_ENV"] = envlayers.PREFIX
    env["NVIDIA_VISIBLE_DEVICES"] = "all"
    env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
    env["TORCH_CUDA_ARCH_LIST"] = ";".join(profile.archs)
    return env


def _settings(work: Path, record: dict[str, Any], epoch: int,
              forbidden: tuple[bytes, ...]) -> oci.Layer:
    dest = work / "settings.tar.gz"
    body = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
    with LayerWriter(dest, epoch, forbidden) as w:
        w.directory("etc")
        w.directory("etc/megatron-env")
        w.data(SETTINGS_FILE, body)
        written = w.close()
    return oci.Layer(dest, written.digest, written.diff_id, written.size, oci.MEDIA_LAYER_GZIP,
                     "settings")


def _kernels(profile: Profile, work: Path, exe: str, minor: str, tag: str, epoch: int,
             common: dict[str, Any], cache: _Cache, forbidden: tuple[bytes, ...],
             reused: list[str], echo: output.Echo) -> tuple[str, oci.Layer | None]:
    """The kernel wheels the build cache has for this profile, installed as one layer."""
    from megatron_env.bundle import make  # the cache's selection by profile, Python, torch, archs

    found = [p for _arc, p in make.cached_builds(profile) if p.suffix == ".whl"]
    names = sorted({p.name.split("-")[0] for p in found})
    if not found:
        wanted = ", ".join(sorted(profile.kernels)) or "none pinned"
        echo(f"layer kernels: absent ({wanted}: not in the build cache)")
        return f"absent: {wanted} not in the build cache (invoke build on a GPU node)", None
    key = "kernels-" + digest.hexpart(digest.of(
        {**common, "wheels": sorted(digest.file_hex(p) for p in found)}), 24)
    hit = cache.get(key, "kernels")
    if hit is not None:
        reused.append("kernels")
        return "present: " + ", ".join(names), hit
    stage = work / "stage-kernels"
    envlayers.venv(exe, stage, echo)
    envlayers.install(stage, [str(p) for p in found], echo, hashed=False)
    st = envlayers.collect(stage, minor, envlayers.PREFIX)
    envlayers.compile_bytecode(exe, stage / st.site, stage, envlayers.PREFIX)
    paths = [p for d in sorted(st.dists) for p in envlayers.with_bytecode(st, st.dists[d], tag)]
    layer = cache.put(key, "kernels", lambda dest: envlayers.write_layer(
        dest, epoch, envlayers.PREFIX, stage, paths, st.data, {}, forbidden))
    return "present: " + ", ".join(names), layer


def _megatron(profile: Profile, work: Path, exe: str, minor: str, epoch: int,
              common: dict[str, Any], cache: _Cache, forbidden: tuple[bytes, ...],
              reused: list[str], echo: output.Echo) -> oci.Layer:
    """Megatron-LM at the pinned commit with the patches, on the environment's path (.pth)."""
    from megatron_env.megatron import checkout

    key = "megatron-" + digest.hexpart(digest.of({**common, "checkout": checkout.key(profile)}),
                                       24)
    hit = cache.get(key, "megatron")
    if hit is not None:
        echo("layer megatron: unchanged (cached)")
        reused.append("megatron")
        return hit
    src = checkout.prepare(profile, echo)
    tree = work / "megatron"
    shutil.copytree(src, tree, symlinks=True,
                    ignore=shutil.ignore_patterns(".git", checkout.STAMP, "__pycache__"))
    envlayers.compile_bytecode(exe, tree, tree, envlayers.MEGATRON_AT)
    rels = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*")
                  if p.is_file() or p.is_symlink())
    top = envlayers.MEGATRON_AT.strip("/")
    pth = f"{envlayers.PREFIX.strip('/')}/lib/python{minor}/site-packages/megatron-lm.pth"

    def make(dest: Path) -> Written:
        from megatron_env.image.tarlayer import parents

        entries = {f"{top}/{r}": r for r in rels}
        names = sorted({*entries, pth, *parents([*entries, pth])})
        with LayerWriter(dest, epoch, forbidden) as w:
            for name in names:
                if name == pth:
                    w.data(name, f"{envlayers.MEGATRON_AT}\n".encode())
                elif name in entries:
                    w.file(name, tree / entries[name])
                else:
                    w.directory(name)
            return w.close()

    echo(f"layer megatron: {profile.megatron['tag']} at {envlayers.MEGATRON_AT}")
    return cache.put(key, "megatron", make)


def _publish(staged: Path, out: Path) -> None:
    """The finished layout at `out` in one rename (an earlier image there moved aside first)."""
    old = None
    if out.exists():
        old = files.temp_for(out.with_name(out.name + "-old"))
        os.rename(out, old)
    try:
        os.rename(staged, out)
    except OSError:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
