"""The layer writer alone: the same entries give the same bytes whatever the files' own times,
owners and the directory they were staged in; a file naming the build's path or an NVIDIA
driver library is refused by kind."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_env.image.tarlayer import LayerWriter, parents

from .conftest import user_error

names = st.lists(st.from_regex(r"[a-z][a-z0-9_.-]{0,8}(/[a-z][a-z0-9_.-]{0,8}){0,3}",
                               fullmatch=True), min_size=1, max_size=12, unique=True)


def _stage(root: Path, tree: dict[str, bytes], mtime: int) -> None:
    for rel, data in tree.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.utime(p, (mtime, mtime))
        os.chmod(p, 0o600 if mtime % 2 else 0o664)


def _write(root: Path, tree: dict[str, bytes], dest: Path) -> str:
    with LayerWriter(dest, 1_700_000_000, (str(root).encode(),)) as w:
        files_ = sorted(tree)
        for name in sorted({*files_, *parents(files_)}):
            if name in tree:
                w.file(name, root / name)
            else:
                w.directory(name)
        return w.close().digest


def _tree(paths: list[str], data: st.DataObject) -> dict[str, bytes]:
    tree: dict[str, bytes] = {}
    for p in paths:  # a path that is another's directory stays a directory
        if not any(q.startswith(p + "/") for q in paths) and not any(
                p.startswith(q + "/") for q in tree):
            tree[p] = data.draw(st.binary(max_size=300))
    return tree


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(paths=names, data=st.data())
def test_same_entries_same_digest_wherever_and_whenever_staged(tmp_path_factory, paths, data):
    tree = _tree(paths, data)
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b-other-place")
    _stage(a, tree, 1_000_000_001)
    _stage(b, tree, 1_600_000_000)
    assert _write(a, tree, a.parent / f"{a.name}.tgz") == _write(b, tree, b.parent / f"{b.name}.tgz")
    with tarfile.open(a.parent / f"{a.name}.tgz", "r:gz") as t:
        assert all((m.uid, m.gid, m.mtime, m.uname) == (0, 0, 1_700_000_000, "") for m in t)


def test_a_file_naming_the_build_path_is_refused(tmp_path):
    (tmp_path / "script").write_text(f"#!{tmp_path}/bin/python\n")
    with user_error("image.build-path"):
        _write(tmp_path, {"script": b""}, tmp_path / "l.tgz")


@pytest.mark.parametrize("name", ["libcuda.so.1", "libnvidia-ml.so.535.104.05", "libcuda.so"])
def test_a_driver_library_is_refused(tmp_path, name):
    (tmp_path / name).write_bytes(b"\x7fELF")
    with user_error("image.driver-library"):
        _write(tmp_path, {name: b""}, tmp_path / "l.tgz")
