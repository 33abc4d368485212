"""Edges of the small shared modules that the mutation sample (bench/mutation_sample.py) found
unguarded: each test names what a broken copy got away with."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from megatron_env import files, mutex, proc

WAITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from megatron_env import mutex
    with mutex.exclusive(Path(sys.argv[1]), "waiting: the other run", echo=print):
        print("inside", flush=True)
""")


def test_a_second_holder_says_it_waits_and_enters_only_after_the_first_leaves(tmp_path):
    """mutex.exclusive without its first acquire let two runs build one prefix at once."""
    lock = tmp_path / ".lock"
    said: list[str] = []
    with mutex.exclusive(lock, "never printed", echo=said.append):
        child = subprocess.Popen([sys.executable, "-c", WAITER, str(lock)],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "waiting: the other run"
        time.sleep(0.5)
        assert child.poll() is None  # still waiting, not inside
    out, _ = child.communicate(timeout=60)
    assert out.strip() == "inside" and child.returncode == 0
    assert said == []  # the first holder found the lock free and said nothing


def test_syncing_a_tree_with_a_dangling_link_syncs_its_files_and_skips_the_link(tmp_path):
    """files.sync with its link test inverted opened every link (a dangling one: an error)
    and synced no regular file; a tree with a broken link (a venv's, a checkout's) must sync."""
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "data.txt").write_text("x")
    (tree / "gone").symlink_to(tmp_path / "nowhere")
    files.sync(tree)  # no exception
    assert (tree / "sub" / "data.txt").read_text() == "x"


def test_full_mounts_names_mount_points_from_the_mount_table():
    """A filesystem counted as full is named by its mount point (the second field of
    /proc/self/mounts), never by its device or type: under a limit no filesystem reaches, every
    writable one is listed, each an absolute directory."""
    mounts = files.full_mounts(limit=2**62)
    assert mounts, "no writable filesystem found"
    assert all(m.is_absolute() and m.is_dir() for m in mounts), mounts
    assert any(m == Path("/") or Path(__file__).resolve().is_relative_to(m) for m in mounts)


def test_a_timed_out_command_keeps_what_it_printed_and_nothing_else():
    """The output of a command cut by its timeout: what it printed, or "" when it printed
    nothing (a placeholder there reads as output the command never wrote)."""
    quiet = proc.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert quiet.timed_out and quiet.returncode == 124 and quiet.stdout == ""
    said = proc.run([sys.executable, "-u", "-c",
                     "import time; print('partial', flush=True); time.sleep(30)"], timeout=2)
    assert said.timed_out and said.stdout == "partial\n"
