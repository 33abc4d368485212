"""The offline side of a bundle: unpacked once into the cache, checked against its manifest and
against the profile, Python and platform it serves, then handed to the chain.

Nothing is installed before the manifest matches (a changed or missing file is refused by name).
`use` returns a `Bundle`, a value the chain carries to the steps that fetch (repositories,
sdists, the lock's wheels, the conda layer); the only variables it implies are those of the
child processes, uv and pip (`Bundle.child_env`), which have no other way to be told."""

from __future__ import annotations

import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from megatron_env import digest, files, output, proc
from megatron_env.bundle import unpack
from megatron_env.bundle.layout import (
    MANIFEST,
    OWNED,
    manifest_digest,
    parse_manifest,
    profile_digest,
    read_manifest,
    read_manifest_bytes,
)
from megatron_env.bundle.manifest import Item, Manifest
from megatron_env.errors import UserError
from megatron_env.kernels import build
from megatron_env.profile import Profile
from megatron_env.pyenv import lock
from megatron_env.recipes.recipe import Package, source_var
from megatron_env.sources import repos
from megatron_env.sources.given import Given


def _chain(docs: dict[Path, Manifest]) -> list[Path]:
    """Order bundles (path -> manifest) base first: a delta's manifest names its base's digest."""
    paths = list(docs)
    by_digest = {manifest_digest(d): p for p, d in docs.items()}
    bases = {d.base for d in docs.values()}
    tops = [p for p in paths if manifest_digest(docs[p]) not in bases]
    chain = [tops[0]] if len(tops) == 1 else []
    while chain and (base := docs[chain[-1]].base) in by_digest:
        chain.append(by_digest[base])
    if not chain or set(chain) != set(paths):
        raise UserError(f"{', '.join(p.name for p in paths)} are not one bundle and its deltas",
                        fix="pass a bundle and the deltas made from it with --since",
                        kind="bundle.not-a-chain")
    return chain[::-1]


def unpacked(paths: list[Path], echo: output.Echo) -> Path:
    """Archives unpacked once (base first, deltas over it) under the cache, keyed by the chain
    of manifests, and verified (by the run that unpacked them, and again when reused)."""
    return _unpacked(paths, echo)[0]


def _unpacked(paths: list[Path], echo: output.Echo) -> tuple[Path, Manifest]:
    """`unpacked`, with the manifest of the newest bundle, read once."""
    for p in paths:
        if p.is_dir():
            raise UserError(f"{p} is a directory: pass it alone (unpack the deltas into it)",
                            fix=f"tar xf DELTA.tar -C {p}", kind="bundle.dir-in-chain")
        if not p.exists():
            raise UserError(f"{p} does not exist", fix="pass the bundle's path",
                            kind="bundle.missing")
    raws = {p: read_manifest_bytes(p) for p in paths}
    docs = {p: parse_manifest(p, raw) for p, raw in raws.items()}
    ordered = _chain(docs)
    chain = "".join(manifest_digest(docs[p]) for p in ordered)  # a delta alone differs
    key = digest.hexpart(digest.of_bytes(chain.encode()), 16)
    dest = repos.cache_dir() / "bundles" / key
    top = docs[ordered[-1]]
    if unpack.unpack(ordered, docs, raws[ordered[-1]], dest, echo):
        return dest, top
    try:  # an entry another run published: verified then, checked again now
        verify(dest, top)
    except UserError as e:
        echo(f"bundle: the cached copy {dest} changed since it was unpacked ({e.message}); "
             "unpacking again")
        files.discard(dest)
        unpack.unpack(ordered, docs, raws[ordered[-1]], dest, echo)
    return dest, top


def verify(root: Path, doc: Manifest) -> None:
    """Every file the manifest lists is there, with its size and sha256, and nothing else in
    the places the bundle owns; else refused by name."""
    sums = {}
    for rel, meta in doc.files.items():
        p = root / rel
        if p.is_file():
            size = p.stat().st_size
            sums[rel] = (digest.file_hex(p) if size == meta.size else "", size)
    changed, missing = unpack.mismatch(doc, sums)
    listed = set(doc.files)
    extra = sorted(rel for top in OWNED if (root / top).is_dir()
                   for rel in (f.relative_to(root).as_posix() for f in (root / top).rglob("*")
                               if f.is_file() or f.is_symlink()) if rel not in listed)
    if extra:
        raise UserError(f"bundle {root} holds {len(extra)} file(s) its manifest does not list: "
                        f"{', '.join(extra[:8])}; nothing was installed",
                        fix="remove them, or unpack the bundle again into an empty directory",
                        kind="bundle.unlisted-files")
    if changed or missing:
        raise unpack.refusal(root, changed, missing, "nothing was installed")


def _python_version(python: Path | str) -> str:
    r = proc.run([str(python), "-c", "import sys, platform; print('%d.%d' % sys.version_info[:2],"
                  " sys.platform, platform.machine())"], timeout=60)
    if not r.ok:
        raise UserError(f"{python} does not run: {r.tail(2)}", fix="pass a working interpreter",
                        kind="python.broken")
    return r.stdout.strip()


def check_serves(doc: Manifest, prof: Profile, python: Path | str | None) -> None:
    """The bundle was made for this profile (name and content), Python and platform."""
    made = doc.profile
    if made.name != prof.name:
        raise UserError(f"the bundle was made for profile {made.name}, not {prof.name}",
                        fix=f"pass --profile {made.name}, or make a bundle for {prof.name}",
                        kind="bundle.profile-mismatch")
    if made.digest != profile_digest(prof):
        raise UserError(f"profile {prof.name} at {prof.dir} differs from the one the bundle was "
                        "made from (profile, locks or patches)",
                        fix="run the tool from the bundle's own copy: cd BUNDLE/source",
                        kind="bundle.profile-differs")
    want = f"{doc.python} linux {doc.machine}"
    if python is not None:
        got = _python_version(python)
        if got != want:
            raise UserError(f"the bundle serves Python {doc.python} on linux "
                            f"{doc.machine}; {python} is Python "
                            + got.replace(" ", " on ", 1),
                            fix=f"use a Python {doc.python} interpreter, or make a bundle for "
                                "a profile of this Python", kind="bundle.python-mismatch")
    elif (sys.platform, platform.machine()) != ("linux", doc.machine):
        raise UserError(f"the bundle serves linux {doc.machine}, this is "
                        f"{sys.platform} {platform.machine()}", fix="use a bundle made for it",
                        kind="bundle.platform-mismatch")


def local_conda_lock(prof: Profile, root: Path, conda: Sequence[Item]) -> Path:
    """The profile's conda-lock.yml with each package URL pointing at the bundle's copy: what
    `invoke env` installs offline (written under the cache; the bundle may be read-only)."""
    text = lock.read(prof.conda_lock_file)
    for c in conda:
        if c["url"] not in text:
            raise UserError(f"{prof.conda_lock_file} does not list {c['url']}, "
                            "which the bundle carries", fix="run the tool from the bundle's "
                            "source/ directory", kind="bundle.profile-differs")
        local = (root / c.path).as_uri()
        text = text.replace(c["url"], local + ("#" + c["url"].split("#")[1] if "#" in c["url"]
                                               else ""))
    out = repos.cache_dir() / "bundle-conda" / f"{digest.hexpart(digest.of(text), 16)}.yml"
    return files.write_text(out, text)


@dataclass(frozen=True)
class Bundle:
    """A checked bundle as the chain uses it, passed down as a value: the profile it serves,
    where it lies, its repositories and sdists (`given`), the lock's wheels, the conda layer."""

    profile: Profile
    root: Path
    manifest: Manifest
    given: Given
    wheelhouse: Path | None
    conda_lock: Path | None
    kernels: Mapping[str, Package]  # the profile's kernel packages, resolved once

    @property
    def find_links(self) -> list[str]:
        return [str(self.wheelhouse)] if self.wheelhouse else []

    def child_env(self, cache: Path | None = None) -> dict[str, str]:
        """What uv and pip, as child processes, are told: no index, nothing downloaded, the
        bundle's wheels. uv gets a cache of its own: a cache that once saw an index makes uv
        fetch a pinned wheel from the index's URL even with --no-index and the same file in
        --find-links (uv 0.13.9)."""
        out = {"UV_NO_INDEX": "1", "UV_OFFLINE": "1", "PIP_NO_INDEX": "1",
               "UV_PYTHON_DOWNLOADS": "never",
               "UV_CACHE_DIR": str((cache or repos.cache_dir()) / "uv-offline")}
        if self.wheelhouse:
            out["UV_FIND_LINKS"] = str(self.wheelhouse)
        return out


def use(paths: Iterable[str | Path], profile_name: str | None,
        python: str | Path | Callable[[Profile], str | Path] | None,
        builds: str | None = "all", echo: output.Echo = output.status, *,
        adopt_flag: str = "--adopt PYTHON",
        build_cache: Path | None = None) -> Bundle:
    """Check the bundle (unpacking an archive once under the cache); -> the `Bundle` the chain
    is given. Nothing reaches the network afterwards: git sources come from the bundle's
    repositories, sdists and cached builds from its files, the lock's wheels from wheels/.

    `builds` names the kernel package the caller will build (`all`, or None for none): one the
    bundle was made without is refused here, before anything is installed. `adopt_flag`: how
    the calling command takes an existing interpreter (for the hint of an adopt bundle).
    `python` may be a function of the profile (the environment a build is for): the manifest
    and the profile are each read once."""
    from megatron_env.profile import load as load_profile

    given_paths = [Path(p).absolute() for p in paths]
    t0 = time.monotonic()
    if len(given_paths) == 1 and given_paths[0].is_dir():
        root = given_paths[0]
        doc = read_manifest(root)
        verify(root, doc)
    else:
        root, doc = _unpacked(given_paths, echo)
    prof = load_profile(profile_name or doc.profile.name)
    if callable(python):
        python = python(prof)
    if python is None and doc.mode == "full":
        python = lock.find_python(prof.python)[0]
    check_serves(doc, prof, python)
    if doc.mode == "adopt" and python is None:
        raise UserError("this bundle carries no environment (made with --adopt): it serves an "
                        "existing torch", fix=f"pass {adopt_flag}", kind="bundle.adopt-only")
    kernels = build.packages(prof)
    left_out = doc.without
    wanted = (set() if builds is None else set(kernels) if builds == "all" else {builds})
    if missing := sorted(wanted & set(left_out)):
        raise UserError(f"the bundle was made without {', '.join(missing)}: it carries no "
                        "source to build from", fix="set up with --no-builds, or bundle again "
                        f"without `--without {missing[0]}`", kind="bundle.left-out")
    check_carried_resources(doc, kernels, wanted)
    echo(f"bundle: {root}: {len(doc.files)} files match {MANIFEST} "
         f"({time.monotonic() - t0:.1f} s); "
         f"profile {prof.name}, Python {doc.python}, made {doc.made_at}")
    _cached_builds(root, doc, build_cache or build.cache_dir())
    given = Given(mirrors={r.name: root / r.path for r in doc.git},
                  sdists={x.name: root / x.path for x in doc.sources},
                  resources={r.name: root / r.path for r in doc.resources})
    return Bundle(prof, root, doc, given,
                  root / "wheels" if (root / "wheels").is_dir() else None,
                  local_conda_lock(prof, root, doc.conda) if doc.conda else None, kernels)


def check_carried_resources(doc: Manifest, kernels: Mapping[str, Package], wanted: set[str]
                            ) -> None:
    """Every recipe resource of the kernels to build is in the bundle (or named by the user's
    MEGATRON_ENV_SOURCE_ variable): refused before anything is installed, not at the build."""
    have = {r.name for r in doc.resources}
    lacking = sorted(f"{res.name} ({name})" for name in sorted(wanted) if name in kernels
                     for res in kernels[name].source.resources
                     if res.name not in have and not os.environ.get(source_var(res.name)))
    if lacking:
        raise UserError(f"the bundle carries no {', '.join(lacking)}: it was made by a version "
                        "that did not carry recipe resources", kind="bundle.resource-missing",
                        fix="make the bundle again with this version of megatron-env")


def _cached_builds(root: Path, doc: Manifest, cache: Path) -> None:
    """The bundle's kernel builds copied into the build cache (each slot by one rename)."""
    cached = cache / "wheels"
    for slot in sorted({Path(f).parent for f in doc.files if f.startswith("builds/")}):
        target = cached / slot.name
        if not target.exists():
            with files.publishing(target, tree=True) as tmp:  # another run's first: kept
                shutil.copytree(root / slot, tmp, dirs_exist_ok=True)
