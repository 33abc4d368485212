"""The families' signatures as data: for each family, the messages its sources print, written from
those sources (the kernel's OOM killer, Slurm's slurmstepd and srun, NVIDIA's driver and
nvidia-smi, torch's c10d and elastic agent, DeepSpeed's loss scaler, Megatron's NaN checks, glibc's
errno strings), as general as the source's own wording allows, so that a message never seen
still lands in its family.

A row: the finding it makes, a `kind` within it, a trigger (a literal the line must hold: the
cheap test), the pattern (named groups: pid, proc, host, rank, addr, what, pci, code) and what
it says. One reader (`hit`) serves every row. Also here: the lines that look like a failure
without naming one (`job.unrecognised` quotes them), the lines that say a run is progressing,
and the lines that say it ended normally (`job.stopped` and a clean end need both).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from megatron_env.diagnose import sig_end
from megatron_env.diagnose.ids import FindingId
from megatron_env.diagnose.joblog import Line, local_rank
from megatron_env.diagnose.model import NCCL_ORIGIN, Events, Failing, Hit, rank_of, stamp


@dataclass(frozen=True)
class Sig:
    finding: str
    kind: str
    triggers: tuple[str, ...]
    rx: re.Pattern[str]
    says: str  # str.format over the named groups (missing ones empty)
    # the message goes on on the next line (an exception's cause under its heading:
    # "BackendCompilerFailed: backend='inductor' raised:"; Open MPI's "with errorcode N."): the
    # pattern is matched on the two lines joined where the line alone leaves a group empty
    next_line: bool = False


def _sig(finding: str, kind: str, trigger: str | tuple[str, ...], rx: str, says: str,
         next_line: bool = False) -> Sig:
    return Sig(finding, kind, (trigger,) if isinstance(trigger, str) else trigger,
               re.compile(rx), says, next_line)


_ERRNO = r"(?:\[Errno (?P<code>\d+)\] )?"
_PATH = r"(?:: '?(?P<path>[^'\s]+)'?)?"
TABLE: list[Sig] = [
    # -- hardware: NVIDIA's driver and tools, the PCIe AER driver, the NIC drivers
    _sig(FindingId.JOB_HARDWARE, "fallen off the bus", "fallen off the bus",
         r"(?:GPU (?:at )?(?P<pci>[\w:.]+) )?has fallen off the bus",
         "a GPU has fallen off the bus {pci}"),
    _sig(FindingId.JOB_HARDWARE, "ECC", "ECC",
         r"(?<!CUDA error: )(?i:(?P<what>(?:uncorrectable|uncontained|double[- ]bit) ECC "
         r"error[^.,;]*))",  # (a CUDA error is job.cuda_error's, in the hardware family)
         "{what}"),
    _sig(FindingId.JOB_HARDWARE, "NVLink", "NVLink",
         r"(?P<what>(?:uncorrectable )?NVLink (?:error|fatal error|link down)[^.,;]*)",
         "{what}"),
    _sig(FindingId.JOB_HARDWARE, "GPU lost", "Unable to determine the device handle",
         r"Unable to determine the device handle for GPU (?P<pci>[\w:.]+): (?P<what>.+)",
         "nvidia-smi cannot reach GPU {pci}: {what}"),
    _sig(FindingId.JOB_HARDWARE, "GPU lost", "GPU is lost",
         r"(?:GPU (?P<pci>[\w:.]+) )?(?P<what>GPU is lost)", "the GPU is lost {pci}"),
    _sig(FindingId.JOB_HARDWARE, "GPU lost", "RmInitAdapter failed",
         r"NVRM: (?:GPU (?P<pci>[\w:.]+): )?RmInitAdapter failed", "the driver could not "
         "initialise GPU {pci}"),
    _sig(FindingId.JOB_HARDWARE, "PCIe", "AER:", r"(?:pcieport|nvidia) (?P<pci>[\w:.]+): AER: "
         r"(?P<what>(?:Uncorrected|Multiple Uncorrected) \(\w+\) error[^,]*)", "PCIe {what} "
         "at {pci}"),
    _sig(FindingId.JOB_HARDWARE, "PCIe", "PCIe Bus Error",
         r"(?P<pci>[\w:.]+): (?:AER: )?PCIe Bus Error: (?P<what>severity=Uncorrected[^,]*"
         r"(?:, type=[^,]+)?)", "PCIe bus error ({what}) at {pci}"),
    _sig(FindingId.JOB_HARDWARE, "host memory", "Hardware Error",
         r"(?P<what>(?:\[Hardware Error\]|mce: \[Hardware Error\]).*)", "{what}"),
    _sig(FindingId.JOB_HARDWARE, "NIC", "async event",
         r"NET/IB ?: Got async event ?: (?P<what>port error|.*?(?:error|fatal)[^.]*)",
         "an InfiniBand {what} (the HCA or its link)"),
    _sig(FindingId.JOB_HARDWARE, "NIC", "link down",
         r"(?P<dev>mlx\d_\d+|mlx5_core [\w:.]+|ib\d|eth\d+|bond\d)[: ].*?(?i:link (?:is )?down)",
         "network link {dev} went down"),
    # -- host resources: the kernel's OOM killer (mm/oom_kill.c), the cgroup's, Ray's monitor
    _sig(FindingId.JOB_OOM_KILLER, "kernel", "of memory: Kill",
         r"(?:Out of memory|Memory cgroup out of memory): Kill(?:ed)? process (?P<pid>\d+) "
         r"\((?P<proc>[^)]*)\)", "the kernel's OOM killer killed {proc} (pid {pid})"),
    _sig(FindingId.JOB_OOM_KILLER, "kernel", "oom-kill:",
         r"oom-kill:.*?task=(?P<proc>[^,]+),pid=(?P<pid>\d+)",
         "the kernel's OOM killer killed {proc} (pid {pid})"),
    _sig(FindingId.JOB_OOM_KILLER, "kernel", "Killed process",
         r"Killed process (?P<pid>\d+) \((?P<proc>[^)]*)\) total-vm",
         "the kernel's OOM killer killed {proc} (pid {pid})"),
    _sig(FindingId.JOB_OOM_KILLER, "kernel", "invoked oom-killer",
         r"(?P<proc>\S+) invoked oom-killer", "{proc} invoked the kernel's OOM killer"),
    _sig(FindingId.JOB_OOM_KILLER, "cgroup", ("oom_kill event", "oom-kill event"),
         r"Detected (?P<what>\d+) oom[-_]kill events?(?:\(s\))? in (?:StepId=|step )?"
         r"(?P<step>\w+(?:\.\w+)*)",
         "Slurm saw {what} OOM-kill event(s) in {step}: the job's memory limit"),
    _sig(FindingId.JOB_OOM_KILLER, "cgroup", "OOMKilled", r"(?P<what>OOMKilled)",
         "the container was OOMKilled (its memory limit)"),
    _sig(FindingId.JOB_OOM_KILLER, "ray", "killed due to memory pressure",
         r"(?P<what>\d+ Workers \(tasks / actors\) killed due to memory pressure \(OOM\))"
         r"(?:.*?IP: (?P<host>[\w.:-]+)\))?", "Ray's memory monitor: {what}"),
    _sig(FindingId.JOB_OOM_KILLER, "ray", "low on memory",
         r"(?P<what>Task was killed due to the node running low on memory)", "{what}"),
    # -- host resources: disks and file systems, by their errno (glibc's strings)
    _sig(FindingId.JOB_DISK, "no space", "No space left",
         _ERRNO + r"No space left on device" + _PATH, "no space left on device {path}"),
    _sig(FindingId.JOB_DISK, "write failed", "file write failed",
         r"(?P<what>PytorchStreamWriter failed writing file \S+: file write failed)",
         "torch.save could not write (a full disk or quota, most often): {what}"),
    _sig(FindingId.JOB_DISK, "no space", "StorageFull", r"kind: (?P<what>StorageFull)",
         "no space left on device"),
    _sig(FindingId.JOB_DISK, "quota", "quota exceeded",
         _ERRNO + r"(?i:disk quota exceeded)" + _PATH, "disk quota exceeded {path}"),
    _sig(FindingId.JOB_DISK, "stale file handle", "tale file handle",
         _ERRNO + r"(?i:stale file handle)" + _PATH, "stale file handle (a network file "
         "system lost the file) {path}"),
    _sig(FindingId.JOB_DISK, "read-only", "Read-only file system",
         _ERRNO + r"Read-only file system" + _PATH, "the file system is read-only {path}"),
    _sig(FindingId.JOB_DISK, "I/O error", "Input/output error",
         r"\[Errno 5\] Input/output error" + _PATH, "I/O error {path}"),
    _sig(FindingId.JOB_DISK, "unmounted", "Transport endpoint is not connected",
         _ERRNO + r"Transport endpoint is not connected" + _PATH,
         "a FUSE mount went away {path}"),
    # -- the scheduler: Slurm's slurmstepd/srun, PBS, LSF, Kubernetes' kubelet
    _sig(FindingId.JOB_SCHEDULER, "time limit", "walltime",
         r"(?P<what>job killed: walltime \d+ exceeded limit \d+)", "PBS: {what}"),
    _sig(FindingId.JOB_SCHEDULER, "time limit", "TERM_RUNLIMIT", r"(?P<what>TERM_RUNLIMIT.*)",
         "LSF: {what}"),
    _sig(FindingId.JOB_SCHEDULER, "eviction", "low on resource",
         r"The node was low on resource: (?P<what>[\w-]+)",
         "Kubernetes evicted the pod: the node was low on {what}"),
    _sig(FindingId.JOB_SCHEDULER, "eviction", "Evicted", r"(?:Reason|Status):?\s+(?P<what>Evicted)",
         "Kubernetes evicted the pod"),
    _sig(FindingId.JOB_SCHEDULER, "preemption", ("reempted", "PREEMPTED", "reemption"),
         r"(?P<what>(?:[Pp]reempted|PREEMPTED|Preemption)\b.*)", "{what}"),
    _sig(FindingId.JOB_SCHEDULER, "node failure", "Node failure",
         r"(?P<what>[Nn]ode failure on (?P<host>[\w.-]+))", "Slurm: {what}"),
    _sig(FindingId.JOB_SCHEDULER, "srun", "Force Terminated",
         r"srun: Force Terminated (?:job|step) (?P<what>[\w.]+)", "srun force-terminated "
         "{what}"),
    # -- network and rendezvous: torch's c10d store, torchelastic, name resolution, Ray's GCS
    _sig(FindingId.JOB_RENDEZVOUS, "heartbeat", "heartbeat",
         r"(?P<what>(?:failed to send a keep-alive heartbeat|missed too many heartbeats|"
         r"heartbeat (?:timed out|timeout|lost|failure)|lost heartbeat)[^.]*)",
         "{what}"),
    _sig(FindingId.JOB_RENDEZVOUS, "heartbeat", "keep-alive",
         r"(?P<what>[^.]*keep-alive[^.]*failed[^.]*)",
         "{what}"),
    _sig(FindingId.JOB_RENDEZVOUS, "name resolution", ("name resolution", "not known", "servname",
                                                "nknown host", "resolve host"),
         r"(?P<what>Temporary failure in name resolution|Name or service not known|"
         r"nodename nor servname provided|[Uu]nknown host|getaddrinfo failed|"
         r"could not resolve host(?:name)?)[: ]*(?P<addr>[\w.-]*)",
         "a host name could not be resolved {addr}: {what}"),
    _sig(FindingId.JOB_RENDEZVOUS, "name resolution", "getaddrinfo",
         r"getaddrinfo\(?\)? (?:failed|error)[^:]*:? ?(?P<what>.*)", "getaddrinfo failed: {what}"),
    _sig(FindingId.JOB_RENDEZVOUS, "store", "failed to connect to",
         r"client socket has failed to connect to (?:\[(?P<addr>[^\]]+)\]|(?P<addr2>[\w.-]+))"
         r":(?P<port>\d+)"
         r"(?: \(errno: (?P<code>\d+) - (?P<why>[^)]+)\))?",
         "a client could not connect to the store: {why}"),
    _sig(FindingId.JOB_RENDEZVOUS, "store", "has timed out after",
         r"client socket has timed out after (?P<what>\d+ ?m?s) while trying to connect to "
         r"\(?(?P<addr>[\w.:-]+?), (?P<port>\d+)\)?",
         "a client timed out connecting to the store after {what}"),
    _sig(FindingId.JOB_RENDEZVOUS, "store", "store->get",
         r"(?:\[(?P<rank>\d+)\] is setting up NCCL communicator and \w+ ncclUniqueId from "
         r"\[(?P<root>\d+)\].*?)?(?P<what>store->get\([^)]*\).*)",
         "a rank could not get the NCCL unique id from the store: {what}"),
    _sig(FindingId.JOB_RENDEZVOUS, "port in use", ("EADDRINUSE", "ddress already in use"),
         r"(?P<what>(?:failed to listen on any local network address|[Aa]ddress already in use)"
         r".*?)(?:\.|$)", "the store could not listen: {what}"),
    _sig(FindingId.JOB_RENDEZVOUS, "store", "Connection reset by peer",
         r"^\s*(?:[\w.]+\.)?\w*Error: (?P<what>Connection reset by peer)",
         "the store connection was reset by its peer"),
    _sig(FindingId.JOB_RENDEZVOUS, "heartbeat", "KeepAlive",
         r"(?P<what>Exception in thread (?P<thread>RendezvousKeepAliveTimer\w*))",
         "the rendezvous' keep-alive heartbeat thread failed ({thread})"),
    _sig(FindingId.JOB_RENDEZVOUS, "store", "Timed out after",
         r"(?P<what>Timed out after \d+ seconds waiting for clients\. \d+/\d+ clients joined)",
         "the store waited for its clients: {what}"),
    _sig(FindingId.JOB_RENDEZVOUS, "store", ("recvBytes", "sendBytes", "recvValue"),
         r"(?P<what>(?:recvBytes|sendBytes|recvValue) failed)(?: on SocketImpl\(.*?"
         r"remote=\[?(?P<addr>[\w.:-]+?)\]?:(?P<port>\d+)\))?(?:: (?P<why>[^.]+))?",
         "the store connection broke: {what}: {why}"),
    _sig(FindingId.JOB_RENDEZVOUS, "store", "should dump",
         r"(?P<what>Failed to check the \"should dump\" flag on TCPStore)[^:]*: (?P<why>.*)",
         "the store went away: {what}: {why}"),
    _sig(FindingId.JOB_RENDEZVOUS, "store", "RendezvousTimeoutError",
         r"(?P<what>RendezvousTimeoutError.*)", "{what}"),
    _sig(FindingId.JOB_RENDEZVOUS, "store", "RendezvousClosedError",
         r"(?P<what>RendezvousClosedError.*)", "{what}"),
    # -- communication: a network plugin that failed (NCCL falls back or fails)
    _sig(FindingId.JOB_NCCL_NET, "net plugin", "NET/OFI",
         r"NET/OFI (?P<what>(?:Couldn't|Unable|Failed|failed)[^\n]*|aws-ofi-nccl "
         r"initialization failed)", "NCCL's OFI network plugin failed: {what}"),
    # -- numerics: DeepSpeed's and AMP's loss scalers, Megatron's NaN checks, fairseq, Lightning
    # (triggers of the message's own words: "loss scale" alone is on every Megatron iteration
    # line, which would make each one a line to parse)
    _sig(FindingId.JOB_NUMERICS, "loss scale", ("loss scale already at minimum",
                                        "inimum loss scale reached"),
         r"(?P<what>(?:Current loss scale already at minimum|[Mm]inimum loss scale reached)"
         r"[^.]*)", "{what}"),
    _sig(FindingId.JOB_NUMERICS, "NaN", "NaN",
         r"(?P<what>(?:found NaN in|Rank \d+ found NaN|NaN or Inf found in|Detected NaN|"
         r"loss is NaN|Loss is NaN|loss became NaN|NaN loss)[^.]*)", "{what}"),
    _sig(FindingId.JOB_NUMERICS, "NaN", ("is nan", "became nan", "= nan", "nan loss", "is inf",
                                 "nan values", "inf values"),
         r"(?P<what>(?:[Ll]oss (?:is|became|=) (?:nan|inf)|nan loss|returned in `training_step`"
         r" is nan|detected (?:inf|nan) values)[^.]*)", "{what}"),
    _sig(FindingId.JOB_NUMERICS, "NaN", (": nan", "=nan", "= nan", ": inf", "=inf", ": -inf"),
         r"(?P<what>(?:grad[ _]norm|lm loss|loss)[:=] ?(?:nan|inf|-inf)\b)",
         "the trainer printed {what}"),
    _sig(FindingId.JOB_NUMERICS, "NaN", "nan values",
         r"(?P<what>Function '\w+' returned nan values in its \d+\w* output)", "{what}"),
    _sig(FindingId.JOB_NUMERICS, "loss scale", "OVERFLOW!",
         r"(?P<what>Attempted loss scale: (?P<scale>(?:[1-9]|1[0-6])(?:\.0)?), reducing to "
         r"\S+)", "fp16 overflow at a loss scale of {scale} (collapsed): {what}"),
    _sig(FindingId.JOB_NUMERICS, "loss scale", "reducing loss scale to",
         r"(?P<what>reducing loss scale to (?P<scale>(?:[1-9]|1[0-6])(?:\.0+)?)\b(?![\d.]))",
         "fp16 overflow at a loss scale of {scale} (collapsed): {what}"),
    _sig(FindingId.JOB_NUMERICS, "NaN", "non-finite",
         r"(?P<what>[^.]*(?:non-finite|not finite)[^.]*(?:loss|grad)[^.]*)", "{what}"),
    # -- communication: ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) comparing ranks
    _sig(FindingId.JOB_DESYNC, "mismatch", "mismatch between collectives",
         r"Detected mismatch between collectives on ranks\. Rank (?P<rank>\d+) is running "
         r"collective: (?P<what>CollectiveFingerPrint\([^)]*\))(?:, but Rank (?P<other>\d+) "
         r"is running collective: (?P<theirs>CollectiveFingerPrint\([^)]*\)))?",
         "the ranks disagree on the collective (a desync): rank {rank} runs {what}, rank "
         "{other} runs {theirs}"),
    # -- the data pipeline: torch.utils.data's worker watchdog, its re-raise of a worker error
    _sig(FindingId.JOB_DATA, "worker killed", "DataLoader worker",
         r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: (?P<what>[\w ]+)",
         "a DataLoader worker (pid {pid}) was killed by a signal: {what}"),
    _sig(FindingId.JOB_DATA, "worker exited", "DataLoader worker",
         r"DataLoader worker \(pid\(s\) (?P<pid>[\d, ]+)\) exited unexpectedly",
         "DataLoader worker(s) (pid {pid}) exited unexpectedly"),
    _sig(FindingId.JOB_DATA, "dataset", "DatasetGenerationError",
         r"(?P<what>DatasetGenerationError: .*)", "the dataset could not be built: {what}"),
    _sig(FindingId.JOB_DATA, "worker error", "in DataLoader worker",
         r"Caught (?P<what>\w+) in DataLoader worker process (?P<rank>\d+)",
         "a DataLoader worker raised {what}"),
    # torch/utils/data: the worker's own signal handler, the old exit message, the timeout
    _sig(FindingId.JOB_DATA, "worker killed", "encountered in worker",
         r"Unexpected (?P<what>bus error|segmentation fault|floating-point exception) "
         r"encountered in worker", "a DataLoader worker crashed: {what}"),
    _sig(FindingId.JOB_DATA, "worker exited", "exited unexpectedly with exit code",
         r"DataLoader worker \(pid (?P<pid>\d+)\) exited unexpectedly with exit code "
         r"(?P<code>-?\d+)", "a DataLoader worker (pid {pid}) exited with code {code}"),
    _sig(FindingId.JOB_DATA, "timeout", "DataLoader timed out",
         r"DataLoader timed out after (?P<what>\d+) seconds",
         "a DataLoader batch took longer than its timeout ({what} s)"),
    # -- a CUDA kernel's own bounds check (aten's CUDA_KERNEL_ASSERT), printed by the device
    # before (or without) the RuntimeError that says "device-side assert triggered"
    _sig(FindingId.JOB_DEVICE_ASSERT, "assert", ("Assertion `", "assertion `"),
         r"(?:(?P<file>[\w/.-]+\.(?:cuh?|hip)):\d+: (?P<fn>[^:]+?): )?(?:block: \[[\d,]+\], "
         r"thread: \[[\d,]+\] )?(?:Device-side a|A)ssertion `(?P<what>.+?)[`'] failed",
         "a GPU kernel's device-side assertion failed: `{what}` in {fn}"),
    # -- the launcher started a script that is not there (CPython's own message)
    _sig(FindingId.JOB_SCRIPT, "missing", "can't open file",
         r"(?P<proc>[\w./-]*python[\w.]*): can't open file '?(?P<path>[^']+?)'?: "
         r"(?P<what>\[Errno \d+\] [^\n]+)", "{proc} can't open file {path}: {what}"),
    # -- a compiled extension built against another torch or CUDA (the dynamic linker's words,
    # ranks' lines often glued together: the symbol ends where the next rank's error begins)
    _sig(FindingId.JOB_KERNEL_ABI, "undefined symbol", "undefined symbol",
         r"(?:(?P<lib>[\w./+-]+\.so[\w.]*): )?undefined symbol: (?P<what>[\w$.@]+?)"
         r"(?=ImportError|OSError|\[rank|\s|$)",
         "a compiled extension does not match the torch it is loaded into: {lib} needs the "
         "undefined symbol {what}"),
    # -- torch.compile: dynamo, inductor, triton (their exception classes)
    _sig(FindingId.JOB_COMPILER, "inductor", "BackendCompilerFailed",
         r"BackendCompilerFailed: backend='(?P<backend>[\w.]+)' raised:?\s*(?P<what>.*)",
         "torch.compile's backend {backend} failed: {what}", next_line=True),
    _sig(FindingId.JOB_COMPILER, "inductor",
         ("InductorError", "LoweringException", "CppCompileError"),
         r"(?P<kind>InductorError|LoweringException|CppCompileError): (?P<what>.*)",
         "inductor failed ({kind}): {what}"),
    _sig(FindingId.JOB_COMPILER, "triton", "OutOfResources",
         r"OutOfResources: out of resource: (?P<what>[\w ]+), Required: (?P<req>\d+), "
         r"Hardware limit: (?P<lim>\d+)",
         "a Triton kernel needs more {what} than the GPU has ({req} > {lim})"),
    _sig(FindingId.JOB_COMPILER, "triton", ("CompilationError", "Failed to find C compiler"),
         r"(?P<what>triton\.compiler\.errors\.CompilationError.*|Failed to find C compiler.*)",
         "Triton could not compile a kernel: {what}"),
    # an error-level glog record of inductor's or dynamo's own modules (torch's logging: the
    # generated kernel's source printed line by line when Triton failed to compile it)
    _sig(FindingId.JOB_COMPILER, "inductor", ("_inductor", "_dynamo"),
         r"^\[?E\d{4} [\d:.]+ +\d+ \S*?torch[/\\](?P<what>_(?:inductor|dynamo)[/\\]\S+?\.py):\d+\]",
         "torch.compile's {what} logged an error while compiling (its generated code follows)"),
    _sig(FindingId.JOB_COMPILER, "dynamo", "torch._dynamo.exc.",
         r"torch\._dynamo\.exc\.(?P<kind>(?!BackendCompilerFailed)\w+): (?P<what>.*)",
         "torch.compile (dynamo) failed ({kind}): {what}"),
    # -- another accelerator runtime out of memory: ROCm, Ascend, Intel XPU, Apple MPS, XLA
    _sig(FindingId.JOB_ACCELERATOR_OOM, "hip", "HIP out of memory",
         r"HIP out of memory\. Tried to allocate (?P<what>[\d.]+ [KMGT]iB)",
         "ROCm ran out of GPU memory: tried to allocate {what}"),
    _sig(FindingId.JOB_ACCELERATOR_OOM, "npu", "NPU out of memory",
         r"NPU out of memory\. Tried to allocate (?P<what>[\d.]+ [KMGT]iB)",
         "the Ascend NPU ran out of memory: tried to allocate {what}"),
    _sig(FindingId.JOB_ACCELERATOR_OOM, "xpu", "XPU out of memory",
         r"XPU out of memory\. Tried to allocate (?P<what>[\d.]+ [KMGT]iB)",
         "the Intel XPU ran out of memory: tried to allocate {what}"),
    _sig(FindingId.JOB_ACCELERATOR_OOM, "mps", "MPS backend out of memory",
         r"MPS backend out of memory \((?P<what>[^)]*)\)",
         "Apple's MPS backend ran out of memory ({what})"),
    _sig(FindingId.JOB_ACCELERATOR_OOM, "xla", "RESOURCE_EXHAUSTED",
         r"RESOURCE_EXHAUSTED:?\s*(?P<what>[^\n]{0,160})",
         "the accelerator's runtime (XLA) ran out of a resource: RESOURCE_EXHAUSTED {what}"),
    # -- MPI: a rank called MPI_Abort and the launcher killed every rank (Open MPI, MPICH)
    _sig(FindingId.JOB_MPI_ABORT, "abort", "MPI_ABORT was invoked",
         r"MPI_ABORT was invoked on rank (?P<rank>\d+) in communicator (?P<comm>\w+)"
         r"(?:\s+with errorcode (?P<code>-?\d+))?",
         "rank {rank} called MPI_ABORT on {comm}, errorcode {code}: mpirun killed every rank",
         next_line=True),
    _sig(FindingId.JOB_MPI_ABORT, "abort", "called MPI_Abort",
         r"application called MPI_Abort\((?P<comm>\w+), (?P<code>-?\d+)\) - process "
         r"(?P<rank>\d+)", "rank {rank} called MPI_Abort on {comm} (error code {code})"),
]

_SYSLOG_HOST = re.compile(r"\b\w{3}\s+\d+ [\d:]+ (\S+) kernel:")
_TRIGGERS: dict[str, list[Sig]] = {}
for _s in TABLE:
    for _w in _s.triggers:
        _TRIGGERS.setdefault(_w, []).append(_s)


class _Blank(dict[str, str]):  # str.format_map with the groups that did not take part left empty
    def __missing__(self, key: str) -> str:
        return ""


def _hit(sig: Sig, ev: Events, line: Line, t: str, ahead: deque[Line]) -> bool:
    m = sig.rx.search(t)
    if m is None:
        return False
    if sig.next_line and ahead and not all(m.groupdict().values()) and (
            both := sig.rx.search(f"{t.rstrip()} {ahead[0].text.strip()}")):
        m = both
    g = {k: v.strip() for k, v in m.groupdict().items() if v}
    host = g.get("host") or line.host
    if host is None and "kernel:" in t and (h := _SYSLOG_HOST.search(t)):
        host = h.group(1)
    addr = g.get("addr") or g.get("addr2")
    store = f"{addr}:{g['port']}" if addr and g.get("port") else None
    if host is None and (o := NCCL_ORIGIN.search(t)) and o.group(1) and o.start():
        host = t[:o.start()].split()[-1].split("|")[-1] or None
    rank = int(g["rank"]) if g.get("rank") and sig.finding != FindingId.JOB_DATA else rank_of(line)
    says = " ".join(sig.says.format_map(_Blank(g)).split())
    ev.add(Hit(id=sig.finding, kind=sig.kind, what=says, rank=rank, host=host,
               pid=g.get("pid"), pci=g.get("pci"), store=store, line=t.strip()),
           key=(sig.finding, says, rank, host))
    return True


def reader(sigs: list[Sig]) -> Callable[[Events, Line, str, deque[Line], dict[str, Any]], None]:
    def read(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
        for sig in sigs:
            if _hit(sig, ev, line, t, ahead):
                return
    return read


# ------------------------------------------------------------------ failure-looking lines

# an exception as Python prints it last in a traceback ("pkg.mod.SomeError: text"), an error
# line (logging's ERROR, glog's E, `error:`), a fatal message
_EXCEPTION = re.compile(r"^\s*(?:[\w.]+\.)?(?P<name>[A-Z]\w*(?:Error|Exception|Exit|Interrupt|"
                        r"Failure|Fault|Failed))\b(?::\s*(?P<what>.*))?$")
_ERROR_LINE = re.compile(r"(?:\bERROR\b|\berror:|^\[?E\d{4} |\bFATAL\b|\bfatal error\b|"
                         r"\bCRITICAL\b)", )
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in\b')
# a logging library's record head before a traceback's line: vLLM's `ERROR 01-11 13:09:40
# engine.py:366] `, glog's (torch's) `E0426 23:48:33.749000 5102 path/api.py:874] `, Python
# logging's default `ERROR:name:`
_RECORD_HEAD = re.compile(r"^(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d [\w.]+:\d+\] |"
                          r"[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] (?:\[[\d/]+\] )?|"
                          r"(?:ERROR|CRITICAL):[\w.]+:)")
_PACKAGES = ("site-packages", "dist-packages", "/lib/python", "<frozen")
TRACEBACK = "Traceback (most recent call last)"


def _body(t: str) -> str:
    """The line without a logging library's record head (what Python printed)."""
    m = _RECORD_HEAD.match(t)
    return t[m.end():] if m else t


def _failing(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """A line that looks like a failure: kept (the first few) for `job.unrecognised` and
    `job.exception`; an exception line closes its rank's traceback."""
    m = _EXCEPTION.match(_body(t))
    rank = rank_of(line)
    if m:
        ev.tracebacks.pop(rank, None)
    if len(ev.failing) >= 64 or sig_end.ignored(facts, line, m is not None):
        return
    if m:
        frame = facts.get("frame")
        where = ("framework" if frame and any(p in frame[0] for p in _PACKAGES) else "user"
                 if frame else "")
        ev.add(Failing(kind="exception", line=t.strip(), rank=rank,
                                  host=line.host, name=m.group("name"), where=where,
                                  frame=f"{frame[0]}:{frame[1]}" if frame else ""),
               key=("exception", t.strip()[:200], rank))
    elif _ERROR_LINE.search(t) and "WARN" not in t:
        ev.add(Failing(kind="error", line=t.strip(), rank=rank,
                                  host=line.host),
               key=("error", t.strip()[:200], rank))


def _frame(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """The innermost frame of a traceback so far: where its exception was raised; the rank's
    traceback stays open until an exception line closes it (`cut_tracebacks`)."""
    if m := _FRAME.match(_body(t)):
        facts["frame"] = (m.group("file"), m.group("line"))
        _open(ev, line, t, f"{m.group('file')}:{m.group('line')}")


def _traceback(ev: Events, line: Line, t: str, ahead: deque[Line],
               facts: dict[str, Any]) -> None:
    """A traceback's heading (Python's, or rich's box title): its rank's traceback is open."""
    facts["frame"] = None
    _open(ev, line, t, "")


def _open(ev: Events, line: Line, t: str, frame: str) -> None:
    """The rank's traceback is open at this line (cheap: a frame line is common; the failure is
    made, and placed, only for a traceback still open at the end)."""
    rank = rank_of(line)
    seen = ev.tracebacks.get(rank)
    if seen is None and len(ev.tracebacks) >= 64:
        return
    ev.tracebacks[rank] = (line, ev.lines, frame or (seen[2] if seen else ""))


def cut_tracebacks(ev: Events) -> None:
    """The tracebacks no exception line closed by the end of the logs: each a failure whose
    exception line was cut off (kept with the failure-looking lines), placed where its last
    line was read."""
    for rank, (line, seq, frame) in ev.tracebacks.items():
        if len(ev.failing) < 64:
            x = Failing(kind="traceback", line=line.text.strip(), rank=rank, host=line.host,
                        frame=frame, source=line.source, number=line.number, seq=seq,
                        time=stamp(line.raw or line.text),
                        local=local_rank(line.raw) if line.raw else None)
            ev.failing.append(x)
    ev.tracebacks.clear()


FAILING_WORDS = ("Error", "Exception", "Exit", "Interrupt", "Failure", "Fault", "ERROR",
                 "error:", "FATAL", "fatal error", "CRITICAL")

READERS = [
    *((trigger, reader(sigs)) for trigger, sigs in _TRIGGERS.items()),
    *((w, _failing) for w in FAILING_WORDS), ('File "', _frame), (TRACEBACK, _traceback),
]
