"""Which attention kernel this node should train with: measured by scripts/gpu_health.py
(`attention`: TFLOP/s of every backend present, forward + backward, causal bf16 and its
`gpu.attention` finding), read back here for `invoke check` and preflight.

It matters: on an H200 (torch 2.11, head dim 128) SDPA's cuDNN backend ran at 471-529 TFLOP/s
and the attention kernel package the profile compiled for minutes at 283-306: 1.7x slower than
one torch already ships. A profile can then leave that package out (`build = false`). Which
packages are attention kernels the recipes say (those that choose head dims).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from megatron_env import recipes
from megatron_env.findings import Finding
from megatron_env.profile import Profile

DEFAULT_HEAD_DIM = 128  # Megatron's GPT configs: hidden / heads = 128


def _attention_kernels(prof: Profile) -> dict[str, dict[str, Any]]:
    """The profile's kernel tables whose recipe chooses head dims: its attention kernels."""
    return {name: table for name, table in prof.kernels.items()
            if any(c.name == "hdims" for c in recipes.get(name).choices)}


def head_dims(prof: Profile) -> list[int]:
    """The head dims to time: those an attention kernel's `hdims` picks, else 128."""
    dims = sorted({int(d) for t in _attention_kernels(prof).values()
                   for d in t.get("hdims", ["all"]) if d != "all"})
    return dims or [DEFAULT_HEAD_DIM]


def builds_attention_kernel(prof: Profile) -> bool:
    return any(t.get("build", True) for t in _attention_kernels(prof).values())


def finding(health: dict[str, Any], prof: Profile | None = None) -> Finding | None:
    """gpu.attention as gpu_health judged it (the fastest backend, the others beside it, and,
    when the compiled kernel is slower, the profile line that stops building it); the fix is
    dropped where the profile builds no attention kernel already. None when the result timed
    no attention."""
    own = next((f for f in health.get("findings") or [] if f.get("id") == "gpu.attention"),
               None)
    if own is None:
        return None
    fix = own.get("fix", "") if prof is None or builds_attention_kernel(prof) else ""
    return Finding("gpu.attention", own.get("status", "pass"), own.get("summary", ""),
                   list(own.get("evidence") or []), fix)


def from_file(path: Path, prof: Profile | None = None) -> Finding | None:
    """finding() of a gpu_health JSON file, None when it is absent or unreadable."""
    try:
        return finding(json.loads(path.read_text()), prof)
    except (OSError, ValueError, RecursionError, AttributeError, TypeError):
        return None
