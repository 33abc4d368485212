"""Pure parsers for the raw text a snapshot holds.

Each parser takes text exactly as a command printed it (ANSI escapes, tabs, old and new layouts)
and returns plain data, or raises `ParseError` saying what it could not find. Checks turn a
`ParseError` into a finding, so garbage input is reported, never a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class ParseError(ValueError):
    """The text is not what the parser expects; the message says what was missing."""


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


# --- nvidia-smi -----------------------------------------------------------------------------

_DRIVER = re.compile(r"Driver Version\s*:?\s*(\d+\.\d+(?:\.\d+)?)")
_SMI_CUDA = re.compile(r"CUDA Version\s*:?\s*(\d+\.\d+)")


def driver_version(text: str) -> str:
    """The driver version from `nvidia-smi` or `nvidia-smi -q`."""
    m = _DRIVER.search(strip_ansi(text))
    if not m:
        raise ParseError("no 'Driver Version' in the text")
    return m.group(1)


def driver_cuda_version(text: str) -> str | None:
    """The newest CUDA the driver supports, as `nvidia-smi` prints it; None when absent."""
    m = _SMI_CUDA.search(strip_ansi(text))
    return m.group(1) if m else None


@dataclass
class GpuReasons:
    """Clock event ("throttle") reasons of one GPU from `nvidia-smi -q`."""

    bus_id: str
    active: list[str] = field(default_factory=list)


def clock_event_reasons(text: str) -> list[GpuReasons]:
    """Active clock event reasons per GPU, from the full or `-d PERFORMANCE` output of `-q`.

    Drivers before 535 call the section "Clocks Throttle Reasons", later ones "Clocks Event
    Reasons"; both are read. The "... Counters" section that follows holds durations, not states.
    """
    gpus: list[GpuReasons] = []
    current: GpuReasons | None = None
    in_section = False
    indent = 0
    for raw in strip_ansi(text).splitlines():
        line = raw.rstrip()
        if m := re.match(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", line):
            current = GpuReasons(m.group(1))
            gpus.append(current)
            in_section = False
            continue
        stripped = line.strip()
        if re.fullmatch(r"Clocks? (Event|Throttle) Reasons", stripped):
            in_section = current is not None
            indent = len(line) - len(line.lstrip())
            continue
        if in_section:
            this_indent = len(line) - len(line.lstrip())
            if not stripped or this_indent <= indent:
                in_section = False
                continue
            if ":" in stripped:
                name, _, state = stripped.partition(":")
                if state.strip() == "Active":
                    assert current is not None
                    current.active.append(name.strip())
    if not gpus:
        raise ParseError("no 'GPU xxxxxxxx:xx:xx.x' section")
    return gpus


# --- nvidia-smi topo -m ---------------------------------------------------------------------

_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


@dataclass
class Topology:
    """The GPU-to-GPU part of `nvidia-smi topo -m`: `link[i][j]` is a cell such as NV18 or SYS."""

    gpus: list[str]
    link: list[list[str]]
    nics: list[str] = field(default_factory=list)

    def pairs(self) -> list[tuple[int, int, str]]:
        n = len(self.gpus)
        return [(i, j, self.link[i][j]) for i in range(n) for j in range(i + 1, n)]


def topology(text: str) -> Topology:
    """Parse `nvidia-smi topo -m`: any driver's layout, tabs or spaces, 1 to 16+ GPUs.

    Column labels are the device tokens before "CPU Affinity" (GPUn, NICn, mlx5_n, ...); the
    "NIC Legend" block, when present, renames NICn to the device it stands for.
    """
    lines = [line.rstrip() for line in strip_ansi(text).splitlines()]
    header_at = next(
        (i for i, line in enumerate(lines) if re.match(r"^\s+GPU0\b", line)), None
    )
    if header_at is None:
        raise ParseError("no header line starting with GPU0")
    header = lines[header_at].split("CPU Affinity")[0].split()
    gpu_cols = [c for c in header if re.fullmatch(r"GPU\d+", c)]
    if not gpu_cols or header[: len(gpu_cols)] != gpu_cols:
        raise ParseError(f"header does not start with GPU columns: {lines[header_at]!r}")
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", "\n".join(lines), flags=re.M))
    nics = [legend.get(c, c) for c in header[len(gpu_cols):]]
    rows: dict[str, list[str]] = {}
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        if not tokens or not re.fullmatch(r"GPU\d+", tokens[0]):
            continue
        cells = tokens[1 : 1 + len(header)]
        if len(cells) < len(gpu_cols) or not all(_CELL.match(c) for c in cells[: len(gpu_cols)]):
            raise ParseError(f"row {tokens[0]} does not have {len(gpu_cols)} link cells: {line!r}")
        rows[tokens[0]] = cells[: len(gpu_cols)]
    missing = [g for g in gpu_cols if g not in rows]
    if missing:
        raise ParseError(f"no row for {', '.join(missing)}")
    link = [rows[g] for g in gpu_cols]
    for i, g in enumerate(gpu_cols):
        if link[i][i] != "X":
            raise ParseError(f"row {g} is not X on its own column")
    return Topology(gpus=gpu_cols, link=link, nics=nics)


def nvlink_count(cell: str) -> int:
    """NV18 -> 18; any PCIe-only cell -> 0."""
    return int(cell[2:]) if cell.startswith("NV") else 0


# --- ibstatus -------------------------------------------------------------------------------


@dataclass
class IbPort:
    device: str
    port: int
    state: str  # ACTIVE, DOWN, INIT, ARMED
    phys_state: str  # LinkUp, Disabled, Polling, ...
    rate_gbps: float
    link_layer: str  # InfiniBand or Ethernet (RoCE)

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"


def ibstatus(text: str) -> list[IbPort]:
    """Parse `ibstatus`: one block per port, "Infiniband device 'mlx5_0' port 1 status:"."""
    ports: list[IbPort] = []
    blocks = re.split(r"^Infiniband device '", strip_ansi(text), flags=re.M)
    for block in blocks[1:]:
        head = re.match(r"([^']+)' port (\d+) status:", block)
        if not head:
            raise ParseError(f"bad ibstatus block header: {block.splitlines()[0]!r}")
        fields = dict(
            (k.strip(), v.strip()) for k, v in re.findall(r"^\s*([a-z_ ]+):\s*(.*)$", block, re.M)
        )
        try:
            state = fields["state"].split(":")[-1].strip()
            phys = fields["phys state"].split(":")[-1].strip()
            rate = float(re.match(r"([\d.]+)", fields["rate"]).group(1))  # type: ignore[union-attr]
        except (KeyError, AttributeError, ValueError) as e:
            raise ParseError(f"ibstatus block for {head.group(1)} lacks {e}") from None
        ports.append(
            IbPort(head.group(1), int(head.group(2)), state, phys, rate,
                   fields.get("link_layer", "InfiniBand"))
        )
    if not ports and strip_ansi(text).strip():
        raise ParseError("no \"Infiniband device '...' port N status:\" block")
    return ports


# --- small ones -----------------------------------------------------------------------------


def ulimit(text: str) -> int | None:
    """`ulimit -l`: None for unlimited, else KiB."""
    value = strip_ansi(text).strip()
    if value == "unlimited":
        return None
    if not value.isdigit():
        raise ParseError(f"expected 'unlimited' or a number, got {value[:40]!r}")
    return int(value)


def nvcc_release(text: str) -> str:
    """`nvcc --version` -> "12.1"."""
    m = re.search(r"release (\d+\.\d+)", strip_ansi(text))
    if not m:
        raise ParseError("no 'release X.Y' in nvcc --version")
    return m.group(1)


def df_size_bytes(text: str) -> int:
    """`df -k PATH` -> the size of that filesystem in bytes."""
    lines = [line for line in strip_ansi(text).splitlines() if line.strip()]
    if len(lines) < 2 or not lines[0].startswith("Filesystem"):
        raise ParseError("expected df's 'Filesystem' header and one row")
    fields = " ".join(lines[1:]).split()
    if len(fields) < 2 or not fields[1].isdigit():
        raise ParseError(f"no size column in {lines[1]!r}")
    return int(fields[1]) * 1024


@dataclass
class Interface:
    name: str
    state: str
    addresses: list[str]


def ip_brief(text: str) -> dict[str, Interface]:
    """`ip -br addr` -> interface name -> state and addresses."""
    out: dict[str, Interface] = {}
    for line in strip_ansi(text).splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name = fields[0].split("@")[0]
        out[name] = Interface(name, fields[1], fields[2:])
    if not out and text.strip():
        raise ParseError("no 'NAME STATE ADDRESSES' lines")
    return out


def env_file(text: str) -> dict[str, str]:
    """env.txt (KEY=VALUE per line) -> dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            out[key] = value
    return out
