#!/usr/bin/env python3
"""verify_nccl.py - is the collective layer of this job correct, fast, and on the right transport?

Runs anywhere torch runs (the environment megatron-env built, an NGC container, a bare compute
node); it needs nothing from megatron_env.

    torchrun --nproc_per_node=8 verify_nccl.py --out runs/nccl           # one node
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-endpoint=HOST:29500 verify_nccl.py
    srun --ntasks-per-node=8 python verify_nccl.py                       # Slurm
    torchrun --nproc_per_node=4 verify_nccl.py --backend gloo --sizes 1K:1M   # CPUs only
    python verify_nccl.py --analyze-log nccl.log [--json]                 # a saved NCCL log

What it does, in order:
1. correctness: all_reduce, all_gather, reduce_scatter and broadcast on integer-valued floats,
   checked element-exactly against the value each rank must see;
2. bandwidth: a sweep of message sizes, warm-up then timed iterations (CUDA events on GPUs),
   reporting time, algbw and busbw with the nccl-tests definitions;
3. transport: NCCL_DEBUG=INFO goes to one file per rank; the log is parsed into findings (which
   network, which per-channel transports, which of the usual failures);
4. judgement: the peak all_reduce busbw against what the topology should give.

Rank 0 prints a table and writes results.json (and busbw.png when matplotlib is there).
Findings use the shape of `invoke check`: id, status (pass/warn/fail/skip), summary, evidence, fix.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

# --------------------------------------------------------------------------- findings

TOLERANCE = 0.8  # a peak below 80% of the expected busbw fails

# Per-direction NVLink bandwidth per GPU (GB/s) by compute capability: links x 25 GB/s.
NVLINK_GBPS = {(9, 0): 450.0, (8, 0): 300.0, (7, 0): 150.0, (10, 0): 900.0}
# What all_reduce busbw reaches on those fabrics with NVLink SHARP off, as a share of the
# per-direction NVLink bandwidth (8x H100/H200: ~360-370 of 450 GB/s).
NVLINK_EFFICIENCY = 0.8
PCIE_GBPS = {3: 12.0, 4: 24.0, 5: 48.0}  # x16, per direction, what NCCL reaches


def finding(id: str, status: str, summary: str, evidence=(), fix: str = "") -> dict:
    return {"id": id, "status": status, "summary": summary, "evidence": list(evidence), "fix": fix}


# --------------------------------------------------------------------------- NCCL log analysis

_VERSION = re.compile(r"NCCL version (\S+)")
_NET_USING = re.compile(r"NET/(IB|Socket|\w+) ?: Using (.*)")
_NETWORK = re.compile(r"Using network (\S.*?)\s*$")
_PLUGIN = re.compile(r"NET/Plugin\s*:?\s*(.*)")
# "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA" (2.7+), "Ring 00 : 0[0] -> 1[1] via P2P/IPC"
# and "... via direct shared memory" (2.4-2.6)
_CHANNEL = re.compile(r"(?:Channel|Ring) \d+(?:/\d+)? : (\d+)\[\w+\] -> (\d+)\[\w+\]"
                      r"(?: \[(?:send|receive)\])? via (.+?)\s*$")
# "NCCL WARN ..."; NCCL 2.1 wrote "host [dev] file.cu:line WARN ..." without the word NCCL
_WARN = re.compile(r"\bNCCL WARN (.*)|^[\w.<>-]+ \[\d+\] \S+:\d+ WARN (.*)")
# host:pid:tid [dev] [file.cc:line] NCCL ...  (an mpirun "[0] " tag may come first)
_PREFIX = re.compile(r"^(?:\[\d+\] )?([\w.<>-]+):\d+:\d+ \[(\d+)\](?: \S+:\d+)? NCCL")
_OLD_PREFIX = re.compile(r"^([\w.<>-]+) \[(\d+)\] \S+:\d+ WARN")
_NRANKS = re.compile(r"\bnranks (\d+)")


def analyze_log(text: str) -> dict:
    """Parse NCCL_DEBUG=INFO output (any NCCL from 2.4 to 2.28; one or many ranks interleaved)."""
    versions = sorted(set(_VERSION.findall(text)))
    transports: dict[str, int] = {}
    networks: list[str] = []
    ib_devices: list[str] = []
    sockets: list[str] = []
    plugins: list[str] = []
    warnings: list[str] = []
    where: dict[str, list[str]] = {}  # warning -> ["host [dev]", ...] that printed it
    ib_missing = False
    hosts: set[str] = set()
    nranks = 0
    gdrdma = False
    for line in text.splitlines():
        origin = _PREFIX.match(line) or _OLD_PREFIX.match(line)
        if origin:
            hosts.add(origin.group(1))
        if m := _NRANKS.search(line):
            nranks = max(nranks, int(m.group(1)))
        if m := _CHANNEL.search(line):
            key = _transport_key(m.group(3))
            transports[key] = transports.get(key, 0) + 1
            gdrdma = gdrdma or "GDRDMA" in m.group(3)
        else:
            ib_missing = _note_network(line, networks, ib_devices, sockets, plugins) or ib_missing
        if m := _WARN.search(line):
            _note_warning((m.group(1) or m.group(2)).strip(), origin, warnings, where)
    if not networks:  # NCCL < 2.12 does not say "Using network"; infer from the channels
        nets = sorted({k.split("/")[1] for k in transports if k.startswith("NET/")})
        networks = nets
    return {"nccl_versions": versions, "networks": networks, "ib_devices": ib_devices,
            "socket_interfaces": sockets, "plugins": plugins, "ib_missing": ib_missing,
            "transports": transports, "warnings": warnings, "warned_at": where,
            "hosts": sorted(hosts),
            "nranks": nranks, "gdrdma": gdrdma}


def _note_network(line: str, networks: list, ib_devices: list, sockets: list,
                  plugins: list) -> bool:
    """A line that is no channel: the network, NIC or plugin it names, appended where new.
    True when it says NCCL found no IB device."""
    if m := _NETWORK.search(line):
        if m.group(1) not in networks:
            networks.append(m.group(1))
    elif "NET/IB" in line and ("No device found" in line or "No IB devices found" in line):
        return True
    elif m := _NET_USING.search(line):
        target = ib_devices if m.group(1) != "Socket" else sockets
        value = re.split(r" ; |; OOB", m.group(2))[0].strip()
        if value and value != "[RO]" and value not in target:
            target.append(value)
    elif (m := _PLUGIN.search(line)) and m.group(1) and m.group(1) not in plugins:
        plugins.append(m.group(1).strip())
    return False


def _note_warning(w: str, origin, warnings: list, where: dict) -> None:
    """A WARN once in `warnings`, and each "host [dev]" that printed it once in where[w]."""
    if w not in warnings:
        warnings.append(w)
    if origin:
        at = f"{origin.group(1)} [{origin.group(2)}]"
        if at not in where.setdefault(w, []):
            where[w].append(at)


def _transport_key(via: str) -> str:
    """'NET/IBext_v8/7/GDRDMA' -> 'NET/IB', 'P2P/IPC/read' -> 'P2P/IPC', old SHM wording -> 'SHM/direct'."""
    if via.startswith("direct shared memory"):
        return "SHM/direct"
    parts = via.split()[0].split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return "NET/IB" if parts[1].startswith("IB") else f"NET/{parts[1]}"
    return "/".join(parts[:2])


def log_findings(a: dict) -> list[dict]:
    out = []
    nets = a["networks"]
    tr = a["transports"]
    socket_used = any("Socket" in n for n in nets) or any(k.startswith("NET/Socket") for k in tr)
    ib_used = any(n.startswith("IB") for n in nets) or any(k.startswith("NET/IB") for k in tr)
    single_node = len(a["hosts"]) <= 1 and not any(k.startswith("NET/") for k in tr)
    if single_node and not ib_used:
        out.append(finding("nccl.net", "skip",
                           f"single node: no inter-node traffic (network chosen: "
                           f"{', '.join(nets) or 'none'}"
                           + ("; no IB device, so sockets would carry multi-node jobs)"
                              if a["ib_missing"] else ")"),
                           [f"hosts: {', '.join(a['hosts']) or 'unknown'}", f"nranks: {a['nranks']}"],
                           "for multi-node training make IB/RoCE visible to NCCL"
                           if a["ib_missing"] else ""))
    elif a["ib_missing"] and socket_used:
        out.append(finding("nccl.net", "fail",
                           "no InfiniBand device found: NCCL falls back to TCP sockets between nodes",
                           [f"networks: {', '.join(nets)}"] + a["socket_interfaces"][:4],
                           "install rdma-core/libibverbs in the environment (container: --device "
                           "/dev/infiniband, --cap-add IPC_LOCK), check `ibstatus`, and unset "
                           "NCCL_IB_DISABLE"))
    elif socket_used and tr.get("NET/Socket"):
        out.append(finding("nccl.net", "warn", "inter-node traffic goes over TCP sockets",
                           [f"networks: {', '.join(nets)}"],
                           "use IB/RoCE for multi-node training; check NCCL_IB_DISABLE / NCCL_NET"))
    elif ib_used:
        out.append(finding("nccl.net", "pass", f"NCCL uses {', '.join(nets) or 'IB'}"
                           + (" with GPUDirect RDMA" if a["gdrdma"] else ""), a["ib_devices"][:8]))
    elif nets:
        out.append(finding("nccl.net", "pass", f"network chosen: {', '.join(nets)}",
                           a["plugins"][:2] + a["socket_interfaces"][:2]))
    else:
        out.append(finding("nccl.net", "skip", "no network selection in the log"))
    if tr:
        ev = [f"{k}: {v} channel connections" for k, v in sorted(tr.items())]
        if "SHM/direct" in tr and not any(k.startswith("P2P") for k in tr):
            out.append(finding("nccl.transport", "warn",
                               "GPUs on a node talk through host shared memory (SHM), not P2P",
                               ev, "P2P is disabled or unsupported: unset NCCL_P2P_DISABLE, check "
                                   "`nvidia-smi topo -p2p r`, ACS/IOMMU settings, VM passthrough"))
        else:
            out.append(finding("nccl.transport", "pass", "transports: " + ", ".join(sorted(tr)), ev))
    else:
        out.append(finding("nccl.transport", "skip",
                           "no channel connections in the log (one rank, or connections not logged)"))
    out += _error_findings(a)
    rules = [
        ("nccl.system_error", r"unhandled system error|ibv_reg_mr\S* failed|ibv_create_qp failed|"
                              r"Cannot allocate memory|Unable to register memory",
         "NCCL hit a system error (often locked-memory limits with IB)",
         "set `ulimit -l unlimited` (limits.conf, --ulimit memlock=-1, Slurm PropagateResourceLimits)"),
        ("nccl.shm", r"/dev/shm|shared memory segment|ShmAlloc|shm_open|posix_fallocate",
         "NCCL could not create its shared-memory segments: /dev/shm too small",
         "give the container --shm-size=64g or --ipc=host"),
        ("nccl.socket", r"socketStartConnect|Connect to \S+ failed|Software caused connection abort",
         "NCCL could not connect a socket to a peer",
         "set NCCL_SOCKET_IFNAME to the interface the nodes reach each other on (and "
         "NCCL_SOCKET_FAMILY=AF_INET when it picked an IPv6 link-local fe80:: address); check "
         "firewalls between the nodes"),
        ("nccl.ibverbs", r"libibverbs", "libibverbs could not be loaded: no IB support in this "
         "environment", "install rdma-core (libibverbs) in the image"),
    ]
    for rid, pattern, summary, fix in rules:
        hits = [w for w in a["warnings"] if re.search(pattern, w, re.I)]
        if hits:
            at = _places(a, hits)
            out.append(finding(rid, "fail", summary + (f" on {at}" if at else ""),
                               [_located(a, w) for w in hits[:5]], fix))
    return out


# ibv_wc_status (infiniband/verbs.h): what a failed work completion's status number means
IBV_WC_STATUS = {1: "local length error", 2: "local QP operation error", 4: "local protection error",
                 5: "work request flushed", 7: "bad response", 8: "local access error",
                 9: "remote invalid request", 10: "remote access error", 11: "remote operation error",
                 12: "transport retry counter exceeded", 13: "RNR retry counter exceeded"}
_COMPLETION = re.compile(r"Got completion from peer (\S+) with (?:error |status=)(\d+),? "
                         r"opcode[ =](\d+),? len[ =](\d+),? vendor err (\d+)(?: \((\w+)\))?")
_CUDA_FAILURE = re.compile(r"Cuda failure (?:(\d+) )?'([^']+)'")
_PEER_GONE = re.compile(r"Connection closed by remote peer (\S+)|Connection reset by peer|"
                        r"Call to recv from (\S+) failed")


def _places(a: dict, warnings: list[str]) -> str:
    """'H100-2 [1], H100-5 [3]': the hosts and devices that printed these warnings."""
    seen = dict.fromkeys(at for w in warnings for at in a.get("warned_at", {}).get(w, []))
    return ", ".join(list(seen)[:6]) + (f" and {len(seen) - 6} more" if len(seen) > 6 else "")


def _located(a: dict, warning: str) -> str:
    at = a.get("warned_at", {}).get(warning)
    return f"{', '.join(at[:3])}: {warning}" if at else warning


def _error_findings(a: dict) -> list[dict]:
    """NCCL's own runtime failures: IB completion errors, its CUDA calls failing, a peer gone."""
    out = []
    ib = [(w, m) for w in a["warnings"] if (m := _COMPLETION.search(w))]
    if ib:
        codes = sorted({(int(m.group(2)), int(m.group(5))) for _, m in ib})
        what = "; ".join(f"status {s} ({IBV_WC_STATUS.get(s, 'see ibv_wc_status')}), vendor err {v}"
                         for s, v in codes)
        peers = sorted({m.group(1) for _, m in ib})
        out.append(finding(
            "nccl.ib_completion", "fail",
            f"InfiniBand completion error on {_places(a, [w for w, _ in ib]) or 'a rank'}: {what}",
            [_located(a, w) for w, _ in ib[:5]] + [f"peers: {', '.join(peers[:6])}"],
            "a link, port or peer failed mid-transfer: check `ibstatus` and the port error "
            "counters (`perfquery -x`) on the named hosts and their peers, run `invoke preflight` "
            "there, and exclude a host whose port flaps; a peer that died first shows its own error"))
    cuda = [(w, m) for w in a["warnings"] if (m := _CUDA_FAILURE.search(w))]
    if cuda:
        kinds = sorted({m.group(2) for _, m in cuda})
        oom = "out of memory" in kinds
        out.append(finding(
            "nccl.cuda", "fail",
            f"a CUDA call inside NCCL failed ('{', '.join(kinds)}') on "
            f"{_places(a, [w for w, _ in cuda]) or 'a rank'}",
            [_located(a, w) for w, _ in cuda[:5]]
            + [w for w in a["warnings"] if "Failed to CUDA" in w][:2],
            "NCCL allocates its buffers on the GPU after the model: leave it headroom (smaller "
            "micro-batch, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, fewer NCCL channels)"
            if oom else "check the GPU on that host (`nvidia-smi -q`, Xid lines in `dmesg`) and "
                        "run `invoke preflight` there"))
    gone = [w for w in a["warnings"] if _PEER_GONE.search(w)]
    if gone:
        out.append(finding(
            "nccl.peer_lost", "fail",
            f"a peer closed its connection (seen on {_places(a, gone) or 'a rank'}): another rank "
            "died or its network failed first", [_located(a, w) for w in gone[:5]],
            "find the rank that exited first (its own error, or torchrun's root cause) and "
            "fix that; the ranks that report the lost connection are victims"))
    return out


# --------------------------------------------------------------------------- judgement


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw."""
    if n <= 1:
        return 0.0
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
            "reduce_scatter": (n - 1) / n, "broadcast": 1.0}[op]


def expected_busbw(topo: dict) -> tuple[float | None, str]:
    """(GB/s, why) for all_reduce from what this job runs on; None when nothing is expected."""
    if topo["world_size"] < 2 or topo["backend"] != "nccl":
        return None, "nothing to expect: one rank, or not NCCL"
    cc = tuple(topo.get("compute_capability") or ())
    if topo["nodes"] > 1:
        rate = topo.get("ib_gbps_per_node") or 0.0
        per_gpu = rate / 8 / max(topo["local_world_size"], 1)
        if per_gpu <= 0:
            return None, "multi-node without an active IB/RoCE port: no expectation"
        return per_gpu * NVLINK_EFFICIENCY, (f"{rate:g} Gb/s of IB per node shared by "
                                             f"{topo['local_world_size']} GPUs")
    if topo.get("nvlink") and cc in NVLINK_GBPS:
        return NVLINK_GBPS[cc] * NVLINK_EFFICIENCY, (
            f"NVLink of sm_{cc[0]}{cc[1]}: {NVLINK_GBPS[cc]:g} GB/s per direction x "
            f"{NVLINK_EFFICIENCY:g}")
    gen = topo.get("pcie_gen") or 4
    return PCIE_GBPS.get(gen, 24.0) * NVLINK_EFFICIENCY, f"PCIe gen {gen} x16, no NVLink"


def judge(results: list[dict], topo: dict, override: float | None, log_f: list[dict]) -> dict:
    ar = [r for r in results if r["op"] == "all_reduce"]
    peak = max((r["busbw_gbps"] for r in ar), default=0.0)
    expected, why = (override, "given by --expected-busbw") if override else expected_busbw(topo)
    if expected is None:
        return finding("nccl.busbw", "skip", f"peak all_reduce busbw {peak:.1f} GB/s; {why}")
    ev = [f"peak {peak:.1f} GB/s", f"expected >= {expected * TOLERANCE:.1f} GB/s "
          f"({TOLERANCE:.0%} of {expected:.1f}: {why})"]
    if peak >= expected * TOLERANCE:
        return finding("nccl.busbw", "pass", f"peak all_reduce busbw {peak:.1f} GB/s", ev)
    causes = [f["summary"] for f in log_f if f["status"] in ("fail", "warn")]
    return finding("nccl.busbw", "fail",
                   f"peak all_reduce busbw {peak:.1f} GB/s is below {expected * TOLERANCE:.1f}",
                   ev + [f"likely cause: {c}" for c in causes],
                   "see the transport findings; check `invoke check` (gpu.topology, net.ib)")


# --------------------------------------------------------------------------- the run


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper().rstrip("B").rstrip("I"))
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use 1M, 64K, 4G)")
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]


def size_sweep(spec: str) -> list[int]:
    lo, _, hi = spec.partition(":")
    a, b = parse_size(lo), parse_size(hi or lo)
    out = []
    while a <= b:
        out.append(a)
        a *= 2
    return out


def slurm_first_host(env) -> str:
    """The step's first node, where rank 0 runs: from scontrol, else single-node jobs locally.
    The step's list, not the job's: a step started with --exclude/--nodelist may leave the job's
    first node out."""
    nodelist = (env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
                or env.get("SLURM_NODELIST", ""))
    if shutil.which("scontrol") and nodelist:
        hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                               capture_output=True, text=True).stdout.split()
        if hosts:
            return hosts[0]
    if env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")) == "1":
        return "127.0.0.1"
    raise SystemExit("verify_nccl: cannot tell rank 0's host (no scontrol): set MASTER_ADDR")


def dist_env() -> tuple[int, int, int, int]:
    """(rank, world, local_rank, local_world) from torchrun or Slurm; sets what torch needs."""
    env = os.environ
    if "RANK" not in env and "SLURM_PROCID" in env:
        env["RANK"], env["WORLD_SIZE"] = env["SLURM_PROCID"], env["SLURM_NTASKS"]
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        env.setdefault("LOCAL_WORLD_SIZE", env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0])
        if "MASTER_ADDR" not in env:
            env["MASTER_ADDR"] = slurm_first_host(env)
        env.setdefault("MASTER_PORT", str(29500 + int(env.get("SLURM_JOB_ID", "0")) % 1000))
    env.setdefault("RANK", "0")
    env.setdefault("WORLD_SIZE", "1")
    env.setdefault("LOCAL_RANK", "0")
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29500")
    local_world = int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
    return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]), local_world


def check_correctness(torch, dist, device, rank: int, n: int) -> dict:
    """Element-exact checks; float32 holds these integers exactly."""
    k = 1024
    f32 = torch.float32
    res = {}
    t = torch.ones(k, device=device, dtype=f32) * rank
    dist.all_reduce(t)
    res["all_reduce"] = bool(torch.all(t == n * (n - 1) / 2).item())
    outs = [torch.empty(k, device=device, dtype=f32) for _ in range(n)]
    dist.all_gather(outs, torch.full((k,), float(rank), device=device, dtype=f32))
    res["all_gather"] = all(bool(torch.all(o == i).item()) for i, o in enumerate(outs))
    if hasattr(dist, "reduce_scatter_tensor"):
        inp = torch.cat([torch.full((k,), float((rank + 1) * (j + 1)), device=device, dtype=f32)
                         for j in range(n)])
        out = torch.empty(k, device=device, dtype=f32)
        try:
            dist.reduce_scatter_tensor(out, inp)
            res["reduce_scatter"] = bool(torch.all(out == (rank + 1) * n * (n + 1) / 2).item())
        except RuntimeError as e:  # gloo has no reduce_scatter in older torch
            res["reduce_scatter"] = f"unsupported: {str(e).splitlines()[0]}"
    b = torch.full((k,), 42.0 if rank == 0 else -1.0, device=device, dtype=f32)
    dist.broadcast(b, src=0)
    res["broadcast"] = bool(torch.all(b == 42.0).item())
    return res


OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
HOST_BYTES = 64


def old_torch(version: str) -> bool:
    """torch before 2.2: gloo without _allgather_base, and a destroy that can hang."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) < (2, 2)


def gather_correctness(torch, dist, device, rank: int, n: int, mine: dict) -> list[dict]:
    """Every rank's correctness and host name, gathered through tensors: object collectives need
    numpy (torch alone has none) and pickle, and this must run wherever torch runs."""
    codes = [1 if mine.get(op) is True else -1 if isinstance(mine.get(op), str) else 0
             for op in OPS]
    host = list(socket.gethostname().encode()[:HOST_BYTES])
    row = torch.tensor(codes + host + [0] * (HOST_BYTES - len(host)), dtype=torch.int32,
                       device=device)
    rows = [torch.empty_like(row) for _ in range(n)]
    dist.all_gather(rows, row)
    out = []
    for r, t in enumerate(rows):
        values = [int(v) for v in t.tolist()]
        entry = {"rank": r, "host": bytes(b for b in values[len(OPS):] if b).decode(errors="replace")}
        for op, code in zip(OPS, values[: len(OPS)], strict=True):
            if op in mine:
                entry[op] = (mine[op] if r == rank else "unsupported") if code == -1 else code == 1
        out.append(entry)
    return out


def all_gather_flat(dist, out, part, n: int) -> None:
    """all_gather into one flat tensor; gloo before torch 2.2 lacks _allgather_base, so the
    list form (views of `out`) stands in for it there."""
    try:
        dist.all_gather_into_tensor(out, part)
    except (RuntimeError, AttributeError) as e:
        if "_allgather_base" not in str(e) and not isinstance(e, AttributeError):
            raise
        dist.all_gather(list(out.chunk(n)), part)


def time_op(torch, dist, device, op: str, nbytes: int, n: int, warmup: int, iters: int) -> float:
    """Seconds per call, the slowest rank's mean (as nccl-tests reports)."""
    elems = max(nbytes // 4, n)
    elems -= elems % n
    x = torch.ones(elems, device=device, dtype=torch.float32)
    if op == "all_reduce":
        def call():
            dist.all_reduce(x)
    elif op == "all_gather":
        out = torch.empty(elems, device=device, dtype=torch.float32)
        part = x[: elems // n]

        def call():
            all_gather_flat(dist, out, part, n)
    elif op == "reduce_scatter":
        out = torch.empty(elems // n, device=device, dtype=torch.float32)

        def call():
            dist.reduce_scatter_tensor(out, x)
    else:
        def call():
            dist.broadcast(x, src=0)
    for _ in range(warmup):
        call()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            call()
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1000 / iters
    else:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        seconds = (time.perf_counter() - t0) / iters
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def local_topology(torch, backend: str, world: int, local_world: int) -> dict:
    topo = {"backend": backend, "world_size": world, "local_world_size": local_world,
            "nodes": max(world // max(local_world, 1), 1), "hostname": socket.gethostname()}
    if backend != "nccl":
        return topo
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    topo.update(gpu=props.name, compute_capability=[props.major, props.minor],
                torch=torch.__version__, cuda=torch.version.cuda,
                nccl=".".join(map(str, torch.cuda.nccl.version())))
    try:
        import pynvml as nv

        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        topo["driver"] = nv.nvmlSystemGetDriverVersion()
        links = 0
        for i in range(18):
            try:
                links += nv.nvmlDeviceGetNvLinkState(h, i) == nv.NVML_FEATURE_ENABLED
            except nv.NVMLError:
                break
        topo["nvlink"], topo["nvlinks_active"] = links > 0, links
        topo["pcie_gen"] = nv.nvmlDeviceGetCurrPcieLinkGeneration(h)
    except Exception as e:  # noqa: BLE001 - NVML is optional here
        topo["nvml_error"] = str(e)
    ib = 0.0
    for rate in Path("/sys/class/infiniband").glob("*/ports/*/rate"):
        state = (rate.parent / "state").read_text() if (rate.parent / "state").exists() else ""
        if "ACTIVE" in state:
            m = re.match(r"([\d.]+)", rate.read_text())
            ib += float(m.group(1)) if m else 0.0
    topo["ib_gbps_per_node"] = ib
    return topo


def plot(results: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for op in sorted({r["op"] for r in results}):
        rs = [r for r in results if r["op"] == op]
        ax.plot([r["bytes"] for r in rs], [r["busbw_gbps"] for r in rs], marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def print_log_findings(findings: list[dict]) -> None:
    for f in findings:
        print(f"{f['id']:<18} {f['status']:<5} {f['summary']}")
        if f["status"] in ("fail", "warn") and f["fix"]:
            print(f"{'':<24}fix: {f['fix']}")


def analyze_saved_log(path: str, *, as_json: bool) -> int:
    """--analyze-log: a saved NCCL_DEBUG=INFO log's findings; exit 1 on a failing one, 2 when
    the file cannot be read or holds no NCCL line."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        print(f"error: cannot read {path}: {e.strerror}", file=sys.stderr)
        return 2
    a = analyze_log(text)
    if not any(a[k] for k in ("nccl_versions", "hosts", "networks", "transports", "warnings",
                              "plugins", "nranks", "ib_missing")):
        print(f"error: {path} holds no NCCL line; fix: pass the output of a run "
              "with NCCL_DEBUG=INFO (NCCL_DEBUG_FILE names where it goes)", file=sys.stderr)
        return 2
    fs = log_findings(a)
    if as_json:
        print(json.dumps({"analysis": a, "findings": fs}, indent=2))
    else:
        print_log_findings(fs)
    return 1 if any(f["status"] == "fail" for f in fs) else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--analyze-log", metavar="FILE", help="parse a saved NCCL_DEBUG=INFO log and exit")
    p.add_argument("--json", action="store_true", help="with --analyze-log: JSON on stdout")
    p.add_argument("--backend", choices=["nccl", "gloo"], help="default: nccl when CUDA is there")
    p.add_argument("--sizes", default=None, help="MIN:MAX, doubling (default 1M:4G; gloo 1K:4M)")
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,broadcast")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--expected-busbw", type=float, help="GB/s; overrides the topology's figure")
    p.add_argument("--out", default="runs/verify_nccl", help="directory for JSON, logs and plot")
    args = p.parse_args(argv)

    if args.analyze_log:
        return analyze_saved_log(args.analyze_log, as_json=args.json)

    import torch
    import torch.distributed as dist

    rank, world, local_rank, local_world = dist_env()
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if backend == "nccl":
        os.environ.setdefault("NCCL_DEBUG", "INFO")
        os.environ.setdefault("NCCL_DEBUG_FILE", str(out / f"nccl-rank{rank}.log"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=10))
    correctness = check_correctness(torch, dist, device, rank, world)
    all_correct = gather_correctness(torch, dist, device, rank, world, correctness)
    sizes = size_sweep(args.sizes or ("1M:4G" if backend == "nccl" else "1K:4M"))
    ops = [o for o in args.ops.split(",") if o]
    results = []
    for op in ops:
        if any(isinstance(c.get(op), str) for c in all_correct):
            continue  # unsupported on this backend
        for nbytes in sizes:
            seconds = time_op(torch, dist, device, op, nbytes, world, args.warmup, args.iters)
            algbw = nbytes / seconds / 1e9
            results.append({"op": op, "bytes": nbytes, "time_us": seconds * 1e6,
                            "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(op, world),
                            # one rank moves no data between ranks: a "bandwidth" of a no-op
                            "meaningful": world > 1})
    topo = local_topology(torch, backend, world, local_world)
    dist.barrier()
    # torch 2.1's gloo: a rank hung in destroy_process_group after this barrier (every run of
    # tests/test_env.py's 2-rank case; pytorch/pytorch#75097), and exit frees it there. Newer
    # torch aborts a rank that exits with its gloo group alive ("terminate called without an
    # active exception", seen with torch 2.11 when started as srun starts tasks): destroy it.
    if not (backend == "gloo" and old_torch(torch.__version__)):
        dist.destroy_process_group()
    if rank != 0:
        return 0

    time.sleep(0.5)  # let the other ranks' NCCL logs flush
    logs = sorted(out.glob("nccl-rank*.log"))
    log_a = analyze_log("\n".join(f.read_text(errors="replace") for f in logs)) if logs else None
    log_f = log_findings(log_a) if log_a else []
    ok = all(v is True or isinstance(v, str) for c in all_correct for k, v in c.items()
             if k not in ("rank", "host"))
    findings = [finding("nccl.correctness", "pass" if ok else "fail",
                        f"{len(ops)} collectives element-exact on {world} ranks" if ok
                        else "a collective returned wrong values",
                        [json.dumps(c) for c in all_correct if not ok or c["rank"] == 0],
                        "" if ok else "run `invoke check`; a wrong sum points at broken P2P/NVLink")]
    findings += log_f
    findings.append(judge(results, topo, args.expected_busbw, log_f))
    peaks = {op: max((r["busbw_gbps"] for r in results if r["op"] == op), default=0.0) for op in ops}
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "topology": topo, "sizes": sizes,
           "warmup": args.warmup, "iters": args.iters, "correctness": all_correct,
           "results": results, "peak_busbw_gbps": peaks, "nccl_log": log_a, "findings": findings,
           "logs": [f.name for f in logs]}
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    plotted = plot(results, out / "busbw.png")

    print(f"{'op':<15}{'bytes':>12}{'time_us':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}")
    for r in results:
        bw = (f"{r['algbw_gbps']:>12.2f}{r['busbw_gbps']:>12.2f}" if r["meaningful"]
              else f"{'n/a':>12}{'n/a':>12}")
        print(f"{r['op']:<15}{r['bytes']:>12}{r['time_us']:>12.1f}{bw}")
    if world < 2:
        print("note: one rank: no data crosses a link, so there is no bandwidth to measure "
              "(results.json keeps the raw figures, marked \"meaningful\": false); run with "
              "--nproc_per_node >= 2")
    print()
    print_log_findings(findings)
    worst = "fail" if any(f["status"] == "fail" for f in findings) else "pass"
    print(f"verify_nccl: {worst}; {world} ranks on {topo['nodes']} node(s), backend {backend}; "
          f"results in {out / 'results.json'}" + (f", plot {out / 'busbw.png'}" if plotted else ""))
    return 1 if worst == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
