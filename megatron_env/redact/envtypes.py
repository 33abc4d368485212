"""Environment values by type: a variable the tool prints shows its value only when the value
parses as what the variable can hold.

Names alone decided before: an `NCCL_`-named copy of a credential was printed whole, because
NCCL_ variables are harmless. But a variable's value has a grammar, written down by the library
that reads it, and a secret does not parse as `NCCL_DEBUG`'s level or `MASTER_PORT`'s port. So
each variable the tool prints (`TABLE`) is given the grammar of its value, taken from the
library's own documentation:
- NCCL: the NCCL User Guide, "Environment Variables" (docs.nvidia.com/deeplearning/nccl/
  user-guide/docs/env.html): NCCL_SOCKET_IFNAME's prefix list with `^` and `=`, NCCL_IB_HCA's
  `device:port` list, NCCL_DEBUG's levels, NCCL_DEBUG_SUBSYS's subsystems, NCCL_P2P_LEVEL's
  numbers or LOC/NVL/PIX/PXB/PHB/SYS, NCCL_ALGO/NCCL_PROTO's names, sizes in bytes, 0/1 switches;
- CUDA: the CUDA Programming Guide, "CUDA Environment Variables" (docs.nvidia.com/cuda/
  cuda-programming-guide/05-appendices/environment-variables.html): CUDA_VISIBLE_DEVICES's
  indices, `GPU-<uuid>` (or a prefix of one), `MIG-<uuid>/<gi>/<ci>`; CUDA_MODULE_LOADING's
  LAZY/EAGER; CUDA_DEVICE_ORDER's FASTEST_FIRST/PCI_BUS_ID; the MPS directories (docs.nvidia.com/
  deploy/mps, "Appendix: Environment Variables");
- PyTorch: "PYTORCH ProcessGroupNCCL Environment Variables" (pytorch.org/docs/stable/
  torch_nccl_environment_variables.html: 0-3 and 0/1 switches, sizes, a temp file's path),
  torchrun's "Environment Variables" (pytorch.org/docs/stable/elastic/run.html: MASTER_ADDR,
  MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, ROLE_* ...), the CUDA caching
  allocator's PYTORCH_CUDA_ALLOC_CONF `key:value,...` (pytorch.org/docs/stable/notes/cuda.html);
- Slurm: sbatch(1) and srun(1), "OUTPUT ENVIRONMENT VARIABLES" (slurm.schedmd.com/sbatch.html):
  ids and counts, host lists (`node[01-04,07]`), `4(x2)` task counts, names, the submit dir;
- Open MPI / PMIx / UCX: Open MPI's mpirun(1) "Exported Environment Variables"
  (OMPI_COMM_WORLD_*), PMIx's PMIX_RANK, UCX's `ucx_info -f` (UCX_TLS's transports,
  UCX_NET_DEVICES's `mlx5_0:1` list, y/n switches, sizes with `k`/`m`/`g` or `inf`/`auto`);
- the shell's own (PATH, HOME, PWD: paths) and this tool's (MEGATRON_ENV_*: paths, URLs,
  numbers).

`shown(name, value)` is the value as printed: itself where it parses, else its shape (`<redacted:
24 chars>`). A name the table does not hold under a prefix it governs (an unknown NCCL_* name)
is unknown: its value shows only when it is plainly harmless whatever its name (empty, a
boolean, an integer of at most 6 digits). Pure.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from urllib.parse import urlsplit

from megatron_env.redact.shape import REDACTED, random_segment

Grammar = Callable[[str], bool]

# the prefixes whose variables the table governs: a name under one of them is typed or unknown
PREFIXES = ("NCCL_", "CUDA_", "CUDA", "TORCH_", "PYTORCH_", "NVIDIA_", "SLURM_", "SLURMD_",
            "OMPI_", "PMIX_", "UCX_", "MEGATRON_ENV_", "TORCHELASTIC_", "NVCC_", "GLOO_", "FI_")


def shape(value: str) -> str:
    """What a value that shows nothing of itself says: its length."""
    return f"<redacted: {len(value)} chars>"


# ----------------------------------------------------------------------------- grammars

_INT = re.compile(r"-?\d+")
_SIZE = re.compile(r"\d+(?:\.\d+)?[ \t]*(?:[KMGTPkmgtp](?:i?[Bb])?|[Bb])?")
_BOOL = frozenset({"0", "1", "true", "false", "yes", "no", "on", "off", "y", "n", "t", "f"})
_VERSION = re.compile(r"v?\d+(?:\.\d+){0,3}(?:[.+-]?[A-Za-z0-9]{1,12}){0,3}")
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
_IPV6 = re.compile(r"\[?[0-9A-Fa-f:]{2,39}(?:%[\w.]+)?\]?")
_PATH_PART = re.compile(r"[\w.@~+%-]+")
_UUID = r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
_GPU = re.compile(rf"\d+|GPU-[0-9a-fA-F-]{{4,36}}|MIG-(?:GPU-)?{_UUID}(?:/\d+/\d+)?|MIG-{_UUID}")
# an interface's name as the kernel and NCCL's docs write them (`eth0`, `enp220s0np0`, `ib0`,
# `bond0.100`, `docker0`, `lo`): letters, then digits and short letter runs; at most 15 chars
_IFACE = re.compile(r"[a-z]{1,8}(?:\d+(?:[a-z]{1,3}\d+)*)?(?:\.\d+)?")
_HCA = re.compile(r"[a-z]+(?:_[a-z]+)*\d*(?:_\d+)?(?::\d+)?")
_NODE = re.compile(r"[A-Za-z][\w-]*(?:\[[\d,-]+\][\w-]*)*")
_TASKS = re.compile(r"\d+(?:\(x\d+\))?(?:,\d+(?:\(x\d+\))?)*")
_TRES = re.compile(r"[\w/]+[:=]\d+(?:,[\w/]+[:=]\d+)*")
_ARCH = re.compile(r"\d+\.\d+[a-z]?(?:\+PTX)?")


def _words(value: str) -> bool:
    """A name a person or a tool wrote as words (`train-gpt`, `gpu_a100`, `debug`): identifier
    characters, no segment that reads as generated."""
    return re.fullmatch(r"[\w.+-]{1,64}", value) is not None and not any(
        random_segment(p) for p in re.split(r"[/:@=]", value))


def integer(v: str) -> bool:
    return _INT.fullmatch(v) is not None and len(v) <= 20


def size(v: str) -> bool:
    return _SIZE.fullmatch(v) is not None or v.lower() in ("inf", "auto", "-1")


def boolean(v: str) -> bool:
    return v.lower() in _BOOL


def version(v: str) -> bool:
    return _VERSION.fullmatch(v) is not None and _words(v)


def enum(*values: str, items: bool = False, invert: bool = False) -> Grammar:
    """One of `values` (case as NCCL/CUDA/Slurm take them: any); with `items`, a comma list of
    them, with `invert` led by `^` (NCCL's "all but")."""
    allowed = frozenset(x.lower() for x in values)

    def grammar(v: str) -> bool:
        body = v[1:] if invert and v.startswith("^") else v
        parts = re.split(r"[,;]", body) if items else [body]
        return all(p.strip().lower() in allowed for p in parts) and bool(body)
    return grammar


def host(v: str) -> bool:
    """A host name, an IPv4 or IPv6 address: labels that read as words (`node03`,
    `gpu-a100-017`, `ip-10-0-0-1.ec2.internal`)."""
    if _IPV4.fullmatch(v) or ":" in v and _IPV6.fullmatch(v):
        return True
    labels = v.rstrip(".").split(".")
    # a host name is written in one case (`node03`, `DGX-A100-01`): a label of both is no host's
    return len(v) <= 253 and all(_HOST_LABEL.fullmatch(x) and (x.lower() == x or x.upper() == x)
                                 for x in labels) and not any(random_segment(x) for x in labels)


def host_port(v: str) -> bool:
    h, sep, port = v.rpartition(":")
    return bool(sep) and host(h) and port.isdigit() and int(port) < 65536


def port(v: str) -> bool:
    return v.isdigit() and int(v) < 65536


def path(v: str) -> bool:
    """A file's path: parts of path characters, none that reads as generated (a temporary
    folder's `tmpa8x_3kz9` and a hex digest are harmless forms of the shape pass)."""
    if not v or len(v) > 4096 or any(c.isspace() for c in v):
        return False
    parts = [p for p in v.split("/") if p not in ("", ".", "..", "~")]
    return all(_PATH_PART.fullmatch(p) for p in parts) and not any(map(random_segment, parts))


def paths(v: str) -> bool:
    return all(path(p) for p in v.split(":") if p)


def url(v: str) -> bool:
    """A URL without a password or a query (a mirror's `https://host/simple`), or a path."""
    if "://" not in v:
        return path(v)
    try:
        u = urlsplit(v)
        netloc_host, netloc_port = u.hostname, u.port
    except ValueError:
        return False
    return (u.password is None and u.username is None and not u.query and not u.fragment
            and netloc_host is not None and host(netloc_host) and (
                netloc_port is None or 0 <= netloc_port < 65536) and path(u.path or "/"))


def gpus(v: str) -> bool:
    """CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES: indices, GPU or MIG UUIDs (or their
    prefixes), `all`, `none`, `void`, `NoDevFiles`."""
    if v.lower() in ("all", "none", "void", "nodevfiles", ""):
        return True
    return all(_GPU.fullmatch(p.strip()) for p in v.split(","))


def interfaces(v: str) -> bool:
    """NCCL_SOCKET_IFNAME: prefixes, `,`-separated, led by `^` (exclude) and/or `=` (exact)."""
    body = v[1:] if v.startswith("^") else v
    body = body[1:] if body.startswith("=") else body
    return bool(body) and all(_IFACE.fullmatch(p) and len(p) <= 15 for p in body.split(","))


def hcas(v: str) -> bool:
    """NCCL_IB_HCA / UCX_NET_DEVICES: `mlx5_0:1,mlx5_1` with `^`/`=`, or `all`."""
    body = v.lstrip("^=")
    return body == "all" or bool(body) and all(_HCA.fullmatch(p) for p in body.split(","))


def nodes(v: str) -> bool:
    """A Slurm host list: `node[01-04,07],gpu-a[1-2]`."""
    return all(_NODE.fullmatch(p) and not random_segment(re.sub(r"\[[^\]]*\]", "", p))
               for p in re.split(r",(?![^\[]*\])", v) if p) and bool(v)


def tasks(v: str) -> bool:
    return _TASKS.fullmatch(v) is not None


def tres(v: str) -> bool:
    return _TRES.fullmatch(v) is not None


def name(v: str) -> bool:
    return _words(v)


def names(v: str) -> bool:
    """A comma list of names, optionally led by `^` (Open MPI's exclusion)."""
    return all(_words(p) for p in v.lstrip("^").split(",") if p) and bool(v.lstrip("^"))


def arch_list(v: str) -> bool:
    """TORCH_CUDA_ARCH_LIST: `8.0;9.0+PTX`, `8.0 9.0a`, or named `Hopper`."""
    return all(_ARCH.fullmatch(p) or p in ("Kepler", "Maxwell", "Pascal", "Volta", "Turing",
                                           "Ampere", "Ada", "Hopper", "Blackwell")
               for p in re.split(r"[;, ]+", v.strip()) if p)


# PYTORCH_CUDA_ALLOC_CONF's documented keys and the forms of their values
_ALLOC_KEYS = frozenset({"max_split_size_mb", "roundup_power2_divisions",
                         "garbage_collection_threshold", "expandable_segments", "backend",
                         "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                         "pinned_num_register_threads", "pinned_use_background_threads",
                         "max_non_split_rounding_mb", "per_process_memory_fraction"})


def alloc_conf(v: str) -> bool:
    for item in re.split(r",(?![^\[]*\])", v):
        key, sep, val = item.partition(":")
        if not sep or key.strip() not in _ALLOC_KEYS:
            return False
        val = val.strip()
        if not (boolean(val) or re.fullmatch(r"\d+(?:\.\d+)?", val) or val in (
                "native", "cudaMallocAsync") or re.fullmatch(r"\[[\d:,>\s]+\]", val)):
            return False
    return bool(v)


def subsystems(v: str) -> bool:
    return enum("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL",
                "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL",
                items=True, invert=True)(v)


def nccl_algos(v: str) -> bool:
    """NCCL_ALGO / NCCL_PROTO: names, `^` for all but, and since 2.24 per collective
    (`allreduce:tree,ring;broadcast:^ring`)."""
    known = {"ring", "tree", "collnet", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat",
             "ll", "ll128", "simple", "allreduce", "allgather", "reducescatter", "broadcast",
             "reduce", "sendrecv"}
    return bool(v) and all(w.lower() in known for w in re.split(r"[,;:^]+", v) if w)


def level(v: str) -> bool:
    return integer(v) or v.upper() in ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")


def requires(v: str) -> bool:
    """NVIDIA_REQUIRE_CUDA: `cuda>=12.4 brand=tesla,driver>=470,driver<471 ...`."""
    return all(re.fullmatch(r"[a-z]+(?:>=|<=|=|<|>)[\w.]+", c)
               for part in v.split() for c in part.split(",")) and bool(v.strip())


def flags(v: str) -> bool:
    """NVCC_APPEND_FLAGS and the like: options (`-allow-unsupported-compiler`,
    `--threads=4`, `-gencode=arch=compute_90,code=sm_90`), each part words or numbers."""
    return all(re.fullmatch(r"-{0,2}[\w.=+,/-]+", t) and all(
        _words(p) for p in re.split(r"[=,]", t.lstrip("-")) if p) for t in v.split())


def words(v: str) -> bool:
    """A short phrase of words (NVIDIA_PRODUCT_NAME `NVIDIA PyTorch`)."""
    return all(_words(w) for w in v.split()) and len(v) <= 128


# ----------------------------------------------------------------------------- the table

B, N, S, P = boolean, integer, size, path  # the grammars most names take
TABLE: dict[str, Grammar] = {
    # NCCL User Guide, Environment Variables
    "NCCL_DEBUG": enum("VERSION", "WARN", "INFO", "TRACE", "ABORT", "NONE"),
    "NCCL_DEBUG_SUBSYS": subsystems, "NCCL_DEBUG_FILE": P, "NCCL_CONF_FILE": P,
    "NCCL_SOCKET_IFNAME": interfaces, "NCCL_IB_HCA": hcas, "NCCL_NET": words,
    "NCCL_NET_PLUGIN": name, "NCCL_TUNER_PLUGIN": name, "NCCL_PROFILER_PLUGIN": name,
    "NCCL_SOCKET_FAMILY": enum("AF_INET", "AF_INET6"), "NCCL_IB_ADDR_FAMILY":
    enum("AF_INET", "AF_INET6"), "NCCL_COMM_ID": host_port,
    "NCCL_P2P_LEVEL": level, "NCCL_NET_GDR_LEVEL": level, "NCCL_IB_GDR_LEVEL": level,
    "NCCL_SHM_LEVEL": level, "NCCL_ALGO": nccl_algos, "NCCL_PROTO": nccl_algos,
    "NCCL_LAUNCH_MODE": enum("PARALLEL", "GROUP"), "NCCL_TOPO_FILE": P,
    "NCCL_TOPO_DUMP_FILE": P, "NCCL_GRAPH_FILE": P, "NCCL_GRAPH_DUMP_FILE": P,
    "NCCL_HOME": P, "NCCL_VERSION": version, "NCCL_IB_ROCE_VERSION_NUM": N,
    **{f"NCCL_{n}": B for n in (
        "P2P_DISABLE", "SHM_DISABLE", "IB_DISABLE", "PXN_DISABLE", "NVB_DISABLE",
        "CUMEM_ENABLE", "CUMEM_HOST_ENABLE", "COLLNET_ENABLE", "NET_GDR_READ",
        "IGNORE_CPU_AFFINITY", "GRAPH_REGISTER", "SET_STACK_SIZE", "SET_THREAD_NAME",
        "DMABUF_ENABLE", "CHECK_POINTERS", "CHECKS_DISABLE", "IB_ADAPTIVE_ROUTING",
        "IB_MERGE_NICS", "IB_PCI_RELAXED_ORDERING", "RAS_ENABLE", "P2P_USE_CUDA_MEMCPY",
        "NET_SHARED_BUFFERS", "NET_SHARED_COMMS", "GRAPH_MIXING_SUPPORT", "LOCAL_REGISTER",
        "P2P_DIRECT_DISABLE", "RUNTIME_CONNECT", "BLOCKING_WAIT", "DESYNC_DEBUG",
        "IB_SPLIT_DATA_ON_QPS", "COMM_BLOCKING", "PAT_ENABLE")},
    **{f"NCCL_{n}": N for n in (
        "IB_TIMEOUT", "IB_RETRY_CNT", "IB_GID_INDEX", "IB_SL", "IB_TC", "IB_QPS_PER_CONNECTION",
        "NTHREADS", "MIN_NCHANNELS", "MAX_NCHANNELS", "MIN_CTAS", "MAX_CTAS", "NCHANNELS",
        "SOCKET_NTHREADS", "NSOCKS_PERTHREAD", "P2P_PXN_LEVEL", "NCHANNELS_PER_NET_PEER",
        "NVLS_NCHANNELS", "COLLNET_NODE_THRESHOLD", "WORK_FIFO_DEPTH", "IB_FIFO_TC",
        "NET_GDR_C2C", "PROGRESS_APPENDOP_FREQ", "CREATE_THREAD_CONTEXT", "MAX_P2P_NCHANNELS",
        "MIN_P2P_NCHANNELS", "IB_AR_THRESHOLD", "SOCKET_RETRY_CNT", "SOCKET_RETRY_SLEEP_MSEC",
        "ASYNC_ERROR_HANDLING", "CROSS_NIC", "MNNVL_ENABLE", "NVLS_ENABLE")},
    **{f"NCCL_{n}": S for n in (
        "BUFFSIZE", "P2P_NET_CHUNKSIZE", "P2P_NVL_CHUNKSIZE", "P2P_PCI_CHUNKSIZE",
        "P2P_LL_THRESHOLD", "LL_THRESHOLD", "LL128_THRESHOLD", "TREE_THRESHOLD",
        "SINGLE_RING_THRESHOLD", "CHUNK_SIZE", "NVLSTREE_MAX_CHUNKSIZE", "NVLS_CHUNKSIZE")},
    # CUDA Programming Guide, CUDA Environment Variables; the MPS appendix
    "CUDA_VISIBLE_DEVICES": gpus, "CUDA_LAUNCH_BLOCKING": B, "CUDA_DEVICE_MAX_CONNECTIONS": N,
    "CUDA_DEVICE_MAX_COPY_CONNECTIONS": N, "CUDA_MODULE_LOADING": enum("LAZY", "EAGER"),
    "CUDA_MODULE_DATA_LOADING": enum("LAZY", "EAGER"),
    "CUDA_DEVICE_ORDER": enum("FASTEST_FIRST", "PCI_BUS_ID"), "CUDA_CACHE_DISABLE": B,
    "CUDA_CACHE_MAXSIZE": N, "CUDA_CACHE_PATH": P, "CUDA_FORCE_PTX_JIT": B,
    "CUDA_DISABLE_PTX_JIT": B, "CUDA_AUTO_BOOST": B, "CUDA_DEVICE_WAITS_ON_EXCEPTION": B,
    "CUDA_COREDUMP_FILE": P, "CUDA_ENABLE_COREDUMP_ON_EXCEPTION": B,
    "CUDA_MPS_PIPE_DIRECTORY": P, "CUDA_MPS_LOG_DIRECTORY": P,
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": N, "CUDA_HOME": P, "CUDA_PATH": P, "CUDA_ROOT": P,
    "CUDA_VERSION": version, "CUDA_DRIVER_VERSION": version, "CUDA_ARCH_LIST": arch_list,
    "CUDA_SCALE_LAUNCH_QUEUES": S, "CUDA_LOG_FILE": P, "CUDA_INJECTION64_PATH": P,
    "CUDA_NVCC_EXECUTABLE": P, "CUDA_MANAGED_FORCE_DEVICE_ALLOC": B,
    "CUDA_COMPAT_PATH": P, "CUDACXX": P, "CUDAHOSTCXX": P, "CUDA_TOOLKIT_ROOT_DIR": P,
    "CUDA_BIN_PATH": P,
    # NVIDIA Container Toolkit; NGC containers' labels
    "NVIDIA_VISIBLE_DEVICES": gpus, "NVIDIA_DRIVER_CAPABILITIES": enum(
        "compute", "compat32", "graphics", "utility", "video", "display", "all", items=True),
    "NVIDIA_REQUIRE_CUDA": requires, "NVIDIA_DISABLE_REQUIRE": B, "NVIDIA_TF32_OVERRIDE": N,
    "NVIDIA_MIG_CONFIG_DEVICES": gpus, "NVIDIA_MIG_MONITOR_DEVICES": gpus,
    "NVIDIA_PRODUCT_NAME": words, "NVIDIA_BUILD_ID": N, "NVIDIA_CUDA_END_OF_LIFE": B,
    "NVIDIA_PYTORCH_VERSION": version, "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS": B,
    # PyTorch: ProcessGroupNCCL's variables, the allocator's, torch.distributed's
    **{f"TORCH_NCCL_{n}": N for n in (
        "ASYNC_ERROR_HANDLING", "HIGH_PRIORITY", "BLOCKING_WAIT", "DUMP_ON_TIMEOUT",
        "DESYNC_DEBUG", "ENABLE_TIMING", "ENABLE_MONITORING", "HEARTBEAT_TIMEOUT_SEC",
        "TRACE_BUFFER_SIZE", "WAIT_TIMEOUT_DUMP_MILSEC", "COORD_CHECK_MILSEC",
        "ABORT_IN_DESTROY_PG", "AVOID_RECORD_STREAMS", "NAN_CHECK", "PROPAGATE_ERROR",
        "USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "CUDA_EVENT_CACHE",
        "LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN",
        "EXTRA_DUMP_ON_EXEC", "RETHROW_CUDA_ERRORS", "ENABLE_NAN_CHECK", "TRACE_CPP_STACK")},
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": P, "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": P,
    "TORCH_DISTRIBUTED_DEBUG": enum("OFF", "INFO", "DETAIL"),
    "TORCH_CPP_LOG_LEVEL": enum("INFO", "WARNING", "ERROR", "FATAL", "0", "1", "2", "3"),
    "TORCH_SHOW_CPP_STACKTRACES": B, "TORCH_CUDA_ARCH_LIST": arch_list,
    "TORCH_EXTENSIONS_DIR": P, "TORCH_HOME": P, "TORCH_COMPILE_DEBUG": B,
    "TORCH_LOGS": lambda v: all(re.fullmatch(r"[+-]?[\w.]+", p) for p in v.split(",") if p),
    "TORCH_USE_CUDA_DSA": B, "TORCH_DISABLE_ADDR2LINE": B, "TORCH_SYMBOLIZE_MODE": words,
    "TORCH_CUDNN_V8_API_ENABLED": B, "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": B,
    "TORCH_NCCL_USE_COMM_NONBLOCKING": B, "TORCH_DIST_INIT_BARRIER": B,
    "TORCH_FR_BUFFER_SIZE": N, "TORCH_FR_DUMP_TEMP_FILE": P,
    "PYTORCH_CUDA_ALLOC_CONF": alloc_conf, "PYTORCH_ALLOC_CONF": alloc_conf,
    "PYTORCH_HIP_ALLOC_CONF": alloc_conf, "PYTORCH_NO_CUDA_MEMORY_CACHING": B,
    "PYTORCH_NVML_BASED_CUDA_CHECK": B, "PYTORCH_JIT": B, "PYTORCH_KERNEL_CACHE_PATH": P,
    "PYTORCH_TEST_WITH_SLOW": B, "PYTORCH_BUILD_VERSION": version, "PYTORCH_VERSION": version,
    # torchrun (torch.distributed.elastic) and the launchers
    "MASTER_ADDR": host, "MASTER_PORT": port, "RANK": N, "LOCAL_RANK": N, "WORLD_SIZE": N,
    "LOCAL_WORLD_SIZE": N, "GROUP_RANK": N, "GROUP_WORLD_SIZE": N, "ROLE_RANK": N,
    "ROLE_WORLD_SIZE": N, "ROLE_NAME": name, "NODE_RANK": N, "OMP_NUM_THREADS": N,
    "TORCHELASTIC_RESTART_COUNT": N, "TORCHELASTIC_MAX_RESTARTS": N,
    "TORCHELASTIC_RUN_ID": name, "TORCHELASTIC_USE_AGENT_STORE": B,
    "TORCHELASTIC_ERROR_FILE": P, "TORCHELASTIC_ENABLE_FILE_TIMER": B,
    # sbatch(1)/srun(1), OUTPUT ENVIRONMENT VARIABLES
    **{f"SLURM_{n}": N for n in (
        "JOB_ID", "JOBID", "ARRAY_JOB_ID", "ARRAY_TASK_ID", "ARRAY_TASK_COUNT",
        "ARRAY_TASK_MAX", "ARRAY_TASK_MIN", "ARRAY_TASK_STEP", "STEP_ID", "STEPID", "PROCID",
        "LOCALID", "NODEID", "NNODES", "JOB_NUM_NODES", "NTASKS", "NPROCS", "NTASKS_PER_NODE",
        "CPUS_PER_TASK", "CPUS_ON_NODE", "GPUS_ON_NODE", "JOB_UID", "JOB_GID", "TASK_PID",
        "PRIO_PROCESS", "STEP_NUM_NODES", "STEP_NUM_TASKS", "RESTART_COUNT", "MEM_PER_CPU",
        "MEM_PER_NODE", "MEM_PER_GPU", "GPUS", "NTASKS_PER_GPU", "NTASKS_PER_SOCKET",
        "GPUS_PER_NODE", "GPUS_PER_TASK", "CPUS_PER_GPU", "HET_SIZE", "PTY_PORT",
        "SRUN_COMM_PORT", "STEP_LAUNCHER_PORT", "STEP_RESV_PORTS", "THREADS_PER_CORE",
        "JOB_CPUS_PER_NODE_PACK_GROUP_0", "UMASK", "JOB_START_TIME", "JOB_END_TIME")},
    **{f"SLURM_{n}": nodes for n in (
        "JOB_NODELIST", "NODELIST", "STEP_NODELIST", "TOPOLOGY_ADDR", "SUBMIT_HOST",
        "LAUNCH_NODE_IPADDR", "SRUN_COMM_HOST", "STEP_LAUNCHER_HOSTNAME")},
    **{f"SLURM_{n}": name for n in (
        "JOB_NAME", "JOB_USER", "JOB_ACCOUNT", "JOB_PARTITION", "CLUSTER_NAME", "JOB_QOS",
        "JOB_RESERVATION", "TOPOLOGY_ADDR_PATTERN", "CPU_BIND_TYPE", "DISTRIBUTION",
        "JOB_DEPENDENCY", "MPI_TYPE", "PROFILE", "JOB_LICENSES", "CONSTRAINTS",
        "JOB_CONSTRAINTS", "CPU_BIND_VERBOSE", "OVERCOMMIT", "EXPORT_ENV", "GET_USER_ENV",
        "CPU_BIND_LIST", "CPU_BIND", "MEM_BIND", "JOB_STDERR", "JOB_STDIN", "JOB_STDOUT")},
    **{f"SLURM_{n}": tasks for n in (
        "TASKS_PER_NODE", "JOB_CPUS_PER_NODE", "STEP_TASKS_PER_NODE")},
    "SLURM_SUBMIT_DIR": P, "SLURM_WORKING_DIR": P, "SLURM_CONF": P, "SLURM_SPANK_JOB_DIR": P,
    "SLURM_TRES_PER_TASK": tres, "SLURM_JOB_GPUS": lambda v: all(
        p.isdigit() for p in v.split(",")), "SLURM_STEP_GPUS": lambda v: all(
        p.isdigit() for p in v.split(",")), "SLURM_NODE_ALIASES": lambda v: v in (
        "(null)", "") or nodes(v.replace(":", "-")), "SLURMD_NODENAME": host,
    "SLURM_GTIDS": lambda v: all(p.isdigit() for p in v.split(",")),
    # Open MPI's mpirun(1) exported variables; PMIx; UCX (`ucx_info -f`)
    **{f"OMPI_COMM_WORLD_{n}": N for n in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE",
                                          "NODE_RANK")},
    "OMPI_UNIVERSE_SIZE": N, "OMPI_MCA_pml": names, "OMPI_MCA_btl": names,
    "OMPI_MCA_btl_tcp_if_include": names, "OMPI_MCA_btl_tcp_if_exclude": names,
    "OMPI_MCA_oob_tcp_if_include": names, "OMPI_MCA_coll_hcoll_enable": B,
    "OMPI_MCA_coll": names, "OMPI_MCA_osc": names, "OMPI_MCA_mtl": names,
    "OMPI_MCA_orte_base_help_aggregate": B, "OMPI_MCA_opal_cuda_support": B,
    "OMPI_MCA_btl_openib_warn_default_gid_prefix": B, "OMPI_MCA_plm_rsh_agent": path,
    "OMPI_MCA_rmaps_base_oversubscribe": B, "OMPI_ALLOW_RUN_AS_ROOT": B,
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": B, "OMPI_MCA_hwloc_base_binding_policy": name,
    "PMIX_RANK": N, "PMIX_SIZE": N, "PMIX_NAMESPACE": name, "PMIX_HOSTNAME": host,
    "PMIX_MCA_gds": names, "PMIX_MCA_psec": names, "PMIX_VERSION": version,
    "UCX_TLS": enum("all", "rc", "rc_v", "rc_x", "rc_mlx5", "ud", "ud_v", "ud_x", "ud_mlx5",
                    "dc", "dc_x", "dc_mlx5", "tcp", "sm", "shm", "self", "cuda", "cuda_copy",
                    "cuda_ipc", "gdr_copy", "rocm", "rocm_copy", "rocm_ipc", "cma", "knem",
                    "xpmem", "posix", "sysv", "mm", "ib", "rc_verbs", "ud_verbs", "srd",
                    items=True, invert=True),
    "UCX_NET_DEVICES": hcas, "UCX_IB_GID_INDEX": N, "UCX_MEMTYPE_CACHE": B,
    "UCX_RNDV_THRESH": S, "UCX_RNDV_SCHEME": name, "UCX_ZCOPY_THRESH": S,
    "UCX_MAX_RNDV_RAILS": N, "UCX_IB_PCI_RELAXED_ORDERING": name, "UCX_WARN_UNUSED_ENV_VARS": B,
    "UCX_LOG_LEVEL": enum("fatal", "error", "warn", "diag", "info", "debug", "trace", "data",
                          "func", "poll"),
    "UCX_CUDA_COPY_MAX_REG_RATIO": lambda v: re.fullmatch(r"\d+(?:\.\d+)?", v) is not None,
    "UCX_PROTO_ENABLE": B, "UCX_PROTO_INFO": B, "UCX_IB_SL": N, "UCX_IB_TRAFFIC_CLASS": N,
    "UCX_SOCKADDR_TLS_PRIORITY": names, "UCX_HANDLE_ERRORS": names,
    # libfabric (FI_*), gloo, nvcc: what snapshot records besides
    "FI_PROVIDER": names, "FI_EFA_USE_DEVICE_RDMA": B, "FI_EFA_FORK_SAFE": B,
    "FI_HMEM_CUDA_USE_GDRCOPY": B, "FI_LOG_LEVEL": name, "FI_EFA_ENABLE_SHM_TRANSFER": B,
    "GLOO_SOCKET_IFNAME": interfaces, "GLOO_DEVICE_TRANSPORT": name,
    "NVCC_APPEND_FLAGS": flags, "NVCC_PREPEND_FLAGS": flags, "NVCC_THREADS": N,
    "NVCC_CCBIN": P, "MAX_JOBS": N,
    # the shell's own, and the environments' roots
    "PATH": paths, "LD_LIBRARY_PATH": paths, "LIBRARY_PATH": paths, "CPATH": paths,
    "PWD": P, "OLDPWD": P, "HOME": P, "HOSTNAME": host, "CONDA_PREFIX": P, "VIRTUAL_ENV": P,
    "CONDA_DEFAULT_ENV": name, "TMPDIR": P, "SHELL": P, "USER": name, "LOGNAME": name,
    # this tool's own (docs/configuration.md)
    "MEGATRON_ENV_CACHE": P, "MEGATRON_ENV_STATE": P, "MEGATRON_ENV_PROJECT": P,
    "MEGATRON_ENV_MIN_FREE_GB": lambda v: re.fullmatch(r"\d+(?:\.\d+)?", v) is not None,
    "MEGATRON_ENV_DEBUG": B, "MEGATRON_ENV_CONDA_CHANNELS": lambda v: all(
        url(p) or name(p) for p in v.split(",") if p),
    "MEGATRON_ENV_POOL_WIDTH": N, "MEGATRON_ENV_POOL_SLOTS": N, "MEGATRON_ENV_SLOTS": N,
    "MEGATRON_ENV_BUILD_ID": name, "MEGATRON_ENV_TEST_CACHE": P,
}
# families of this tool's names: a mirror's URL, a source's path or URL
# and Open MPI's MCA parameters (`OMPI_MCA_<param>`: a component list, a number, a switch)
_FAMILIES: tuple[tuple[str, Grammar], ...] = (("MEGATRON_ENV_MIRROR_", url),
                                              ("MEGATRON_ENV_SOURCE_", url),
                                              ("OMPI_MCA_", names), ("PMIX_MCA_", names))


def grammar_of(var: str) -> Grammar | None:
    """The grammar of `var`'s value, or None when the table does not know the name."""
    g = TABLE.get(var)
    if g is not None:
        return g
    return next((g for prefix, g in _FAMILIES if var.startswith(prefix)), None)


def governed(var: str) -> bool:
    """Whether `var` is typed here: in the table, or under a prefix the table governs (then an
    unknown name is unknown, never harmless for its prefix)."""
    return var in TABLE or var.startswith(PREFIXES)


# a value shorter is no secret worth its mask (masking it would blank out ordinary words, and a
# bad value the tool's own error quotes, `MEGATRON_ENV_MIN_FREE_GB='abc'`, would say nothing)
MIN_SECRET = 4
_MASKED = re.compile(r"<redacted(?:: \d+ chars)?>")
# a reference to another variable (`$NCCL_IFACE`, `${HOME}`), not a value; a mask already made
_REFERENCE = re.compile(r"\$\{?[A-Za-z_]\w*\}?")


def plainly_harmless(value: str) -> bool:
    """What no name makes a secret: shorter than MIN_SECRET, a boolean, an integer of at most
    6 digits, a reference to a variable, a mask."""
    v = value.strip()
    return len(v) < MIN_SECRET or v.lower() in _BOOL or v.lower() in ("none", "null", "(null)") or (
        _INT.fullmatch(v) is not None and len(v.lstrip("-")) <= 6) or _REFERENCE.fullmatch(
        v) is not None or _MASKED.fullmatch(v) is not None


@functools.lru_cache(maxsize=4096)
def parses(var: str, value: str) -> bool:
    """Whether `value` parses as what `var` can hold (a name the table does not know: only
    the plainly harmless). A URL's password and secret query values are judged masked (the
    URL rule masks them wherever they print)."""
    if plainly_harmless(value):
        return True
    g = grammar_of(var)
    if g is None:
        return False
    v = value.strip()
    if g is url and "://" in v:
        u = v.split("://", 1)
        rest = u[1].rsplit("@", 1)[-1] if "@" in u[1].split("/", 1)[0] else u[1]
        v = u[0] + "://" + rest.split("?", 1)[0].split("#", 1)[0]
    try:
        return g(v)
    except (ValueError, TypeError):
        return False


# `NAME=value` in any text (env.txt, a check's evidence, a log's `export` line): the name an
# environment variable's (upper case), under a prefix the table governs or in the table
_ASSIGN = re.compile(r"(?<![\w.$-])([A-Z][A-Z0-9_]*[A-Z0-9]|[A-Z]+_MCA_\w+)=(<redacted: \d+ chars>"
                     r"|\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']*)")
_HINT = re.compile(r"(?:" + "|".join(PREFIXES + ("MASTER_", "RANK", "WORLD_SIZE", "PATH",
                                                   "HOME", "PWD", "HOSTNAME", "MAX_JOBS")) + ")")


def shown(var: str, value: str) -> str:
    """`value` as printed for `var`: itself where it parses, else its shape."""
    return value if parses(var, value) else shape(value)


def _assign(m: re.Match[str]) -> str:
    var, value = m.group(1), m.group(2)
    if not governed(var) or not value:
        return m.group(0)
    if value[:1] in "\"'" and len(value) >= 2:
        inner = value[1:-1]
        return m.group(0) if parses(var, inner) else f"{var}={value[0]}{shape(inner)}{value[0]}"
    # a sentence's stop or a closing bracket the value did not open is no part of it
    bare = value
    for close, opening in ((")", "("), ("]", "["), ("}", "{")):
        if close in bare and bare.count(close) > bare.count(opening):
            bare = bare[:bare.index(close)] if opening not in bare else bare.rstrip(close)
    bare = bare.rstrip(".,;:")
    if "<redacted" in bare and not _MASKED.fullmatch(bare):  # partly masked: masked whole
        return f"{var}={REDACTED}{value[len(bare):]}"
    if parses(var, bare):
        return m.group(0)
    return f"{var}={shape(bare)}{value[len(bare):]}"


def mask(s: str) -> str:
    """Each `NAME=value` of a governed name whose value does not parse, as its shape."""
    if "=" not in s or _HINT.search(s) is None:
        return s
    return _ASSIGN.sub(_assign, s)
