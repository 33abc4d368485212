"""Which family an exception belongs to when no signature names it: from its type, the package
whose frames raised it, and (for a non-finite loss) its words.

Why a table: an exception line is a rank's own account of its failure (`Type: message`), and
the type with the raising package already says what kind of failure it is (a compiler's, a
kernel library's, the network's, the user's code) for exceptions no signature was written for.
The rows were read off real job logs (tests/fixtures/job-logs: the exception types they raise
and the packages in their frames). Some types are consequences, not causes: a launcher reporting
its child's failure, a collective aborted because a peer died; those never lead (`consequence`).
Pure data and one function; nothing here reads a log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from megatron_env import recipes

# exception type -> family (families.FAMILIES' names)
BY_TYPE: dict[str, str] = {
    # torch.compile: dynamo, inductor, Triton's compiler
    "BackendCompilerFailed": "compiler", "InductorError": "compiler",
    "LoweringException": "compiler", "CompilationError": "compiler",
    "TorchRuntimeError": "compiler",
    # rendezvous and stores (torch.distributed.elastic, c10d), name resolution
    "DistNetworkError": "network", "DistStoreError": "network", "gaierror": "network",
    "RendezvousConnectionError": "network", "RendezvousTimeoutError": "network",
    "RendezvousClosedError": "network",
    # numerics
    "FloatingPointError": "numerics",
    # the data pipeline
    "UnidentifiedImageError": "data", "DecodeError": "data",
    # an installation that does not match (a kernel built for another torch, a missing module)
    "ImportError": "framework", "ModuleNotFoundError": "framework",
    "AcceleratorError": "framework", "SafetensorError": "framework",
    # host memory
    "MemoryError": "host",
}

# exception types that report another process's failure, or a collective a dead peer aborted
CONSEQUENCES = frozenset({
    "ChildFailedError", "CalledProcessError", "ProcessExitedException",
    "ProcessRaisedException", "SystemExit", "KeyboardInterrupt", "RayActorError",
    "ActorDiedError", "RayTaskError", "DistBackendError", "HorovodInternalError",
})
# words of an exception that only says a collective failed because of someone else
_CONSEQUENCE_WORDS = re.compile(
    r"Watchdog caught collective operation timeout|NCCL communicator was aborted|"
    r"Connection reset by peer|Broken pipe|remote process exited|Socket Timeout")

# a package in the innermost frame's path -> family (the kernel packages this project builds
# come from its recipes, `_kernel_packages`, which alone name them)
BY_PACKAGE: list[tuple[str, str]] = [
    ("torch/_inductor", "compiler"), ("torch\\_inductor", "compiler"),
    ("torch/_dynamo", "compiler"), ("torch\\_dynamo", "compiler"),
    ("/triton/", "compiler"), ("\\triton\\", "compiler"),
    # Megatron's argument checks: the run's configuration, which the user writes
    ("megatron/training/arguments.py", "user"),
    # other kernel libraries and the frameworks: an installation or framework fault
    ("xformers", "framework"), ("deep_ep", "framework"), ("grouped_gemm", "framework"),
    ("bitsandbytes", "framework"), ("mamba_ssm", "framework"), ("causal_conv1d", "framework"),
    ("/megatron/", "framework"), ("/nemo/", "framework"), ("/deepspeed/", "framework"),
]


@cache
def _kernel_packages() -> tuple[str, ...]:
    """The import names of the kernel packages the recipes build (a frame inside one is a
    kernel library's error: the framework family's)."""
    return tuple(r.name.replace("-", "_") for r in recipes.declared().values())
_NON_FINITE = re.compile(r"\b(?:nan|inf|non-finite|not finite)\b.*\b(?:loss|grad)|"
                         r"\b(?:loss|grad)\w*\b.*\b(?:nan|inf|non-finite|not finite)\b", re.I)


@dataclass(frozen=True)
class Kind:
    family: str
    consequence: bool


def classify(name: str, frame: str, line: str, where: str) -> Kind:
    """The family of an exception `name` raised at `frame` (innermost frame `file:line`, or
    empty), its printed `line`, and `where` ("user", "framework" or ""), and whether it is only
    a consequence of another process's failure."""
    consequence = name in CONSEQUENCES or _CONSEQUENCE_WORDS.search(line) is not None
    if _NON_FINITE.search(line):
        return Kind("numerics", consequence)
    if name in BY_TYPE:
        return Kind(BY_TYPE[name], consequence)
    path = frame.rsplit(":", 1)[0]
    if any(f"/{name}/" in path or f"\\{name}\\" in path for name in _kernel_packages()):
        return Kind("framework", consequence)
    for part, fam in BY_PACKAGE:
        if part in path:
            return Kind(fam, consequence)
    if consequence:
        return Kind("communication", True)
    return Kind(where or "user", False)
