"""Every finding id triage reports, as one enum: the ids are data other code reads (the families'
table, the order of causes, a script filtering `--json`), so a misspelt id is a name error here,
not a finding that silently lands in no family. A member is the string it names (`str` and
JSON write "job.timeout"). The `nccl.*` ids are also those of scripts/verify_nccl.py's analysis,
whose findings arrive as plain dicts. Nothing here imports anything."""

from __future__ import annotations

from enum import Enum


class FindingId(str, Enum):
    JOB_ACCELERATOR_OOM = "job.accelerator_oom"
    JOB_BOOTSTRAP = "job.bootstrap"
    JOB_CLEAN = "job.clean"
    JOB_COMPILER = "job.compiler"
    JOB_CUDA_ERROR = "job.cuda_error"
    JOB_CUDA_OOM = "job.cuda_oom"
    JOB_DATA = "job.data"
    JOB_DESYNC = "job.desync"
    JOB_DEVICE_ASSERT = "job.device_assert"
    JOB_DISK = "job.disk"
    JOB_EXCEPTION = "job.exception"
    JOB_GPU_XID = "job.gpu_xid"
    JOB_HANG = "job.hang"
    JOB_HARDWARE = "job.hardware"
    JOB_KERNEL_ABI = "job.kernel_abi"
    JOB_MIXED = "job.mixed"
    JOB_MPI_ABORT = "job.mpi_abort"
    JOB_NCCL_ERROR = "job.nccl_error"
    JOB_NCCL_NET = "job.nccl_net"
    JOB_NUMERICS = "job.numerics"
    JOB_ODD_RANK = "job.odd_rank"
    JOB_OOM_KILLER = "job.oom_killer"
    JOB_RAY_WORKER = "job.ray_worker"
    JOB_RENDEZVOUS = "job.rendezvous"
    JOB_ROOT_CAUSE = "job.root_cause"
    JOB_SCHEDULER = "job.scheduler"
    JOB_SCRIPT = "job.script"
    JOB_SHM = "job.shm"
    JOB_SIGNAL = "job.signal"
    JOB_STALL = "job.stall"
    JOB_STOPPED = "job.stopped"
    JOB_TIMEOUT = "job.timeout"
    JOB_UNRECOGNISED = "job.unrecognised"
    JOB_WATCHDOG_STUCK = "job.watchdog_stuck"
    NCCL_CUDA = "nccl.cuda"
    NCCL_IB_COMPLETION = "nccl.ib_completion"
    NCCL_IBVERBS = "nccl.ibverbs"
    NCCL_IBVERBS_CALL = "nccl.ibverbs_call"
    NCCL_NET = "nccl.net"
    NCCL_PEER_LOST = "nccl.peer_lost"
    NCCL_SHM = "nccl.shm"
    NCCL_SOCKET = "nccl.socket"
    NCCL_SYSTEM_ERROR = "nccl.system_error"
    NCCL_TRANSPORT = "nccl.transport"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)
