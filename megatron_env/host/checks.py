"""Checks: pure functions of (snapshot, profile) that return one finding each.

Every check reads only the snapshot, so a node can be judged from a directory collected on it
days ago, and every verdict can be tested on real captured outputs. A parse failure becomes a
`warn` finding naming the file, never an exception.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from packaging.version import Version

from megatron_env.findings import Finding, Status
from megatron_env.host import parsers, snapshot
from megatron_env.host.parsers import ParseError
from megatron_env.host.snapshot import Snapshot, collect
from megatron_env.profile import Profile
from megatron_env.units import GIB, MIB

Check = Callable[[Snapshot, Profile], Finding]
CHECKS: list[tuple[str, Check]] = []
READS: dict[str, tuple[str, ...]] = {}  # a check's snapshot files (any one of them will do)

# Oldest driver that runs a CUDA major release through minor-version compatibility
# (CUDA compatibility guide, "Minor Version Compatibility").
MINOR_COMPAT_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
T = TypeVar("T")


def check(check_id: str, *reads: str) -> Callable[[Check], Check]:
    """Register a check reading the snapshot files `reads` (of snapshot.FILES): in a hand-made
    snapshot that holds none of them, the check is not run and says "not collected"."""
    def register(fn: Check) -> Check:
        CHECKS.append((check_id, fn))
        READS[check_id] = reads
        return fn

    return register


def evaluate(profile: Profile, snapshot_dir: Path | None = None) -> list[Finding]:
    """Findings for a collected snapshot directory, or for this host (collected to a temp dir)."""
    if snapshot_dir is not None:
        return run_all(Snapshot.load(snapshot_dir), profile)
    with tempfile.TemporaryDirectory(prefix="megatron-env-snapshot-") as tmp:
        return run_all(collect(Path(tmp), echo=lambda *_: None, complete=False), profile)


class Unparsed(Finding):
    """A finding about an input that could not be parsed (its type is its kind)."""


def _not_collected(snap: Snapshot, check_id: str) -> Finding | None:
    """In a hand-made snapshot, the skip of a check none of whose files was copied: a file
    that is not there says nothing about the host (None: the check runs)."""
    reads = READS.get(check_id, ())
    if not snap.hand_made or not reads or any((snap.path / n).is_file() for n in reads):
        return None
    return Finding(check_id, Status.SKIP, f"not collected: {' or '.join(reads)} is not in the "
                   "snapshot", fix="copy it from the node, or run `invoke collect` there",
                   kind="not-collected")


def _hand_made(snap: Snapshot) -> Finding:
    there = [n for n in snapshot.FILES if (snap.path / n).is_file()]
    return Finding("snapshot", Status.SKIP,
                   f"not made by `invoke collect` (no meta.json): {len(there)} of "
                   f"{len(snapshot.FILES)} files read as they are, the others not collected",
                   [f"read: {', '.join(there)}"], kind="hand-made")


def run_all(snap: Snapshot, profile: Profile) -> list[Finding]:
    out: list[Finding] = [_hand_made(snap)] if snap.hand_made else []
    for check_id, fn in CHECKS:
        if skipped := _not_collected(snap, check_id):
            out.append(skipped)
            continue
        try:
            out.append(fn(snap, profile))
        except ParseError as e:
            out.append(Unparsed(check_id, Status.WARN, f"could not parse the input: {e}",
                                fix="re-collect the snapshot with `invoke collect`"))
    unparsed = [f for f in out if isinstance(f, Unparsed)]
    if unparsed and all(isinstance(f, Unparsed) or f.status is Status.SKIP for f in out):
        out.insert(0, Finding("snapshot", Status.FAIL,
                              f"nothing in {snap.path} could be parsed ({len(unparsed)} check(s) "
                              "found only unrecognisable input)",
                              [f"{f.id}: {f.summary}" for f in unparsed[:4]],
                              "collect the snapshot again on the node with "
                              "`invoke collect --out DIR`"))
    return out


def _unparseable(check_id: str, name: str, err: ParseError) -> Finding:
    return Unparsed(check_id, Status.WARN, f"{name} could not be parsed: {err}",
                    evidence=[f"file: {name}"],
                    fix=f"re-run the command behind {name} on the node, or `invoke collect` "
                        "again")


def _parsed(snap: Snapshot, cid: str, name: str, parser: Callable[[str], T],
            missing: str) -> T | Finding:
    """The value parsed from the snapshot file `name`, or the finding that says why there is
    none (absent: skip; unparseable)."""
    text = snap.text(name)
    if text is None:
        return Finding(cid, Status.SKIP, missing)
    try:
        return parser(text)
    except ParseError as e:
        return _unparseable(cid, name, e)


def _driver(snap: Snapshot) -> str | None:
    if v := snap.nvml().get("driver_version"):
        return str(v)
    for name in ("nvidia-smi.txt", "nvidia-smi-q.txt"):
        text = snap.text(name)
        if text:
            try:
                return parsers.driver_version(text)
            except ParseError:
                continue
    return None


def _ib_ports(snap: Snapshot) -> list[parsers.IbPort]:
    text = snap.text("ibstatus.txt")
    if not text:
        return []
    try:
        return parsers.ibstatus(text)
    except ParseError:
        return []


def _active_ib(snap: Snapshot) -> list[parsers.IbPort]:
    return [p for p in _ib_ports(snap) if p.state == "ACTIVE"]


@check("driver.version", "nvidia-smi.txt", "nvidia-smi-q.txt", "nvml.json")
def driver_version(snap: Snapshot, profile: Profile) -> Finding:
    cid = "driver.version"
    driver = _driver(snap)
    if driver is None:
        text = snap.text("nvidia-smi.txt") or snap.nvml().get("error", "")
        evidence = [line for line in text.strip().splitlines()[:3]] if text else []
        if snap.missing("nvidia-smi.txt") or not text or "NVML" in text or "failed" in text:
            return Finding(cid, Status.FAIL,
                           "no NVIDIA driver: nvidia-smi and NVML are unavailable",
                           evidence=evidence or ["nvidia-smi: not installed"],
                           fix="install the NVIDIA driver (or run on a GPU node); "
                               f"the profile needs >= {profile.min_driver}", kind="absent")
        return _unparseable(cid, "nvidia-smi.txt", ParseError("no 'Driver Version'"))
    have, need = Version(driver), Version(profile.min_driver)
    evidence = [f"driver {driver}", f"profile {profile.name}: CUDA {profile.cuda} "
                f"needs >= {profile.min_driver}"]
    if have >= need:
        return Finding(cid, Status.PASS, f"driver {driver} supports CUDA {profile.cuda}", evidence)
    compat = MINOR_COMPAT_DRIVER.get(profile.cuda_major)
    if compat and have >= Version(compat):
        return Finding(cid, Status.WARN,
                       f"driver {driver} runs CUDA {profile.cuda} only through minor-version "
                       "compatibility (no PTX JIT of newer code)", evidence,
                       fix=f"upgrade the driver to >= {profile.min_driver}")
    return Finding(cid, Status.FAIL, f"driver {driver} is too old for CUDA {profile.cuda}",
                   evidence,
                   fix=f"upgrade the driver to >= {profile.min_driver}, or pick a profile "
                       "with an older CUDA")


_CUDA_DIR = re.compile(r"/cuda[-_]?(\d+\.\d+)(?=/|$)")


@check("cuda.toolkit", "nvcc-version.txt")
def cuda_toolkit(snap: Snapshot, profile: Profile) -> Finding:
    cid = "cuda.toolkit"
    env = snap.env()
    versions: dict[str, set[str]] = {}
    for var in ("PATH", "LD_LIBRARY_PATH"):
        for entry in env.get(var, "").split(":"):
            if m := _CUDA_DIR.search(entry):
                versions.setdefault(m.group(1), set()).add(f"{var}: {entry}")
    evidence = [e for v in sorted(versions) for e in sorted(versions[v])]
    text = snap.text("nvcc-version.txt")
    if not text:
        status = Status.WARN if len(versions) > 1 else Status.SKIP
        return Finding(cid, status,
                       f"no nvcc on the host; the environment's CUDA {profile.cuda} toolkit "
                       "(conda) builds the kernels" + (
                           f"; several CUDA toolkits on the paths: {', '.join(sorted(versions))}"
                           if len(versions) > 1 else ""),
                       evidence, fix="nothing to do unless you build kernels with the system "
                                     "toolkit; then install CUDA " + profile.cuda)
    try:
        nvcc = parsers.nvcc_release(text)
    except ParseError as e:
        return _unparseable(cid, "nvcc-version.txt", e)
    evidence.insert(0, f"nvcc release {nvcc}")
    if len(versions) > 1:
        return Finding(cid, Status.WARN,
                       f"several CUDA toolkits on PATH/LD_LIBRARY_PATH: "
                       f"{', '.join(sorted(versions))}", evidence,
                       fix=f"keep only CUDA {profile.cuda} on PATH and LD_LIBRARY_PATH")
    if nvcc.split(".")[0] != profile.cuda.split(".")[0]:
        return Finding(cid, Status.FAIL,
                       f"nvcc {nvcc} has another major version than the profile's CUDA "
                       f"{profile.cuda}: the kernel builds will fail", evidence,
                       fix=f"put a CUDA {profile.cuda} toolkit first on PATH (set CUDA_HOME), "
                           "or let `invoke env` install it with conda")
    if nvcc != profile.cuda:
        return Finding(cid, Status.WARN,
                       f"nvcc {nvcc} differs from the profile's CUDA {profile.cuda} "
                       "in the minor version", evidence,
                       fix=f"use a CUDA {profile.cuda} toolkit for kernel builds")
    return Finding(cid, Status.PASS, f"nvcc {nvcc} matches the profile", evidence)


def _nvml_disagreement(pairs: list[tuple[str, str, str]], nvml: dict[str, Any]) -> list[str]:
    """Pairs where `nvidia-smi topo -m` and NVML's NVLink P2P status tell different stories."""
    m = nvml.get("nvlink_p2p")
    if not isinstance(m, list) or not pairs or len(m) != len({g for a, b, _ in pairs
                                                              for g in (a, b)}):
        return []
    out = []
    for a, b, cell in pairs:
        i, j = int(a[3:]), int(b[3:])
        if cell.startswith("NV") != bool(m[i][j]):
            out.append(f"{a}-{b}: topo {cell}, NVML {'NVLink' if m[i][j] else 'no NVLink'}")
    return out


@check("gpu.topology", "nvidia-smi-topo-m.txt", "nvml.json")
def gpu_topology(snap: Snapshot, profile: Profile) -> Finding:
    finding, pairs = _topology_verdict(snap)
    judged = finding.status in (Status.PASS, Status.FAIL)
    odd = _nvml_disagreement(pairs, snap.nvml()) if judged else []
    if not odd:
        return finding
    return Finding(finding.id, Status.WARN if finding.status is Status.PASS else Status.FAIL,
                   f"{finding.summary}; NVML and nvidia-smi disagree on {len(odd)} pair(s)",
                   finding.evidence + odd[:8],
                   finding.fix or "compare `nvidia-smi nvlink -s` with `nvidia-smi topo -m`; "
                                  "a driver or fabric manager problem shows this way")


def _topology_verdict(snap: Snapshot) -> tuple[Finding, list[tuple[str, str, str]]]:
    """The verdict from `nvidia-smi topo -m` (or NVML when the text is missing), and the GPU
    pairs it was judged on."""
    cid = "gpu.topology"
    text = snap.text("nvidia-smi-topo-m.txt")
    nvml = snap.nvml()
    if text:
        try:
            topo = parsers.topology(text)
        except ParseError as e:
            return _unparseable(cid, "nvidia-smi-topo-m.txt", e), []
        gpus = topo.gpus
        pairs = [(gpus[i], gpus[j], cell) for i, j, cell in topo.pairs()]
        source = "nvidia-smi topo -m"
    elif nvml.get("nvlink_p2p"):
        m = nvml["nvlink_p2p"]
        gpus = [f"GPU{i}" for i in range(len(m))]
        pairs = [(gpus[i], gpus[j], "NVLink" if m[i][j] else "PCIe")
                 for i in range(len(m)) for j in range(i + 1, len(m))]
        source = "NVML"
    else:
        return Finding(cid, Status.SKIP, "no topology recorded (no GPU, or nvidia-smi missing)"), []
    if len(gpus) < 2:
        return Finding(cid, Status.PASS, f"{len(gpus)} GPU: no GPU-to-GPU links to check",
                       [f"{source}: {', '.join(gpus)}"]), pairs
    nv = [(a, b, c) for a, b, c in pairs if c.startswith("NV")]
    not_nv = [(a, b, c) for a, b, c in pairs if not c.startswith("NV")]
    if not nv:
        return Finding(cid, Status.WARN,
                       f"no NVLink: all {len(gpus)} GPUs talk over PCIe "
                       f"({', '.join(sorted({c for _, _, c in pairs}))})",
                       [f"{source}: {len(pairs)} pairs, none NV#"],
                       fix="keep tensor parallelism off this box (or within a PCIe switch); "
                           "use NVLink nodes for TP > 1"), pairs
    if not_nv:
        shown = [f"{a}-{b}: {c}" for a, b, c in not_nv]
        lost = Counter(g for a, b, _ in not_nv for g in (a, b))
        suspects = [g for g, n in lost.items() if n == len(gpus) - 1]
        return Finding(cid, Status.FAIL,
                       f"{len(not_nv)} of {len(pairs)} GPU pairs are not on NVLink"
                       + (f"; {', '.join(suspects)} lost all NVLinks" if suspects else ""),
                       shown[:16] + ([f"... {len(shown) - 16} more"] if len(shown) > 16 else []),
                       fix="drain the node and have the NVLink/NVSwitch fabric checked "
                           "(nvidia-smi nvlink -s; fabric manager logs)"), pairs
    counts = Counter(c for _, _, c in nv)
    if source != "NVML" and len(counts) > 1:
        usual = counts.most_common(1)[0][0]
        odd = [f"{a}-{b}: {c} (others {usual})" for a, b, c in nv if c != usual]
        return Finding(cid, Status.FAIL, f"{len(odd)} GPU pairs have fewer NVLinks than the others",
                       odd[:16], fix="drain the node and have the NVLinks checked "
                                     "(nvidia-smi nvlink -s shows inactive links)"), pairs
    return Finding(cid, Status.PASS, f"all {len(pairs)} pairs of {len(gpus)} GPUs on NVLink "
                   f"({', '.join(sorted(counts))})", [f"source: {source}"]), pairs


# Reasons that cost speed and are not a normal state of a busy GPU.
_BAD_REASONS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown",
                "SW Thermal Slowdown")
_BENIGN_REASONS = ("Idle", "Applications Clocks Setting", "Display Clock Setting", "Sync Boost",
                   "GPU idle")


@check("gpu.throttle", "nvidia-smi-q.txt")
def gpu_throttle(snap: Snapshot, profile: Profile) -> Finding:
    cid = "gpu.throttle"
    gpus = _parsed(snap, cid, "nvidia-smi-q.txt", parsers.clock_event_reasons,
               "no `nvidia-smi -q` output in the snapshot")
    if isinstance(gpus, Finding):
        return gpus
    bad = [(g.bus_id, r) for g in gpus for r in g.active if r in _BAD_REASONS]
    other = [(g.bus_id, r) for g in gpus for r in g.active
             if r not in _BAD_REASONS and r not in _BENIGN_REASONS]
    if bad:
        return Finding(cid, Status.FAIL, f"hardware/thermal slowdown active on "
                       f"{len({b for b, _ in bad})} GPU(s)",
                       [f"{b}: {r}" for b, r in bad],
                       fix="check cooling, power supply and the BMC's power brake; "
                           "drain the node until nvidia-smi -q shows Not Active")
    if other:
        return Finding(cid, Status.WARN,
                       "clocks limited: " + ", ".join(sorted({r for _, r in other})),
                       [f"{b}: {r}" for b, r in other],
                       fix="a power cap under load is common; if it persists at idle, "
                           "check the power limit (nvidia-smi -q -d POWER)")
    return Finding(cid, Status.PASS, f"no clock slowdown on {len(gpus)} GPU(s)",
                   [f"{g.bus_id}: {', '.join(g.active) or 'none active'}" for g in gpus])


@check("net.ib", "ibstatus.txt")
def net_ib(snap: Snapshot, profile: Profile) -> Finding:
    cid = "net.ib"
    text = snap.text("ibstatus.txt")
    if text is None or not text.strip():
        why = "ibstatus not installed" if snap.missing("ibstatus.txt") else "no ibstatus output"
        return Finding(cid, Status.SKIP, f"no InfiniBand/RoCE ports seen ({why}); "
                       "fine for a single node, NCCL will use sockets across nodes",
                       fix="for multi-node training install rdma-core / infiniband-diags "
                           "and check the HCAs")
    try:
        ports = parsers.ibstatus(text)
    except ParseError as e:
        return _unparseable(cid, "ibstatus.txt", e)
    evidence = [f"{p.name} {p.state} {p.phys_state} {p.rate_gbps:g} Gb/s {p.link_layer}"
                for p in ports]
    problems = []
    for p in ports:
        if p.state != "ACTIVE" or p.phys_state != "LinkUp":
            problems.append(f"{p.name} is {p.state}/{p.phys_state}")
    active = [p for p in ports if p.state == "ACTIVE"]
    for layer in {p.link_layer for p in active}:
        peers = [p for p in active if p.link_layer == layer]
        top = max(p.rate_gbps for p in peers)
        problems += [f"{p.name} trained at {p.rate_gbps:g} Gb/s, its peers at {top:g}"
                     for p in peers if p.rate_gbps < top]
    if problems:
        return Finding(cid, Status.FAIL, "; ".join(problems), evidence,
                       fix="reseat or replace the cable/transceiver, check the switch port; "
                           "until fixed exclude the port with NCCL_IB_HCA")
    return Finding(cid, Status.PASS, f"{len(ports)} port(s) ACTIVE at "
                   f"{', '.join(sorted({f'{p.rate_gbps:g}' for p in ports}))} Gb/s", evidence)


@check("limits.memlock", "ulimit-l.txt")
def limits_memlock(snap: Snapshot, profile: Profile) -> Finding:
    cid = "limits.memlock"
    kib = _parsed(snap, cid, "ulimit-l.txt", parsers.ulimit, "ulimit -l not recorded")
    if isinstance(kib, Finding):
        return kib
    if kib is None:
        return Finding(cid, Status.PASS, "locked memory is unlimited", ["ulimit -l: unlimited"])
    ib = bool(_active_ib(snap))
    return Finding(cid, Status.FAIL if ib else Status.WARN,
                   f"locked memory limited to {kib} KiB: NCCL over IB fails with "
                   "'unhandled system error'" + ("" if ib else " (no active IB port here)"),
                   [f"ulimit -l: {kib}"],
                   fix="set `* - memlock unlimited` in /etc/security/limits.conf, "
                       "or --ulimit memlock=-1 for containers, or PropagateResourceLimits in Slurm")


@check("sys.shm", "shm.txt")
def sys_shm(snap: Snapshot, profile: Profile) -> Finding:
    cid = "sys.shm"
    size = _parsed(snap, cid, "shm.txt", parsers.df_size_bytes,
                  "/dev/shm size not recorded")
    if isinstance(size, Finding):
        return size
    evidence = [f"/dev/shm: {size / GIB:.2f} GiB"]
    fix = "give the container --shm-size=64g (or --ipc=host); on bare metal remount /dev/shm larger"
    if size < 1 * GIB:
        return Finding(cid, Status.FAIL, f"/dev/shm is only {size / MIB:.0f} MiB: NCCL's SHM "
                       "transport and data-loader workers will fail", evidence, fix)
    if size < 8 * GIB:
        return Finding(cid, Status.WARN, f"/dev/shm is {size / GIB:.1f} GiB: tight for 8 ranks of "
                       "data-loader workers", evidence, fix)
    return Finding(cid, Status.PASS, f"/dev/shm is {size / GIB:.0f} GiB", evidence)


def _ifname_matches(spec: str, names: list[str]) -> list[str]:
    """NCCL_SOCKET_IFNAME semantics: comma list of prefixes, '=' exact, '^' excludes."""
    spec = spec.strip()
    if spec.startswith("^"):
        return names
    exact = spec.startswith("=")
    wanted = [s for s in spec.lstrip("=").split(",") if s]
    return [n for n in names for w in wanted if (n == w if exact else n.startswith(w))]


@check("nccl.env", "env.txt")
def nccl_env(snap: Snapshot, profile: Profile) -> Finding:
    cid = "nccl.env"
    env = snap.env()
    if not env and (snap.text("env.txt") or "").strip():
        return _unparseable(cid, "env.txt", ParseError("no KEY=VALUE line"))
    nccl = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    problems: list[tuple[str, str]] = []
    ifaces_text = snap.text("ip-br-addr.txt")
    try:
        ifaces = parsers.ip_brief(ifaces_text) if ifaces_text else None
    except ParseError:
        ifaces = None
    spec = nccl.get("NCCL_SOCKET_IFNAME")
    if spec and ifaces is not None and not _ifname_matches(spec, list(ifaces)):
        problems.append((f"NCCL_SOCKET_IFNAME={spec} matches no interface "
                         f"(have {', '.join(ifaces)})", "unset it or name an existing interface"))
    active_ib = _active_ib(snap)
    if nccl.get("NCCL_IB_DISABLE") == "1" and active_ib:
        problems.append((f"NCCL_IB_DISABLE=1 although {len(active_ib)} IB port(s) are ACTIVE: "
                         "NCCL will use TCP sockets", "unset NCCL_IB_DISABLE"))
    if (hca := nccl.get("NCCL_IB_HCA")) and _ib_ports(snap):
        devices = {p.device for p in _ib_ports(snap)}
        named = [h.split(":")[0] for h in hca.lstrip("^=").split(",") if h]
        unknown = [h for h in named if not any(d.startswith(h) for d in devices)]
        if unknown and not hca.startswith("^"):
            problems.append((f"NCCL_IB_HCA names {', '.join(unknown)}, not on this host "
                             f"(have {', '.join(sorted(devices))})", "fix NCCL_IB_HCA"))
    if nccl.get("NCCL_NET", "").lower() == "socket" and active_ib:
        problems.append(("NCCL_NET=Socket although IB ports are ACTIVE", "unset NCCL_NET"))
    if nccl.get("NCCL_P2P_DISABLE") == "1":
        problems.append(("NCCL_P2P_DISABLE=1: GPU-to-GPU traffic goes through host memory",
                         "unset NCCL_P2P_DISABLE"))
    if nccl.get("NCCL_SHM_DISABLE") == "1":
        problems.append(("NCCL_SHM_DISABLE=1", "unset NCCL_SHM_DISABLE"))
    evidence = [f"{k}={v}" for k, v in sorted(nccl.items())] or ["no NCCL_* variables set"]
    if problems:
        return Finding(cid, Status.FAIL, "; ".join(p for p, _ in problems), evidence,
                       fix="; ".join(f for _, f in problems))
    return Finding(cid, Status.PASS, "NCCL_* variables agree with the host" if nccl
                   else "no NCCL_* variables set; NCCL picks transports itself", evidence)
