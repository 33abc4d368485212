"""A small conda channel built in a temporary directory, and a solver stand-in to use it.

The packages are real conda packages (.tar.bz2 with info/index.json and info/paths.json) indexed
by py-rattler; `solver(tmp)` writes an executable named micromamba that runs
tests/conda_stub/micromamba_stub.py with this interpreter.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import sys
import tarfile
import time
from pathlib import Path

STUB = Path(__file__).parent / "conda_stub" / "micromamba_stub.py"


def make_package(channel: Path, subdir: str, name: str, version: str, depends=(),
                 files: dict[str, str] | None = None, links: dict[str, str] | None = None) -> Path:
    """files: path -> content; links: path -> target of a symbolic link (path_type softlink)."""
    files = files or {f"share/{name}/VERSION": version + "\n"}
    links = links or {}
    d = channel / subdir
    d.mkdir(parents=True, exist_ok=True)
    index = {"name": name, "version": version, "build": "0", "build_number": 0,
             "depends": list(depends), "subdir": subdir, "timestamp": int(time.time() * 1000)}
    if subdir == "noarch":
        index["noarch"] = "generic"
    paths = {"paths_version": 1, "paths": [
        {"_path": p, "path_type": "hardlink", "sha256": hashlib.sha256(c.encode()).hexdigest(),
         "size_in_bytes": len(c.encode())} for p, c in files.items()] + [
        {"_path": p, "path_type": "softlink", "sha256": hashlib.sha256(t.encode()).hexdigest(),
         "size_in_bytes": len(t.encode())} for p, t in links.items()]}
    out = d / f"{name}-{version}-0.tar.bz2"
    with tarfile.open(out, "w:bz2") as tar:
        for arc, content in [("info/index.json", json.dumps(index)),
                             ("info/paths.json", json.dumps(paths)), *files.items()]:
            data = content.encode()
            info = tarfile.TarInfo(arc)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for arc, target in links.items():
            info = tarfile.TarInfo(arc)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return out


def build_channel(channel: Path, python: Path | None = None) -> str:
    """python 3.10, two cuda-nvcc versions (the lock must pick 12.1), gxx, ninja. -> file:// URL

    With `python` (a real 3.10 interpreter) the python package makes the prefix a working Python
    (a pyvenv.cfg beside bin/python linked to that interpreter), as conda's own python package
    does, so that packages can be installed into the conda prefix."""
    import rattler

    nvcc = "#!/bin/sh\necho 'Cuda compilation tools, release {v}, V{v}.105'\n"
    if python:
        cfg = f"home = {python.parent}\ninclude-system-site-packages = false\nversion = 3.10.13\n"
        make_package(channel, "linux-64", "python", "3.10.13", files={"pyvenv.cfg": cfg},
                     links={"bin/python": str(python), "bin/python3": str(python)})
    else:
        make_package(channel, "linux-64", "python", "3.10.13")
    make_package(channel, "linux-64", "cuda-nvcc", "12.1.105", files={"bin/nvcc": nvcc.format(v="12.1")})
    make_package(channel, "linux-64", "cuda-nvcc", "12.4.131", files={"bin/nvcc": nvcc.format(v="12.4")})
    make_package(channel, "linux-64", "cuda-cudart-dev", "12.1.105")
    make_package(channel, "linux-64", "cuda-libraries-dev", "12.1.1")
    make_package(channel, "linux-64", "gxx_linux-64", "11.4.0")
    make_package(channel, "noarch", "ninja", "1.11.1", depends=["python"])
    asyncio.run(rattler.index.index_fs(channel, write_zst=False, write_shards=False))
    return channel.resolve().as_uri()


def solver(tmp: Path) -> Path:
    exe = tmp / "bin" / "micromamba"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "$@"\n')
    exe.chmod(0o755)
    return exe


# Any HTTP(S) request goes to a closed port: the conda part must need no network at all.
NO_NETWORK = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
              "NO_PROXY": ""}


def lock_offline(prof, tmp: Path, monkeypatch, python: Path | None = None, echo=print):
    """conda-lock `prof`'s environment.yml with no network: a channel built under `tmp` given as
    the mirror override (as an air-gapped cluster sets it), the solver stand-in and an empty
    local lookup file. -> (conda-lock.yml or None, the solver)"""
    from megatron_env.pyenv import lock_conda

    for k, v in NO_NETWORK.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv(lock_conda.CHANNELS_ENV, build_channel(tmp / "channel", python=python))
    stub = solver(tmp)
    lookup = tmp / "lookup.yml"
    lookup.write_text("{}\n")
    return lock_conda.conda_lock(prof, solver=str(stub), lookup=lookup, echo=echo), stub
