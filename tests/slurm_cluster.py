"""A real three-node Slurm on this one host, for tests: munged, slurmctld and three slurmd.

Everything lives in one temporary directory (config, munge key and socket, state, spool, logs);
clients find it through SLURM_CONF. Debian's slurm-wlm is built with multiple-slurmd support,
so `slurmd -N n1` .. `-N n3` on ports 17001-17003 of 127.0.0.1 stand for three hosts. Daemons
are stopped by the pids they were started with, never by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

NODES = ("n1", "n2", "n3")
PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sinfo")

SLURM_CONF = """\
ClusterName=megatron-env-test
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmUser={user}
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmctldLogFile={root}/log/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName=n[1-3] NodeHostname=localhost NodeAddr=127.0.0.1 Port={node_ports} CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP
"""


def missing_programs() -> list[str]:
    return [p for p in DAEMONS if shutil.which(p) is None and
            not Path("/usr/sbin", p).exists()]


def install() -> None:
    """apt-get install the packages (root only): what .ci/run does before the tests."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES],
                   check=True, env=env, stdout=subprocess.DEVNULL)


def _sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class Cluster:
    root: Path
    ctld_port: int = 17000
    pids: list[int] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm client (srun, sinfo) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.root / "slurm.conf")}

    def start(self, timeout: float = 60) -> None:
        r = self.root
        for d in ("munge", "state", "run", "log", *(f"spool/{n}" for n in NODES)):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o700)
        key = r / "munge" / "munge.key"
        subprocess.run([_sbin("mungekey"), "--create", "--force", "--keyfile", str(key)],
                       check=True, capture_output=True)
        key.chmod(0o600)
        user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        (r / "slurm.conf").write_text(SLURM_CONF.format(
            root=r, user=user, ctld_port=self.ctld_port,
            node_ports=f"{self.ctld_port + 1}-{self.ctld_port + len(NODES)}"))
        self._daemon([_sbin("munged"), "--foreground", "--force",
                      f"--socket={r}/munge/munge.socket", f"--key-file={key}",
                      f"--pid-file={r}/munge/munged.pid", f"--log-file={r}/log/munged.log",
                      f"--seed-file={r}/munge/munged.seed"], "munged")
        self._wait(lambda: (r / "munge" / "munge.socket").exists(), timeout, "munged socket")
        self._daemon([_sbin("slurmctld"), "-D", "-i", "-f", str(r / "slurm.conf")], "slurmctld")
        for n in NODES:
            self._daemon([_sbin("slurmd"), "-D", "-N", n, "-f", str(r / "slurm.conf")],
                         f"slurmd-{n}")
        self._wait(self._all_idle, timeout, "three idle nodes in sinfo")

    def _daemon(self, argv: list[str], name: str) -> None:
        log = (self.root / "log" / f"{name}.out").open("w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, **self.env), start_new_session=True)
        self.pids.append(p.pid)

    def _all_idle(self) -> bool:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                           env=dict(os.environ, **self.env))
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in NODES)

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.5)
        logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
                         for f in sorted((self.root / "log").glob("*")))
        raise RuntimeError(f"Slurm test cluster: no {what} after {timeout:.0f} s\n{logs}")

    def stop(self) -> None:
        """SIGTERM every daemon we started (by pid, newest first), then SIGKILL stragglers."""
        for pid in reversed(self.pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for pid in reversed(self.pids):
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
        self.pids.clear()
