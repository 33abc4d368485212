"""Where the project lives: the directory whose envs/ (profiles), patches/ and scripts/ the tool
uses, settled once per process and read by every module through `megatron_env.REPO_ROOT`.

The order: the directory a front door was given (`--project`, or MEGATRON_ENV_PROJECT), else
the checkout enclosing the working directory, else the checkout this package runs from (an
editable install), else the copy shipped inside the wheel.

Where the tool writes follows from that: in a project (a checkout, or a `--project`
directory) environments go to `.megatron-env/` and caches to `.cache/` beside its profiles, as
they always have; with the wheel's shipped copy (read-only data inside site-packages) they go to
the user's directories of the platform (XDG: ~/.local/share/megatron-env/envs and
~/.cache/megatron-env), never into whatever directory the command happens to run in.
`--cache-dir` (front door) or MEGATRON_ENV_CACHE moves the cache, `--prefix` an environment;
MEGATRON_ENV_STATE moves everything written by default (the test suite gives each test its
own)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ENV = "MEGATRON_ENV_PROJECT"
CACHE_ENV = "MEGATRON_ENV_CACHE"
STATE_ENV = "MEGATRON_ENV_STATE"
APP = "megatron-env"
#: The project files a wheel carries, under the package (setup.py copies them there).
SHIPPED = Path(__file__).resolve().parent / "_project"
_PACKAGE_CHECKOUT = Path(__file__).resolve().parent.parent

_chosen: Path | None = None
_cache_chosen: Path | None = None
_root: tuple[Path, str] | None = None


def is_project(path: Path) -> bool:
    """A directory holding at least one profile (envs/NAME/profile.toml)."""
    return path.is_dir() and any((path / "envs").glob("*/profile.toml"))


def choose(path: str | os.PathLike[str] | None) -> None:
    """The front door's `--project`: must be called before the root is first read."""
    global _chosen
    if path is not None:
        _chosen = Path(path).expanduser().absolute()


def _enclosing(start: Path) -> Path | None:
    for d in (start, *start.parents):
        if is_project(d) and (d / "megatron_env" / "__init__.py").is_file():
            return d
    return None


def resolve(chosen: Path | None = None, environ: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> tuple[Path, str]:
    """-> (root, how): how is `given`, `checkout`, `package checkout` or `shipped`. Pure given
    its arguments; a named directory that holds no profile is refused."""
    from megatron_env.errors import UserError

    if environ is None:
        environ = os.environ
    named = chosen or (Path(environ[ENV]).expanduser().absolute() if environ.get(ENV) else None)
    if named is not None:
        if not is_project(named):
            raise UserError(f"project directory {named} holds no envs/*/profile.toml",
                            fix=f"pass --project (or {ENV}) a directory with envs/, patches/ "
                                "and scripts/, e.g. a checkout of megatron-env",
                            kind="project.missing")
        return named, "given"
    if found := _enclosing(cwd or Path.cwd()):
        return found, "checkout"
    if is_project(_PACKAGE_CHECKOUT):
        return _PACKAGE_CHECKOUT, "package checkout"
    return SHIPPED, "shipped"


def root() -> Path:
    """The project directory, settled on first use."""
    global _root
    if _root is None:
        _root = resolve(_chosen)
    return _root[0]


def how() -> str:
    root()
    assert _root is not None
    return _root[1]


def choose_cache(path: str | os.PathLike[str] | None) -> None:
    """The front door's `--cache-dir` (before MEGATRON_ENV_CACHE and the default)."""
    global _cache_chosen
    if path is not None:
        _cache_chosen = Path(path).expanduser().absolute()


def _user(kind: str) -> Path:
    import platformdirs

    get = platformdirs.user_cache_path if kind == "cache" else platformdirs.user_data_path
    return Path(get(APP, appauthor=False)).absolute()


def state_root() -> Path:
    """Where the tool writes what is not a cache (run directories): MEGATRON_ENV_STATE when set
    (the test suite sets it, so no test reads or writes what a checkout's own setup left), else
    the project, or the user's data directory for the wheel's shipped copy."""
    if state := _state():
        return state
    return _user("data") if how() == "shipped" else root()


def _state() -> Path | None:
    value = os.environ.get(STATE_ENV)
    return Path(value).expanduser().absolute() if value else None


def env_root() -> Path:
    """Where environments live by default: .megatron-env in a project (or under
    MEGATRON_ENV_STATE), the user's data directory's envs/ for the shipped copy."""
    if state := _state():
        return state / ".megatron-env"
    return _user("data") / "envs" if how() == "shipped" else root() / ".megatron-env"


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The cache: --cache-dir, else MEGATRON_ENV_CACHE, else .cache in a project (or under
    MEGATRON_ENV_STATE) or the user's cache directory for the shipped copy."""
    if _cache_chosen is not None:
        return _cache_chosen
    value = (os.environ if environ is None else environ).get(CACHE_ENV)
    if value:
        return Path(value).expanduser().absolute()
    return default_cache_root()


def default_cache_root() -> Path:
    """The cache where nothing moves it: .cache in a project (or under MEGATRON_ENV_STATE),
    else the user's cache directory."""
    if state := _state():
        return state / ".cache"
    return _user("cache") if how() == "shipped" else root() / ".cache"


def commit() -> str | None:
    """The project's git commit (12 digits, `+modified` with local changes), None outside git."""
    import subprocess

    if how() == "shipped":
        return None
    try:
        head = subprocess.run(["git", "-C", str(root()), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return head.stdout.strip() if head.returncode == 0 else None
