"""What crosses into the tool from a file (a bundle's manifest, findings another program or
node wrote) is parsed once into a frozen value; any other shape is one UserError with a kind,
never a KeyError or TypeError further down (issue 27 item 2). Generated inputs: random JSON
values, and a real manifest with one field removed or replaced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_env.bundle import layout
from megatron_env.bundle.manifest import Manifest
from megatron_env.errors import UserError
from megatron_env.findings import Finding

from .conftest import user_error

ROOT = Path(__file__).resolve().parent.parent
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
SHA = "ab" * 32
GOOD = {"format": 1, "tool": {"name": "megatron-env", "version": "0.1.0"}, "made_at": "now",
        "profile": {"name": "p", "digest": "d", "python": "3.10", "torch": "2.1.0",
                    "cuda": "12.1"},
        "python": "3.10", "platform": {"system": "linux", "machine": "x86_64"},
        "mode": "adopt", "with_builds": False, "base": None, "without": [],
        "git": [{"name": "megatron", "commit": "c" * 40, "tag": "t", "path": "git/m.git"}],
        "sources": [{"name": "flash-attn", "path": "sources/f.tar.gz", "sha256": SHA}],
        "conda": [],
        "files": {"source/README.md": {"sha256": SHA, "size": 3, "role": "source"}}}


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


PATHS = [p for p in _paths(GOOD) if p]


def _mangle(path, value, remove):
    doc = json.loads(json.dumps(GOOD))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if remove and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def test_the_good_manifest_parses():
    m = Manifest.parse(GOOD, "b.tar")
    assert m.profile.name == "p" and m.files["source/README.md"].size == 3
    assert m.git[0]["commit"] == "c" * 40 and m.sources[0].path == "sources/f.tar.gz"


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PATHS), JSON, st.booleans())
def test_a_mangled_manifest_parses_or_is_one_user_error(path, value, remove):
    try:
        m = Manifest.parse(_mangle(path, value, remove), "b.tar")
    except UserError as e:
        assert e.kind == "bundle.manifest" and "b.tar" in e.message and "\n" not in e.message
    else:  # what parsed is usable: every field a consumer reads has its type
        assert isinstance(m.profile.name, str) and isinstance(m.with_builds, bool)
        assert all(isinstance(f.size, int) and not isinstance(f.size, bool)
                   for f in m.files.values())


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_json_value_parses_or_is_one_user_error(value):
    try:
        Manifest.parse(value, "b.tar")
    except UserError as e:
        assert e.kind == "bundle.manifest"


def test_unsafe_paths_and_bad_hashes_are_refused():
    for bad in ({"/etc/passwd": GOOD["files"]["source/README.md"]},
                {"../x": GOOD["files"]["source/README.md"]},
                {"a": {"sha256": "zz", "size": 1, "role": "source"}},
                {"a": {"sha256": SHA, "size": True, "role": "source"}},
                {"a": {"sha256": SHA, "size": -1, "role": "source"}}):
        with user_error("bundle.manifest"):
            Manifest.parse({**GOOD, "files": bad}, "b.tar")


def test_the_issue_manifest_through_setup(tmp_path):
    """`{"format":1,"files":{}}` crashed `invoke setup --bundle` with KeyError: 'profile'."""
    (tmp_path / "manifest.json").write_text('{"format":1,"files":{}}')
    p = subprocess.run([sys.executable, "-m", "megatron_env", "setup", "--bundle",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[-2].startswith(f"error: {tmp_path}: manifest.json is not a format-1 bundle "
                                "manifest: profile is missing"), p.stderr
    assert lines[-1].startswith("hint:") and "Traceback" not in p.stderr
    with user_error("bundle.manifest"):
        layout.read_manifest(tmp_path)


@settings(max_examples=300, deadline=None)
@given(JSON | st.fixed_dictionaries(
    {"id": st.text(max_size=5), "status": st.sampled_from(["pass", "warn", "fail", "skip", "x"]),
     "summary": st.text(max_size=5)}, optional={"evidence": JSON, "fix": JSON, "kind": JSON}))
def test_findings_from_other_programs_parse_or_are_one_user_error(value):
    try:
        f = Finding.from_dict(value, "node1/gpu_health.json")
    except UserError as e:
        assert e.kind == "findings.invalid" and "node1/gpu_health.json" in e.message
    else:
        assert f.status in ("pass", "warn", "fail", "skip") and f.id
        assert all(isinstance(x, str) for x in f.evidence) and isinstance(f.fix, str)
