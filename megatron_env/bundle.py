"""Offline bundles: everything one profile's `invoke setup` needs, in one archive with a manifest.

Made where the network (or the MEGATRON_ENV_MIRROR_* / MEGATRON_ENV_SOURCE_* mirrors) is, used
where nothing is reachable. Layout of an archive (and of the directory it unpacks to):

    manifest.json        every file below: sha256, size, role; the profile digest; the Python and
                         platform it serves; the tool version; `base` for a delta bundle
    source/              the tool's own tree with this profile, its locks and patch series
                         (run `invoke ... --bundle` from here)
    tool/                megatron-env and its runtime dependencies as wheels for the profile's
                         Python, with the build backend (pip install --no-index --find-links)
    wheels/              every file the lock pins, each checked against the lock's sha256
                         (absent from an `adopt` bundle, made for a node that has its own torch)
    sources/<name>/      kernel sdists, checked against the profile's sha256
    git/<name>-<commit>.git   bare repositories holding only the pinned commit (and its tag):
                         Megatron-LM, every git-sourced kernel package and each submodule it
                         pins (named <package>-<path>)
    builds/<key>/        kernel wheels from the build cache for this profile (--with-builds)

The offline side checks the manifest before anything else (a changed or missing file is refused
by name and nothing is installed), checks that the bundle serves this profile, Python and
platform, then points the usual chain at the bundle through the variables it already honours:
uv's UV_FIND_LINKS/UV_NO_INDEX/UV_OFFLINE, MEGATRON_ENV_MIRROR_<NAME>, MEGATRON_ENV_SOURCE_<NAME>.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import (
    REPO_ROOT,
    __version__,
    build,
    digest,
    lock,
    megatron,
    output,
    patches,
    proc,
    recipe,
    sources,
    uv,
)
from .errors import UserError
from .profile import Profile

FORMAT = 1
MANIFEST = "manifest.json"
# The tool's own tree as shipped (envs/ holds only the bundled profile).
SOURCE_ITEMS = ("megatron_env", "scripts", "patches", "docs", "tasks.py", "noxfile.py",
                "pyproject.toml", "README.md")
MACHINE = "x86_64"  # the locks are made for linux x86_64 (lock.PLATFORM)
_PIP_NAME = re.compile(r"[-_.]+")


# --- what a profile's bundle must agree on ---------------------------------------------------


def profile_digest(prof: Profile) -> str:
    """The profile, its locks and every patch series it uses: what a bundle was made from."""
    files = [prof.path, *(prof.dir / f for f in (lock.LOCK_FILE, lock.ENV_FILE,
                                                  lock.CONDA_LOCK_FILE))]
    return digest.of({
        "files": {f.name: digest.of_file(f) for f in files},
        "megatron": digest.of_files(megatron.patch_series(prof)),
        "kernels": {k.name: digest.of_files(patches.series(k.name, k.pin))
                    for k in build.packages(prof).values()}})


def _py_tag(version: str) -> str:
    return "cpython-" + version.replace(".", "")


# --- the online side -------------------------------------------------------------------------


@dataclass
class Entry:
    arcname: str
    path: Path
    role: str
    sha256: str = ""
    size: int = 0


@dataclass
class Made:
    out: Path
    manifest: dict
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


def _pip_download(args: list[str | Path], dest: Path, python: str, what: str) -> None:
    argv = [sys.executable, "-m", "pip", "download", "-q", "-d", dest, "--python-version", python,
            "--implementation", "cp", "--only-binary=:all:"]
    for plat in lock.WHEEL_PLATFORMS:
        argv += ["--platform", plat]
    r = proc.run([*argv, *args], timeout=1800)
    if not r.ok:
        raise UserError(f"cannot download {what} for Python {python}: {r.tail(4)}",
                        fix="check the package index (pip's configuration, PIP_INDEX_URL) "
                            "or PIP_FIND_LINKS")


def _tool_wheels(prof: Profile, source: Path, dest: Path, echo, extras: tuple[str, ...] = ()
                 ) -> None:
    """megatron-env as a wheel, its runtime dependencies and its build backend, for the profile's
    Python: `pip install --no-index --find-links tool megatron-env` then needs nothing else."""
    echo(f"tool: building the megatron-env {__version__} wheel")
    with tempfile.TemporaryDirectory(prefix="megatron-env-wheel-") as tmp:
        work = Path(tmp) / "src"
        shutil.copytree(source, work)
        # fixed zip timestamps: the same tree gives the same wheel, so a delta bundle skips it
        r = proc.run([uv.exe(), "build", "--wheel", "--out-dir", Path(tmp) / "dist", work],
                     env=uv.env(SOURCE_DATE_EPOCH="315532800"), timeout=900)
        if not r.ok:
            raise UserError(f"building the megatron-env wheel failed: {r.tail(5)}",
                            fix="the build needs setuptools and wheel from the package index")
        built = next((Path(tmp) / "dist").glob("megatron_env-*.whl"))
        shutil.copy(built, dest / built.name)
    echo(f"tool: its runtime dependencies for Python {prof.python} (linux {MACHINE})")
    pins = tool_pins(source / "pyproject.toml", prof.python, extras)
    _pip_download(["--no-deps", *pins], dest, prof.python, "megatron-env's dependencies")


def tool_pins(pyproject: Path, python: str, extras: tuple[str, ...] = ()) -> list[str]:
    """The tool's runtime dependencies (and `extras`') and build backend resolved for `python`
    on linux x86_64.

    uv resolves, because `pip download --python-version` still judges markers by the running
    interpreter (tomli for 3.10 would be left out when run by 3.12)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    backend = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
    with tempfile.TemporaryDirectory(prefix="megatron-env-tool-") as tmp:
        (Path(tmp) / "backend.in").write_text("\n".join(backend) + "\n")
        r = proc.run([uv.exe(), "pip", "compile", pyproject, Path(tmp) / "backend.in",
                      *(a for e in extras for a in ("--extra", e)),
                      "--python-version", python, "--python-platform", lock.PLATFORM,
                      "--no-header", "--no-annotate", "--quiet"], env=uv.env(), timeout=600)
    if not r.ok:
        raise UserError(f"cannot resolve megatron-env's dependencies for Python {python}: "
                        f"{r.tail(4)}", fix="check the package index (UV_INDEX_URL)")
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip() and ln[0].isalnum()]


def _env_wheels(prof: Profile, echo) -> list[Path]:
    """The lock's files, downloaded once into the cache and each checked against the lock."""
    lockfile = prof.dir / lock.LOCK_FILE
    text = lockfile.read_text()
    allowed = lock.parse_hashes(text)
    total = len(allowed)
    house = sources.cache_dir() / "bundle-wheels"
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
        raise UserError(f"downloading the files of {lockfile} failed: {r.tail(4)}",
                        fix="check the package index or mirror (PIP_INDEX_URL, PIP_FIND_LINKS)")
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
                            fix=f"remove {house} and run `invoke bundle` again")
        chosen.append(hit)
    if missing:
        raise UserError(f"no file matching the lock's sha256 for: {', '.join(missing)}",
                        fix=f"the index served other files; remove {house} and retry")
    return chosen


def conda_packages(prof: Profile) -> list[dict]:
    """The linux-64 conda packages of the profile's conda-lock.yml (none without one): name,
    url, the file's place in a bundle (`conda/<subdir>/<file>`) and the lock's hashes."""
    f = prof.dir / lock.CONDA_LOCK_FILE
    if not f.exists():
        return []
    try:
        import yaml
    except ImportError:
        raise UserError(f"{f} is read with PyYAML, which is not installed",
                        fix="pip install 'megatron-env[conda]' (the conda extra)") from None
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
                        fix=f"run `invoke lock --profile {prof.name}` again") from None
    return out


def _conda_fetch(pkgs: list[dict], echo) -> list[Path]:
    """Each conda package downloaded once into the cache and checked against the lock's sha256
    (md5 where the lock has none), as the lock's wheels are."""
    import urllib.request

    cache = sources.cache_dir() / "conda-pkgs"
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for i, p in enumerate(pkgs, 1):
        algo, want = ("sha256", p["sha256"]) if p.get("sha256") else ("md5", p.get("md5"))
        if not want:
            raise UserError(f"conda-lock.yml gives {p['name']} no sha256 or md5",
                            fix="lock the conda layer again with conda-lock")
        dest = cache / f"{want[:16]}-{Path(p['path']).name}"
        if not (dest.exists() and digest.file_hex(dest, algo) == want):
            echo(f"conda: {i}/{len(pkgs)} downloading {Path(p['path']).name}")
            part = dest.with_name(dest.name + f".part-{os.getpid()}")
            try:
                urllib.request.urlretrieve(p["url"].split("#")[0], part)
            except OSError as e:
                part.unlink(missing_ok=True)
                raise UserError(f"cannot download {p['url']}: {e}",
                                fix="lock the conda layer against a reachable channel "
                                    f"({lock.CHANNELS_ENV}=MIRROR invoke lock)") from None
            if digest.file_hex(part, algo) != want:
                part.unlink()
                raise UserError(f"{p['url']} does not match the {algo} in conda-lock.yml",
                                fix="the channel serves another file: check the mirror, "
                                    "or lock again")
            os.replace(part, dest)
        out.append(dest)
    return out


def _bare_repo(name: str, url: str, commit: str, tag: str | None, dest: Path, echo) -> None:
    """A fresh bare repository holding only `commit` (and `tag`, checked to point at it)."""
    url = sources.repo_url(name, url)
    echo(f"{name}: fetching {tag or commit[:12]} (depth 1) from {url}")
    shutil.rmtree(dest, ignore_errors=True)
    git = ["git", "--git-dir", str(dest)]
    run_env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    steps = [["git", "init", "-q", "--bare", str(dest)],
             [*git, "fetch", "-q", "--depth", "1", url,
              f"+refs/tags/{tag}:refs/tags/{tag}" if tag else commit]]
    for argv in steps:
        r = proc.run(argv, env=run_env, timeout=3600)
        if not r.ok:
            raise UserError(f"cannot fetch {name} {tag or commit} from {url}: {r.tail(2)}",
                            fix=f"set {sources.mirror_var(name)} to a reachable mirror or a "
                                "local bare repository holding the pin")
    at = sources.resolve(dest, tag or commit)
    if at != commit:
        raise UserError(f"{name}: tag {tag} points at {at}, the profile pins {commit}",
                        fix="the tag moved: check upstream and the profile's pin")
    for argv in ([*git, "update-ref", "refs/heads/pinned", commit],
                 [*git, "symbolic-ref", "HEAD", "refs/heads/pinned"],
                 [*git, "repack", "-a", "-d", "-q"]):
        r = proc.run(argv, timeout=600)
        if not r.ok:
            raise UserError(f"{name}: preparing the bare repository failed: {r.tail(2)}")
    for junk in ("hooks", "description", "info", "FETCH_HEAD", "logs"):
        p = dest / junk
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def git_pins(prof: Profile, without: Iterable[str] = ()) -> list[tuple[str, str, str, str | None]]:
    """(name, repository, commit, tag) of every git source the profile's setup checks out:
    Megatron-LM, each git-sourced kernel package (but those `without` names) and each submodule
    it pins."""
    m = prof.megatron
    return [("megatron", m["repo"], m["commit"], m["tag"]),
            *((name, url, commit, tag) for k in build.packages(prof).values()
              if k.name not in without
              for name, url, commit, tag, _path in build.git_sources(k))]


def _left_out(prof: Profile, without: Iterable[str]) -> list[str]:
    """The kernel packages a bundle leaves out, each checked against the profile's recipes."""
    known = sorted(build.packages(prof))
    for name in without:
        if name not in known:
            raise UserError(f"--without {name}: {prof.name} pins no kernel package of that name",
                            fix=f"one of: {', '.join(known)}")
    return sorted(set(without))


def repo_path(name: str, commit: str) -> str:
    """Where a bundle keeps the bare repository of `name` at `commit` (a submodule's name
    `<package>/<path>` flattened)."""
    return f"git/{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}-{commit[:12]}.git"


def _builds(prof: Profile, without: Iterable[str] = ()) -> list[tuple[str, Path]]:
    """Cached kernel wheels made for this profile's pins, variants, Python, torch and archs."""
    out = []
    for k in build.packages(prof).values():
        if k.name in without:
            continue
        want = {"source": k.source.digest,
                "patches": digest.of_files(patches.series(k.name, k.pin)),
                "python": _py_tag(prof.python), "cuda": prof.cuda,
                "archs": sorted(prof.archs) if k.cuda else [],
                "switches": k.switches, "build_options": list(k.build_options)}
        for meta in sorted((build.cache_dir() / "wheels").glob(f"{k.name}-*/meta.json")):
            try:
                doc = json.loads(meta.read_text()).get("key") or {}
            except (OSError, json.JSONDecodeError):
                continue
            if (all(doc.get(f) == v for f, v in want.items())
                    and str(doc.get("torch", "")).split("+")[0] == prof.torch):
                out.extend((f"builds/{meta.parent.name}/{f.name}", f)
                           for f in sorted(meta.parent.iterdir()) if f.is_file())
    return out


def _role(arcname: str) -> str:
    top = arcname.split("/")[0]
    if top == "source":
        if arcname.startswith("source/envs/"):
            return "lock" if arcname.endswith((".lock", ".yml")) else "profile"
        return "patch" if arcname.startswith("source/patches/") else "tool-source"
    return {"tool": "tool-wheel", "wheels": "env-wheel", "sources": "kernel-source",
            "git": "git", "builds": "kernel-build", "conda": "conda-package"}.get(top, top)


def _tree(root: Path, prefix: str) -> list[Entry]:
    return [Entry(f"{prefix}/{p.relative_to(root).as_posix()}", p, "")
            for p in sorted(root.rglob("*")) if p.is_file()]


def read_manifest(path: Path) -> dict:
    """The manifest of an archive or of an unpacked bundle directory."""
    try:
        if path.is_dir():
            text = (path / MANIFEST).read_text()
        else:
            with tarfile.open(path) as tar:
                member = tar.extractfile(MANIFEST)
                if member is None:
                    raise KeyError(MANIFEST)
                text = member.read().decode()
        doc = json.loads(text)
    except (OSError, KeyError, tarfile.TarError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a megatron-env bundle (no readable {MANIFEST}: "
                        f"{type(e).__name__})",
                        fix="pass the .tar `invoke bundle` wrote, or the directory it was "
                            "unpacked into") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "files" not in doc:
        raise UserError(f"{path}: {MANIFEST} is not a format-{FORMAT} bundle manifest",
                        fix="make the bundle with this version of megatron-env")
    return doc


def _manifest_digest(doc: dict) -> str:
    return digest.of(doc)


def make(prof: Profile, out: Path, *, adopt: bool = False, with_builds: bool = False,
         since: Path | None = None, without: Iterable[str] = (), echo=output.status) -> Made:
    """Write the bundle of `prof` to `out` (a .tar); with `since`, only what that bundle lacks.

    `without` leaves kernel packages out (their sources and builds): a smaller archive for nodes
    that bring those kernels or set up with --no-builds; the manifest says which, and the offline
    side refuses to build them by name instead of reaching for the network."""
    t0 = time.monotonic()
    without = _left_out(prof, without)
    if problems := lock.stale(prof):
        raise UserError("; ".join(problems),
                        fix=f"run `invoke lock --profile {prof.name}` and commit the locks first")
    base = read_manifest(since) if since else None
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bundle-", dir=out.parent) as tmp:
        stage = Path(tmp)
        entries: list[Entry] = []
        _source_tree(prof, stage / "source")
        entries += _tree(stage / "source", "source")
        conda = [] if adopt else conda_packages(prof)  # an adopted node brings its own
        (stage / "tool").mkdir()
        _tool_wheels(prof, stage / "source", stage / "tool", echo,
                     ("conda",) if conda else ())  # conda-lock installs the conda layer
        entries += _tree(stage / "tool", "tool")
        if not adopt:
            entries += [Entry(f"wheels/{w.name}", w, "") for w in _env_wheels(prof, echo)]
        entries += [Entry(c["path"], f, "") for c, f in zip(conda, _conda_fetch(conda, echo),
                                                            strict=True)]
        repos, sdists = [], []
        for k in build.packages(prof).values():
            if k.source.repo or k.name in without:  # a repository below, or left out
                continue
            echo(f"{k.name}: the {k.pin} source ({k.source.digest[:19]})")
            build.fetch(k, Path(sys.executable), echo)  # downloads once, checks the sha256
            arc = build.sdist_archive(k)
            name = f"sources/{k.name}/{k.name}-{k.pin}.tar.gz"
            entries.append(Entry(name, arc, ""))
            sdists.append({"name": k.name, "path": name, "sha256": k.source.sha256})
        for name, url, commit, tag in git_pins(prof, without):
            rel = repo_path(name, commit)
            repos.append({"name": name, "commit": commit, "tag": tag, "path": rel})
            if base and any(f.startswith(rel + "/") for f in base["files"]):
                echo(f"{name}: {rel} is in the base bundle")
                continue
            _bare_repo(name, url, commit, tag, stage / rel, echo)
            entries += _tree(stage / rel, rel)
        if with_builds:
            found = _builds(prof, without)
            echo(f"builds: {len({a.split('/')[1] for a, _ in found})} cached kernel build(s) "
                 f"for {prof.name}")
            entries += [Entry(a, p, "") for a, p in found]
        files: dict[str, dict] = {}
        for e in entries:
            e.role = _role(e.arcname)
            e.sha256, e.size = digest.file_hex(e.path), e.path.stat().st_size
            files[e.arcname] = {"sha256": e.sha256, "size": e.size, "role": e.role}
        written = []
        for e in entries:
            old = base["files"].get(e.arcname) if base else None
            if old and old["sha256"] == e.sha256:
                files[e.arcname]["in"] = "base"
            else:
                written.append(e)
        if base:  # git repositories the base already holds: its entries stand
            for rel in (r["path"] for r in repos):
                for f, meta in base["files"].items():
                    if f.startswith(rel + "/"):
                        files[f] = {**meta, "in": "base"}
        manifest = {
            "format": FORMAT, "tool": {"name": "megatron-env", "version": __version__},
            "made_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "profile": {"name": prof.name, "digest": profile_digest(prof), "python": prof.python,
                        "torch": prof.torch, "cuda": prof.cuda},
            "python": prof.python, "platform": {"system": "linux", "machine": MACHINE,
                                                "wheels": lock.PLATFORM},
            "mode": "adopt" if adopt else "full", "with_builds": with_builds,
            "base": _manifest_digest(base) if base else None, "without": without,
            "git": repos, "sources": sdists,
            "conda": [{"name": c["name"], "url": c["url"], "path": c["path"]} for c in conda],
            "files": dict(sorted(files.items())),
        }
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        part = out.with_name(out.name + f".part-{os.getpid()}")
        echo(f"writing {out.name}: {len(written)} files, "
             f"{sum(e.size for e in written) / 2**20:.1f} MiB")
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(stage / MANIFEST, arcname=MANIFEST)
            for e in written:
                tar.add(e.path, arcname=e.arcname, recursive=False)
        os.replace(part, out)
    by_role: dict[str, int] = {}
    for e in written:
        by_role[e.role] = by_role.get(e.role, 0) + e.size
    return Made(out, manifest, len(written), len(entries) - len(written), out.stat().st_size,
                time.monotonic() - t0, by_role)


# --- the offline side ------------------------------------------------------------------------


def _chain(docs: dict[Path, dict]) -> list[Path]:
    """Order bundles (path -> manifest) base first: a delta's manifest names its base's digest."""
    paths = list(docs)
    by_digest = {_manifest_digest(d): p for p, d in docs.items()}
    bases = {d.get("base") for d in docs.values()}
    tops = [p for p in paths if _manifest_digest(docs[p]) not in bases]
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
    chain = "".join(_manifest_digest(docs[p]) for p in ordered)  # a delta alone differs
    key = digest.hexpart(digest.of_bytes(chain.encode()), 16)
    dest = sources.cache_dir() / "bundles" / key
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
    text = (prof.dir / lock.CONDA_LOCK_FILE).read_text()
    for c in doc["conda"]:
        if c["url"] not in text:
            raise UserError(f"{prof.dir / lock.CONDA_LOCK_FILE} does not list {c['url']}, "
                            "which the bundle carries", fix="run the tool from the bundle's "
                            "source/ directory")
        local = (root / c["path"]).as_uri()
        text = text.replace(c["url"], local + ("#" + c["url"].split("#")[1] if "#" in c["url"]
                                               else ""))
    out = sources.cache_dir() / "bundle-conda" / f"{digest.hexpart(digest.of(text), 16)}.yml"
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
    from . import profile as profile_mod

    paths = [Path(p).absolute() for p in paths]
    root = _unpack(paths, echo)
    doc = read_manifest(root)
    t0 = time.monotonic()
    verify(root, doc)
    prof = profile_mod.load(profile_name or doc["profile"]["name"])
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
                       "UV_CACHE_DIR": str(sources.cache_dir() / "uv-offline")})
    if (root / "wheels").is_dir():
        os.environ["UV_FIND_LINKS"] = str(root / "wheels")
    for repo in doc["git"]:
        os.environ[sources.mirror_var(repo["name"])] = str(root / repo["path"])
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
