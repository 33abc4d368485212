"""The variables that point the tool at mirrors and local copies, as the code reads them: one
row per variable and pin, made from the same functions the fetching code calls
(bundle.make.git_pins and repos.mirror_var for git repositories, recipe.source_var for sdists
and recipe resources). `megatron-env kernels --mirrors` prints it; docs/setup.md holds it
between markers and a test keeps the two equal, so the docs cannot name a variable the code
does not read."""

from __future__ import annotations

from megatron_env.profile import Profile

BEGIN, END = "<!-- mirrors:begin (megatron-env kernels --mirrors) -->", "<!-- mirrors:end -->"


def rows(profiles: list[Profile]) -> list[tuple[str, str, str, str]]:
    """(variable, what it stands in for, the pin it must hold, profiles), one per variable and
    pin, in the order the setup chain fetches them."""
    from megatron_env.bundle.make import git_pins
    from megatron_env.kernels import build
    from megatron_env.recipes.recipe import source_var
    from megatron_env.sources.repos import mirror_var

    seen: dict[tuple[str, str, str], list[str]] = {}
    for prof in profiles:
        kernels = build.packages(prof)
        found = []
        for name, url, commit, tag in git_pins(prof, (), kernels):
            found.append((f"`{mirror_var(name)}`", f"git repository of {name} ({url})",
                          f"commit {commit[:12]}" + (f", tag {tag}" if tag else "")))
        for k in kernels.values():
            if k.source.sha256:
                found.append((f"`{source_var(k.name)}`",
                              f"{k.name} sdist `{k.source.url}` (a path or URL)",
                              f"sha256 {k.source.sha256[:12]}"))
            for res in k.source.resources:
                what = (f"the wheel `{res.wheel}` (a path)" if res.wheel else
                        f"{', '.join(f'`{t}`' for t in res.take)} of {res.repo} at "
                        f"{res.commit[:12]} (a directory or tar)")
                pin = f"sha256 {res.sha256[:12]}" if res.wheel else f"git tree {res.tree[:12]}"
                found.append((f"`{source_var(res.name)}`", f"{k.name}: {what}", pin))
        for row in found:
            seen.setdefault(row, []).append(prof.name)
    return [(*row, ", ".join(names)) for row, names in seen.items()]


def markdown(profiles: list[Profile]) -> str:
    """The table as docs/setup.md holds it (without the markers)."""
    lines = ["| variable | stands in for | must hold | profiles |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows(profiles)]
    return "\n".join(lines) + "\n"


def in_doc(text: str, begin: str = BEGIN, end: str = END) -> str | None:
    """The table between the markers of a document (None: no markers)."""
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"
