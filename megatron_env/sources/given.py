"""Sources handed in by the caller instead of the network: what an unpacked bundle holds.

A value, passed down as an argument (never through the process environment): the bare
repository standing in for each git source (by its name: `megatron`, a package,
`package/third_party/x`), the file standing in for each kernel sdist (by package name) and the
file standing in for each recipe resource (by resource name, recipes/recipe.py: `Resource`). None
or an empty `Given` means online: the user's MEGATRON_ENV_MIRROR_* / MEGATRON_ENV_SOURCE_*
variables, then the profile's URLs and the package index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Given:
    mirrors: Mapping[str, Path] = field(default_factory=dict)
    sdists: Mapping[str, Path] = field(default_factory=dict)
    resources: Mapping[str, Path] = field(default_factory=dict)

    def mirror(self, name: str) -> Path | None:
        return self.mirrors.get(name)

    def sdist(self, name: str) -> Path | None:
        return self.sdists.get(name)

    def resource(self, name: str) -> Path | None:
        return self.resources.get(name)
