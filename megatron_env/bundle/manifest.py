"""A bundle's manifest.json as one typed value, parsed once where it crosses into the tool.

The manifest arrives from a file someone copied between sites: it is input, not our own state.
`Manifest.parse` checks every field the offline side reads (type, and the shapes that matter:
sha256 hex, sizes, relative paths) and refuses anything else with one line naming the file and
the field; nothing below it indexes a dict that may lack a key. The raw document is kept for
its digest (a delta names its base by it) and for callers that print it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from megatron_env.errors import UserError

FORMAT = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")


class _Bad(Exception):
    """One field of the manifest is not what the format says (its path and what was found)."""


def _field(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str,
           optional: bool = False) -> Any:
    """doc[key] when it is of `kind` (true/false is not an integer here); missing -> None when
    `optional`."""
    if key not in doc:
        if optional:
            return None
        raise _Bad(f"{where}{key} is missing")
    value, kinds = doc[key], kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise _Bad(f"{where}{key} is {type(value).__name__}, not {_name(kinds)}")
    return value


def _name(kinds: tuple[type, ...]) -> str:
    return " or ".join({"str": "a string", "int": "an integer", "dict": "an object",
                        "list": "a list", "bool": "true/false", "NoneType": "null"}
                       .get(k.__name__, k.__name__) for k in kinds)


def _relpath(value: str, where: str) -> str:
    p = PurePosixPath(value)
    if not value or p.is_absolute() or ".." in p.parts or "\\" in value:
        raise _Bad(f"{where} is {value!r}, not a relative path inside the bundle")
    return value


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int
    role: str
    in_base: bool = False  # a delta's file that its base bundle carries


@dataclass(frozen=True)
class MadeFor:
    """The profile a bundle was made from (name and content digest) and its stack."""

    name: str
    digest: str
    python: str
    torch: str
    cuda: str


@dataclass(frozen=True)
class Item:
    """A named thing the bundle carries at `path` (a git repository, an sdist, a conda
    package); `extra` holds its other string fields (commit, tag, sha256, url)."""

    name: str
    path: str
    extra: Mapping[str, str]

    def __getitem__(self, key: str) -> str:  # commit, tag, sha256, url
        return {"name": self.name, "path": self.path, **self.extra}[key]


@dataclass(frozen=True)
class Manifest:
    profile: MadeFor
    python: str
    machine: str
    mode: str  # "full" (carries the environment's wheels) or "adopt"
    with_builds: bool
    made_at: str
    base: str | None  # the digest of the bundle this one is a delta of
    without: tuple[str, ...]
    git: tuple[Item, ...]
    sources: tuple[Item, ...]
    conda: tuple[Item, ...]
    files: Mapping[str, FileEntry]
    resources: tuple[Item, ...] = ()  # recipe resources (name, path, package, digest)
    tool_version: str = ""  # the megatron-env that made it (what a reader may print)
    wheels: str = ""  # the wheel platform its lock was resolved for
    # as read (or as written): its digest names this bundle in a delta chain
    doc: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_doc(self) -> dict[str, Any]:
        """The manifest.json document of these fields: the one writer of the format, so what
        `parse` reads is what was written (test_bundle_manifest round-trips it)."""
        return {
            "format": FORMAT, "tool": {"name": "megatron-env", "version": self.tool_version},
            "made_at": self.made_at,
            "profile": {"name": self.profile.name, "digest": self.profile.digest,
                        "python": self.profile.python, "torch": self.profile.torch,
                        "cuda": self.profile.cuda},
            "python": self.python,
            "platform": {"system": "linux", "machine": self.machine, "wheels": self.wheels},
            "mode": self.mode, "with_builds": self.with_builds, "base": self.base,
            "without": list(self.without),
            "git": [_item_doc(i) for i in self.git],
            "sources": [_item_doc(i) for i in self.sources],
            "resources": [_item_doc(i) for i in self.resources],
            "conda": [_item_doc(i) for i in self.conda],
            "files": {rel: {"sha256": f.sha256, "size": f.size, "role": f.role,
                            **({"in": "base"} if f.in_base else {})}
                      for rel, f in sorted(self.files.items())},
        }

    @classmethod
    def parse(cls, doc: object, source: str) -> Manifest:
        """`doc` (the JSON value of `source`'s manifest.json) as a Manifest, or one UserError
        naming the field."""
        try:
            return cls._parse(doc)
        except _Bad as e:
            raise UserError(f"{source}: manifest.json is not a format-{FORMAT} bundle manifest: "
                            f"{e}", fix="copy the bundle again from where it was made, or make "
                            "it again with this version of megatron-env",
                            kind="bundle.manifest") from None

    @classmethod
    def _parse(cls, doc: object) -> Manifest:
        if not isinstance(doc, dict):
            raise _Bad(f"the document is {type(doc).__name__}, not an object")
        if doc.get("format") != FORMAT or isinstance(doc.get("format"), bool):
            raise _Bad(f"format is {doc.get('format')!r}, not {FORMAT}")
        prof = _field(doc, "profile", dict, "")
        made = MadeFor(*(_field(prof, k, str, "profile.") for k in
                         ("name", "digest", "python", "torch", "cuda")))
        platform = _field(doc, "platform", dict, "")
        mode = _field(doc, "mode", str, "")
        if mode not in ("full", "adopt"):
            raise _Bad(f"mode is {mode!r}, not full or adopt")
        without = _field(doc, "without", list, "", optional=True) or []
        if not all(isinstance(w, str) for w in without):
            raise _Bad("without holds something that is not a package name")
        base = _field(doc, "base", (str, type(None)), "", optional=True)
        tool = _field(doc, "tool", dict, "", optional=True) or {}
        return cls(made, _field(doc, "python", str, ""), _field(platform, "machine", str,
                                                                "platform."),
                   mode, _field(doc, "with_builds", bool, ""), _field(doc, "made_at", str, ""),
                   base, tuple(without), _items(doc, "git", ("commit",)),
                   _items(doc, "sources", ("sha256",)), _items(doc, "conda", ("url",)),
                   _files(_field(doc, "files", dict, "")), _items(doc, "resources", ("digest",)),
                   _field(tool, "version", str, "tool.", optional=True) or "",
                   _field(platform, "wheels", str, "platform.", optional=True) or "", doc)


def _item_doc(item: Item) -> dict[str, str]:
    return {"name": item.name, "path": item.path, **item.extra}


def _items(doc: Mapping[str, Any], key: str, required: tuple[str, ...]) -> tuple[Item, ...]:
    out = []
    for i, raw in enumerate(_field(doc, key, list, "", optional=True) or []):
        where = f"{key}[{i}]."
        if not isinstance(raw, dict):
            raise _Bad(f"{key}[{i}] is {type(raw).__name__}, not an object")
        name, path = _field(raw, "name", str, where), _field(raw, "path", str, where)
        for k in required:
            _field(raw, k, str, where)
        extra = {k: v for k, v in raw.items() if k not in ("name", "path")}
        if not all(isinstance(v, (str, type(None))) for v in extra.values()):
            raise _Bad(f"{where[:-1]} has a field that is not a string")
        out.append(Item(name, _relpath(path, where + "path"),
                        {k: v for k, v in extra.items() if v is not None}))
    return tuple(out)


def _files(raw: Mapping[str, Any]) -> dict[str, FileEntry]:
    out = {}
    for rel, meta in raw.items():
        where = f"files[{rel!r}]"
        _relpath(rel, where)
        if not isinstance(meta, dict):
            raise _Bad(f"{where} is {type(meta).__name__}, not an object")
        sha = _field(meta, "sha256", str, where + ".")
        size = _field(meta, "size", int, where + ".")
        if not _HEX64.fullmatch(sha):
            raise _Bad(f"{where}.sha256 is not 64 hex digits")
        if size < 0:
            raise _Bad(f"{where}.size is negative")
        inb = _field(meta, "in", str, where + ".", optional=True)
        out[rel] = FileEntry(sha, size, _field(meta, "role", str, where + "."), inb == "base")
    return out
