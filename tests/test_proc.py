"""megatron_env.proc: the one subprocess runner."""

import gc
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from megatron_env import proc

from .tmpfs import mounted

ROOT = Path(__file__).resolve().parent.parent


def test_stdin_file_is_fed_and_closed(tmp_path):
    f = tmp_path / "in"
    f.write_text("hello")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        r = proc.run(["cat"], stdin_file=f)
        gc.collect()
    assert r.ok and r.stdout == "hello"
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)]
    assert proc.run(["cat"], input="x", stdin_file=f).stdout == "x"  # input wins, as before


# ------------------------------------------------ an interrupt while a child is being started

_STARTER = r'''
import os, signal, subprocess, sys, time
from pathlib import Path

real = subprocess.Popen.__init__

def slow(self, *a, **k):  # the window between fork and Popen's return, made wide enough to hit
    real(self, *a, **k)
    print(self.pid, flush=True)
    time.sleep(3)  # the interrupt lands here (held: it is raised once Popen returned)

subprocess.Popen.__init__ = slow
from megatron_env import proc

signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    if sys.argv[1] == "feed":
        proc.feed(["sleep", "60"], lambda stdin: None)
    else:
        proc.run(["sleep", "60"], stream=sys.argv[1] == "stream")
except KeyboardInterrupt:
    pid = int(Path("pid").read_text())
    stat = Path(f"/proc/{pid}/stat")
    state = stat.read_text().rsplit(")", 1)[1].split()[0] if stat.exists() else "gone"
    print(f"interrupted; the child: {state}", flush=True)
    sys.exit(130)
print("not interrupted", flush=True)
'''


@pytest.mark.parametrize("how", ["run", "stream", "feed"])
def test_an_interrupt_while_a_child_starts_kills_and_reaps_it(tmp_path, how):
    """Before: a Ctrl-C landing inside subprocess.Popen (after fork, before it returned) lost
    the child's pid: the child ran on, unkilled and unreaped (CI, 2026-12-06: uv outlived an
    interrupted `env`). Now the interrupt is held until the child is held, then raised, and
    the child is killed and reaped before the interrupt goes on up."""
    (tmp_path / "starter.py").write_text(_STARTER)
    p = subprocess.Popen([sys.executable, "starter.py", how], cwd=tmp_path, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout is not None
    pid = p.stdout.readline().strip()
    assert pid.isdigit(), p.stderr.read() if p.stderr else ""
    (tmp_path / "pid").write_text(pid)
    os.kill(p.pid, signal.SIGINT)  # while the starter is still inside Popen
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, out + err
    assert out.strip() == "interrupted; the child: gone", out + err
    assert not Path(f"/proc/{pid}").exists()


def test_a_log_on_a_disk_that_fills_stops_logging_not_the_run(tmp_path):
    """Before: the streamed log written beside the environment uv fills raised ENOSPC in this
    process's own write: the child was killed and uv's message (and its `no space` cause) lost.
    Now the log stops where its disk is full and the output is kept whole in memory."""
    with mounted(tmp_path / "small", "1m") as mnt:
        r = proc.run([sys.executable, "-c", "for i in range(40000): print('x' * 60, i)"],
                     log=mnt / "run.log", stream=True, on_line=lambda line: None)
        assert r.ok, r.tail(3)
        assert len(r.output.splitlines()) == 40000 and r.output.splitlines()[-1].endswith(" 39999")
        assert 0 < (mnt / "run.log").stat().st_size <= 2**20  # as much as fitted
