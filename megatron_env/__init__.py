"""megatron-env: reproducible, verified Megatron-LM training environments."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def __getattr__(name: str) -> Path:
    """`REPO_ROOT`: the project directory (profiles, patches, scripts), settled on first use by
    megatron_env.project, so that a front door's --project is known before any module reads it."""
    if name == "REPO_ROOT":
        from megatron_env import project

        return project.root()
    raise AttributeError(f"module 'megatron_env' has no attribute {name!r}")
