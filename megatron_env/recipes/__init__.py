"""The kernel recipes: one module per package here, each defining `RECIPE` (recipe.py: the types
they are made of).

Adding a package is adding a module (and `[kernels.<name>]` lines to the profiles that build
it); nothing else in megatron_env names a kernel package.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from megatron_env.errors import UserError
from megatron_env.recipes.recipe import Recipe


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
                        fix="`invoke kernels` lists the recipes with their pins and variants")
    return recipes[name]
