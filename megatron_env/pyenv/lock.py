"""Locks: a profile's Python requirements resolved to exact versions with every file's sha256.

The lock is uv's hashed requirements format, not uv.lock: it names no index, so the same file
installs from PyPI, a mirror or a local wheelhouse chosen at install time, while the hashes pin
every byte. Its header records a digest of the inputs it was made from (the profile's pip-relevant
pins and the constraints derived from them), so `invoke lock --check` can tell a stale lock from
a fresh one without the network; and a digest of its body, with a short digest per package in
its footer (the seal), so a pin or a hash edited by hand fails the same check, naming the
package. `invoke lock --check --resolve` goes further: it resolves again and compares.
`invoke lock --refresh` resolves without the old pins: every package the profile does not pin
moves to its newest allowed version; torch, the profile's own pins and the CUDA constraints stay,
because they are inputs, not pins of the old lock.

Derived, never written by hand:
- the requirements: torch from [torch], the rest from [requirements];
- the constraints: the profile's CUDA version pins the nvidia-* packages that are versioned by the
  CUDA toolkit (runtime, nvrtc, cupti, nvjitlink, nvtx, nvcc), so none floats to a newer minor;
- environment.yml, from [python] and [conda] (pyenv/lock_conda.py, with the conda lock).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from megatron_env import digest, files, output, proc
from megatron_env.errors import UserError
from megatron_env.profile import LOCK_FILE, Profile
from megatron_env.pyenv import lock_conda, uv
from megatron_env.redact import mask_urls
from megatron_env.sources import index_config

Argv = list[str | os.PathLike[str]]  # a command line as proc.run takes it

FORMAT = 1
PLATFORM = "x86_64-manylinux_2_28"
# Packages whose version is the CUDA toolkit's own version (12.1.105 for CUDA 12.1).
CUDA_VERSIONED = ["cuda-runtime", "cuda-nvrtc", "cuda-cupti", "nvjitlink", "nvtx", "cuda-nvcc"]
_DIGEST = re.compile(r"^# inputs-digest: (sha256:[0-9a-f]{64})$", re.M)
_BODY_DIGEST = re.compile(r"^# body-digest: (sha256:[0-9a-f]{64})$", re.M)
_SEALED = re.compile(r"^# sealed (\S+)==(\S+) ([0-9a-f]{16})$", re.M)


def requirements(profile: Profile) -> list[str]:
    return [f"torch=={profile.torch}", *profile.requirements]


def constraints(profile: Profile) -> list[str]:
    """The CUDA version pins the toolkit-versioned nvidia-* family (both naming schemes)."""
    cuda, major = profile.cuda, profile.cuda_major
    out = []
    for name in CUDA_VERSIONED:
        out.append(f"nvidia-{name}-cu{major}=={cuda}.*")  # CUDA <= 12 wheels
        out.append(f"nvidia-{name}=={cuda}.*")  # CUDA >= 13 wheels
    out.append(f"cuda-toolkit=={cuda}.*")
    return out


def inputs_digest(profile: Profile) -> str:
    doc = {"format": FORMAT, "python": profile.python, "platform": PLATFORM,
           "requirements": requirements(profile), "constraints": constraints(profile)}
    return digest.of(doc)


def header(profile: Profile, body: str) -> str:
    return (f"# megatron-env lock for profile {profile.name}: Python {profile.python}, "
            f"linux x86_64 ({PLATFORM}).\n"
            f"# Regenerate with `invoke lock --profile {profile.name}`; do not edit by hand.\n"
            f"# Install from any index or wheelhouse with hashes required, e.g.\n"
            f"#   uv pip install --require-hashes -r {LOCK_FILE}\n"
            f"# inputs-digest: {inputs_digest(profile)}\n"
            f"# body-digest: {body_digest(blocks(body))}\n")


# --- the seal: what the body held when `invoke lock` wrote it ------------------------------


def blocks(text: str) -> dict[str, str]:
    """name -> its block (the pin line and its --hash lines, whitespace normalized)."""
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if not line.startswith(" "):
            name = line.split("==")[0].strip().lower().replace("_", "-")
            out[name] = []
        if name is not None:
            out[name].append(" ".join(line.replace("\\", " ").split()))
    return {n: "\n".join(lines) for n, lines in out.items()}


def _block_digest(block: str) -> str:
    return digest.hexpart(digest.of_bytes(block.encode()), 16)


def body_digest(bs: dict[str, str]) -> str:
    text = "".join(f"{n} {_block_digest(b)}\n" for n, b in sorted(bs.items()))
    return digest.of_bytes(text.encode())


def footer(body: str) -> str:
    pins = parse_lock(body)
    return ("# The seal: one digest per package, so `invoke lock --check` names a hand edit.\n"
            + "".join(f"# sealed {n}=={pins[n]} {_block_digest(b)}\n"
                      for n, b in sorted(blocks(body).items())))


def seal(profile: Profile, body: str) -> str:
    """The lock file: header (inputs and body digests), the body uv wrote, the seal."""
    body = body.split("\n# The seal:")[0].rstrip("\n") + "\n"
    return header(profile, body) + body + footer(body)


def compare(have: dict[str, str], ref: dict[str, str]) -> list[tuple[str, str]]:
    """(name, kind) for each package of two {name: block} maps that differs: kind "only-have",
    "only-ref" or "changed"."""
    out = []
    for name in sorted(set(have) | set(ref)):
        kind = ("only-have" if name not in ref else "only-ref" if name not in have
                else "changed" if have[name] != ref[name] else None)
        if kind:
            out.append((name, kind))
    return out


def read(path: Path) -> str:
    """A lock file's text; bytes that are not UTF-8 are one UserError naming the file."""
    return files.read_text(path, fix="restore it (`git checkout -- FILE`) or write it again "
                                     "with `invoke lock`")


def hand_edits(path: Path) -> list[str]:
    """Packages whose pin or hashes differ from what the lock's seal recorded (empty: none)."""
    text = read(path)
    got = blocks(text)
    sealed = {m.group(1): (m.group(2), m.group(3)) for m in _SEALED.finditer(text)}
    recorded = _BODY_DIGEST.search(text)
    if not sealed or recorded is None:
        return [f"{path}: has no seal (body-digest and sealed lines): made by an older "
                "`invoke lock` or edited by hand"]
    what = {"only-have": "added by hand (not in the lock's seal)",
            "only-ref": "removed by hand (sealed as {pin})",
            "changed": "pin or --hash edited by hand (sealed as {pin})"}
    now = {n: _block_digest(b) for n, b in got.items()}
    out = [f"{path}: {name}: " + what[kind].format(pin=f"{name}=={sealed[name][0]}")
           for name, kind in compare(now, {n: d for n, (_v, d) in sealed.items()})]
    if not out and recorded.group(1) != body_digest(got):
        out.append(f"{path}: body-digest does not match its body: the seal was edited by hand")
    return out


# --- finding an interpreter ------------------------------------------------------------------


def find_python(version: str, explicit: str | None = None) -> tuple[str, str]:
    """(path, where) of an interpreter of `version`; never downloads one."""
    def version_of(exe: str) -> str | None:
        r = proc.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout=30)
        return r.stdout.strip() if r.ok else None

    if explicit:
        got = version_of(explicit)
        if got != version:
            raise UserError(f"--python {explicit} is Python {got or '?'}, "
                            f"the profile needs {version}",
                            fix=f"pass a Python {version} interpreter", kind="lock.wrong-python")
        return explicit, "--python"
    candidates: list[tuple[str, str]] = []
    for name in (f"python{version}", "python3", "python"):
        if exe := proc.which(name):
            candidates.append((exe, "PATH"))
    roots = [os.environ.get("PYENV_ROOT"), str(Path.home() / ".pyenv")]
    for root in filter(None, roots):
        for found in sorted(Path(root, "versions").glob(f"{version}.*/bin/python{version}"),
                            reverse=True):
            candidates.append((str(found), "pyenv"))
    for base in filter(None, (os.environ.get("CONDA_PREFIX"), os.environ.get("CONDA_EXE"))):
        conda_root = Path(base).parent.parent if base.endswith("conda") else Path(base)
        for found in sorted(conda_root.glob(f"envs/*/bin/python{version}")):
            candidates.append((str(found), "conda"))
    for exe, where in candidates:
        if version_of(exe) == version:
            return exe, where
    raise UserError(f"no Python {version} interpreter found on PATH, in pyenv or in conda "
                    "(megatron-env never downloads one)",
                    fix=f"install Python {version} (pyenv install {version}, conda create "
                        f"python={version}) or pass --python PATH", kind="lock.no-python")


@dataclass
class LockResult:
    path: Path
    python: str
    where: str
    packages: int
    changed: bool = True  # False: the resolution gave the bytes already on disk (file untouched)


def _resolve(profile: Profile, exe: str, seed: Path | None,
             upgrade: list[str] | None = None, pinned: dict[str, str] | None = None,
             fresh_index: bool = False) -> str:
    """uv's hashed resolution of the profile (the pins of `seed`, a lock, kept unless upgraded;
    `pinned` versions as constraints: their hashes then come from the index, not from a seed).
    `fresh_index`: revalidate uv's cached index pages, so a release made minutes ago is seen."""
    with tempfile.TemporaryDirectory(prefix="megatron-env-lock-") as tmp:
        t = Path(tmp)
        (t / "requirements.in").write_text("\n".join(requirements(profile)) + "\n")
        extra = [f"{n}=={v}" for n, v in sorted((pinned or {}).items())]
        (t / "constraints.txt").write_text("\n".join(constraints(profile) + extra) + "\n")
        out = t / LOCK_FILE
        if seed is not None and seed.exists():  # uv keeps the pins of an existing output file
            shutil.copy(seed, out)
        argv: Argv = [uv.exe(), "pip", "compile", t / "requirements.in",
                      "-c", t / "constraints.txt", "--generate-hashes", "--no-header",
                      "--python", exe,
                "--python-version", profile.python, "--python-platform", PLATFORM,
                "--no-annotate", "-o", out, "--quiet"]
        for name in upgrade or []:
            argv += ["--upgrade-package", name]
        if fresh_index:
            argv.append("--refresh")
        url = index_config.installer_index()  # the one index: docs/locks.md says the order
        argv += ["--default-index", url]
        r = proc.run(argv, env=uv.env(), timeout=1800)
        if not r.ok:
            raise UserError(f"uv could not resolve profile {profile.name} from the index "
                            f"{mask_urls(url)}:\n{r.tail(15)}",
                            fix="check the pins in the profile and the index (UV_DEFAULT_INDEX, "
                                "UV_INDEX_URL, uv.toml, PIP_INDEX_URL, pip.conf: docs/locks.md)",
                            kind="lock.unresolvable")
        return out.read_text()


def compile_lock(profile: Profile, *, python: str | None = None,
                 upgrade: list[str] | None = None, refresh: bool = False,
                 echo: Callable[[str], object] = output.status) -> LockResult:
    """Resolve the profile into envs/<name>/requirements.lock (kept pins stay unless upgraded;
    `refresh`: no pin of the old lock is kept). The file is rewritten only when its bytes change,
    so a refresh with nothing new leaves it untouched (idempotent, no spurious diff)."""
    exe, where = find_python(profile.python, python)
    how = "Refreshing" if refresh else "Resolving"
    echo(f"{how} {profile.name} for Python {profile.python} with {exe} (found on {where})")
    target = profile.lock_file
    body = _resolve(profile, exe, None if refresh else target, upgrade, fresh_index=refresh)
    text = seal(profile, body)
    changed = not target.exists() or read(target) != text
    if changed:
        files.write_text(target, text)  # a reader never sees half a lock
    return LockResult(target, exe, where, len(parse_lock(text)), changed)


def resolve_check(profile: Profile, python: str | None = None,
                  echo: Callable[[str], object] = output.status) -> list[str]:
    """Resolve again (network) with the committed lock's versions as constraints; every
    difference named. So a new release upstream is no difference; a pin that no longer
    satisfies the profile, or a hash the index does not serve, is."""
    path = profile.lock_file
    exe, _ = find_python(profile.python, python)
    echo(f"Resolving {profile.name} again with {exe} to compare with {path.name}")
    fresh = blocks(_resolve(profile, exe, None, pinned=parse_lock(read(path))))
    have = blocks(read(path))
    out = []
    for name, kind in compare(have, fresh):
        if kind == "only-ref":
            out.append(f"{path}: {name}: missing (a resolution now includes it)")
        elif kind == "only-have":
            out.append(f"{path}: {name}: not part of a resolution of the profile")
        else:
            a, b = fresh[name].splitlines()[0], have[name].splitlines()[0]
            out.append(f"{path}: {name}: " + (f"pinned {b}, a resolution gives {a}" if a != b
                                              else "its hashes differ from the index's files"))
    return out


# Every wheel tag a glibc 2.28 x86_64 system runs (PLATFORM): pip takes --platform literally, and
# CUDA 13 wheels are tagged manylinux_2_27 (nvidia-cublas 13.1), others manylinux_2_24.
WHEEL_PLATFORMS = [*(f"manylinux_2_{m}_x86_64" for m in range(28, 4, -1)),
                   "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def download_wheels(lockfile: Path, dest: Path, python: str,
                    on_line: Callable[[str], object] | None = None) -> proc.Result:
    """Every file of a lock into `dest` as linux x86_64 wheels, hashes checked: a wheelhouse for
    `invoke env --find-links DIR --no-index` on a cluster without an index. `on_line` receives
    pip's output line by line (progress of long downloads)."""
    argv: Argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
            "--index-url", index_config.installer_index(), "-r", lockfile, "-d", dest,
            "--python-version", python, "--implementation", "cp",
            "--only-binary=:all:", "--progress-bar", "off"]
    for plat in WHEEL_PLATFORMS:
        argv += ["--platform", plat]
    if on_line is None:
        return proc.run([*argv, "-q"], timeout=1800)
    return proc.run(argv, timeout=None, stream=True, on_line=on_line)


def parse_hashes(text: str) -> dict[str, set[str]]:
    """name -> the sha256 digests the lock allows for it (one per file: wheels, sdist)."""
    return {n: set(re.findall(r"--hash=sha256:([0-9a-f]{64})", b))
            for n, b in blocks(text).items()}


def parse_lock(text: str) -> dict[str, str]:
    """name -> version of a hashed requirements file."""
    out = {}
    for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", text, re.M):
        out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def subset(text: str, names: set[str]) -> str:
    """The blocks (pin line and its --hash lines) of the packages `names`, as a lock of its own."""
    chosen, take = [], False
    for line in text.splitlines():
        if line and not line.startswith((" ", "#")):
            take = line.split("==")[0].lower().replace("_", "-") in names
        if take and line:
            chosen.append(line)
    return "\n".join(chosen) + "\n"


def recorded_digest(path: Path) -> str | None:
    if not path.exists():
        return None
    m = _DIGEST.search(read(path))
    return m.group(1) if m else None


def stale(profile: Profile) -> list[str]:
    """Why this profile's committed lock files do not match their inputs (empty: all fresh)."""
    problems = []
    lock = profile.lock_file
    got = recorded_digest(lock)
    if got is None:
        problems.append(f"{lock}: missing or has no inputs-digest line")
    elif got != inputs_digest(profile):
        problems.append(f"{lock}: made from other inputs than {profile.path} now holds")
    else:
        problems += hand_edits(lock)
    env = profile.env_file
    if not env.exists() or read(env) != lock_conda.environment_yml(profile):
        problems.append(f"{env}: differs from what {profile.path} generates")
    return problems
