"""Environments: a profile's locks turned into a working, verified Python environment.

Layout: the prefix the user names (default `.megatron-env/<profile>`) is a symbolic link to
`<prefix>.d/<lock digest>`, a directory built, verified and stamped before the link is switched
to it with one atomic rename. So a run that fails or is killed at any moment leaves the previous
environment in place and working, and a finished environment is never moved (virtual
environments and conda prefixes hold their own absolute paths). A file lock serialises runs on
the same prefix: the second waits, then finds the work done.

Three ways in:
- uv: a venv from an interpreter of the profile's Python (found, never downloaded), then the
  hashed lock installed with `--require-hashes --no-deps`;
- conda: when a solver and the profile's conda-lock.yml exist, conda-lock installs the
  interpreter and CUDA toolkit first, then the same pip layer goes into that prefix;
- adopt: an environment that already exists (an NGC container, a site module) is checked
  against the profile and, when asked, given only what is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from . import REPO_ROOT, digest, lock, output, proc, uv
from .errors import UserError
from .probe import probe
from .profile import Profile

ENV_ROOT = REPO_ROOT / ".megatron-env"
STAMP = ".megatron-env.json"
MIN_FREE_ENV = "MEGATRON_ENV_MIN_FREE_GB"
DEFAULT_MIN_FREE_GB = 8.0  # a CUDA torch environment with its nvidia-* wheels: ~5-6 GiB
# Installed by the venv or conda machinery, not by the lock; never counted as "extra".
TOOLING = {"pip", "setuptools", "wheel", "uv"}
# What megatron-env itself installs on top of the lock (`invoke megatron`, editable).
ON_TOP = {"megatron-core"}



def default_prefix(profile: Profile) -> Path:
    return ENV_ROOT / profile.name


def python_of(prefix: Path) -> Path:
    return prefix / "bin" / "python"


def read_stamp(prefix: Path) -> dict | None:
    try:
        return json.loads((prefix / STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        return None


# --- verification ----------------------------------------------------------------------------


@dataclass
class Verification:
    facts: dict
    differences: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences


def _names(items: list[str], most: int = 12) -> str:
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def verify(python: Path | str, profile: Profile, lockfile: Path,
           quick: bool = False) -> Verification:
    """Compare what `python` has with the lock and the profile; every difference named.

    quick: distributions only (no torch import), for an environment whose stamp already says it
    was verified in full; it catches anything installed, removed or changed since.
    """
    facts = probe(python, torch=not quick)
    pins = lock.parse_lock(lockfile.read_text())
    have = facts["dists"]
    v = Verification(facts)
    v.missing = sorted(n for n in pins if n not in have)
    if v.missing:
        v.differences.append(f"missing from the environment: {_names(v.missing)}")
    wrong = [f"{n} {have[n]} (lock {pins[n]})" for n in sorted(pins)
             if n in have and have[n] != pins[n]]
    if wrong:
        v.differences.append(f"{len(wrong)} other versions than the lock: {_names(wrong)}")
    extra = sorted(n for n in have if n not in pins and n not in TOOLING | ON_TOP)
    if extra:
        v.differences.append(f"{len(extra)} not in the lock: {_names(extra)}")
    if not facts["python"].startswith(profile.python + "."):
        v.differences.append(f"Python {facts['python']}, profile wants {profile.python}")
    torch = facts.get("torch")
    if quick:
        return v
    if torch is None:
        v.differences.append("torch does not import: " + "; ".join(facts["errors"]))
    else:
        if torch.split("+")[0] != profile.torch:
            v.differences.append(f"torch {torch}, profile wants {profile.torch}")
        if facts.get("torch_cuda") != profile.cuda:
            v.differences.append(f"torch.version.cuda is {facts.get('torch_cuda')}, "
                                 f"profile wants {profile.cuda}")
        nccl_pin = next((ver for n, ver in pins.items() if n.startswith("nvidia-nccl-")), None)
        if nccl_pin and facts.get("nccl") and facts["nccl"] != nccl_pin:
            v.differences.append(f"torch.cuda.nccl.version() is {facts['nccl']}, lock has "
                                 f"{nccl_pin}")
    return v


# --- building --------------------------------------------------------------------------------


@dataclass
class Summary:
    profile: str
    prefix: Path
    mode: str
    action: str  # "built", "up to date", "adopted"
    seconds: float
    facts: dict

    def line(self) -> str:
        f = self.facts
        size = dir_size(self.prefix) if self.mode != "adopt" else 0
        return (f"{self.profile}: {self.action} at {self.prefix} ({self.mode}); Python "
                f"{f.get('python')}, torch {f.get('torch')}, CUDA {f.get('torch_cuda')}, "
                f"NCCL {f.get('nccl', '?')}, {len(f.get('dists', {}))} packages"
                + (f", {size / 2**30:.2f} GiB" if size else "") + f", {self.seconds:.1f} s")


def dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path.resolve()):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def check_free_space(where: Path, echo=output.status) -> None:
    need_gb = float(os.environ.get(MIN_FREE_ENV, DEFAULT_MIN_FREE_GB))
    free_gb = shutil.disk_usage(where).free / 2**30
    if free_gb < need_gb:
        raise UserError(
            f"only {free_gb:.1f} GiB free under {where}; building an environment needs about "
            f"{need_gb:.1f} GiB (wheels unpacked beside the previous environment)",
            fix=f"free disk space or choose another --prefix ({MIN_FREE_ENV} sets the need)")


def _uv_install(python: Path, lockfile: Path, find_links: list[str], no_index: bool,
                log: Path) -> None:
    argv = [uv.exe(), "pip", "install", "--python", python, "--require-hashes",
            "--no-deps", "-r", lockfile]
    for f in find_links:
        argv += ["--find-links", f]
    if no_index:
        argv.append("--no-index")
    r = proc.run(argv, env=uv.env(), timeout=None, log=log, stream=True)
    if not r.ok:
        text = r.output
        cause = ("a downloaded file does not match the hash in the lock"
                 if "hash" in text.lower() and "mismatch" in text.lower()
                 else "uv could not install the lock")
        raise UserError(f"{cause}; nothing was changed. uv said:\n{r.tail(8)}",
                        fix="check the index/mirror (UV_INDEX_URL, --find-links) serves the "
                            f"original files; full log: {log}")


def build(profile: Profile, prefix: Path | None = None, *, python: str | None = None,
          conda: str | None = None, use_conda: bool | None = None,
          find_links: list[str] | None = None, no_index: bool = False,
          echo=output.status) -> Summary:
    """Create or verify the profile's environment at `prefix` (see the module docstring)."""
    t0 = time.monotonic()
    prefix = Path(prefix or default_prefix(profile)).absolute()
    lockfile = profile.dir / lock.LOCK_FILE
    if not lockfile.exists():
        raise UserError(f"{lockfile} does not exist",
                        fix=f"run `invoke lock --profile {profile.name}`")
    wanted = digest.of_file(lockfile)
    store = prefix.with_name(prefix.name + ".d")
    store.mkdir(parents=True, exist_ok=True)
    with FileLock(str(store / ".lock")):
        current = read_stamp(prefix) if prefix.exists() else None
        foreign = prefix.exists() and not prefix.is_symlink() and any(prefix.iterdir())
        if foreign and current is None:
            raise UserError(f"{prefix} exists and is not an environment made by megatron-env",
                            fix="choose another --prefix, or remove it")
        if current and current.get("profile") != profile.name:
            raise UserError(f"{prefix} holds the environment of profile "
                            f"{current.get('profile')}, not {profile.name}",
                            fix="pass another --prefix for this profile")
        if current and current.get("lock_digest") == wanted:
            v = verify(python_of(prefix), profile, lockfile, quick=True)
            if v.ok:
                return Summary(profile.name, prefix, current.get("mode", "uv"), "up to date",
                               time.monotonic() - t0, v.facts)
            echo(f"{prefix} no longer matches its lock ({'; '.join(v.differences)}); rebuilding")
        check_free_space(store, echo)
        keep = prefix.resolve() if prefix.is_symlink() else None
        for leftover in store.iterdir():  # what interrupted runs left: never trusted, removed
            if leftover.is_dir() and leftover != keep:
                shutil.rmtree(leftover, ignore_errors=True)
            elif leftover.name.startswith(".link-"):
                leftover.unlink(missing_ok=True)
        target = store / f"{digest.hexpart(wanted, 16)}-{time.strftime('%Y%m%d%H%M%S')}"
        mode = _create(profile, target, lockfile, python=python, conda=conda,
                       use_conda=use_conda, find_links=find_links or [], no_index=no_index,
                       echo=echo)
        v = verify(python_of(target), profile, lockfile)
        if not v.ok:
            shutil.rmtree(target, ignore_errors=True)
            raise UserError("the new environment does not match the lock: "
                            + "; ".join(v.differences) + ". The previous one is unchanged.",
                            fix="re-run `invoke lock`, then `invoke env`")
        (target / STAMP).write_text(json.dumps(
            {"profile": profile.name, "lock_digest": wanted, "mode": mode,
             "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "python": v.facts["python"], "torch": v.facts.get("torch")}, indent=2) + "\n")
        _switch(prefix, target)
        if keep and keep != target and keep.parent == store:
            shutil.rmtree(keep, ignore_errors=True)
        return Summary(profile.name, prefix, mode, "built", time.monotonic() - t0, v.facts)


def _create(profile: Profile, target: Path, lockfile: Path, *, python, conda, use_conda,
            find_links, no_index, echo) -> str:
    log = target.with_suffix(".log")
    conda_lock_file = profile.dir / lock.CONDA_LOCK_FILE
    solver = conda or lock.conda_solver()
    if use_conda is None:
        use_conda = bool(solver and conda_lock_file.exists())
    if use_conda:
        if not (solver and conda_lock_file.exists()):
            raise UserError("--conda needs a conda solver and "
                            f"{conda_lock_file.relative_to(REPO_ROOT)}",
                            fix="install micromamba and run `invoke lock`")
        echo(f"conda: installing {conda_lock_file.name} into {target} with {solver}")
        r = lock.conda_install(conda_lock_file, target, solver)
        if not r.ok:
            shutil.rmtree(target, ignore_errors=True)
            raise UserError(f"conda-lock install failed: {r.tail(6)}",
                            fix="check the conda channels or mirror")
        mode = "conda"
    else:
        exe, where = lock.find_python(profile.python, python)
        echo(f"uv: a venv from {exe} (found on {where})")
        r = proc.run([uv.exe(), "venv", "--python", exe, "--no-project", target],
                     env=uv.env(), timeout=300)
        if not r.ok:
            raise UserError(f"uv venv failed: {r.tail(5)}", fix="check the interpreter")
        mode = "uv"
    echo(f"installing {lockfile} with hashes required")
    try:
        _uv_install(python_of(target), lockfile, find_links, no_index, log)
    except UserError:
        shutil.rmtree(target, ignore_errors=True)
        raise
    log.unlink(missing_ok=True)
    return mode


def _switch(prefix: Path, target: Path) -> None:
    """Point `prefix` at `target` in one atomic rename of a fresh symbolic link."""
    if prefix.exists() and not prefix.is_symlink():
        # an environment from before this layout: move it aside, it is replaced below
        aside = prefix.with_name(f".{prefix.name}.replaced-{os.getpid()}")
        os.rename(prefix, aside)
        shutil.rmtree(aside, ignore_errors=True)
    link = target.parent / f".link-{os.getpid()}"
    link.unlink(missing_ok=True)
    os.symlink(os.path.relpath(target, prefix.parent), link)
    os.replace(link, prefix)


# --- adopting --------------------------------------------------------------------------------


def adopt(profile: Profile, python: str | None, install_missing: bool,
          find_links: list[str] | None = None, no_index: bool = False) -> Verification:
    """Check an existing environment against the profile; optionally add what is missing."""
    exe = python or sys.executable
    lockfile = profile.dir / lock.LOCK_FILE
    v = verify(exe, profile, lockfile)
    if install_missing and v.missing:
        text = lockfile.read_text()
        keep = set(v.missing)
        blocks = [b for b in text.split("\n") if b]
        chosen, take = [], False
        for line in blocks:
            if not line.startswith((" ", "#")):
                name = line.split("==")[0].lower().replace("_", "-")
                take = name in keep
            if take:
                chosen.append(line)
        with tempfile.TemporaryDirectory() as tmp:
            subset = Path(tmp) / "missing.txt"
            subset.write_text("\n".join(chosen) + "\n")
            _uv_install(Path(exe), subset, find_links or [], no_index, Path(tmp) / "uv.log")
        v = verify(exe, profile, lockfile)
    return v
