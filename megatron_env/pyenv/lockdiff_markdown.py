"""The lock-diff document (pyenv/lockdiff.py, format 1: docs/locks.md) for people: markdown
for a pull request's comment and job summary, one section per profile that moved (a summary line,
a table of packages with their sizes and flags, yanked files, kernel rebuilds, Megatron's
commit), cut to a comment's size limit at a row; or the document itself as JSON.

Apart from the report: what a lock change is, and how a person reads one, change for different
reasons (the comment's layout is tuned without touching how a diff is computed)."""

from __future__ import annotations

import json
from typing import Any

NO_CHANGES = "No lock changes."


def mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} kB"


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "−") + mb(abs(n))


def quiet(p: dict[str, Any]) -> bool:
    return not (p["changes"] or p["yanked"] or p["kernels"] or p["megatron"]["moved"])


def render(rep: dict[str, Any], as_json: bool) -> str:
    return json.dumps(rep, indent=2) if as_json else markdown(rep)


def _summary_line(p: dict[str, Any]) -> str:
    if p.get("status") in ("added", "removed"):  # a whole profile: one line, no table
        size = p["size_after"] if p["status"] == "added" else p["size_before"]
        return (f"profile {p['status']}: {p['packages']} packages"
                + (f", download per node {mb(size)}" if size is not None else ""))
    counts: dict[str, int] = {}
    for c in p["changes"]:
        counts[c["change"]] = counts.get(c["change"], 0) + 1
    line = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no package moved"
    if p["size_before"] is not None and p["size_before"] == p["size_after"]:
        line += f"; download per node {mb(p['size_after'])} (unchanged)"
    elif p["size_before"] is not None:
        line += (f"; download per node {mb(p['size_before'])} → {mb(p['size_after'])} "
                 f"({_signed(p['size_after'] - p['size_before'])})")
    return line


def _table(p: dict[str, Any]) -> list[str]:
    if not p["changes"] or p.get("status") in ("added", "removed"):
        return []
    rows = ["| package | change | old | new | size old | size new | flags |\n"
            "|---|---|---|---|---|---|---|"]
    for c in p["changes"]:
        flags = (["**major**"] if c["major"] else []) + (
            [f"**yanked**: {c['yanked'] or 'no reason given'}"]
            if c["yanked"] is not None else [])
        sizes = [mb(c["size_old"]) if c["old"] else "", mb(c["size_new"]) if c["new"]
                 else ""] if p["size_before"] is not None else ["", ""]
        rows.append(f"| {c['name']} | {c['change']} | {c['old'] or ''} | "
                    f"{c['new'] or ''} | {sizes[0]} | {sizes[1]} | {' '.join(flags)} |")
    return [*rows, ""]


def cut(text: str, max_bytes: int, note: str) -> str:
    """`text` in at most `max_bytes` UTF-8 bytes, cut at a line (a table row) boundary, never
    inside a character; a cut text ends with `note` (which counts toward the limit)."""
    if len(text.encode()) <= max_bytes:
        return text
    budget = max_bytes - len(("\n" + note + "\n").encode())
    kept, used = [], 0
    for line in text.splitlines(keepends=True):
        if used + len(line.encode()) > budget:
            break
        kept.append(line)
        used += len(line.encode())
    return "".join(kept) + "\n" + note + "\n"


def markdown(rep: dict[str, Any]) -> str:
    parts = []
    for p in rep["profiles"]:
        if quiet(p):
            continue
        parts.append(f"### {p['profile']} (`{p['lock']}`)\n\n{_summary_line(p)}\n")
        parts += _table(p)
        for y in (y for y in p["yanked"] if y["name"] not in {c["name"] for c in p["changes"]}):
            parts.append(f"- **yanked** on the index: {y['name']}=={y['version']} "
                         f"({y['reason'] or 'no reason given'})")
        for k in p["kernels"]:
            why = f" ({', '.join(k['inputs'])})" if k["inputs"] else ""
            then = ("no longer built" if k["status"] == "removed" else
                    "every node builds it again (or takes it from the shared build cache)")
            parts.append(f"- kernel build **{k['recipe']}**: {k['status']}{why}: {then}")
        m = p["megatron"]
        if m["moved"]:
            parts.append(f"- Megatron-LM commit moved: {(m['old'] or 'none')[:12]} → "
                         f"{(m['new'] or 'none')[:12]}")
        parts.append("")
    if not parts:
        return NO_CHANGES
    if not rep["index_read"]:
        parts.append("_Sizes and yanked flags unknown: the package index was not read._")
    return "\n".join(parts).rstrip() + "\n"
