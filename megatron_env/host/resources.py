"""How much of this machine a build may use: memory and cores as this process sees them.

/proc/meminfo and os.cpu_count() describe the whole host. Inside a container or a Slurm job the
cgroup's memory limit and the CPU affinity are what count: compile jobs sized by the host's
memory get OOM-killed there, and jobs sized by the host's cores share a few.
"""

from __future__ import annotations

import os
from pathlib import Path

from megatron_env.units import GIB

UNLIMITED = 2**60  # cgroup v1 writes "no limit" as 9223372036854771712


def cores() -> int:
    """The CPUs this process may run on (Slurm's --cpus-per-task, taskset, a container)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def mem_available(root: Path = Path("/")) -> int:
    """Bytes a build may still take (see memory())."""
    return memory(root)[0]


def memory(root: Path = Path("/")) -> tuple[int, str]:
    """Bytes a build may still take, and where that figure comes from: MemAvailable, or less
    where a cgroup limits this process.

    Every memory cgroup from this process's own up to the hierarchy's root counts (Slurm puts
    the limit on the job, the process in a step below it). Page cache that the kernel can drop
    (inactive_file) is counted as free, as MemAvailable does. `root` is for tests."""
    avail, source = _meminfo_available(root), "free"
    for limit, used in _cgroup_limits(root):
        if limit - used < avail:
            avail = max(0, limit - used)
            source = f"free under a {limit / GIB:.0f} GiB cgroup limit"
    return avail, source


def _meminfo_available(root: Path) -> int:
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 8 * GIB  # unreadable: assume a small machine


def _cgroup_limits(root: Path) -> list[tuple[int, int]]:
    """(limit, used) for each limited memory cgroup this process is in, v2 or v1."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: 0::/path
            base, files = root / "sys/fs/cgroup", ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base, files = (root / "sys/fs/cgroup/memory",
                           ("memory.limit_in_bytes", "memory.usage_in_bytes",
                            "total_inactive_file"))
        else:
            continue
        here = base / path.lstrip("/")
        if not here.is_dir():  # a namespaced path that this mount does not show: its root
            here = base
        while True:
            if (pair := _limit(here, *files)) is not None:
                found.append(pair)
            if here == base or base not in here.parents:
                break
            here = here.parent
    return found


def _limit(d: Path, limit_file: str, usage_file: str, inactive_key: str) -> tuple[int, int] | None:
    try:
        raw = (d / limit_file).read_text().strip()
        if raw == "max" or int(raw) >= UNLIMITED:
            return None
        used = int((d / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    inactive = 0
    try:
        for line in (d / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    except (OSError, ValueError):
        pass
    return int(raw), max(0, used - inactive)
