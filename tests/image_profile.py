"""A small profile for the image tests: Python 3.11 (Debian bookworm's python3), a torch, an
nvidia-* library and two small packages as local wheels the tests build (a real resolution by
uv from a local wheelhouse, a real lock), Megatron a local bare repository. Nothing of torch's
2.6 GB: the layers, their split and their bytes are what the tests look at."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from .gitrepo import git
from .test_lock import copy_repo
from .test_setup import make_upstream

NAME = "small-py311"
PYTHON = "3.11"


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(house: Path, name: str, version: str, files: dict[str, bytes], *,
          requires: tuple[str, ...] = (), scripts: dict[str, str] | None = None,
          tag: str = "py3-none-any") -> Path:
    """A wheel of `files` (path in site-packages -> bytes), as a build backend writes one."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    meta = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    body = {**files, f"{info}/METADATA": meta,
            f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                             f"Tag: {tag}\n".encode()}
    if scripts:
        body[f"{info}/entry_points.txt"] = ("[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in scripts.items())).encode()
    rows = [[p, _digest(d), str(len(d))] for p, d in sorted(body.items())]
    rows.append([f"{info}/RECORD", "", ""])
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    body[f"{info}/RECORD"] = buf.getvalue().encode()
    out = house / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(out, "w") as z:
        for p in sorted(body):
            zi = zipfile.ZipInfo(p, (2020, 1, 1, 0, 0, 0))
            z.writestr(zi, body[p])
    return out


def wheelhouse(house: Path, small_version: str = "1.0") -> Path:
    house.mkdir(parents=True, exist_ok=True)
    wheel(house, "torch", "2.1.0",
          {"torch/__init__.py": b"__version__ = '2.1.0'\nimport nvidia.cublas\n",
           "torch/lib/libtorch_stub.so": b"\x7fELF torch stand-in\n"},
          requires=("nvidia-cublas-cu12==12.1.3.1", "filelock-small"),
          scripts={"torchrun": "torch:main"})
    wheel(house, "nvidia-cublas-cu12", "12.1.3.1",
          {"nvidia/__init__.py": b"", "nvidia/cublas/__init__.py": b"",
           "nvidia/cublas/lib/libcublas.so.12": b"\x7fELF cublas stand-in\n" * 64},
          tag="py3-none-manylinux1_x86_64")
    wheel(house, "filelock-small", "3.0", {"filelock_small.py": b"LOCKED = True\n"})
    for v in sorted({"1.0", "1.1", small_version}):
        wheel(house, "smallpkg", v, {"smallpkg/__init__.py": f"VERSION = '{v}'\n".encode()},
              scripts={"smallpkg": "smallpkg:main"})
    _simple(house)
    return house


def _simple(house: Path) -> None:
    """A PEP 503 index of the wheelhouse (house/simple/NAME/index.html): the lock resolves from
    it as from an index, and from nothing else."""
    by_name: dict[str, list[Path]] = {}
    for w in sorted(house.glob("*.whl")):
        by_name.setdefault(w.name.split("-")[0].replace("_", "-").lower(), []).append(w)
    for name, wheels in by_name.items():
        d = house / "simple" / name
        d.mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="../../{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">'
                        f"{w.name}</a>\n" for w in wheels)
        (d / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


PROFILE = """\
description = "a small profile for the image tests"

[python]
version = "3.11"

[cuda]
version = "12.1"
min_driver = "530.30.02"
archs = ["8.0", "9.0"]

[torch]
version = "2.1.0"

[megatron]
repo = "{repo}"
tag = "core_v0.4.0"
commit = "{commit}"

[kernels.apex]
commit = "52e18c894223800cb611682dce27d88050edf1de"
variants = ["cpp_ext"]

[requirements]
packages = ["smallpkg=={small}"]

[conda]
channels = ["conda-forge"]
packages = ["ninja"]
"""


def tool_env(house: Path) -> dict[str, str]:
    """uv and pip see only the local wheelhouse."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_FIND", "UV_NO",
                                                                       "UV_INDEX", "UV_DEFAULT"))}
    return {**base, "UV_DEFAULT_INDEX": (house / "simple").as_uri(), "COLUMNS": "250",
            "UV_PYTHON_DOWNLOADS": "never"}


def invoke(repo: Path, *args: str, env: dict[str, str], timeout: float = 1800
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=repo,
                          env={**env, "PYTHONPATH": str(repo)}, capture_output=True, text=True,
                          timeout=timeout)


def make_repo(root: Path, house: Path, small: str = "1.0",
              upstream: tuple[Path, Path, str] | None = None) -> Path:
    """A copy of this checkout with the small profile, its lock made by `invoke lock` from the
    local wheelhouse, committed (the image's epoch is the lock's commit time)."""
    _work, bare, commit = upstream or make_upstream(root)
    repo = copy_repo(root)
    d = repo / "envs" / NAME
    d.mkdir(parents=True)
    (d / "profile.toml").write_text(PROFILE.format(repo=bare, commit=commit, small=small))
    r = invoke(repo, "lock", "--profile", NAME, env=tool_env(house))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "small profile", cwd=repo)
    return repo


def set_small(repo: Path, house: Path, version: str) -> None:
    """Move smallpkg's pin and lock again (committed)."""
    prof = repo / "envs" / NAME / "profile.toml"
    text = prof.read_text()
    import re

    prof.write_text(re.sub(r'"smallpkg==[^"]+"', f'"smallpkg=={version}"', text))
    r = invoke(repo, "lock", "--profile", NAME, env=tool_env(house))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    git("commit", "-qam", f"smallpkg {version}", cwd=repo)
