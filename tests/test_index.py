"""A pinned sdist fetched from a package index by its file name, checked by sha256, with nothing
of the package run: the simple API's two forms parsed on real pages (fixtures/index/README.md),
pip's and uv's configuration read, and a real local index (http.server) serving an sdist whose
setup.py would raise and leave a mark if anything executed it."""

import gc
import hashlib
import http.server
import io
import json
import tarfile
import threading
import warnings
from pathlib import Path

import pytest

from megatron_env import profile
from megatron_env.errors import UserError
from megatron_env.kernels import build, source_trees
from megatron_env.recipes import recipe
from megatron_env.redact import mask_urls
from megatron_env.sources import index, index_config

FIX = Path(__file__).parent / "fixtures" / "index"
PYPI = "https://pypi.org/simple/"


def test_both_forms_of_a_real_project_page_give_the_same_files():
    j = index.parse_json((FIX / "flash-attn.json").read_text(), PYPI + "flash-attn/")
    h = index.parse_html((FIX / "flash-attn.html").read_text(), PYPI + "flash-attn/")
    assert len(j) == len(h) == 77
    assert {(f.name, f.sha256, f.url) for f in j} == {(f.name, f.sha256, f.url) for f in h}
    pinned = profile.load("core_v0.4.0-cu121").kernels["flash-attn"]["sha256"]
    sdist = next(f for f in j if f.name == "flash_attn-2.5.8.tar.gz")
    assert sdist.sha256 == pinned and sdist.size == 2474099 and not sdist.yanked
    assert sdist.url.startswith("https://files.pythonhosted.org/packages/")


def test_yanked_files_and_their_reasons_in_both_forms():
    for parse, name in ((index.parse_json, "requests.json"), (index.parse_html, "requests.html")):
        files = parse((FIX / name).read_text(), PYPI + "requests/")
        yanked = {f.name: f.reason for f in files if f.yanked}
        assert sorted(yanked) == ["requests-2.32.0-py3-none-any.whl", "requests-2.32.0.tar.gz",
                                  "requests-2.32.1-py3-none-any.whl", "requests-2.32.1.tar.gz"]
        assert set(yanked.values()) == {"Yanked due to conflicts with CVE-2024-35195 mitigation"}
        assert next(f for f in files if f.name == "requests-2.31.0.tar.gz").yanked is False


def test_the_configured_indexes_come_from_pip_and_uv_settings():
    conf = "[global]\nindex-url = https://mirror.example/simple/\nfind-links = /srv/wheels\n" \
           "extra-index-url = file:///srv/a/simple file:///srv/b/simple\n"
    s = index_config.settings({}, [conf])
    assert s.indexes == ["https://mirror.example/simple", "file:///srv/a/simple",
                         "file:///srv/b/simple"]
    assert s.find_links == ["/srv/wheels"] and not s.no_index
    s = index_config.settings({"PIP_INDEX_URL": "https://env.example/simple",
                        "UV_INDEX": "internal=https://uv.example/simple"}, [conf])
    assert s.indexes == ["https://env.example/simple", "file:///srv/a/simple",
                         "file:///srv/b/simple", "https://uv.example/simple"]
    assert index_config.settings({}, []).indexes == [index_config.DEFAULT_INDEX]
    assert index_config.settings({"UV_DEFAULT_INDEX": "https://u/simple"}, []).indexes == [
        "https://u/simple"]
    s = index_config.settings({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/a /b"}, [conf])
    assert s.no_index and s.indexes == [] and s.find_links == ["/a", "/b"]
    assert index_config.settings({"UV_NO_INDEX": "1"}, [conf]).no_index
    s = index_config.settings({"UV_NO_INDEX": "1", "PIP_INDEX_URL": "https://p/simple"}, [])
    assert not s.no_index and s.indexes == ["https://p/simple"]  # pip's own word wins for pip
    user = "[global]\nindex-url = https://user.example/simple\n"
    assert index_config.settings({}, [conf, user]).indexes[0] == "https://user.example/simple"
    assert index_config.pip_config_files({"PIP_CONFIG_FILE": "/dev/null"}) == []


def test_the_installer_index_is_uv_s_then_pip_s_and_shown_without_credentials(tmp_path):
    """lock-diff's index: uv's settings (it resolves the locks; it reads no pip setting), then
    pip's configuration, then PyPI; its credentials never in a message."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\n")
    env = {"UV_NO_CONFIG": "1", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "PIP_CONFIG_FILE": str(conf)}
    assert index_config.installer_index(env) == "https://mirror.example/simple"
    env["PIP_INDEX_URL"] = "https://pip.example/simple"
    assert index_config.installer_index(env) == "https://pip.example/simple"
    env["UV_DEFAULT_INDEX"] = "https://u:secret@uv.example/simple"
    assert index_config.installer_index(env) == "https://u:secret@uv.example/simple"
    assert mask_urls(index_config.installer_index(env)) == "https://***@uv.example/simple"
    # uv.toml (unless UV_NO_CONFIG) comes before pip's word, after uv's variables
    uv = tmp_path / "cfg" / "uv" / "uv.toml"
    uv.parent.mkdir(parents=True)
    uv.write_text('[[index]]\nname = "other"\nurl = "https://other.example/simple"\n\n'
                  '[[index]]\nurl = "https://uvtoml.example/simple"\ndefault = true\n')
    del env["UV_DEFAULT_INDEX"]
    assert index_config.installer_index(env) == "https://pip.example/simple"  # UV_NO_CONFIG
    del env["UV_NO_CONFIG"]
    assert index_config.installer_index(env) == "https://uvtoml.example/simple"
    assert index_config.uv_default_index('index-url = "https://old.example/simple"\n') == \
        "https://old.example/simple"
    assert index_config.uv_default_index("not toml [") is None
    assert index_config.installer_index({"PIP_CONFIG_FILE": "/dev/null", "UV_NO_CONFIG": "1",
                                  "HOME": str(tmp_path)}) == index_config.DEFAULT_INDEX


RAISES = """import pathlib
pathlib.Path(__file__).with_name("RAN").write_text("setup.py ran")
raise SystemExit("setup.py must never run to download this sdist")
"""


def tiny_sdist(where: Path, name: str = "tinyk", version: str = "1.0") -> Path:
    path = where / f"{name}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in ((f"{name}-{version}/setup.py", RAISES),
                          (f"{name}-{version}/PKG-INFO", f"Name: {name}\nVersion: {version}\n")):
            data = text.encode()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


class Index(http.server.BaseHTTPRequestHandler):
    """/simple/<project>/ in JSON or HTML by the Accept header (or HTML only), /files/<name>;
    requests are recorded; with `auth` set, only that Basic credential gets through."""

    project = "tinyk"
    files: dict[str, Path] = {}
    yanked: dict[str, str] = {}
    html_only = False
    garbled = False  # the JSON page is cut short
    auth: str | None = None
    seen: list[tuple[str, str]] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        Index.seen.append((self.path, self.headers.get("Accept", "")))
        if Index.auth and self.headers.get("Authorization") != Index.auth:
            self.send_response(401)
            self.end_headers()
            return
        parts = self.path.strip("/").split("/")
        if parts[0] == "files" and parts[1] in Index.files:
            return self._send(Index.files[parts[1]].read_bytes(), "application/octet-stream")
        if parts[0] != "simple" or len(parts) != 2 or parts[1] != Index.project:
            self.send_response(404)
            self.end_headers()
            return
        rows = [(n, hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size)
                for n, p in Index.files.items()]
        if "vnd.pypi.simple.v1+json" in self.headers.get("Accept", "") and not Index.html_only:
            doc = {"meta": {"api-version": "1.1"}, "name": Index.project, "files": [
                {"filename": n, "url": f"../../files/{n}", "hashes": {"sha256": h}, "size": s,
                 "yanked": Index.yanked.get(n, False)} for n, h, s in rows]}
            body = json.dumps(doc).encode()
            return self._send(body[:len(body) // 2] if Index.garbled else body,
                              "application/vnd.pypi.simple.v1+json")
        body = "".join(f'<a href="../../files/{n}#sha256={h}"'
                       + (f' data-yanked="{Index.yanked[n]}"' if n in Index.yanked else "")
                       + f">{n}</a>\n" for n, h, _s in rows)
        self._send(f"<html><body>{body}</body></html>".encode(), "text/html")

    def _send(self, data: bytes, kind: str):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _reset() -> None:
    Index.files, Index.yanked, Index.html_only, Index.auth = {}, {}, False, None
    Index.garbled = False
    Index.project = "tinyk"
    Index.seen = []


@pytest.fixture
def served(tmp_path):
    _reset()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()  # shutdown() stops the loop; the listening socket is closed here
    _reset()  # test_bundle serves this class too


def _pkg(sdist: Path) -> recipe.Package:
    r = recipe.Recipe("tinyk", "a test recipe", "sdist", sdist="tinyk-{version}.tar.gz",
                      cuda=False)
    return recipe.resolve(r, {"version": "1.0",
                              "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest()}, [])


@pytest.mark.parametrize("html_only", [False, True])
def test_build_fetches_the_pinned_sdist_from_the_index_without_running_it(
        served, tmp_path, monkeypatch, html_only):
    sdist = tiny_sdist(tmp_path)
    Index.files = {sdist.name: sdist}
    Index.html_only = html_only
    monkeypatch.setenv("MEGATRON_ENV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", served)
    for var in ("PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_EXTRA_INDEX_URL", "UV_INDEX",
                "UV_FIND_LINKS", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    said = []
    tree = source_trees.fetch(_pkg(sdist), said.append)
    assert (tree / "setup.py").read_text() == RAISES and not (tree / "RAN").exists()
    assert said[0] == "tinyk: fetching tinyk-1.0.tar.gz from the package index"
    assert said[1].startswith(f"tinyk: downloading tinyk-1.0.tar.gz from {served}")
    assert Index.seen[0][0] == "/simple/tinyk/" and "json" in Index.seen[0][1]
    assert Index.seen[1][0] == "/files/tinyk-1.0.tar.gz"


def test_a_yanked_sdist_is_named_and_another_file_under_its_name_refused(
        served, tmp_path, capsys):
    sdist = tiny_sdist(tmp_path)
    Index.files, Index.yanked = {sdist.name: sdist}, {sdist.name: "broken metadata"}
    cfg = index_config.Config([served])
    got = index.fetch("tinyk", sdist.name, hashlib.sha256(sdist.read_bytes()).hexdigest(),
                      tmp_path / "out.tar.gz", cfg, echo=lambda *_: None)
    assert got.yanked and got.yanked.reason == "broken metadata"
    assert (tmp_path / "out.tar.gz").read_bytes() == sdist.read_bytes()
    with pytest.raises(UserError) as e:
        index.fetch("tinyk", sdist.name, "0" * 64, tmp_path / "x.tar.gz", cfg,
                    echo=lambda *_: None)
    assert e.value.message.startswith(f"{sdist.name}: no copy with the pinned sha256 {'0' * 64}")
    assert not list(tmp_path.glob("x.tar.gz*"))  # nor any temporary of it
    with pytest.raises(UserError, match=r"nothere-1.0.tar.gz is on none of: http://127.0.0.1"):
        index.fetch("tinyk", "nothere-1.0.tar.gz", "0" * 64, tmp_path / "y", cfg,
                    echo=lambda *_: None)


def test_build_names_a_yanked_sdist_in_a_warning(served, tmp_path, monkeypatch, capsys):
    sdist = tiny_sdist(tmp_path)
    Index.files, Index.yanked = {sdist.name: sdist}, {sdist.name: "do not use"}
    monkeypatch.setenv("MEGATRON_ENV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", served)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    source_trees.fetch(_pkg(sdist), lambda *_: None)
    err = " ".join(capsys.readouterr().err.split())
    assert ("warning: tinyk: tinyk-1.0.tar.gz is yanked on its index (do not use); using it "
            "because the profile pins its sha256") in err


def test_credentials_in_the_index_url_go_in_a_header_and_never_in_messages(served, tmp_path):
    import base64

    sdist = tiny_sdist(tmp_path)
    Index.files = {sdist.name: sdist}
    Index.auth = "Basic " + base64.b64encode(b"me:s3cret").decode()
    with_cred = served.replace("http://", "http://me:s3cret@")
    said = []
    index.fetch("tinyk", sdist.name, hashlib.sha256(sdist.read_bytes()).hexdigest(),
                tmp_path / "a", index_config.Config([with_cred]), echo=said.append)
    assert "s3cret" not in " ".join(said) and "***@127.0.0.1" in said[0]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        said = _refused(served.replace("http://", "http://me:wrong@"))
        gc.collect()
    assert "HTTP 401" in said and "wrong" not in said
    assert [str(w.message) for w in seen if w.category is ResourceWarning] == []  # answer closed


def _refused(index_url: str) -> str:
    """The message index.files raises for `index_url`; the error itself goes with this frame
    (pytest's traceback keeps the frame that caught it alive until the frame returns)."""
    with pytest.raises(UserError) as e:
        index.files("tinyk", index_url, index_config.Config())
    return e.value.message


def test_a_file_index_and_a_find_links_directory(tmp_path):
    sdist = tiny_sdist(tmp_path)
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    page = tmp_path / "idx" / "simple" / "tinyk"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="../../../{sdist.name}#sha256={sha}">'
                                     f"{sdist.name}</a>")
    cfg = index_config.Config([(tmp_path / "idx" / "simple").as_uri()])
    got = index.fetch("TinyK", sdist.name, sha, tmp_path / "a", cfg, echo=lambda *_: None)
    listed = index.files("tinyk", cfg.indexes[0])
    assert [f.name for f in listed] == [sdist.name] and listed[0].size is None
    assert index.size(listed[0]) == sdist.stat().st_size  # the file's own, on disk
    assert index.files("nothere", cfg.indexes[0]) == []
    assert got.source == sdist.as_uri() and (tmp_path / "a").read_bytes() == sdist.read_bytes()
    got = index.fetch("tinyk", sdist.name, sha, tmp_path / "b",
                      index_config.Config([], [str(tmp_path)], True), echo=lambda *_: None)
    assert got.source == str(sdist)


def test_an_unreachable_index_says_so_and_offers_the_ways_on(tmp_path, monkeypatch):
    """A node without an index: the fix names a local copy of the sdist or --no-builds."""
    monkeypatch.setenv("MEGATRON_ENV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv(recipe.source_var("flash-attn"), raising=False)
    pkg = build.packages(profile.load("core_v0.4.0-cu121"))["flash-attn"]
    with pytest.raises(UserError) as e:
        source_trees.fetch(pkg, echo=lambda *_: None)
    assert e.value.message.startswith("cannot fetch the flash-attn 2.5.8 sdist: cannot read "
                                      "http://127.0.0.1:9/simple/flash-attn/")
    assert "MEGATRON_ENV_SOURCE_FLASH_ATTN" in e.value.fix and "--no-builds" in e.value.fix


def test_a_page_that_is_not_the_simple_api_is_one_line(served, tmp_path):
    """A JSON page cut short: one error naming the page, credentials masked; a fetch goes on to
    the next index, which has the file."""
    sdist = tiny_sdist(tmp_path)
    Index.files, Index.garbled = {sdist.name: sdist}, True
    with_cred = served.replace("http://", "http://me:s3cret@")
    with pytest.raises(UserError) as e:
        index.files("tinyk", with_cred)
    assert e.value.message.startswith(f"{served}/tinyk/ is not a simple API project page (")
    assert "s3cret" not in e.value.message and "\n" not in e.value.message
    page = tmp_path / "idx" / "tinyk"
    page.mkdir(parents=True)
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    (page / "index.html").write_text(f'<a href="../../{sdist.name}#sha256={sha}">x</a>')
    got = index.fetch("tinyk", "x", sha, tmp_path / "a",
                      index_config.Config([with_cred, (tmp_path / "idx").as_uri()]),
                      echo=lambda *_: None)
    assert got.source == sdist.as_uri()
