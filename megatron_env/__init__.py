"""megatron-env: reproducible, verified Megatron-LM training environments."""

from pathlib import Path

__version__ = "0.1.0"

#: The checkout this package runs from: profiles, patches and scripts live beside it.
REPO_ROOT = Path(__file__).resolve().parent.parent
