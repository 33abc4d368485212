"""The NCCL_DEBUG log analysis, shared with scripts/verify_nccl.py by loading that file.

Why this shape: verify_nccl.py must stay one file that runs anywhere torch runs (an NGC
container, a bare compute node) without this package, so it cannot import from megatron_env.
The other direction is free: this package always runs from its checkout (REPO_ROOT holds the
profiles, patches and scripts), and verify_nccl.py imports only the standard library at module
level (torch is imported inside main). So the analysis lives once, in the script, and is loaded
from it here by path; `invoke triage` and `verify_nccl.py --analyze-log` read a log the same
way, and a rule added there is a rule both use. Nothing is copied or generated.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from types import ModuleType
from typing import Any

from megatron_env import REPO_ROOT
from megatron_env.errors import UserError
from megatron_env.findings import Finding

SCRIPT = REPO_ROOT / "scripts" / "verify_nccl.py"
_NAME = "megatron_env._verify_nccl_script"


@cache
def script() -> ModuleType:
    """scripts/verify_nccl.py as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location(_NAME, SCRIPT)
    if spec is None or spec.loader is None or not SCRIPT.exists():
        raise UserError(f"{SCRIPT} is missing", fix="restore scripts/verify_nccl.py from git",
                        kind="install.incomplete")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


Analysis = dict[str, Any]  # verify_nccl.py's analysis of NCCL_DEBUG lines, as it writes it


def analyze(text: str) -> Analysis:
    """What the NCCL_DEBUG lines in `text` say (networks, transports, warnings and where)."""
    out: Analysis = script().analyze_log(text)
    return out


def findings(analysis: Analysis) -> list[Finding]:
    """The script's findings (plain dicts there) as this package's Finding."""
    return [Finding.from_dict(f, str(SCRIPT)) for f in script().log_findings(analysis)]


_KEEP = 500  # distinct warnings, devices... kept: a long log repeats a few


def merge(a: Analysis | None, b: Analysis) -> Analysis:
    """Two analyses of consecutive parts of one log as one (the log is analysed in batches so
    that it never has to be held whole)."""
    if a is None:
        return b

    def union(x: list[Any], y: list[Any]) -> list[Any]:
        return (x + [v for v in y if v not in x])[:_KEEP]

    where = {k: list(v) for k, v in a["warned_at"].items()}
    for w, at in b["warned_at"].items():
        if w in where or len(where) < _KEEP:
            where[w] = union(where.get(w, []), at)
    transports = dict(a["transports"])
    for k, n in b["transports"].items():
        transports[k] = transports.get(k, 0) + n
    return {"nccl_versions": sorted(set(a["nccl_versions"]) | set(b["nccl_versions"])),
            "networks": union(a["networks"], b["networks"]),
            "ib_devices": union(a["ib_devices"], b["ib_devices"]),
            "socket_interfaces": union(a["socket_interfaces"], b["socket_interfaces"]),
            "plugins": union(a["plugins"], b["plugins"]), "ib_missing": a["ib_missing"]
            or b["ib_missing"], "transports": transports,
            "warnings": union(a["warnings"], b["warnings"]), "warned_at": where,
            "hosts": sorted(set(a["hosts"]) | set(b["hosts"]))[:_KEEP],
            "nranks": max(a["nranks"], b["nranks"]), "gdrdma": a["gdrdma"] or b["gdrdma"]}
