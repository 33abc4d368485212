"""Reading one big log on two cores: the file's logical lines made in a child process while
this one reads the events in them.

Why: on the worst case (nearly every line near a signature) the time splits about evenly
between making the lines (`logfiles.physical`'s block scan, `joblog.lines`' tags and wraps)
and reading them (`events`); each half is Python's per-line work, which one process does on
one core. A forked child runs the first half and sends the lines in batches through a pipe; the
parent reads events as they come. The lines, their order and the tally of what was passed
over are the same as in one process, so the findings are too (checked byte for byte on every
fixture log). Memory stays bounded: the pipe holds a few batches and the child blocks when it
is full. Used only for a regular file of at least `MIN_BYTES` where `fork` exists and a
second core is idle; otherwise, and for standard input, the lines are made in this process.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NamedTuple

from megatron_env.diagnose import joblog, logfiles
from megatron_env.diagnose.joblog import Line
from megatron_env.errors import UserError

MIN_BYTES = 8 << 20  # below this, starting a process costs more than it saves
MODE = "auto"  # "auto": by size and an idle core; "one" or "two" processes (tests, benches)
_BATCH = 2000  # lines a message through the pipe carries
# lines cross the pipe as plain tuples: a NamedTuple pickles through a Python method per line
# (2.4 times the child's pickling time), and tuple.__new__ makes the Line again in C
_as_line = functools.partial(tuple.__new__, Line)


class _Failed(NamedTuple):
    """A UserError raised in the child, as plain fields (its class does not pickle whole)."""

    message: str
    fix: str
    kind: str


def lines(path: Path, hot: logfiles.Hot, tally: logfiles.Tally) -> Iterator[Line]:
    """`joblog.lines(logfiles.physical(path, hot, tally), str(path), searched=True)`, made on
    the other core when the file is big enough; `tally` is filled when the lines end."""
    if not _worth_it(path):
        yield from joblog.lines(logfiles.physical(path, hot, tally), str(path), searched=True)
        return
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_produce, args=(path, hot, send, tally.progress), daemon=True)
    child.start()
    send.close()
    try:
        while True:
            try:
                kind, payload = recv.recv()
            except EOFError:  # the child died without a word (killed): never a short read
                raise RuntimeError(f"the process reading {path} ended early "
                                   f"(exit code {child.exitcode})") from None
            if kind == "lines":
                yield from map(_as_line, payload)
            elif kind == "end":
                tally.skipped, tally.lines, tally.ranks, tail, tally.text = payload
                tally.tail.extend(tail)
                return
            elif kind == "error":
                raise UserError(payload.message, payload.fix,
                                kind=payload.kind or "triage.unreadable")
            else:  # a bug in the child: its traceback, not a silent short read
                raise RuntimeError(f"reading {path} failed in the reading process:\n{payload}")
    finally:
        recv.close()
        child.join(timeout=5)
        if child.is_alive():  # the reader stopped early: the child is ours and no longer needed
            child.terminate()
            child.join()


def _worth_it(path: Path) -> bool:
    if path == logfiles.STDIN or "fork" not in multiprocessing.get_all_start_methods():
        return False
    if MODE != "auto":
        return MODE == "two"
    if not _idle_core():
        return False
    try:
        return os.stat(path).st_size >= MIN_BYTES
    except OSError:
        return False  # the reader in this process says why it cannot be read


def _idle_core() -> bool:
    """Is a second core free? On a machine already busy (a shared node, a loaded laptop) the
    child only adds its pickling to the CPU time and buys no wall time: measured on a 2-core
    machine at load 13, the worst case took 23% more CPU and 40% more wall in two processes."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call: macOS
        cpus = os.cpu_count() or 1
    return cpus >= 2 and os.getloadavg()[0] <= cpus - 1


def _produce(path: Path, hot: logfiles.Hot, send: Connection,
             progress: Callable[[int], None] | None = None) -> None:
    """The child: the lines in batches, then the tally (or the error that stopped them); the
    progress is said from here (fork: the reporter came with the process)."""
    tally = logfiles.Tally()
    tally.progress = progress
    try:
        batch: list[Line] = []
        for line in joblog.lines(logfiles.physical(path, hot, tally), str(path), searched=True):
            batch.append(line)
            if len(batch) >= _BATCH:
                send.send(("lines", list(map(tuple, batch))))
                batch = []
        if batch:
            send.send(("lines", list(map(tuple, batch))))
        send.send(("end", (tally.skipped, tally.lines, tally.ranks, list(tally.tail),
                           tally.text)))
    except UserError as e:
        send.send(("error", _Failed(e.message, e.fix, e.kind)))
    except Exception:  # noqa: BLE001 - handed to the parent, which raises it
        send.send(("crash", traceback.format_exc()))
    finally:
        send.close()
