"""A kernel package's source trees in the build cache: the pristine source (an sdist checked
by sha256, or git checkouts at pinned commits with their resources) and the patched tree a build
copies. Each is published whole and sealed (files.seal), so a tree that changed in the cache is
made again; where each lives is a pure function of its pins (pristine_path, patched_path), which
the setup chain's stamped steps check without re-hashing anything."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import urllib.parse
from pathlib import Path

from megatron_env import digest, files, output
from megatron_env.errors import UserError
from megatron_env.recipes.recipe import Package, source_var
from megatron_env.redact import mask_urls
from megatron_env.sources import archive as archive_mod
from megatron_env.sources import http, index, patches, repos
from megatron_env.sources.given import Given
from megatron_env.sources.resources import place as place_resource


def fetch(pkg: Package, echo: output.Echo = output.status, *, given: Given | None = None,
          cache: Path | None = None) -> Path:
    """The pristine source tree, fetched once into the cache and verified by hash or commit.
    `given`: a bundle's repositories and sdists instead of the network."""
    src = pkg.source
    root = cache or repos.cache_dir()
    if src.repo:
        dest = pristine_path(pkg, root)
        if not _whole(dest, PRISTINE, f"{pkg.name}: the cached source tree"):
            files.sweep(dest.parent, dest.name)
            with files.publishing(dest, tree=True) as tmp:
                for name, repo, commit, tag, path in git_sources(pkg):
                    repos.checkout(name, repo, tag, commit, tmp / path, echo=echo, given=given)
                for res in src.resources:  # pinned content in place of a submodule
                    echo(f"{pkg.name}: {res.path} from {res.origin} ({', '.join(res.take)})")
                    place_resource(res, tmp, echo=echo,
                                   given=given.resource(res.name) if given else None)
                seal(tmp, PRISTINE, src.digest)
        return dest
    archive = sdist_archive(pkg, root)
    if archive.exists() and (got := digest.file_hex(archive)) != src.sha256:
        output.warning(f"{pkg.name}: the cached sdist {archive} has sha256 {got}, the profile "
                       f"pins {src.sha256}: it changed in the cache; fetching it again")
        files.discard(archive)
    if not archive.exists():
        with files.publishing(archive) as tmp:
            origin = download(pkg, tmp, echo, given)
            got = digest.file_hex(tmp)
            if got != src.sha256:
                raise UserError(f"{pkg.name} source {origin}: sha256 {got}, the profile pins "
                                f"{src.sha256}", fix="the file was changed or is another "
                                "version: use the original sdist", kind="source.sha256")
    dest = pristine_path(pkg, root)
    if not _whole(dest, PRISTINE, f"{pkg.name}: the cached source tree"):
        _unpack_sdist(pkg, archive, dest)
    return dest


def _unpack_sdist(pkg: Package, archive: Path, dest: Path) -> None:
    """The verified sdist's top directory published as `dest`, sealed."""
    files.sweep(dest.parent, dest.name)
    with files.publishing(dest, tree=True) as tmp:
        try:
            with tarfile.open(archive) as tar:
                archive_mod.extract(tar, tmp / "x", f"the {pkg.name} {pkg.pin} sdist")
        except (tarfile.TarError, ValueError, OSError) as e:
            if files.no_space(e):
                raise
            raise UserError(f"cannot unpack {archive}: {e}",
                            fix=f"remove {archive} and fetch it again",
                            kind="source.unreadable") from None
        tops = list((tmp / "x").iterdir())
        top = tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp / "x"
        for item in top.iterdir():
            os.rename(item, tmp / item.name)
        shutil.rmtree(tmp / "x", ignore_errors=True)
        seal(tmp, PRISTINE, pkg.source.sha256 or "")


PRISTINE, PATCHED = ".megatron-env-pristine", ".megatron-env-patched"


seal = files.seal


def _whole(tree: Path, marker: str, what: str) -> bool:
    """Whether a cached tree is whole as it was sealed; else it is gone (the caller makes it
    again from its pinned source), with a warning when it had changed."""
    why = files.unsealed(tree, marker)
    if why:
        output.warning(f"{what} {tree} {why}; making it again")
    return why is None


def pristine_path(pkg: Package, cache: Path) -> Path:
    """Where `fetch` keeps the pristine tree (complete when it holds .megatron-env-pristine)."""
    src = pkg.source
    if src.repo:
        dest = cache / "src" / f"{pkg.name}-{(src.commit or '')[:12]}"
        if src.submodules or src.resources:
            dest = dest.with_name(f"{dest.name}-{digest.hexpart(digest.of(src.digest), 8)}")
        return dest
    return cache / "src" / f"{pkg.name}-{(src.sha256 or '')[:12]}"


def patched_path(pkg: Package, series: list[Path], cache: Path) -> Path:
    """Where `patched` keeps the patched tree (complete when it holds .megatron-env-patched)."""
    key = digest.hexpart(digest.of([pkg.source.digest, digest.of_files(series)]), 16)
    return cache / "patched" / f"{pkg.name}-{key}"


def git_sources(pkg: Package) -> list[tuple[str, str, str, str | None, str]]:
    """(name, repository, commit, tag, path in the tree) of a git-sourced package: the package
    itself, then each submodule at the commit the profile pins (not the parent's index). A
    submodule is named `<package>/<path>`: its MEGATRON_ENV_MIRROR_ variable and its repository
    in a bundle follow from the name."""
    src = pkg.source
    if not src.repo or not src.commit:
        return []
    return [(pkg.name, src.repo, src.commit, src.tag, ""),
            *((f"{pkg.name}/{path}", repo, commit, None, path)
              for path, repo, commit in src.submodules)]


def sdist_archive(pkg: Package, cache: Path | None = None) -> Path:
    """Where the cache keeps a package's verified sdist (named by its sha256)."""
    return (cache or repos.cache_dir()) / "sdists" / f"{pkg.source.sha256}.tar.gz"


def download(pkg: Package, target: Path, echo: output.Echo, given: Given | None) -> str:
    """The sdist written to `target` (its sha256 checked by the caller); -> where it came from.

    In order: the bundle's copy, the user's MEGATRON_ENV_SOURCE_<NAME> (a path or URL), the
    configured package index by file name. Nothing of the package runs: pip's `download
    --no-binary` would execute setup.py (a kernel package's imports torch) just to fetch a file."""
    fix = (f"set {source_var(pkg.name)} to the sdist's path or URL, or pass --no-builds to "
           "`invoke setup` to go on without the kernels")
    url = str((given and given.sdist(pkg.name)) or os.environ.get(source_var(pkg.name)) or "")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("http", "https", "file"):
        shown = mask_urls(url)
        echo(f"{pkg.name}: downloading {shown}")
        try:
            with http.open_url(url) as r:
                digest.copy_hashed(r, target)
        except (OSError, ValueError) as e:
            if files.no_space(e):
                raise
            raise UserError(f"cannot download {shown}: {getattr(e, 'reason', e)}", fix=fix,
                            kind="source.unreachable") from None
        return shown
    if url:
        if not Path(url).is_file():
            raise UserError(f"{source_var(pkg.name)}={url}: no such file", fix=fix,
                            kind="source.no-such-file")
        shutil.copy(url, target)
        return url
    name = pkg.source.url or ""
    echo(f"{pkg.name}: fetching {name} from the package index")
    try:
        got = index.fetch(pkg.name, name, pkg.source.sha256 or "", target, echo=echo)
    except UserError as e:
        raise UserError(f"cannot fetch the {pkg.name} {pkg.pin} sdist: {e.message}",
                        fix=fix, kind=e.kind or "source.unreachable") from None
    if got.yanked:
        output.warning(f"{pkg.name}: {name} is yanked on its index"
                       + (f" ({got.yanked.reason})" if got.yanked.reason else "")
                       + "; using it because the profile pins its sha256")
    return got.source



def patched(pkg: Package, series: list[Path], echo: output.Echo = output.status, *,
            given: Given | None = None, cache: Path | None = None) -> Path:
    """The package's pristine source with its patch series applied: made once per source and
    series under the cache (whole or not at all), then only copied. The setup chain's patches
    step makes it; a build copies it (a build writes objects into its tree)."""
    root = cache or repos.cache_dir()
    dest = patched_path(pkg, series, root)
    if _whole(dest, PATCHED, f"{pkg.name}: the cached patched tree"):
        return dest
    pristine = fetch(pkg, echo, given=given, cache=root)
    files.sweep(dest.parent, dest.name)  # of killed runs, this host's or long dead only
    with files.publishing(dest, tree=True) as staged:
        staged.rmdir()  # apply_series makes it
        patches.apply_series(pristine, staged, series)  # on failure nothing is left
        for x in series:
            echo(f"{pkg.name}: applied {x.name}")
        seal(staged, PATCHED, json.dumps([x.name for x in series]))
    return dest


