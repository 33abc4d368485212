"""Edges of the lock and lock-diff code that the mutation sample
(bench/mutation_sample.py) found unguarded: each test names what a broken copy got away with."""

from megatron_env.pyenv import lockdiff_markdown


def _profile(**over):
    """One profile of a lock-diff document (format 1, docs/locks.md) whose lock did not move."""
    p = {"profile": "core_v0.4.0-cu121", "lock": "envs/core_v0.4.0-cu121/requirements.lock",
         "changes": [], "status": "changed", "packages": 80, "size_before": None,
         "size_after": None, "size_unknown": [], "yanked": [], "kernels": [],
         "megatron": {"old": "a" * 40, "new": "b" * 40, "moved": True}}
    return {**p, **over}


def test_a_profile_where_only_megatron_moved_says_no_package_moved():
    """The summary line of a section with no package change was empty (its `or` fallback
    replaced by an empty string) and nothing noticed."""
    text = lockdiff_markdown.markdown({"profiles": [_profile()], "index_read": False})
    section = text.split("\n\n")
    assert section[0] == "### core_v0.4.0-cu121 (`envs/core_v0.4.0-cu121/requirements.lock`)"
    assert section[1] == "no package moved"
    assert "- Megatron-LM commit moved: aaaaaaaaaaaa → bbbbbbbbbbbb" in text


def test_a_profile_added_or_removed_is_one_line_with_its_download_on_its_own_side():
    """A whole profile added has only a size after, one removed only a size before; the line
    of the one added named nothing when the two sides were swapped."""
    added = _profile(status="added", size_before=None, size_after=2_500_000, megatron={
        "old": None, "new": "b" * 40, "moved": True})
    removed = _profile(profile="old", lock="envs/old/requirements.lock", status="removed",
                       size_before=1_200_000_000, size_after=None, packages=7)
    text = lockdiff_markdown.markdown({"profiles": [added, removed], "index_read": True})
    assert "\nprofile added: 80 packages, download per node 2.5 MB\n" in text
    assert "\nprofile removed: 7 packages, download per node 1,200.0 MB\n" in text
