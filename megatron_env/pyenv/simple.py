"""A package index's simple API (PEP 691 JSON or PEP 503 HTML), read for lock-diff: each file's
name, URL, sha256, size and PEP 592 yanked flag.

The index is the one the installer is configured with (uv's, then pip's configuration), found at
run time only: a lock never names it, and neither does anything lock-diff writes. A URL may
carry credentials (https://user:token@host/simple): they go into an Authorization header and
never into a message.
"""

from __future__ import annotations

import base64
import configparser
import json
import os
import re
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT = "https://pypi.org/simple"
ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
          "text/html;q=0.01")  # what uv sends


@dataclass(frozen=True)
class IndexFile:
    name: str  # file name
    url: str
    sha256: str | None
    yanked: str | None  # None: not yanked; else the reason ("" when none was given)
    size: int | None  # PEP 691 (api 1.1) gives it; HTML does not


def _uv_config_url() -> str | None:
    for path in (Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "uv/uv.toml",
                 Path("/etc/uv/uv.toml")):
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            continue
        for index in data.get("index", []):
            if index.get("default") and index.get("url"):
                return index["url"]
        if data.get("index-url"):
            return data["index-url"]
    return None


def _pip_config_url() -> str | None:
    files = [Path("/etc/pip.conf"), Path.home() / ".pip/pip.conf",
             Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "pip/pip.conf"]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(Path(os.environ["PIP_CONFIG_FILE"]))
    found = None
    for path in files:  # later files override earlier ones, as pip reads them
        cp = configparser.ConfigParser()
        try:
            cp.read(path)
        except configparser.Error:
            continue
        for section in ("global", "install", "download"):
            if cp.has_option(section, "index-url"):
                found = cp.get(section, "index-url")
    return found


def index_url() -> str:
    """The index the installer uses: uv's settings, then pip's, then PyPI."""
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        if os.environ.get(var):
            return os.environ[var]
    if os.environ.get("UV_NO_CONFIG") is None and (url := _uv_config_url()):
        return url
    return os.environ.get("PIP_INDEX_URL") or _pip_config_url() or DEFAULT


def shown(url: str) -> str:
    """The URL without its credentials, for messages."""
    p = urllib.parse.urlsplit(url)
    return p._replace(netloc=(p.hostname or "") + (f":{p.port}" if p.port else "")).geturl() \
        if p.username or p.password else url


def _request(url: str, method: str = "GET", accept: str | None = None) -> urllib.request.Request:
    p = urllib.parse.urlsplit(url)
    headers = {"Accept": accept} if accept else {}
    if p.username or p.password:
        netloc = p.hostname + (f":{p.port}" if p.port else "")
        url = p._replace(netloc=netloc).geturl()
        token = f"{urllib.parse.unquote(p.username or '')}:{urllib.parse.unquote(p.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
    return urllib.request.Request(url, headers=headers, method=method)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict[str, str | None]] = []
        self._a: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._a, self._text = dict(attrs), []

    def handle_data(self, data: str) -> None:
        if self._a is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._a is not None:
            self._a["text"] = "".join(self._text).strip()
            self.links.append(self._a)
            self._a = None


def _from_html(text: str, base: str) -> list[IndexFile]:
    parser = _Links()
    parser.feed(text)
    out = []
    for a in parser.links:
        href = a.get("href") or ""
        url, _, frag = urllib.parse.urljoin(base, href).partition("#")
        m = re.match(r"sha256=([0-9a-f]{64})", frag)
        name = a.get("text") or urllib.parse.unquote(url.rsplit("/", 1)[-1])
        yanked = a["data-yanked"] or "" if "data-yanked" in a else None
        out.append(IndexFile(name, url, m.group(1) if m else None, yanked, None))
    return out


def _from_json(doc: dict, base: str) -> list[IndexFile]:
    out = []
    for f in doc.get("files", []):
        y = f.get("yanked", False)
        out.append(IndexFile(f["filename"], urllib.parse.urljoin(base, f["url"]),
                             (f.get("hashes") or {}).get("sha256"),
                             None if y is False or y is None else ("" if y is True else str(y)),
                             f.get("size")))
    return out


def files(project: str, index: str, timeout: float = 30) -> list[IndexFile]:
    """Every file the index lists for `project` (OSError when it cannot be read)."""
    name = re.sub(r"[-_.]+", "-", project).lower()  # PEP 503 normalized
    url = index.rstrip("/") + f"/{name}/"
    if url.startswith("file:"):  # a local index: a directory per project with index.html
        path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
        page = path / "index.html"
        return [f if f.size is not None or not f.url.startswith("file:") else
                IndexFile(f.name, f.url, f.sha256, f.yanked, _file_size(f.url))
                for f in _from_html(page.read_text(), page.as_uri())]
    with urllib.request.urlopen(_request(url, accept=ACCEPT), timeout=timeout) as r:
        body, kind, final = r.read(), r.headers.get("Content-Type", ""), r.geturl()
    if "json" in kind:
        return _from_json(json.loads(body), final)
    return _from_html(body.decode("utf-8", "replace"), final)


def _file_size(url: str) -> int | None:
    try:
        return Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path)).stat().st_size
    except OSError:
        return None


def size(f: IndexFile, timeout: float = 30) -> int | None:
    """The file's size: the index's, else a HEAD request's Content-Length (PEP 503 has none)."""
    if f.size is not None:
        return f.size
    if f.url.startswith("file:"):
        return _file_size(f.url)
    try:
        with urllib.request.urlopen(_request(f.url, "HEAD"), timeout=timeout) as r:
            length = r.headers.get("Content-Length")
    except OSError:
        return None
    return int(length) if length and length.isdigit() else None
