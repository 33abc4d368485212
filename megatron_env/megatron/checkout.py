"""Megatron-LM at the profile's tag: checked out from a cached mirror, the tag verified against
the pinned commit, `patches/megatron/<tag>/` applied, installed editable into the profile's
environment without dependency resolution (the lock already decided), and its C++ dataset
helpers built by that install.

Checkouts live in `.megatron-env/<profile>.megatron/<commit>-<patch digest>/`, complete and
stamped before they are used, published by megatron_env.files: an interrupted run leaves only
a temporary that a later run removes once it is provably dead (never another node's live one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from megatron_env import digest, files, output, proc
from megatron_env.errors import UserError
from megatron_env.profile import Profile
from megatron_env.pyenv import env, manifest, probe, uv
from megatron_env.sources import patches, repos
from megatron_env.sources.given import Given

STAMP = ".megatron-env-source.json"
MODULES = ("megatron.core", "megatron.core.datasets.helpers")
MEGATRON_DIST = "megatron-core"


def patch_series(profile: Profile) -> list[Path]:
    return patches.series("megatron", profile.megatron["tag"])


def key(profile: Profile) -> str:
    series = digest.of_files(patch_series(profile))
    return f"{profile.megatron['commit'][:12]}-{digest.hexpart(series, 12)}"


def source_dir(profile: Profile) -> Path:
    return env.env_root() / f"{profile.name}.megatron" / key(profile)


def not_pinned(profile: Profile, imported_core: str) -> str | None:
    """Why the megatron.core that imported (its __init__.py) is not the profile's pinned
    checkout (None: it is): another Megatron earlier on sys.path (PYTHONPATH, an image's own
    install) would train with other code than the one the setup installed and verified."""
    src = source_dir(profile).resolve()
    try:
        Path(imported_core).resolve().relative_to(src)
    except ValueError:
        return (f"megatron.core imports from {Path(imported_core).parent}, not from the pinned "
                f"checkout {src} ({profile.megatron['tag']} @ {profile.megatron['commit'][:12]})")
    return None


def prepare(profile: Profile, echo: output.Echo = output.status,
            given: Given | None = None) -> Path:
    """The patched source tree of the profile's Megatron, made once per commit and patch series
    (`given`: a bundle's repository instead of the profile's URL)."""
    dest = source_dir(profile)
    if (dest / STAMP).exists():
        return dest
    root = dest.parent
    root.mkdir(parents=True, exist_ok=True)
    files.sweep(root)  # only what killed runs left: this host's dead ones, or long dead
    m = profile.megatron
    pristine = files.temp_for(root / f".pristine-{m['commit'][:12]}")
    series = patch_series(profile)
    if dest.exists():
        files.discard(dest)  # unstamped: half a checkout, never used
    try:
        repos.checkout("megatron", m["repo"], m["tag"], m["commit"], pristine, echo=echo,
                       given=given)
        with files.publishing(dest, tree=True) as staged:
            patches.apply_series(pristine, staged, series)
            for p in series:
                echo(f"megatron: applied {p.name}")
            (staged / STAMP).write_text(json.dumps(
                {"tag": m["tag"], "commit": m["commit"], "patches": [p.name for p in series],
                 "patch_digest": digest.of_files(series)}, indent=2) + "\n")
    finally:
        files.remove(pristine)
    return dest


def install(profile: Profile, python: Path, src: Path, echo: output.Echo = output.status,
            child_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Editable install of `src` for the interpreter `python`; returns the import check.
    `child_env`: what uv is told besides (a bundle's offline settings)."""
    if not python.exists():
        raise UserError(f"no environment at {python}", fix="run `invoke env` first",
                        kind="megatron.no-env")
    bindir = python.parent
    run_env = {**uv.env(**(child_env or {})),
               "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    echo(f"megatron: installing {src.name} editable for {python} (no dependency resolution)")
    r = proc.run([uv.exe(), "pip", "install", "--python", python, "--no-deps",
                  "--no-build-isolation", "-e", src], env=run_env, timeout=3600,
                 log=src.parent / f"{src.name}.install.log")
    uv.raise_for_cache(r)
    if not r.ok:
        raise UserError(f"installing Megatron for {python} failed: {r.tail(8)}",
                        fix="the dataset helpers need a C++ compiler, Python headers and "
                            f"pybind11 in the environment; log: {src.parent}/{src.name}"
                            ".install.log", kind="megatron.install-failed")
    return check_import(python)


def check_import(python: Path, also: tuple[str, ...] = ()) -> dict[str, Any]:
    """torch, megatron.core and its compiled dataset helpers import; returns the probe's facts,
    whose "imported" also says which of the modules `also` imported (in the same interpreter
    run: importing torch once costs seconds)."""
    missing, facts = probe.missing_modules(python, (*MODULES, *also))
    missing = [m for m in missing if m in MODULES]
    if missing or "torch" not in facts:
        raise UserError(f"{', '.join(missing) or 'torch'} does not import for {python}: "
                        + "; ".join(facts["errors"])[-600:], fix="re-run `invoke megatron`",
                        kind="megatron.import-failed")
    return facts


def not_installed(python: Path, profile: Profile) -> str | None:
    """Quick (no import): why the environment no longer has this profile's Megatron checkout
    installed (None: it has). An environment built anew has lost it; so has a removed checkout,
    a removed file of the editable install (its .pth) or an install from another checkout."""
    if not python.exists():
        return f"no environment at {python}"
    src = source_dir(profile)
    if not (src / STAMP).exists():
        return f"the checkout {src} is gone"
    dists = manifest.scan(probe.sites(python), {MEGATRON_DIST})["dists"]
    if not dists:
        return f"{MEGATRON_DIST} is not installed for {python}"
    d = next(iter(dists.values()))
    if d["absent"]:
        return f"{MEGATRON_DIST} is missing {', '.join(d['absent'][:3])}"
    info = next((Path(f[0]).parent for f in d["files"] if f[0].endswith(".dist-info/RECORD")),
                None)
    url = _direct_url(info) if info else None
    if url is not None and url != src.as_uri():
        return f"{MEGATRON_DIST} is installed from {url}, not from {src}"
    return None


def _direct_url(info: Path) -> str | None:
    """Where an installed distribution came from (PEP 610 direct_url.json), if it says."""
    doc, _why = files.read_json(info / "direct_url.json")
    url = doc.get("url") if isinstance(doc, dict) else None
    return url if isinstance(url, str) else None
