"""Git sources pinned by commit: a cached bare mirror per repository, tags checked against pins.

Tags move; the commit in the profile is the pin. A mirror URL or a local bare repository can
stand in for the upstream (air-gapped clusters): `MEGATRON_ENV_MIRROR_<NAME>` (for example
MEGATRON_ENV_MIRROR_MEGATRON=/srv/git/Megatron-LM.git) replaces the profile's URL.

git is always called with `--` before a URL or path (`--end-of-options` before a ref), and a
URL or mirror value that starts with '-' is refused, so no value can pass as one of git's
options (`--upload-pack=...`). Credentials in a mirror URL are printed redacted (every console
line goes through megatron_env.redact).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from megatron_env import digest, files, output, proc, project
from megatron_env.errors import UserError
from megatron_env.sources.given import Given

CACHE_ENV = project.CACHE_ENV


def cache_dir() -> Path:
    return project.cache_root()


def mirror_var(name: str) -> str:
    return "MEGATRON_ENV_MIRROR_" + re.sub(r"[^A-Z0-9]", "_", name.upper())


def repo_url(name: str, url: str, given: Given | None = None) -> str:
    """Where `name` is fetched from: a bundle's repository, else the user's
    MEGATRON_ENV_MIRROR_<NAME>, else the profile's URL. A value starting with '-' is refused:
    git would read it as an option (`--upload-pack=...`)."""
    mirror = given.mirror(name) if given else None
    if mirror:
        return str(mirror)
    value = os.environ.get(mirror_var(name))
    if value is not None and value.startswith("-"):
        raise UserError(f"{mirror_var(name)}={value!r} starts with '-'",
                        fix="set it to a URL (https://...) or an absolute path of a bare "
                            "repository", kind="input.value")
    if value is None and url.startswith("-"):
        raise UserError(f"the {name} repository URL {url!r} starts with '-'",
                        fix="fix the URL in the profile: a URL (https://...) or an absolute path",
                        kind="profile.invalid")
    return value if value is not None else url


def _git(*args: str | Path, cwd: Path | None = None, timeout: float = 1800) -> proc.Result:
    r = proc.run(["git", *map(str, args)], cwd=cwd, timeout=timeout,
                 env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    if r.missing:
        raise UserError("git is not installed", fix="install git (apt-get install git)",
                        kind="tool.no-git")
    return r


def mirror(name: str, url: str, echo: output.Echo = output.status,
           given: Given | None = None) -> Path:
    """A bare mirror of `url` under the cache, created or brought up to date (tags forced)."""
    url = repo_url(name, url, given)
    local = Path(url[len("file://"):] if url.startswith("file://") else url)
    if url.startswith(("/", "file://")) and local.is_dir() and not (
            (local / "HEAD").exists() or (local / ".git").exists()):
        where = (f"{mirror_var(name)}={url}" if os.environ.get(mirror_var(name))
                 else f"the {name} repository {url}")
        raise UserError(f"{where} is a directory but not a git repository"
                        + (" (it is empty)" if not any(local.iterdir()) else ""),
                        fix=f"fill it with `git clone --mirror <upstream URL> {local}` on a "
                            "machine that can reach upstream, or point at another mirror",
                        kind="source.mirror")
    key = digest.hexpart(digest.of_bytes(url.encode()), 12)
    path = cache_dir() / "git" / f"{name}-{key}.git"
    if path.exists():
        echo(f"{name}: updating the mirror of {url}")
        _reached(name, url, path, _git(f"--git-dir={path}", "fetch", "--prune", "--force",
                                       "--tags", "--", "origin", "+refs/heads/*:refs/heads/*"))
    else:
        echo(f"{name}: mirroring {url}")
        path.parent.mkdir(parents=True, exist_ok=True)
        files.sweep(path.parent, path.name)
        with files.publishing(path, tree=True) as tmp:
            tmp.rmdir()  # git clone makes it
            _reached(name, url, path, _git("clone", "--mirror", "--quiet", "--", url, tmp))
    return path


def _reached(name: str, url: str, path: Path, r: proc.Result) -> None:
    """A git fetch or clone that failed, said as what it is: a full disk or an unreachable
    repository."""
    if not r.ok and files.said_full(r.output):
        raise files.full(path.parent, what=f"the {name} mirror")
    if not r.ok:
        raise UserError(f"cannot reach the {name} repository {url}: {r.tail(2)}",
                        fix=f"set {mirror_var(name)} to a reachable mirror or a local bare "
                            "repository (git clone --mirror URL on a machine that can reach it)",
                        kind="source.unreachable")


def resolve(git_dir: Path, ref: str) -> str | None:
    r = _git(f"--git-dir={git_dir}", "rev-parse", "--verify", "--quiet", "--end-of-options",
             f"{ref}^{{commit}}")
    return r.stdout.strip() if r.ok else None


def checkout(name: str, url: str, tag: str | None, commit: str, dest: Path,
             echo: output.Echo = output.status, given: Given | None = None) -> Path:
    """The tree of `commit` at `dest`, after checking that `tag` (when given) still points at it."""
    git_dir = mirror(name, url, echo=echo, given=given)
    at = resolve(git_dir, tag or commit)
    if at is None:
        what = f"tag {tag}" if tag else f"commit {commit}"
        raise UserError(f"{name}: {what} does not exist in {repo_url(name, url, given)}",
                        fix="check the pin in the profile, or the mirror",
                        kind="source.missing-ref")
    if at != commit:
        raise UserError(f"{name}: tag {tag} now points at {at}, the profile pins {commit}: "
                        "the tag moved", fix="check upstream; if the move is intended, update "
                                             "the commit in the profile through a reviewed change",
                        kind="source.tag-moved")
    if dest.exists():
        files.discard(dest)
    with files.publishing(dest, tree=True) as tmp:
        tmp.rmdir()  # git clone makes it
        r = _git("clone", "--quiet", "--no-checkout", "--shared", "--", git_dir, tmp)
        if r.ok:
            r = _git("-C", tmp.absolute(), "-c", "advice.detachedHead=false", "checkout",
                     "--quiet", commit, "--")
        if not r.ok:
            raise UserError(f"{name}: checkout of {commit} failed: {r.tail(3)}",
                            kind="source.checkout-failed")
    return dest
