"""Package indexes read as data: a pinned file fetched by its name and checked by its sha256.

`pip download --no-binary` runs an sdist's setup.py just to download it (a kernel package's imports
torch); the simple API (PEP 691 JSON, PEP 503 HTML) lists each file of a project with its URL,
hash and yanked flag, so a file whose sha256 the profile already holds needs nothing else.
Where to look (the user's pip and uv configuration) is sources/index_config.py; lock-diff reads
each locked file's size here (`size`: the page's, else a HEAD request's) and yanked flag.

The parsers are pure; `files` reads one project page; `fetch` finds, downloads and checks.
An index URL may carry credentials (user:pass@): they go into a header, never into a message.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from megatron_env import digest, output
from megatron_env.errors import UserError
from megatron_env.files import no_space, publishing
from megatron_env.redact import mask_urls
from megatron_env.sources import http
from megatron_env.sources.index_config import Config, configured

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
