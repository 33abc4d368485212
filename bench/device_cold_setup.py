#!/usr/bin/env python3
"""device_cold_setup.py - the one-node record of cold, converging and warm `invoke setup`, run
from an adopt bundle on a GPU node whose calls are shorter than the record.

A cold setup of core_v0.19.0-cu130 takes about 9.5 minutes and the whole record (two cold
setups, the converge scenario, six warm runs) about 22, while one command on such a node may
run 10 minutes and the node keeps nothing between sessions. So `start` puts the bundle, this
script and bench/converge.py into a work directory of its own and runs the record there in a
new process session (setsid), which outlives the call that started it; each later call runs
`collect`, which waits up to --wait seconds and packs whatever the record holds by then into
ONE tar.gz plus summary.json (a call cut short still brings back the phases done so far).

    python3 bench/device_cold_setup.py start --bundle PART [--bundle PART ...] --adopt PY
                                             [--sha256 HEX|FILE] [--label TEXT] [--work DIR]
    python3 bench/device_cold_setup.py collect --wait SECONDS --out DIR [--work DIR]
    python3 bench/device_cold_setup.py status [--work DIR]

--bundle parts are concatenated in the order given (a bundle split to fit the calls). The
phases, each with its exit code and seconds in phases.json and a line per start and end in
progress.txt:
  versions  driver, GPU, torch, CUDA, NCCL, nvcc, ninja, cmake, gcc (versions.txt)
  unpack    the bundle's source/ (the tool runs from there) and its tool/ installed with the
            bundle's own checked installer, scripts/install_tool.py, into a venv
  cold1     `invoke setup --bundle B --adopt PY` with an empty cache, timed, load sampled
  converge  bench/converge.py of the checkout that started the record, when it has one
  warm      three `invoke setup` and three `megatron-env setup`, each a timed process
  cold2     kernels uninstalled, the wheel cache and the prefix's setup state removed, the
            pool's object-costs kept; a second cold `invoke setup`, timed, load sampled
Every command has a timeout (its process group is ended when it runs out), a phase that fails
does not stop the later ones, and nothing outside the work directory is written or removed
but what the record is about: the packages `invoke setup` installs into the adopted interpreter
(kernels, Megatron, their run-time requirements) and the kernels cold2 and converge.py uninstall.

Standard library only: it runs before the tool is installed on the node.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

MARK = ".device-cold-setup"  # a work directory holds it; --fresh removes no other directory
PHASES = ("versions", "unpack", "cold1", "converge", "warm", "cold2")
COMPILERS = frozenset({"cicc", "ptxas", "cc1plus", "cudafe++"})
KERNEL_DISTS = ("flash_attn", "apex", "transformer_engine", "transformer_engine_torch")
PACK_LIMIT = 15 * 2**20  # one file back from the node: at most 16 MiB
SETUP_TIMEOUT = 1800
DEFAULT_CONVERGE = "--out {out} -- --bundle {bundle} --adopt {adopt}"
STEP_ROW = re.compile(r"^(check|lock|env|sources|patches|builds|megatron|verify)\s+"
                      r"(done|up to date|skipped|skip|failed|fail)\s+([0-9.]+)\s", re.M)
SETUP_END = re.compile(r"^setup (\w+)\b.*?([0-9.]+) s$", re.M)
KERNEL_BUILT = re.compile(r"([\w.-]+) built in ([0-9.]+) s")
BOILERPLATE = ("Copyright", "This is free software", "warranty", "CMake suite")
TIMED = re.compile(r"^real ([0-9.]+) s, user ([0-9.]+) s, sys ([0-9.]+) s$", re.M)


class Refused(Exception):
    """Bad input or state: one line and a hint, exit 2."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


# --- analysis (pure) -------------------------------------------------------------------------

def setup_facts(text: str) -> dict[str, Any]:
    """What one captured `invoke setup` transcript (with run()'s trailer) says: the verdict and
    the seconds it reported, the seconds of each step, and the process's real/user/sys."""
    facts: dict[str, Any] = {}
    ends = SETUP_END.findall(text)
    if ends:
        facts["verdict"], facts["reported_s"] = ends[-1][0], float(ends[-1][1])
    steps = {name: float(s) for name, _, s in STEP_ROW.findall(text)}
    if steps:
        facts["steps_s"] = steps
    builds = re.findall(r"^builds\s.*$", text, re.M)
    kernels = dict(KERNEL_BUILT.findall(builds[-1])) if builds else {}
    if kernels:
        facts["kernels_s"] = {k: float(v) for k, v in kernels.items()}
    timed = TIMED.findall(text)
    if timed:
        real, user, sys_ = (float(x) for x in timed[-1])
        facts.update(process_s=real, user_s=user, sys_s=sys_)
    exits = re.findall(r"^exit (-?\d+)$", text, re.M)
    if exits:
        facts["exit"] = int(exits[-1])
    return facts


def load_facts(text: str) -> dict[str, Any]:
    """Mean and peak compilers and peak memory of a load-sampler file, its columns named by its
    header (an older record's has a `waiting` column too)."""
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if "compilers" not in head or "mem_used_mib" not in head:
        return {"samples": 0}
    c, m = head.index("compilers"), head.index("mem_used_mib")
    rows = [r for r in (line.split() for line in lines[1:])
            if len(r) == len(head) and r[c].isdigit() and r[m].isdigit()]
    if not rows:
        return {"samples": 0}
    comp = [int(r[c]) for r in rows]
    return {"samples": len(rows), "mean_compilers": round(sum(comp) / len(rows), 2),
            "peak_compilers": max(comp), "peak_mem_used_mib": max(int(r[m]) for r in rows)}


def probe_output(logged: str) -> str:
    """What one probe printed, as run() logged it (its `$ command` line and trailer dropped,
    licence boilerplate too), in one line."""
    lines = [ln.strip() for ln in logged.splitlines()[1:] if ln.strip()
             and not TIMED.match(ln) and not re.match(r"exit -?\d+$", ln)
             and not ln.startswith(BOILERPLATE)]
    return " | ".join(lines[:4])


# --- the node's facts ------------------------------------------------------------------------

def sample(out: Path, stop: threading.Event, every: float = 2.0, cap: int = 3600) -> None:
    """Every `every` s until `stop` (at most `cap` samples): epoch, 1-min load,
    running/total tasks, compiler processes, memory used (MiB)."""
    with open(out, "w") as f:
        f.write("epoch load1 running/total compilers mem_used_mib\n")
        for _ in range(cap):
            try:
                load = Path("/proc/loadavg").read_text().split()
                mem = dict(line.split(":", 1) for line in
                           Path("/proc/meminfo").read_text().splitlines() if ":" in line)
                used = (int(mem["MemTotal"].split()[0]) - int(mem["MemAvailable"].split()[0]))
                f.write(f"{int(time.time())} {load[0]} {load[3]} {compilers()} {used // 1024}\n")
                f.flush()
            except (OSError, KeyError, IndexError, ValueError) as e:
                f.write(f"# sample failed: {e}\n")
            if stop.wait(every):
                return


def compilers() -> int:
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                n += Path(f"/proc/{pid}/comm").read_text().strip() in COMPILERS
    return n


def run(cmd: list[str], log: Path, timeout: float, cwd: Path | None = None,
        env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `cmd` in a process group of its own, its output and a trailer (`real .. s, user ..
    s, sys .. s` of it and every child it waited for, `exit N`) appended to `log`; a command
    that outruns `timeout` has its group ended (exit 124)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        try:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                 cwd=cwd, env=env, start_new_session=True)
        except OSError as e:
            f.write(f"cannot start: {e}\nexit 127\n")
            return {"rc": 127, "seconds": 0.0}
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            f.write(f"\ntimed out after {timeout:.0f} s: ending its process group\n")
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=30)
                    break
                except subprocess.TimeoutExpired:
                    continue
            rc = 124
        real = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
        f.write(f"real {real:.3f} s, user {user:.3f} s, sys {sys_:.3f} s\nexit {rc}\n")
    return {"rc": rc, "seconds": round(real, 3), "user_s": round(user, 3), "sys_s": round(sys_, 3)}


# --- the record ------------------------------------------------------------------------------

class Record:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.cfg: dict[str, Any] = json.loads((work / "config.json").read_text())
        self.results = work / "results"
        self.cache = work / "cache"
        self.source = work / "bundle" / "source"
        self.bundle = work / "b.tar"
        self.tool = work / "tool"
        self.adopt = self.cfg["adopt"]
        self.env = {**os.environ, "MEGATRON_ENV_CACHE": str(self.cache), "PYTHONUNBUFFERED": "1"}

    def progress(self, line: str) -> None:
        with open(self.work / "progress.txt", "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {int(time.time())} {line}\n")

    def setup_cmd(self, tool: str = "invoke") -> list[str]:
        return [str(self.tool / "bin" / tool), "setup", "--bundle", str(self.bundle),
                "--adopt", self.adopt]

    def inside(self, path: Path) -> Path:
        """`path`, refused unless it lies inside the work directory (what a phase removes)."""
        if not path.resolve().is_relative_to(self.work.resolve()):
            raise RuntimeError(f"{path} is outside {self.work}: not removed")
        return path

    # phases: each returns its facts; rc is the first failing command's, else 0
    def versions(self) -> dict[str, Any]:
        log = self.results / "versions.txt"
        probe = ("import sys, torch; g = torch.cuda.is_available(); print('python', "
                 "sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,"
                 " 'nccl', torch.cuda.nccl.version() if g else '-', 'gpu', "
                 "torch.cuda.get_device_name() if g else 'none')")
        cmds = {"date": ["date"], "kernel": ["uname", "-r"],
                "gpu": ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                        "--format=csv,noheader"],
                "cores": ["nproc"], "memory": ["free", "-g"], "python": [self.adopt, "-c", probe],
                "compilers_env": ["sh", "-c", "env | grep -E '^(CC|CXX|CUDAHOSTCXX|CUDA_HOME|"
                                  "MAX_JOBS|TMPDIR)=' || true"],
                "nvcc": ["nvcc", "--version"], "ninja": ["ninja", "--version"],
                "ninja_path": ["sh", "-c", "command -v ninja"], "cmake": ["cmake", "--version"],
                "gcc": ["gcc", "--version"], "g++": ["g++", "--version"],
                "cxx": ["sh", "-c", '"${CXX:-c++}" --version'],
                "disk": ["df", "-h", str(self.work)]}
        facts: dict[str, str] = {}
        rcs: list[int] = []
        for name, cmd in cmds.items():
            at = log.stat().st_size if log.exists() else 0
            rcs.append(run(cmd, log, 60)["rc"])
            with open(log, errors="replace") as f:
                f.seek(at)
                facts[name] = probe_output(f.read())
        write_json(self.results / "versions.json", facts)
        return {"rc": 0, "failed_probes": sum(1 for r in rcs if r)}

    def unpack(self) -> dict[str, Any]:
        log = self.results / "unpack.txt"
        (self.work / "bundle").mkdir(exist_ok=True)
        r = run(["tar", "-xf", str(self.bundle), "-C", str(self.work / "bundle"), "source"],
                log, 300)
        if r["rc"]:
            return r
        for python in self.tool_pythons(log):  # the next one where a venv cannot be made
            shutil.rmtree(self.inside(self.tool), ignore_errors=True)
            r = run([python, str(self.source / "scripts" / "install_tool.py"),
                     str(self.bundle), str(self.tool)], log, 600)
            if r["rc"] == 0:
                return {**r, "tool_python": python}
        return {"rc": 2, "note": "the tool could not be installed with any Python of the "
                                 "bundle's version (unpack.txt)"}

    def tool_pythons(self, log: Path) -> list[str]:
        """The bundle's Python, with venv and ensurepip, in this order: the given one,
        python3.X on PATH, /usr/bin's, the adopted interpreter (a venv's python makes a venv of
        its base)."""
        want = ""
        with tarfile.open(self.bundle) as tar:
            for m in tar:  # manifest.json comes first in a bundle
                if m.name.removeprefix("./") == "manifest.json" and m.isfile():
                    f = tar.extractfile(m)
                    want = str(json.loads(f.read())["python"]) if f else ""
                    break
        check = (f"import sys, venv, ensurepip; "
                 f"sys.exit(f'{{sys.version_info[0]}}.{{sys.version_info[1]}}' != {want!r})")
        found: list[str] = []
        for c in (self.cfg.get("tool_python"), shutil.which(f"python{want}"),
                  f"/usr/bin/python{want}", self.adopt):
            if c and str(c) not in found and run([str(c), "-c", check], log, 60)["rc"] == 0:
                found.append(str(c))
        return found

    def cold(self, n: int) -> dict[str, Any]:
        dest = self.results / f"cold{n}"
        dest.mkdir(parents=True, exist_ok=True)
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(dest / f"load-cold{n}.txt", stop),
                                   daemon=True)
        t0 = time.time()
        sampler.start()
        try:
            r = run(self.setup_cmd(), dest / f"setup-cold{n}.txt", SETUP_TIMEOUT,
                    cwd=self.source, env=self.env)
        finally:
            stop.set()
            sampler.join(10)
        self.harvest(dest, since=t0)
        return r

    def reset(self) -> dict[str, Any]:
        """Before cold2: the kernels out of the adopted interpreter, the wheel cache and the
        prefix's setup state removed; the pool's object-costs kept."""
        dest = self.results / "cold2"
        r = run([self.adopt, "-m", "pip", "uninstall", "-y", *KERNEL_DISTS],
                dest / "0-uninstall.txt", 300)
        gone = [self.cache / "wheels", self.cache / "build",
                self.source / ".megatron-env" / f"{self.cfg['profile']}.setup"]
        with open(dest / "0-uninstall.txt", "a") as f:
            for path in gone:
                f.write(f"{'removed' if path.exists() else 'absent:'} {path}\n")
                shutil.rmtree(self.inside(path), ignore_errors=True)
            costs = sorted(p.name for p in (self.cache / "object-costs").glob("*.json"))
            f.write(f"kept object-costs: {', '.join(costs) or 'none'}\n")
        return r

    def cold2(self) -> dict[str, Any]:
        uninstall = self.reset()["rc"]
        return {**self.cold(2), "uninstall_rc": uninstall}

    def harvest(self, dest: Path, since: float) -> None:
        """The cache's own records of a build: object-costs, each wheel's meta.json and ninja
        logs, and the build logs written since `since`."""
        costs = self.cache / "object-costs"
        if costs.is_dir():
            shutil.copytree(costs, dest / "object-costs", dirs_exist_ok=True)
        for slot in sorted((self.cache / "wheels").glob("*")):
            if (slot / "meta.json").is_file():
                shutil.copy2(slot / "meta.json", dest / f"{slot.name}.meta.json")
            if (slot / "ninja-logs").is_dir():
                shutil.copytree(slot / "ninja-logs", dest / f"{slot.name}.ninja-logs",
                                dirs_exist_ok=True)
        for log in sorted((self.cache / "logs").glob("*.log")):
            if log.stat().st_mtime >= since - 1:
                (dest / "build-logs").mkdir(exist_ok=True)
                shutil.copy2(log, dest / "build-logs" / log.name)

    def converge(self) -> dict[str, Any]:
        script = self.work / "converge.py"
        if not script.is_file():
            return {"rc": 0, "note": "skipped: the checkout has no bench/converge.py"}
        out = self.results / "converge"
        args = [a.format(out=out, bundle=self.bundle, adopt=self.adopt, work=self.work)
                for a in shlex.split(self.cfg["converge_args"])]
        # the tool's bin first on PATH for it alone: what it starts finds this `invoke`
        env = {**self.env, "PATH": f"{self.tool / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        return run([str(self.tool / "bin" / "python"), str(script), *args],
                   self.results / "converge.txt", 1200, cwd=self.source, env=env)

    def warm(self) -> dict[str, Any]:
        rcs = []
        for tool, name in (("invoke", "invoke"), ("megatron-env", "me")):
            for i in (1, 2, 3):
                rcs.append(run(self.setup_cmd(tool), self.results / "warm" / f"warm-{name}-{i}.txt",
                               300, cwd=self.source, env=self.env)["rc"])
        return {"rc": next((r for r in rcs if r), 0)}

    def main(self) -> None:
        self.results.mkdir(exist_ok=True)
        steps = {"versions": self.versions, "unpack": self.unpack,
                 "cold1": lambda: self.cold(1), "converge": self.converge, "warm": self.warm,
                 "cold2": self.cold2}
        done: list[dict[str, Any]] = []
        chosen = self.cfg.get("phases") or list(PHASES)
        tool = self.tool / "bin" / "invoke"
        for phase in PHASES:
            if phase not in chosen:
                facts: dict[str, Any] = {"rc": 0, "note": "skipped: not in --phases"}
            elif phase not in ("versions", "unpack") and not tool.exists():
                facts = {"rc": 2, "note": "not run: the tool is not installed"}
            else:
                self.progress(f"{phase} start")
                t0 = time.monotonic()
                try:
                    facts = steps[phase]()
                except Exception as e:  # a phase's own failure must not stop the record
                    facts = {"rc": 1, "note": f"{type(e).__name__}: {e}"}
                facts["phase_s"] = round(time.monotonic() - t0, 1)
            done.append({"phase": phase, **facts})
            write_json(self.work / "phases.json", done)
            self.progress(f"{phase} end rc={facts['rc']} {facts.get('phase_s', 0)} s "
                          f"{facts.get('note', '')}".rstrip())
        self.progress("finished")


def write_json(path: Path, doc: Any) -> None:
    """Written whole or not at all (a reader never sees half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


# --- the commands ----------------------------------------------------------------------------

def running(work: Path) -> int | None:
    """The pid of a record still running in `work`, else None."""
    try:
        pid = int((work / "driver.pid").read_text())
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state == "Z" or finished(work) else pid  # a zombie has ended


def finished(work: Path) -> bool:
    try:
        return (work / "progress.txt").read_text().rstrip().endswith(" finished")
    except OSError:
        return False


def join(parts: list[Path], dest: Path) -> str:
    """`parts` written one after the other into `dest`; -> the sha256 of what was written."""
    h = hashlib.sha256()
    with open(dest, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
    return h.hexdigest()


def start(a: argparse.Namespace) -> int:
    work: Path = a.work
    if running(work):
        raise Refused(f"a record is already running in {work} (pid {running(work)})",
                      "collect it (`collect --wait S --out DIR`) or pass another --work")
    if work.exists():
        if not (a.fresh and (work / MARK).exists()):
            raise Refused(f"{work} exists", "pass --fresh to replace an earlier record's work "
                          "directory, or another --work")
        shutil.rmtree(work)
    phases = [p for p in a.phases.split(",") if p]
    if unknown := sorted(set(phases) - set(PHASES)):
        raise Refused(f"--phases: unknown {', '.join(unknown)}", f"choose from {','.join(PHASES)}")
    missing = [str(p) for p in a.bundle if not p.is_file()]
    if missing:
        raise Refused(f"bundle part(s) missing: {', '.join(missing)}",
                      "carry every part to the node again (a node given back keeps nothing)")
    work.mkdir(parents=True)
    (work / MARK).touch()
    got = join(a.bundle, work / "b.tar")
    if a.sha256:
        want = (Path(a.sha256).read_text().split() or [""])[0] if Path(a.sha256).is_file() \
            else a.sha256
        if got != want.lower():
            shutil.rmtree(work)
            raise Refused(f"the joined bundle has sha256 {got}, expected {want}",
                          "carry the parts again, in order")
    here = Path(__file__).resolve()
    shutil.copy2(here, work / "driver.py")
    if (here.parent / "converge.py").is_file():
        shutil.copy2(here.parent / "converge.py", work / "converge.py")
    write_json(work / "config.json", {
        "adopt": a.adopt, "profile": a.profile, "label": a.label, "tool_python": a.tool_python,
        "converge_args": a.converge_args, "phases": phases, "bundle_sha256": got,
        "bundle_bytes": (work / "b.tar").stat().st_size, "started": time.time()})
    with open(work / "driver.log", "w") as log:
        p = subprocess.Popen([sys.executable, str(work / "driver.py"), "run", "--work", str(work)],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    (work / "driver.pid").write_text(f"{p.pid}\n")
    print(f"started the record in {work} (pid {p.pid}, bundle sha256 {got[:12]}); progress: "
          f"{work / 'progress.txt'}")
    return 0


def summary(work: Path) -> dict[str, Any]:
    cfg = json.loads((work / "config.json").read_text())
    doc: dict[str, Any] = {
        "label": cfg.get("label"), "profile": cfg.get("profile"), "finished": finished(work),
        "bundle_sha256": cfg.get("bundle_sha256"), "bundle_bytes": cfg.get("bundle_bytes"),
        "elapsed_s": round(time.time() - cfg.get("started", time.time()), 1)}
    try:
        doc["phases"] = json.loads((work / "phases.json").read_text())
    except (OSError, ValueError):
        doc["phases"] = []
    res = work / "results"
    with contextlib.suppress(OSError, ValueError):
        doc["versions"] = json.loads((res / "versions.json").read_text())
    setups = {}
    for log in sorted(res.glob("*/setup-*.txt")) + sorted(res.glob("warm/warm-*.txt")):
        setups[f"{log.parent.name}/{log.stem}"] = setup_facts(log.read_text(errors="replace"))
    doc["setups"] = setups
    doc["load"] = {f"{p.parent.name}/{p.stem}": load_facts(p.read_text())
                   for p in sorted(res.glob("*/load-*.txt"))}
    with contextlib.suppress(OSError):
        doc["progress_tail"] = (work / "progress.txt").read_text().splitlines()[-3:]
    return doc


def pack(work: Path, out: Path, doc: dict[str, Any]) -> Path:
    """results/, progress, phases and the driver's log as out/device-run.tar.gz; when the whole
    would not come back (one file: 16 MiB), each build log over 1 MiB goes as its last MiB
    (`<name>.last-MiB`)."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / "device-run.tar.gz"
    write_json(work / "summary.json", doc)
    files = []
    for name in ("summary.json", "progress.txt", "phases.json", "config.json", "driver.log",
                 "results"):
        path = work / name
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for cut in (False, True):
        tmp = out / "device-run.tar.gz.part"
        with tarfile.open(tmp, "w:gz") as tar:
            for f in files:
                arc = f"device-run/{f.relative_to(work).as_posix()}"
                if cut and "build-logs" in f.parts and f.stat().st_size > 2**20:
                    with open(f, "rb") as fh:
                        fh.seek(-(2**20), os.SEEK_END)
                        data = fh.read()
                    info = tarfile.TarInfo(f"{arc}.last-MiB")
                    info.size, info.mtime = len(data), int(f.stat().st_mtime)
                    tar.addfile(info, io.BytesIO(data))
                else:
                    tar.add(f, arcname=arc)
        tmp.replace(target)
        if target.stat().st_size <= PACK_LIMIT:
            break
    return target


def collect(a: argparse.Namespace) -> int:
    work: Path = a.work
    if not (work / "config.json").is_file():
        raise Refused(f"no record in {work}", "run `start` first (on this node: a node given "
                      "back keeps nothing)")
    deadline = time.monotonic() + a.wait
    last = ""
    while not finished(work) and time.monotonic() < deadline and running(work):
        try:
            tail = (work / "progress.txt").read_text().splitlines()[-1]
        except (OSError, IndexError):
            tail = ""
        if tail != last:
            print(f"progress: {tail}", file=sys.stderr, flush=True)
            last = tail
        time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
    doc = summary(work)
    if not doc["finished"] and not running(work):
        doc["note"] = "the driver is gone before the record finished (driver.log)"
    target = pack(work, a.out, doc)
    write_json(a.out / "summary.json", doc)
    print(json.dumps(doc, indent=1))
    state = "finished" if doc["finished"] else "still running" if running(work) else "stopped"
    print(f"record {state}: {target} ({target.stat().st_size} bytes), "
          f"{len(doc['phases'])}/{len(PHASES)} phases", file=sys.stderr)
    return 0 if doc["finished"] else 3


def status(a: argparse.Namespace) -> int:
    try:
        print((a.work / "progress.txt").read_text(), end="")
    except OSError:
        raise Refused(f"no record in {a.work}", "run `start` first") from None
    print(f"driver: {'running pid ' + str(running(a.work)) if running(a.work) else 'not running'}",
          file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("start", "run", "collect", "status"):
        p = sub.add_parser(name)
        p.add_argument("--work", type=Path, default=Path("/tmp/megatron-env-device-run"))
    s = sub.choices["start"]
    s.add_argument("--bundle", type=Path, action="append", required=True,
                   help="the adopt bundle, or its parts in order (repeat)")
    s.add_argument("--adopt", required=True, help="the node's interpreter with torch")
    s.add_argument("--sha256", help="the joined bundle's sha256, or the .sha256 file")
    s.add_argument("--profile", default="core_v0.19.0-cu130")
    s.add_argument("--label", default="", help="what the record is of (a commit)")
    s.add_argument("--tool-python", help="the Python to install the tool with")
    s.add_argument("--converge-args", default=DEFAULT_CONVERGE,
                   help="bench/converge.py's arguments; {out} {bundle} {adopt} {work} filled in")
    s.add_argument("--fresh", action="store_true", help="replace an earlier record's directory")
    s.add_argument("--phases", default=",".join(PHASES),
                   help="the phases to run, comma-separated (unpack is needed by the later ones)")
    c = sub.choices["collect"]
    c.add_argument("--wait", type=float, default=0, help="seconds to wait for the record")
    c.add_argument("--out", type=Path, required=True, help="where the tar.gz and summary go")
    a = ap.parse_args(argv)
    a.work = a.work.absolute()
    try:
        if a.cmd == "run":
            Record(a.work).main()
            return 0
        return {"start": start, "collect": collect, "status": status}[a.cmd](a)
    except Refused as e:
        print(f"error: {e}\nhint: {e.fix}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
