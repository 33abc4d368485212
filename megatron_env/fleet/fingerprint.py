"""A node's environment fingerprint: what must be the same on every node of one training job.

Profile, lock digest, the interpreter's torch / CUDA / NCCL / cuDNN, the kernel cache keys that
interpreter would look up (one per kernel recipe), and the Megatron commit with its patch
digest. Two nodes with different fingerprints run different code; the fleet analysis names the
odd one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from megatron_env import digest
from megatron_env.errors import UserError
from megatron_env.kernels import build
from megatron_env.megatron import checkout
from megatron_env.profile import Profile
from megatron_env.pyenv import env, probe


def interpreter(profile: Profile, python: str | None) -> Path:
    """The interpreter a job would run: --python, else the profile's environment's (built or
    adopted: env.interpreter)."""
    return env.interpreter(env.default_prefix(profile), python)


def collect(profile: Profile, python: Path) -> dict[str, Any]:
    """The fingerprint of `python` for `profile`; what cannot be known says why under errors."""
    lockfile = profile.lock_file
    doc: dict[str, Any] = {
        "profile": profile.name,
        "lock_digest": digest.of_file(lockfile) if lockfile.is_file() else None,
        "python": str(python),
        "megatron_commit": profile.megatron["commit"],
        "megatron_patch_digest": digest.of_files(checkout.patch_series(profile)),
        "megatron_installed": checkout.source_dir(profile).is_dir(),
        "kernel_cache_keys": {},
        "errors": [],
    }
    if not python.exists():
        doc["errors"].append(f"no interpreter at {python}")
        return doc
    try:
        facts = probe.probe(python)
    except UserError as e:
        doc["errors"].append(e.message)
        return doc
    doc.update({k: facts.get(k) for k in ("torch", "torch_cuda", "nccl", "cudnn")})
    doc["errors"] += facts.get("errors", [])
    if "torch" not in facts:
        return doc
    # what probe.torch_facts would report, from the one probe (importing torch takes seconds)
    torch = {"torch": facts["torch"], "cuda": facts.get("torch_cuda"),
             "abi": facts.get("cxx11_abi"), "tag": facts.get("cache_tag"),
             "platlib": facts.get("platlib")}
    for pkg in build.packages(profile).values():
        try:
            doc["kernel_cache_keys"][pkg.name] = build.plan(pkg, python, profile.archs,
                                                            facts=torch).key
        except UserError as e:
            doc["kernel_cache_keys"][pkg.name] = None
            doc["errors"].append(f"{pkg.name} cache key: {e.message}")
    return doc
