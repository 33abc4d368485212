"""Job counts from cores and memory: the memory bound holds for every split, and a package that
builds its extensions in parallel gets the width a flat MAX_JOBS could not use."""

import pytest

from megatron_env.kernels import jobs

from .conftest import user_error

GIB = 2**30


def test_one_ninja_gets_all_slots_memory_permitting():
    # the H200 flash-attn build: 125 GiB free, 5 GiB a job (one arch), 16 cores
    j = jobs.derive(5.0, 125 * GIB, "free", 16)
    assert (j.max_jobs, j.extensions) == (16, 1)
    assert j.why == "125 GiB free / 5 GiB a job = 25, 16 cores"
    # the same build in a 24 GiB cgroup: memory, not cores, sets the width
    j = jobs.derive(5.0, 23 * GIB, "free under a 24 GiB cgroup limit", 16)
    assert (j.max_jobs, j.extensions) == (4, 1)


@pytest.mark.parametrize(("avail_gib", "cores", "expected"), [
    (125, 16, (8, 5)),  # the H200 node: amp_C (15 objects) 8 wide, 4 more extensions beside it
    (23, 16, (3, 2)),  # 16 cores in a 24 GiB cgroup: 6 compilers, 18 GiB at most
    (20, 2, (1, 2)),  # a 2-core machine
    (2, 64, (1, 1)),  # almost no memory: one job, whatever the cores
])
def test_parallel_extensions_never_exceed_memory(avail_gib, cores, expected):
    j = jobs.derive(3.0, avail_gib * GIB, "free", cores, "APEX_PARALLEL_BUILD")
    assert (j.max_jobs, j.extensions) == expected
    assert j.max_jobs * j.extensions * 3.0 <= max(avail_gib, 3.0)  # every compiler fits at once
    assert j.why.endswith(f"{j.extensions} extensions at once")


def test_numbers_the_caller_set_are_kept():
    env = {"MAX_JOBS": "4", "APEX_PARALLEL_BUILD": "4"}
    j = jobs.derive(3.0, 125 * GIB, "free", 16, "APEX_PARALLEL_BUILD", env)
    assert (j.max_jobs, j.extensions, j.why) == (4, 4, "MAX_JOBS and APEX_PARALLEL_BUILD set")
    j = jobs.derive(3.0, 125 * GIB, "free", 16, "APEX_PARALLEL_BUILD", {"MAX_JOBS": "4"})
    assert (j.max_jobs, j.extensions) == (4, 10)  # the extensions fill what memory leaves
    assert j.why.startswith("MAX_JOBS set; 125 GiB free")
    j = jobs.derive(5.0, 125 * GIB, "free", 16, "", {"MAX_JOBS": "3"})
    assert (j.max_jobs, j.extensions, j.why) == (3, 1, "MAX_JOBS set")


@pytest.mark.parametrize("value", ["abc", "0", "-2", "4.5"])
def test_a_count_that_does_not_parse_is_refused_with_the_fix(value):
    with user_error("input.value") as e:
        jobs.derive(3.0, 125 * GIB, "free", 16, "", {"MAX_JOBS": value})
    assert f"MAX_JOBS={value}" in e.value.message and "unset it" in e.value.fix
    with user_error("input.value") as e:
        jobs.derive(3.0, 125 * GIB, "free", 16, "APEX_PARALLEL_BUILD",
                    {"APEX_PARALLEL_BUILD": value})
    assert f"APEX_PARALLEL_BUILD={value}" in e.value.message
