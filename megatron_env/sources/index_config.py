"""Where the package index is: the user's pip and uv configuration read as pip and uv read it.

PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, UV_DEFAULT_INDEX/UV_INDEX_URL, UV_INDEX/UV_EXTRA_INDEX_URL,
pip.conf (PIP_CONFIG_FILE, the site, user and global files), find-links directories, no-index, a
CA bundle and a timeout (`configured`, from the pure `settings`); and the one index uv resolves
the locks from (`installer_index`: uv's settings, then pip's, then PyPI), where lock-diff reads
sizes and yanked flags. https://pypi.org/simple when nothing says.

Apart from sources/index.py, which reads an index once it is found: which files configure an
installer, and in what order they win, follow pip's and uv's rules and change with them."""

from __future__ import annotations

import configparser
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class Config:
    indexes: list[str] = field(default_factory=list)  # the primary first, then the extras
    find_links: list[str] = field(default_factory=list)
    no_index: bool = False
    cert: str | None = None
    timeout: float = 60.0


def pip_config_files(environ: Mapping[str, str]) -> list[Path]:
    """pip's configuration files, weakest first (pip's own order); none with PIP_CONFIG_FILE set
    to os.devnull."""
    own = environ.get("PIP_CONFIG_FILE")
    if own == os.devnull:
        return []
    home = Path(environ.get("HOME", str(Path.home())))
    xdg = environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    files = [*(Path(d) / "pip" / "pip.conf" for d in reversed(xdg)), Path("/etc/pip.conf"),
             home / ".pip" / "pip.conf",
             Path(environ.get("XDG_CONFIG_HOME", str(home / ".config"))) / "pip" / "pip.conf",
             Path(sys.prefix) / "pip.conf"]
    return files + ([Path(own)] if own else [])


def _words(value: str | None) -> list[str]:
    return (value or "").split()  # pip splits its list settings on whitespace


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def settings(environ: Mapping[str, str], conf_texts: list[str]) -> Config:
    """Pure: the indexes, find-links, no-index and CA bundle from environment variables and the
    text of pip's configuration files (weakest first; a later file overrides an earlier one,
    and a variable overrides them all)."""
    conf: dict[str, str] = {}
    for text in conf_texts:
        cp = configparser.ConfigParser(interpolation=None)
        try:
            cp.read_string(text)
        except configparser.Error:
            continue
        for section in ("global", "install", "download"):  # pip download reads all three
            if cp.has_section(section):
                conf.update(cp.items(section))

    def pick(var: str, key: str) -> str | None:
        return environ.get(var) or conf.get(key)

    primary = (environ.get("PIP_INDEX_URL") or environ.get("UV_DEFAULT_INDEX")
               or environ.get("UV_INDEX_URL") or conf.get("index-url") or DEFAULT_INDEX)
    extras = [*_words(pick("PIP_EXTRA_INDEX_URL", "extra-index-url")),
              *_words(environ.get("UV_INDEX")), *_words(environ.get("UV_EXTRA_INDEX_URL"))]
    links = [*_words(pick("PIP_FIND_LINKS", "find-links")),
             *(environ.get("UV_FIND_LINKS", "").replace(",", " ").split())]
    pip_said = any(environ.get(v) for v in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"))
    no_index = _true(environ.get("PIP_NO_INDEX")) or (  # uv's only where pip names no index
        _true(environ.get("UV_NO_INDEX")) and not pip_said) or (
        "PIP_NO_INDEX" not in environ and _true(conf.get("no-index")))
    named = [i.split("=", 1)[1] if re.match(r"^[\w-]+=", i) else i  # uv's `name=url`
             for i in (primary, *extras)]
    indexes = [] if no_index else list(dict.fromkeys(i.rstrip("/") for i in named))
    try:
        timeout = float(pick("PIP_TIMEOUT", "timeout") or pick("PIP_DEFAULT_TIMEOUT",
                                                                "default-timeout") or 60)
    except ValueError:
        timeout = 60.0
    return Config(indexes, list(dict.fromkeys(links)), no_index,
                  pick("PIP_CERT", "cert"), timeout)


def configured(environ: Mapping[str, str] | None = None) -> Config:
    """pip's and uv's settings as pip reads them (`settings` on this process's files)."""
    environ = os.environ if environ is None else environ
    texts = []
    for f in pip_config_files(environ):
        try:
            texts.append(f.read_text())
        except (OSError, UnicodeDecodeError):
            continue
    return settings(environ, texts)


def uv_config_files(environ: Mapping[str, str]) -> list[Path]:
    """uv's configuration files, strongest first (the user's, then the system's); none with
    UV_NO_CONFIG set."""
    if "UV_NO_CONFIG" in environ:
        return []
    home = Path(environ.get("HOME", str(Path.home())))
    return [Path(environ.get("XDG_CONFIG_HOME", str(home / ".config"))) / "uv" / "uv.toml",
            Path("/etc/uv/uv.toml")]


def uv_default_index(text: str) -> str | None:
    """Pure: the default index a uv.toml names (an `[[index]]` with `default = true`, else the
    older `index-url`), or None."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    for ix in data.get("index", []):
        if isinstance(ix, dict) and ix.get("default") and ix.get("url"):
            return str(ix["url"])
    return data.get("index-url") or None


def installer_index(environ: Mapping[str, str] | None = None) -> str:
    """The one index uv resolves the locks from, where lock-diff reads sizes and yanked flags:
    uv's settings first (UV_DEFAULT_INDEX, UV_INDEX_URL, uv.toml; uv reads no pip setting),
    then pip's configuration (`configured`), then PyPI."""
    environ = os.environ if environ is None else environ
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        if environ.get(var):
            return environ[var]
    for path in uv_config_files(environ):
        try:
            url = uv_default_index(path.read_text())
        except (OSError, UnicodeDecodeError):
            continue
        if url:
            return url
    cfg = configured(environ)
    return cfg.indexes[0] if cfg.indexes else DEFAULT_INDEX
