"""Credentials stay with their host (issue 34 item 2), proved with real local servers.

An index given as http://user:pass@A/simple that redirects to another host B (or to another
port of A) must not send its Authorization to B; a redirect within A keeps it; a redirect from
https down to http is refused before anything reaches the http server. The servers are real
http.server threads on 127.0.0.1 and 127.0.0.2 (two loopback addresses: two hosts), the TLS one
with a self-signed certificate made by the openssl command line and trusted through PIP_CERT's
setting (index_config.Config.cert), as a user would."""

from __future__ import annotations

import base64
import gc
import hashlib
import http.server
import json
import os
import shutil
import ssl
import subprocess
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from megatron_env.kernels import source_trees
from megatron_env.recipes import recipe
from megatron_env.sources import http as http_mod
from megatron_env.sources import index, index_config

from .conftest import user_error

BODY = b"the pinned sdist\n" * 64
SHA = hashlib.sha256(BODY).hexdigest()
NAME = "tinyk-1.0.tar.gz"
BASIC = "Basic " + base64.b64encode(b"user:s3cret-pass").decode()


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers from its server's `routes` (path -> ("redirect", URL) | ("page", files) |
    ("file", bytes)) and records (path, Authorization) of every request in `seen`."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        srv.seen.append((self.path, self.headers.get("Authorization")))  # type: ignore[attr-defined]
        kind, value = srv.routes.get(self.path, ("missing", None))  # type: ignore[attr-defined]
        if kind == "redirect":
            self.send_response(302)
            self.send_header("Location", value)
            self.end_headers()
        elif kind in ("page", "file"):
            data = (json.dumps({"meta": {"api-version": "1.0"}, "name": "tinyk", "files": [
                {"filename": NAME, "url": value, "hashes": {"sha256": SHA}}]}).encode()
                if kind == "page" else value)
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json"
                             if kind == "page" else "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_response(404)
            self.end_headers()


class Server:
    def __init__(self, host: str, tls: ssl.SSLContext | None = None) -> None:
        self.httpd = http.server.ThreadingHTTPServer((host, 0), Recorder)
        if tls:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.seen, self.httpd.routes = [], {}  # type: ignore[attr-defined]
        scheme = "https" if tls else "http"
        self.base = f"{scheme}://{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def seen(self) -> list[tuple[str, str | None]]:
        return self.httpd.seen  # type: ignore[attr-defined,no-any-return]

    def route(self, path: str, kind: str, value: object) -> None:
        self.httpd.routes[path] = (kind, value)  # type: ignore[attr-defined]

    def close(self) -> None:
        """Stop the loop and close the listening socket (shutdown() alone leaves it open)."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def with_user(self) -> str:
        scheme, rest = self.base.split("://")
        return f"{scheme}://user:s3cret-pass@{rest}"


@pytest.fixture
def servers() -> Iterator[dict[str, Server]]:
    try:
        made = {"a": Server("127.0.0.1"), "a2": Server("127.0.0.1"), "b": Server("127.0.0.2")}
    except OSError as e:  # pragma: no cover - a loopback without 127.0.0.2
        pytest.skip(f"no second loopback address: {e}")
    yield made
    for s in made.values():
        s.close()


def _fetch(index_url: str, dest: Path, cert: str | None = None) -> index.Fetched:
    return index.fetch("tinyk", NAME, SHA, dest, index_config.Config([index_url], cert=cert),
                       echo=lambda _s: None)


def test_index_credentials_do_not_follow_a_redirect_to_another_host(servers, tmp_path):
    """What `invoke build flash-attn` does with PIP_INDEX_URL=http://user:pass@A/simple: A
    redirects the project page to B, whose page names a file on B. A gets the credentials;
    B gets every request (page and file) without them, and the file arrives checked."""
    a, b = servers["a"], servers["b"]
    a.route("/simple/tinyk/", "redirect", f"{b.base}/simple/tinyk/")
    b.route("/simple/tinyk/", "page", f"{b.base}/files/{NAME}")
    b.route(f"/files/{NAME}", "file", BODY)
    got = _fetch(a.with_user() + "/simple", tmp_path / NAME)
    assert got.path.read_bytes() == BODY
    assert a.seen == [("/simple/tinyk/", BASIC)]
    assert b.seen == [("/simple/tinyk/", None), (f"/files/{NAME}", None)]


def test_another_port_of_the_same_host_is_another_origin(servers, tmp_path):
    a, a2 = servers["a"], servers["a2"]
    a.route("/simple/tinyk/", "page", f"{a2.base}/files/{NAME}")  # listed on another port
    a2.route(f"/files/{NAME}", "redirect", f"{a2.base}/real/{NAME}")
    a2.route(f"/real/{NAME}", "file", BODY)
    _fetch(a.with_user() + "/simple", tmp_path / NAME)
    assert a.seen == [("/simple/tinyk/", BASIC)]
    assert a2.seen == [(f"/files/{NAME}", None), (f"/real/{NAME}", None)]


def test_a_redirect_within_the_host_keeps_the_credentials(servers, tmp_path):
    """A moves its index (a relative redirect) and serves the file itself: every request to A,
    before and after the redirects, carries the index's credentials (pip does the same)."""
    a = servers["a"]
    a.route("/simple/tinyk/", "redirect", "/moved/simple/tinyk/")
    a.route("/moved/simple/tinyk/", "page", f"/files/{NAME}")
    a.route(f"/files/{NAME}", "redirect", f"{a.base}/blobs/{NAME}")
    a.route(f"/blobs/{NAME}", "file", BODY)
    _fetch(a.with_user() + "/simple", tmp_path / NAME)
    assert [p for p, _auth in a.seen] == ["/simple/tinyk/", "/moved/simple/tinyk/",
                                          f"/files/{NAME}", f"/blobs/{NAME}"]
    assert {auth for _p, auth in a.seen} == {BASIC}


def test_a_source_url_with_credentials_keeps_them_at_home(servers, tmp_path, monkeypatch):
    """MEGATRON_ENV_SOURCE_<NAME>=http://user:pass@A/... (the sdist's own URL): A redirects
    to B; B never sees the credentials, and the user's password is in no line printed."""
    a, b = servers["a"], servers["b"]
    a.route(f"/dl/{NAME}", "redirect", f"{b.base}/cdn/{NAME}")
    b.route(f"/cdn/{NAME}", "file", BODY)
    pkg = recipe.Package("tinyk", "1.0", recipe.Source(sha256=SHA, url=NAME), modules=(),
                         cuda=False)
    monkeypatch.setenv(recipe.source_var("tinyk"), f"{a.with_user()}/dl/{NAME}")
    said: list[str] = []
    origin = source_trees.download(pkg, tmp_path / NAME, said.append, None)
    assert (tmp_path / NAME).read_bytes() == BODY
    assert a.seen == [(f"/dl/{NAME}", BASIC)] and b.seen == [(f"/cdn/{NAME}", None)]
    assert "s3cret-pass" not in origin + " ".join(said)


def test_netrc_credentials_go_to_their_host_only(servers, tmp_path, monkeypatch):
    a, b = servers["a"], servers["b"]
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login user password s3cret-pass\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    a.route("/simple/tinyk/", "redirect", f"{b.base}/simple/tinyk/")
    b.route("/simple/tinyk/", "page", f"{b.base}/files/{NAME}")
    b.route(f"/files/{NAME}", "file", BODY)
    _fetch(a.base + "/simple", tmp_path / NAME)
    assert a.seen == [("/simple/tinyk/", BASIC)]
    assert all(auth is None for _p, auth in b.seen) and len(b.seen) == 2


@pytest.fixture
def tls(tmp_path) -> tuple[ssl.SSLContext, Path]:
    """A self-signed certificate for 127.0.0.1, made by the openssl command line."""
    if not shutil.which("openssl"):
        pytest.skip("needs the openssl command line")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx, cert


def test_https_to_http_is_refused_before_the_http_server_is_asked(servers, tls, tmp_path):
    ctx, cert = tls
    a = servers["a"]
    t = Server("127.0.0.1", ctx)
    try:
        t.route("/simple/tinyk/", "page", f"/files/{NAME}")
        t.route(f"/files/{NAME}", "redirect", f"{a.base}/files/{NAME}")  # down to http
        a.route(f"/files/{NAME}", "file", BODY)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", ResourceWarning)
            said = _refused(t.with_user() + "/simple", tmp_path / NAME, str(cert))
            gc.collect()
        assert "from https to plain http; refused" in said
        assert "s3cret-pass" not in said
        assert [str(w.message) for w in seen if w.category is ResourceWarning] == []  # closed
        assert a.seen == []  # never asked, with or without credentials
        assert t.seen == [("/simple/tinyk/", BASIC), (f"/files/{NAME}", BASIC)]
        assert not list(tmp_path.glob(f"{NAME}*"))  # nothing written, no temporary left
    finally:
        t.close()


def _refused(index_url: str, dest: Path, cert: str) -> str:
    """What the refused download says, whole; the error itself goes with this frame (pytest's
    traceback keeps the frame that caught it alive until the frame returns)."""
    with user_error("http.downgrade") as e:
        _fetch(index_url, dest, cert=cert)
    return str(e.value)


def test_origin_fills_default_ports_and_ignores_case():
    assert http_mod.origin("HTTPS://Host.Example/x") == ("https", "host.example", 443)
    assert http_mod.origin("http://h:8080/") == ("http", "h", 8080)
    assert http_mod.origin("http://h/") != http_mod.origin("https://h/")
    assert http_mod.without_userinfo("http://u:p%40x@h:81/s")[1] == \
        "Basic " + base64.b64encode(b"u:p@x").decode()


def test_the_builds_sdist_fetch_with_pip_index_url_keeps_the_password_home(servers, tmp_path,
                                                                           monkeypatch):
    """The path of `invoke build flash-attn` without a local sdist: PIP_INDEX_URL as the user
    sets it, read by the build's own fetch (source_trees.download -> index.fetch)."""
    a, b = servers["a"], servers["b"]
    a.route("/simple/tinyk/", "redirect", f"{b.base}/simple/tinyk/")
    b.route("/simple/tinyk/", "page", f"{b.base}/files/{NAME}")
    b.route(f"/files/{NAME}", "file", BODY)
    for var in [v for v in os.environ if v.startswith(("PIP_", "UV_"))]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", a.with_user() + "/simple")
    monkeypatch.delenv(recipe.source_var("tinyk"), raising=False)
    pkg = recipe.Package("tinyk", "1.0", recipe.Source(sha256=SHA, url=NAME), cuda=False)
    source_trees.download(pkg, tmp_path / NAME, lambda _s: None, None)
    assert (tmp_path / NAME).read_bytes() == BODY
    assert a.seen == [("/simple/tinyk/", BASIC)]
    assert [auth for _p, auth in b.seen] == [None, None]
