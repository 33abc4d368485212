"""A compile job of the shared pool (kernels.slots): `slot_client.py COMPILER ARGS...` asks the
broker for a slot, waits for it, then becomes the compiler, the socket still open: the broker
sees the slot free when every process holding it has exited. Run as a script (`python -S`,
started once per object: it imports nothing of megatron_env). Without a broker in the
environment, or inside a job that holds a slot already (nvcc's host compiler), it only execs.
An nvcc job with --split-compile=N asks for N slots and is given between 1 and N: it then
runs on as many threads as it got."""

from __future__ import annotations

import os
import re
import socket
import sys

SOCKET_ENV = "MEGATRON_ENV_SLOTS"
KERNEL_ENV = "MEGATRON_ENV_SLOTS_KERNEL"
HELD_ENV = "MEGATRON_ENV_SLOT_HELD"


def output_of(argv: list[str]) -> str:
    """The object a command writes: `-o X`, `-oX`, `--output-file X` or `--output-file=X`."""
    for i, a in enumerate(argv):
        if a in ("-o", "--output-file", "-output-file") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--output-file="):
            return a.split("=", 1)[1]
        if a.startswith("-o") and len(a) > 2 and not a.startswith("-o-"):
            return a[2:]
    return ""


_SPLIT = re.compile(r"(-{1,2}split-compile)(=|\s+)(\d+)")


def split_of(argv: list[str], environ: dict[str, str]) -> int:
    """How many threads an nvcc job optimises on (--split-compile=N in its command or in
    NVCC_APPEND_FLAGS, which nvcc reads itself); 1 for any other compiler."""
    if os.path.basename(argv[0]) != "nvcc":
        return 1
    found = _SPLIT.findall(" ".join(argv[1:]) + " " + environ.get("NVCC_APPEND_FLAGS", ""))
    return max([int(n) for _f, _s, n in found] or [1])


def resize(argv: list[str], environ: dict[str, str], n: int) -> list[str]:
    """The nvcc job on `n` threads, the slots granted (in its command and in NVCC_APPEND_FLAGS)."""
    def sub(text: str) -> str:
        return _SPLIT.sub(lambda m: f"{m.group(1)}{m.group(2)}{n}", text)
    if "NVCC_APPEND_FLAGS" in environ:
        environ["NVCC_APPEND_FLAGS"] = sub(environ["NVCC_APPEND_FLAGS"])
    out, i = [], 0
    while i < len(argv):  # "--split-compile N" spans two arguments
        if argv[i] in ("--split-compile", "-split-compile") and i + 1 < len(argv):
            out += [argv[i], str(n)]
            i += 2
            continue
        out.append(sub(argv[i]))
        i += 1
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("slot_client.py: no compiler given", file=sys.stderr)
        return 2
    where = os.environ.get(SOCKET_ENV)
    if where and not os.environ.get(HELD_ENV):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(where)
        except OSError:  # the pool has closed: the build is ending anyway
            s.close()
        else:
            kernel = os.environ.get(KERNEL_ENV, "")
            want = split_of(argv, dict(os.environ))
            s.sendall(f"{kernel}\t{output_of(argv)}\t{want}\n".encode())
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = s.recv(16)
                if not chunk:
                    print(f"slot_client.py: the pool of compile jobs closed before "
                          f"{argv[0]} could start", file=sys.stderr)
                    return 1
                answer += chunk
            got = answer.split()
            n = int(got[1]) if len(got) > 1 and got[1].isdigit() else 1
            if want > 1:  # nvcc's --split-compile threads: as many as slots were granted
                env = dict(os.environ)
                argv = resize(argv, env, n)
                os.environ.update(env)
            os.set_inheritable(s.fileno(), True)
            os.environ[HELD_ENV] = "1"
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"slot_client.py: cannot run {argv[0]}: {e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
