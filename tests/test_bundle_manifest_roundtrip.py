"""bundle/manifest.py: the manifest is written from the `Manifest` type (`to_doc`) and read
back by `Manifest.parse`: one definition of the format, so any manifest the type can hold
survives the trip through JSON unchanged."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from megatron_env.bundle.manifest import FileEntry, Item, MadeFor, Manifest

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
segment = st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1,
                  max_size=8).filter(lambda s: s not in (".", ".."))
relpath = st.lists(segment, min_size=1, max_size=4).map("/".join)
hex64 = st.text("0123456789abcdef", min_size=64, max_size=64)


def items(required: str) -> st.SearchStrategy[tuple[Item, ...]]:
    extra = st.dictionaries(segment.filter(lambda k: k not in ("name", "path")), text,
                            max_size=3)
    return st.lists(st.builds(lambda n, p, r, e: Item(n, p, {required: r, **e}), text, relpath,
                              text, extra), max_size=3).map(tuple)


manifests = st.builds(
    Manifest,
    profile=st.builds(MadeFor, text, text, text, text, text),
    python=text, machine=text, mode=st.sampled_from(["full", "adopt"]),
    with_builds=st.booleans(), made_at=text, base=st.none() | text,
    without=st.lists(text, max_size=3).map(tuple),
    git=items("commit"), sources=items("sha256"), conda=items("url"),
    files=st.dictionaries(relpath, st.builds(FileEntry, hex64, st.integers(0, 2**53), text,
                                             st.booleans()), max_size=4),
    resources=items("digest"), tool_version=text, wheels=text)


@given(manifests)
def test_what_the_type_writes_it_reads_back(m: Manifest) -> None:
    doc = json.loads(json.dumps(m.to_doc()))
    back = Manifest.parse(doc, "b.tar")
    assert back == m
    assert back.doc == doc  # what a delta's digest is taken of: the document as written
