#!/usr/bin/env python3
"""Benchmark: `invoke image` of the default profile (core_v0.4.0-cu121: torch 2.1.0 and its
nvidia-* wheels, 2.6 GB), then the same after a one-package change of the lock, with the same
cache (the layers that did not change are reused). Ratios come from one run on one machine.

The default profile's Python is 3.10, which no Debian release ships as python3: the base here is
the tool's own Debian bookworm base with this machine's CPython 3.10 copied into /usr/local (its
library registered with `ldconfig -r`), given as a root file system tarball: the stand-in for an
operator's base that has python3.10. Megatron is a small local repository tagged core_v0.4.0 (the
tests' stand-in; no GitHub here). Wheels come from the tests' wheelhouse of the default lock
(tests/wheelhouse.py), then from the index for the one package that moves.

    nice -n 10 python bench/image_build.py [--debian-base FILE.tar.gz] [--out results.json]

`wall_s` is the whole command (process start, the OCI layout and the squashfs); `image_s` the
OCI layout alone (without --sqsh's flattening), `phases_s` where the time went. It ends by
running the image: `umoci unpack` and `runc run` import torch and megatron.core.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megatron_env.pyenv import lock  # noqa: E402
from tests.gitrepo import git  # noqa: E402
from tests.test_setup import make_repo, make_upstream  # noqa: E402
from tests.wheelhouse import ensure  # noqa: E402

PROFILE = "core_v0.4.0-cu121"
MOVED = ("six", "1.16.0")  # the one package whose pin moves (the lock pins 1.17.0)


def sh(*argv: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], check=True, text=True, capture_output=True,
                          **kw)  # type: ignore[call-overload]


def base_with_python(work: Path, debian: Path) -> Path:
    """The Debian base with this machine's CPython 3.10 at /usr/local, as a rootfs tarball."""
    exe, _ = lock.find_python("3.10")
    prefix = Path(sh(exe, "-c", "import sys; print(sys.base_prefix)").stdout.strip())
    rootfs = work / "rootfs"
    rootfs.mkdir()
    sh("tar", "-xzf", debian, "-C", rootfs)
    for part in ("bin", "lib", "include"):
        if (prefix / part).is_dir():
            shutil.copytree(prefix / part, rootfs / "usr" / "local" / part, symlinks=True,
                            dirs_exist_ok=True)
    sh("ldconfig", "-r", rootfs)
    out = work / "base-py310.tar"
    sh("tar", "-cf", out, "-C", rootfs, ".")
    shutil.rmtree(rootfs)
    return out


def image(repo: Path, env: dict[str, str], out: Path, base: Path) -> dict[str, object]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "invoke", "image", "--profile", PROFILE, "--out",
                        str(out), "--base", str(base), "--sqsh", str(out) + ".sqsh", "--json"],
                       cwd=repo, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"invoke image failed:\n{r.stderr[-3000:]}")
    doc = json.loads(r.stdout)
    phases = doc["phases"]
    return {"wall_s": round(wall, 1), "tool_s": doc["seconds"],
            "image_s": round(doc["seconds"] - phases.get("sqsh", 0.0), 1), "phases_s": phases,
            "digest": doc["digest"], "size": doc["size"],
            "sqsh_sha256": doc["sqsh_sha256"],
            "sqsh_size": Path(str(out) + ".sqsh").stat().st_size,
            "layers": [{k: x[k] for k in ("what", "size", "reused", "digest")}
                       for x in doc["layers"]]}


def run_image(layout: Path, work: Path) -> str:
    bundle = work / "bundle"
    sh("umoci", "unpack", "--image", f"{layout}:latest", bundle)
    cfg = json.loads((bundle / "config.json").read_text())
    cfg["process"]["terminal"] = False
    cfg["process"]["args"] = ["python", "-c", "import torch, megatron.core; "
                              "print('torch', torch.__version__, 'cuda', torch.version.cuda, "
                              "'megatron.core', megatron.core.__version__)"]
    (bundle / "config.json").write_text(json.dumps(cfg))
    r = sh("runc", "--root", work / "runc", "run", "bench-image", cwd=bundle)
    shutil.rmtree(bundle)
    return r.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--debian-base", type=Path, help="the tool's cached Debian base "
                    "(.cache/image/base/debian-bookworm-*.tar.gz); made with mmdebstrap if absent")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    house = ensure()
    with tempfile.TemporaryDirectory(prefix="bench-image-", dir=os.environ.get("TMPDIR")) as t:
        work = Path(t)
        repo = make_repo(work, make_upstream(work))
        git("add", "-A", cwd=repo)
        git("commit", "-qm", "megatron stand-in", cwd=repo)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
        env.update({"PYTHONPATH": str(repo), "UV_FIND_LINKS": str(house), "UV_NO_INDEX": "1",
                    "UV_PYTHON_DOWNLOADS": "never", "MEGATRON_ENV_CACHE": str(work / "cache"),
                    "COLUMNS": "200"})
        debian = a.debian_base
        if debian is None:
            from megatron_env.image import base
            from megatron_env.project import choose_cache

            choose_cache(work / "cache")
            debian = base.debian("3.11", work / "cache", 0, lambda *_: None)[0].path
        t0 = time.monotonic()
        base_tar = base_with_python(work, debian)
        base_s = time.monotonic() - t0
        first = image(repo, env, work / "A", base_tar)
        ran = run_image(work / "A", work)
        prof = repo / "envs" / PROFILE / "profile.toml"
        text = prof.read_text()
        prof.write_text(re.sub(r'"six"', f'"{MOVED[0]}=={MOVED[1]}"', text, count=1))
        relock = subprocess.run([sys.executable, "-m", "invoke", "lock", "--profile", PROFILE],
                                cwd=repo, env={**env, "UV_NO_INDEX": ""}, capture_output=True,
                                text=True)
        if relock.returncode != 0:
            sys.exit(f"invoke lock failed:\n{relock.stderr[-2000:]}")
        git("commit", "-qam", "six 1.16.0", cwd=repo)
        second = image(repo, {**env, "UV_NO_INDEX": ""}, work / "B", base_tar)
    doc = {"benchmark": "image_build", "profile": PROFILE, "cores": os.cpu_count(),
           "base": "debian bookworm (mmdebstrap minbase) + CPython 3.10 at /usr/local, rootfs "
                   "tarball", "base_prepare_s": round(base_s, 1),
           "first": first, "after_one_package": {"moved": f"{MOVED[0]}=={MOVED[1]}", **second},
           "ratio_second_to_first": round(float(second["wall_s"]) / float(first["wall_s"]), 3),
           "ratio_image_only": round(float(second["image_s"]) / float(first["image_s"]), 3),
           "runc": ran, "goal": "second build <= 1/3 of the first"}
    text = json.dumps(doc, indent=1) + "\n"
    print(text, end="")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)


if __name__ == "__main__":
    main()
