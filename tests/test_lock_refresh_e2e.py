"""The lock-refresh flow end to end, as the scheduled workflow runs it, minus GitHub: a local bare
"remote", a local package index (PEP 503 HTML on localhost, tiny wheels built here, one version
yanked), a tiny profile; `invoke lock --refresh` moves a package, the lock-diff names it with its
size change, a second refresh changes nothing, the bot's branch is pushed, a yanked pin is
flagged. Real uv, real git, real HTTP; no network beyond 127.0.0.1, no torch (a stand-in wheel
named torch)."""

import base64
import csv
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from megatron_env.errors import UserError
from megatron_env.pyenv import lockdiff, lockdiff_markdown
from megatron_env.sources import index as sources_index

from .conftest import tiny_profile
from .gitrepo import project_files

ROOT = Path(__file__).resolve().parent.parent
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
GIT = ["git", "-c", "user.name=bot", "-c", "user.email=bot@example.invalid",
       "-c", "init.defaultBranch=main"]


def make_wheel(dest: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A real, installable py3-none-any wheel with METADATA, WHEEL and RECORD."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"__version__ = {version!r}\n".encode(),
             f"{dist}/METADATA": ("Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                                  + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    record = io.StringIO()
    w = csv.writer(record, lineterminator="\n")
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        w.writerow([path, f"sha256={digest}", len(data)])
    w.writerow([f"{dist}/RECORD", "", ""])
    out = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, data in {**files, f"{dist}/RECORD": record.getvalue().encode()}.items():
            z.writestr(path, data)
    return out


class Index:
    """A PEP 503 tree under `root/simple` (PEP 691 JSON too when asked by Accept), served on
    127.0.0.1 by a thread of this process, stopped by its object."""

    def __init__(self, root: Path):
        self.root = root
        self.files: dict[str, list[tuple[Path, str | None]]] = {}  # project -> (wheel, yanked)
        (root / "files").mkdir(parents=True)
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k):
                super().__init__(*a, directory=str(root), **k)

            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                project = self.path.strip("/").split("/")
                if ("vnd.pypi.simple.v1+json" in self.headers.get("Accept", "") and
                        len(project) == 2 and project[0] == "simple" and index.json):
                    body = json.dumps(index.page_json(project[1])).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                super().do_GET()

        self.json = False
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self, name: str, version: str, requires: tuple[str, ...] = (),
                yanked: str | None = None) -> Path:
        wheel = make_wheel(self.root / "files", name, version, requires)
        self.files.setdefault(name, []).append((wheel, yanked))
        self._write(name)
        return wheel

    def yank(self, name: str, version: str, reason: str) -> None:
        self.files[name] = [(w, reason if f"-{version}-" in w.name else y)
                            for w, y in self.files[name]]
        self._write(name)

    def _write(self, name: str) -> None:
        links = []
        for wheel, yanked in self.files[name]:
            sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
            attr = "" if yanked is None else f' data-yanked="{yanked}"'
            links.append(f'<a href="../../files/{wheel.name}#sha256={sha}"{attr}>{wheel.name}</a>')
        d = self.root / "simple" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "<br>\n".join(links)
                                      + "\n</body></html>\n")
        (self.root / "simple" / "index.html").write_text(
            "<html><body>" + "".join(f'<a href="{n}/">{n}</a>' for n in sorted(self.files))
            + "</body></html>")

    def page_json(self, name: str) -> dict:
        return {"meta": {"api-version": "1.1"}, "name": name, "files": [
            {"filename": w.name, "url": f"../../files/{w.name}", "size": w.stat().st_size,
             "hashes": {"sha256": hashlib.sha256(w.read_bytes()).hexdigest()},
             "yanked": False if y is None else y} for w, y in self.files.get(name, [])]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(tmp_path):
    idx = Index(tmp_path / "index")
    yield idx
    idx.close()


PROFILE = tiny_profile(PY, purpose="the refresh flow's test profile")


def git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def repo_with_remote(tmp_path: Path, profile_text: str, extra: dict[str, str] | None = None
                     ) -> Path:
    """This checkout's code plus envs/tiny in a work tree whose origin is a bare repository."""
    work = tmp_path / "work"
    for rel in project_files(ROOT):
        if rel.startswith("megatron_env/") or rel in ("tasks.py", "pyproject.toml"):
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, work / rel)
    for rel, text in {"envs/tiny/profile.toml": profile_text, **(extra or {})}.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    assert git("init", "-q", "--bare", str(tmp_path / "remote.git"), cwd=tmp_path).returncode == 0
    git("init", "-q", cwd=work)
    git("remote", "add", "origin", str(tmp_path / "remote.git"), cwd=work)
    return work


def commit_and_push(work: Path, message: str, branch: str = "main") -> None:
    git("add", "-A", cwd=work)
    assert git("commit", "-qm", message, cwd=work).returncode == 0
    r = git("push", "-q", "origin", f"HEAD:{branch}", cwd=work)
    assert r.returncode == 0, r.stderr
    git("fetch", "-q", "origin", cwd=work)


def run(work: Path, index: Index, *args: str,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(work), "UV_DEFAULT_INDEX": index.url,
           "UV_NO_CONFIG": "1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
           "NO_COLOR": "1", **(env or {})}
    env.pop("UV_INDEX_URL", None)
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    return r


def lock_text(work: Path) -> str:
    return (work / "envs/tiny/requirements.lock").read_text()


def pins(work: Path) -> dict[str, str]:
    from megatron_env.pyenv.lock import parse_lock

    return parse_lock(lock_text(work))


def diff_json(work: Path, index: Index, base: str) -> dict:
    r = ok(run(work, index, "lock-diff", "--base", base, "--json"))
    assert index.url not in r.stdout and "127.0.0.1" not in r.stdout
    doc = json.loads(r.stdout)
    assert doc["format"] == 1 and doc["index_read"] is True
    (prof,) = doc["profiles"]
    return prof


def test_refresh_moves_a_package_diffs_it_pushes_and_flags_a_yank(tmp_path, index):
    size = {}
    size["torch"] = index.publish("torch", "2.1.0").stat().st_size
    size["tinytop"] = index.publish("tinytop", "1.0", ("tinydep>=1.0",)).stat().st_size
    size["tinydep 1.0"] = index.publish("tinydep", "1.0").stat().st_size
    index.publish("tinydep", "1.1", yanked="broken build")
    work = repo_with_remote(tmp_path, PROFILE)
    lock = ("lock", "--profile", "tiny", "--python", sys.executable)

    ok(run(work, index, *lock))
    assert pins(work) == {"tinydep": "1.0", "tinytop": "1.0", "torch": "2.1.0"}  # 1.1 yanked
    commit_and_push(work, "tiny profile and its lock")

    size["tinydep 1.2"] = index.publish("tinydep", "1.2").stat().st_size
    r = ok(run(work, index, *lock))  # a plain lock keeps the pins
    assert "(unchanged)" in r.stdout and pins(work)["tinydep"] == "1.0"
    r = ok(run(work, index, *lock, "--refresh"))
    assert pins(work)["tinydep"] == "1.2" and "(unchanged)" not in r.stdout
    assert "Refreshing tiny" in r.stderr
    ok(run(work, index, "lock", "--check"))  # the seal was made anew, the inputs are the same
    assert "127.0.0.1" not in lock_text(work)

    # idempotent: a second refresh with nothing new leaves the file alone (bytes and mtime)
    before, mtime = lock_text(work), (work / "envs/tiny/requirements.lock").stat().st_mtime_ns
    r = ok(run(work, index, *lock, "--refresh"))
    assert "(unchanged)" in r.stdout and lock_text(work) == before
    assert (work / "envs/tiny/requirements.lock").stat().st_mtime_ns == mtime

    prof = diff_json(work, index, "origin/main")
    assert prof["changes"] == [{"name": "tinydep", "change": "upgraded", "old": "1.0",
                                "new": "1.2", "major": False, "yanked": None,
                                "size_old": size["tinydep 1.0"],
                                "size_new": size["tinydep 1.2"]}]
    assert prof["size_before"] == size["torch"] + size["tinytop"] + size["tinydep 1.0"]
    assert prof["size_after"] == size["torch"] + size["tinytop"] + size["tinydep 1.2"]
    assert prof["yanked"] == [] and prof["kernels"] == [] and not prof["megatron"]["moved"]
    md = ok(run(work, index, "lock-diff", "--base", "origin/main", "--markdown")).stdout
    kb = lambda n: f"{n / 1e3:,.1f} kB"  # noqa: E731
    assert (f"| tinydep | upgraded | 1.0 | 1.2 | {kb(size['tinydep 1.0'])} | "
            f"{kb(size['tinydep 1.2'])} |  |") in md
    assert "1 upgraded; download per node" in md

    # the bot: the fixed branch, one commit, pushed (force: it is the bot's own branch)
    assert git("switch", "-qC", "lock-refresh/tiny", cwd=work).returncode == 0
    commit_and_push(work, "locks: refresh tiny (invoke lock --refresh)", "lock-refresh/tiny")
    remote = git("ls-remote", "origin", "refs/heads/lock-refresh/tiny", cwd=work).stdout
    assert remote.split()[0] == git("rev-parse", "HEAD", cwd=work).stdout.strip()
    ok(run(work, index, *lock, "--refresh"))
    assert git("diff", "--quiet", cwd=work).returncode == 0  # nothing moved: nothing to push
    assert ok(run(work, index, "lock-diff", "--base", "HEAD")).stdout.strip() == "No lock changes."

    # 1.2 is yanked after it was locked: flagged; the refresh moves off it (1.1 is yanked too)
    index.yank("tinydep", "1.2", "bad metadata")
    prof = diff_json(work, index, "HEAD")
    assert prof["changes"] == []
    assert prof["yanked"] == [{"name": "tinydep", "version": "1.2", "reason": "bad metadata"}]
    md = ok(run(work, index, "lock-diff", "--base", "HEAD")).stdout
    assert "**yanked** on the index: tinydep==1.2 (bad metadata)" in md
    ok(run(work, index, *lock, "--refresh"))
    prof = diff_json(work, index, "HEAD")
    assert [(c["name"], c["change"], c["old"], c["new"], c["yanked"]) for c in prof["changes"]] \
        == [("tinydep", "downgraded", "1.2", "1.0", None)]

    index.publish("tinydep", "2.0")  # a major jump
    ok(run(work, index, *lock, "--refresh"))
    prof = diff_json(work, index, "HEAD")
    assert [(c["name"], c["change"], c["new"], c["major"]) for c in prof["changes"]] \
        == [("tinydep", "upgraded", "2.0", True)]
    md = ok(run(work, index, "lock-diff", "--base", "HEAD", "--markdown")).stdout
    assert "| tinydep | upgraded | 1.2 | 2.0 |" in md and "**major**" in md


def test_kernel_keys_torch_and_megatron_moves_are_named(tmp_path, index):
    """A patch edited, the torch pin moved and Megatron's commit moved: lock-diff names the
    kernel build whose cache key changes (and why) and the commit, from the profiles alone."""
    index.publish("torch", "2.1.0")
    index.publish("torch", "2.2.0")
    index.publish("tinytop", "1.0")
    text = PROFILE.replace('packages = ["ninja"]', 'packages = ["ninja"]\n\n'
                           '[kernels.flash-attn]\nversion = "2.8.3"\n'
                           f'sha256 = "{"1" * 64}"\n')
    patch = "patches/flash-attn/2.8.3/0001-fix.patch"
    work = repo_with_remote(tmp_path, text, {patch: "why\n\ndiff --git a/x b/x\n"})
    lock = ("lock", "--profile", "tiny", "--python", sys.executable)
    ok(run(work, index, *lock))
    commit_and_push(work, "base")

    (work / patch).write_text("why, better\n\ndiff --git a/x b/x\n")
    prof = diff_json(work, index, "origin/main")
    assert prof["changes"] == [] and not prof["megatron"]["moved"]
    assert prof["kernels"] == [{"recipe": "flash-attn", "status": "new key",
                                "inputs": ["patches"]}]

    prof_file = work / "envs/tiny/profile.toml"
    prof_file.write_text(prof_file.read_text().replace('"2.1.0"', '"2.2.0"')
                         .replace("a" * 40, "b" * 40))
    ok(run(work, index, *lock))
    prof = diff_json(work, index, "origin/main")
    assert [(c["name"], c["old"], c["new"]) for c in prof["changes"]] == [("torch", "2.1.0",
                                                                           "2.2.0")]
    assert prof["kernels"] == [{"recipe": "flash-attn", "status": "new key",
                                "inputs": ["patches", "torch"]}]
    assert prof["megatron"] == {"old": "a" * 40, "new": "b" * 40, "moved": True}
    md = ok(run(work, index, "lock-diff", "--base", "origin/main")).stdout
    assert "kernel build **flash-attn**: new key (patches, torch)" in md
    assert "Megatron-LM commit moved: aaaaaaaaaaaa → bbbbbbbbbbbb" in md

    offline = ok(run(work, index, "lock-diff", "--base", "origin/main", "--json", "--offline"))
    doc = json.loads(offline.stdout)
    assert doc["index_read"] is False and doc["profiles"][0]["size_after"] is None
    # an index that cannot be read: one warning line (no credentials in it), the rest holds
    gone = ok(run(work, index, "lock-diff", "--base", "origin/main", "--json", "--index-url",
                  "http://u:secret@127.0.0.1:9/simple"))
    assert json.loads(gone.stdout)["profiles"][0]["kernels"] == prof["kernels"]
    assert "could not be read" in gone.stderr and "secret" not in gone.stderr + gone.stdout


def test_bad_input_is_one_line(tmp_path, index):
    work = repo_with_remote(tmp_path, PROFILE)
    commit_and_push(work, "base")
    for args, words in [(("lock-diff", "--base", "nope"), "'nope' is not a git revision"),
                        (("lock-diff", "--profile", "nope"), "unknown profile 'nope'"),
                        (("lock-diff", "--json", "--markdown"), "--markdown and --json"),
                        (("lock", "--refresh", "--upgrade-package", "x"), "--refresh moves")]:
        r = run(work, index, *args)
        assert r.returncode == 2 and words in r.stderr and "hint:" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize("as_json", [False, True], ids=["pep503-html", "pep691-json"])
def test_the_index_reader_reads_yanked_hashes_and_sizes(index, as_json, capsys):
    index.json = as_json
    w = index.publish("tinydep", "1.0")
    index.publish("tinydep", "1.1", yanked="broken build")
    index.publish("tinydep", "1.2", yanked="")
    got = {f.name: f for f in sources_index.files("TinyDep", index.url)}
    assert set(got) == {f"tinydep-{v}-py3-none-any.whl" for v in ("1.0", "1.1", "1.2")}
    one = got[w.name]
    assert one.sha256 == hashlib.sha256(w.read_bytes()).hexdigest()
    assert one.yanked is False and one.reason == ""
    assert got["tinydep-1.1-py3-none-any.whl"].yanked is True
    assert got["tinydep-1.1-py3-none-any.whl"].reason == "broken build"
    assert got["tinydep-1.2-py3-none-any.whl"].yanked is True  # yanked, no reason given
    assert got["tinydep-1.2-py3-none-any.whl"].reason == ""
    assert one.size == (w.stat().st_size if as_json else None)  # HTML carries no size...
    assert sources_index.size(one) == w.stat().st_size  # ...a HEAD request does
    # a wrong index: no such page (404) lists nothing, and lock-diff calls it not read
    wrong = index.url.replace("/simple", "/nothing")
    assert sources_index.files("tinydep", wrong) == []
    assert lockdiff.read_index({"tinydep"}, wrong) == {"tinydep": None}
    assert "could not be read" in capsys.readouterr().err
    assert lockdiff.read_index({"tinydep"}, index.url)["tinydep"] is not None
    with pytest.raises(UserError):  # nothing listening there
        sources_index.files("tinydep", "http://127.0.0.1:9/simple")


def test_a_node_fetches_the_best_wheel_the_lock_allows():
    """Real torch 2.11.0 file names (PyPI's simple page): the x86_64 cp312 wheel, not the
    aarch64, Windows or cp313 one; no compatible file: the sdist; no allowed hash: nothing."""
    def f(name, sha):
        return sources_index.IndexFile(name, "u", sha, size=1)

    files = [f("torch-2.11.0-cp312-cp312-manylinux_2_28_aarch64.whl", "a"),
             f("torch-2.11.0-cp312-cp312-win_amd64.whl", "b"),
             f("torch-2.11.0-cp313-cp313-manylinux_2_28_x86_64.whl", "c"),
             f("torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl", "d"),
             f("torch-2.11.0.tar.gz", "e")]
    assert lockdiff.pick(files, set("abcde"), "3.12").sha256 == "d"
    assert lockdiff.pick(files, set("abcde"), "3.11").sha256 == "e"
    assert lockdiff.pick(files, {"b"}, "3.12") is None


def test_a_wheel_with_several_tags_ranks_by_its_best_one():
    """numpy's real compressed tag set (manylinux_2_17 and manylinux2014): pip ranks a wheel by
    the best tag it carries, so it beats a manylinux_2_12-only wheel whatever the order; a wheel
    ranked by its worst tag would lose to it."""
    def f(name, sha):
        return sources_index.IndexFile(name, "u", sha, size=1)

    both = f("numpy-1.21.6-cp310-cp310-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "a")
    older = f("numpy-1.21.6-cp310-cp310-manylinux_2_12_x86_64.whl", "b")
    for files in ([both, older], [older, both]):
        assert lockdiff.pick(files, {"a", "b"}, "3.10") is both
    assert lockdiff.pick([older, f("numpy-1.21.6.zip", "c")], {"b", "c"}, "3.10") is older


def test_pick_skips_what_it_cannot_use_and_keeps_the_index_order_among_equals():
    """A file whose hash the lock does not allow, or whose wheel name does not parse, is passed
    over (not the end of the search); of two wheels with the same tags the first listed wins,
    as pip keeps the index's order among equal candidates; a .zip sdist is an sdist."""
    def f(name, sha):
        return sources_index.IndexFile(name, "u", sha, size=1)

    good = f("six-1.16.0-py2.py3-none-any.whl", "a")
    assert lockdiff.pick([f("six-1.16.0-py2.py3-none-any.whl", "x"), good], {"a"}, "3.10") is good
    assert lockdiff.pick([f("six-1.16.0.whl", "b"), good], {"a", "b"}, "3.10") is good
    twin = f("six-1.16.0-py2.py3-none-any.whl", "c")
    assert lockdiff.pick([good, twin], {"a", "c"}, "3.10") is good
    zipped = f("six-1.16.0.zip", "d")
    assert lockdiff.pick([zipped], {"d"}, "3.10") is zipped


def test_pick_ranks_the_nodes_platforms_not_this_machines():
    """The nodes run manylinux x86_64 wheels: a wheel built for a bare linux_x86_64 tag (this
    machine could install it) is never picked, nor a py3 wheel of such a platform; a
    cp312-none-any wheel is."""
    def f(name, sha):
        return sources_index.IndexFile(name, "u", sha, size=1)

    sdist = f("tiny-1.0.tar.gz", "s")
    for name in ("tiny-1.0-cp312-cp312-linux_x86_64.whl", "tiny-1.0-py3-none-linux_x86_64.whl"):
        assert lockdiff.pick([f(name, "w"), sdist], {"w", "s"}, "3.12") is sdist, name
    anyplat = f("tiny-1.0-cp312-none-any.whl", "w")
    assert lockdiff.pick([anyplat, sdist], {"w", "s"}, "3.12") is anyplat


def test_cut_keeps_a_row_that_fills_the_budget_exactly():
    """Four 3-byte rows into 9 bytes with a 1-byte note: the note and its two newlines take 3,
    two rows fill the other 6 exactly and are kept."""
    assert lockdiff_markdown.cut("aa\nbb\ncc\ndd\n", 9, "N") == "aa\nbb\n\nN\n"


def test_added_profile_is_one_line_and_shallow_or_no_git_say_what_to_do(tmp_path, index):
    index.publish("torch", "2.1.0")
    index.publish("tinytop", "1.0", ("tinydep>=1.0",))
    index.publish("tinydep", "1.0")
    work = repo_with_remote(tmp_path, PROFILE)
    ok(run(work, index, "lock", "--profile", "tiny", "--python", sys.executable))
    commit_and_push(work, "tiny")
    text = (work / "envs/tiny/profile.toml").read_text().replace("default = true\n", "")
    shutil.copytree(work / "envs/tiny", work / "envs/tiny2")
    (work / "envs/tiny2/profile.toml").write_text(text)
    md = ok(run(work, index, "lock-diff", "--base", "origin/main", "--markdown")).stdout
    assert "### tiny2 (`envs/tiny2/requirements.lock`)" in md
    assert "profile added: 3 packages, download per node" in md
    assert "| tinytop |" not in md  # no row per package
    commit_and_push(work, "tiny2")
    shallow = tmp_path / "shallow"
    origin = git("remote", "get-url", "origin", cwd=work).stdout.strip()
    assert git("clone", "-q", "--depth", "1", f"file://{origin}", str(shallow),
               cwd=tmp_path).returncode == 0
    r = run(shallow, index, "lock-diff", "--base", "HEAD~1")
    assert r.returncode == 2 and "git fetch --unshallow" in r.stderr, r.stderr
    nogit = tmp_path / "nogit"
    shutil.copytree(work, nogit, ignore=shutil.ignore_patterns(".git"))
    # CI's temporary directories lie inside its clone: git must not look above the copy
    r = run(nogit, index, "lock-diff", env={"GIT_CEILING_DIRECTORIES": str(tmp_path)})
    assert r.returncode == 2 and "is not a git repository" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def _comment_step() -> str:
    import yaml

    doc = yaml.safe_load((ROOT / ".github/workflows/lock-check.yml").read_text())
    (step,) = doc["jobs"]["comment"]["steps"]
    return step["run"]


@pytest.mark.parametrize("listing", ["fails", "two"])
def test_the_sticky_comment_step_never_posts_a_duplicate(tmp_path, listing):
    """The comment step as GitHub runs it (bash -e), with a stand-in `gh`: a listing that fails
    fails the step and posts nothing; a listing of two comments updates the first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    answer = ('echo "HTTP 502: Bad Gateway" >&2; exit 1' if listing == "fails"
              else 'printf "11\\n12\\n"')
    (bin_dir / "gh").write_text(f"""#!/bin/bash
echo "$*" >> {calls}
case "$*" in
  *--paginate*) {answer} ;;
  *) cat > /dev/null ;;
esac
""")
    (bin_dir / "gh").chmod(0o755)
    script = tmp_path / "step.sh"
    script.write_text(_comment_step())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GH_TOKEN": "t",
           "REPO": "o/r", "PR": "7", "MARKDOWN": "| a | b |"}
    r = subprocess.run(["bash", "-e", str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    made = calls.read_text().splitlines()
    assert not [c for c in made if "POST" in c], made
    if listing == "fails":
        assert r.returncode != 0
    else:
        assert r.returncode == 0, r.stderr
        assert any("PATCH repos/o/r/issues/comments/11" in c for c in made), made


def test_a_long_diff_is_cut_at_a_row_never_inside_a_character():
    rows = [f"| pkg{i} | upgraded | 1.{i} | 2.{i} | {'é' * (i % 7)}ü |" for i in range(400)]
    text = "### p\n\n| package | change |\n|---|---|\n" + "\n".join(rows) + "\n"
    note = "_(truncated)_"
    for limit in (120, 1001, 5003, len(text.encode()) - 1):
        short = lockdiff_markdown.cut(text, limit, note)
        raw = short.encode()
        assert len(raw) <= limit
        body = raw.decode().removesuffix("\n" + note + "\n")  # decodes: no character cut
        assert short.endswith(note + "\n")
        assert text.startswith(body) and (body == "" or body.endswith("|\n") or
                                          body.endswith("\n"))
        assert all(line.endswith("|") or not line.startswith("|")
                   for line in body.splitlines())
    assert lockdiff_markdown.cut(text, len(text.encode()), note) == text
