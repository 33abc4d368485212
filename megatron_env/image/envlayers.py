"""The environment's layers: the lock's packages installed into a staging venv with uv, then
each layer made of exactly the files its distributions' RECORDs name (so a package lands in
one layer, and a changed pin changes only the layer that holds it).

The staging venv lives in a scratch directory, but the image holds it at `prefix`
(/opt/megatron-env/env): every byte that would name the staging path is made to name the image's
instead, as an install at the final path would have written it. Script shebangs are rewritten
(and their RECORD rows with them), bytecode is compiled by `compileall -s STAGE -p PREFIX` with
hash-based invalidation (an image's file times are the epoch, never the source's), and the
venv's own files (pyvenv.cfg, bin/python) are written for the base's interpreter. The layer
writer then refuses any file that still holds the staging path. This works unprivileged;
installing at the final path would need a private mount namespace (root or user namespaces).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from megatron_env import output, proc
from megatron_env.errors import UserError
from megatron_env.image.tarlayer import LayerWriter, Written, parents
from megatron_env.pyenv import lock, uv

PREFIX = "/opt/megatron-env/env"  # the environment inside the image
MEGATRON_AT = "/opt/megatron-env/Megatron-LM"
# The distributions of the torch layer: torch and what moves with it (the CUDA libraries)
HEAVY_NAMES = ("torch", "triton")
HEAVY_PREFIXES = ("nvidia-", "cuda-")


def heavy(name: str) -> bool:
    return name in HEAVY_NAMES or name.startswith(HEAVY_PREFIXES)


def split_pins(lock_text: str) -> tuple[set[str], set[str]]:
    """(the torch layer's package names, the rest) of a lock."""
    names = set(lock.parse_lock(lock_text))
    return {n for n in names if heavy(n)}, {n for n in names if not heavy(n)}


@dataclass
class Staged:
    """A staging venv and the files (relative to it) that each distribution installed."""

    root: Path
    minor: str
    dists: dict[str, list[str]] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)  # rewritten files: path -> bytes

    @property
    def site(self) -> str:
        return f"lib/python{self.minor}/site-packages"


def venv(python: str, stage: Path, echo: output.Echo) -> None:
    r = proc.run([uv.exe(), "venv", "-q", "--python", python, "--no-project", str(stage)],
                 env=uv.env(), timeout=300)
    if not r.ok:
        raise uv.cache_problem(r.output) or UserError(
            f"uv venv failed: {r.tail(4)}", fix="check the interpreter", kind="env.venv-failed")


def install(stage: Path, what: list[str], echo: output.Echo, hashed: bool = True) -> None:
    """`what` (a lock file, or wheel files) into the staging venv: no dependencies, wheels for
    the lock's platform (manylinux_2_28, whatever the build host's C library is)."""
    argv = [uv.exe(), "pip", "install", "-q", "--python", str(stage / "bin" / "python"),
            "--no-deps", "--python-platform", lock.PLATFORM, "--link-mode", "copy"]
    argv += ["--require-hashes", "-r", *what] if hashed else what
    r = proc.run(argv, env=uv.env(), timeout=None)
    uv.raise_for_cache(r)
    if not r.ok:
        raise UserError(f"uv could not install the lock into the image's staging venv:\n"
                        f"{r.tail(6)}", fix="check the index or --find-links (UV_FIND_LINKS) "
                                            "serves the lock's files", kind="env.install-failed")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def collect(stage: Path, minor: str, prefix: str) -> Staged:
    """Every distribution of the staging venv with its files; scripts rewritten for `prefix`."""
    st = Staged(stage, minor)
    site = stage / st.site
    old, new = str(stage).encode(), prefix.encode()
    for info in sorted(site.glob("*.dist-info")):
        record = info / "RECORD"
        if not record.is_file():
            raise UserError(f"{info.name} has no RECORD: its files cannot be told apart",
                            fix="reinstall it from a wheel", kind="image.no-record")
        name = re.sub(r"[-_.]+", "-", info.name.split("-")[0]).lower()
        rows = list(csv.reader(io.StringIO(record.read_text())))
        out_rows, paths = [], []
        for row in rows:
            if not row:
                continue
            full = os.path.normpath(site / row[0])
            rel = os.path.relpath(full, stage)
            if rel.startswith(".."):
                raise UserError(f"{info.name}: RECORD names {row[0]}, outside the environment",
                                fix="a wheel that installs outside its prefix cannot go into "
                                    "an image", kind="image.no-record")
            p = stage / rel
            if rel.startswith("bin/") and p.is_file() and not p.is_symlink():
                body = p.read_bytes()
                if old in body:
                    body = body.replace(old, new)
                    st.data[rel] = body
                    row = [row[0], _record_hash(body), str(len(body))]
            out_rows.append(row)
            if rel != os.path.relpath(record, stage):
                paths.append(rel)
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(out_rows)
        st.data[os.path.relpath(record, stage)] = buf.getvalue().encode()
        paths.append(os.path.relpath(record, stage))
        st.dists[name] = paths
    return st


def compile_bytecode(python: str, tree: Path, strip: Path, prefix: str) -> None:
    """Bytecode for every module under `tree`, naming `prefix` instead of `strip`; checked by
    the source's hash, never its time (the image's times are all the epoch)."""
    proc.run([python, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode",
              "unchecked-hash", "-s", str(strip), "-p", prefix, str(tree)],
             env={**os.environ, "PYTHONHASHSEED": "0"}, timeout=None)
    # a module that does not compile (a test fixture in Python 2) keeps no bytecode, as pip's


def with_bytecode(st: Staged, paths: Iterable[str], tag: str) -> list[str]:
    out = []
    for rel in paths:
        out.append(rel)
        if rel.endswith(".py"):
            d, _, leaf = rel.rpartition("/")
            pyc = f"{d + '/' if d else ''}__pycache__/{leaf[:-3]}.{tag}.pyc"
            if (st.root / pyc).is_file():
                out.append(pyc)
    return out


def skeleton(minor: str, base_python: str) -> dict[str, tuple[str, str | bytes]]:
    """The venv's own files for the image: relative path -> ("link", target) | ("data", bytes)."""
    home = base_python.rsplit("/", 1)[0]
    cfg = (f"home = {home}\ninclude-system-site-packages = false\nversion = {minor}\n"
           f"executable = {base_python}\n")
    return {"pyvenv.cfg": ("data", cfg.encode()),
            "bin/python": ("link", base_python),
            "bin/python3": ("link", "python"),
            f"bin/python{minor}": ("link", "python"),
            "lib64": ("link", "lib"),
            f"lib/python{minor}/site-packages": ("dir", "")}


def write_layer(dest: Path, epoch: int, prefix: str, stage: Path, files_: Iterable[str],
                data: dict[str, bytes], extra: dict[str, tuple[str, str | bytes]],
                forbidden: tuple[bytes, ...]) -> Written:
    """A layer of `files_` (relative to `stage`, placed under `prefix`), the rewritten `data`
    and the `extra` entries, with every directory above them."""
    top = prefix.strip("/")
    entries: dict[str, tuple[str, str | bytes]] = {}
    for rel in files_:
        if rel in data:
            entries[f"{top}/{rel}"] = ("data", data[rel])
        else:
            entries[f"{top}/{rel}"] = ("path", str(stage / rel))
    for rel, e in extra.items():
        entries[f"{top}/{rel}"] = e
    dirs = [d for d in parents(list(entries)) if d not in entries]
    with LayerWriter(dest, epoch, forbidden) as w:
        for name in sorted([*entries, *dirs]):
            kind, value = entries.get(name, ("dir", ""))
            if kind == "dir":
                w.directory(name)
            elif kind == "link":
                w.symlink(name, str(value))
            elif kind == "data":
                w.data(name, bytes(value) if isinstance(value, bytes) else str(value).encode(),
                       0o755 if name.split("/")[-2:-1] == ["bin"] else 0o644)
            else:
                w.file(name, Path(str(value)))
        return w.close()
