"""Running uv: where its executable is, and the environment every call gets.

uv never downloads an interpreter here (UV_PYTHON_DOWNLOADS=never): an environment is made from
a Python that is already on the machine, or not at all.
"""

from __future__ import annotations

import os

from megatron_env import proc
from megatron_env.errors import UserError


def exe() -> str:
    """uv on PATH, else the one the `uv` Python package ships."""
    found = proc.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        raise UserError("uv is not installed", fix="python3 -m pip install uv",
                        kind="tool.no-uv") from None


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "UV_PYTHON_DOWNLOADS": "never", **extra}
