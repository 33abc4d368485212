"""The taxonomy of how a job dies: every finding of `triage` belongs to one family, and the family
says what to do next (drain a node, requeue, fix the code) whatever message led there.

Why a table: the advice and the exit meaning are properties of the cause's family, not of the
message that revealed it, so a message never seen before that lands in a family gets that
family's advice. Which finding id is in which family is data (`FAMILY_OF`), read by `family`;
nothing here looks at log text.

Exit codes of `invoke triage` (docs/diagnose.md has the table): 0 when the logs show a normal
end and no failure, 1 for any failure seen (a named family or `job.unrecognised`), 3 when the
logs cannot tell (`job.stopped`: neither a failure nor an end, the `inconclusive` family), 2
when the input is not a log (nothing to read, an empty file or directory). The family's `means`
says what a retry wrapper should make of the 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_env.diagnose.ids import FindingId
from megatron_env.findings import INCONCLUSIVE


@dataclass(frozen=True)
class Family:
    name: str
    title: str
    means: str  # what exit 1 with this family means for whoever runs the job next
    advice: str  # the family's first step, whatever the message


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("hardware", "hardware (GPU, NVLink, NIC, host memory)",
           "do not retry on the same node: drain it",
           "drain the node (`scontrol update nodename=N state=drain reason=...`), reset or "
           "replace the GPU or NIC, run `invoke preflight` there before it rejoins"),
    Family("host", "host resources (memory, disk, file systems)",
           "retry after freeing the resource or asking for more",
           "the host ran out of something the job needs: host memory (the OOM killer), disk "
           "space, a quota, or a file system that failed; fix that, then rerun"),
    Family("scheduler", "the scheduler (time limit, preemption, cancellation, eviction)",
           "requeue: nothing in the job failed",
           "the scheduler ended the job: raise the time limit or checkpoint more often and "
           "requeue; `sacct -j JOB -o JobID,State,ExitCode,Reason` says which"),
    Family("network", "network and rendezvous (ports, stores, name resolution, heartbeats)",
           "retry once the nodes reach each other",
           "every node must reach the store (MASTER_ADDR:MASTER_PORT, the rendezvous endpoint) "
           "by a name it can resolve: check the address, the port, the firewall and that the "
           "store's host was up; `invoke preflight` checks the links"),
    Family("communication", "communication (NCCL errors, timeouts, mismatches, desyncs)",
           "find the rank that failed first; retry only if it was transient",
           "the ranks that time out wait for one that failed or took another path: find it "
           "(its own error earlier in its log); rerun with NCCL_DEBUG=INFO and the flight "
           "recorder (TORCH_NCCL_TRACE_BUFFER_SIZE)"),
    Family("numerics", "numerics (NaN/inf loss or gradients, loss-scale collapse)",
           "do not retry unchanged: it will diverge again",
           "the loss or gradients became NaN/inf: lower the learning rate, use bf16 or a "
           "larger initial loss scale, clip gradients, and find the batch where it began"),
    Family("data", "the data pipeline (DataLoader workers, datasets)",
           "fix the data or its workers before retrying",
           "a DataLoader worker died or a sample could not be read: run with num_workers=0 "
           "to see the sample's own error; a killed worker is host memory or /dev/shm"),
    Family("user", "the user's code",
           "fix the code: a retry fails the same way",
           "the traceback names the line of the training script that raised"),
    Family("framework", "the framework (PyTorch, Megatron, DeepSpeed, a kernel build)",
           "fix the installation or versions: a retry fails the same way",
           "an error inside the framework or a compiled kernel: `invoke build-check` and "
           "`invoke check` compare what is installed with what the profile pins"),
    Family("compiler", "the compiler (torch.compile: dynamo, inductor, Triton)",
           "retry without torch.compile to confirm, then fix or pin the compiler",
           "torch.compile failed while compiling the model, before it ran: rerun with "
           "TORCHDYNAMO_DISABLE=1 (eager) to confirm; TORCH_LOGS=+dynamo,+inductor says where; "
           "a Triton resource limit needs "
           "smaller blocks or another GPU; a C/C++ compile error needs the compiler the "
           "profile pins (`invoke check`)"),
    Family("abort", "a rank that ended the whole job (MPI_Abort)",
           "find that rank's own error: the others were killed because of it",
           "mpirun kills every rank when one calls MPI_Abort (Horovod and mpi4py do on an "
           "uncaught exception): the rank it names printed its own error just before"),
    Family("signal", "a process killed by a signal, its sender not in the logs",
           "find who sent it before retrying",
           "the signal says who: SIGKILL is the kernel's OOM killer or the scheduler, SIGTERM "
           "the scheduler or the launcher, SIGSEGV/SIGBUS a crash (native code, /dev/shm)"),
    Family("unrecognised", "failure-looking lines that match no signature",
           "a failure: read the quoted lines",
           "the quoted lines are what looked like the failure: please report them (the log "
           "and `invoke report`) so the next version names this failure"),
    Family(INCONCLUSIVE, "a log that ends with neither an error nor a normal end",
           "cannot tell (exit 3): a hang, a kill from outside, or a log cut short",
           "a hang or a kill: `py-spy dump --pid` of a live rank says where it waits; rerun "
           "with NCCL_DEBUG=INFO, TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and "
           "TORCH_NCCL_DUMP_ON_TIMEOUT=1 (the flight recorder's dump names the collective)"),
    Family("clean", "a normal end, no failure", "success", ""),
]}

# finding id -> family; an id not listed is the framework's (`family`)
FAMILY_OF: dict[str, str] = {
    FindingId.JOB_GPU_XID: "hardware", FindingId.JOB_HARDWARE: "hardware",
    FindingId.JOB_OOM_KILLER: "host", FindingId.JOB_DISK: "host", FindingId.JOB_SHM: "host",
    FindingId.JOB_SCHEDULER: "scheduler",
    FindingId.JOB_RENDEZVOUS: "network", FindingId.JOB_BOOTSTRAP: "network",
    FindingId.NCCL_SOCKET: "network",
    FindingId.JOB_TIMEOUT: "communication", FindingId.JOB_NCCL_ERROR: "communication",
    FindingId.JOB_ODD_RANK: "communication", FindingId.JOB_HANG: "communication",
    FindingId.JOB_DESYNC: "communication", FindingId.JOB_STALL: "communication",
    FindingId.JOB_WATCHDOG_STUCK: "communication", FindingId.JOB_NCCL_NET: "communication",
    FindingId.NCCL_IB_COMPLETION: "communication", FindingId.NCCL_IBVERBS_CALL: "communication",
    FindingId.NCCL_SYSTEM_ERROR: "communication", FindingId.NCCL_IBVERBS: "communication",
    FindingId.NCCL_PEER_LOST: "communication", FindingId.NCCL_NET: "communication",
    FindingId.NCCL_TRANSPORT: "communication", FindingId.NCCL_SHM: "host",
    FindingId.NCCL_CUDA: "framework",
    FindingId.JOB_NUMERICS: "numerics", FindingId.JOB_DATA: "data",
    FindingId.JOB_DEVICE_ASSERT: "user", FindingId.JOB_SCRIPT: "user",
    FindingId.JOB_ACCELERATOR_OOM: "user",
    FindingId.JOB_KERNEL_ABI: "framework",
    FindingId.JOB_COMPILER: "compiler", FindingId.JOB_MPI_ABORT: "abort",
    FindingId.JOB_CUDA_OOM: "user", FindingId.JOB_EXCEPTION: "user",
    FindingId.JOB_CUDA_ERROR: "framework", FindingId.JOB_RAY_WORKER: "framework",
    FindingId.JOB_SIGNAL: "signal", FindingId.JOB_ROOT_CAUSE: "signal",
    FindingId.JOB_UNRECOGNISED: "unrecognised", FindingId.JOB_STOPPED: INCONCLUSIVE,
    FindingId.JOB_CLEAN: "clean",
    FindingId.JOB_MIXED: "clean",
}


def family(finding_id: str, kind: str = "") -> Family:
    """The family of a finding: its `kind` when that names a family (a finding whose family
    depends on what it found, e.g. a CUDA error that is an ECC fault), else its id's."""
    if kind in FAMILIES:
        return FAMILIES[kind]
    return FAMILIES[FAMILY_OF.get(finding_id, "framework")]
