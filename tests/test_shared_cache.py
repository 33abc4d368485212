"""One way to publish into a shared cache (issue 34 item 3): processes posing as two nodes of a
cluster write into one cache at once; neither removes the other's work in progress, and a
writer killed with SIGKILL leaves nothing a later run trips over (its temporary goes once it is
provably dead: its own host sees the pid gone, any host after files.STALE_HOURS)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_env import files
from megatron_env.recipes import recipe

from .test_trust_nothing import _sdist  # one tiny sdist for both files

ROOT = Path(__file__).resolve().parent.parent

# argv: host, dest, ready file, go file ("" to finish at once); what every publishing site does
WRITER = """
import sys, time
from pathlib import Path
from megatron_env import files
host, dest, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
files.set_host(host)
files.sweep(dest.parent, dest.name)
with files.publishing(dest, tree=True) as tmp:
    (tmp / "first-half").write_text(host)
    ready.write_text(tmp.name)
    while go and not Path(go).exists():
        time.sleep(0.01)
    (tmp / "second-half").write_text(host)
print(dest)
"""

# argv: host, cache, the pinned sha256: the kernel source fetch (source_trees.fetch) as a node runs it
FETCH = """
import sys
from pathlib import Path
from megatron_env import files
from megatron_env.kernels import build, source_trees
from megatron_env.recipes import recipe
files.set_host(sys.argv[1])
pkg = recipe.Package("tinyk", "1.0", recipe.Source(sha256=sys.argv[3], url="tinyk-1.0.tar.gz"),
                     cuda=False)
print(source_trees.fetch(pkg, lambda s: None, cache=Path(sys.argv[2])))
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def _start(host: str, dest: Path, ready: Path, go: Path | None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, host, str(dest), str(ready),
                             str(go) if go else ""], env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait(path: Path, proc: subprocess.Popen[str]) -> str:
    for _ in range(3000):
        if path.exists() and path.read_text():
            return path.read_text()
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError(f"{path} never came")


def _sweep_as(host: str, parent: Path) -> list[str]:
    code = ("import sys; from pathlib import Path; from megatron_env import files; "
            "files.set_host(sys.argv[1]); print([p.name for p in files.sweep(Path(sys.argv[2]))])")
    r = subprocess.run([sys.executable, "-c", code, host, str(parent)], env=_env(),
                       capture_output=True, text=True, check=True)
    return eval(r.stdout)  # a list of names printed by the line above  # noqa: S307


def test_two_hosts_writing_one_cache_leave_each_other_alone(tmp_path):
    cache = tmp_path / "cache" / "patched"
    dest = cache / "tinyk-0123456789abcdef"
    go = tmp_path / "go"
    a = _start("nodeA", dest, tmp_path / "a.ready", go)
    b = _start("nodeB", dest, tmp_path / "b.ready", go)
    temps = {_wait(tmp_path / "a.ready", a), _wait(tmp_path / "b.ready", b)}
    assert {t.split(".tmp-")[1].split("-")[0] for t in temps} == {"nodeA", "nodeB"}
    # each node's clean-up runs while both are mid-write: neither's temporary is touched
    assert _sweep_as("nodeA", cache) == [] and _sweep_as("nodeB", cache) == []
    assert {p.name for p in cache.iterdir()} == temps
    go.touch()
    for p in (a, b):
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    # one whole tree published (the first rename), the other dropped; no temporary left
    assert sorted(p.name for p in dest.iterdir()) == ["first-half", "second-half"]
    assert (dest / "first-half").read_text() == (dest / "second-half").read_text()
    assert [p.name for p in cache.iterdir()] == [dest.name]


def test_a_writer_killed_with_sigkill_leaves_nothing_a_later_run_trips_over(tmp_path):
    """nodeA is killed mid-write of the kernel source tree. nodeB's fetch publishes the tree
    past it and leaves nodeA's temporary alone (nodeB cannot ask nodeA's kernel); nodeA's next
    run removes it (its pid is gone); after STALE_HOURS any node does."""
    sdist, sha = _sdist(tmp_path)
    cache = tmp_path / "cache"
    dest = cache / "src" / f"tinyk-{sha[:12]}"
    killed = _start("nodeA", dest, tmp_path / "a.ready", tmp_path / "never")
    left = _wait(tmp_path / "a.ready", killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    env = _env(**{recipe.source_var("tinyk"): str(sdist)})

    def fetch_as(host: str) -> str:
        r = subprocess.run([sys.executable, "-c", FETCH, host, str(cache), sha], env=env,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert fetch_as("nodeB") == str(dest)
    assert (dest / "tinyk" / "__init__.py").read_text() == "ANSWER = 42\n"
    assert (dest.parent / left).is_dir()  # another node's, not provably dead
    files.discard(dest)  # the tree is made again: nodeA's run sweeps first
    assert fetch_as("nodeA") == str(dest)
    assert not (dest.parent / left).exists()  # this host's, its pid gone
    # a temporary another node left a day ago
    old = dest.parent / f"{dest.name}.tmp-nodeC-{os.getpid()}-0123abcd"
    old.mkdir()
    day = time.time() - (files.STALE_HOURS + 1) * 3600
    os.utime(old, (day, day))
    files.discard(dest)
    assert fetch_as("nodeB") == str(dest) and not old.exists()
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]


def test_names_without_a_host_or_not_temporaries_are_never_called_dead(tmp_path):
    """An older version's `<name>.tmp-<pid>` may be another node's: only its age frees it;
    a name that is not a temporary never is."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for name in (f"x.tmp-{dead}", "x.tmp-", "x-tmp-1", "x"):
        (tmp_path / name).mkdir()
    assert files.sweep(tmp_path) == []
    later = time.time() + (files.STALE_HOURS + 1) * 3600
    assert [p.name for p in tmp_path.iterdir() if files.dead(p, now=later)] == [f"x.tmp-{dead}"]


@pytest.mark.parametrize("tree", [False, True])
def test_a_failed_write_leaves_no_temporary_and_the_old_value(tmp_path, tree):
    dest = tmp_path / "slot"
    if tree:
        dest.mkdir()
        (dest / "old").write_text("old")
    else:
        dest.write_text("old")
    with pytest.raises(RuntimeError), files.publishing(dest, tree=tree) as tmp:
        (tmp / "x" if tree else tmp).write_text("half")
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slot"]
    assert (dest / "old" if tree else dest).read_text() == "old"


def test_an_environment_in_progress_on_another_node_is_not_cleared(tmp_path):
    """`invoke env` clears what killed runs left in the environment store: an environment
    whose claim is another node's (or this host's, alive) stays, one whose claim is dead
    goes, an unclaimed one (older versions) goes as before; the lock file and the current
    environment stay."""
    from megatron_env.pyenv import env

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    store = tmp_path / "prefix.d"
    for d in ("current", "other-node", "killed-here", "unclaimed"):
        (store / d / "bin").mkdir(parents=True)
    (store / ".lock").touch()
    (store / f"other-node.tmp-nodeB-{dead}-0123abcd").touch()
    (store / f"killed-here.tmp-{files.host()}-{dead}-0123abcd").touch()
    env._clear(store, store / "current")
    assert sorted(p.name for p in store.iterdir()) == [
        ".lock", "current", "other-node", f"other-node.tmp-nodeB-{dead}-0123abcd"]
