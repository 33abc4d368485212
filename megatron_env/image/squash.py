"""The image flattened into one squashfs for enroot/pyxis (and Apptainer, which runs plain
squashfs too): the layers' winning entries (whiteouts applied, a later layer's file over an
earlier one's) streamed as one tar into `mksquashfs - OUT -tar`, with the reproducibility
flags pinned: every file root-owned, every time the epoch, no extended attributes, zstd.
enroot reads the container's environment from /etc/environment and its command from /etc/rc
(what `enroot import` writes from an image's config): both are written here from the config.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from pathlib import Path
from typing import IO, Any

from megatron_env import files, output, proc
from megatron_env.errors import UserError
from megatron_env.image import oci
from megatron_env.image.tarlayer import CHUNK

FLAGS = ("-noappend", "-no-xattrs", "-all-root", "-comp", "zstd", "-no-progress", "-quiet")
ENROOT_FILES = ("etc/environment", "etc/rc", "etc/rc.local")


def _norm(name: str) -> str:
    name = name[2:] if name.startswith("./") else name
    return name.strip("/")


def _whiteout(name: str) -> tuple[str, bool] | None:
    """(the path a whiteout entry removes, opaque?) or None for an ordinary entry."""
    head, _, leaf = name.rpartition("/")
    if leaf == ".wh..wh..opq":
        return head, True
    if leaf.startswith(".wh."):
        return (f"{head}/{leaf[4:]}" if head else leaf[4:]), False
    return None


def winners(layers: list[oci.Layer]) -> dict[str, int]:
    """path -> the index of the layer whose entry the flattened image keeps."""
    keep: dict[str, int] = {}
    for i, layer in enumerate(layers):
        with tarfile.open(layer.path, mode="r|*", bufsize=CHUNK) as tar:
            for m in tar:
                name = _norm(m.name)
                wh = _whiteout(name)
                if wh is not None:
                    gone, opaque = wh
                    below = gone + "/"
                    for k in [k for k in keep if k.startswith(below) or (k == gone and not opaque)]:
                        del keep[k]
                    continue
                if m.isdev() and name.startswith("dev/"):
                    continue  # enroot and the runtimes make /dev themselves
                keep[name] = i
    for name in ENROOT_FILES:
        keep.pop(name, None)
    return keep


def enroot_files(config: dict[str, Any]) -> dict[str, bytes]:
    """/etc/environment, /etc/rc and /etc/rc.local as enroot derives them from a config."""
    c = config.get("config") or {}
    env = "".join(f"{e}\n" for e in c.get("Env") or [])
    labels = "".join(f"# {k} {v}\n" for k, v in sorted((c.get("Labels") or {}).items()))
    entry = " ".join(shlex.quote(a) for a in c.get("Entrypoint") or [])
    cmd = " ".join(shlex.quote(a) for a in c.get("Cmd") or []) or ("" if entry else "/bin/sh")
    workdir = c.get("WorkingDir") or "/"
    rc = (labels + ("\n" if labels else "")
          + f"mkdir -p {shlex.quote(workdir)} 2> /dev/null\n"
          + f"cd {shlex.quote(workdir)} && unset OLDPWD || exit 1\n\n"
          + "if [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\n"
          + f"if [ $# -gt 0 ]; then\n    exec {entry} \"$@\"\nelse\n    exec {entry} {cmd}\nfi\n")
    local = ("# This file is sourced by /etc/rc when the container starts.\n"
             "# It can be used to manipulate the entrypoint or the command of the container.\n")
    return {"etc/environment": env.encode(), "etc/rc": rc.replace("exec  ", "exec ").encode(),
            "etc/rc.local": local.encode()}


def _stream(layers: list[oci.Layer], keep: dict[str, int], extra: dict[str, bytes],
            epoch: int, sink: IO[bytes]) -> None:
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as out:
        for i, layer in enumerate(layers):
            with tarfile.open(layer.path, mode="r|*", bufsize=CHUNK) as tar:
                for m in tar:
                    name = _norm(m.name)
                    if not name or keep.get(name) != i:
                        continue
                    m.name = name
                    if m.islnk():
                        m.linkname = _norm(m.linkname)
                    m.mtime, m.uid, m.gid, m.uname, m.gname = epoch, 0, 0, "", ""
                    m.pax_headers = {}
                    out.addfile(m, tar.extractfile(m) if m.isfile() else None)
        for name, data in sorted(extra.items()):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime, ti.mode = len(data), epoch, 0o644
            out.addfile(ti, io.BytesIO(data))


def write(layers: list[oci.Layer], config: dict[str, Any], dest: Path, epoch: int,
          echo: output.Echo = output.status) -> None:
    """The squashfs at `dest`, published whole (a temporary beside it, then renamed)."""
    exe = proc.which("mksquashfs")
    if exe is None:
        raise UserError("--sqsh needs mksquashfs (squashfs-tools 4.5 or newer) and it is not "
                        "installed", fix="apt-get install squashfs-tools",
                        kind="image.tool-missing")
    echo(f"sqsh: flattening {len(layers)} layers")
    keep = winners(layers)
    extra = enroot_files(config)
    with files.publishing(dest) as tmp:
        argv = [exe, "-", str(tmp), "-tar", *FLAGS, "-all-time", str(epoch),
                "-mkfs-time", str(epoch)]
        r = proc.feed(argv, lambda sink: _stream(layers, keep, extra, epoch, sink))
        if not r.ok:
            files.child_full(r.output, dest.parent, dest.name)
            raise UserError(f"mksquashfs failed: {r.tail(4)}",
                            fix="check the disk beside --sqsh and squashfs-tools (4.5+: -tar)",
                            kind="image.sqsh-failed")
