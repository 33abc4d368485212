"""Where the tool writes, said and undone: the one status line a writing command prints
(`announce`), the marks that make a cache or an environment directory provably the tool's, and
`clean`, which lists those places with their sizes and removes them.

A directory is removed only when it is provably the tool's: a cache root holding the
CACHEDIR.TAG the tool wrote (the standard tag, which backup tools also skip), the default
environment root holding ROOT_MARK, or an environment `--prefix` whose store (`<prefix>.d`)
holds only stamped environments. Inside a marked place, too, only what the tool makes goes:
the cache's own parts (CACHE_PARTS, real directories), and environments with a stamped store
or the tool's setup stamps; a file, a link or a directory someone put there stays. Anything
else is listed as kept, with why, and never touched: a `--cache-dir` pointed at a home
directory by mistake must not empty it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from megatron_env import files, output, project
from megatron_env.commands.cli import command
from megatron_env.errors import UserError
from megatron_env.pyenv import uv
from megatron_env.units import MIB

CACHEDIR_TAG = "CACHEDIR.TAG"
_TAG_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"  # bford.info/cachedir
_TAG_TEXT = (f"{_TAG_SIGNATURE}\n# This file marks the cache of megatron-env "
             "(`megatron-env clean` lists and removes it).\n")
ROOT_MARK = ".megatron-env-root"  # in the default environment root: every entry is the tool's
_ENV_PARTS = ("", ".d", ".setup", ".megatron")  # an environment's link, store, stamps, checkouts


def _mark(path: Path, name: str, text: str) -> None:
    """`path` created with its mark (best effort: a read-only place is said by the write that
    needs it, not here)."""
    with contextlib.suppress(OSError, UserError):
        path.mkdir(parents=True, exist_ok=True)
        if not (path / name).exists():
            files.write_text(path / name, text)


def _empty(path: Path) -> bool:
    try:
        return not any(path.iterdir())
    except FileNotFoundError:
        return True
    except OSError:
        return False


def announce(*, prefix: Path | None = None, cache: Path | None = None, out: Path | None = None,
             echo: output.Echo = output.status) -> None:
    """The one status line of a writing command: where its environment, cache and output go
    (and that they are the user's directories when no project holds them). Marks the cache
    (the default one, or one the tool creates) and the default environment root as the
    tool's, so that `clean` may remove them later."""
    parts = []
    if prefix is not None:
        parts.append(f"environment {prefix}")
        if prefix.parent == project.env_root():
            _mark(prefix.parent, ROOT_MARK, "megatron-env environments (`megatron-env clean`)\n")
    if cache is not None:
        parts.append(f"cache {cache}")
        if cache == project.default_cache_root() or _empty(cache):
            # a directory the user named that already holds other things is never claimed:
            # MEGATRON_ENV_CACHE=~/.cache by mistake must not make `clean` empty ~/.cache
            _mark(cache, CACHEDIR_TAG, _TAG_TEXT)
    if out is not None:
        parts.append(f"output {out}")
    where = ("the user's directories: no project here" if project.how() == "shipped"
             else f"project {project.root()}")
    echo(f"where: {', '.join(parts)} ({where}; --prefix, --cache-dir or "
         f"{project.CACHE_ENV} move them)")


def size_of(path: Path) -> int:
    return files.size_of(path)[0]


def _size(path: Path) -> str:
    n, whole = files.size_of(path, seconds=3.0)
    return f"{'at least ' if not whole else ''}{n / MIB:,.0f} MiB"


@contextlib.contextmanager
def saying_what_is_kept(cache: Path, echo: output.Echo = output.status) -> Iterator[None]:
    """On Ctrl-C or SIGTERM: one line saying what stays for the next run (the downloads in
    uv's cache, the sources and builds in the tool's cache, with sizes), which the next run
    reuses; what was half made is removed where it was being made."""
    try:
        yield
    except KeyboardInterrupt:
        kept = []
        if (uvc := uv.cache_dir()) and uvc.is_dir():
            kept.append(f"downloads in uv's cache {uvc} ({_size(uvc)})")
        if cache.is_dir():
            kept.append(f"sources and builds in {cache} ({_size(cache)})")
        echo("kept for the next run, which reuses them: " + ("; ".join(kept) or "nothing"))
        raise


@dataclass(frozen=True)
class Place:
    """One thing `clean` can remove: what it is, its paths, size, and why it is kept if so."""

    kind: str  # "cache" or "environment"
    name: str
    paths: tuple[Path, ...]
    size: int
    kept: str = ""  # why it is not the tool's to remove ("" when it is)


def _is_tagged(cache: Path) -> bool:
    try:
        return (cache / CACHEDIR_TAG).read_text().startswith(_TAG_SIGNATURE + "\n# This file "
                                                             "marks the cache of megatron-env")
    except OSError:
        return False


#: What the tool makes in its cache root, one directory each (git mirrors, sdists, source and
#: patched trees, built wheels, their build trees, logs and facts, the bundles' parts); any
#: other entry (a file, a link, a directory of another name) is not the tool's to remove.
CACHE_PARTS = ("build", "bundle-conda", "bundle-wheels", "bundles", "conda-pkgs", "facts", "git",
               "logs", "object-costs", "patched", "sdists", "src", "toolchain", "uv-offline",
               "wheels")


def _cache_part(p: Path) -> bool:
    """A directory (never a link, whatever it points at) of a name the tool gives, or the
    temporary of one a run left."""
    return (p.is_dir() and not p.is_symlink()
            and (p.name in CACHE_PARTS or p.name.split(".tmp-")[0] in CACHE_PARTS))


def caches(cache: Path) -> list[Place]:
    """The cache root's parts (git mirrors, sources, wheels, builds ...), one place each; an
    entry the tool does not make there is listed as kept."""
    if not cache.is_dir():
        return []
    tagged = _is_tagged(cache)
    kept = "" if tagged else f"no {CACHEDIR_TAG} of megatron-env in {cache}"
    return [Place("cache", p.name, (p,), size_of(p),
                  kept or ("" if _cache_part(p) else "not a part of megatron-env's cache"))
            for p in sorted(cache.iterdir()) if p.name != CACHEDIR_TAG]


def _stamped_store(store: Path) -> bool:
    """An environment store the tool made: its lock file, and every directory in it an
    environment with the tool's stamp (or a temporary of one)."""
    from megatron_env.pyenv import env

    if not (store / ".lock").is_file():
        return False
    return all(files.dead(p) or "tmp-" in p.name or (p / env.STAMP).is_file()
               for p in store.iterdir() if p.is_dir() and not p.is_symlink())


def _stamps(d: Path) -> bool:
    """A directory of setup stamps the tool made: a real directory holding a step's stamp or
    the lock every setup run takes there."""
    from megatron_env.setup.steps import STEPS

    if d.is_symlink() or not d.is_dir():
        return False
    return (d / ".lock").is_file() or any((d / f"{step}.json").is_file() for step in STEPS)


def _link(prefix: Path, store: Path) -> bool:
    """The prefix as the tool leaves it: a link into its store, or a stamped directory."""
    from megatron_env.pyenv import env

    if prefix.is_symlink():
        return prefix.resolve().parent == store.resolve()
    return (prefix / env.STAMP).is_file()


def environment(prefix: Path) -> Place:
    """The environment at `prefix` with its store, setup stamps and Megatron checkouts: the
    tool's when its store is stamped or (under the marked default root) it has the tool's
    setup stamps; a prefix that is neither a link into that store nor stamped stays."""
    store = prefix.with_name(prefix.name + ".d")
    marked_root = prefix.parent == project.env_root() and (prefix.parent / ROOT_MARK).is_file()
    stamped = _stamped_store(store)
    ours = stamped or (marked_root and _stamps(prefix.with_name(prefix.name + ".setup")))
    paths = tuple(p for p in (prefix.with_name(prefix.name + s) for s in _ENV_PARTS)
                  if (p.exists() or p.is_symlink()) and (p != prefix or _link(prefix, store))
                  and (p != store or stamped))
    kept = "" if ours and paths else \
        f"{prefix} is not an environment megatron-env made (no stamped {store})"
    return Place("environment", prefix.name, paths, sum(size_of(p) for p in paths), kept)


def environments(root: Path) -> list[Place]:
    """Every environment under the default root, by name."""
    if not root.is_dir():
        return []
    names = set()
    for p in root.iterdir():
        if p.name == ROOT_MARK:
            continue
        base = p.name
        for s in _ENV_PARTS[1:]:
            if base.endswith(s):
                base = base[:-len(s)]
                break
        names.add(base.split(".tmp-")[0])
    return [environment(root / n) for n in sorted(names)]


@command(dry_run="list what would be removed, with sizes, and remove nothing",
         prefix="an environment outside the default place to remove too",
         cache_dir="the cache to clean (default: the one in use: --cache-dir, "
                   "MEGATRON_ENV_CACHE, .cache in a project, else the user's cache directory)",
         only="`caches` or `environments`: clean only those")
def clean(dry_run: bool = False, prefix: str | None = None, cache_dir: str | None = None,
          only: str | None = None) -> int:
    """List the caches and environments the tool made, with sizes, and remove them."""
    if only not in (None, "caches", "environments"):
        raise UserError(f"--only {only} is neither `caches` nor `environments`",
                        fix="pass --only caches or --only environments (or leave it out)",
                        kind="input.value")
    cache = Path(cache_dir).expanduser().absolute() if cache_dir else project.cache_root()
    places: list[Place] = []
    if only != "environments":
        places += caches(cache)
    if only != "caches":
        places += environments(project.env_root())
        if prefix:
            at = Path(prefix).expanduser().absolute()
            named = environment(at)
            if not any(p.exists() or p.is_symlink()
                       for p in (at.with_name(at.name + s) for s in _ENV_PARTS)):
                raise UserError(f"no environment at {prefix}", fix="check the --prefix",
                                kind="input.path")
            if named.kept:
                raise UserError(named.kept, fix="remove it by hand if it is yours to remove",
                                kind="clean.not-ours")
            places.append(named)
    rows, freed, kept = [], 0, 0
    for p in places:
        if p.kept:
            kept += 1
            rows.append((p.kind, p.name, f"{p.size / MIB:,.1f} MiB", "kept: " + p.kept))
            continue
        if not dry_run:
            for path in p.paths:
                files.discard(path)
        freed += p.size
        rows.append((p.kind, p.name, f"{p.size / MIB:,.1f} MiB",
                     ("would remove " if dry_run else "removed ") + ", ".join(map(str, p.paths))))
    output.table(rows)
    verb = "would free" if dry_run else "freed"
    output.summary(f"clean: {verb} {freed / MIB:,.1f} MiB in {len(places) - kept} place(s)"
                   + (f"; {kept} kept (not provably megatron-env's)" if kept else "")
                   + f"; cache {cache}, environments {project.env_root()}")
    return 0
