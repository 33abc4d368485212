#!/usr/bin/env python3
"""Benchmark: offline bundles. Size and time of `invoke bundle` for each profile (full, and
`--adopt` without the lock's wheels); `invoke setup --bundle` with no network (`unshare -n`)
against `invoke setup` online from a warm cache; a delta bundle after one moved pin against a
full one. Writes bench/results/<date>-cpu/bundle.json.

Megatron-LM and git-sourced kernels come from wherever MEGATRON_ENV_MIRROR_<NAME> points (set
them to local bare mirrors where the upstream is unreachable); the lock's wheels from the
package index pip is configured with.

    python bench/bundle.py [--profiles A,B] [--setup-profiles A] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import megatron_env  # noqa: E402
from megatron_env import profile  # noqa: E402
from megatron_env.bundle import layout, offline  # noqa: E402
from megatron_env.pyenv import lock  # noqa: E402

# One pin moved in a pull request: Megatron-LM from this tag (the previous state) to the
# profile's own. The commit is the tag's, as the profile would pin it.
MOVED_FROM = {"tag": "core_v0.18.2"}


def sh(argv, cwd=None, env=None, offline=False, timeout=3600):
    argv = [str(a) for a in argv]
    if offline:
        argv = ["unshare", "-n", *argv]
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(argv)}\n{r.stdout[-3000:]}"
                         f"{r.stderr[-3000:]}")
    return seconds, r


def checkout_copy(dest: Path) -> Path:
    """The tool's tracked files (a checkout whose profile can be edited)."""
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, text=True,
                           check=True).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


def make(checkout: Path, prof: str, out: Path, cache: Path, *args: str) -> dict:
    # pip's own HTTP cache off: a first bundle downloads every wheel from the index
    env = {**os.environ, "PYTHONPATH": str(checkout), "MEGATRON_ENV_CACHE": str(cache),
           "PIP_NO_CACHE_DIR": "1"}
    seconds, r = sh([sys.executable, "-m", "invoke", "bundle", "--profile", prof, "--out", out,
                     *args], cwd=checkout, env=env)
    doc = layout.read_manifest(out)
    roles: dict[str, int] = {}
    for meta in doc.files.values():
        if not meta.in_base:
            roles[meta.role] = roles.get(meta.role, 0) + meta.size
    print(f"  {out.name}: {out.stat().st_size / 2**20:.1f} MiB in {seconds:.1f} s", flush=True)
    return {"seconds": round(seconds, 1), "bytes": out.stat().st_size,
            "mib": round(out.stat().st_size / 2**20, 1), "files": len(doc.files),
            "written_files": sum(1 for m in doc.files.values() if not m.in_base),
            "bytes_by_role": roles, "summary": r.stdout.strip().splitlines()[-1]}


def setup_times(prof: profile.Profile, full: Path, work: Path) -> dict:
    """Offline from the bundle (cold caches, no network) against online from warm caches. The
    archive is unpacked and removed first: the disk holds one environment at a time."""
    out: dict = {}
    shared = work / f"shared-{prof.name}"
    shared.mkdir()
    t0 = time.perf_counter()
    with tarfile.open(full) as tar:
        tar.extractall(shared, filter="data")
    out["unpack_seconds"] = round(time.perf_counter() - t0, 1)
    full.unlink()
    py = lock.find_python(prof.python)[0]
    tool = work / f"tool-{prof.name}"
    sh([py, "-m", "venv", tool])
    quiet = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    s, _ = sh([tool / "bin" / "pip", "install", "-q", "--no-index", "--find-links",
               shared / "tool", "megatron-env"], env=quiet, offline=True)
    out["tool_install_offline_seconds"] = round(s, 1)
    node = {**quiet, "MEGATRON_ENV_CACHE": str(work / f"node-cache-{prof.name}"),
            "PYTHONPATH": ""}
    for key in ("offline_setup", "offline_rerun"):
        s, r = sh([tool / "bin" / "invoke", "setup", "--bundle", shared, "--prefix",
                   work / f"offline-{prof.name}"], cwd=shared / "source", env=node, offline=True)
        out[f"{key}_seconds"] = round(s, 1)
        out[f"{key}_summary"] = r.stdout.strip().splitlines()[-1]
    _clean(work, prof.name)
    # online: the checkout's own setup, once to warm uv's cache and the git mirror, then timed
    online = {**os.environ, "MEGATRON_ENV_CACHE": str(work / f"online-cache-{prof.name}"),
              "UV_CACHE_DIR": str(work / f"online-uv-{prof.name}")}
    online.pop("PYTHONPATH", None)  # its egg-info would show as a package in the env
    for attempt in ("warm-up", "timed"):
        prefix = work / f"online-{prof.name}-{attempt}"
        s, r = sh([sys.executable, "-m", "invoke", "setup", "--profile", prof.name, "--prefix",
                   prefix], cwd=ROOT, env=online)
        if attempt == "warm-up":
            for p in (prefix, prefix.with_name(prefix.name + ".d"),
                      prefix.with_name(prefix.name + ".setup")):
                shutil.rmtree(p, ignore_errors=True) if not p.is_symlink() else p.unlink()
    out["online_warm_cache_setup_seconds"] = round(s, 1)
    out["online_setup_summary"] = r.stdout.strip().splitlines()[-1]
    _clean(work, prof.name)
    return out


def _clean(work: Path, name: str) -> None:
    for p in work.glob(f"*{name}*"):
        if p.name.startswith("cache-"):  # the bundle's wheel cache: kept for the delta
            continue
        if p.is_symlink():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", default=",".join(profile.names()))
    p.add_argument("--setup-profiles", default=profile.load().name,
                   help="profiles whose offline and online setup are timed (each builds two "
                        "environments)")
    p.add_argument("--delta-profile", default="core_v0.19.0-cu130")
    p.add_argument("--work", type=Path,
                   default=Path(tempfile.gettempdir()) / "megatron-env-bench-bundle")
    args = p.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    doc: dict = {"date": time.strftime("%Y-%m-%d"),
                 "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                 "tool": megatron_env.__version__, "profiles": {}}
    for name in args.profiles.split(","):
        print(f"{name}:", flush=True)
        cache = work / f"cache-{name}"
        full = work / f"{name}-full.tar"
        res = {"full_cold": make(ROOT, name, full, cache)}
        full.unlink()
        res["full_warm"] = make(ROOT, name, full, cache)  # the lock's wheels already cached
        res["adopt"] = make(ROOT, name, work / f"{name}-adopt.tar", cache, "--adopt")
        if name == args.delta_profile:
            full.unlink()  # the same content as the new full bundle below: measured above
            res["delta"] = delta(name, work, cache, res["full_warm"])
        shutil.rmtree(cache, ignore_errors=True)
        if name in args.setup_profiles.split(",") and full.exists():
            res["setup"] = setup_times(profile.load(name), full, work)
        elif name in args.setup_profiles.split(","):
            res["setup"] = setup_times(profile.load(name), *_remake(name, work), work)
        doc["profiles"][name] = res
        for tar in work.glob(f"{name}-*.tar"):
            tar.unlink()
    out = ROOT / "bench" / "results" / f"{doc['date']}-cpu" / "bundle.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2).replace(str(work), "$WORK") + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


def _remake(name: str, work: Path) -> tuple[Path]:
    cache = work / f"cache-{name}"
    full = work / f"{name}-full.tar"
    make(ROOT, name, full, cache)
    shutil.rmtree(cache, ignore_errors=True)
    return (full,)


def delta(name: str, work: Path, cache: Path, new_full: dict) -> dict:
    """The profile as it was before one pin moved (Megatron at MOVED_FROM), bundled in full;
    then a delta of the profile as it is --since that one, against its full bundle."""
    prof = profile.load(name)
    old_checkout = checkout_copy(work / "before-the-move")
    mirror = os.environ.get("MEGATRON_ENV_MIRROR_MEGATRON", prof.megatron["repo"])
    _, r = sh(["git", "ls-remote", mirror, f"refs/tags/{MOVED_FROM['tag']}^{{}}",
               f"refs/tags/{MOVED_FROM['tag']}"])
    commit = r.stdout.split()[0]
    toml = old_checkout / "envs" / name / "profile.toml"
    toml.write_text(toml.read_text().replace(prof.megatron["commit"], commit)
                    .replace(f'"{prof.megatron["tag"]}"', f'"{MOVED_FROM["tag"]}"'))
    old = work / f"{name}-before.tar"
    res = {"moved": f"megatron {MOVED_FROM['tag']} -> {prof.megatron['tag']}",
           "old_full": make(old_checkout, name, old, cache),
           "delta": make(ROOT, name, work / f"{name}-delta.tar", cache, "--since", str(old))}
    shutil.rmtree(cache, ignore_errors=True)
    # the offline side combines them: unpacked base first, the delta over it, all verified
    combined = work / "combined"
    t0 = time.perf_counter()
    for tar in (old, work / f"{name}-delta.tar"):
        with tarfile.open(tar) as t:
            t.extractall(combined, filter="data")
        tar.unlink()
    offline.verify(combined, layout.read_manifest(combined))
    res["combine_and_verify_seconds"] = round(time.perf_counter() - t0, 1)
    res["delta_over_full"] = round(res["delta"]["bytes"] / new_full["bytes"], 4)
    shutil.rmtree(combined)
    shutil.rmtree(old_checkout)
    return res


if __name__ == "__main__":
    sys.exit(main())
