"""Resources: pinned content in place of a submodule (megatron_env/sources/resources.py), with real
git, tar and zip on small inputs made here. TE takes cutlass's two header trees by git tree id
and cudnn-frontend's headers from its release wheel by sha256 (recipes/transformer_engine.py)."""

import hashlib
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from megatron_env.errors import UserError
from megatron_env.recipes import recipe
from megatron_env.recipes.recipe import Recipe, Resource
from megatron_env.sources import resources


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path):
    """A repository with include/ and tools/util/include/ (what TE reads of cutlass) and more."""
    repo = tmp_path / "cutlass"
    for rel, text in {"include/a.h": "#define A 1\n", "include/sub/b.h": "int b;\n",
                      "tools/util/include/u.h": "// u\n", "media/big.png": "x" * 1000,
                      "README.md": "hi\n"}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    (repo / "include" / "run.sh").write_text("#!/bin/sh\n")
    (repo / "include" / "run.sh").chmod(0o755)  # the mode is part of the tree id
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c", cwd=repo)
    commit = git("rev-parse", "HEAD", cwd=repo)
    tar = tmp_path / "paths.tar"
    subprocess.run(["git", "archive", "-o", tar, commit, "include", "tools/util/include"],
                   cwd=repo, check=True)
    return {"repo": repo, "commit": commit, "tar": tar}


def headers(up, tree: str) -> Resource:
    return Resource("cutlass-headers", "3rdparty/cutlass", "3rdparty/cutlass", up["commit"],
                    ("include", "tools/util/include"), "the build reads these only",
                    repo=str(up["repo"]), commit=up["commit"], tree=tree)


def tree_of(up, tmp_path) -> str:
    work = tmp_path / "unpacked"
    with tarfile.open(up["tar"]) as t:
        t.extractall(work, filter="data")
    return resources.tree_id(work, ("include", "tools/util/include"))


def test_git_paths_are_placed_and_checked_by_tree_id(upstream, tmp_path, monkeypatch):
    monkeypatch.setenv("MEGATRON_ENV_CACHE", str(tmp_path / "cache"))
    tree = tree_of(upstream, tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    resources.place(headers(upstream, tree), src, echo=lambda *_: None)
    assert (src / "3rdparty/cutlass/include/sub/b.h").read_text() == "int b;\n"
    assert (src / "3rdparty/cutlass/tools/util/include/u.h").exists()
    assert not (src / "3rdparty/cutlass/media").exists()  # only what the build reads
    # the same paths as a tar (offline): the same tree id, so accepted
    monkeypatch.setenv("MEGATRON_ENV_SOURCE_CUTLASS_HEADERS", str(upstream["tar"]))
    other = tmp_path / "src2"
    other.mkdir()
    resources.place(headers(upstream, tree), other, echo=lambda *_: None)
    assert (other / "3rdparty/cutlass/include/run.sh").stat().st_mode & 0o111


def test_a_changed_file_in_the_offline_copy_is_refused(upstream, tmp_path, monkeypatch):
    tree = tree_of(upstream, tmp_path)
    work = tmp_path / "tampered"
    with tarfile.open(upstream["tar"]) as t:
        t.extractall(work, filter="data")
    (work / "include" / "a.h").write_text("#define A 2\n")
    monkeypatch.setenv("MEGATRON_ENV_SOURCE_CUTLASS_HEADERS", str(work))
    (tmp_path / "src").mkdir()
    with pytest.raises(UserError, match=f"holds tree [0-9a-f]{{40}}, the recipe pins {tree}"):
        resources.place(headers(upstream, tree), tmp_path / "src")
    assert not (tmp_path / "src" / "3rdparty").exists()  # nothing placed


def wheel(tmp_path: Path) -> Path:
    w = tmp_path / "nvidia_cudnn_frontend-1.25.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("include/cudnn_frontend.h", "// fe\n")
        z.writestr("include/node/rope.h", "// rope\n")
        z.writestr("cudnn/_compiled_module.so", "binary")
    return w


def frontend(w: Path, sha: str) -> Resource:
    return Resource("cudnn-frontend-headers", "3rdparty/cudnn-frontend", "3rdparty/cudnn-frontend",
                    "e46d7082" * 5, ("include",), "headers from the release wheel",
                    wheel=w.name, sha256=sha)


def test_a_wheel_gives_its_include_tree_and_is_checked_by_sha256(tmp_path, monkeypatch):
    w = wheel(tmp_path)
    monkeypatch.setenv("MEGATRON_ENV_SOURCE_CUDNN_FRONTEND_HEADERS", str(w))
    src = tmp_path / "src"
    src.mkdir()
    sha = hashlib.sha256(w.read_bytes()).hexdigest()
    resources.place(frontend(w, sha), src, echo=lambda *_: None)
    assert (src / "3rdparty/cudnn-frontend/include/node/rope.h").exists()
    assert not (src / "3rdparty/cudnn-frontend/cudnn").exists()
    with pytest.raises(UserError, match=f"has sha256 {sha}, the recipe pins 0000"):
        resources.place(frontend(w, "0" * 64), tmp_path / "src")


def test_a_resource_stands_in_only_at_its_pin_and_enters_the_source_digest(upstream):
    res = headers(upstream, "ab" * 20)
    r = Recipe("pkg", "about", "git", repo="https://example.invalid/pkg.git",
               submodules={"3rdparty/cutlass": "https://example.invalid/cutlass.git"},
               resources=(res,))
    pinned = recipe.resolve(r, {"commit": "c" * 40,
                                "submodules": {"3rdparty/cutlass": upstream["commit"]}}, ["9.0"])
    assert pinned.source.submodules == () and pinned.source.resources == (res,)
    assert pinned.source.digest.endswith(f"+3rdparty/cutlass<tree:{'ab' * 20}")
    moved = recipe.resolve(r, {"commit": "c" * 40, "submodules": {"3rdparty/cutlass": "d" * 40}},
                           ["9.0"])
    assert moved.source.resources == ()  # another pin: the whole submodule from git, as before
    assert moved.source.submodules == (("3rdparty/cutlass", "https://example.invalid/cutlass.git",
                                        "d" * 40),)


def test_a_bundle_carries_each_resource_verifies_it_and_uses_it_without_variables(
        upstream, tmp_path, monkeypatch):
    """What `invoke bundle` keeps of a package's resources (bundle/make.py `_resources`): one
    file each, listed in the manifest and checked by `verify` on unpack (a changed byte is
    refused by name); offline, `use` hands them to the build as `Given.resources`, so the tree
    is placed with no MEGATRON_ENV_SOURCE_* set and the upstream repository gone."""
    from megatron_env.bundle import layout, make, offline
    from megatron_env.bundle.manifest import FORMAT, Manifest
    from megatron_env.sources.given import Given

    from .conftest import user_error

    monkeypatch.setenv("MEGATRON_ENV_CACHE", str(tmp_path / "cache"))
    tree = tree_of(upstream, tmp_path)
    w = wheel(tmp_path)
    sha = hashlib.sha256(w.read_bytes()).hexdigest()
    r = Recipe("pkg", "about", "git", repo="https://example.invalid/pkg.git",
               submodules={"3rdparty/cutlass": "https://example.invalid/cutlass.git",
                           "3rdparty/cudnn-frontend": "https://example.invalid/fe.git"},
               resources=(headers(upstream, tree), frontend(w, sha)))
    pkg = recipe.resolve(r, {"commit": "c" * 40, "submodules": {
        "3rdparty/cutlass": upstream["commit"], "3rdparty/cudnn-frontend": "e46d7082" * 5}},
        ["9.0"])
    monkeypatch.setenv("MEGATRON_ENV_MIRROR_CUTLASS_HEADERS", str(upstream["repo"]))
    monkeypatch.setenv("MEGATRON_ENV_SOURCE_CUDNN_FRONTEND_HEADERS", str(w))  # the index's file
    root = tmp_path / "bundle"
    entries: list = []
    carried = make._resources({"pkg": pkg}, [], root, entries, echo=lambda *_: None)
    assert [(c["name"], c["path"]) for c in carried] == [
        ("cutlass-headers", f"resources/cutlass-headers/cutlass-headers-{tree[:12]}.tar.gz"),
        ("cudnn-frontend-headers", f"resources/cudnn-frontend-headers/{w.name}")]
    files, _written = make._hashed(entries, None, [])
    assert {f["role"] for f in files.values()} == {"resource"}
    def manifest(**over):  # the typed manifest as `use` reads it (bundle/manifest.py)
        d = {"format": FORMAT, "profile": dict.fromkeys(
                 ("name", "digest", "python", "torch", "cuda"), "x"),
             "python": "3.12", "platform": {"machine": "x86_64"}, "mode": "adopt",
             "with_builds": False, "made_at": "now", "files": files, "resources": carried}
        return Manifest.parse({**d, **over}, "test")

    doc = manifest()
    assert [r.path for r in doc.resources] == [c["path"] for c in carried]
    offline.verify(root, doc)  # as made: every file matches
    # offline: no variable, no upstream; the bundle's files are all there is
    monkeypatch.delenv("MEGATRON_ENV_MIRROR_CUTLASS_HEADERS")
    monkeypatch.delenv("MEGATRON_ENV_SOURCE_CUDNN_FRONTEND_HEADERS")
    import shutil
    shutil.rmtree(upstream["repo"])
    offline.check_carried_resources(doc, {"pkg": pkg}, {"pkg"})
    given = Given(resources={r.name: root / r.path for r in doc.resources})  # as `use` does
    src = tmp_path / "src"
    src.mkdir()
    for res in pkg.source.resources:
        resources.place(res, src, echo=lambda *_: None, given=given.resource(res.name))
    assert (src / "3rdparty/cutlass/include/sub/b.h").read_text() == "int b;\n"
    assert (src / "3rdparty/cudnn-frontend/include/node/rope.h").exists()
    # a tampered resource: refused by the manifest on unpack, and by its pin when placed
    cut = root / carried[0]["path"]
    cut.write_bytes(cut.read_bytes() + b"x")
    with pytest.raises(UserError) as e:  # unpack.refusal (its kind is given elsewhere)
        offline.verify(root, doc)
    assert carried[0]["path"] in e.value.message
    fe = root / carried[1]["path"]
    fe.write_bytes(fe.read_bytes() + b"x")
    with user_error("resource.sha256"):
        resources.place(pkg.source.resources[1], src, echo=lambda *_: None,
                        given=given.resource("cudnn-frontend-headers"))
    # a bundle made before resources travelled is refused up front, naming what it lacks
    with user_error("bundle.resource-missing") as e:
        offline.check_carried_resources(manifest(resources=[]), {"pkg": pkg}, {"pkg"})
    assert "cutlass-headers (pkg)" in e.value.message
    offline.check_carried_resources(manifest(resources=[]), {"pkg": pkg}, set())  # none to build
    assert layout.role(carried[0]["path"]) == "resource"
