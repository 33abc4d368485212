"""Every HTTP request the tool makes (index pages, sdists, wheels, conda packages, a
MEGATRON_ENV_SOURCE_<NAME> URL), with credentials bound to the origin they were given for.

A URL's userinfo (`https://user:pass@host/simple`) or the netrc entry of its host becomes an
`Authorization` header for that scheme, host and port only. urllib copies every header onto a
redirect, so an index that redirects to a CDN or another host would receive the index's
password; here a header travels only as an unredirected one and is put back, request by
request, where the request's origin is one the credentials belong to. A redirect from https to
plain http is refused: what it carries (a package) would arrive unauthenticated. This is what
pip and requests do.

Why urllib with two small handlers and not a client library: the requests are few and simple
(GET or HEAD, streamed to a file); urllib already honours the proxy variables and the system's
CA store, which urllib3 alone does not, and a second HTTP stack would be a dependency for
twenty lines.
"""

from __future__ import annotations

import base64
import netrc
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import IO, Any

from megatron_env.errors import UserError
from megatron_env.redact import mask_urls

Origin = tuple[str, str, int]
_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> Origin:
    """(scheme, host, port) with the scheme's default port filled in: the unit of trust."""
    p = urllib.parse.urlsplit(url)
    scheme = p.scheme.lower()
    try:
        port = p.port
    except ValueError:
        port = None
    return scheme, (p.hostname or "").lower(), port or _PORTS.get(scheme, 0)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def without_userinfo(url: str) -> tuple[str, str | None]:
    """(the URL without user:pass@, the Authorization header they make, or None)."""
    p = urllib.parse.urlsplit(url)
    if p.username is None:
        return url, None
    host = p.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{p.port}" if p.port else "")
    unq = urllib.parse.unquote
    return (urllib.parse.urlunsplit(p._replace(netloc=netloc)),
            _basic(unq(p.username), unq(p.password or "")))


def from_netrc(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The header the netrc file (NETRC, else ~/.netrc) gives the URL's host, or None."""
    environ = os.environ if environ is None else environ
    path = environ.get("NETRC") or os.path.join(environ.get("HOME") or "~", ".netrc")
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        return None
    try:
        entry = netrc.netrc(path).authenticators(origin(url)[1])
    except (netrc.NetrcParseError, OSError, UnicodeDecodeError):
        return None
    if not entry or not entry[0]:
        return None
    return _basic(entry[0], entry[2] or "")


class _Credentials(urllib.request.BaseHandler):
    """Before every request (the first and each redirect's): any Authorization header is
    dropped, and the one for the request's own origin, if any, is added unredirected."""

    handler_order = 1000  # after urllib's own request processing

    def __init__(self, by_origin: dict[Origin, str]) -> None:
        self.by_origin = by_origin

    def http_request(self, req: urllib.request.Request) -> urllib.request.Request:
        req.remove_header("Authorization")
        header = self.by_origin.get(origin(req.full_url))
        if header:
            req.add_unredirected_header("Authorization", header)
        return req

    https_request = http_request


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, but never from https down to http."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        target = urllib.parse.urljoin(req.full_url, newurl)
        if origin(req.full_url)[0] == "https" and origin(target)[0] != "https":
            fp.close()  # the redirect's answer: urllib closes it only when a request follows
            raise UserError(f"{mask_urls(req.full_url)} redirects to {mask_urls(target)}: "
                            "from https to plain http; refused",
                            fix="use the https address the server should give, or a mirror "
                                "that stays on https", kind="http.downgrade")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def open_url(url: str, *, timeout: float = 60.0, cafile: str | None = None,
             headers: Mapping[str, str] | None = None, method: str = "GET",
             also: tuple[str, ...] = (), environ: Mapping[str, str] | None = None) -> Any:
    """urlopen of `url`: its credentials (userinfo, else netrc) sent to its origin only, and
    those of the URLs in `also` (the index a file is listed on) to theirs. The response as
    urlopen gives it; urllib's errors (OSError, ValueError) as urllib raises them, an HTTPError
    closed first: it holds the answer's socket, and every caller keeps only its code and reason
    (which outlive the close), so one caught and dropped would leave the socket open."""
    bare, header = without_userinfo(url)
    by_origin: dict[Origin, str] = {}
    for other in also:
        _, h = without_userinfo(other)
        if h:
            by_origin.setdefault(origin(other), h)
    if header:
        by_origin[origin(bare)] = header
    if origin(bare) not in by_origin and origin(bare)[0] in _PORTS and (
            h := from_netrc(bare, environ)):
        by_origin[origin(bare)] = h
    handlers: list[urllib.request.BaseHandler] = [_Credentials(by_origin), _Redirects()]
    if cafile:
        handlers.append(urllib.request.HTTPSHandler(
            context=ssl.create_default_context(cafile=cafile)))
    opener = urllib.request.build_opener(*handlers)
    req = urllib.request.Request(bare, headers={"User-Agent": "megatron-env", **(headers or {})},
                                 method=method)
    try:
        return opener.open(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        raise
