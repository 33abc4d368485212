"""Offline bundles: everything one profile's `invoke setup` needs, in one archive with a
manifest; here its layout and the manifest's reading.

Made where the network (or the MEGATRON_ENV_MIRROR_* / MEGATRON_ENV_SOURCE_* mirrors) is, used
where nothing is reachable. Layout of an archive (and of the directory it unpacks to):

    manifest.json        every file below: sha256, size, role; the profile digest; the Python and
                         platform it serves; the tool version; `base` for a delta bundle
    source/              the tool's own tree with this profile, its locks and patch series
                         (run `invoke ... --bundle` from here)
    tool/                megatron-env and its runtime dependencies as wheels for the profile's
                         Python, with the build backend (pip install --no-index --find-links)
    wheels/              every file the lock pins, each checked against the lock's sha256
                         (absent from an `adopt` bundle, made for a node that has its own torch)
    sources/<name>/      kernel sdists, checked against the profile's sha256
    git/<name>-<commit>.git   bare repositories holding only the pinned commit (and its tag):
                         Megatron-LM, every git-sourced kernel package and each submodule it
                         pins (named <package>-<path>)
    builds/<key>/        kernel wheels from the build cache for this profile (--with-builds)

megatron_env.bundle.make writes it; megatron_env.bundle.offline checks and uses it.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

from megatron_env import digest
from megatron_env.errors import UserError
from megatron_env.kernels import build
from megatron_env.megatron import checkout
from megatron_env.profile import Profile
from megatron_env.sources import patches

FORMAT = 1
MANIFEST = "manifest.json"
MACHINE = "x86_64"  # the locks are made for linux x86_64 (lock.PLATFORM)
def profile_digest(prof: Profile) -> str:
    """The profile, its locks and every patch series it uses: what a bundle was made from."""
    files = [prof.path, prof.lock_file, prof.env_file, prof.conda_lock_file]
    return digest.of({
        "files": {f.name: digest.of_file(f) for f in files},
        "megatron": digest.of_files(checkout.patch_series(prof)),
        "kernels": {k.name: digest.of_files(patches.series(k.name, k.pin))
                    for k in build.packages(prof).values()}})


def py_tag(version: str) -> str:
    return "cpython-" + version.replace(".", "")




def repo_path(name: str, commit: str) -> str:
    """Where a bundle keeps the bare repository of `name` at `commit` (a submodule's name
    `<package>/<path>` flattened)."""
    return f"git/{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}-{commit[:12]}.git"


def role(arcname: str) -> str:
    top = arcname.split("/")[0]
    if top == "source":
        if arcname.startswith("source/envs/"):
            return "lock" if arcname.endswith((".lock", ".yml")) else "profile"
        return "patch" if arcname.startswith("source/patches/") else "tool-source"
    return {"tool": "tool-wheel", "wheels": "env-wheel", "sources": "kernel-source",
            "git": "git", "builds": "kernel-build", "conda": "conda-package"}.get(top, top)


def read_manifest(path: Path) -> dict:
    """The manifest of an archive or of an unpacked bundle directory."""
    try:
        if path.is_dir():
            text = (path / MANIFEST).read_text()
        else:
            with tarfile.open(path) as tar:
                member = tar.extractfile(MANIFEST)
                if member is None:
                    raise KeyError(MANIFEST)
                text = member.read().decode()
        doc = json.loads(text)
    except (OSError, KeyError, tarfile.TarError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a megatron-env bundle (no readable {MANIFEST}: "
                        f"{type(e).__name__})",
                        fix="pass the .tar `invoke bundle` wrote, or the directory it was "
                            "unpacked into") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "files" not in doc:
        raise UserError(f"{path}: {MANIFEST} is not a format-{FORMAT} bundle manifest",
                        fix="make the bundle with this version of megatron-env")
    return doc


def manifest_digest(doc: dict) -> str:
    return digest.of(doc)
