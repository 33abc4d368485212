"""Host snapshots: collect the facts of a node once, into a directory, then analyse offline.

A snapshot is a plain directory: one raw text file per command (exactly what it printed),
`nvml.json` with what NVML reports, and `meta.json` saying for every file how it was made and
whether the command was missing on the host. The same directory can be collected on a compute
node and analysed anywhere with `invoke check --snapshot DIR`.

`meta.json` is the snapshot's completeness record: `collect` writes it whole (a temporary
renamed into place) after every other file is on disk, with each file's sha256. Before anything
else `collect` writes an in-progress marker (`IN_PROGRESS`), and removes it after meta.json: a
directory holding the marker, or a meta.json that cannot be read, is a collect that stopped part
way (a full disk, a kill) and is refused, since its absent files would read as absent tools ("no
nvcc on the host"); a collected snapshot whose files changed afterwards is refused too.

A directory with neither marker nor meta.json was not made by `collect`: the outputs an
operator copied from a node by hand (`nvidia-smi -q`, `nvidia-smi topo -m`, `ibstatus`, `ulimit
-l`), as a support ticket or a fleet audit carries them. It is read as it is (`hand_made`): the
files named as `collect` names them are judged, and a check whose files are not there says "not
collected" (a skip), never that the tool is absent from the host.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_env import files, output, proc, redact
from megatron_env.errors import UserError

# file name -> command. ulimit is a shell builtin, hence sh -c.
COMMANDS: dict[str, list[str]] = {
    "nvidia-smi.txt": ["nvidia-smi"],
    "nvidia-smi-topo-m.txt": ["nvidia-smi", "topo", "-m"],
    "nvidia-smi-q.txt": ["nvidia-smi", "-q"],
    "ibstatus.txt": ["ibstatus"],
    "ulimit-l.txt": ["sh", "-c", "ulimit -l"],
    "nvcc-version.txt": ["nvcc", "--version"],
    "shm.txt": ["df", "-k", "/dev/shm"],
    "ip-br-addr.txt": ["ip", "-br", "addr"],
}

# Only variables that matter to a GPU job are recorded: env.txt may be shared, secrets must not be.
ENV_PREFIXES = ("CUDA", "NCCL_", "NVIDIA_", "TORCH_", "SLURM_", "UCX_", "OMPI_", "PMIX_",
                "FI_", "GLOO_", "MAX_JOBS", "NVCC_", "CONDA_PREFIX", "VIRTUAL_ENV")
ENV_NAMES = ("PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "HOSTNAME")


# Written first and removed last by `collect`: a directory that holds it is a collect cut short.
IN_PROGRESS = "collect-in-progress"
# The files a snapshot is read from, as `collect` names them (a hand-made one uses these names).
FILES = (*COMMANDS, "env.txt", "nvml.json")
# Read by a check only when NVML reports no driver version (`checks._driver`'s fallback):
# the live check's throw-away snapshot runs them only then (collect(complete=False)).
FALLBACKS = ("nvidia-smi.txt",)


@dataclass
class Snapshot:
    """A snapshot directory, read lazily. `text(name)` is None when not collected.
    `hand_made`: neither `collect`'s marker nor its meta.json is there, so a file that is not
    there was not copied, which says nothing about the host."""

    path: Path
    hand_made: bool = False

    @classmethod
    def load(cls, path: Path) -> Snapshot:
        if not path.is_dir():
            raise UserError(
                f"snapshot {path} is not a directory",
                fix="pass a directory written by `invoke collect --out DIR`",
                kind="snapshot.not-a-directory",
            )
        known = {*FILES, "meta.json", IN_PROGRESS}
        if not any((path / name).exists() for name in known):
            raise UserError(
                f"snapshot {path} holds none of the files of a snapshot "
                f"({', '.join(sorted(known))})",
                fix="pass a directory written by `invoke collect --out DIR`",
                kind="snapshot.empty",
            )
        cut_short = (path / IN_PROGRESS).exists() or (path / IN_PROGRESS).is_symlink()
        if not cut_short and not (path / "meta.json").exists() \
                and not (path / "meta.json").is_symlink():
            return cls(path, hand_made=True)
        meta, why = files.read_json(path / "meta.json")
        if cut_short or not isinstance(meta, dict):  # meta.json is written whole, last
            why = (f"{IN_PROGRESS} is there: `collect` did not reach its end" if cut_short
                   else f"{why or 'meta.json is not a JSON object'}; `collect` writes it last")
            raise UserError(
                f"snapshot {path} is incomplete ({why}): it stopped part way and its absent "
                "files would read as absent tools",
                fix=f"collect it again on its node: invoke collect --out {path} --force",
                kind="snapshot.incomplete",
            )
        altered = _altered(path, meta)
        if altered:
            raise UserError(
                f"snapshot {path} was changed after it was collected: {altered}",
                fix=f"collect it again on its node: invoke collect --out {path} --force",
                kind="snapshot.altered",
            )
        return cls(path)

    def text(self, name: str) -> str | None:
        f = self.path / name
        if not f.is_file():
            return None
        return f.read_bytes().decode("utf-8", errors="replace")

    def meta(self) -> dict[str, Any]:
        return self._json("meta.json")

    def nvml(self) -> dict[str, Any]:
        return self._json("nvml.json")

    def missing(self, name: str) -> bool:
        """True when the command behind `name` was recorded as not installed on the host."""
        return bool(self.meta().get("files", {}).get(name, {}).get("status") == "missing")

    def env(self) -> dict[str, str]:
        from megatron_env.host.parsers import env_file

        return env_file(self.text("env.txt") or "")

    def _json(self, name: str) -> dict[str, Any]:
        raw = self.text(name)
        if raw is None:
            return {}
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            return {"_error": f"{name} is not valid JSON"}
        return data if isinstance(data, dict) else {"_error": f"{name} is not a JSON object"}


def _nvcc_argv() -> list[str]:
    """nvcc from PATH, else from CUDA_HOME or the default install prefix."""
    if proc.which("nvcc"):
        return ["nvcc", "--version"]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and Path(home, "bin", "nvcc").is_file():
            return [str(Path(home, "bin", "nvcc")), "--version"]
    return ["nvcc", "--version"]


def nvml_facts() -> dict[str, Any]:
    """What NVML says about the driver and every GPU; {"error": ...} when it cannot load."""
    try:
        import pynvml as nv
    except ImportError:
        return {"error": "nvidia-ml-py is not installed"}
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:  # no driver, no libnvidia-ml.so
        return {"error": f"NVML init failed: {e}"}
    try:
        def text(v: Any) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        count = nv.nvmlDeviceGetCount()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = []
        for i, h in enumerate(handles):
            gpu: dict[str, Any] = {
                "index": i,
                "name": text(nv.nvmlDeviceGetName(h)),
                "uuid": text(nv.nvmlDeviceGetUUID(h)),
                "pci_bus_id": text(nv.nvmlDeviceGetPciInfo(h).busId),
                "memory_total": nv.nvmlDeviceGetMemoryInfo(h).total,
            }
            optional = {
                "compute_capability": (nv.nvmlDeviceGetCudaComputeCapability, ()),
                "clocks_event_reasons": (nv.nvmlDeviceGetCurrentClocksEventReasons, ()),
                "temperature_c": (nv.nvmlDeviceGetTemperature, (nv.NVML_TEMPERATURE_GPU,)),
            }
            for key, (fn, extra) in optional.items():
                try:
                    value = fn(h, *extra)
                    gpu[key] = ".".join(map(str, value)) if isinstance(value, tuple) else value
                except (nv.NVMLError, AttributeError) as e:
                    gpu[key + "_error"] = str(e)
            links = 0
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    links += nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED
                except nv.NVMLError:
                    break
            gpu["nvlinks_active"] = links
            gpus.append(gpu)
        return {
            "driver_version": text(nv.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": nv.nvmlSystemGetCudaDriverVersion(),
            "gpus": gpus,
            "nvlink_p2p": _nvlink_p2p(nv, handles),
        }
    finally:
        nv.nvmlShutdown()


def _nvlink_p2p(nv: Any, handles: list[Any]) -> list[list[bool]]:
    """nvlink[i][j]: True when NVML reports NVLink P2P between GPU i and j (a GPU with itself:
    True; a pair NVML cannot answer for: False)."""
    def linked(i: int, j: int) -> bool:
        if i == j:
            return True
        try:
            status = nv.nvmlDeviceGetP2PStatus(handles[i], handles[j],
                                               nv.NVML_P2P_CAPS_INDEX_NVLINK)
        except nv.NVMLError:
            return False
        return bool(status == nv.NVML_P2P_STATUS_OK)

    return [[linked(i, j) for j in range(len(handles))] for i in range(len(handles))]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _altered(path: Path, meta: dict[str, Any]) -> str:
    """The first file whose content differs from the sha256 `collect` recorded for it ("" when
    none): a file cut short or edited after collection would read as false host facts. Older
    snapshots record no digests; their files are read as they are."""
    record = meta.get("files")
    for name, entry in (record.items() if isinstance(record, dict) else ()):
        want = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(want, str) or not isinstance(name, str) or "/" in name:
            continue
        try:
            got = hashlib.sha256((path / name).read_bytes()).hexdigest()
        except OSError as e:
            return f"{name} cannot be read ({e.strerror or e})"
        if got != want:
            return f"{name} differs from what was collected"
    return ""


def reseal(path: Path, names: list[str]) -> None:
    """Record in meta.json the digests of files replaced on purpose after collection (fleet
    preflight's test hook), each marked as replaced: the snapshot then says what it holds."""
    meta, _ = files.read_json(path / "meta.json")
    if not isinstance(meta, dict) or "meta.json" in names:
        return
    record = meta.setdefault("files", {})
    for name in names:
        entry = record.setdefault(name, {})
        if isinstance(entry, dict):
            entry.update(sha256=hashlib.sha256((path / name).read_bytes()).hexdigest(),
                         replaced="after collection, on purpose")
    files.write_text(path / "meta.json", redact.text(json.dumps(meta, indent=2) + "\n"))


def _write(out: Path, name: str, text: str, durable: bool = True) -> str:
    """Write one file of the snapshot through the redaction; its sha256 for meta.json. Not
    `durable`: a plain write (a throw-away snapshot read back at once needs no fsync)."""
    text = redact.text(text)
    if durable:
        files.write_text(out / name, text)
    else:
        (out / name).write_text(text)
    return _sha256(text)


def _gather(argvs: dict[str, list[str]], nvml: bool) -> tuple[dict[str, proc.Result],
                                                               dict[str, Any] | None]:
    """Every command (and NVML) at once, each in a thread: the commands wait on the driver or
    the disk, not on this process, so a collect takes its slowest command's time, not their
    sum (each nvidia-smi may spend 50-300 ms initialising the driver)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(argvs) + 1) as pool:
        facts = pool.submit(nvml_facts) if nvml else None
        runs = {name: pool.submit(proc.run, argv, timeout=120) for name, argv in argvs.items()}
        return ({name: f.result() for name, f in runs.items()},
                facts.result() if facts is not None else None)


def collect(out: Path, *, echo: output.Echo = output.status, force: bool = False,
            complete: bool = True) -> Snapshot:
    """Record this host into `out` (created). A snapshot already there is replaced only with
    `force`: it may be the only record of a node as it was. Every file is written through
    megatron_env.redact (command outputs can hold a token in a URL or a variable).

    complete=False is the live check's throw-away snapshot (`checks.evaluate`, read back at
    once and removed): its files are not synced, and plain `nvidia-smi` runs only when NVML
    reports no driver version, since that is the only case any check reads its output (the
    driver's version comes from NVML first; the file is the fallback and the failure's
    evidence). `invoke collect` records everything, for any reader."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is a file, not a directory",
                        fix="pass --out a directory (new or existing) for the snapshot",
                        kind="snapshot.out-is-file")
    if (out / "meta.json").exists() and not force:
        raise UserError(f"{out} already holds a snapshot",
                        fix="pass --force to replace it, or --out a new directory",
                        kind="snapshot.exists")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / IN_PROGRESS).touch()  # first: until it goes, the directory is a collect under way
        files.remove(out / "meta.json")  # until the new one: incomplete, not the old snapshot
    except OSError as e:
        raise UserError(f"cannot create {out}: {e.strerror}",
                        fix="pass --out a directory you can write",
                        kind="path.cannot-create") from None
    record: dict[str, dict[str, Any]] = {}
    argvs = {name: _nvcc_argv() if name == "nvcc-version.txt" else argv
             for name, argv in COMMANDS.items()}
    later = {} if complete else {n: argvs.pop(n) for n in FALLBACKS}
    results, nvml = _gather(argvs, nvml=True)
    assert nvml is not None
    if later and not nvml.get("driver_version"):
        results |= _gather(later, nvml=False)[0]
    for name in COMMANDS:
        if name not in results:  # a fallback not needed: not collected (never read as missing)
            continue
        r, argv = results[name], list(results[name].argv)
        if r.missing:
            record[name] = {"argv": argv, "status": "missing"}
            (out / name).unlink(missing_ok=True)
        else:
            record[name] = {"argv": argv, "status": "ok" if r.ok else "failed",
                           "returncode": r.returncode,
                           "sha256": _write(out, name, r.output, complete)}
        echo(f"  {name:<24} {record[name]['status']}")
    env = redact.variables({k: v for k, v in os.environ.items()
                            if k in ENV_NAMES or k.startswith(ENV_PREFIXES)})
    record["env.txt"] = {"status": "ok", "source": "environment (GPU-related variables only)",
                         "sha256": _write(out, "env.txt", "".join(
                             f"{k}={v}\n" for k, v in env.items()), complete)}
    record["nvml.json"] = {"status": "ok", "source": "nvidia-ml-py", "sha256": _write(
        out, "nvml.json", json.dumps(nvml, indent=2) + "\n", complete)}
    meta = {
        "hostname": socket.gethostname(),
        "collected_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # platform.platform() runs `uname -p`: the throw-away snapshot names the kernel only
        "platform": platform.platform() if complete else "-".join(os.uname()[::2]),
        "files": record,
    }
    _write(out, "meta.json", json.dumps(meta, indent=2) + "\n", complete)
    (out / IN_PROGRESS).unlink()  # last: the snapshot is complete
    return Snapshot(out)
