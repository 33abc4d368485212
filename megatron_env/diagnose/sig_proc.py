"""Signatures of how processes ended, as the launchers and the scheduler print it: torchrun's
failure table and elastic agent, signals as CPython, UCX, Open MPI, the DataLoader and gdb print
them, Ray's dead workers, Slurm's cancellations."""

from __future__ import annotations

import re
from collections import deque
from itertools import islice
from typing import Any

from megatron_env.diagnose.ids import FindingId
from megatron_env.diagnose.joblog import Line
from megatron_env.diagnose.model import (
    SIGNALS,
    Cancelled,
    Events,
    Failing,
    Failure,
    Hit,
    RayDeath,
    Signal,
    rank_of,
)

FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*: (.*)$")
ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_ELASTIC = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_RAY_DIED = re.compile(r"A worker died or was killed.*?Worker IP address: (\S+).*?Worker PID: "
                       r"(\d+)(?:.*?Worker exit type: (\w+))?")
_RAY_ACTOR = re.compile(r"RayTaskError\((\w+)\): \S+ \(pid=(\d+), ip=([\w.-]+)")
_SLURM_CANCEL = re.compile(r"\*\*\* (STEP|JOB) ([\w.]+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO "
                           r"([A-Z ]+?))? \*\*\*")
# a process killed by a signal, as UCX, CPython, Open MPI, the DataLoader, torchrun's agent, gdb
# and Python's subprocess say it: (pattern, groups of number, name, host, pid)
_SIGNAL_FORMS = [
    (re.compile(r"(?:\[([\w.-]+):(\d+) ?:\d+:\d+\] )?Caught signal (\d+) \(([^:)]+)"),
     (3, 4, 1, 2)),
    (re.compile(r"Fatal Python error: (Bus error|Segmentation fault|Aborted|Floating point "
                r"exception)"), (None, 1, None, None)),
    (re.compile(r"(?:\[([\w.-]+):(\d+)\] )?Signal: ([\w ]+?) \((\d+)\)"), (4, 3, 1, 2)),
    (re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID (\d+)"), (1, 2, None, 3)),
    (re.compile(r"<Signals\.(SIG\w+): (\d+)>"), (2, 1, None, None)),
    (re.compile(r"received signal (SIG\w+)"), (None, 1, None, None)),
    # abseil's failure signal handler (Ray's workers, glog-linked binaries)
    (re.compile(r"\*\*\* (SIG[A-Z]+) received at time="), (None, 1, None, None)),
    (re.compile(r"Received (\d+) death signal, shutting down workers"), (1, None, None, None)),
]
_SLURM_CANCEL = re.compile(r"\*\*\* (STEP|JOB) ([\w.]+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO "
                           r"([A-Z ]+?))? \*\*\*")
_SIGNAL_NAMES = {"Bus error": 7, "Segmentation fault": 11, "Aborted": 6, "Killed": 9,
                 "Floating point exception": 8}


def failed(ev: Events, f: Failure, key: tuple[Any, ...] | None = None,
           line: str = "") -> None:
    """A launcher's failed child: a failure, and a signal when its exit code says one."""
    ev.add(f, key=key)
    code = f.exitcode
    if code is not None and code < 0:
        name = SIGNALS.get(-code, f"signal {-code}")
        ev.add(Signal(signal=name, what=name, number=-code, rank=f.rank, host=f.host,
                      pid=f.pid, local=f.local_rank, code=code, table=True,
                      line=line or f"{f.launcher}: "
                      + (f"rank {f.rank}" if f.rank is not None else
                         f"local rank {f.local_rank}") + f" exit code {code}"),
               key=(name, f.rank, f.host, f.pid, f.local_rank))


def _elastic(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _ELASTIC.search(t):
        failed(ev, Failure(local_rank=int(m.group(2)), host=line.host,
                           exitcode=int(m.group(1)), pid=m.group(3)),
               key=(m.group(2), m.group(3)), line=t.strip())


# DeepSpeed's launcher (deepspeed/launcher/launch.py, sigkill_handler): one child failed, it
# kills the others ("Killing subprocess N") and logs the failed command, with its local rank,
# "exits with return code = N" at its end (a paste may cut it off)
_DS_FAILED = re.compile(r"sigkill_handler\] \[.*?'--local_rank=(?P<local>\d+)'.*?"
                        r"(?:exits with return code = (?P<code>-?\d+)|$)")


def _deepspeed(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _DS_FAILED.search(t):
        code = int(m.group("code")) if m.group("code") else None
        failed(ev, Failure(root=True, local_rank=int(m.group("local")), host=line.host,
                           exitcode=code, launcher="DeepSpeed's launcher"),
               key=("deepspeed", m.group("local")), line=t.strip())


def _ray(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _RAY_DIED.search(t):
        ev.add(RayDeath(ip=m.group(1), pid=m.group(2), exit=m.group(3)), key=(m.group(2),))


_ACTOR_FIELD = re.compile(r"^\s*(pid|ip|class_name): (\S+)")


def _actor_died(ev: Events, line: Line, t: str, ahead: deque[Line],
                facts: dict[str, Any]) -> None:
    """Ray's ActorDiedError: `The actor died unexpectedly before finishing this task.`, its
    class_name, pid and ip on the lines that follow (ray/exceptions.py)."""
    f = {m.group(1): m.group(2) for x in islice(ahead, 12) if (m := _ACTOR_FIELD.match(x.text))}
    if f.get("pid"):
        ev.add(RayDeath(ip=f.get("ip") or line.host or "an unknown node", pid=f["pid"],
                        exit=f.get("class_name")), key=(f["pid"],))


def _ray_actor(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _RAY_ACTOR.search(t):
        ev.add(RayDeath(ip=m.group(3), pid=m.group(2), exit=m.group(1)), key=(m.group(2),))


def _cancelled(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    if m := _SLURM_CANCEL.search(t):
        ev.add(Cancelled(what=m.group(1).lower(), id=m.group(2), host=m.group(3),
                         at=m.group(4), why=(m.group(5) or "").lower()),
               key=(m.group(2),))


def _signal(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    m, groups = next(((m, g) for rx, g in _SIGNAL_FORMS if (m := rx.search(t))), (None, None))
    if m is None or groups is None:
        return
    gnum, gname, ghost, gpid = groups
    what = (m.group(gname).strip() if gname else
            SIGNALS.get(int(m.group(gnum)), "signal") if gnum else "signal")
    num = int(m.group(gnum)) if gnum else _SIGNAL_NAMES.get(what) or next(
        (n for n, s in SIGNALS.items() if s == what), None)
    host = (m.group(ghost) if ghost else None) or line.host
    pid = m.group(gpid) if gpid else None
    name = SIGNALS.get(num, what) if num else what
    ev.add(Signal(signal=name, what=what, number=num, rank=rank_of(line), host=host, pid=pid,
                  worker="is killed by signal" in t,
                  agent="received by PID" in t or "death signal" in t, line=t.strip()),
           key=(name, rank_of(line), host, pid))
    if pid is not None:
        ev.job.note(rank_of(line), host, pid)


def failure(e: dict[str, Any]) -> Failure:
    """One entry of torchrun's failure table (its fields as read, `root` under the Root Cause
    heading) as a Failure."""
    rank = re.match(r"(\d+)(?: \(local_rank: (\d+)\))?", e.get("rank", ""))
    code = re.match(r"(-?\d+)(?: \(pid: (\d+)\))?", e.get("exitcode", ""))
    return Failure(root=e["root"], rank=int(rank.group(1)) if rank else None,
                   local_rank=int(rank.group(2)) if rank and rank.group(2) else None,
                   host=e.get("host"), exitcode=int(code.group(1)) if code else None,
                   pid=code.group(2) if code else None,
                   time=(e.get("time") or "").replace("_", " ") or None,
                   traceback=e.get("traceback", ""))




_SHELL = ("Killed", "fault", "Bus error", "Aborted", "Terminated", "Illegal instruction",
          "Floating point exception")
# how launchers, shells and schedulers print the end of a child they started; named groups:
# code (an exit status, negative for a signal, 128+N from a shell), sig (a signal's number),
# sname (a signal as the shell words it), pid, host, rank, local (local rank), tasks (srun's)
_EXITS = [((trigger,) if isinstance(trigger, str) else trigger, re.compile(rx))
          for trigger, rx in [
    # DeepSpeed's launcher: "[launch.py:..:sigkill_handler] ['python', ..., '--local_rank=1']
    # exits with return code = -9"
    ("return code =", r"^(?!.*sigkill_handler\] \[.*--local_rank).*?exits with return code = "
                      r"(?P<code>-?\d+)"),
    # Open MPI's mpirun / prterun
    ("exited on", r"process rank (?P<rank>\d+) with PID (?P<pid>\S+) on node "
                         r"(?P<host>\S+) exited on signal (?P<sig>\d+)"),
    # srun, for the tasks of one node: "srun: error: nid01: tasks 2,4-5: Terminated"
    ("srun: error:", r"srun: error: (?P<host>[\w.-]+): tasks? (?P<tasks>[\d,-]+): "
                     r"(?:(?P<sname>Killed|Terminated|Segmentation fault|Aborted|Bus error|"
                     r"Out Of Memory)|Exited with exit code (?P<code>\d+))"),
    ("exit code", r"command terminated with exit code (?P<code>\d+)"),  # kubectl exec / logs
    ("exit with status", r"Process (?P<rank>\d+) exit with status code (?P<code>-?\d+)"),
    # a shell reporting its child: bash's job control ("script: line 10:   93 Killed   cmd")
    (_SHELL, r"line \d+:\s+(?P<pid>\d+) (?P<sname>Killed|Segmentation fault|Bus error|Aborted|"
              r"Terminated|Illegal instruction|Floating point exception)\b"),
    # ... and a bare line: "Killed", "Segmentation fault (core dumped)"
    (_SHELL, r"^\s*(?P<sname>Killed|Segmentation fault|Bus error|Terminated|Illegal instruction|"
             r"Floating point exception)(?: \(core dumped\))?"
           r"\s*$"),
    (("Aborted",), r"^\s*(?P<sname>Aborted) \(core dumped\)\s*$"),
    ("Received SIG", r"Received (?:SIG[A-Z]+): (?P<sig>\d+)"),  # Lightning's signal handler
    # torch.multiprocessing.spawn: "ProcessExitedException: process 0 terminated with signal
    # SIGKILL" / "... terminated with exit code 1"
    ("terminated with", r"process (?P<local>\d+) terminated with (?:signal (?P<sigword>SIG[A-Z]+)|"
                        r"exit code (?P<code>\d+))"),
    ("exit status", r"returned non-zero exit status (?P<code>-?\d+)"),  # CalledProcessError
    ("non-zero status", r"Command exited with non-zero status (?P<code>\d+)"),  # /usr/bin/time
    ("xit", r"\b[Ee]xit(?:ed)?(?: with)? (?:code|status)[ :=]+(?P<code>-?\d+)"),
]]
_SHELL_WORDS = {"Killed": 9, "Segmentation fault": 11, "Bus error": 7, "Aborted": 6,
                "Illegal instruction": 4, "Floating point exception": 8,
                "Terminated": 15}


def tasks(text: str) -> list[int]:
    """srun's task list ("2,4-5,7") as task ids."""
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        if a.isdigit():
            out += range(int(a), int(b) + 1) if b.isdigit() else [int(a)]
    return out[:4096]


def _exit(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """A child's end as its launcher printed it: a signal (negative code, 128+N, a shell's
    word) goes to `signals`, a host OOM kill to `hits`, another non-zero code to `failing`."""
    if t.endswith("exited on") and ahead:  # mpirun's message wrapped before "signal N"
        t = t + " " + ahead[0].text.strip()
    for triggers, rx in _EXITS:
        if any(w in t for w in triggers) and (m := rx.search(t)):
            break
    else:
        return
    g = m.groupdict()
    code = int(g["code"]) if g.get("code") else None
    num = (int(g["sig"]) if g.get("sig") else _SHELL_WORDS.get(g.get("sname") or "")
           or next((n for n, s in SIGNALS.items() if s == g.get("sigword")), None)
           or (-code if code is not None and code < 0 else None)
           or (code - 128 if code is not None and code - 128 in SIGNALS else None))
    host = g.get("host") or line.host
    rank = int(g["rank"]) if g.get("rank") else rank_of(line)
    ids = tasks(g["tasks"]) if g.get("tasks") else []
    local = int(g["local"]) if g.get("local") else None
    if g.get("sname") == "Out Of Memory":
        ev.add(Hit(id=FindingId.JOB_OOM_KILLER, kind="cgroup",
                   what="the cgroup's OOM killer (srun: Out Of Memory)", rank=rank, host=host,
                   tasks=ids, line=t.strip()),
               key=(host, g["tasks"]))
    elif num is not None:
        name = SIGNALS.get(num, f"signal {num}")
        ev.add(Signal(signal=name, what=g.get("sname") or name, number=num, rank=rank,
                      host=host, pid=g.get("pid"), tasks=ids, local=local, code=code,
                      line=t.strip()), key=(name, rank, host, g.get("pid"), g["tasks"]
                                                    if g.get("tasks") else local))
    elif code:
        ev.add(Failing(kind="exit", line=t.strip(), rank=rank, host=host, code=code,
                                  tasks=ids, local=local), key=("exit", code, rank, host, local))


# a row of `kubectl get pods`: NAME READY STATUS RESTARTS AGE
_POD = re.compile(r"^\s*(?P<pod>[a-z0-9][a-z0-9.-]{2,252})\s+\d+/\d+\s+(?P<status>Running|Error|"
                  r"CrashLoopBackOff|OOMKilled|Completed|Terminating|Evicted)\s+\d+")


def _pod(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """The pods a `kubectl get pods` table names: where an exit code of `kubectl` came from."""
    if (m := _POD.match(t)) and m.group("pod") not in ev.pods and len(ev.pods) < 16:
        ev.pods.append(m.group("pod"))
    if m and m.group("status") in ("CrashLoopBackOff", "Error"):  # it failed; its log says why
        ev.add(Failing(kind="pod", line=t.strip(), host=m.group("pod")),
               key=("pod", m.group("pod")))


# a shell prompt a user pasted with the output: `[user@host dir]$ cmd`, `user@host:~$ cmd`
_PROMPT = re.compile(r"^\s*(?:\([\w.-]+\)\s*)*\[?[\w.-]+@(?P<host>[\w.-]+)[ :][^$#\n]{0,80}[$#] ")


def _prompt(ev: Events, line: Line, t: str, ahead: deque[Line], facts: dict[str, Any]) -> None:
    """The host a pasted shell prompt names: where the output below it was printed."""
    if (m := _PROMPT.match(t)) and m.group("host") not in ev.prompts and len(ev.prompts) < 8:
        ev.prompts.append(m.group("host"))


READERS = [
    *((w, _prompt) for w in ("]$ ", "~$ ", "]# ", "~# ")),
    ("sigkill_handler] [", _deepspeed),
    *((w, _pod) for w in ("Running", "CrashLoopBackOff", "OOMKilled", "Completed", "Evicted")),
    ("exitcode", _elastic), ("worker died", _ray), ("RayTaskError", _ray_actor),
    ("actor died unexpectedly", _actor_died),
    ("CANCELLED", _cancelled), ("ignal", _signal), ("Fatal Python", _signal),
    ("received at time=", _signal),
    *((trigger, _exit) for trigger in dict.fromkeys(w for ws, _ in _EXITS for w in ws)),
]
