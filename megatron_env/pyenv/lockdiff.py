"""What a lock change does: added, removed, upgraded and downgraded packages between a git
revision and the working tree, as the markdown body of a lock-update pull request."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from megatron_env import REPO_ROOT, proc
from megatron_env.errors import UserError
from megatron_env.profile import LOCK_FILE
from megatron_env.pyenv.lock import parse_lock


def _git(*args: str) -> proc.Result:
    return proc.run(["git", "-C", REPO_ROOT, *args], timeout=60)


def default_base() -> str:
    r = _git("merge-base", "HEAD", "main")
    if r.missing:
        raise UserError("git is not installed", fix="install git")
    return r.stdout.strip() if r.ok and r.stdout.strip() else "HEAD"


def change(old: str | None, new: str | None) -> str:
    if old is None:
        return "added"
    if new is None:
        return "removed"
    try:
        return "upgraded" if Version(new) > Version(old) else "downgraded"
    except InvalidVersion:
        return "changed"


def diff(old: dict[str, str], new: dict[str, str]) -> list[tuple[str, str, str, str]]:
    rows = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a != b:
            rows.append((name, change(a, b), a or "", b or ""))
    return rows


def diff_all(base: str | None) -> dict[str, list[tuple[str, str, str, str]]]:
    base = base or default_base()
    if not _git("rev-parse", "--verify", f"{base}^{{commit}}").ok:
        raise UserError(f"{base!r} is not a git revision here", fix="pass --base REF")
    out = {}
    for path in sorted((REPO_ROOT / "envs").glob(f"*/{LOCK_FILE}")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        r = _git("show", f"{base}:{rel}")
        old = parse_lock(r.stdout) if r.ok else {}
        out[rel] = diff(old, parse_lock(path.read_text()))
    return out


def markdown(changes: dict[str, list[tuple[str, str, str, str]]]) -> str:
    parts = []
    for path, rows in changes.items():
        if not rows:
            continue
        parts.append(f"### {path}\n\n| package | change | old | new |\n|---|---|---|---|")
        parts += [f"| {n} | {c} | {a} | {b} |" for n, c, a, b in rows]
        parts.append("")
    return "\n".join(parts) if parts else "No lock changes."
