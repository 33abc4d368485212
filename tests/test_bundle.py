"""Offline bundles for real: made from a local wheelhouse, local bare repositories and local
sdists (no index, no GitHub), then used with no network at all (`unshare -n`): the tool installs
from the bundle, `invoke setup --bundle` ends verified; tampered, missing, foreign bundles are
refused by name before anything is installed; a delta bundle carries only what moved."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from megatron_env import digest, profile
from megatron_env.bundle.manifest import Item
from megatron_env.errors import UserError
from megatron_env.kernels import build, source_trees
from megatron_env.pyenv import lock, lock_conda
from megatron_env.recipes import recipe
from megatron_env.sources import patches, repos
from megatron_env.sources.given import Given

from . import test_setup
from .test_setup import PATCH, PROFILE, git, statuses

upstream, repo = test_setup.upstream, test_setup.repo  # the fixtures: a bare repo tagged as Megatron

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def _no_network_possible() -> bool:
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


offline = pytest.mark.skipif(not shutil.which("unshare") or not _no_network_possible(),
                             reason="needs `unshare -n` (root or user namespaces)")


@pytest.fixture(scope="session")
def toolhouse(tmp_path_factory):
    """The tool's runtime dependencies and build backend as wheels for the default profile's
    Python: with the lock's wheelhouse, every package the bundle needs, from local files."""
    from megatron_env.bundle import tool

    house = tmp_path_factory.mktemp("toolhouse")
    py = profile.load(PROFILE).python
    argv = [sys.executable, "-m", "pip", "download", "-q", "-d", house, "--python-version", py,
            "--implementation", "cp", "--only-binary=:all:", "--no-deps",
            *tool.tool_pins(ROOT / "pyproject.toml", py)]
    for plat in lock.WHEEL_PLATFORMS:
        argv += ["--platform", plat]
    subprocess.run(argv, check=True)
    assert list(house.glob("tomli-*.whl"))  # Python 3.10 needs it
    prof = profile.load(PROFILE)  # and what the kernels import at run time (an adopt bundle's)
    tool.kernel_requirements(list(build.packages(prof).values()), house, py, lambda _s: None,
                             prof.lock_file)
    return house


_FAKED: dict[Path, dict[str, str]] = {}


def fake_kernel_sources(repo_dir: Path, tmp: Path, setup_py: str = "from setuptools import "
                        "setup\nsetup()\n") -> dict[str, str]:
    """Every kernel package of the profile given a local source: a bare repository (its pinned
    commit replaced by the local one) or an sdist (its sha256 replaced); -> the variables that
    point the online side at them. Made once per checkout: a second bundle sees the same pins."""
    if repo_dir in _FAKED:
        return _FAKED[repo_dir]
    prof_file = repo_dir / "envs" / PROFILE / "profile.toml"
    text = prof_file.read_text()
    env = {}
    for pkg in build.packages(profile.load_file(prof_file)).values():
        work = tmp / f"{pkg.name}-src"
        (work / pkg.name.replace("-", "_")).mkdir(parents=True)
        (work / pkg.name.replace("-", "_") / "__init__.py").write_text("")
        (work / "setup.py").write_text(setup_py)
        if pkg.source.repo:
            git("init", "-q", cwd=work)
            git("add", "-A", cwd=work)
            git("commit", "-qm", pkg.name, cwd=work)
            if pkg.source.tag:
                git("tag", pkg.source.tag, cwd=work)
            bare = tmp / f"{pkg.name}.git"
            git("clone", "-q", "--bare", work, bare, cwd=tmp)
            text = text.replace(pkg.source.commit, git("rev-parse", "HEAD", cwd=work))
            env[repos.mirror_var(pkg.name)] = str(bare)
        else:
            sdist = tmp / f"{pkg.name}-{pkg.pin}.tar.gz"
            with tarfile.open(sdist, "w:gz") as tar:
                tar.add(work, arcname=f"{pkg.name}-{pkg.pin}")
            text = text.replace(pkg.source.sha256, hashlib.sha256(sdist.read_bytes()).hexdigest())
            env[recipe.source_var(pkg.name)] = str(sdist)
    prof_file.write_text(text)
    _FAKED[repo_dir] = env
    return env


def invoke(cwd: Path, *args, env=None, offline_run=False, python=sys.executable, timeout=1800):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_FIND", "UV_NO"))}
    cmd = [python, "-m", "invoke", *args]
    if offline_run:
        cmd = ["unshare", "-n", *cmd]
    return subprocess.run(cmd, cwd=cwd, env={**base, "COLUMNS": "250", **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def make_bundle(repo_dir, tmp, houses, *args, env_over=None):
    """`invoke bundle` with only local sources: the wheelhouses, the bare repositories, sdists."""
    shutil.copy(ROOT / "README.md", repo_dir / "README.md")  # the tool's wheel names it
    env = {"PYTHONPATH": str(repo_dir), "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull,
           "PIP_FIND_LINKS": " ".join(map(str, houses)), "UV_NO_INDEX": "1",
           "UV_FIND_LINKS": ",".join(map(str, houses)),
           "MEGATRON_ENV_CACHE": str(tmp / "online-cache"),
           **fake_kernel_sources(repo_dir, tmp), **(env_over or {})}
    env = {k: v for k, v in env.items() if v is not None}
    r = invoke(repo_dir, "bundle", "--profile", PROFILE, *args, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def flat(r):
    return " ".join((r.stdout + r.stderr).split())


@offline
def test_full_bundle_sets_up_a_verified_env_with_no_network(repo, wheelhouse, toolhouse,
                                                             tmp_path):
    out = tmp_path / "b.tar"
    made = make_bundle(repo, tmp_path, [wheelhouse, toolhouse], "--out", out)
    assert "bundle" in made.stdout and out.exists()
    with tarfile.open(out) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())
    pins = lock.parse_lock((repo / "envs" / PROFILE / profile.LOCK_FILE).read_text())
    assert len([n for n in names if n.startswith("wheels/")]) == len(pins)
    assert any(n.startswith("tool/megatron_env-") for n in names)
    assert {r["name"] for r in manifest["git"]} >= {"megatron"}
    assert manifest["python"] == "3.10" and manifest["mode"] == "full"
    assert all(f["role"] and len(f["sha256"]) == 64 for f in manifest["files"].values())
    # the offline side: unpack once (a shared filesystem), install the tool from it, set up
    shared = tmp_path / "shared"
    shared.mkdir()
    subprocess.run(["tar", "xf", out, "-C", shared], check=True)
    py310 = lock.find_python("3.10")[0]
    tool = tmp_path / "tool-venv"
    subprocess.run([py310, "-m", "venv", tool], check=True)
    quiet = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    pip = subprocess.run(["unshare", "-n", tool / "bin" / "pip", "install", "-q", "--no-index",
                          "--find-links", shared / "tool", "megatron-env"], env=quiet,
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    node = {"MEGATRON_ENV_CACHE": str(tmp_path / "node-cache"), "PIP_CONFIG_FILE": os.devnull,
            "PYTHONPATH": ""}
    prefix = tmp_path / "env"

    def setup(*args, bundle=shared):
        return invoke(shared / "source", "setup", "--bundle", bundle, "--prefix", prefix, *args,
                      env=node, offline_run=True, python=tool / "bin" / "python")

    # refused by name before anything is installed: a changed file, a missing one, another Python
    pack = next((shared / "git").glob("megatron-*.git/objects/pack/*.pack"))
    good = pack.read_bytes()
    pack.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    r = setup()
    assert r.returncode == 2 and "1 changed" in flat(r), flat(r)[-2000:]
    assert str(pack.relative_to(shared)) in flat(r) and not prefix.exists()
    pack.write_bytes(good)
    wheel = next((shared / "wheels").glob("six-*.whl"))
    wheel.rename(tmp_path / wheel.name)
    r = setup()
    assert r.returncode == 2 and f"1 missing: wheels/{wheel.name}" in flat(r), flat(r)[-2000:]
    assert not prefix.exists()
    (tmp_path / wheel.name).rename(wheel)
    if sys.version_info[:2] != (3, 10):
        r = setup("--adopt", sys.executable)
        assert r.returncode == 2, flat(r)[-2000:]
        assert (f"the bundle serves Python 3.10 on linux x86_64; {sys.executable} is Python "
                f"3.{sys.version_info[1]}") in flat(r)
        assert not prefix.exists()
    # and the bundle as it was made sets up a verified environment with no network
    r = setup()
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    s = statuses(r.stdout)
    assert (s["env"], s["megatron"], s["verify"]) == ("done", "done", "done"), r.stdout[-3000:]
    check = subprocess.run([prefix / "bin" / "python", "-c", "import megatron.core as m, "
                            "megatron.core.datasets.helpers; print(m.PATCHED)"],
                           capture_output=True, text=True, cwd="/")
    assert check.stdout.strip() == "1", check.stderr


@offline
def test_adopt_bundle_refusals_and_a_delta_after_one_moved_pin(repo, toolhouse, tmp_path):
    old = tmp_path / "old.tar"
    make_bundle(repo, tmp_path, [toolhouse], "--out", old, "--adopt")
    with tarfile.open(old) as tar:
        names = tar.getnames()
    # the node brings its own torch: wheels/ holds only what the kernels import at run time
    carried = {n.split("/")[1].split("-")[0].lower() for n in names if n.startswith("wheels/")}
    assert carried and not carried & {"torch", "triton"} and "einops" in carried
    py310 = lock.find_python("3.10")[0]
    node = {"MEGATRON_ENV_CACHE": str(tmp_path / "node-cache"), "PYTHONPATH": str(repo)}

    def lock_step(*bundles, profile_name=PROFILE):
        args = [a for b in bundles for a in ("--bundle", str(b))]
        return invoke(repo, "setup", "--profile", profile_name, *args, "--adopt", py310,
                      "--only", "lock", env=node, offline_run=True)

    # a tampered copy first, into a fresh cache: refused by name; the good one then serves
    tampered = tmp_path / "tampered.tar"
    shutil.copy(old, tampered)
    with tarfile.open(tampered) as tar:
        at = tar.getmember("source/README.md").offset_data
    with open(tampered, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))
    r = lock_step(tampered)
    assert r.returncode == 2, flat(r)[-2000:]
    assert "does not match its manifest (1 changed: source/README.md)" in flat(r)
    r = lock_step(old)
    assert r.returncode == 0 and statuses(r.stdout)["lock"] == "done", flat(r)[-2000:]
    r = lock_step(old, profile_name="core_v0.19.0-cu130")
    assert r.returncode == 2
    assert f"the bundle was made for profile {PROFILE}, not core_v0.19.0-cu130" in flat(r)
    r = invoke(repo, "setup", "--bundle", old, "--only", "lock", env=node, offline_run=True)
    assert r.returncode == 2 and "made with --adopt" in flat(r)
    assert "hint: pass --adopt PYTHON" in flat(r)
    r = invoke(repo, "env", "--bundle", old, env=node, offline_run=True)
    assert r.returncode == 2 and "hint: pass --adopt --python PYTHON" in flat(r), flat(r)
    garbage = tmp_path / "garbage.tar"
    garbage.write_text("not a tar")
    r = lock_step(garbage)
    assert r.returncode == 2
    assert "garbage.tar is not a megatron-env bundle: it is a text file" in flat(r)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(old.read_bytes()[:old.stat().st_size // 2])
    r = lock_step(cut)
    assert r.returncode == 2 and "cut.tar is truncated (copy it again)" in flat(r), flat(r)
    # one pin moves (the Megatron patch series): the delta holds that and little else
    series = repo / "patches" / "megatron" / "core_v0.4.0"
    (series / "0001-mark-patched.patch").write_text(PATCH.format(n=2))
    r = lock_step(old)
    assert r.returncode == 2 and "differs from the one the bundle was made from" in flat(r)
    delta = tmp_path / "delta.tar"
    make_bundle(repo, tmp_path, [toolhouse], "--out", delta, "--adopt", "--since", old)
    with tarfile.open(delta) as tar:
        moved = set(tar.getnames())
    assert "source/patches/megatron/core_v0.4.0/0001-mark-patched.patch" in moved
    assert not [n for n in moved if n.startswith(("git/", "tool/", "sources/"))], moved
    assert delta.stat().st_size < old.stat().st_size / 10
    r = lock_step(delta)  # alone it lacks what its base holds
    assert r.returncode == 2 and " missing: git/" in flat(r), flat(r)
    r = lock_step(delta, old)  # combined (any order), on a node without network
    assert r.returncode == 0, flat(r)[-2000:]
    assert "files match manifest.json" in flat(r)


@offline
def test_a_bundle_without_a_kernel_refuses_its_build_by_name(repo, toolhouse, tmp_path):
    """`--without apex`: no apex repository in the archive, the manifest says so, and a setup
    that would build apex is refused by name before anything is installed; with --no-builds the
    same bundle serves."""
    r = invoke(repo, "bundle", "--profile", PROFILE, "--out", tmp_path / "x.tar", "--adopt",
               "--without", "nosuch", env={"PYTHONPATH": str(repo)})
    assert r.returncode == 2 and "--without nosuch: " in flat(r) and "one of: apex" in flat(r)
    small = tmp_path / "small.tar"
    make_bundle(repo, tmp_path, [toolhouse], "--out", small, "--adopt", "--without", "apex")
    with tarfile.open(small) as tar:
        names = tar.getnames()
        doc = json.load(tar.extractfile("manifest.json"))
    assert doc["without"] == ["apex"]
    assert not [n for n in names if n.startswith("git/apex")]
    assert [n for n in names if n.startswith("git/megatron")]
    py310 = lock.find_python("3.10")[0]
    prefix = tmp_path / "env"
    node = {"MEGATRON_ENV_CACHE": str(tmp_path / "node-cache"), "PYTHONPATH": str(repo)}
    r = invoke(repo, "setup", "--profile", PROFILE, "--bundle", small, "--adopt", py310,
               "--prefix", prefix, "--only", "lock", env=node, offline_run=True)
    assert r.returncode == 2 and "the bundle was made without apex" in flat(r), flat(r)[-2000:]
    assert "--no-builds" in flat(r) and not prefix.exists()
    r = invoke(repo, "setup", "--profile", PROFILE, "--bundle", small, "--adopt", py310,
               "--prefix", prefix, "--only", "lock", "--no-builds", env=node, offline_run=True)
    assert r.returncode == 0 and statuses(r.stdout)["lock"] == "done", flat(r)[-2000:]


def test_with_builds_takes_only_the_cached_wheels_made_for_the_profile(tmp_path, monkeypatch):
    """The cache's meta.json says what each key was made from (build.plan's key document):
    a bundle takes the slots of this profile's pins, variants, Python, torch and archs, no
    others."""
    from megatron_env.bundle import make

    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path))
    prof = profile.load("core_v0.19.0-cu130")
    kept, others = [], []
    for pkg in build.packages(prof).values():
        doc = {"source": pkg.source.digest, "python": "cpython-312", "cuda": prof.cuda,
               "patches": digest.of_files(patches.series(pkg.name, pkg.pin)),
               "torch": f"{prof.torch}+cu130", "archs": sorted(prof.archs) if pkg.cuda else [],
               "cxx11_abi": 1, "switches": pkg.switches,
               "build_options": list(pkg.build_options)}
        for key, changed in (("a", {}), ("b", {"archs": ["8.0"]}), ("c", {"torch": "2.9.0"}),
                             ("d", {"switches": {**pkg.switches, "OTHER_VARIANT": "1"}})):
            slot = tmp_path / "wheels" / f"{pkg.name}-{key}"
            slot.mkdir(parents=True)
            (slot / f"{pkg.name}-1.0-cp312-linux_x86_64.whl").write_bytes(b"wheel")
            (slot / "meta.json").write_text(json.dumps({
                "key": {**doc, **changed},
                "wheel_sha256": hashlib.sha256(b"wheel").hexdigest()}))
            (kept if not changed else others).append(slot.name)
    cut = tmp_path / "wheels" / f"{kept[0].rsplit('-', 1)[0]}-a"  # its wheel changed since
    next(cut.glob("*.whl")).write_bytes(b"whe")
    found = {arc.split("/")[1] for arc, _ in make.cached_builds(prof)}
    assert found == set(kept) - {cut.name} and not found & set(others)
    assert not cut.exists()  # discarded: the next build makes it again


def test_a_git_kernel_travels_with_its_pinned_submodules_as_bare_repos(tmp_path, monkeypatch):
    """A git recipe with a submodule: the bundle holds a depth-1 bare repository of the package
    and one of the submodule at the profile's pin (not the submodule's tip), and the offline
    side checks both out from the bundle alone (the upstreams are gone by then)."""
    from megatron_env.bundle import layout, make

    from .gitrepo import with_submodule

    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    top_repo, top, headers, first = with_submodule(tmp_path)
    r = recipe.Recipe("withsub", "a test recipe", "git", repo=str(top_repo),
                      submodules={"third_party/headers": str(headers)})
    pkg = recipe.resolve(r, {"commit": top, "submodules": {"third_party/headers": first}}, [])
    prof = profile.load(PROFILE)
    monkeypatch.setattr(build, "packages", lambda _prof, _archs=None: {"withsub": pkg})
    pins = make.git_pins(prof)
    assert [(n, c) for n, _u, c, _t in pins] == [
        ("megatron", prof.megatron["commit"]), ("withsub", top),
        ("withsub/third_party/headers", first)]
    root = tmp_path / "bundle"
    for name, url, commit, tag in pins[1:]:
        make._bare_repo(name, url, commit, tag, root / layout.repo_path(name, commit),
                          echo=lambda *_: None)
    assert layout.repo_path("withsub/third_party/headers", first) == \
        f"git/withsub-third_party-headers-{first[:12]}.git"
    shallow = root / layout.repo_path("withsub/third_party/headers", first)
    assert git("--git-dir", shallow, "rev-list", "--all", cwd=tmp_path) == first  # depth 1
    shutil.rmtree(headers)
    shutil.rmtree(top_repo)
    given = Given(mirrors={name: root / layout.repo_path(name, commit)  # what `use` passes on
                           for name, _url, commit, _tag in pins[1:]})
    tree = source_trees.fetch(pkg, echo=lambda *_: None, given=given)
    assert (tree / "third_party/headers/include/h.h").read_text() == "// one\n"
    assert (tree / "setup.py").exists()


def test_a_conda_layer_travels_as_its_packages_and_installs_with_its_channel_gone(
        tmp_path, monkeypatch):
    """A profile locked with a conda layer: its packages go into the bundle, each checked against
    the conda-lock.yml's sha256 (a channel serving another file is refused by name); offline,
    the lock's URLs point into the bundle and conda-lock installs the layer from it alone (the
    channel deleted first, every HTTP request sent to a closed port), as `invoke env` does."""
    from megatron_env.bundle import make, offline

    from .conda_channel import lock_offline

    monkeypatch.setenv(repos.CACHE_ENV, str(tmp_path / "cache"))
    src = profile.envs_root() / PROFILE
    shutil.copytree(src, tmp_path / "envs" / src.name)
    prof = profile.load_file(tmp_path / "envs" / src.name / "profile.toml")
    assert make.conda_packages(prof) == []  # no conda layer, nothing to carry
    conda_lock, stub = lock_offline(prof, tmp_path, monkeypatch, echo=lambda *_: None)
    pkgs = make.conda_packages(prof)
    assert sorted(p["path"] for p in pkgs) == [
        "conda/linux-64/cuda-cudart-dev-12.1.105-0.tar.bz2",
        "conda/linux-64/cuda-libraries-dev-12.1.1-0.tar.bz2",
        "conda/linux-64/cuda-nvcc-12.1.105-0.tar.bz2", "conda/linux-64/gxx_linux-64-11.4.0-0.tar.bz2",
        "conda/linux-64/python-3.10.13-0.tar.bz2", "conda/noarch/ninja-1.11.1-0.tar.bz2"]
    said = []
    files = make.fetch_conda_packages(pkgs, said.append)
    assert len(said) == 6 and "conda: 1/6 downloading" in said[0]
    assert make.fetch_conda_packages(pkgs, said.append) == files and len(said) == 6  # cached
    root = tmp_path / "bundle"
    for p, f in zip(pkgs, files, strict=True):
        (root / p["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, root / p["path"])
    shutil.rmtree(tmp_path / "channel")
    conda = [Item(p["name"], p["path"], {"url": p["url"]}) for p in pkgs]
    local = offline.local_conda_lock(prof, root, conda)
    text = local.read_text()
    assert not [p for p in pkgs if p["url"] in text]
    assert all((root / p["path"]).as_uri() in text for p in pkgs)
    res = lock_conda.conda_install(local, tmp_path / "prefix", str(stub))
    assert res.ok, res.output
    nvcc = subprocess.run([tmp_path / "prefix" / "bin" / "nvcc"], capture_output=True, text=True)
    assert "release 12.1" in nvcc.stdout
    # a channel that serves another file than the one locked
    bad = [{**pkgs[0], "url": (root / pkgs[0]["path"]).as_uri(), "sha256": "0" * 64}]
    with pytest.raises(UserError, match="does not match the sha256 in conda-lock.yml"):
        make.fetch_conda_packages(bad, said.append)
    assert not list((tmp_path / "cache" / "conda-pkgs").glob("*.tmp-*"))


@offline
def test_a_bundle_made_by_a_tool_without_torch_takes_the_sdist_from_the_index(
        repo, toolhouse, tmp_path):
    """`invoke bundle` run by the tool's own interpreter, which has no torch (a fresh `pip
    install -e .`), with only git mirrors set: flash-attn's sdist comes from the configured
    package index by its file name, checked by sha256, and its setup.py (which would raise and
    leave a mark) never runs. Before, `pip download --no-binary` ran it and failed on torch."""
    import http.server
    import threading

    from .test_index import RAISES, Index

    # the tool's interpreter without torch: where the test venv has it, a torch that cannot be
    # imported stands first on the path (a fresh `pip install -e .` has none at all)
    no_torch = tmp_path / "no-torch"
    (no_torch / "torch").mkdir(parents=True)
    (no_torch / "torch" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'torch\'", name="torch")\n')
    path = f"{no_torch}{os.pathsep}{repo}"
    assert subprocess.run([sys.executable, "-c", "import torch"], capture_output=True,
                          env={**os.environ, "PYTHONPATH": path}).returncode != 0
    env = fake_kernel_sources(repo, tmp_path, setup_py=RAISES)
    sdists = {k: Path(v) for k, v in env.items() if k.startswith("MEGATRON_ENV_SOURCE_")}
    pkgs = build.packages(profile.load_file(repo / "envs" / PROFILE / "profile.toml"))
    fa = pkgs["flash-attn"]
    Index.project, Index.files = "flash-attn", {fa.source.url: sdists[recipe.source_var(fa.name)]}
    Index.yanked, Index.html_only, Index.auth, Index.seen = {}, False, None, []
    Index.garbled = False
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    served = f"http://127.0.0.1:{server.server_address[1]}/simple"
    out = tmp_path / "b.tar"
    try:
        r = make_bundle(repo, tmp_path, [toolhouse], "--out", out, "--adopt",
                        env_over={**{k: None for k in sdists}, "PIP_NO_INDEX": None,
                                  "PIP_INDEX_URL": served, "PYTHONPATH": path})
    finally:
        server.shutdown()
        server.server_close()
    assert f"flash-attn: downloading {fa.source.url} from {served}" in flat(r), flat(r)[-3000:]
    assert tuple(p for p, _a in Index.seen if "simple/flash" in p) == ("/simple/flash-attn/", )
    with tarfile.open(out) as tar:
        doc = json.load(tar.extractfile("manifest.json"))
        assert tar.extractfile(f"sources/flash-attn/flash-attn-{fa.pin}.tar.gz").read() == \
            sdists[recipe.source_var(fa.name)].read_bytes()
        assert "tool/requirements.txt" in tar.getnames()
    assert [s["name"] for s in doc["sources"]] == ["flash-attn"]
    assert not list((tmp_path / "online-cache").rglob("RAN"))
    py310 = lock.find_python("3.10")[0]
    r = invoke(repo, "setup", "--bundle", out, "--adopt", py310, "--only", "lock",
               env={"MEGATRON_ENV_CACHE": str(tmp_path / "node-cache"), "PYTHONPATH": str(repo)},
               offline_run=True)
    assert r.returncode == 0 and statuses(r.stdout)["lock"] == "done", flat(r)[-2000:]


def test_a_bundle_needs_its_size_free_about_once_not_twice(repo, toolhouse, tmp_path):
    """Its files are staged beside --out, then archived: before, the staged copy and the archive
    stood side by side (twice the bundle's size). Now each staged file leaves as the archive
    takes it in: a filesystem with room for the bundle and its largest file (well under twice
    its size) holds the run; one with room for half of it is refused naming the need, with
    nothing left behind."""
    first = tmp_path / "first.tar"
    make_bundle(repo, tmp_path, [toolhouse], "--out", first, "--adopt")
    size = first.stat().st_size
    with tarfile.open(first) as tar:
        largest = max(m.size for m in tar.getmembers())
    cap = ((size + largest + 2 * 2**20) // 4096 + 1) * 4096
    assert cap < 2 * size  # the test means something: twice would not fit
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={cap}", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        make_bundle(repo, tmp_path, [toolhouse], "--out", mnt / "b.tar", "--adopt")
        with tarfile.open(first) as a, tarfile.open(mnt / "b.tar") as b:
            assert a.getnames() == b.getnames()
        for made in mnt.glob("b.tar*"):  # the archive and its .sha256
            made.unlink()
        (mnt / "fill").write_bytes(b"\0" * (cap - size // 2))
        shutil.copy(ROOT / "README.md", repo / "README.md")
        env = {"PYTHONPATH": str(repo), "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull,
               "PIP_FIND_LINKS": str(toolhouse), "UV_NO_INDEX": "1",
               "UV_FIND_LINKS": str(toolhouse),
               "MEGATRON_ENV_CACHE": str(tmp_path / "online-cache"),
               **fake_kernel_sources(repo, tmp_path)}
        r = invoke(repo, "bundle", "--profile", PROFILE, "--out", mnt / "c.tar", "--adopt",
                   env=env)
        assert r.returncode == 2 and f"error: no space on {mnt}" in r.stderr, flat(r)[-2000:]
        assert sorted(p.name for p in mnt.iterdir()) == ["fill"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
