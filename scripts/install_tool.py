#!/usr/bin/env python3
"""install_tool.py - install megatron-env from a bundle's own wheels, checked, with no index.

    python3.X install_tool.py BUNDLE VENV      # BUNDLE: the .tar, or the directory it was unpacked into

Standard library only: it runs before the tool exists on the node. Every file of the bundle's
tool/ must be listed in its manifest.json with that sha256, and every listed one must be there:
an extra, changed or missing wheel refuses the install by name before anything is installed.
Then pip installs exactly tool/requirements.txt (each wheel pinned by sha256) with --no-index
--require-hashes into VENV (created with this interpreter when absent). Get the script out of an
archive first with `tar xf BUNDLE.tar source/scripts/install_tool.py`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath


class Refused(Exception):
    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


def _sha256(data_or_path) -> str:
    h = hashlib.sha256()
    if isinstance(data_or_path, bytes):
        h.update(data_or_path)
        return h.hexdigest()
    with open(data_or_path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _from_archive(bundle: Path, into: Path) -> dict:
    """manifest.json and the members under tool/ (each a plain file with a safe name)."""
    doc = None
    try:
        with tarfile.open(bundle) as tar:
            for m in tar:
                name = PurePosixPath(m.name).as_posix().removeprefix("./")
                if name == "manifest.json" and m.isfile():
                    doc = json.loads(tar.extractfile(m).read())
                elif name.startswith("tool/") and not m.isdir():
                    if not m.isfile() or ".." in PurePosixPath(name).parts:
                        raise Refused(f"{bundle}: member {m.name} is not a plain file",
                                      "use the bundle as `invoke bundle` wrote it")
                    target = into / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(m).read())
    except (tarfile.TarError, EOFError, OSError) as e:
        raise Refused(f"{bundle} cannot be read as a bundle ({type(e).__name__}: {e}); "
                      "truncated or not a bundle", "copy the bundle again") from None
    if doc is None:
        raise Refused(f"{bundle} has no manifest.json", "pass the .tar `invoke bundle` wrote")
    return doc


def check(root: Path, doc: dict) -> list[str]:
    """Refuse tool/ unless it holds exactly the manifest's tool files; -> their names."""
    listed = {f: meta for f, meta in doc["files"].items() if f.startswith("tool/")}
    present = {f"tool/{p.relative_to(root / 'tool').as_posix()}"
               for p in (root / "tool").rglob("*") if not p.is_dir()}
    extra = sorted(present - set(listed))
    missing = sorted(set(listed) - present)
    changed = sorted(f for f in present & set(listed)
                     if (root / f).is_symlink() or _sha256(root / f) != listed[f]["sha256"])
    problems = [f"{len(x)} {what}: {', '.join(x[:6])}" for x, what in
                ((extra, "not in manifest.json"), (changed, "changed"), (missing, "missing"))
                if x]
    if "tool/requirements.txt" not in listed:
        problems.append("no tool/requirements.txt (a bundle from an older megatron-env)")
    if problems:
        raise Refused("the tool's wheels do not match the bundle's manifest ("
                      + "; ".join(problems) + "); nothing was installed",
                      "copy the bundle again from where it was made")
    return sorted(listed)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    bundle, venv = Path(argv[0]).absolute(), Path(argv[1]).absolute()
    try:
        with tempfile.TemporaryDirectory(prefix="megatron-env-tool-") as tmp:
            if bundle.is_dir():
                root = bundle
                doc = json.loads((bundle / "manifest.json").read_text())
            else:
                root = Path(tmp)
                doc = _from_archive(bundle, root)
            want = doc.get("python", "")
            have = f"{sys.version_info[0]}.{sys.version_info[1]}"
            if want != have:
                raise Refused(f"the bundle's tool wheels are for Python {want}; this is "
                              f"Python {have}", f"run it with python{want}")
            names = check(root, doc)
            if not (venv / "bin" / "python").exists():
                subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            r = subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q",
                                "--no-index", "--require-hashes", "--find-links", root / "tool",
                                "-r", root / "tool" / "requirements.txt"])
            if r.returncode:
                raise Refused(f"pip refused the tool's wheels (exit {r.returncode}, above)",
                              "copy the bundle again from where it was made")
    except Refused as e:
        print(f"error: {e}\nhint: {e.fix}", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError, subprocess.CalledProcessError) as e:
        print(f"error: {bundle}: {type(e).__name__}: {e}\nhint: pass the bundle `invoke "
              "bundle` wrote (or its unpacked directory) and a writable VENV path",
              file=sys.stderr)
        return 2
    print(f"megatron-env installed into {venv} from {len(names)} checked files of {bundle.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
