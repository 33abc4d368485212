"""The offline side of a bundle: unpacked once into the cache, checked against its manifest and
against the profile, Python and platform it serves, then handed to the chain.

Nothing is installed before the manifest matches (a changed or missing file is refused by name);
the chain is then pointed at the bundle through the variables it already honours: uv's
UV_FIND_LINKS/UV_NO_INDEX/UV_OFFLINE, MEGATRON_ENV_MIRROR_<NAME>, MEGATRON_ENV_SOURCE_<NAME>."""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path

from megatron_env import digest, output, proc
from megatron_env.bundle.layout import MANIFEST, manifest_digest, profile_digest, read_manifest
from megatron_env.errors import UserError
from megatron_env.kernels import build
from megatron_env.profile import Profile
from megatron_env.pyenv import lock
from megatron_env.recipes import recipe
from megatron_env.sources import repos


def _chain(docs: dict[Path, dict]) -> list[Path]:
    """Order bundles (path -> manifest) base first: a delta's manifest names its base's digest."""
    paths = list(docs)
    by_digest = {manifest_digest(d): p for p, d in docs.items()}
    bases = {d.get("base") for d in docs.values()}
    tops = [p for p in paths if manifest_digest(docs[p]) not in bases]
    chain = [tops[0]] if len(tops) == 1 else []
    while chain and (base := docs[chain[-1]].get("base")) in by_digest:
        chain.append(by_digest[base])
    if not chain or set(chain) != set(paths):
        raise UserError(f"{', '.join(p.name for p in paths)} are not one bundle and its deltas",
                        fix="pass a bundle and the deltas made from it with --since")
    return chain[::-1]


def _unpack(paths: list[Path], echo) -> Path:
    """Archives unpacked once (base first, deltas over it) under the cache, keyed by the top
    manifest; a directory is used where it is."""
    if len(paths) == 1 and paths[0].is_dir():
        return paths[0]
    for p in paths:
        if p.is_dir():
            raise UserError(f"{p} is a directory: pass it alone (unpack the deltas into it)",
                            fix=f"tar xf DELTA.tar -C {p}")
        if not p.exists():
            raise UserError(f"{p} does not exist", fix="pass the bundle's path")
    docs = {p: read_manifest(p) for p in paths}
    ordered = _chain(docs)
    chain = "".join(manifest_digest(docs[p]) for p in ordered)  # a delta alone differs
    key = digest.hexpart(digest.of_bytes(chain.encode()), 16)
    dest = repos.cache_dir() / "bundles" / key
    if (dest / MANIFEST).exists():
        return dest
    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for p in ordered:
        echo(f"bundle: unpacking {p.name} into {dest}")
        try:
            with tarfile.open(p) as tar:
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise UserError(f"{p}: cannot unpack ({e})", fix="copy the bundle again") from None
    os.replace(tmp, dest)
    return dest


def verify(root: Path, doc: dict) -> None:
    """Every file the manifest lists is there, with its size and sha256; else refused by name."""
    missing, changed = [], []
    for rel, meta in doc["files"].items():
        p = root / rel
        if not p.is_file():
            missing.append(rel)
        elif p.stat().st_size != meta["size"] or digest.file_hex(p) != meta["sha256"]:
            changed.append(rel)
    if missing or changed:
        parts = []
        if changed:
            parts.append(f"{len(changed)} changed: {', '.join(changed[:8])}")
        if missing:
            parts.append(f"{len(missing)} missing: {', '.join(missing[:8])}")
        raise UserError(f"bundle {root} does not match its manifest ({'; '.join(parts)}); "
                        "nothing was installed",
                        fix="copy the bundle again from where it was made (a delta needs its "
                            "base unpacked first)")


def _python_version(python: Path | str) -> str:
    r = proc.run([str(python), "-c", "import sys, platform; print('%d.%d' % sys.version_info[:2],"
                  " sys.platform, platform.machine())"], timeout=60)
    if not r.ok:
        raise UserError(f"{python} does not run: {r.tail(2)}", fix="pass a working interpreter")
    return r.stdout.strip()


def check_serves(doc: dict, prof: Profile, python: Path | str | None) -> None:
    """The bundle was made for this profile (name and content), Python and platform."""
    made = doc["profile"]
    if made["name"] != prof.name:
        raise UserError(f"the bundle was made for profile {made['name']}, not {prof.name}",
                        fix=f"pass --profile {made['name']}, or make a bundle for {prof.name}")
    if made["digest"] != profile_digest(prof):
        raise UserError(f"profile {prof.name} at {prof.dir} differs from the one the bundle was "
                        "made from (profile, locks or patches)",
                        fix="run the tool from the bundle's own copy: cd BUNDLE/source")
    want = f"{doc['python']} linux {doc['platform']['machine']}"
    if python is not None:
        got = _python_version(python)
        if got != want:
            raise UserError(f"the bundle serves Python {doc['python']} on linux "
                            f"{doc['platform']['machine']}; {python} is Python "
                            + got.replace(" ", " on ", 1),
                            fix=f"use a Python {doc['python']} interpreter, or make a bundle for "
                                "a profile of this Python")
    elif (sys.platform, platform.machine()) != ("linux", doc["platform"]["machine"]):
        raise UserError(f"the bundle serves linux {doc['platform']['machine']}, this is "
                        f"{sys.platform} {platform.machine()}", fix="use a bundle made for it")


def local_conda_lock(prof: Profile, root: Path, doc: dict) -> Path:
    """The profile's conda-lock.yml with each package URL pointing at the bundle's copy: what
    `invoke env` installs offline (written under the cache; the bundle may be read-only)."""
    text = (prof.conda_lock_file).read_text()
    for c in doc["conda"]:
        if c["url"] not in text:
            raise UserError(f"{prof.conda_lock_file} does not list {c['url']}, "
                            "which the bundle carries", fix="run the tool from the bundle's "
                            "source/ directory")
        local = (root / c["path"]).as_uri()
        text = text.replace(c["url"], local + ("#" + c["url"].split("#")[1] if "#" in c["url"]
                                               else ""))
    out = repos.cache_dir() / "bundle-conda" / f"{digest.hexpart(digest.of(text), 16)}.yml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


def use(paths: Iterable[str | Path], profile_name: str | None, python: str | Path | None,
        builds: str | None = "all", echo=output.status) -> tuple[str, Path]:
    """Check the bundle, then point this process's chain at it; -> (profile name, its root).

    `builds` names the kernel package the caller will build (`all`, or None for none): one the
    bundle was made without is refused here, before anything is installed.

    Nothing reaches the network afterwards: uv and pip are told there is no index, git sources
    come from the bundle's repositories, sdists and cached builds from its files."""
    from megatron_env.profile import load as load_profile

    paths = [Path(p).absolute() for p in paths]
    root = _unpack(paths, echo)
    doc = read_manifest(root)
    t0 = time.monotonic()
    verify(root, doc)
    prof = load_profile(profile_name or doc["profile"]["name"])
    if python is None and doc["mode"] == "full":
        python = lock.find_python(prof.python)[0]
    check_serves(doc, prof, python)
    if doc["mode"] == "adopt" and python is None:
        raise UserError("this bundle carries no environment (made with --adopt): it serves an "
                        "existing torch", fix="pass --adopt PYTHON (or --python PYTHON)")
    left_out = doc.get("without", [])
    wanted = (set() if builds is None else set(build.packages(prof)) if builds == "all"
              else {builds})
    if missing := sorted(wanted & set(left_out)):
        raise UserError(f"the bundle was made without {', '.join(missing)}: it carries no "
                        "source to build from", fix="set up with --no-builds, or bundle again "
                        f"without `--without {missing[0]}`")
    echo(f"bundle: {len(doc['files'])} files match {MANIFEST} ({time.monotonic() - t0:.1f} s); "
         f"profile {prof.name}, Python {doc['python']}, made {doc['made_at']}")
    # uv's own cache of its own: a cache that once saw an index makes uv fetch a pinned wheel
    # from the index's URL even with --no-index and the same file in --find-links (uv 0.13.9)
    os.environ.update({"UV_NO_INDEX": "1", "UV_OFFLINE": "1", "PIP_NO_INDEX": "1",
                       "UV_PYTHON_DOWNLOADS": "never",
                       "UV_CACHE_DIR": str(repos.cache_dir() / "uv-offline")})
    if (root / "wheels").is_dir():
        os.environ["UV_FIND_LINKS"] = str(root / "wheels")
    for repo in doc["git"]:
        os.environ[repos.mirror_var(repo["name"])] = str(root / repo["path"])
    for sdist in doc["sources"]:
        os.environ[recipe.source_var(sdist["name"])] = str(root / sdist["path"])
    if doc.get("conda"):
        os.environ[lock.CONDA_LOCKFILE_ENV] = str(local_conda_lock(prof, root, doc))
    cached = build.cache_dir() / "wheels"
    for slot in sorted({Path(f).parent for f in doc["files"] if f.startswith("builds/")}):
        target = cached / slot.name
        if not target.exists():
            cached.mkdir(parents=True, exist_ok=True)
            shutil.copytree(root / slot, target.with_name(target.name + ".tmp-bundle"),
                            dirs_exist_ok=True)
            os.replace(target.with_name(target.name + ".tmp-bundle"), target)
    return prof.name, root
