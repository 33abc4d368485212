"""Profiles: `envs/<name>/profile.toml`, the single source of truth for one stack.

A profile is declarative, like a Spack recipe: versions with hashes, nothing imperative.
Everything else (lock constraints, build flags, cache keys, what checks expect) is derived from
it by code. Loading validates every field against `SCHEMA` and names the file, the key and what
was expected, so a typo never travels further than `invoke profiles`.
"""

from __future__ import annotations

import re
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from packaging.version import InvalidVersion, Version

from megatron_env import project, recipes
from megatron_env.errors import UserError
from megatron_env.recipes.recipe import Recipe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# The files `invoke lock` generates beside a profile.toml (megatron_env.pyenv.lock writes them).
LOCK_FILE = "requirements.lock"
ENV_FILE = "environment.yml"
CONDA_LOCK_FILE = "conda-lock.yml"
PROFILE_FILE = "profile.toml"

# --- field validators: each returns an error text ("expected ...") or None -------------------

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_MAJOR_MINOR = re.compile(r"^\d+\.\d+$")
_DRIVER = re.compile(r"^\d+(\.\d+){1,2}$")
_ARCH = re.compile(r"^\d+\.\d+a?(\+PTX)?$")
_SWITCH = re.compile(r"^[a-z][a-z_0-9]*$")


def _version(v: str) -> str | None:
    try:
        Version(v)
    except InvalidVersion:
        return "a version such as 2.1.0"
    return None


def _match(rx: re.Pattern[str], what: str) -> Callable[[str], str | None]:
    return lambda v: None if rx.match(v) else what


def _url(v: str) -> str | None:
    ok = re.match(r"^(https?|ssh|git|file)://", v) or v.startswith(("/", "git@"))
    return None if ok else "a git URL (https://, ssh://, git@, file:// or a local path)"


def _list_of(check: Callable[[str], str | None] | None) -> Callable[[Any], str | None]:
    def validate(items: Any) -> str | None:
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            return "a list of strings"
        for item in items:
            if check and (err := check(item)):
                return f"{err} for every item (got {item!r})"
        return None

    return validate


@dataclass(frozen=True)
class Field:
    type: type
    check: Callable[[Any], str | None] | None = None
    required: bool = True


# The whole grammar of a profile. A key not listed here is an error, not silently ignored.
SCHEMA: dict[str, dict[str, Field] | Field | str] = {
    "description": Field(str),
    "default": Field(bool, required=False),
    "python": {"version": Field(str, _match(_MAJOR_MINOR, "a Python version such as 3.10"))},
    "cuda": {
        "version": Field(str, _match(_MAJOR_MINOR, "a CUDA version such as 12.1")),
        "min_driver": Field(str, _match(_DRIVER, "a driver version such as 530.30.02")),
        "archs": Field(list, _list_of(_match(_ARCH, "a compute capability such as 9.0"))),
    },
    "torch": {"version": Field(str, _version)},
    "megatron": {
        "repo": Field(str, _url),
        "tag": Field(str),
        "commit": Field(str, _match(_HEX40, "a commit of 40 lowercase hex digits")),
    },
    "kernels": "tables",  # [kernels.<recipe>]: see _kernel_schema
    "requirements": {"packages": Field(list, _list_of(None))},
    "conda": {
        "channels": Field(list, _list_of(None)),
        "packages": Field(list, _list_of(None)),
    },
}


def _one_of(names: list[str]) -> Callable[[str], str | None]:
    return lambda v: None if v in names else f"one of {', '.join(names) or 'nothing'}"


def _kernel_schema(r: Recipe) -> dict[str, Any]:
    """The pins a [kernels.<name>] table must give, by the recipe's kind of source."""
    common = {"variants": Field(list, _list_of(_one_of([v.name for v in r.variants])),
                                required=False),
              "build": Field(bool, required=False),  # false: pinned, not built (a kernel
              #                                        torch already ships a faster one of)
              **{c.name: Field(list, _list_of(_one_of(["all", *c.values])), required=False)
                 for c in r.choices}}
    if r.source == "sdist":
        return {"version": Field(str, _version),
                "sha256": Field(str, _match(_HEX64, "a sha256 of 64 lowercase hex digits")),
                **common}
    commit = _match(_HEX40, "a commit of 40 lowercase hex digits")
    subs = {"submodules": {p: Field(str, commit) for p in r.submodules}} if r.submodules else {}
    return {"commit": Field(str, commit), "tag": Field(str, required=False), **subs, **common}


@dataclass(frozen=True)
class Profile:
    """A validated profile. `data` keeps the raw tables; properties name what code needs."""

    name: str
    path: Path
    data: dict[str, Any] = field(repr=False)

    @property
    def dir(self) -> Path:
        return self.path.parent

    @property
    def lock_file(self) -> Path:
        """The hashed pip lock (requirements.lock): what every environment installs."""
        return self.dir / LOCK_FILE

    @property
    def env_file(self) -> Path:
        """environment.yml: the conda layer's input, derived from the profile."""
        return self.dir / ENV_FILE

    @property
    def conda_lock_file(self) -> Path:
        """conda-lock.yml: the conda layer resolved, every package with its sha256."""
        return self.dir / CONDA_LOCK_FILE

    @property
    def description(self) -> str:
        return str(self.data["description"])

    @property
    def is_default(self) -> bool:
        return bool(self.data.get("default", False))

    @property
    def python(self) -> str:
        return str(self.data["python"]["version"])

    @property
    def cuda(self) -> str:
        return str(self.data["cuda"]["version"])

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])

    @property
    def min_driver(self) -> str:
        return str(self.data["cuda"]["min_driver"])

    @property
    def archs(self) -> list[str]:
        return list(self.data["cuda"]["archs"])

    @property
    def torch(self) -> str:
        return str(self.data["torch"]["version"])

    @property
    def megatron(self) -> dict[str, str]:
        return dict(self.data["megatron"])

    @property
    def kernels(self) -> dict[str, dict[str, Any]]:
        """[kernels.<recipe>] tables: the kernel packages this profile builds, with their pins."""
        return {k: dict(v) for k, v in self.data.get("kernels", {}).items()}

    @property
    def requirements(self) -> list[str]:
        return list(self.data["requirements"]["packages"])

    @property
    def conda(self) -> dict[str, list[str]]:
        return dict(self.data["conda"])


def _validate(data: dict[str, Any], schema: dict[str, Any], where: str, path: Path) -> None:
    def fail(key: str, expected: str, got: Any = None) -> NoReturn:
        got_text = "" if got is None else f", got {got!r}"
        raise UserError(
            f"{path}: {key}: expected {expected}{got_text}",
            fix=f"edit {path} (see the profiles shipped under envs/ for the shape)",
            kind="profile.invalid",
        )

    for key in data:
        if key not in schema:
            known = ", ".join(sorted(schema))
            fail(f"{where}{key}", f"one of the known keys ({known}); unknown key")
    for key, spec in schema.items():
        name = f"{where}{key}"
        if spec == "tables":
            _validate_kernels(data.get(key, {}), name, path, fail)
            continue
        if isinstance(spec, dict):
            table = data.get(key)
            if not isinstance(table, dict):
                fail(f"[{name}]", "a table" if table is None else "a table, not a value", table)
            _validate(table, spec, f"{name}.", path)
            continue
        if key not in data:
            if spec.required:
                fail(name, f"a {spec.type.__name__} (missing)")
            continue
        _validate_value(data[key], spec, name, fail)


def _validate_value(value: Any, spec: Any, name: str, fail: Callable[..., NoReturn]) -> None:
    """One key's value against its spec: its type (a TOML number where a string was meant is
    named as such; a bool is no int here) and then the spec's own check."""
    if spec.type is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        fail(name, "a string in quotes, e.g. \"3.10\" (TOML reads an unquoted 3.10 as the "
                   f"number {value!r})")
    if not isinstance(value, spec.type) or (spec.type is not bool and isinstance(value, bool)):
        fail(name, f"a {spec.type.__name__}", value)
    if spec.check and (err := spec.check(value)):
        fail(name, err, value)


def _validate_kernels(tables: Any, name: str, path: Path, fail: Callable[..., NoReturn]) -> None:
    if not isinstance(tables, dict):
        fail(f"[{name}]", "a table of [kernels.<recipe>] tables", tables)
    known = recipes.declared()
    for kernel, table in tables.items():
        if kernel not in known:
            fail(f"[{name}.{kernel}]", f"a declared recipe ({', '.join(known)})")
        if not isinstance(table, dict):
            fail(f"[{name}.{kernel}]", "a table", table)
        _validate(table, _kernel_schema(known[kernel]), f"{name}.{kernel}.", path)


MAX_PROFILE_BYTES = 1 << 20  # a profile is a page of TOML; more is the wrong file


def _read_capped(path: Path) -> str:
    """The text of a profile file: a regular file of at most MAX_PROFILE_BYTES (a device such
    as /dev/zero or a FIFO would be read until memory runs out, or forever)."""
    try:
        st = path.stat()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})", fix="check the path",
                        kind="profile.unreadable") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{path} is not a regular file",
                        fix="pass a profile.toml file, or a profile name (invoke profiles)",
                        kind="profile.unreadable")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROFILE_BYTES + 1)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})", fix="check the path",
                        kind="profile.unreadable") from None
    if len(data) > MAX_PROFILE_BYTES:
        raise UserError(f"{path} is larger than {MAX_PROFILE_BYTES // 1024} KiB: not a profile",
                        fix="pass a profile.toml file, or a profile name (invoke profiles)",
                        kind="profile.too-large")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text", fix="pass a profile.toml file",
                        kind="profile.not-utf8") from None


def load_file(path: Path) -> Profile:
    text = _read_capped(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML: {e}", fix=f"fix the syntax in {path}",
                        kind="profile.toml") from None
    _validate(data, SCHEMA, "", path)
    return Profile(name=path.parent.name, path=path, data=data)


def is_path(value: str) -> bool:
    """`--profile` names a file only when it says so: a path with a '/' ending in `.toml`
    (`./mine.toml`, `envs/x/profile.toml`); anything else is a profile name."""
    return "/" in value and value.endswith(".toml")


def envs_root() -> Path:
    """The project's envs/ (read when asked, never at import: a `--project` given to a front
    door after this module was imported still counts)."""
    return project.root() / "envs"


def names(envs_dir: Path | None = None) -> list[str]:
    envs_dir = envs_dir or envs_root()
    if not envs_dir.is_dir():
        return []
    return sorted(p.parent.name for p in envs_dir.glob(f"*/{PROFILE_FILE}"))


def load(name: str | None = None, envs_dir: Path | None = None) -> Profile:
    """Load a profile by name (or the default one), or from a file when `name` says it is one
    (`is_path`: contains '/' and ends with .toml)."""
    envs_dir = envs_dir or envs_root()
    if name and is_path(name):
        return load_file(Path(name))
    if name and ("/" in name or name.endswith(".toml") or name.startswith("-")):
        raise UserError(
            f"--profile {name!r} is neither a profile name nor a profile file",
            fix="pass a name (invoke profiles lists them) or a file path with a '/' that ends "
                "in .toml (./my-profile.toml)", kind="profile.bad-name")
    known = names(envs_dir)
    if name is None:
        items = [load_file(envs_dir / n / PROFILE_FILE) for n in known]
        return default(items, envs_dir)
    if name not in known:
        raise UserError(
            f"unknown profile {name!r}; known profiles: {', '.join(known) or 'none'}",
            fix="pass one of the known names to --profile (invoke profiles lists them)",
            kind="profile.unknown",
        )
    return load_file(envs_dir / name / PROFILE_FILE)


def default_name(items: list[Profile]) -> str | None:
    """The profile commands without --profile use: the only one there is (an unpacked bundle
    carries its own profile alone, whatever it says about default), else the one that says
    default = true; None when none or several do."""
    if len(items) == 1:
        return items[0].name
    defaults = [p.name for p in items if p.is_default]
    return defaults[0] if len(defaults) == 1 else None


def default(items: list[Profile], envs_dir: Path | None = None) -> Profile:
    """The profile commands without --profile use (`default_name`); none, or several that say
    default = true, is a UserError naming the fix."""
    envs_dir = envs_dir or envs_root()
    if (chosen := default_name(items)) is not None:
        return next(p for p in items if p.name == chosen)
    if not items:
        raise UserError(f"no profile under {envs_dir} (no */{PROFILE_FILE})",
                        fix="run from the project's checkout or an unpacked bundle's source "
                            "tree, or pass --profile ./path/to/profile.toml",
                        kind="profile.none")
    defaults = [p.name for p in items if p.is_default]
    raise UserError(
        f"{len(defaults)} profiles under {envs_dir} say default = true"
        + (f" ({', '.join(defaults)})" if defaults else "") + "; exactly one must",
        fix="set default = true in one profile.toml and remove it from the others",
        kind="profile.default-count",
    )


def check_default(items: list[Profile], envs_dir: Path | None = None) -> None:
    """Several profiles have exactly one default (`default`); no profile at all is no error
    here (`invoke profiles` lists none)."""
    if items:
        default(items, envs_dir)


def load_all(envs_dir: Path | None = None) -> list[Profile]:
    envs_dir = envs_dir or envs_root()
    return [load_file(envs_dir / n / PROFILE_FILE) for n in names(envs_dir)]
