"""On a GPU, the built kernels proven by one small call each, not only imported:
scripts/gpu_health.py run once on one GPU (a small GEMM, no attention timing), and its
`kernel.<check>` findings read for the kernels the setup built (each recipe names its check,
Recipe.gpu_check: one small call of the package against PyTorch). `verdicts` is pure: a
gpu_health results document in, a verdict per kernel out; `run` is the one call of the program."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from megatron_env import REPO_ROOT, files, proc, recipes
from megatron_env.errors import UserError

SCRIPT = Path("scripts") / "gpu_health.py"
SIZE = 1024  # the GEMM edge: a proof that it computes, not a speed test


def checks(kernels: list[str]) -> dict[str, str]:
    """kernel -> the gpu_health check that proves it (kernels without one left out)."""
    return {k: c for k in kernels if (c := recipes.get(k).gpu_check)}


def verdicts(doc: Any, wanted: dict[str, str]) -> dict[str, tuple[str, str]]:
    """kernel -> (pass | fail | skip | absent, the finding's summary) from a gpu_health
    results document; "absent": the document has no finding of that check."""
    found = {f.get("id"): f for f in (doc.get("findings") or [] if isinstance(doc, dict) else [])
             if isinstance(f, dict)}
    out = {}
    for kernel, check in wanted.items():
        f = found.get(f"kernel.{check}")
        out[kernel] = ((str(f.get("status")), str(f.get("summary", ""))) if f
                       else ("absent", f"gpu_health reported no kernel.{check}"))
    return out


def run(python: Path, wanted: dict[str, str]) -> dict[str, tuple[str, str]]:
    """gpu_health.py on GPU 0 with `python`; -> verdicts. A program that ends without its
    results is a UserError naming its log's last lines."""
    script = REPO_ROOT / SCRIPT
    if not script.is_file():
        return {k: ("skip", f"{SCRIPT} is not in this installation") for k in wanted}
    with tempfile.TemporaryDirectory(prefix="megatron-env-kernel-proof-") as tmp:
        r = proc.run([python, script, "--size", str(SIZE), "--no-attention", "--out", tmp],
                     env={**os.environ, "LOCAL_RANK": "0"}, timeout=900, cwd=tmp)
        doc, why = files.read_json(Path(tmp) / "results-rank0.json")
    if why:
        raise UserError(f"{SCRIPT} ended without results (exit {r.returncode}): {r.tail(5)}",
                        fix=f"run `{python} {script} --size {SIZE}` and read its error",
                        kind="verify.gpu-check-failed")
    return verdicts(doc, wanted)
