"""The shared pool of compile jobs: every compiler a kernel build starts asks this broker for a
slot over a Unix socket and waits; the broker (kernels.schedule) grants the waiting job with
the longest remaining work first.

Why not a make jobserver (the pool before): its tokens go to whoever reads the FIFO first, and
ninja 1.13 reads it only when one of its own jobs ends. The kernel whose seven objects take
150-235 s each started its first on its implicit slot, found the FIFO empty (the two other
kernels' ninjas, with short objects, read it all the time) and did not look again for 185 s:
one to three of its objects ran at once, three of the longest started at 612 s, and the cores
idled at the end (a cold setup on a 16-core H100, 942.5 s, 2.05 x its bound).

How a compiler reaches the broker: the directory `bin_dir()` writes goes first on PATH and holds
`c++`, `g++`, `gcc`, `cc` (torch's extensions call `c++`; CMake finds them there), each
running the real one through `slot_client.py`; torch's nvcc is named by PYTORCH_NVCC, CMake's
by CMAKE_CUDA_COMPILER_LAUNCHER. The client connects, says its kernel and output, waits for
"go", then execs the compiler with the socket open: the slot is free when the compiler and every
process it started have exited (the kernel closes the socket), also when it is killed. A
compiler started by a compiler (nvcc's host compiler) holds no second slot. ninja runs wide
(`-j` of the pool's width): its waiting jobs are asleep in the client, and the broker sees
every ready object of every kernel at once.
"""

from __future__ import annotations

import os
import selectors
import socket
import stat
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from megatron_env import proc
from megatron_env.kernels import schedule

SOCKET_ENV = "MEGATRON_ENV_SLOTS"  # the broker's socket: set, a compiler asks it for a slot
KERNEL_ENV = "MEGATRON_ENV_SLOTS_KERNEL"  # which kernel's build the compiler belongs to
HELD_ENV = "MEGATRON_ENV_SLOT_HELD"  # set in a granted compiler's environment
CLIENT = Path(__file__).with_name("slot_client.py")
WRAPPED = ("c++", "g++", "gcc", "cc")


@dataclass
class Grant:
    """One granted compile job, for the record (tests and benchmarks read the order)."""

    kernel: str
    output: str
    priority: float
    asked: float
    started: float
    slots: int = 1
    ended: float | None = None


@dataclass
class _Conn:
    sock: socket.socket
    rid: int
    buf: bytes = b""
    kernel: str = ""
    output: str = ""
    priority: float = 0.0
    width: int = 1
    asked: float = 0.0
    granted: Grant | None = None


@dataclass
class Broker:
    """Serves `slots` compile jobs from a socket in `where` on a thread of its own."""

    where: Path
    slots: int
    costs: Mapping[str, schedule.Costs] = field(default_factory=dict)
    expected: Mapping[str, list[float] | None] = field(default_factory=dict)
    hold_s: float = 30.0
    grants: list[Grant] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.path = self.where / "slots.sock"
        self.where.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self._t0 = time.monotonic()
        self._sched = schedule.Scheduler(self.slots, self.expected, opened=0.0,
                                         hold_s=self.hold_s)
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._server.listen(512)
        self._server.setblocking(False)
        self._sel.register(self._server, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = os.pipe()
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Conn] = {}
        self._ids = 0
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="compile-slots", daemon=True)
        self._thread.start()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def env(self, kernel: str) -> dict[str, str]:
        """What a kernel's build environment gets so that its compilers ask this broker."""
        return {SOCKET_ENV: str(self.path), KERNEL_ENV: kernel}

    def forget(self, kernel: str) -> None:
        """A kernel's build ended (or never compiles): hold nothing more for it."""
        with self._lock:
            self._sched.forget(kernel)
        os.write(self._wake_w, b"x")

    def close(self) -> None:
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        for c in list(self._conns.values()):
            c.sock.close()
        self._sel.close()
        self._server.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.path.unlink(missing_ok=True)

    # --- the broker's thread --------------------------------------------------------------

    def _serve(self) -> None:
        while not self._closed:
            for k, _ev in self._sel.select(timeout=1.0):
                if k.data == "wake":
                    os.read(self._wake_r, 4096)
                elif k.data is None:
                    self._accept()
                else:
                    self._read(k.data)
            self._grant()

    def _accept(self) -> None:
        try:
            s, _addr = self._server.accept()
        except OSError:
            return
        s.setblocking(False)
        self._ids += 1
        c = _Conn(s, self._ids)
        self._conns[c.rid] = c
        self._sel.register(s, selectors.EVENT_READ, c)

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the compiler ended (or the client gave up waiting)
            self._drop(c)
            return
        if c.kernel or b"\n" not in c.buf + data:
            c.buf += data
            return
        line = (c.buf + data).split(b"\n", 1)[0].decode(errors="replace")
        c.kernel, _tab, rest = line.partition("\t")
        c.output, _tab, width = rest.partition("\t")
        c.width = int(width) if width.isdigit() and int(width) > 0 else 1
        costs = self.costs.get(c.kernel)
        c.priority = costs.of(c.output) if costs else 0.0
        c.asked = self.now()
        with self._lock:  # a probe, a try-compile, a link: at once (schedule.at_once)
            self._sched.want(c.rid, c.kernel, c.priority, c.width,
                             at_once=schedule.at_once(c.output))

    def _drop(self, c: _Conn) -> None:
        self._sel.unregister(c.sock)
        c.sock.close()
        self._conns.pop(c.rid, None)
        if c.kernel:
            with self._lock:
                self._sched.done(c.rid)
        if c.granted:
            c.granted.ended = self.now()

    def _grant(self) -> None:
        with self._lock:
            ready = self._sched.grants(self.now())
        for rid, n in ready:
            c = self._conns.get(rid)
            if c is None:
                continue
            c.granted = Grant(c.kernel, c.output, c.priority, c.asked, self.now(), n)
            self.grants.append(c.granted)
            try:
                c.sock.sendall(f"go {max(1, n)}\n".encode())  # one thread for a slotless job
            except OSError:
                self._drop(c)


def record(grants: list[Grant], kernel: str) -> dict[str, list[list[object]]]:
    """One kernel's compile jobs as the pool ran them: run name -> [output, start, end, slots]
    (seconds from the pool's start), "cmake" for a CMake build's objects (their outputs are
    CMakeFiles/<target>.dir/...: kernels.schedule.stage), "extensions" for the rest. The
    times a ninja log keeps include the wait for a slot; these do not."""
    out: dict[str, list[list[object]]] = {}
    for g in grants:
        if g.kernel != kernel or g.ended is None or not g.output.endswith(".o"):
            continue
        run = "cmake" if "CMakeFiles/" in g.output else "extensions"
        out.setdefault(run, []).append([g.output, round(g.started, 2), round(g.ended, 2),
                                        g.slots])
    return out


def bin_dir(where: Path, path: str, python: str = sys.executable) -> Path:
    """A directory to put first on PATH: `c++`, `g++`, `gcc`, `cc` (those found on `path`)
    each running the real one through the slot client, and `slot` (the client itself, for
    PYTORCH_NVCC and CMAKE_<LANG>_COMPILER_LAUNCHER)."""
    d = where / "slot-bin"
    d.mkdir(parents=True, exist_ok=True)
    _script(d / "slot", f'exec {sh_quote(python)} -S {sh_quote(str(CLIENT))} "$@"\n')
    for name in WRAPPED:
        real = proc.which(name, path=path)
        if real:
            _script(d / name, f'exec {sh_quote(python)} -S {sh_quote(str(CLIENT))} '
                              f'{sh_quote(real)} "$@"\n')
    return d


def env_compilers(where: Path, environ: Mapping[str, str], path: str,
                  python: str = sys.executable) -> dict[str, str]:
    """CC and CXX, where the environment sets them (an image's CXX=/usr/bin/g++ is found before
    PATH: torch's extensions and CMake take it), each through the slot client: var -> a
    wrapper of the same file name (torch accepts a compiler by its name: g++, gcc, clang++)."""
    out = {}
    for var in ("CC", "CXX"):
        words = environ.get(var, "").split()
        if not words:
            continue
        real = words[0] if os.sep in words[0] else proc.which(words[0], path=path)
        if not real:
            continue
        d = where / "slot-env" / var.lower()
        d.mkdir(parents=True, exist_ok=True)
        f = d / Path(real).name
        _script(f, f'exec {sh_quote(python)} -S {sh_quote(str(CLIENT))} '
                   + " ".join(sh_quote(w) for w in [real, *words[1:]]) + ' "$@"\n')
        out[var] = str(f)
    return out


def _script(f: Path, body: str) -> None:
    f.write_text("#!/bin/sh\n# a compile job of the shared pool (written by megatron-env)\n"
                 + body)
    f.chmod(f.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def sh_quote(s: str) -> str:
    """`s` as one word of a POSIX shell script, always in single quotes."""
    return "'" + s.replace("'", "'\\''") + "'"
