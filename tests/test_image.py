"""`invoke image` for real on a small profile the tests build (tests/image_profile.py): the
default Debian base made by mmdebstrap, layers split by RECORD, two builds in two clones at two
times give the same manifest digest and squashfs, a moved pin changes only its layers, the
image runs under runc, and bad input ends in one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from megatron_env.image.build import CONTENT_EPOCH

from .gitrepo import git
from .image_profile import NAME, invoke, make_repo, set_small, tool_env, wheelhouse
from .tmpfs import mounted

pytestmark = pytest.mark.slow
TOOLS = ("mmdebstrap", "umoci", "runc", "mksquashfs")
needs_tools = pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS) or os.geteuid() != 0,
                                 reason="needs root and " + ", ".join(TOOLS) + " (.ci/run installs them)")


def build(repo: Path, env: dict[str, str], out: Path, *args: str
          ) -> subprocess.CompletedProcess[str]:
    return invoke(repo, "image", "--profile", NAME, "--out", str(out), "--json", *args, env=env)


def ok(r: subprocess.CompletedProcess[str]) -> dict:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout)


def layer_names(layout: Path, digest: str) -> list[str]:
    blob = layout / "blobs" / "sha256" / digest.split(":")[1]
    with tarfile.open(blob, "r:gz") as t:
        return t.getnames()


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """One build with the default base (mmdebstrap's bookworm): (root, house, repo, env, doc)."""
    root = tmp_path_factory.mktemp("image")
    house = wheelhouse(root / "house")
    repo = make_repo(root, house)
    env = {**tool_env(house), "MEGATRON_ENV_CACHE": str(root / "cache")}
    doc = ok(build(repo, env, root / "A", "--sqsh", str(root / "a.sqsh")))
    return root, house, repo, env, doc


def debian_base(root: Path) -> Path:
    """The default base the first build made, from its cache: a root file system tarball."""
    return next((root / "cache" / "image" / "base").glob("debian-*.tar.gz"))


@needs_tools
def test_layers_split_by_record(first):
    root, _house, repo, _env, doc = first
    layout = root / "A"
    assert [x["what"] for x in doc["layers"]] == ["base", "torch", "packages", "megatron",
                                                  "settings"]
    by = {x["what"]: layer_names(layout, x["digest"]) for x in doc["layers"]}
    env = "opt/megatron-env/env/lib/python3.11/site-packages/"
    torch = [n for n in by["torch"] if n.startswith(env)]
    rest = [n for n in by["packages"] if n.startswith(env)]
    assert any(n.startswith(env + "torch/") for n in torch)
    assert any(n.startswith(env + "nvidia/cublas/lib/") for n in torch)
    assert not any("smallpkg" in n or "filelock_small" in n for n in torch)
    assert any(n.startswith(env + "smallpkg/") for n in rest)
    assert not any(n.startswith((env + "torch/", env + "nvidia/")) for n in rest)
    assert env + "torch/__pycache__/__init__.cpython-311.pyc" in torch  # bytecode goes along
    assert "usr/bin/python3.11" in by["base"]
    # the kernels are not in the build cache here: no layer, and the labels say so
    labels = doc["labels"]
    assert labels["megatron-env.kernels"].startswith("absent")
    assert labels["megatron-env.lock-digest"].startswith("sha256:")
    index = json.loads((layout / "index.json").read_text())
    assert index["manifests"][0]["digest"] == doc["digest"]
    manifest = json.loads((layout / "blobs/sha256" / doc["digest"][7:]).read_bytes())
    config = json.loads((layout / "blobs/sha256" / manifest["config"]["digest"][7:]).read_bytes())
    env_vars = dict(e.split("=", 1) for e in config["config"]["Env"])
    assert env_vars["PATH"].startswith("/opt/megatron-env/env/bin:")
    assert env_vars["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env_vars["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert env_vars["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0"
    # reproducible entries: owner 0, one time for every file (the same for every lock: a moved
    # pin must not change the other layers); no path of the build anywhere
    epoch = CONTENT_EPOCH
    blob = layout / "blobs/sha256" / doc["layers"][1]["digest"][7:]
    with tarfile.open(blob, "r:gz") as t:
        for m in t:
            assert (m.uid, m.gid, m.mtime) == (0, 0, epoch), m.name
            if m.isfile():
                assert str(root).encode() not in t.extractfile(m).read(), m.name
    assert blob.read_bytes()[4:8] == b"\0\0\0\0"  # gzip's time field: none


@needs_tools
def test_image_runs_under_runc_and_imports_torch_and_megatron(first, tmp_path):
    root, *_ = first
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{root / 'A'}:latest", str(bundle)],
                   check=True, capture_output=True)
    cfg = json.loads((bundle / "config.json").read_text())
    cfg["process"]["terminal"] = False
    cfg["process"]["args"] = ["python", "-c", "import torch, megatron.core, smallpkg, sys; "
                              "print(torch.__version__, megatron.core.__file__, sys.prefix, "
                              "smallpkg.VERSION)"]
    (bundle / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run(["runc", "--root", str(tmp_path / "state"), "run", f"t{os.getpid()}"],
                       cwd=bundle, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2.1.0", "/opt/megatron-env/Megatron-LM/megatron/core/__init__.py",
                                "/opt/megatron-env/env", "1.0"]
    script = (bundle / "rootfs/opt/megatron-env/env/bin/smallpkg").read_text()
    assert script.startswith("#!/opt/megatron-env/env/bin/python\n")


@pytest.fixture(scope="module")
def second(first):
    """The same lock built again: in a clone (another directory, its own cache), a second later,
    on the base the first build made (given as a root file system tarball), and once more
    in the first checkout on that same base."""
    root, _house, repo, env, doc = first
    base = debian_base(root)
    a2 = ok(build(repo, env, root / "A2", "--base", str(base), "--sqsh", str(root / "a2.sqsh")))
    clone = root / "clone"
    git("clone", "-q", str(repo), str(clone), cwd=root)
    time.sleep(1.1)
    fresh = {**env, "MEGATRON_ENV_CACHE": str(root / "cache-b"),
             "MEGATRON_ENV_STATE": str(root / "state-b")}
    b = ok(build(clone, fresh, root / "B", "--base", str(base), "--sqsh", str(root / "b.sqsh")))
    return base, clone, a2, b


@needs_tools
def test_two_builds_give_the_same_digest_and_squashfs(first, second):
    _base, _clone, a2, b = second
    assert a2["digest"] == b["digest"]
    assert a2["sqsh_sha256"] == b["sqsh_sha256"]
    assert not any(x["reused"] for x in b["layers"][1:])  # the clone's cache was empty
    # the base given as a tarball is the default base's layer, byte for byte
    assert a2["layers"][0]["digest"] == first[4]["layers"][0]["digest"]


@needs_tools
def test_a_moved_pin_changes_exactly_the_layers_that_hold_it(first, second):
    root, house, _repo, env, _doc = first
    base, clone, _a2, b = second
    set_small(clone, house, "1.1")
    fresh = {**env, "MEGATRON_ENV_CACHE": str(root / "cache-b"),
             "MEGATRON_ENV_STATE": str(root / "state-b")}
    c = ok(build(clone, fresh, root / "C", "--base", str(base)))
    before = {x["what"]: x["digest"] for x in b["layers"]}
    after = {x["what"]: x["digest"] for x in c["layers"]}
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"packages", "settings"}
    assert {x["what"] for x in c["layers"] if x["reused"]} == {"torch", "megatron"}


@needs_tools
@pytest.mark.parametrize("form", ["empty-dir", "text-file", "reference", "missing",
                                  "other-tar", "no-python"])
def test_bad_bases_are_one_line(first, tmp_path, form):
    _root, _house, repo, env, _doc = first
    kinds = {"empty-dir": "image.base-not-image", "text-file": "image.base-not-image",
             "other-tar": "image.base-not-image", "reference": "image.base-unknown-form",
             "missing": "image.base-unknown-form", "no-python": "image.base-cannot-run"}
    given = tmp_path / "base"
    if form == "empty-dir":
        given.mkdir()
    elif form == "text-file":
        given.write_text("not an image\n")
    elif form == "other-tar":
        (tmp_path / "x").write_text("x")
        with tarfile.open(given, "w") as t:
            t.add(tmp_path / "x", "docs/readme")
    elif form == "no-python":
        libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
        with tarfile.open(given, "w") as t:
            t.add(libc, "usr/lib/x86_64-linux-gnu/libc.so.6")
            t.add(tmp_path, "etc", recursive=False)
    arg = "docker://debian:12" if form == "reference" else str(given)
    r = build(repo, env, tmp_path / "out", "--base", arg)
    assert r.returncode == 2, r.stderr
    err = json.loads(r.stdout)["error"]
    assert err["kind"] == kinds[form], err
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] and \
        "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


@needs_tools
def test_a_stale_lock_is_refused(first, tmp_path):
    root, _house, repo, env, _doc = first
    copy = root / "stale"
    git("clone", "-q", str(repo), str(copy), cwd=root)
    prof = copy / "envs" / NAME / "profile.toml"
    prof.write_text(prof.read_text().replace('"smallpkg==1.0"', '"smallpkg==1.0", "six"'))
    r = build(copy, env, tmp_path / "out")
    assert r.returncode == 2
    assert json.loads(r.stdout)["error"]["kind"] == "image.lock-stale"
    assert not (tmp_path / "out").exists()


@needs_tools
def test_an_interrupted_build_leaves_nothing_at_out(first, tmp_path):
    root, _house, repo, env, _doc = first
    out = tmp_path / "out"
    base = debian_base(root)
    p = subprocess.Popen([sys.executable, "-m", "invoke", "image", "--profile", NAME, "--out",
                          str(out), "--base", str(base)],
                         cwd=repo, env={**env, "PYTHONPATH": str(repo),
                                        "MEGATRON_ENV_CACHE": str(tmp_path / "c")},
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stderr is not None
    for line in p.stderr:  # a fresh cache: the layers are being made when this line comes
        if line.startswith("layer torch:"):
            break
    os.killpg(p.pid, signal.SIGTERM)
    rest = p.stderr.read()
    assert p.wait() == 143, rest
    assert not out.exists()
    assert not [x for x in tmp_path.iterdir() if x.name.startswith("out")], list(tmp_path.iterdir())


@needs_tools
def test_a_full_disk_is_one_line_and_leaves_nothing(first, tmp_path):
    root, _house, repo, env, _doc = first
    base = debian_base(root)
    with mounted(tmp_path / "small", "4m") as small:
        r = build(repo, env, small / "out", "--base", str(base))
        assert r.returncode == 2, r.stderr
        assert json.loads(r.stdout)["error"]["kind"] == "disk.full"
        assert "Traceback" not in r.stderr
        assert os.listdir(small) == []


@needs_tools
@pytest.mark.skipif(shutil.which("skopeo") is None, reason="needs skopeo (.ci/run installs it)")
@pytest.mark.parametrize("form", ["oci-layout", "oci-archive", "docker-archive"])
def test_an_image_is_a_base_in_each_form(first, tmp_path, form):
    """The first image, as skopeo writes it in each form, is the base of another: its layers
    come through unchanged (their diff_ids), under the new environment's."""
    root, _house, repo, env, doc = first
    if form == "oci-layout":
        given = root / "A"
    else:
        given = tmp_path / f"base-{form}.tar"
        subprocess.run(["skopeo", "copy", "-q", f"oci:{root / 'A'}:latest", f"{form}:{given}"],
                       check=True, capture_output=True, timeout=300)
    made = ok(build(repo, env, tmp_path / "out", "--base", str(given)))
    layout = tmp_path / "out"

    def diff_ids(layout: Path, digest: str) -> list[str]:
        manifest = json.loads((layout / "blobs/sha256" / digest[7:]).read_bytes())
        config = json.loads((layout / "blobs/sha256" / manifest["config"]["digest"][7:])
                            .read_bytes())
        return config["rootfs"]["diff_ids"]

    first_ids = diff_ids(root / "A", doc["digest"])
    assert diff_ids(layout, made["digest"])[:len(first_ids)] == first_ids
    assert [x["what"] for x in made["layers"]][len(first_ids):] == \
        ["torch", "packages", "megatron", "settings"]
