#!/usr/bin/env python3
"""Benchmark and record: kernels removed from a ready node come back with one `invoke setup`.

On a node where `invoke setup ARGS` is ready (an adopted image, typically: `--bundle B --adopt
PY`), this program
  0. runs `invoke setup ARGS --json` once, untimed: it must say ready; it names the profile
     and the prefix, and the builds step's status (skipped on a machine without a GPU);
  a. uninstalls every kernel distribution the profile builds from the environment's
     interpreter (the one the setup recorded, built or adopted), keeping the wheel cache;
  b. runs `invoke setup ARGS`, timed (wall seconds of the process);
  c. imports every compiled module each kernel declares in that interpreter (torch first);
  d. runs `invoke preflight --local --json --profile P` and reads gpu.health's status;
and writes OUT/converge.json:

    {"kernels_removed": true, "setup_exit": 0, "imports_after": true, "seconds": N,
     "preflight_local_adopted": "pass", ...}

with the raw output of every command beside it (0-setup-before.txt ... 4-preflight.txt). On a
machine where the builds step is skipped (no GPU or toolkit, --no-builds) no kernel is
removed: kernels_removed is false, imports_after null, and `kernels_skipped` says why.

    python bench/converge.py --out bench/results/<date>-<gpu>-converge -- \\
        --bundle B --adopt /opt/torch/.venv/bin/python3

Run it from the project directory where `invoke setup` is run (--project otherwise); the tool
is the one `python -m invoke` imports there. Exit 0 when the record says the node converged.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Asked of the tool the project imports (not this file's checkout: a project may declare its
# own recipes): the profile's kernels, their compiled modules and the environment's
# interpreter (env.interpreter: the adopted one the setup recorded, else bin/python).
FACTS = r"""
import json, sys
from pathlib import Path
from megatron_env import profile
from megatron_env.kernels import build
from megatron_env.pyenv import env
from megatron_env.pyenv import uv
prof = profile.load(sys.argv[1])
print(json.dumps({"python": str(env.interpreter(Path(sys.argv[2]))), "uv": str(uv.exe()),
                  "kernels": {k.name: list(k.modules) for k in build.packages(prof).values()}}))
"""

IMPORTS = r"""
import importlib, json, sys
out = {"imported": {}, "errors": {}}
try:
    import torch
except Exception as e:
    out["errors"]["torch"] = "%s: %s" % (type(e).__name__, e)
for m in sys.argv[1:]:
    try:
        out["imported"][m] = getattr(importlib.import_module(m), "__file__", None)
    except Exception as e:
        out["errors"][m] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""

INSTALLED = r"""
import json, sys
from importlib import metadata
names = {d.metadata["Name"].lower().replace("_", "-") for d in metadata.distributions()
         if d.metadata["Name"]}
print(json.dumps(sorted(n for n in sys.argv[1:] if n.lower().replace("_", "-") in names)))
"""


def run(argv: list[str], log: Path, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `argv` in `cwd`, keep its whole output (stdout, then stderr) and exit in `log`."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    log.write_text(f"$ {shlex.join(argv)}\n{r.stdout}{r.stderr}"
                   f"exit {r.returncode}, {seconds:.2f} s\n")
    return r, seconds


def last_json(text: str) -> Any:
    """The JSON document that ends `text` (a probe's last line, or a --json block)."""
    lines = text.strip().splitlines()
    for i in range(len(lines)):
        try:
            return json.loads("\n".join(lines[i:]))
        except ValueError:
            continue
    raise SystemExit(f"no JSON at the end of: {text[-500:]!r}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="where converge.json and the logs go")
    p.add_argument("--project", type=Path, default=Path.cwd(),
                   help="the project directory `invoke setup` runs in (default: here)")
    p.add_argument("setup_args", nargs="*", help="after --: the `invoke setup` arguments")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    invoke = [sys.executable, "-m", "invoke"]
    setup = [*invoke, "setup", *a.setup_args]
    result: dict[str, Any] = {"kernels_removed": False, "setup_exit": None,
                              "imports_after": None, "seconds": None,
                              "preflight_local_adopted": None, "setup_args": a.setup_args}

    before, _ = run([*setup, "--json"], a.out / "0-setup-before.txt", a.project)
    doc = last_json(before.stdout)
    if before.returncode != 0 or doc.get("verdict") != "ready":
        print(f"converge: `invoke setup` is not ready before the run (exit {before.returncode});"
              f" see {a.out / '0-setup-before.txt'}", file=sys.stderr)
        return 2
    builds: dict[str, Any] = next((s for s in doc["steps"] if s["step"] == "builds"), {})
    facts_r, _ = run([sys.executable, "-c", FACTS, doc["profile"], doc["prefix"]],
                     a.out / "facts.txt", a.project)
    facts = last_json(facts_r.stdout)
    py, kernels = facts["python"], facts["kernels"]
    result.update(profile=doc["profile"], python=py, kernels=kernels,
                  builds_before=builds.get("status"))
    modules = [m for mods in kernels.values() for m in mods]

    if builds.get("status") == "skipped" or not kernels:
        result["kernels_skipped"] = builds.get("detail") or "the profile builds no kernels"
        (a.out / "1-uninstall.txt").write_text("nothing uninstalled: the builds step is "
                                               f"skipped here ({result['kernels_skipped']})\n")
    else:
        run([facts["uv"], "pip", "uninstall", "--python", py, *kernels],
            a.out / "1-uninstall.txt", a.project)
        left, _ = run([py, "-c", INSTALLED, *kernels], a.out / "1-installed-after.txt", a.project)
        result["kernels_removed"] = left.returncode == 0 and last_json(left.stdout) == []

    again, seconds = run(setup, a.out / "2-setup.txt", a.project)
    result.update(setup_exit=again.returncode, seconds=round(seconds, 2))

    if "kernels_skipped" not in result:
        imp, _ = run([py, "-c", IMPORTS, *modules], a.out / "3-imports.txt", a.project)
        got = last_json(imp.stdout) if imp.returncode == 0 else {"imported": {}}
        result["imports_after"] = all(m in got["imported"] for m in modules)

    pre, _ = run([*invoke, "preflight", "--local", "--json", "--profile", doc["profile"]],
                 a.out / "4-preflight.txt", a.project)
    try:
        nodes = last_json(pre.stdout)["nodes"]
        health = [f["status"] for n in nodes for f in n["findings"] if f["id"] == "gpu.health"]
        result["preflight_local_adopted"] = health[0] if health else "absent"
    except (SystemExit, KeyError, TypeError):
        result["preflight_local_adopted"] = f"no JSON (exit {pre.returncode})"
    result["preflight_exit"] = pre.returncode

    (a.out / "converge.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    converged = (result["setup_exit"] == 0 and result["imports_after"] is not False
                 and result["preflight_local_adopted"] in ("pass", "skip"))
    return 0 if converged else 1


if __name__ == "__main__":
    sys.exit(main())
