"""The online side of a bundle: everything one profile's `invoke setup` needs, downloaded,
checked against the lock and the profile, and written into one archive with its manifest
(megatron_env.bundle.layout says what goes where)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_env import REPO_ROOT, __version__, digest, files, output, proc
from megatron_env.bundle import tool
from megatron_env.bundle.layout import (
    MACHINE,
    MANIFEST,
    manifest_digest,
    profile_digest,
    py_tag,
    read_manifest,
    repo_path,
    role,
)
from megatron_env.bundle.manifest import FileEntry, Item, MadeFor, Manifest
from megatron_env.errors import UserError
from megatron_env.kernels import build, compiler, source_trees
from megatron_env.profile import Profile
from megatron_env.pyenv import lock, lock_conda
from megatron_env.recipes.recipe import Package
from megatron_env.redact import mask_urls
from megatron_env.sources import http, patches, repos, resources
from megatron_env.units import MIB

# The tool's own tree as shipped (envs/ holds only the bundled profile).
SOURCE_ITEMS = ("megatron_env", "scripts", "patches", "docs", "tasks.py", "noxfile.py",
                "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
_PIP_NAME = re.compile(r"[-_.]+")


@dataclass
class Entry:
    """One file of the archive: its name there, where it is here, its role, digest and size."""
    arcname: str
    path: Path
    role: str
    sha256: str = ""
    size: int = 0


@dataclass
class Made:
    out: Path
    manifest: dict[str, Any]
    written: int  # files in this archive
    reused: int  # files a --since base already holds
    size: int
    seconds: float
    by_role: dict[str, int] = field(default_factory=dict)


def _source_tree(prof: Profile, dest: Path) -> None:
    """The tool's tree as it runs from a checkout, with only this profile under envs/."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".*.log", "*.egg-info")
    for item in SOURCE_ITEMS:
        src = REPO_ROOT / item
        if src.is_dir():
            shutil.copytree(src, dest / item, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / item)
    shutil.copytree(prof.dir, dest / "envs" / prof.name, ignore=ignore)


def _house(cache: Path | None) -> Path:
    """Where the lock's files are downloaded once, for every bundle of every profile."""
    return (cache or repos.cache_dir()) / "bundle-wheels"


def lock_bytes(prof: Profile, house: Path) -> tuple[int, int, int]:
    """(bytes of the lock's files, of those the bytes still to download, how many files' sizes
    are unknown), known before anything is downloaded or written: a file already in `house`
    by its size there, any other by the size the package index gives for the file the lock
    pins (as lock-diff reads it), where an index is configured and answers."""
    from concurrent.futures import ThreadPoolExecutor

    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    from megatron_env.pyenv import lockdiff
    from megatron_env.sources import index, index_config

    text = lock.read(prof.lock_file)
    pins, hashes = lock.parse_lock(text), lock.parse_hashes(text)
    cached: dict[tuple[str, str], int] = {}
    for f in house.glob("*.whl") if house.is_dir() else ():
        try:
            name, version, _build, _tags = parse_wheel_filename(f.name)
        except InvalidWheelFilename:
            continue
        cached[(canonicalize_name(name), str(version))] = f.stat().st_size
    have = {n: cached.get((canonicalize_name(n), v)) for n, v in pins.items()}
    rest = sorted(n for n, size in have.items() if size is None)
    fetched: list[int | None] = [None] * len(rest)
    cfg = index_config.configured()
    if rest and not cfg.no_index:
        url = index_config.installer_index()
        ask = index_config.Config(timeout=lockdiff.INDEX_TIMEOUT)

        def one(name: str) -> int | None:
            try:
                f = lockdiff.pick(index.files(name, url, ask), hashes.get(name, set()),
                                  prof.python)
                return index.size(f, url, ask) if f else None
            except UserError:  # an index that does not answer: that size is unknown
                return None

        with ThreadPoolExecutor(8) as pool:
            fetched = list(pool.map(one, rest))
    known = sum(size for size in have.values() if size is not None)
    to_get = sum(size for size in fetched if size is not None)
    return known + to_get, to_get, sum(size is None for size in fetched)


def _room(prof: Profile, out: Path, house: Path) -> None:
    """Refuse, before the first download or write, an --out (and a cache) without room for
    the lock's files: their sizes are known up front, and the free space is measured before
    this run has written anything (before: every wheel was downloaded first, then the free
    space left after the run's own staging was compared with the whole)."""
    total, to_get, unknown = lock_bytes(prof, house)
    what = f"bundle {out.name}: the files of {prof.lock_file.name}" + (
        f" ({unknown} of unknown size not counted)" if unknown else "")
    if files.mount_of(out.parent) == files.mount_of(house):
        files.ensure(out.parent, total + to_get, what + ", and their download")
        return
    files.ensure(out.parent, total, what)
    files.ensure(house, to_get, f"the download of the files of {prof.lock_file.name}")


def _env_wheels(prof: Profile, echo: output.Echo, *, cache: Path | None = None) -> list[Path]:
    """The lock's files, downloaded once into the cache and each checked against the lock."""
    lockfile = prof.lock_file
    text = lock.read(lockfile)
    allowed = lock.parse_hashes(text)
    total = len(allowed)
    house = _house(cache)
    house.mkdir(parents=True, exist_ok=True)
    seen = [0]

    def progress(line: str) -> None:  # one line a file: pip's "Downloading x.whl (530.7 MB)"
        m = re.match(r"\s*(Downloading|Using cached|File was already downloaded)\s+(\S+)(.*)",
                     line)
        if m:
            seen[0] += 1
            how = {"Downloading": "downloading"}.get(m.group(1), "cached")
            size = m.group(3).strip(" ()")
            echo(f"wheels: {seen[0]}/{total} {how} {Path(m.group(2)).name}"
                 + (f" ({size})" if size else ""))

    echo(f"wheels: {total} files of {lockfile.name} for Python {prof.python}, hashes required")
    r = lock.download_wheels(lockfile, house, prof.python, on_line=progress)
    if not r.ok:
        files.child_full(r.output, house, f"the files of {lockfile.name}")
        raise UserError(f"downloading the files of {lockfile} failed: {r.tail(4)}",
                        fix="check the package index or mirror (PIP_INDEX_URL, PIP_FIND_LINKS)",
                        kind="source.unreachable")
    by_hash: dict[str, Path] = {}
    for f in house.glob("*.whl"):
        by_hash[digest.file_hex(f)] = f
    chosen, missing = [], []
    for name, hashes in sorted(allowed.items()):
        hit = next((by_hash[h] for h in hashes if h in by_hash), None)
        if hit is None:
            missing.append(name)
            continue
        if _PIP_NAME.sub("-", hit.name.split("-")[0]).lower() != name:
            raise UserError(f"{hit.name} carries a hash the lock gives {name}",
                            fix=f"remove {house} and run `invoke bundle` again",
                            kind="bundle.wheel-mismatch")
        chosen.append(hit)
    if missing:
        raise UserError(f"no file matching the lock's sha256 for: {', '.join(missing)}",
                        fix=f"the index served other files; remove {house} and retry",
                        kind="source.sha256")
    return chosen


def conda_packages(prof: Profile) -> list[dict[str, Any]]:
    """The linux-64 conda packages of the profile's conda-lock.yml (none without one): name,
    url, the file's place in a bundle (`conda/<subdir>/<file>`) and the lock's hashes."""
    f = prof.conda_lock_file
    if not f.exists():
        return []
    try:
        import yaml
    except ImportError:
        raise UserError(f"{f} is read with PyYAML, which is not installed",
                        fix="pip install 'megatron-env[conda]' (the conda extra)",
                        kind="tool.no-pyyaml") from None
    try:
        doc = yaml.safe_load(f.read_text())
        out = []
        for p in doc["package"]:
            if p.get("manager") != "conda" or p.get("platform") != "linux-64":
                continue
            url = str(p["url"])
            subdir, name = url.split("#")[0].rsplit("/", 2)[-2:]
            out.append({"name": p["name"], "url": url, "path": f"conda/{subdir}/{name}",
                        "sha256": p["hash"].get("sha256"), "md5": p["hash"].get("md5")})
    except (yaml.YAMLError, KeyError, TypeError, AttributeError, ValueError) as e:
        raise UserError(f"{f} is not a conda-lock file ({type(e).__name__}: {e})",
                        fix=f"run `invoke lock --profile {prof.name}` again",
                        kind="lock.conda-invalid") from None
    return out


def fetch_conda_packages(pkgs: list[dict[str, Any]], echo: output.Echo, *,
                 cache: Path | None = None) -> list[Path]:
    """Each conda package downloaded once into the cache and checked against the lock's sha256
    (md5 where the lock has none), as the lock's wheels are."""
    cache = (cache or repos.cache_dir()) / "conda-pkgs"
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for i, p in enumerate(pkgs, 1):
        algo, want = ("sha256", p["sha256"]) if p.get("sha256") else ("md5", p.get("md5"))
        if not want:
            raise UserError(f"conda-lock.yml gives {p['name']} no sha256 or md5",
                            fix="lock the conda layer again with conda-lock",
                            kind="lock.conda-no-hash")
        dest = cache / f"{want[:16]}-{Path(p['path']).name}"
        if not (dest.exists() and digest.file_hex(dest, algo) == want):
            echo(f"conda: {i}/{len(pkgs)} downloading {Path(p['path']).name}")
            with files.publishing(dest) as part:
                try:
                    with http.open_url(p["url"].split("#")[0]) as r:
                        digest.copy_hashed(r, part)
                except (OSError, ValueError) as e:
                    if files.no_space(e):
                        raise
                    raise UserError(f"cannot download {mask_urls(p['url'])}: "
                                    f"{getattr(e, 'reason', e)}",
                                    fix="lock the conda layer against a reachable channel "
                                        f"({lock_conda.CHANNELS_ENV}=MIRROR invoke lock)",
                                    kind="source.unreachable") from None
                if digest.file_hex(part, algo) != want:
                    raise UserError(f"{mask_urls(p['url'])} does not match the {algo} in "
                                    "conda-lock.yml", fix="the channel serves another file: "
                                    "check the mirror, or lock again", kind="source.sha256")
        out.append(dest)
    return out


def _bare_repo(name: str, url: str, commit: str, tag: str | None, dest: Path,
               echo: output.Echo) -> None:
    """A fresh bare repository holding only `commit` (and `tag`, checked to point at it)."""
    url = repos.repo_url(name, url)
    echo(f"{name}: fetching {tag or commit[:12]} (depth 1) from {url}")
    shutil.rmtree(dest, ignore_errors=True)
    git = ["git", f"--git-dir={dest}"]
    run_env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    steps = [["git", "init", "-q", "--bare", "--", str(dest)],
             [*git, "fetch", "-q", "--depth", "1", "--", url,
              f"+refs/tags/{tag}:refs/tags/{tag}" if tag else commit]]
    for argv in steps:
        r = proc.run(argv, env=run_env, timeout=3600)
        if not r.ok:
            files.child_full(r.output, dest.parent, f"the {name} repository")
            raise UserError(f"cannot fetch {name} {tag or commit} from {url}: {r.tail(2)}",
                            fix=f"set {repos.mirror_var(name)} to a reachable mirror or a "
                                "local bare repository holding the pin", kind="source.unreachable")
    at = repos.resolve(dest, tag or commit)
    if at != commit:
        raise UserError(f"{name}: tag {tag} points at {at}, the profile pins {commit}",
                        fix="the tag moved: check upstream and the profile's pin",
                        kind="source.tag-moved")
    for argv in ([*git, "update-ref", "refs/heads/pinned", commit],
                 [*git, "symbolic-ref", "HEAD", "refs/heads/pinned"],
                 [*git, "repack", "-a", "-d", "-q"]):
        r = proc.run(argv, timeout=600)
        if not r.ok:
            raise UserError(f"{name}: preparing the bare repository failed: {r.tail(2)}",
                            kind="bundle.repo-failed")
    for junk in ("hooks", "description", "info", "FETCH_HEAD", "logs"):
        p = dest / junk
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def git_pins(prof: Profile, without: Iterable[str] = (),
             kernels: Mapping[str, Package] | None = None
             ) -> list[tuple[str, str, str, str | None]]:
    """(name, repository, commit, tag) of every git source the profile's setup checks out:
    Megatron-LM, each git-sourced kernel package (but those `without` names) and each submodule
    it pins."""
    m = prof.megatron
    kernels = build.packages(prof) if kernels is None else kernels
    return [("megatron", m["repo"], m["commit"], m["tag"]),
            *((name, url, commit, tag) for k in kernels.values()
              if k.name not in without
              for name, url, commit, tag, _path in source_trees.git_sources(k))]


def _left_out(prof: Profile, without: Iterable[str], kernels: Mapping[str, Package]
              ) -> list[str]:
    """The kernel packages a bundle leaves out, each checked against the profile's recipes."""
    known = sorted(kernels)
    for name in without:
        if name not in known:
            raise UserError(f"--without {name}: {prof.name} pins no kernel package of that name",
                            fix=f"one of: {', '.join(known)}", kind="recipe.not-pinned")
    return sorted(set(without))


def cached_builds(prof: Profile, without: Iterable[str] = (),
            kernels: Mapping[str, Package] | None = None, *,
            cache: Path | None = None) -> list[tuple[str, Path]]:
    """Cached kernel wheels made for this profile's pins, variants, Python, torch and archs."""
    out: list[tuple[str, Path]] = []
    kernels = build.packages(prof) if kernels is None else kernels
    for k in (k for k in kernels.values() if k.name not in without):
        want = {"source": k.source.digest,
                "patches": digest.of_files(patches.series(k.name, k.pin)),
                "python": py_tag(prof.python), "cuda": prof.cuda,
                "archs": sorted(prof.archs) if k.cuda else [],
                "switches": k.switches, "build_options": list(k.build_options)}
        wheels = (cache or build.cache_dir()) / "wheels"
        for meta in sorted(wheels.glob(f"{k.name}-*/meta.json")):
            record, _why = files.read_json(meta)
            if not isinstance(record, dict) or not isinstance(record.get("key"), dict):
                continue  # unreadable: not this profile's, whatever it was
            doc = record["key"]
            if (all(doc.get(f) == v for f, v in want.items())
                    and str(doc.get("torch", "")).split("+")[0] == prof.torch
                    and compiler.cached(meta.parent)):  # its wheel checked, as a build does
                out.extend((f"builds/{meta.parent.name}/{f.name}", f)
                           for f in sorted(meta.parent.iterdir()) if f.is_file())
    return out


def check_out(out: Path, inputs: list[Path]) -> Path:
    """--out must be a file path that is none of the inputs (a --since base written over would
    be lost: the delta is made from it); refused before anything is written."""
    out = out.absolute()
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; the bundle is one file",
                        fix=f"name a file in it: --out {out / 'bundle.tar'}",
                        kind="bundle.out-is-directory")
    for i in inputs:
        same = out.exists() and i.exists() and os.path.samefile(out, i)
        if same or out.resolve() == i.absolute().resolve():
            raise UserError(f"--out {out} is the bundle given to --since ({i}); writing it "
                            "would destroy the base the delta is made from. Nothing was changed",
                            fix="write the delta to another file: --out delta.tar",
                            kind="bundle.out-is-base")
    return out


def _tree(root: Path, prefix: str) -> list[Entry]:
    return [Entry(f"{prefix}/{p.relative_to(root).as_posix()}", p, "")
            for p in sorted(root.rglob("*")) if p.is_file()]


def _sdists(kernels: Mapping[str, Package], without: Iterable[str], entries: list[Entry],
            echo: output.Echo, cache: Path) -> list[dict[str, Any]]:
    """Each sdist-sourced kernel's source, fetched once into the cache (sha256 checked)."""
    sdists = []
    for k in kernels.values():
        if k.source.repo or k.name in without:  # a repository (git pins), or left out
            continue
        echo(f"{k.name}: the {k.pin} source ({k.source.digest[:19]})")
        source_trees.fetch(k, echo, cache=cache)  # once by file name, sha256 checked, nothing run
        name = f"sources/{k.name}/{k.name}-{k.pin}.tar.gz"
        entries.append(Entry(name, source_trees.sdist_archive(k, cache), ""))
        sdists.append({"name": k.name, "path": name, "sha256": k.source.sha256})
    return sdists


def _resources(kernels: Mapping[str, Package], without: Iterable[str], stage: Path,
               entries: list[Entry], echo: output.Echo) -> list[dict[str, Any]]:
    """Each recipe resource the kept kernels use, as one file checked against its pin (the
    wheel by sha256, a tar.gz of the paths by git tree id): what builds them offline."""
    carried = []
    for k in kernels.values():
        if k.name in without:
            continue
        for res in k.source.resources:
            echo(f"{k.name}: resource {res.name} from {res.origin} ({res.digest[:19]})")
            f = resources.carry(res, stage / "resources" / res.name, echo)
            rel = f"resources/{res.name}/{f.name}"
            entries.append(Entry(rel, f, ""))
            carried.append({"name": res.name, "package": k.name, "path": rel,
                            "digest": res.digest})
    return carried


def _git(prof: Profile, without: Iterable[str], kernels: Mapping[str, Package],
         base: Manifest | None, stage: Path, entries: list[Entry],
         echo: output.Echo) -> list[dict[str, Any]]:
    """A bare repository of each git pin, but those a --since base already holds."""
    bares = []
    for name, url, commit, tag in git_pins(prof, without, kernels):
        rel = repo_path(name, commit)
        bares.append({"name": name, "commit": commit, "tag": tag, "path": rel})
        if base and any(f.startswith(rel + "/") for f in base.files):
            echo(f"{name}: {rel} is in the base bundle")
            continue
        _bare_repo(name, url, commit, tag, stage / rel, echo)
        entries += _tree(stage / rel, rel)
    return bares


def _items(rows: list[dict[str, Any]]) -> tuple[Item, ...]:
    """The manifest's items from the rows gathered for them (an absent tag is no field)."""
    return tuple(Item(r["name"], r["path"], {k: v for k, v in r.items()
                                             if k not in ("name", "path") and v is not None})
                 for r in rows)


def _hashed(entries: list[Entry], base: Manifest | None, bares: list[dict[str, Any]]
            ) -> tuple[dict[str, dict[str, Any]], list[Entry]]:
    """The manifest's files (sha256, size, role) and the entries this archive writes: those a
    --since base does not hold already."""
    rows: dict[str, dict[str, Any]] = {}
    for e in entries:
        e.role = role(e.arcname)
        e.sha256, e.size = digest.file_hex(e.path), e.path.stat().st_size
        rows[e.arcname] = {"sha256": e.sha256, "size": e.size, "role": e.role}
    written = []
    for e in entries:
        old = base.files.get(e.arcname) if base else None
        if old and old.sha256 == e.sha256:
            rows[e.arcname]["in"] = "base"
        else:
            written.append(e)
    if base:  # git repositories the base already holds: its entries stand
        for rel in (r["path"] for r in bares):
            for f, meta in base.files.items():
                if f.startswith(rel + "/"):
                    rows[f] = {"sha256": meta.sha256, "size": meta.size,
                               "role": meta.role, "in": "base"}
    return rows, written


def _write(out: Path, stage: Path, written: list[Entry], echo: output.Echo) -> None:
    """The archive, written once: the manifest first (read without a scan), then each file;
    a file staged for it (the source tree, the tool's wheels, git repositories, resources) is
    removed as soon as it is in, so the disk holds the bundle about once, not the staged copy
    and the archive side by side. The room it needs is known before: a full disk is said
    before the first byte."""
    total = sum(e.size for e in written)
    staged = [e for e in written if e.path.is_relative_to(stage)]
    need = total + MIB
    if staged and os.stat(stage).st_dev == os.stat(out.parent).st_dev:
        # what is staged on this filesystem is freed as the archive takes it in
        need -= sum(e.size for e in staged) - max(e.size for e in staged)
    files.ensure(out.parent, need, f"bundle {out.name}")
    echo(f"writing {out.name}: {len(written)} files, {total / MIB:.1f} MiB")
    with files.publishing(out) as part, tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(stage / MANIFEST, arcname=MANIFEST)
        for e in written:
            tar.add(e.path, arcname=e.arcname, recursive=False)
            if e.path.is_relative_to(stage):
                e.path.unlink()


def make(prof: Profile, out: Path, *, adopt: bool = False, with_builds: bool = False,
         since: Path | None = None, without: Iterable[str] = (),
         echo: output.Echo = output.status) -> Made:
    """Write the bundle of `prof` to `out` (a .tar); with `since`, only what that bundle lacks.

    `without` leaves kernel packages out (their sources and builds): a smaller archive for nodes
    that bring those kernels or set up with --no-builds; the manifest says which, and the offline
    side refuses to build them by name instead of reaching for the network."""
    t0 = time.monotonic()
    kernels = build.packages(prof)  # resolved once for the whole bundle
    cache = repos.cache_dir()  # and the cache root read once
    without = _left_out(prof, without, kernels)
    if problems := lock.stale(prof):
        raise UserError("; ".join(problems),
                        fix=f"run `invoke lock --profile {prof.name}` and commit the locks first",
                        kind="lock.stale")
    out = check_out(out, [since] if since else [])
    base = read_manifest(since) if since else None
    if not adopt and base is None:  # a delta leaves out what its base holds: said at _write
        _room(prof, out, _house(cache))
    out.parent.mkdir(parents=True, exist_ok=True)
    files.sweep(out.parent, out.name)  # what killed runs left: this host's, or long dead
    with files.scratch(out) as stage:
        entries: list[Entry] = []
        _source_tree(prof, stage / "source")
        entries += _tree(stage / "source", "source")
        conda = [] if adopt else conda_packages(prof)  # an adopted node brings its own
        (stage / "tool").mkdir()
        tool.wheels(prof, stage / "source", stage / "tool", echo,
                     ("conda",) if conda else ())  # conda-lock installs the conda layer
        tool.requirements(stage / "tool")
        entries += _tree(stage / "tool", "tool")
        if not adopt:
            entries += [Entry(f"wheels/{w.name}", w, "")
                        for w in _env_wheels(prof, echo, cache=cache)]
        have = {e.arcname for e in entries}  # the kernels' run-time requirements, beside the lock's
        entries += [Entry(f"wheels/{w.name}", w, "") for w in tool.kernel_requirements(
            [k for n, k in kernels.items() if n not in without], stage / "kernel-requires",
            prof.python, echo, prof.lock_file,
            frozenset() if adopt else frozenset(tool.normal_names(prof.lock_file)))
            if f"wheels/{w.name}" not in have]
        entries += [Entry(c["path"], f, "") for c, f in
                    zip(conda, fetch_conda_packages(conda, echo, cache=cache), strict=True)]
        sdists = _sdists(kernels, without, entries, echo, cache)
        carried = _resources(kernels, without, stage, entries, echo)
        bares = _git(prof, without, kernels, base, stage, entries, echo)
        if with_builds:
            found = cached_builds(prof, without, kernels, cache=cache)
            echo(f"builds: {len({a.split('/')[1] for a, _ in found})} cached kernel build(s) "
                 f"for {prof.name}")
            entries += [Entry(a, p, "") for a, p in found]
        listed, written = _hashed(entries, base, bares)
        made = Manifest(
            MadeFor(prof.name, profile_digest(prof), prof.python, prof.torch, prof.cuda),
            prof.python, MACHINE, "adopt" if adopt else "full", with_builds,
            time.strftime("%Y-%m-%dT%H:%M:%S%z"), manifest_digest(base) if base else None,
            tuple(without), _items(bares), _items(sdists), _items(
                [{"name": c["name"], "url": c["url"], "path": c["path"]} for c in conda]),
            {rel: FileEntry(r["sha256"], r["size"], r["role"], r.get("in") == "base")
             for rel, r in listed.items()},
            _items(carried), __version__, lock.PLATFORM)
        manifest = made.to_doc()
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        _write(out, stage, written, echo)
    by_role = {r: sum(e.size for e in written if e.role == r) for r in {e.role for e in written}}
    return Made(out, manifest, len(written), len(entries) - len(written), out.stat().st_size,
                time.monotonic() - t0, by_role)


