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
