"""Sizes in bytes, named once: every limit, free-space check and message that says GiB or MiB
computes it from these (1 GiB = 2**30 bytes, as `df -h`, cgroups and nvidia-smi count)."""

from __future__ import annotations

KIB = 2**10
MIB = 2**20
GIB = 2**30
