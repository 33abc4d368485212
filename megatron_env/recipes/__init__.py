"""The kernel recipes: one module per package here, each defining `RECIPE` (recipe.py: the types
they are made of).

Adding a package is adding a module (and `[kernels.<name>]` lines to the profiles that build
it); nothing else in megatron_env names a kernel package.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from functools import cache
from typing import Any, Protocol

from megatron_env.errors import UserError
from megatron_env.recipes.recipe import Recipe


class Pinned(Protocol):
    """What the table reads of a profile (megatron_env.profile.Profile, which imports this)."""

    @property
    def name(self) -> str: ...
    @property
    def kernels(self) -> dict[str, dict[str, Any]]: ...


@cache
def declared() -> dict[str, Recipe]:
    """Every recipe, by name."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "recipe":
            continue
        r: Recipe = importlib.import_module(f"{__name__}.{info.name}").RECIPE
        found[r.name] = r
    return dict(sorted(found.items()))


def get(name: str) -> Recipe:
    recipes = declared()
    if name not in recipes:
        raise UserError(f"no recipe named {name!r}; declared: {', '.join(recipes)}",
                        fix="`invoke kernels` lists the recipes with their pins and variants",
                        kind="recipe.unknown")
    return recipes[name]


def table(profiles: Sequence[Pinned]) -> list[tuple[str, str]]:
    """`invoke kernels`: each recipe (source, what it is, variants and choices), then what each
    of `profiles` pins of it (version or tag @ commit, variants chosen)."""
    rows = []
    for r in declared().values():
        rows.append((r.name, f"{r.source:<5}  {r.about}"))
        if r.variants:
            rows.append(("", "variants  " + ", ".join(v.name + ("*" if v.default else "")
                                                      for v in r.variants)))
        for c in r.choices:  # multi-valued: the profile lists values
            rows.append(("", f"{c.name}  {', '.join(c.values)} (default {','.join(c.default)})"))
        for p in profiles:
            pins = p.kernels.get(r.name)
            if pins is None:
                rows.append(("", f"{p.name}  not pinned"))
                continue
            pin = pins.get("version") or " @ ".join(filter(None, (pins.get("tag"),
                                                                  pins["commit"][:12])))
            chosen = [*pins.get("variants", r.default_variants)]
            chosen += [f"{c.name}={','.join(pins.get(c.name, c.default))}" for c in r.choices
                       if c.name in pins or not c.modules]  # a module choice unset: unsaid
            rows.append(("", f"{p.name}  {pin}" + "".join(f" +{v}" for v in chosen)))
    return rows
