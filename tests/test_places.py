"""Where the tool writes (issue 41): outside a project, a wheel install writes into the user's
directories (XDG), never into the directory it runs in; every writing run says where in one
status line; `clean` lists caches and environments with sizes and removes only what is
provably the tool's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from megatron_env import project
from megatron_env.commands import places

from .conftest import user_error


@pytest.fixture
def proj(tmp_path, monkeypatch):
    """A project directory in use: its .megatron-env and .cache are the defaults."""
    (tmp_path / "proj" / "envs" / "p").mkdir(parents=True)
    monkeypatch.setattr(project, "_root", (tmp_path / "proj", "given"))
    monkeypatch.setattr(project, "_cache_chosen", None)
    monkeypatch.delenv(project.CACHE_ENV, raising=False)
    monkeypatch.delenv(project.STATE_ENV, raising=False)  # the suite's own state: not here
    return tmp_path / "proj"


def _environment(prefix: Path, size: int) -> None:
    """The layout env.build leaves: the prefix a link into its store, the stamp, the lock."""
    from megatron_env.pyenv import env

    target = prefix.with_name(prefix.name + ".d") / "abc-1"
    target.mkdir(parents=True)
    (target.parent / ".lock").write_text("")
    (target / env.STAMP).write_text("{}")
    (target / "blob").write_bytes(b"\0" * size)
    prefix.symlink_to(os.path.relpath(target, prefix.parent))


def test_clean_lists_then_removes_only_what_is_marked(proj, tmp_path, capsys):
    cache = project.cache_root()
    assert cache == proj / ".cache"
    places.announce(prefix=project.env_root() / "p", cache=cache)
    (cache / "git").mkdir()
    (cache / "git" / "pack").write_bytes(b"\0" * 3 * 2**20)
    _environment(project.env_root() / "p", 2 * 2**20)
    assert places.clean.fn(dry_run=True) == 0
    out = capsys.readouterr().out
    assert "cache        git  3.0 MiB  would remove" in out
    assert "environment  p    2.0 MiB  would remove" in out
    assert "would free 5.0 MiB in 2 place(s)" in out
    assert (cache / "git" / "pack").exists() and (project.env_root() / "p").is_symlink()
    assert places.clean.fn() == 0
    assert "freed 5.0 MiB" in capsys.readouterr().out
    assert not (cache / "git").exists() and not list(project.env_root().glob("p*"))

    # a cache directory the tool did not make (a home directory by mistake), even one a writing
    # command was pointed at: never marked, listed as kept, untouched
    home = tmp_path / "home"
    (home / "thesis").mkdir(parents=True)
    (home / "thesis" / "draft.tex").write_text("x" * 4096)
    places.announce(cache=home)
    assert not (home / places.CACHEDIR_TAG).exists()
    assert places.clean.fn(cache_dir=str(home)) == 0
    out = capsys.readouterr().out
    assert "kept: no CACHEDIR.TAG of megatron-env" in out and "1 kept" in out
    assert (home / "thesis" / "draft.tex").exists()


def test_clean_refuses_a_prefix_that_is_not_an_environment(proj, tmp_path):
    other = tmp_path / "data"
    other.mkdir()
    (other / "results.csv").write_text("1,2\n")
    (tmp_path / "data.d").mkdir()  # a directory that only looks like a store: no lock, no stamp
    (tmp_path / "data.d" / "keep").mkdir()
    with user_error("clean.not-ours"):
        places.clean.fn.__wrapped__(prefix=str(other))
    assert (other / "results.csv").exists() and (tmp_path / "data.d" / "keep").exists()
    _environment(tmp_path / "mine", 1024)  # a --prefix environment elsewhere: stamped, removed
    assert places.clean.fn(prefix=str(tmp_path / "mine")) == 0
    assert not (tmp_path / "mine").is_symlink() and not (tmp_path / "mine.d").exists()


def test_clean_removes_only_the_tools_own_entries(proj, tmp_path, capsys):
    """Before: in a tagged cache or the marked environment root, every entry went, whoever put
    it there. Now a foreign file, a foreign directory and links pointing outside stay (and
    what they point at), beside the tool's own parts, which go."""
    cache, root = project.cache_root(), project.env_root()
    places.announce(prefix=root / "p", cache=cache)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    (cache / "wheels").mkdir()
    (cache / "wheels" / "w.whl").write_bytes(b"\0" * 1024)
    (cache / "notes.txt").write_text("mine")  # a file put in the cache
    (cache / "datasets").mkdir()  # a directory put in the cache
    (cache / "datasets" / "d.bin").write_text("mine")
    (cache / "src").symlink_to(outside)  # a link with a part's name, pointing outside
    (cache / "link").symlink_to(outside)
    _environment(root / "p", 1024)
    (root / "p2.setup").mkdir()  # what `setup --only lock` leaves: its stamp only
    (root / "p2.setup" / "lock.json").write_text("{}")
    (root / "scratch").mkdir()  # a directory put under the environments root
    (root / "scratch" / "run.log").write_text("mine")
    (root / "data.d").mkdir()  # one that only looks like a store
    (root / "data.d" / "keep").write_text("mine")
    (root / "elsewhere").symlink_to(outside)
    assert places.clean.fn() == 0
    out = capsys.readouterr().out
    assert not (cache / "wheels").exists() and not list(root.glob("p*"))
    for mine in (cache / "notes.txt", cache / "datasets" / "d.bin", root / "scratch" / "run.log",
                 root / "data.d" / "keep", outside / "precious"):
        assert mine.exists(), (mine, out)
    for link in (cache / "src", cache / "link", root / "elsewhere"):
        assert link.is_symlink(), (link, out)
    assert "7 kept" in out, out
