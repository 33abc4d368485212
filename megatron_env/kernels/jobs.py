"""How many compile jobs a kernel build runs at once, from this machine's cores and memory.

Two numbers. MAX_JOBS is the ninja -j of one extension: torch's cpp_extension runs one ninja
per extension. A package whose setup.py can build several extensions at once (its recipe names
the variable that says how many) runs N of those ninjas at once, so up to N x MAX_JOBS
compilers. A package of a dozen extensions of 1 to 3 objects and one of 15, built one after
another at MAX_JOBS=16, kept at most 12 compilers busy and took 608 s on a 16-core H200 node,
against 208 s at 4 extensions x 4 jobs (bench/results/2026-12-02-h200-1gpu).

The bound that must hold is memory: N x MAX_JOBS x (GiB a job) fits in what is free (or in the
cgroup's limit), so no split can be OOM-killed where MAX_JOBS alone would not be. Cores only
bound the useful width: the large extension gets half the slots, and as many extensions run
beside it as memory allows, up to the number of cores; the small ones rarely use their
MAX_JOBS, so the compilers actually running stay near the core count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from megatron_env.errors import UserError
from megatron_env.units import GIB


@dataclass(frozen=True)
class Jobs:
    max_jobs: int  # compile jobs within one extension (ninja -j)
    extensions: int  # extensions built at once (1: one after another)
    why: str


def derive(gib_per_job: float, avail: int, source: str, cores: int, parallel_var: str = "",
           environ: Mapping[str, str] | None = None) -> Jobs:
    """The job counts for a build needing `gib_per_job` GiB per compile job, with `avail` bytes
    free (`source` says where that figure comes from) and `cores` CPUs. Numbers the caller set
    (MAX_JOBS, the parallel variable) are kept as given."""
    environ = environ or {}
    by_mem = max(1, int(avail / GIB / gib_per_job))
    slots = max(1, min(cores, by_mem))
    basis = f"{avail / GIB:.0f} GiB {source} / {gib_per_job:g} GiB a job = {by_mem}, {cores} cores"
    given_jobs = _int("MAX_JOBS", environ)
    given_ext = _int(parallel_var, environ)
    if not parallel_var:
        if given_jobs:
            return Jobs(given_jobs, 1, "MAX_JOBS set")
        return Jobs(slots, 1, basis)
    jobs = given_jobs or max(1, slots // 2)
    extensions = given_ext or max(1, min(cores, by_mem // jobs))
    if given_jobs and given_ext:
        return Jobs(jobs, extensions, f"MAX_JOBS and {parallel_var} set")
    said = (["MAX_JOBS set"] if given_jobs else []) + ([f"{parallel_var} set"] if given_ext
                                                       else [])
    return Jobs(jobs, extensions,
                "; ".join(said + [basis, f"{extensions} extensions at once"]))


def _int(name: str, environ: Mapping[str, str]) -> int | None:
    """A positive count the caller set in the environment, or None when unset or empty."""
    value = environ.get(name, "").strip() if name else ""
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"{name}={value} is not a positive whole number",
                        fix=f"set {name} to a number of jobs such as 8, or unset it to have "
                            "it derived from cores and memory", kind="input.value")
    return int(value)
