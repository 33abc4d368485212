"""Small real git repositories for the tests (upstreams, mirrors, submodules)."""

import subprocess
from pathlib import Path

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def git(*args, cwd) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def repo_with(path: Path, files: dict[str, str], message: str = "one") -> str:
    """A work tree at `path` holding `files`, committed once -> the commit."""
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    git("init", "-q", cwd=path)
    git("add", "-A", cwd=path)
    git("commit", "-qm", message, cwd=path)
    return git("rev-parse", "HEAD", cwd=path)


def with_submodule(tmp: Path) -> tuple[Path, str, Path, str]:
    """A package repository and a header repository for its submodule that moved on after the
    commit pinned: -> (package repo, its commit, header repo, the pinned header commit)."""
    headers = tmp / "headers"
    first = repo_with(headers, {"include/h.h": "// one\n"})
    (headers / "include/h.h").write_text("// two\n")
    git("commit", "-qam", "two", cwd=headers)  # the submodule moved on; the pin did not
    top = repo_with(tmp / "top", {"setup.py": ""})
    return tmp / "top", top, headers, first


def project_files(root: Path, untracked: bool = True) -> list[str]:
    """The files of the checkout at `root` as git sees them (tracked, and with `untracked` the
    new files git does not ignore). A copy of the tree that git ignores (mutation testing runs the tests in one,
    mutants/) has no such list: its files as they lie, less caches and build leftovers."""
    new = ["--others", "--exclude-standard"] if untracked else []
    files = subprocess.run(["git", "-C", str(root), "ls-files", "--cached", *new],
                           capture_output=True, text=True, check=True).stdout.split()
    if files:
        return files
    skip = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".nox", ".venv",
            "mutants", "build", "dist"}
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and not skip & set(p.relative_to(root).parts)
                  and not p.name.endswith((".pyc", ".meta")) and ".egg-info" not in str(p))
