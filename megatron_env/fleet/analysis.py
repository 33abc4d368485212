"""Fleet analysis: a pure function of a directory of node results (one sub-directory per host).

A node's sub-directory holds what `invoke collect` writes, and optionally gpu_health.json (as
scripts/gpu_health.py writes it) and fingerprint.json (megatron_env.fleet.fingerprint). Besides
every single-node check, the analysis sees what only a fleet can: a GPU slower than the fleet's
median for its model, NVLink and IB rates below the node's peers, and drivers or environments that
differ from the majority. Every finding's summary names its host (and GPU where there is one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_env.errors import UserError
from megatron_env.findings import Finding, Status, worst
from megatron_env.host import checks, parsers
from megatron_env.host.parsers import ParseError
from megatron_env.host.snapshot import Snapshot
from megatron_env.profile import Profile

DEFAULT_SLOW = 0.10  # a GPU more than 10% below its model's fleet median fails its node
METRICS = (("gemm_bf16_tflops", "bf16 GEMM", "TFLOP/s"), ("copy_tbs", "copy", "TB/s"))


@dataclass
class Node:
    host: str
    snapshot: Snapshot
    health: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)


@dataclass
class NodeResult:
    host: str
    findings: list[Finding]

    @property
    def status(self) -> Status:
        return worst(self.findings)


@dataclass
class Report:
    nodes: list[NodeResult]

    @property
    def exclude(self) -> list[str]:
        return [n.host for n in self.nodes if n.status is Status.FAIL]

    @property
    def exit_code(self) -> int:
        """0 all pass, 1 warnings, 2 a node fails (gcm's OK / WARN / CRITICAL)."""
        return max((n.status.health_code for n in self.nodes), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": [{"host": n.host, "status": n.status,
                           "findings": [f.to_dict() for f in n.findings]} for n in self.nodes],
                "exclude": self.exclude}


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(errors="replace"))
    except (json.JSONDecodeError, RecursionError):
        return {"_error": f"{path.name} is not valid JSON"}
    return data if isinstance(data, dict) else {"_error": f"{path.name} is not a JSON object"}


def load(root: Path) -> list[Node]:
    """The nodes of a fleet directory; a directory without any node is a UserError."""
    fix = ("pass a run directory of `invoke preflight`, or one sub-directory per host holding "
           "what `invoke collect --out DIR/<host>` writes")
    if not root.is_dir():
        raise UserError(f"fleet directory {root} is not a directory", fix=fix,
                        kind="fleet.not-a-directory")
    nodes = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            snap = Snapshot.load(sub)
        except UserError:
            continue
        nodes.append(Node(sub.name, snap, _json(sub / "gpu_health.json"),
                          _json(sub / "fingerprint.json")))
    if not nodes:
        raise UserError(f"fleet directory {root} holds no node snapshot", fix=fix,
                        kind="fleet.empty")
    return nodes


# --- per-node facts the fleet compares ---------------------------------------------------------


def gpus(node: Node) -> list[dict[str, Any]]:
    gpus = node.health.get("gpus")
    return [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []


def _nvlinks(node: Node) -> dict[str, int] | None:
    """NVLinks per GPU (the sum of its NV# cells), or None when the topology is unknown."""
    text = node.snapshot.text("nvidia-smi-topo-m.txt")
    if not text:
        return None
    try:
        topo = parsers.topology(text)
    except ParseError:
        return None
    return {g: sum(parsers.nvlink_count(c) for j, c in enumerate(topo.link[i]) if j != i)
            for i, g in enumerate(topo.gpus)}


def _ib(node: Node) -> list[parsers.IbPort] | None:
    text = node.snapshot.text("ibstatus.txt")
    if text is None:
        return None
    try:
        return [p for p in parsers.ibstatus(text) if p.state == "ACTIVE"]
    except ParseError:
        return None


def fingerprint_facts(node: Node) -> dict[str, str]:
    """The values that must agree across a fleet, flattened: driver, CUDA, NCCL, env."""
    facts: dict[str, str] = {}
    nvml = node.snapshot.nvml()
    if nvml.get("driver_version"):
        facts["driver"] = str(nvml["driver_version"])
    elif text := node.snapshot.text("nvidia-smi.txt"):
        with contextlib.suppress(ParseError):
            facts["driver"] = parsers.driver_version(text)
    if nvml.get("cuda_driver_version"):
        v = int(nvml["cuda_driver_version"])
        facts["driver CUDA"] = f"{v // 1000}.{v % 1000 // 10}"
    if text := node.snapshot.text("nvcc-version.txt"):
        with contextlib.suppress(ParseError):
            facts["nvcc"] = parsers.nvcc_release(text)
    fp = node.fingerprint
    for key in ("profile", "lock_digest", "torch", "torch_cuda", "nccl", "cudnn",
                "megatron_commit", "megatron_patch_digest"):
        if fp.get(key) is not None:
            facts[key.replace("_", " ")] = str(fp[key])
    for pkg, key in (fp.get("kernel_cache_keys") or {}).items():
        if key:
            facts[f"{pkg} cache key"] = str(key)
    if "torch" not in facts and node.health.get("torch"):
        facts["torch"] = str(node.health["torch"])
    return facts


# --- the fleet checks ----------------------------------------------------------------------------


def gpu_speed(nodes: list[Node], slow: float) -> dict[str, Finding]:
    """Each GPU's GEMM and copy against the fleet median of its model."""
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    for n in nodes:
        for g in gpus(n):
            for key, _, _ in METRICS:
                if isinstance(g.get(key), (int, float)):
                    values[(str(g.get("name")), key)].append(float(g[key]))
    median = {k: statistics.median(v) for k, v in values.items()}
    out = {}
    for n in nodes:
        mine = gpus(n)
        if not mine:
            continue
        bad, evidence = [], []
        for g in mine:
            model = str(g.get("name"))
            for key, what, unit in METRICS:
                got, med = g.get(key), median.get((model, key))
                if not isinstance(got, (int, float)) or not med:
                    continue
                line = (f"GPU{g.get('index')} ({model}): {what} {got:g} {unit}, fleet median "
                        f"{med:g} over {len(values[(model, key)])} GPUs")
                evidence.append(line)
                if got < (1 - slow) * med:
                    bad.append(f"GPU{g.get('index')} ({model}) {what} {got:g} {unit} is "
                               f"{1 - got / med:.0%} below the fleet median {med:g}")
        if bad:
            out[n.host] = Finding("fleet.gpu_speed", Status.FAIL, f"{n.host}: " + "; ".join(bad),
                                  evidence, fix="a synchronous job runs at its slowest GPU: "
                                  f"exclude {n.host}, check clocks and cooling (nvidia-smi -q "
                                  "-d PERFORMANCE), run dcgmi diag -r 3")
        else:
            out[n.host] = Finding("fleet.gpu_speed", Status.PASS,
                                  f"{n.host}: {len(mine)} GPU(s) within {slow:.0%} of the fleet "
                                  "median", evidence)
    return out


def drift(nodes: list[Node]) -> dict[str, Finding]:
    """Fingerprint values that differ from the fleet's majority, named with the odd value."""
    facts = {n.host: fingerprint_facts(n) for n in nodes}
    odd: dict[str, list[str]] = defaultdict(list)
    keys = sorted({k for f in facts.values() for k in f})
    for key in keys:
        have = {h: f[key] for h, f in facts.items() if key in f}
        if len(have) < 2:
            continue
        counts = Counter(have.values())
        usual, n_usual = counts.most_common(1)[0]
        if len(counts) == 1:
            continue
        if n_usual * 2 > len(have):
            for h, v in have.items():
                if v != usual:
                    odd[h].append(f"{key} {v} (the fleet's majority: {usual}, "
                                  f"{n_usual} of {len(have)} nodes)")
        else:
            for h, v in have.items():
                odd[h].append(f"{key} {v}: no majority in the fleet ("
                              + ", ".join(f"{val} on {c}" for val, c in counts.items()) + ")")
    out = {}
    for n in nodes:
        if odd[n.host]:
            out[n.host] = Finding("fleet.drift", Status.WARN,
                                  f"{n.host}: " + "; ".join(odd[n.host]),
                                  [f"{k}: {v}" for k, v in sorted(facts[n.host].items())],
                                  fix="make every node run the same driver and environment "
                                      "(invoke setup from the same profile and lock)")
        elif facts[n.host]:
            out[n.host] = Finding("fleet.drift", Status.PASS,
                                  f"{n.host}: {len(facts[n.host])} fingerprint values agree "
                                  "with the fleet", [f"{k}: {v}" for k, v in
                                                     sorted(facts[n.host].items())])
    return out


def nvlink(nodes: list[Node]) -> dict[str, Finding]:
    """Per GPU NVLink count against nodes with as many GPUs (their median)."""
    links = {n.host: v for n in nodes if (v := _nvlinks(n)) is not None}
    by_size: dict[int, list[int]] = defaultdict(list)
    for per_gpu in links.values():
        by_size[len(per_gpu)] += list(per_gpu.values())
    out = {}
    for host, per_gpu in links.items():
        if len(per_gpu) < 2:
            continue
        med = statistics.median(by_size[len(per_gpu)])
        below = {g: c for g, c in per_gpu.items() if c < med}
        evidence = [f"{g}: {c} NVLinks" for g, c in per_gpu.items()]
        if below:
            fewest = min(below.values())
            culprits = [g for g, c in below.items() if c == fewest]
            out[host] = Finding(
                "fleet.nvlink", Status.FAIL,
                f"{host}: {', '.join(culprits)} {'has' if len(culprits) == 1 else 'have'} "
                f"{fewest} NVLinks against the fleet's {med:g} per GPU"
                + (f"; {len(below) - len(culprits)} other GPU(s) lost links to "
                   f"{'it' if len(culprits) == 1 else 'them'}" if len(below) > len(culprits)
                   else ""), evidence,
                fix=f"exclude {host}; have the NVLink/NVSwitch fabric checked "
                    "(nvidia-smi nvlink -s, fabric manager logs)")
        else:
            out[host] = Finding("fleet.nvlink", Status.PASS,
                                f"{host}: {len(per_gpu)} GPUs with the fleet's {med:g} "
                                "NVLinks each", evidence)
    return out


def ib(nodes: list[Node]) -> dict[str, Finding]:
    """Active IB/RoCE ports and their rates against the node's peers."""
    ports = {n.host: p for n in nodes if (p := _ib(n)) is not None}
    if not any(ports.values()):
        return {}
    counts = statistics.median(len(p) for p in ports.values())
    rates: dict[str, list[float]] = defaultdict(list)
    for p in ports.values():
        for port in p:
            rates[port.link_layer].append(port.rate_gbps)
    typical = {layer: statistics.median(r) for layer, r in rates.items()}
    out = {}
    for n in nodes:
        mine = ports.get(n.host)
        if mine is None:
            out[n.host] = Finding("fleet.ib", Status.WARN, f"{n.host}: no ibstatus recorded while "
                                  "its peers have active IB ports",
                                  fix="install infiniband-diags on the node and re-run")
            continue
        problems = [f"{p.name} at {p.rate_gbps:g} Gb/s, its peers at {typical[p.link_layer]:g}"
                    for p in mine if p.rate_gbps < typical[p.link_layer]]
        if len(mine) < counts:
            problems.insert(0, f"{len(mine)} active port(s), its peers {counts:g}")
        evidence = [f"{p.name} {p.link_layer} {p.rate_gbps:g} Gb/s" for p in mine]
        if problems:
            out[n.host] = Finding("fleet.ib", Status.FAIL, f"{n.host}: " + "; ".join(problems),
                                  evidence, fix=f"exclude {n.host}; reseat or replace the "
                                  "cable/transceiver, check the switch port (ibstatus, "
                                  "ibdiagnet)")
        else:
            out[n.host] = Finding("fleet.ib", Status.PASS, f"{n.host}: {len(mine)} active port(s) "
                                  "at the fleet's rate", evidence)
    return out


def _node_findings(node: Node, profile: Profile) -> list[Finding]:
    """Every single-node check, and gpu_health's own findings, with the host in front."""
    own = checks.run_all(node.snapshot, profile)
    for name, doc in (("gpu_health.json", node.health), ("fingerprint.json", node.fingerprint)):
        if "_error" in doc:
            own.append(Finding("fleet.input", Status.WARN, f"{doc['_error']}: left out of the "
                               "comparison", [f"file: {node.host}/{name}"],
                               fix="re-run `invoke preflight` on the node, or remove the file"))
    for f in node.health.get("findings", []) if isinstance(node.health.get("findings"),
                                                            list) else []:
        try:
            own.append(Finding.from_dict(f, f"{node.host}/gpu_health.json"))
        except UserError as e:  # one node's bad file is said, the fleet still compared
            own.append(Finding("fleet.input", Status.WARN, f"{e.message}: left out",
                               [f"file: {node.host}/gpu_health.json"], fix=e.fix))
    # the host in front of the summary; id, kind, evidence and fix as the check gave them
    return [dataclasses.replace(f, summary=f"{node.host}: {f.summary}") for f in own]


def analyse(nodes: list[Node], profile: Profile, *, slow: float = DEFAULT_SLOW,
            expected: list[str] | None = None) -> Report:
    """The fleet's verdict. `expected`: hosts that should have results (an allocation's nodes);
    one without a directory fails as having sent nothing."""
    fleet = [gpu_speed(nodes, slow), nvlink(nodes), ib(nodes), drift(nodes)]
    results = []
    for n in nodes:
        fs = _node_findings(n, profile) + [f[n.host] for f in fleet if n.host in f]
        results.append(NodeResult(n.host, sorted(fs, key=lambda f: f.status.rank)))
    have = {n.host for n in nodes}
    for host in expected or []:
        if host not in have:
            results.append(NodeResult(host, [Finding(
                "fleet.missing", Status.FAIL, f"{host}: sent no results (its preflight task failed "
                "or could not write the run directory)",
                fix=f"read srun.log in the run directory; exclude {host} until it answers")]))
    return Report(sorted(results, key=lambda r: r.host))


def plot(nodes: list[Node], path: Path, slow: float = DEFAULT_SLOW) -> bool:
    """Per-GPU GEMM and copy across the fleet, the median and the failing line; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [(n.host, g) for n in nodes for g in gpus(n)]
    if not rows:
        return False
    fig, axes = plt.subplots(2, 1, figsize=(max(7, 0.25 * len(rows) + 2), 6), sharex=True)
    labels = [f"{h} GPU{g.get('index')}" for h, g in rows]
    for ax, (key, what, unit) in zip(axes, METRICS, strict=True):
        vals = [float(g.get(key) or 0) for _, g in rows]
        by_model: dict[str, list[float]] = defaultdict(list)
        for (_, g), v in zip(rows, vals, strict=True):
            if v:
                by_model[str(g.get("name"))].append(v)
        med = {m: statistics.median(v) for m, v in by_model.items()}
        line = [med.get(str(g.get("name")), 0) for _, g in rows]
        colors = ["tab:red" if v < (1 - slow) * m else "tab:blue" for v, m in zip(vals, line,
                                                                                   strict=True)]
        ax.bar(range(len(vals)), vals, color=colors)
        ax.step(range(len(vals)), line, where="mid", color="black", linewidth=1,
                label="fleet median of the GPU's model")
        ax.step(range(len(vals)), [(1 - slow) * m for m in line], where="mid", color="tab:red",
                linestyle="--", linewidth=1, label=f"{slow:.0%} below: fails")
        ax.set_ylabel(f"{what} ({unit})")
        ax.legend(loc="lower right", fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    axes[-1].set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
