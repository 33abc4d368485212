"""Package indexes read as data: a pinned file fetched by its name and checked by its sha256.

`pip download --no-binary` runs an sdist's setup.py just to download it (a kernel package's imports
torch); the simple API (PEP 691 JSON, PEP 503 HTML) lists each file of a project with its URL,
hash and yanked flag, so a file whose sha256 the profile already holds needs nothing else.
Where to look is the user's pip and uv configuration: PIP_INDEX_URL, PIP_EXTRA_INDEX_URL,
UV_DEFAULT_INDEX/UV_INDEX_URL, UV_INDEX/UV_EXTRA_INDEX_URL, pip.conf (PIP_CONFIG_FILE, the site,
user and global files), find-links directories; https://pypi.org/simple when nothing says.
lock-diff reads the one index uv resolves from (`installer_index`: uv's settings, then pip's) for
each locked file's size (`size`: the page's, else a HEAD request's) and yanked flag.

The parsers are pure; `files` reads one project page; `fetch` finds, downloads and checks.
An index URL may carry credentials (user:pass@): they go into a header, never into a message.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from megatron_env import digest, output
from megatron_env.errors import UserError
from megatron_env.files import no_space, publishing
from megatron_env.redact import mask_urls
from megatron_env.sources import http

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_INDEX = "https://pypi.org/simple"
ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
          "text/html;q=0.01")


@dataclass(frozen=True)
class IndexFile:
    """One file of a project page. `yanked` with its `reason` ("" when the index gives none)."""

    name: str
    url: str
    sha256: str | None
    yanked: bool = False
    reason: str = ""
    size: int | None = None


def normalize(project: str) -> str:
    """PEP 503: My_Package, My.Package and my-package are one project, my-package."""
    return re.sub(r"[-_.]+", "-", project).lower()


def _sha256(url: str) -> str | None:
    frag = urllib.parse.urlparse(url).fragment
    m = re.fullmatch(r"sha256=([0-9a-fA-F]{64})", frag)
    return m.group(1).lower() if m else None


def parse_json(text: str, page_url: str) -> list[IndexFile]:
    """A PEP 691 project page (application/vnd.pypi.simple.v1+json)."""
    doc = json.loads(text)
    out = []
    for f in doc.get("files", []):
        url = urllib.parse.urljoin(page_url, f["url"])
        yanked = f.get("yanked", False)
        out.append(IndexFile(f["filename"], url.split("#")[0],
                             (f.get("hashes") or {}).get("sha256") or _sha256(url),
                             yanked not in (False, None),
                             yanked.strip() if isinstance(yanked, str) else "",
                             f.get("size")))
    return out


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[dict[str, str | None], str]] = []
        self._open: dict[str, str | None] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open, self._text = dict(attrs), ""

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            self.found.append((self._open, self._text.strip()))
            self._open = None


def parse_html(text: str, page_url: str) -> list[IndexFile]:
    """A PEP 503 project page: one anchor a file, `#sha256=` on its URL, `data-yanked`."""
    p = _Anchors()
    p.feed(text)
    out = []
    for attrs, label in p.found:
        href = attrs.get("href")
        if not href:
            continue
        url = urllib.parse.urljoin(page_url, href)
        name = label or urllib.parse.unquote(urllib.parse.urlparse(url).path.rsplit("/", 1)[-1])
        yanked = "data-yanked" in attrs
        out.append(IndexFile(name, url.split("#")[0], _sha256(url), yanked,
                             (attrs.get("data-yanked") or "").strip() if yanked else ""))
    return out


# --- where to look ---------------------------------------------------------------------------


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


# --- reading an index ------------------------------------------------------------------------


def _open(url: str, cfg: Config, accept: str | None = None, method: str = "GET",
          also: tuple[str, ...] = ()) -> Any:
    """The request, credentials bound to their origins (sources/http.py)."""
    return http.open_url(url, timeout=cfg.timeout, cafile=cfg.cert, method=method,
                         headers={"Accept": accept} if accept else None, also=also)


def files(project: str, index_url: str, cfg: Config | None = None) -> list[IndexFile]:
    """The files an index lists for `project` ([] when it has no such project); UserError when
    the index cannot be read or its page is not the simple API."""
    cfg = cfg or Config()
    page = f"{index_url.rstrip('/')}/{normalize(project)}/"
    if page.startswith("file:"):  # a directory laid out as an index: <project>/index.html
        path = Path(urllib.request.url2pathname(urllib.parse.urlparse(page).path))
        html = path / "index.html"
        return parse_html(html.read_text(), html.as_uri()) if html.is_file() else []
    try:
        with _open(page, cfg, ACCEPT) as r:
            kind = r.headers.get_content_type()
            text = r.read().decode(r.headers.get_content_charset() or "utf-8")
            page = r.geturl()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []
        raise UserError(f"{mask_urls(page)}: HTTP {e.code} {e.reason}",
                        fix="check the index URL and its credentials (pip's configuration)",
                        kind="index.http-error"
                        ) from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {mask_urls(page)}: {getattr(e, 'reason', e)}",
                        fix="check the index URL (PIP_INDEX_URL, pip.conf) and the network",
                        kind="source.unreachable"
                        ) from None
    if kind != "application/vnd.pypi.simple.v1+json" and not _looks_simple(kind, text):
        raise UserError(f"{mask_urls(page)} is not a simple index page (a {kind} without "
                        "PEP 503 links)", fix="point --index-url / PIP_INDEX_URL / UV_INDEX_URL "
                        "at a simple index (its URL usually ends in /simple)",
                        kind="index.not-simple")
    try:
        if kind == "application/vnd.pypi.simple.v1+json":
            return parse_json(text, page)
        return parse_html(text, page)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"{mask_urls(page)} is not a simple API project page ({e})",
                        fix="check the index URL (PIP_INDEX_URL, pip.conf, --index-url)",
                        kind="index.not-simple"
                        ) from None


def _looks_simple(kind: str, text: str) -> bool:
    """An HTML project page of the simple API: links to files, or (a project with none) the
    PEP 629 version meta tag. A 200 of anything else (a login page, a proxy's error) is not."""
    if kind not in ("text/html", "application/vnd.pypi.simple.v1+html"):
        return False
    low = text.lower()
    return "<a " in low or "pypi:repository-version" in low


def size(f: IndexFile, index_url: str = "", cfg: Config | None = None) -> int | None:
    """The file's size in bytes: the page's (PEP 691 api 1.1), else the file's on disk (a file:
    index), else a HEAD request's Content-Length (a PEP 503 page gives none); None when nothing
    says. `index_url`'s credentials go with a file on its host, as for a download."""
    if f.size is not None:
        return f.size
    if f.url.startswith("file:"):
        try:
            return Path(urllib.request.url2pathname(urllib.parse.urlparse(f.url).path)
                        ).stat().st_size
        except OSError:
            return None
    try:
        with _open(f.url, cfg or Config(), method="HEAD", also=(index_url,)) as r:
            length = r.headers.get("Content-Length")
    except (OSError, ValueError):
        return None
    return int(length) if length and length.isdigit() else None


@dataclass
class Fetched:
    path: Path
    source: str  # where it came from (credentials masked)
    yanked: IndexFile | None = None


def _download(url: str, dest: Path, sha256: str, cfg: Config, index: str = "") -> str | None:
    """`url` published at `dest` when its sha256 is `sha256`; -> None, else the sha256 it had
    (nothing written). `index`'s credentials go with it to the index's own origin."""
    try:
        with publishing(dest) as tmp:
            try:
                with _open(url, cfg, also=(index,) if index else ()) as r:
                    got = digest.copy_hashed(r, tmp)[0]
            except (OSError, ValueError) as e:
                if no_space(e):
                    raise
                raise UserError(f"cannot download {mask_urls(url)}: {getattr(e, 'reason', e)}",
                                fix="check the index and the network",
                                kind="source.unreachable") from None
            if got != sha256:
                raise _Mismatch(got)
    except _Mismatch as e:
        return str(e)
    return None


class _Mismatch(Exception):
    """A download whose sha256 is not the pin's (its temporary is gone): the next index."""


def fetch(project: str, filename: str, sha256: str, dest: Path, cfg: Config | None = None,
          echo: Callable[[str], object] = output.status) -> Fetched:
    """`filename` of `project` written to `dest`, its sha256 checked: from a find-links
    directory, else from the first index that lists it. A yanked file is fetched (the pin
    names it by hash) and returned with its flag for the caller to name."""
    cfg = cfg or configured()
    tried, wrong = [], []
    for link in cfg.find_links:
        local = Path(link[len("file://"):] if link.startswith("file://") else link) / filename
        if local.is_file():
            if not (got := _download(local.as_uri(), dest, sha256, cfg)):
                return Fetched(dest, str(local))
            wrong.append(f"{local} (sha256 {got})")
        tried.append(link)
    unreadable: list[UserError] = []
    for index in cfg.indexes:
        tried.append(mask_urls(index))
        try:
            listed = files(project, index, cfg)
        except UserError as e:  # as pip does: the next index may have it
            unreadable.append(e)
            continue
        hit = next((f for f in listed if f.name == filename), None)
        if hit is None:
            continue
        if hit.sha256 and hit.sha256 != sha256:
            wrong.append(f"{mask_urls(index)} (sha256 {hit.sha256})")
            continue
        echo(f"{project}: downloading {filename} from {mask_urls(index)}"
             + (f" ({hit.size / 2**20:.1f} MiB)" if hit.size else ""))
        if got := _download(hit.url, dest, sha256, cfg, index):
            wrong.append(f"{mask_urls(hit.url)} (sha256 {got})")
            continue
        return Fetched(dest, mask_urls(hit.url), hit if hit.yanked else None)
    if unreadable:
        raise unreadable[0]
    if wrong:
        raise UserError(f"{filename}: no copy with the pinned sha256 {sha256}; other files of "
                        f"that name at {', '.join(wrong)}",
                        fix="the index serves another file under that name: check the mirror",
                        kind="source.sha256")
    raise UserError(f"{filename} is on none of: {', '.join(tried) or 'no index (no-index set)'}",
                    fix="add an index or find-links directory that has it (PIP_INDEX_URL, "
                        "PIP_FIND_LINKS, pip.conf)", kind="source.unreachable")
