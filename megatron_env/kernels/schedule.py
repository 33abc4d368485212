"""Which waiting compile job starts next in the shared pool: the one with the longest remaining
work (longest-processing-time first, each object's cost plus the longest chain of its kernel's
later stages). Pure: the pool (kernels.slots) and the replay benchmark (bench/setup_replay.py)
call the same code.

Why not first come, first served: a cold setup on a 16-core H100 (942.5 s, 2.05 x its bound)
gave the kernel whose seven objects are the longest (165-235 s) one to three slots while the two
others took the rest; three of its longest objects started at 612 s. With the longest work
first, those start at once and the short objects fill the cores around them.

Costs come from the previous build of the same pins (its ninja logs, kept in the cache beside
its wheel), else from the recipe's declared estimate. A kernel whose objects are known but that
has not asked for a slot yet (its setup.py is still starting) has slots held back for its
objects that outrank the waiting ones, for at most `hold_s` after the pool opened: otherwise the
kernel that starts a second earlier takes every core, whatever its objects cost.
"""

from __future__ import annotations

import fnmatch
import heapq
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from megatron_env.kernels.ninjalog import Step

_TEMP = re.compile(r"(?:^|/)temp\.[^/]+/(.*)$")
_CMAKE = re.compile(r"^(?:.*/)?CMakeFiles/[^/]+\.dir/(.*)$")


# The most slots one nvcc job is given for its --split-compile threads. Its split parts are
# uneven: in the recorded cold setup (bench/results/2026-12-05-h100-cold-setup-e883413) the
# longest object took 235 s with --split-compile=8 and 512 s on one thread in the next run
# (2.2 x for 8 threads), so most of 8 slots would idle; two threads halve the longest objects
# (the critical path) at little loss.
WIDEST = 2


def key(output: str) -> str:
    """One name for an object on both sides: what a compile command's `-o` says and what
    the ninja log recorded ('.../build/temp.linux-x86_64-cpython-312/csrc/x.o' -> 'csrc/x.o';
    'CMakeFiles/te.dir/gemm/g.cu.o' -> 'gemm/g.cu.o')."""
    if m := _TEMP.search(output):
        return m.group(1)
    if m := _CMAKE.match(output):
        return m.group(1)
    return output.lstrip("./")


@dataclass(frozen=True)
class Costs:
    """One kernel's objects: key -> priority (seconds of its own compile plus the longest chain
    of the stages after it), and the declared estimate for an object not recorded."""

    kernel: str
    priority: Mapping[str, float] = field(default_factory=dict)
    estimate: Sequence[tuple[str, float]] = ()  # (fnmatch pattern on the key, seconds)
    source: str = "none"  # "log" (a previous build of the same pins) or "declared"
    ready: tuple[float, ...] = ()  # priorities of the objects it can ask for first, highest first

    def of(self, output: str) -> float:
        """Priority of an object. One not in the record is presumed to gate the rest of its
        kernel (a configure check, a link): the kernel's longest chain, at least its estimate."""
        k = key(output)
        if k in self.priority:
            return self.priority[k]
        guess = next((s for pat, s in self.estimate if fnmatch.fnmatch(k, pat)), 0.0)
        return max(guess, self.longest)

    @property
    def longest(self) -> float:
        return max(self.priority.values(), default=0.0)


def at_once(output: str) -> bool:
    """A job that starts without waiting for a slot and holds none: a compiler probe (no
    output named: `c++ -v`, torch's compiler check), a CMake configure's try-compile (cmTC_*)
    and a link (a .so). Each takes well under a second or two of one core, and the step after
    it (the build's ninja, the next check, the wheel) waits on it: queued behind the objects,
    one kernel's probe held its ninja back 35.7 s (bench/results/2026-12-06-h100-ac60c25), and
    recorded at 0.05-1.1 s a CMake kernel's try-compiles ranked last and held its CMake
    build back. A host compiler's preprocessing for an nvcc outside the pool (-o x.ii) is
    compile work: it waits like an object."""
    return not output or "cmTC_" in output or output.endswith(".so")


def stage(log_name: str) -> int:
    """Where a ninja run sits in its kernel's chain, from the build's structure (ninja logs
    hold no edges): a CMake build (its build directory is named so: a kernel's C++ library)
    comes first; torch's extensions (one ninja each, in temp.<platform> or a directory
    named after the extension) come after it, side by side."""
    return 0 if "cmake" in log_name.lower() else 1


def from_logs(kernel: str, logs: Sequence[tuple[str, Sequence[Step]]],
              estimate: Sequence[tuple[str, float]] = (), slots: int = 16) -> Costs:
    """Costs from one build's ninja logs ((name, steps) per ninja run, as kept in the cache).
    An object's priority is its seconds plus the least time the later stages of its kernel
    take on `slots` jobs (their longest object, or their work spread over the slots)."""
    by_stage: dict[int, list[Step]] = {}
    for name, steps in logs:
        by_stage.setdefault(stage(name), []).extend(steps)
    order = sorted(by_stage)
    least = {i: max(max(s.seconds for s in by_stage[i]),
                    sum(s.seconds for s in by_stage[i]) / slots) for i in order if by_stage[i]}
    prio: dict[str, float] = {}
    first: list[float] = []
    for n, i in enumerate(order):
        tail = sum(least.get(j, 0.0) for j in order[n + 1:])
        for s in by_stage[i]:
            k = key(s.output)
            prio[k] = max(prio.get(k, 0.0), round(s.seconds + tail, 1))
            if n == 0:
                first.append(prio[k])
    return Costs(kernel, prio, tuple(estimate), "log", tuple(sorted(first, reverse=True)))


def expected(costs: Mapping[str, Costs], slots: int) -> dict[str, list[float] | None]:
    """What the Scheduler holds slots for: each kernel's first objects by its recorded costs
    (no more than the slots: a ninja shows its objects in its own order, and every request of
    the kernel takes one off), None for a kernel whose objects are not known."""
    return {k: list(c.ready[:slots]) if c.source == "log" else None for k, c in costs.items()}


@dataclass
class _Wait:
    rid: int
    kernel: str
    priority: float
    width: int = 1  # slots it can use at once (nvcc's --split-compile threads)
    at_once: bool = False  # starts now, holds no slot (kernels.schedule.at_once)


class Scheduler:
    """Grants `slots` compile jobs at once, highest priority first (ties: first asked).

    `expected`: kernel -> priorities of the objects it will ask for first (Costs.ready, the
    first as many as its ninja shows at once), known before it asks. For at most `hold_s` after
    `opened`, a slot stays free for each of those that outranks a waiting job and has not
    asked yet; each request of the kernel takes one off (the one of its priority, else its
    highest). None: not known (a first build of its pins): nothing starts until it asked once,
    so that the kernel whose setup.py starts a second earlier does not take every core.

    `spare_only`: a job gets more than one slot only where no other job waits for it (a slot
    would otherwise idle); the device's second build gave one kernel's six objects two each
    while others waited, and their uneven split parts left 3-5 of 16 cores idle for ~350 s.
    The pool runs with spare_only; the replay (bench/setup_replay.py) gives
    ac60c25's hold_s=30 and spare_only=False to replay the records it made."""

    def __init__(self, slots: int,
                 expected: Mapping[str, Iterable[float] | None] | None = None,
                 opened: float = 0.0, hold_s: float = 30.0, widest: int = WIDEST,
                 spare_only: bool = True) -> None:
        self.slots = slots
        self.widest = widest
        self.spare_only = spare_only
        self._now: list[_Wait] = []
        self.running: dict[int, int] = {}  # request -> slots it holds
        self._heap: list[tuple[float, int, _Wait]] = []
        self._seq = itertools.count()
        self._expected: dict[str, list[float] | None] = {
            k: None if v is None else sorted(v, reverse=True)
            for k, v in (expected or {}).items()}
        self._until = opened + hold_s

    def want(self, rid: int, kernel: str, priority: float, width: int = 1,
             at_once: bool = False) -> None:
        """A compile job asks for a slot, or up to `width` (it can use that many threads; it is
        given between 1 and `width`, as many as are free). `at_once`: it starts at the next
        grants() and holds no slot (a probe, a try-compile, a link: schedule.at_once)."""
        if at_once:  # it asked: an unknown kernel's hold ends (its setup.py is running)
            if kernel in self._expected and self._expected[kernel] is None:
                del self._expected[kernel]
            self._now.append(_Wait(rid, kernel, priority, 0, True))
            return
        exp = self._expected.get(kernel, [])
        if exp is None:
            del self._expected[kernel]
        elif exp:
            exp.remove(priority if priority in exp else exp[0])
        heapq.heappush(self._heap, (-priority, next(self._seq),
                                    _Wait(rid, kernel, priority, max(1, width))))

    def done(self, rid: int) -> None:
        """A job ended (or gave up waiting): its slot is free, or it leaves the queue."""
        if self.running.pop(rid, None) is None:
            self._now = [w for w in self._now if w.rid != rid]
            self._heap = [e for e in self._heap if e[2].rid != rid]
            heapq.heapify(self._heap)

    def forget(self, kernel: str) -> None:
        """A kernel ended without asking (a cache hit, a failure): hold nothing for it."""
        self._expected.pop(kernel, None)

    def waiting(self) -> int:
        return len(self._heap) + len(self._now)

    def busy(self) -> int:
        return sum(self.running.values())

    def grants(self, now: float) -> list[tuple[int, int]]:
        """The jobs to start now, in order, each with the slots it is given."""
        out = []
        for w in self._now:  # they hold no slot
            self.running[w.rid] = 0
            out.append((w.rid, 0))
        self._now = []
        while self._heap and self.busy() < self.slots:
            w = self._heap[0][2]
            held = 0
            if now < self._until:
                if any(v is None for v in self._expected.values()):
                    break
                held = sum(1 for prios in self._expected.values() for p in prios or ()
                           if p > w.priority)
            free = self.slots - self.busy() - held
            if free <= 0:
                break
            heapq.heappop(self._heap)
            spare = free - len(self._heap) if self.spare_only else free
            self.running[w.rid] = max(1, min(w.width, spare, self.widest))
            out.append((w.rid, self.running[w.rid]))
        return out
