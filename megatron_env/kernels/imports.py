"""Which compiled modules of the kernels a setup builds Megatron's own source imports, and which
of those the setup did not build: a profile that trims a kernel to what Megatron uses (a module
choice of its recipe) must not trim one it imports. A kernel the profile does not build at all
is its choice (Megatron's imports of it are optional), and not looked at. Read from the
source, never imported, so that the message names the file and line. Pure: a directory in,
names and places out."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from megatron_env import recipes

_IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)|from[ \t]+([\w.]+)"
                     r"[ \t]+import)", re.M)


def compiled_modules(kernels: Iterable[str]) -> set[str]:
    """Every compiled module the recipes of `kernels` can build: their modules, their variants'
    and the values of their module choices."""
    out: set[str] = set()
    for name in kernels:
        r = recipes.get(name)
        out |= set(r.modules)
        out |= {m for v in r.variants for m in v.modules}
        out |= {x for c in r.choices if c.modules for x in c.values}
    return out


def imported(root: Path, names: Iterable[str]) -> dict[str, str]:
    """name -> 'path:line' of the first place under `root` (tests left out) that imports it
    as a top-level module."""
    wanted = set(names)
    found: dict[str, str] = {}
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if "tests" in rel.parts:
            continue
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for m in _IMPORT.finditer(text):
            mods = [x.strip() for x in m.group(1).split(",")] if m.group(1) else [m.group(2)]
            for mod in mods:
                top = mod.split(".")[0]
                if top in wanted and top not in found:
                    found[top] = f"{rel}:{text.count(chr(10), 0, m.start()) + 1}"
    return found


def not_built(root: Path, kernels: Iterable[str], built: Iterable[str]) -> dict[str, str]:
    """The compiled modules the recipes of `kernels` can build that the source under `root`
    imports and that are not among `built`: name -> where it is imported."""
    return imported(root, compiled_modules(kernels) - set(built))
