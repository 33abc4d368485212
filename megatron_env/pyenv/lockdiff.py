"""What a lock change does, per profile, between a git revision and the working tree: the body
of a lock-update pull request as a stable JSON document (docs/locks.md); lockdiff_markdown
renders it for people.

Per profile: packages added, removed, upgraded and downgraded (major-version jumps flagged); the
download each node makes before and after (per package the one file an installer picks for linux
x86_64 and the profile's Python: the best-ranked wheel among the lock's hashed files, else the
sdist; sizes from the index's simple API); locked files the index has yanked (PEP 592); kernel
builds whose cache key changes (every node rebuilds them); whether Megatron's commit moved.
The index is read, never named in the output; without it (--offline, unreachable) sizes and
yanked flags are null and the rest still holds.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packaging import tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from megatron_env import REPO_ROOT, output, proc
from megatron_env.errors import UserError
from megatron_env.profile import LOCK_FILE, PROFILE_FILE, Profile, load_file
from megatron_env.pyenv.lock import WHEEL_PLATFORMS, parse_hashes, parse_lock, read
from megatron_env.redact import mask_urls
from megatron_env.sources import archive, index, index_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

FORMAT = 1
SIZE_BASIS = ("per package the file a linux x86_64 node downloads: the best-ranked wheel for "
              "the profile's Python (manylinux_2_28 and older) among the lock's hashed files, "
              "else its sdist; sizes from the package index")
# profile, torch pin, patches root -> recipe -> cache key document (kernels.build.static_key_docs)
KeyDocs = Callable[[Profile, str, Path], dict[str, dict[str, Any]]]


def _git(*args: str) -> proc.Result:
    return proc.run(["git", "-C", REPO_ROOT, *args], timeout=60)


def _in_git() -> bool:
    """True in a git work tree; else one clear refusal (git missing, or not a repository)."""
    r = _git("rev-parse", "--is-shallow-repository")
    if r.missing:
        raise UserError("git is not installed", fix="install git", kind="tool.no-git")
    if not r.ok:
        raise UserError(f"{REPO_ROOT} is not a git repository: lock-diff compares the locks with "
                        "those of a git revision", fix="run it in a git clone of the project "
                        "(or pass --project CLONE)", kind="lockdiff.not-git")
    return r.stdout.strip() == "true"


def _unknown_base(base: str, shallow: bool) -> UserError:
    if shallow:
        return UserError(f"{base!r} is not in this shallow clone's history",
                         fix="fetch the history: `git fetch --unshallow` (or `git fetch "
                             "--deepen=50 origin main`), then run lock-diff again",
                         kind="lockdiff.shallow")
    return UserError(f"{base!r} is not a git revision here", fix="pass --base REF naming a "
                     "commit, branch or tag (`git log --oneline` lists them)",
                     kind="lockdiff.base")


def default_base(shallow: bool = False) -> str:
    r = _git("merge-base", "HEAD", "main")
    if r.ok and r.stdout.strip():
        return r.stdout.strip()
    if shallow:
        raise _unknown_base("main", True)
    return "HEAD"


def change(old: str | None, new: str | None) -> str:
    if old is None:
        return "added"
    if new is None:
        return "removed"
    try:
        return "upgraded" if Version(new) > Version(old) else "downgraded"
    except InvalidVersion:
        return "changed"


def major(old: str | None, new: str | None) -> bool:
    """A major-version jump (for 0.x versions, the minor number is the major one)."""
    try:
        a, b = Version(old or ""), Version(new or "")
    except InvalidVersion:
        return False
    return bool(a.major != b.major or (a.major == 0 and a.minor != b.minor))


def diff(old: dict[str, str], new: dict[str, str]) -> list[tuple[str, str, str, str]]:
    rows = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a != b:
            rows.append((name, change(a, b), a or "", b or ""))
    return rows


@contextmanager
def tree_at(base: str) -> Iterator[Path]:
    """envs/ and patches/ as they were at `base`, in a temporary directory."""
    listed = _git("ls-tree", "--name-only", base, "--", "envs", "patches")
    with tempfile.TemporaryDirectory(prefix="megatron-env-lockdiff-") as tmp:
        paths = listed.stdout.split()
        if paths:
            r = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", base,
                                "--", *paths], capture_output=True, timeout=120)
            if r.returncode:
                raise UserError(f"git archive {base}: {r.stderr.decode(errors='replace')[-200:]}",
                                fix="pass --base REF naming a commit of this repository",
                                kind="lockdiff.base")
            with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
                archive.extract(tar, Path(tmp), f"git archive {base}")
        yield Path(tmp)


# --- what a node downloads, and what the index yanked ---------------------------------------


def _ranks(python: str) -> dict[tags.Tag, int]:
    """Wheel tags a linux x86_64 CPython `python` runs, best first (pip's order)."""
    v = tuple(int(x) for x in python.split("."))
    order = [*tags.cpython_tags(v, platforms=WHEEL_PLATFORMS),
             *tags.compatible_tags(v, interpreter=f"cp{v[0]}{v[1]}", platforms=WHEEL_PLATFORMS)]
    return {t: i for i, t in reversed(list(enumerate(order)))}


def pick(found: list[index.IndexFile], hashes: set[str], python: str) -> index.IndexFile | None:
    """The file of a locked package a node fetches: the best-ranked compatible wheel whose hash
    the lock allows, else such an sdist."""
    ranks, best, sdist = _ranks(python), None, None
    for f in found:
        if f.sha256 not in hashes:
            continue
        if f.name.endswith(".whl"):
            try:
                rank = min((ranks[t] for t in parse_wheel_filename(f.name)[3] if t in ranks),
                           default=None)
            except InvalidWheelFilename:
                continue
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, f)
        elif f.name.endswith((".tar.gz", ".zip")):
            sdist = f
    return best[1] if best else sdist


INDEX_TIMEOUT = 30.0  # seconds a page or HEAD request may take


def read_index(names: set[str], url: str | None) -> dict[str, list[index.IndexFile] | None]:
    """name -> the index's files for it (None: not read), eight requests at a time. A project
    the index does not list counts as not read: every locked package is on the index it was
    locked from, so an index that lists none of them is the wrong one and is warned about."""
    if url is None:
        return dict.fromkeys(names)
    cfg = index_config.Config(timeout=INDEX_TIMEOUT)

    def one(name: str) -> list[index.IndexFile] | None:
        try:
            return index.files(name, url, cfg) or None
        except UserError as e:
            if e.kind == "index.not-simple":  # the wrong URL, not an outage: say so
                raise
            return None

    with ThreadPoolExecutor(8) as pool:
        got = dict(zip(sorted(names), pool.map(one, sorted(names)), strict=True))
    if names and all(v is None for v in got.values()):
        output.warning(f"the package index {mask_urls(url)} could not be read: sizes and "
                       "yanked flags are left out (pass --index-url URL, or --offline)")
    return got


def facts(text: str, python: str, pages: dict[str, list[index.IndexFile] | None],
          url: str = "") -> dict[str, tuple[int | None, str | None]]:
    """name -> (download size, yanked reason or None: "" when the index gives none) of a lock's
    packages; `url` is the index the pages came from (its credentials go with a HEAD)."""
    hashes = parse_hashes(text)
    chosen = {n: pick(pages.get(n) or [], h, python) for n, h in hashes.items()}
    cfg = index_config.Config(timeout=INDEX_TIMEOUT)
    with ThreadPoolExecutor(8) as pool:
        sizes = dict(zip(chosen, pool.map(lambda f: f and index.size(f, url, cfg),
                                          chosen.values()), strict=True))
    out = {}
    for name, h in hashes.items():
        yanked = [f.reason for f in pages.get(name) or [] if f.sha256 in h and f.yanked]
        out[name] = (sizes[name], yanked[0] if yanked else None)
    return out


# --- the report ----------------------------------------------------------------------------


def _load(path: Path) -> Profile | None:
    try:
        return load_file(path) if path.exists() else None
    except UserError:  # a profile the current schema no longer reads: its keys are unknown
        return None


def _megatron(path: Path) -> str | None:
    try:
        return str(tomllib.loads(path.read_text())["megatron"]["commit"])
    except (OSError, KeyError, TypeError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def _recipe_code_moved(base: str) -> set[str]:
    """Recipes whose module (or the shared recipe.py) differs at `base`: their switches and build
    options, read from the working tree's code for both sides, may differ too."""
    r = _git("diff", "--name-only", base, "--", "megatron_env/recipes")
    moved = {Path(p).stem for p in r.stdout.split()} if r.ok else set()
    return {n for n in _recipe_names() if "recipe" in moved or n.replace("-", "_") in moved}


def _recipe_names() -> list[str]:
    from megatron_env import recipes

    return list(recipes.declared())


def kernel_changes(old: dict[str, dict[str, Any]] | None, new: dict[str, dict[str, Any]],
                   code_moved: set[str]) -> list[dict[str, Any]]:
    """Recipes whose cache key differs: which inputs moved (a rebuild on every node)."""
    out = []
    for name in sorted(set(old or {}) | set(new)):
        if old is None:
            out.append({"recipe": name, "status": "unknown",
                        "inputs": ["the base's profile.toml does not load here"]})
        elif name not in old or name not in new:
            out.append({"recipe": name, "status": "added" if name in new else "removed",
                        "inputs": []})
        else:
            inputs = sorted(k for k in new[name] if old[name].get(k) != new[name][k])
            inputs += ["recipe code"] if name in code_moved else []
            if inputs:
                out.append({"recipe": name, "status": "new key", "inputs": inputs})
    return out


def _texts(base: Path, head: Path) -> tuple[str | None, str | None]:
    """A lock's text at the base and in the work tree (None where it does not exist)."""
    return (read(base) if base.exists() else None, read(head) if head.exists() else None)


def _profile_report(name: str, base_root: Path, pages: dict[str, Any],
                    texts: tuple[str | None, str | None], key_docs: KeyDocs | None,
                    code_moved: set[str], url: str = "") -> dict[str, Any]:
    old_text, new_text = texts
    old, new = parse_lock(old_text or ""), parse_lock(new_text or "")
    head_prof = _load(REPO_ROOT / "envs" / name / PROFILE_FILE)
    base_prof = _load(base_root / "envs" / name / PROFILE_FILE)
    prof = head_prof or base_prof
    python = prof.python if prof else "3.12"
    before = facts(old_text or "", base_prof.python if base_prof else python, pages, url)
    after = facts(new_text or "", python, pages, url)
    changes = []
    for pkg, kind, a, b in diff(old, new):
        changes.append({"name": pkg, "change": kind, "old": a or None, "new": b or None,
                        "major": kind in ("upgraded", "downgraded") and major(a, b),
                        "yanked": after.get(pkg, (None, None))[1],
                        "size_old": before.get(pkg, (None, None))[0],
                        "size_new": after.get(pkg, (None, None))[0]})
    read = any(pages.get(n) is not None for n in set(old) | set(new))
    kernels: list[dict[str, Any]] = []
    if key_docs and head_prof:
        new_docs = key_docs(head_prof, new.get("torch", head_prof.torch), REPO_ROOT / "patches")
        old_docs = (key_docs(base_prof, old.get("torch", base_prof.torch), base_root / "patches")
                    if base_prof else None if (base_root / "envs" / name).exists() else {})
        kernels = kernel_changes(old_docs, new_docs, code_moved)
    m_old = _megatron(base_root / "envs" / name / PROFILE_FILE)
    m_new = _megatron(REPO_ROOT / "envs" / name / PROFILE_FILE)
    return {
        "profile": name, "lock": f"envs/{name}/{LOCK_FILE}", "changes": changes,
        "status": "added" if old_text is None else "removed" if new_text is None else "changed",
        "packages": len(new or old),
        "size_before": _total(before) if read else None,
        "size_after": _total(after) if read else None,
        "size_unknown": sorted(f"{n}=={new[n]}" for n, (s, _y) in after.items()
                               if s is None) if read else [],
        "yanked": [{"name": n, "version": new[n], "reason": y}
                   for n, (_s, y) in sorted(after.items()) if y is not None],
        "kernels": kernels,
        "megatron": {"old": m_old, "new": m_new, "moved": m_old != m_new},
    }


def _total(f: dict[str, tuple[int | None, str | None]]) -> int:
    return sum(s for s, _y in f.values() if s is not None)


def report(base: str | None, only: str | None = None, *, index_url: str | None,
           kernel_keys: KeyDocs | None = None) -> dict[str, Any]:
    """The lock-diff document (format 1: docs/locks.md) for every profile, or `only` one."""
    shallow = _in_git()
    base = base or default_base(shallow)
    commit = _git("rev-parse", "--verify", f"{base}^{{commit}}")
    if not commit.ok:
        raise _unknown_base(base, shallow)
    with tree_at(base) as root:
        names = sorted({p.parent.name for r in (root, REPO_ROOT)
                        for p in (r / "envs").glob(f"*/{LOCK_FILE}")})
        names = [n for n in names if only in (None, n)]
        texts = {n: _texts(root / "envs" / n / LOCK_FILE, REPO_ROOT / "envs" / n / LOCK_FILE)
                 for n in names}
        pages = read_index({p for t in texts.values() for x in t if x for p in parse_lock(x)},
                           index_url)
        code_moved = _recipe_code_moved(base) if kernel_keys else set()
        profiles = [_profile_report(n, root, pages, texts[n], kernel_keys, code_moved,
                                    index_url or "") for n in names]
    return {"format": FORMAT, "base": base, "base_commit": commit.stdout.strip(),
            "index_read": any(v is not None for v in pages.values()),
            "size_basis": SIZE_BASIS, "profiles": profiles}
