"""The speed-ups of the triage change nothing it finds. A big log read on two cores
(megatron_env/diagnose/twocore.py) gives what one process gives: the same findings, the same
line count, the same error for a damaged file (`twocore.MODE` is set so that the fixture logs,
cited in tests/fixtures/job-logs/README.md, take that path). The block scan in two
parts (events.HOT_PARTS) finds, line by line, the words one scan of all of them finds."""

import dataclasses
import gzip
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_env.diagnose import events as events_mod
from megatron_env.diagnose import jobs, logfiles, twocore, wordscan

from .conftest import FIXTURES, user_error

LOGS = FIXTURES / "job-logs"
SOME = sorted(LOGS.glob("*.log"))[::7]  # every seventh: all families, a few seconds


def _run(paths, mode, monkeypatch):
    monkeypatch.setattr(twocore, "MODE", mode)
    findings, lines, files = jobs.run(paths)
    return [dataclasses.asdict(f) for f in findings], lines, files


@pytest.mark.parametrize("log", SOME, ids=lambda p: p.name)
def test_two_processes_find_what_one_finds(log, monkeypatch):
    assert _run([log], "two", monkeypatch) == _run([log], "one", monkeypatch)


def test_several_files_and_a_compressed_one(tmp_path, monkeypatch):
    packed = tmp_path / "rank1.log"  # gzip, known by its magic bytes
    packed.write_bytes(gzip.compress(SOME[1].read_bytes()))
    paths = [SOME[0], packed, SOME[2]]
    one = _run(paths, "one", monkeypatch)
    assert _run(paths, "two", monkeypatch) == one and one[1] > 0


def test_a_damaged_archive_is_the_same_clear_error(tmp_path, monkeypatch):
    f = tmp_path / "cut.log.gz"
    packed = gzip.compress(b"".join(p.read_bytes() for p in SOME))
    f.write_bytes(packed[:len(packed) // 2])  # cut mid-stream: read a while, then fails
    monkeypatch.setattr(twocore, "MODE", "two")
    with user_error("triage.unreadable") as e:
        jobs.run([f])
    assert str(f) in e.value.message


# ------------------------------------------------ the block scan in two parts, merged exactly

_WORDS = events_mod._WORDS
# pieces that make words overlap across the parts ("Last error:" holds "Last error" and
# "error:"; "Killed process" starts inside "of memory: Kill"), cut words, line ends
_PIECES = st.one_of(st.sampled_from(_WORDS), st.sampled_from([w[1:] for w in _WORDS]),
                    st.sampled_from([w[:-1] for w in _WORDS]),
                    st.sampled_from(["\n", " ", ":", "L", "K", "e", "x"]))


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=40), st.lists(st.sampled_from(_WORDS), max_size=2))
def test_two_part_scan_finds_what_one_scan_finds(pieces, rare):
    text = "".join(pieces)
    one = logfiles._hits(text, events_mod.HOT, tuple(rare))
    assert logfiles._hits(text, events_mod.HOT_PARTS, tuple(rare)) == one
    assert logfiles._hits(text, logfiles._Exact(logfiles._merged(text, events_mod.HOT_PARTS)),
                          tuple(rare)) == one


@settings(max_examples=600, deadline=None)
@given(st.lists(st.text("abAB", min_size=1, max_size=4), min_size=1, max_size=8),
       st.text("abAB\n", max_size=60))
def test_any_words_split_by_first_letter_merge_to_one_scan(words, text):
    # small alphabets make every overlap happen: a dropped match of one part hiding a later
    # match of its own part ("aB" kept, "Bc" dropped, "cd" inside it) included
    one = re.compile(events_mod.trie(words))
    parts = tuple(re.compile(events_mod.trie(g)) for g in
                  ([w for w in words if w[0].islower()], [w for w in words if not w[0].islower()])
                  if g)
    assert logfiles._hits(text, parts, ()) == logfiles._hits(text, one, ())


def test_a_word_hidden_by_a_dropped_match_is_found():
    one = re.compile(events_mod.trie(["aB", "Bc", "cd"]))
    parts = (re.compile(events_mod.trie(["aB", "cd"])), re.compile(events_mod.trie(["Bc"])))
    assert logfiles._hits("aBcd", parts, ()) == logfiles._hits("aBcd", one, ()) == [
        (0, ("aB", "cd"))]
    # a word of one part inside a longer one of the other, some reaching past its end
    for text in ("Last error: x", "Bus error: y\nLast error:\n", "of memory: Killed process 1",
                 "Last errorror: z", "Exitcode exit code exited on"):
        assert (logfiles._hits(text, events_mod.HOT_PARTS, ())
                == logfiles._hits(text, events_mod.HOT, ()))


# ------------------------------------- words that begin with a small letter, found by an anchor

@settings(max_examples=600, deadline=None)
@given(st.lists(st.text("abcxy ", min_size=1, max_size=5), min_size=1, max_size=8),
       st.text("abcxy \n", max_size=200))
def test_an_anchored_scan_finds_what_the_plain_pattern_finds(words, text):
    # any words (a piece of one inside another, a piece that is a whole word), any text;
    # the dense switch (the rest scanned whole) made to happen in short texts too
    exact = re.compile(events_mod.trie(words))
    for dense in (wordscan._DENSE, 2):
        scan = wordscan.Anchored(words)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(wordscan, "_DENSE", dense)
            got = [(m.start(), m.group()) for m in scan.finditer(text)]
        assert got == [(m.start(), m.group()) for m in exact.finditer(text)]


def test_every_anchor_is_a_piece_of_its_word():
    words = [w for w in _WORDS if w[0].islower()]
    pieces = wordscan.anchors(words)
    assert all(any(w.endswith(p) for p in pieces) for w in words)
    assert all(len(p) >= min(wordscan._PIECE, min(map(len, words))) for p in pieces)
