"""Does an interpreter hold what its profile and lock say? Every difference named, with a kind.

The environment's own build (megatron_env.pyenv.env) and an adopted container's interpreter are
judged the same way: the lock's packages (missing, other versions, extras) and the stack itself
(Python, torch, its CUDA, NCCL)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_env import recipes
from megatron_env.profile import Profile
from megatron_env.pyenv import lock
from megatron_env.pyenv.probe import probe

TOOLING = {"pip", "setuptools", "wheel", "uv"}
# What megatron-env itself installs on top of the lock (`invoke megatron`, `invoke build`).
MEGATRON = "megatron-core"
ON_TOP = {MEGATRON, *recipes.declared()}


@dataclass(frozen=True)
class Mismatch:
    """One way an environment differs from its profile and lock. Callers decide by `kind`
    (missing, version, extra: the lock's packages; python, torch, torch-cuda, torch-import,
    nccl: the stack itself), never by the wording of `text`."""

    kind: str
    text: str

    def __str__(self) -> str:
        return self.text


STACK = {"python", "torch", "torch-cuda", "torch-import"}  # what an adopted env must match


@dataclass
class Verification:
    facts: dict[str, Any]
    differences: list[Mismatch] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def text(self, kinds: set[str] | None = None) -> str:
        return "; ".join(d.text for d in self.differences if kinds is None or d.kind in kinds)


def names(items: list[str], most: int = 12) -> str:
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def verify(python: Path | str, profile: Profile, lockfile: Path,
           quick: bool = False) -> Verification:
    """Compare what `python` has with the lock and the profile; every difference named.

    quick: distributions only (no torch import), for an environment whose stamp already says it
    was verified in full; it catches anything installed, removed or changed since.
    """
    facts = probe(python, torch=not quick)
    pins = lock.parse_lock(lock.read(lockfile))
    have = facts["dists"]
    v = Verification(facts)

    def differ(kind: str, text: str) -> None:
        v.differences.append(Mismatch(kind, text))

    v.missing = sorted(n for n in pins if n not in have)
    if v.missing:
        differ("missing", f"missing from the environment: {names(v.missing)}")
    wrong = [f"{n} {have[n]} (lock {pins[n]})" for n in sorted(pins)
             if n in have and have[n] != pins[n]]
    if wrong:
        differ("version", f"{len(wrong)} other versions than the lock: {names(wrong)}")
    extra = sorted(n for n in have if n not in pins and n not in TOOLING | ON_TOP)
    if extra:
        differ("extra", f"{len(extra)} not in the lock: {names(extra)}")
    if not facts["python"].startswith(profile.python + "."):
        differ("python", f"Python {facts['python']}, profile wants {profile.python}")
    torch = facts.get("torch")
    if quick:
        return v
    if torch is None:
        differ("torch-import", "torch does not import: " + "; ".join(facts["errors"]))
        return v
    if torch.split("+")[0] != profile.torch:
        differ("torch", f"torch {torch}, profile wants {profile.torch}")
    if facts.get("torch_cuda") != profile.cuda:
        differ("torch-cuda", f"torch.version.cuda is {facts.get('torch_cuda')}, profile wants "
                             f"{profile.cuda}")
    nccl_pin = next((ver for n, ver in pins.items() if n.startswith("nvidia-nccl-")), None)
    if nccl_pin and facts.get("nccl") and facts["nccl"] != nccl_pin:
        differ("nccl", f"torch.cuda.nccl.version() is {facts['nccl']}, lock has {nccl_pin}")
    return v


# --- building --------------------------------------------------------------------------------
