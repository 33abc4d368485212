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

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_env import digest, files, mutex, output, proc, project, redact
from megatron_env.errors import UserError
from megatron_env.profile import Profile
from megatron_env.pyenv import aside, audit, lock, lock_conda, manifest, uv
from megatron_env.pyenv.audit import MEGATRON, ON_TOP, TOOLING, Verification, verify
from megatron_env.pyenv.probe import probe
from megatron_env.units import GIB

STAMP = ".megatron-env.json"
MANIFEST = ".megatron-env-manifest.json"  # every installed file; see megatron_env.pyenv.manifest
MIN_FREE_ENV = "MEGATRON_ENV_MIN_FREE_GB"
DEFAULT_MIN_FREE_GB = 8.0  # a CUDA torch environment with its nvidia-* wheels: ~5-6 GiB


# Installed by the venv or conda machinery, not by the lock; never counted as "extra".
def default_prefix(profile: Profile) -> Path:
    return env_root() / profile.name


def env_root() -> Path:
    """Where environments live by default (project.env_root); read when asked, never at
    import."""
    return project.env_root()


def python_of(prefix: Path) -> Path:
    """The interpreter of an environment this tool built at `prefix` (not an adopted one: ask
    `interpreter` which one an environment's commands run)."""
    return prefix / "bin" / "python"


ADOPTED = "adopted.json"  # in setup_dir(prefix): the interpreter the setup adopted for it


def setup_dir(prefix: Path) -> Path:
    """Where the setup of `prefix` keeps its state (its steps' stamps, what it adopted): beside
    the prefix, so that an adopted environment, which has no directory of its own, has one."""
    return prefix.with_name(prefix.name + ".setup")


def record_adopted(prefix: Path, python: Path, torch: Mapping[str, Any] | None = None) -> None:
    """Remember that `prefix` is served by the adopted interpreter `python` (the setup's env
    step, once it has checked it): every command that runs the environment's interpreter then
    runs this one (`interpreter`). `torch`: what probe.torch_stamp said of its torch then, its
    version and the stamp of its compiled core (a torch replaced since is checked again and
    named, and the kernels are built for it: `adopted_torch`)."""
    torch = torch or {}
    files.write_text(setup_dir(prefix) / ADOPTED, json.dumps(
        {"python": os.path.abspath(python), "torch_stamp": torch.get("stamp"),
         "torch": torch.get("torch")}) + "\n")


def adopted_torch(prefix: Path) -> dict[str, Any]:
    """The torch recorded with the adoption of `prefix`'s interpreter: {"stamp", "torch" (its
    version)}, each None when not recorded (no adoption, or a record made before versions
    were kept)."""
    doc, _why = files.read_json(setup_dir(prefix) / ADOPTED)
    doc = doc if isinstance(doc, dict) else {}
    return {"stamp": doc.get("torch_stamp"), "torch": doc.get("torch")}


def forget_adopted(prefix: Path) -> None:
    """`prefix` is built by this tool again: its own bin/python serves it."""
    (setup_dir(prefix) / ADOPTED).unlink(missing_ok=True)


def adopted(prefix: Path) -> Path | None:
    """The interpreter recorded as adopted for `prefix` (None: none, or a record that names
    none; then the environment's own bin/python is its interpreter)."""
    doc, _why = files.read_json(setup_dir(prefix) / ADOPTED)
    py = doc.get("python") if isinstance(doc, dict) else None
    return Path(py) if isinstance(py, str) and os.path.isabs(py) else None


def interpreter(prefix: Path, python: str | Path | None = None) -> Path:
    """The one answer to "which interpreter runs this environment's code": `python` when the
    caller names one (made absolute, `..` folded, links kept: a venv's python is one; a command
    may run it from another directory), else the
    one the setup adopted for `prefix`, else the environment's own bin/python. Whether it
    exists is the caller's to say (with its own hint)."""
    if python:
        return Path(os.path.abspath(python))
    return adopted(prefix) or python_of(prefix)


def read_stamp(prefix: Path) -> dict[str, Any] | None:
    """The environment's stamp; None when it is missing or not a JSON object (rebuilt then)."""
    doc, _why = files.read_json(prefix / STAMP)
    return doc if isinstance(doc, dict) else None


@dataclass
class Summary:
    profile: str
    prefix: Path
    mode: str
    action: str  # "built", "up to date", "repaired", "verified"
    seconds: float
    facts: dict[str, Any]
    size: int = 0  # bytes installed, from the manifest (walking 20,000 files costs seconds)

    def line(self) -> str:
        f = self.facts
        size = self.size
        return (f"{self.profile}: {self.action} at {self.prefix} ({self.mode}); Python "
                f"{f.get('python')}, torch {f.get('torch')}, CUDA {f.get('torch_cuda')}, "
                f"NCCL {f.get('nccl', '?')}, {len(f.get('dists', {}))} packages"
                + (f", {size / GIB:.2f} GiB" if size else "") + f", {self.seconds:.1f} s")


def min_free_gb() -> float:
    raw = os.environ.get(MIN_FREE_ENV)
    if raw is None:
        return DEFAULT_MIN_FREE_GB
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise UserError(f"{MIN_FREE_ENV}={raw!r} is not a number of GiB",
                        fix=f"set {MIN_FREE_ENV} to a number such as {DEFAULT_MIN_FREE_GB:g}, "
                            "or unset it", kind="input.value")
    return value


def check_free_space(where: Path, echo: output.Echo = output.status) -> None:
    need = int(min_free_gb() * GIB)
    if files.free_bytes(where) < need:
        raise files.full(where, need, "a new environment (its wheels unpacked beside the "
                                      "previous one)",
                         fix=f"free space there or choose another --prefix ({MIN_FREE_ENV} "
                             "sets the need)")


_PACKAGES = "the packages of {}"  # what a full disk had no room for


def uv_install_lock(python: Path, lockfile: Path, sources: Sources, log: Path,
                    extra: tuple[str, ...] | list[str] = ()) -> None:
    """uv installs `lockfile` into `python`; on failure the hint names the full log, which
    must still exist when it is read: the log (in a temporary directory, or beside the
    environment a failed install removes) is copied out to a file of its own first. A disk
    that filled is said as one `no space` line, not as uv's lines again under an index hint."""
    # --link-mode copy: an environment never shares an inode with uv's cache, so a file edited
    # in place in one environment cannot change the cache and, through it, the next environment
    argv = [uv.exe(), "pip", "install", "--python", python, "--require-hashes",
            "--no-deps", "--link-mode", "copy", "-r", lockfile, *extra]
    for f in sources.find_links:
        argv += ["--find-links", f]
    if sources.no_index:
        argv.append("--no-index")
    r = proc.run(argv, env=uv.env(**sources.child_env), timeout=None, log=log, stream=True)
    uv.raise_for_cache(r)
    if not r.ok:
        text = r.output
        # the log lies beside (or in) what a failed install removes: a copy that outlives it
        kept = _kept(text)
        said = f"full log: {kept}" if kept else "uv's output is above"
        if files.said_full(text):  # the disk, not the index: said as every writer says it
            where = python.parent.parent
            mount = files.mount_of(where)
            raise files.full(where, what=_PACKAGES.format(lockfile.name),
                             fix=f"free space on {mount} or choose another --prefix "
                                 f"(nothing was changed; {said})")
        cause = ("a downloaded file does not match the hash in the lock"
                 if "hash" in text.lower() and "mismatch" in text.lower()
                 else "uv could not install the lock")
        # uv's lines were shown as they came: its first error line, not all of them again
        first = next((line.strip() for line in r.tail(40).splitlines()
                      if line.lstrip().startswith("error:")), r.tail(1).strip())
        raise UserError(f"{cause}; nothing was changed ({first})",
                        fix="check the index/mirror (UV_INDEX_URL, --find-links) serves the "
                            f"original files; {said}", kind="env.install-failed")


def _kept(output: str) -> Path | None:
    """uv's output, masked, in a file of its own in the temporary directory, where it outlives
    the failed environment (or temporary directory) its log was written in, and is whole where
    that log could not be (a disk that filled stops the log, not the output held here); None
    where even that cannot be written."""
    name = None
    try:
        fd, name = tempfile.mkstemp(prefix="megatron-env-uv-", suffix=".log")
        with os.fdopen(fd, "w") as out:
            out.write(redact.text(output))
    except OSError:  # a full temporary directory too: no copy, not half of one
        if name:
            Path(name).unlink(missing_ok=True)
        return None
    return Path(name)


def _refuse(prefix: Path, profile: Profile) -> None:
    """Refuse a prefix that is not (or not yet) this profile's environment, before any write."""
    if prefix.exists() and not prefix.is_dir():
        raise UserError(f"{prefix} is a file, not an environment directory",
                        fix="choose another --prefix, or remove the file",
                        kind="env.not-a-directory")
    current = read_stamp(prefix) if prefix.exists() else None
    foreign = prefix.exists() and not prefix.is_symlink() and any(prefix.iterdir())
    if foreign and current is None:
        raise UserError(f"{prefix} exists and is not an environment made by megatron-env",
                        fix="choose another --prefix, or remove it", kind="env.foreign")
    if current and current.get("profile") != profile.name:
        raise UserError(f"{prefix} holds the environment of profile "
                        f"{current.get('profile')}, not {profile.name}",
                        fix="pass another --prefix for this profile", kind="env.other-profile")


def build(profile: Profile, prefix: Path | None = None, *, python: str | None = None,
          conda: str | None = None, use_conda: bool | None = None,
          find_links: list[str] | None = None, no_index: bool = False, deep: bool = False,
          conda_lock: Path | None = None, echo: output.Echo = output.status,
          child_env: Mapping[str, str] | None = None) -> Summary:
    """Create, check or repair the profile's environment at `prefix` (see the module docstring).

    find_links/no_index: where the lock's wheels come from (a bundle's wheels/, no index);
    conda_lock: the conda-lock.yml to install instead of the profile's (a bundle's local copy).

    deep: re-hash every installed file against its RECORD and import torch, instead of the
    stat-only check of the manifest. child_env: what uv is told besides (a bundle's offline
    settings), passed to each child process, never set in this one.
    """
    t0 = time.monotonic()
    prefix = Path(prefix or default_prefix(profile)).absolute()
    lockfile = profile.lock_file
    if not lockfile.exists():
        raise UserError(f"{lockfile} does not exist",
                        fix=f"run `invoke lock --profile {profile.name}`", kind="lock.missing")
    wanted = digest.of_file(lockfile)
    min_free_gb()  # a bad value is reported before anything is written
    _refuse(prefix, profile)
    if not deep and (s := unchanged_summary(profile, prefix, wanted)) is not None:
        s.seconds = time.monotonic() - t0
        return s
    store = prefix.with_name(prefix.name + ".d")
    made_store = not store.exists()
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {store}: {e.strerror}",
                        fix="choose a writable --prefix", kind="path.cannot-create") from None
    sources = Sources(find_links or [], no_index, dict(child_env or {}))
    try:
        with mutex.exclusive(store / ".lock", f"waiting: another run is working on {prefix} "
                               f"(it holds {store / '.lock'})", echo):
            _refuse(prefix, profile)
            current = read_stamp(prefix) if prefix.exists() else None
            if current and current.get("lock_digest") == wanted:
                s = _warm(profile, prefix, lockfile, current, sources, deep, echo)
                if s is not None:
                    s.seconds = time.monotonic() - t0
                    return s
            check_free_space(store, echo)
            return _cold(profile, prefix, store, lockfile, wanted, sources, t0, echo,
                         python=python, conda=conda, use_conda=use_conda,
                         conda_lock=conda_lock)
    except UserError:
        if made_store and not any(d.is_dir() for d in store.iterdir()):
            shutil.rmtree(store, ignore_errors=True)  # a refused first run leaves nothing
        raise


@dataclass
class Sources:
    """Where packages come from (for a build and for a repair alike)."""

    find_links: list[str]
    no_index: bool
    child_env: dict[str, str] = field(default_factory=dict)  # uv's variables (a bundle's)


def _cold(profile: Profile, prefix: Path, store: Path, lockfile: Path, wanted: str,
          sources: Sources, t0: float, echo: output.Echo, *, python: str | None,
          conda: str | None, use_conda: bool | None, conda_lock: Path | None) -> Summary:
    keep = prefix.resolve() if prefix.is_symlink() else None
    _clear(store, keep, echo)
    files.sweep(prefix.parent, prefix.name)  # a switch's link a killed run left
    target = store / f"{digest.hexpart(wanted, 16)}-{time.strftime('%Y%m%d%H%M%S')}"
    claim = files.temp_for(target)  # this run's, until the environment is whole
    claim.touch()
    try:
        return _make(profile, prefix, target, keep, lockfile, wanted, sources, t0, echo,
                     python=python, conda=conda, use_conda=use_conda, conda_lock=conda_lock)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the unfinished environment goes now
        _unfinished(prefix, target, keep, echo)
        raise
    finally:
        claim.unlink(missing_ok=True)


def _unfinished(prefix: Path, target: Path, keep: Path | None, echo: output.Echo) -> None:
    """An interrupted build's environment removed (unless the switch to it had happened), and
    what the prefix is now said."""
    if not target.exists() or (prefix.is_symlink() and prefix.resolve() == target):
        return
    files.discard(target)
    target.with_suffix(".log").unlink(missing_ok=True)
    now = ("still the previous environment" if keep and prefix.is_symlink()
           else "not made (there was no environment before)")
    echo(f"interrupted: the unfinished environment {target.name} removed; {prefix} is {now}")


def _clear(store: Path, keep: Path | None, echo: output.Echo = output.status) -> None:
    """What interrupted runs left in `store`, removed: a claimed environment (a file
    `<name>.tmp-<host>-<pid>-<random>` beside it) only once its claim is provably dead (another
    node's run on a shared filesystem keeps its work), an unclaimed one (older versions) at once.
    Each one removed is said (what was found, its size): its downloads stay in uv's cache,
    where this run finds them again."""
    claims = [c for c in store.glob("*.tmp-*") if c.is_file()]
    claimed = {c.name.split(".tmp-")[0] for c in claims if not files.dead(c)}
    for d in [*(d for d in store.iterdir() if d.is_dir()), *claims]:  # not the lock file
        if d != keep and d.name.split(".tmp-")[0] not in claimed and d.exists():
            if d.is_dir():
                echo(f"found {d}, an environment an interrupted run left unfinished "
                     f"({files.size_of(d, 3.0)[0] / GIB:.2f} GiB): removing it; the downloads it "
                     "used are reused from uv's cache")
            files.remove(d)


def _make(profile: Profile, prefix: Path, target: Path, keep: Path | None, lockfile: Path,
          wanted: str, sources: Sources, t0: float, echo: output.Echo, *, python: str | None,
          conda: str | None, use_conda: bool | None, conda_lock: Path | None) -> Summary:
    mode = _create(profile, target, lockfile, python=python, conda=conda, use_conda=use_conda,
                   sources=sources, echo=echo, conda_lock=conda_lock)
    try:
        facts = probe(python_of(target), torch=False)
        bad = manifest.hash_check(manifest.scan(facts["sites"]))
        if bad:  # the wheels' hashes were checked: what differs came out of uv's cache
            echo("installed files differ from the RECORD their wheels ship (a corrupt uv cache "
                 "entry):")
            for line in manifest.summarize(bad):
                echo(f"  {line}")
            repair(python_of(target), lockfile, manifest.packages(bad), sources, echo)
        v = verify(python_of(target), profile, lockfile)
    except UserError:
        shutil.rmtree(target, ignore_errors=True)
        raise
    if not v.ok:
        shutil.rmtree(target, ignore_errors=True)
        raise UserError("the new environment does not match the lock: "
                        + v.text() + ". The previous one is unchanged.",
                        fix="re-run `invoke lock`, then `invoke env`", kind="env.verify-failed")
    m = _record(target, profile, wanted, mode, v.facts)
    _switch(prefix, target)
    if keep and keep != target and keep.parent == target.parent:
        shutil.rmtree(keep, ignore_errors=True)
    return Summary(profile.name, prefix, mode, "built", time.monotonic() - t0, v.facts,
                   m["bytes"])


def _record(target: Path, profile: Profile, lock_digest: str, mode: str,
            facts: dict[str, Any]) -> dict[str, Any]:
    """Write the manifest of a verified environment, then its stamp (which names the manifest).
    The manifest holds what this step installs; what the megatron and builds steps install on
    top (ON_TOP: megatron-core editable, the kernel wheels) is theirs to check and re-install,
    so that re-installing it is never a change of the environment."""
    m = manifest.without(manifest.scan(facts["sites"]), ON_TOP)
    manifest_digest = manifest.save(m, target / MANIFEST)
    files.write_text(target / STAMP, json.dumps(
        {"profile": profile.name, "lock_digest": lock_digest, "mode": mode,
         "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
         "python": facts["python"], "torch": facts.get("torch"),
         "manifest": manifest_digest, "facts": facts}, indent=2) + "\n")
    return m


def changes(prefix: Path) -> list[manifest.Difference] | None:
    """What changed in the environment since its build, by stat alone (None: no manifest)."""
    m = manifest.load(prefix / MANIFEST)
    # a manifest written before ON_TOP was left out of it may still name megatron-core
    return None if m is None else [d for d in manifest.stat_check(m, ignore_extra=TOOLING | ON_TOP)
                                   if d.package not in ON_TOP]


def unchanged_summary(profile: Profile, prefix: Path, wanted: str) -> Summary | None:
    """The environment, when it was built from this very lock and nothing in it changed (by
    stat alone): verified without taking the lock or writing anything, so that a complete
    environment on a read-only mount checks. None when anything must be looked at closer."""
    current = read_stamp(prefix) if prefix.exists() else None
    if not current or current.get("lock_digest") != wanted:
        return None
    m = manifest.load(prefix / MANIFEST)
    if m is None or changes(prefix):
        return None
    return Summary(profile.name, prefix, current.get("mode", "uv"), "up to date", 0.0,
                   current.get("facts") or {}, m["bytes"])


def _warm(profile: Profile, prefix: Path, lockfile: Path, current: dict[str, Any], sources: Sources,
          deep: bool, echo: output.Echo) -> Summary | None:
    """Check an environment built from this very lock; repair what changed. None: rebuild it."""
    python = python_of(prefix.resolve())  # the manifest names files by their real paths
    m = manifest.load(prefix / MANIFEST)
    diffs: list[manifest.Difference] = []
    if m is not None:
        diffs = changes(prefix) or []
        extra = [d for d in diffs if d.kind == "extra"]
        if extra:
            echo(f"{prefix} has packages its lock does not: "
                 f"{audit.names(manifest.packages(extra))}; rebuilding")
            return None
        if deep:
            seen = {d.file for d in diffs}
            diffs += [d for d in manifest.hash_check(m)
                      if d.file not in seen and d.package not in ON_TOP]
        if not diffs and not deep:
            return Summary(profile.name, prefix, current.get("mode", "uv"), "up to date", 0.0,
                           current.get("facts") or {}, m["bytes"])
    if diffs:
        echo(f"{prefix} differs from what its build installed:")
        for line in manifest.summarize(diffs):
            echo(f"  {line}")
        repair(python, lockfile, manifest.packages(diffs), sources, echo)
    v = verify(python, profile, lockfile)
    if not v.ok:
        echo(f"{prefix} no longer matches its lock ({v.text()}); rebuilding")
        return None
    m = _record(prefix.resolve(), profile, current["lock_digest"], current.get("mode", "uv"),
                v.facts)
    return Summary(profile.name, prefix, current.get("mode", "uv"),
                   "repaired" if diffs else "verified", 0.0, v.facts, m["bytes"])


def repair(python: Path, lockfile: Path, names: list[str], sources: Sources,
           echo: output.Echo) -> None:
    """Reinstall `names` from the lock, with uv's cache entries of them refreshed from the
    package source (an entry edited in place would otherwise be installed again), then prove
    every reinstalled file against its wheel's RECORD."""
    pins = lock.parse_lock(lock.read(lockfile))
    outside = [n for n in names if n not in pins]
    if outside:
        raise UserError(f"{', '.join(outside)} changed, and the lock does not install "
                        f"{'it' if len(outside) == 1 else 'them'}",
                        fix="re-run the step that installed it: " + ", ".join(
                            "`invoke megatron`" if n == MEGATRON else f"`invoke build {n}`"
                            for n in outside), kind="env.repair-refused")
    echo(f"repairing {', '.join(names)}: reinstalling from {lockfile.name}, uv's cache entry "
         "refreshed")
    extra = [a for n in names for a in ("--reinstall-package", n, "--refresh-package", n)]
    sites = probe(python, torch=False)["sites"]
    # all or nothing: an interrupt or a failure puts the files of `names` back as they were
    with aside.reinstalling(aside.root_of(python), sites, set(names), echo), \
            tempfile.TemporaryDirectory() as tmp:
        subset = Path(tmp) / "repair.txt"
        subset.write_text(lock.subset(lock.read(lockfile), set(names)))
        uv_install_lock(python, subset, sources, Path(tmp) / "uv.log", extra)
    bad = manifest.hash_check(manifest.scan(sites), set(names))
    if bad:
        raise UserError("reinstalling from the lock still gives files that differ from their "
                        "wheel's RECORD: " + "; ".join(manifest.summarize(bad)),
                        fix=f"run `uv cache clean {' '.join(names)}` and check the package "
                            "source (index, mirror or --find-links)", kind="env.repair-failed")


def _create(profile: Profile, target: Path, lockfile: Path, *, python: str | None,
            conda: str | None, use_conda: bool | None,
            sources: Sources, echo: output.Echo, conda_lock: Path | None = None) -> str:
    log = target.with_suffix(".log")
    conda_lock_file = lock_conda.conda_lockfile(profile, conda_lock)
    solver = conda or lock_conda.conda_solver()
    if use_conda is None:
        use_conda = bool(solver and conda_lock_file.exists())
    if use_conda:
        if not (solver and conda_lock_file.exists()):
            raise UserError(f"--conda needs a conda solver and {conda_lock_file}",
                            fix="install micromamba and run `invoke lock`",
                            kind="env.conda-unavailable")
        echo(f"conda: installing {conda_lock_file.name} into {target} with {solver}")
        r = lock_conda.conda_install(conda_lock_file, target, solver)
        if not r.ok:
            shutil.rmtree(target, ignore_errors=True)
            raise UserError(f"conda-lock install failed: {r.tail(6)}",
                            fix="check the conda channels or mirror", kind="env.install-failed")
        mode = "conda"
    else:
        exe, where = lock.find_python(profile.python, python)
        echo(f"uv: a venv from {exe} (found on {where})")
        r = proc.run([uv.exe(), "venv", "--python", exe, "--no-project", target],
                     env=uv.env(**sources.child_env), timeout=300)
        if not r.ok:
            shutil.rmtree(target, ignore_errors=True)
            raise uv.cache_problem(r.output) or UserError(
                f"uv venv failed: {r.tail(5)}", fix="check the interpreter",
                kind="env.venv-failed")
        mode = "uv"
    echo(f"installing {lockfile} with hashes required")
    try:
        uv_install_lock(python_of(target), lockfile, sources, log)
    except UserError as e:
        shutil.rmtree(target, ignore_errors=True)
        if e.kind == "disk.full":  # the free space said as it is with the failed install gone
            raise files.full(target, what=_PACKAGES.format(lockfile.name), fix=e.fix) from None
        raise
    log.unlink(missing_ok=True)
    return mode


def _switch(prefix: Path, target: Path) -> None:
    """Point `prefix` at `target` in one atomic rename of a fresh symbolic link."""
    # an environment from before this layout (a directory at `prefix`) is discarded first
    with files.publishing(prefix) as link:
        os.symlink(os.path.relpath(target, prefix.parent), link)


# --- adopting --------------------------------------------------------------------------------


def adopt(profile: Profile, python: str | None, install_missing: bool,
          find_links: list[str] | None = None, no_index: bool = False,
          child_env: Mapping[str, str] | None = None) -> Verification:
    """Check an existing environment against the profile; optionally add what is missing."""
    exe = python or sys.executable
    lockfile = profile.lock_file
    v = verify(exe, profile, lockfile)
    if install_missing and v.missing:
        with tempfile.TemporaryDirectory() as tmp:
            subset = Path(tmp) / "missing.txt"
            subset.write_text(lock.subset(lock.read(lockfile), set(v.missing)))
            how = Sources(find_links or [], no_index, dict(child_env or {}))
            uv_install_lock(Path(exe), subset, how, Path(tmp) / "uv.log")
        v = verify(exe, profile, lockfile)
    return v
