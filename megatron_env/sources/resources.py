"""Resources: pinned content placed into a source tree in place of a submodule.

A recipe declares them (recipes/recipe.py: `Resource`); this module fetches, verifies and places
them. Two origins, each pinned by a content hash:
- a wheel on the package index, by file name and sha256: downloaded with `pip download
  --only-binary` (a wheel runs nothing when it is fetched), or given as a local file;
- paths of a git repository at a commit, pinned by the git tree id of those paths together:
  `git archive` from a mirror, or a local directory or tar of the same paths, which is checked
  by recomputing that tree id (so an offline copy is held to the repository's own hash).
A local copy stands in for the network: the file a bundle carries (`Given.resources`, passed
down as a value), else MEGATRON_ENV_SOURCE_<NAME>; either is held to the same hash.
`carry` writes the one file a bundle keeps of a resource: the wheel itself, or a tar of the
`take` paths, each checked against its pin before it is written.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

from megatron_env import digest, files, output, proc
from megatron_env.errors import UserError
from megatron_env.recipes.recipe import Resource, source_var
from megatron_env.sources import archive, index, repos


def tree_id(root: Path, paths: tuple[str, ...]) -> str:
    """The git tree id of `paths` under `root` together: the root tree of an index holding
    only them (file modes included, as git records them)."""
    with tempfile.TemporaryDirectory(prefix="tree-") as tmp:
        env = {**os.environ, "GIT_DIR": str(Path(tmp) / "git"), "GIT_WORK_TREE": str(root),
               "GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_CEILING_DIRECTORIES": tmp}
        r = proc.run(["git", "init", "-q", "--bare", Path(tmp) / "git"], timeout=60,
                     env={k: v for k, v in env.items() if k != "GIT_WORK_TREE"})
        if r.ok:
            r = proc.run(["git", "add", "-f", "--", *paths], cwd=root, timeout=600, env=env)
        if r.ok:
            r = proc.run(["git", "write-tree"], cwd=root, timeout=600, env=env)
        if r.missing:
            raise UserError("git is not installed", fix="install git (apt-get install git)",
                            kind="tool.no-git")
        if not r.ok:
            raise UserError(f"cannot hash {', '.join(paths)} under {root}: {r.tail(2)}",
                            kind="resource.hash")
        return r.stdout.strip()


def _unpack(local: Path, dest: Path) -> None:
    """A directory is copied, a tar (any compression) extracted."""
    if local.is_dir():
        shutil.copytree(local, dest, symlinks=True, dirs_exist_ok=True)
        return
    try:
        with tarfile.open(local) as tar:
            archive.extract(tar, dest, str(local))
    except (tarfile.TarError, ValueError, OSError) as e:
        raise UserError(f"{local}: not a directory or a readable tar ({e})",
                        fix="give a directory or a tar of the resource's paths",
                        kind="resource.unreadable") from None


def _from_git(res: Resource, dest: Path, echo: output.Echo) -> None:
    git_dir = repos.mirror(res.name, res.repo, echo=echo)
    archive = dest.with_suffix(".tar")
    r = proc.run(["git", "--git-dir", git_dir, "archive", "--format=tar", "-o", archive,
                  res.commit, "--", *res.take], timeout=1800)
    if not r.ok:
        raise UserError(f"{res.name}: {', '.join(res.take)} at {res.commit} not found in "
                        f"{repos.repo_url(res.name, res.repo)}: {r.tail(2)}",
                        fix="check the mirror; it must hold the pinned commit",
                        kind="resource.commit")
    _unpack(archive, dest)
    archive.unlink()


def _local(res: Resource, given: Path | None) -> Path | None:
    """The local copy: a bundle's file first, then the user's variable."""
    env = os.environ.get(source_var(res.name))
    return given or (Path(env) if env else None)


def _wheel(res: Resource, where: Path, echo: output.Echo, local: Path | None) -> Path:
    """The pinned wheel file, checked by sha256: the local copy, or fetched from the configured
    index by its file name (sources/index.py: nothing of it run)."""
    if local:
        got = digest.file_hex(local)
        if got != res.sha256:
            raise UserError(f"{res.name}: {local} has sha256 {got}, the recipe pins "
                            f"{res.sha256}", fix=f"use the original {res.wheel}",
                            kind="resource.sha256")
        return local
    echo(f"{res.name}: fetching {res.wheel} from the package index")
    project = res.wheel.split("-")[0]
    try:
        fetched = index.fetch(project, res.wheel, res.sha256 or "", where / res.wheel, echo=echo)
    except UserError as e:
        raise UserError(f"cannot fetch {res.wheel}: {e.message}",
                        fix=f"set {source_var(res.name)} to a copy of that wheel",
                        kind=e.kind or "source.unreachable") from None
    if fetched.path != where / res.wheel:
        shutil.copy2(fetched.path, where / res.wheel)
    return where / res.wheel


def _tree_content(res: Resource, work: Path, echo: output.Echo, local: Path | None) -> Path:
    """The `take` paths of a tree resource under the returned directory, checked against the
    pinned tree id."""
    if local:
        _unpack(local, work)
        tops = list(work.iterdir())
        if (len(tops) == 1 and tops[0].is_dir()
                and not any((work / t).exists() for t in res.take)):
            work = tops[0]  # a tar of one top directory (cutlass/include ...)
    else:
        _from_git(res, work, echo)
    missing = [t for t in res.take if not (work / t).exists()]
    got = "" if missing else tree_id(work, res.take)
    if got != res.tree:
        where = local or f"{res.repo}@{res.commit}"
        raise UserError(
            f"{res.name}: {where} " + (f"lacks {', '.join(missing)}" if missing else
                                       f"holds tree {got}, the recipe pins {res.tree}"),
            fix=f"give {source_var(res.name)} the paths {', '.join(res.take)} of "
                f"{res.commit} (git archive {res.commit} {' '.join(res.take)})",
            kind="resource.tree")
    return work


def carry(res: Resource, dest: Path, echo: output.Echo = output.status) -> Path:
    """The file a bundle keeps of `res` in `dest`, checked against its pin: the wheel as it is,
    or `<name>-<tree>.tar.gz` of the `take` paths (what `place` unpacks and checks again)."""
    dest.mkdir(parents=True, exist_ok=True)
    local = _local(res, None)
    with tempfile.TemporaryDirectory(prefix=f"{res.name}-", dir=dest) as tmp:
        if res.wheel:
            out = dest / res.wheel
            with files.publishing(out) as part:  # a copy: the user's own file stays
                shutil.copyfile(_wheel(res, Path(tmp), echo, local), part)
            return out
        work = Path(tmp) / "content"
        work.mkdir()
        work = _tree_content(res, work, echo, local)
        out = dest / f"{res.name}-{res.tree[:12]}.tar.gz"
        with files.publishing(out) as part, tarfile.open(part, "w:gz") as tar:
            for t in res.take:  # sorted, no owners: the same content gives the same files
                tar.add(work / t, arcname=t, filter=_plain)
        return out


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def place(res: Resource, tree: Path, echo: output.Echo = output.status, *,
          given: Path | None = None) -> None:
    """Fetch `res` (or take `given`, a bundle's copy), check its hash and put its `take` paths
    under tree/res.path."""
    with tempfile.TemporaryDirectory(prefix=f"{res.name}-", dir=tree.parent) as tmp:
        work = Path(tmp) / "content"
        work.mkdir()
        local = _local(res, given)
        if res.wheel:
            whl = _wheel(res, Path(tmp), echo, local)
            with zipfile.ZipFile(whl) as z:
                members = [m for m in z.namelist()
                           if any(m == t or m.startswith(t.rstrip("/") + "/") for t in res.take)]
                z.extractall(work, members)
        else:
            work = _tree_content(res, work, echo, local)
        target = tree / res.path
        for t in res.take:
            if not (work / t).exists():
                raise UserError(f"{res.name}: {res.origin} holds no {t}",
                                fix="check the recipe's `take`", kind="resource.take")
            (target / t).parent.mkdir(parents=True, exist_ok=True)
            os.replace(work / t, target / t)
