"""The tool's own wheels in a bundle: megatron-env, its runtime dependencies and its build
backend for the profile's Python, and tool/requirements.txt pinning each by sha256, so the
offline install (scripts/install_tool.py, or pip with --require-hashes) takes these files and no
others."""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from megatron_env import __version__, digest, files, output, proc
from megatron_env.bundle.layout import MACHINE
from megatron_env.errors import UserError
from megatron_env.profile import Profile
from megatron_env.pyenv import lock, uv
from megatron_env.recipes.recipe import Package

_PIP_NAME = re.compile(r"[-_.]+")


def _pip_download(args: list[str | Path], dest: Path, python: str, what: str) -> None:
    argv: list[str | Path] = [sys.executable, "-m", "pip", "download", "-q", "-d", dest,
                              "--python-version", python,
            "--implementation", "cp", "--only-binary=:all:"]
    for plat in lock.WHEEL_PLATFORMS:
        argv += ["--platform", plat]
    r = proc.run([*argv, *args], timeout=1800)
    if not r.ok:
        files.child_full(r.output, dest, what)
        raise UserError(f"cannot download {what} for Python {python}: {r.tail(4)}",
                        fix="check the package index (pip's configuration, PIP_INDEX_URL) "
                            "or PIP_FIND_LINKS", kind="source.unreachable")


def wheels(prof: Profile, source: Path, dest: Path, echo: output.Echo,
           extras: tuple[str, ...] = ()
                 ) -> None:
    """megatron-env as a wheel, its runtime dependencies and its build backend, for the profile's
    Python: `pip install --no-index --find-links tool megatron-env` then needs nothing else."""
    if not (source / "pyproject.toml").is_file():  # a wheel install: no project to build
        echo(f"tool: the installed megatron-env {__version__} as a wheel")
        installed_wheel(dest)
        pins = _resolve(installed_requirements(extras), prof.python, None)
    else:
        echo(f"tool: building the megatron-env {__version__} wheel")
        _build_wheel(source, dest)
        pins = tool_pins(source / "pyproject.toml", prof.python, extras)
    echo(f"tool: its runtime dependencies for Python {prof.python} (linux {MACHINE})")
    _pip_download(["--no-deps", *pins], dest, prof.python, "megatron-env's dependencies")


def _build_wheel(source: Path, dest: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="megatron-env-wheel-") as tmp:
        work = Path(tmp) / "src"
        shutil.copytree(source, work)
        # fixed zip timestamps: the same tree gives the same wheel, so a delta bundle skips it
        r = proc.run([uv.exe(), "build", "--wheel", "--out-dir", Path(tmp) / "dist", work],
                     env=uv.env(SOURCE_DATE_EPOCH="315532800"), timeout=900)
        uv.raise_for_cache(r)
        if not r.ok:
            files.child_full(r.output, tmp, "building the megatron-env wheel")
            raise UserError(f"building the megatron-env wheel failed: {r.tail(5)}",
                            fix="the build needs setuptools and wheel from the package index",
                            kind="bundle.tool-build-failed")
        built = next((Path(tmp) / "dist").glob("megatron_env-*.whl"))
        shutil.copy(built, dest / built.name)


_LEFT = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"}  # installers


def installed_wheel(dest: Path) -> Path:
    """The installed megatron-env packed again as a wheel, file for file as its RECORD lists
    them (no byte code, not what the installer added), with a new RECORD and fixed timestamps:
    a bundle made from a wheel install carries the tool that made it, without a source tree."""
    import base64
    import hashlib
    import zipfile
    from importlib import metadata

    dist = metadata.distribution("megatron-env")
    info = next(str(f).split("/")[0] for f in dist.files or [] if ".dist-info/" in str(f))
    version = dist.version
    out = dest / f"megatron_env-{version}-py3-none-any.whl"
    rows = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(dist.files or [], key=str):
            name = str(f)
            if (name.endswith(".pyc") or "__pycache__" in name or name.startswith("..")
                    or (name.startswith(info + "/") and name.split("/")[-1] in _LEFT)):
                continue
            data = Path(str(f.locate())).read_bytes()
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
            sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={sha},{len(data)}")
        rows.append(f"{info}/RECORD,,")
        z.writestr(zipfile.ZipInfo(f"{info}/RECORD", (1980, 1, 1, 0, 0, 0)),
                   "\n".join(rows) + "\n")
    return out


def installed_requirements(extras: tuple[str, ...] = ()) -> list[str]:
    """The installed megatron-env's Requires-Dist: those of no extra, and those of `extras`
    without their extra marker."""
    from importlib import metadata

    out = []
    for req in metadata.requires("megatron-env") or []:
        spec, _, marker = req.partition(";")
        m = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if not m:
            out.append(req)
        elif m.group(1) in extras:
            out.append(spec.strip())
    return out


def kernel_requirements(kernels: list[Package], dest: Path, python: str,
                        echo: Callable[[str], object],
                        constraints: Path | None = None,
                        carried: frozenset[str] = frozenset()) -> list[Path]:
    """What the kernels' Python packages import at run time (each recipe's `requires`), with
    their dependencies but torch and what torch itself brings (the environment the kernels
    build for has it), as wheels for the profile's Python: an adopted bare image gets them
    offline from the bundle's wheels/, and only those it lacks are installed. `constraints`:
    the profile's lock (its versions win where it pins the same package); `carried`: the
    names the bundle carries already (an environment bundle's lock wheels)."""
    reqs = sorted({r for k in kernels for r in k.requires if _name(r) not in carried})
    if not reqs:
        return []
    echo(f"wheels: the kernels' run-time requirements ({', '.join(reqs)}) for Python {python}")
    torch_own = {_name(x) for x in _resolve(["torch"], python, constraints)} | {"torch"}
    pins = [x for x in _resolve(reqs, python, constraints)
            if _name(x) not in torch_own | carried]
    dest.mkdir(parents=True, exist_ok=True)
    _pip_download(["--no-deps", *pins], dest, python, "the kernels' run-time requirements")
    return sorted(dest.glob("*.whl"))


def normal_names(lockfile: Path) -> list[str]:
    """The package names a lock pins, normalised as _name does."""
    return [_name(n) for n in lock.parse_lock(lock.read(lockfile))]


def _name(pin: str) -> str:
    return _PIP_NAME.sub("-", re.split(r"[=<>!~; ]", pin, maxsplit=1)[0]).lower()


def _resolve(reqs: list[str], python: str, constraints: Path | None) -> list[str]:
    """`reqs` and their dependencies pinned for `python` on linux x86_64 (uv pip compile)."""
    with tempfile.TemporaryDirectory(prefix="megatron-env-reqs-") as tmp:
        (Path(tmp) / "reqs.in").write_text("\n".join(reqs) + "\n")
        r = proc.run([uv.exe(), "pip", "compile", Path(tmp) / "reqs.in", "--python-version",
                      python, "--python-platform", lock.PLATFORM, "--no-header",
                      *(["--constraint", str(constraints)] if constraints else []),
                      "--no-annotate", "--quiet"], env=uv.env(), timeout=600)
    uv.raise_for_cache(r)
    if not r.ok:
        raise UserError(f"cannot resolve {', '.join(reqs)} for Python {python}: {r.tail(4)}",
                        fix="check the package index (UV_INDEX_URL)",
                        kind="bundle.requires-unresolvable")
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip() and ln[0].isalnum()]


def tool_pins(pyproject: Path, python: str, extras: tuple[str, ...] = ()) -> list[str]:
    """The tool's runtime dependencies (and `extras`') and build backend resolved for `python`
    on linux x86_64.

    uv resolves, because `pip download --python-version` still judges markers by the running
    interpreter (tomli for 3.10 would be left out when run by 3.12)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    backend = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
    with tempfile.TemporaryDirectory(prefix="megatron-env-tool-") as tmp:
        (Path(tmp) / "backend.in").write_text("\n".join(backend) + "\n")
        r = proc.run([uv.exe(), "pip", "compile", pyproject, Path(tmp) / "backend.in",
                      *(a for e in extras for a in ("--extra", e)),
                      "--python-version", python, "--python-platform", lock.PLATFORM,
                      "--no-header", "--no-annotate", "--quiet"], env=uv.env(), timeout=600)
    uv.raise_for_cache(r)
    if not r.ok:
        raise UserError(f"cannot resolve megatron-env's dependencies for Python {python}: "
                        f"{r.tail(4)}", fix="check the package index (UV_INDEX_URL)",
                        kind="bundle.tool-unresolvable")
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip() and ln[0].isalnum()]


def requirements(tool: Path) -> Path:
    """tool/requirements.txt: every wheel of tool/ pinned by name, version and sha256, so
    `pip install --no-index --require-hashes -r tool/requirements.txt --find-links tool`
    refuses a changed wheel (scripts/install_tool.py also refuses one the manifest lacks)."""
    lines = []
    for w in sorted(tool.glob("*.whl")):
        name, version = w.name.split("-")[:2]
        lines.append(f"{_PIP_NAME.sub('-', name).lower()}=={version} "
                     f"--hash=sha256:{digest.file_hex(w)}")
    out = tool / "requirements.txt"
    out.write_text("\n".join(lines) + "\n")
    return out
