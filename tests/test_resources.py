"""Free memory for compile jobs as a cgroup (Slurm job, container) sees it, on /proc and
/sys/fs/cgroup trees built from captured files and paths quoted from public threads
(fixtures/cgroups/README.md)."""

from pathlib import Path

from megatron_env.host import resources

CAPTURES = Path(__file__).parent / "fixtures" / "cgroups"
GIB = 2**30
MEMINFO_AVAILABLE = 24031960 * 1024  # MemAvailable in meminfo-24g.txt


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root


def capture(name: str) -> str:
    return (CAPTURES / name).read_text()


def test_no_limit_on_this_build_machine_leaves_meminfo(tmp_path):
    here = "sys/fs/cgroup/memory/jobs/ddad21c71da6d39587b926110c67cb12"
    root = tree(tmp_path, {
        "proc/meminfo": capture("meminfo-24g.txt"),
        "proc/self/cgroup": capture("proc-self-cgroup-v1-hybrid.txt"),
        f"{here}/memory.limit_in_bytes": capture("memory.limit_in_bytes-unlimited.txt"),
        f"{here}/memory.usage_in_bytes": "4894375936\n",
        f"{here}/memory.stat": capture("memory.stat-v1.txt"),
        "sys/fs/cgroup/memory/memory.limit_in_bytes": capture("memory.limit_in_bytes-unlimited.txt"),
    })
    assert resources.mem_available(root) == MEMINFO_AVAILABLE


def test_slurm_v2_limit_on_a_parent_of_the_task_cgroup(tmp_path):
    step = "sys/fs/cgroup/system.slice/slurm-worker-1_slurmstepd.scope/job_4749/step_0"
    root = tree(tmp_path, {
        "proc/meminfo": capture("meminfo-24g.txt"),
        "proc/self/cgroup":
            "0::/system.slice/slurm-worker-1_slurmstepd.scope/job_4749/step_0/user/task_0\n",
        f"{step}/user/task_0/memory.max": "max\n",
        f"{step}/user/task_0/memory.current": "536870912\n",
        f"{step}/user/memory.max": "4194304000\n",
        f"{step}/user/memory.current": "1073741824\n",  # the test's: 1 GiB in use
    })
    assert resources.mem_available(root) == 4194304000 - GIB  # not the host's 22.9 GiB
    assert resources.memory(root)[1] == "free under a 4 GiB cgroup limit"


def test_slurm_v1_job_limit_counts_droppable_page_cache_as_free(tmp_path):
    job = "sys/fs/cgroup/memory/slurm/uid_2687/job_13759490"
    lines = capture("proc-self-cgroup-v1-hybrid.txt").replace(
        "memory:/jobs/ddad21c71da6d39587b926110c67cb12",
        "memory:/slurm/uid_2687/job_13759490/step_batch/task_0")
    root = tree(tmp_path, {
        "proc/meminfo": capture("meminfo-24g.txt"),
        "proc/self/cgroup": lines,
        f"{job}/step_batch/task_0/memory.limit_in_bytes":
            capture("memory.limit_in_bytes-unlimited.txt"),
        f"{job}/memory.limit_in_bytes": str(8 * GIB),  # the test's: an 8 GiB job
        f"{job}/memory.usage_in_bytes": str(6 * GIB),
        f"{job}/memory.stat": capture("memory.stat-v1.txt"),  # total_inactive_file 6413271040
    })
    assert resources.mem_available(root) == 8 * GIB - (6 * GIB - 6413271040)


def test_container_path_not_in_its_own_mount_falls_back_to_the_mount_root(tmp_path):
    pod = ("/kubepods-burstable-podb96a7488_3ee1_4bdc_9c98_155cc887b417.slice:cri-containerd:"
           "6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294")
    root = tree(tmp_path, {
        "proc/meminfo": capture("meminfo-24g.txt"),
        "proc/self/cgroup": f"13:cpuset:{pod}\n4:memory:{pod}\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": str(16 * GIB),  # the test's: a 16 GiB pod
        "sys/fs/cgroup/memory/memory.usage_in_bytes": str(3 * GIB),
    })
    assert resources.mem_available(root) == 13 * GIB


def test_unreadable_cgroup_files_are_ignored_and_no_meminfo_means_a_small_machine(tmp_path):
    root = tree(tmp_path, {
        "proc/meminfo": capture("meminfo-24g.txt"),
        "proc/self/cgroup": "0::/\n",
        "sys/fs/cgroup/memory.max": capture("meminfo-24g.txt"),  # garbage where a number goes
        "sys/fs/cgroup/memory.current": "1\n",
    })
    assert resources.memory(root) == (MEMINFO_AVAILABLE, "free")
    assert resources.mem_available(tmp_path / "nothing") == 8 * GIB


def test_cores_are_the_ones_this_process_may_use():
    """Pinned to one CPU (taskset, Slurm's --cpus-per-task), a process may use one core however
    many the machine has; cpu_count() would say all of them."""
    import subprocess
    import sys

    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from megatron_env.host import resources; print(resources.cores(), os.cpu_count())")
    one, machine = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True,
                                           text=True, check=True).stdout.split())
    assert one == 1 and machine >= 1
