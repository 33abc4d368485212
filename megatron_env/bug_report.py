"""`invoke report`: one block to paste into a bug report, with no secret in it.

Trackers ask for "your environment" and get it by hand, incompletely, sometimes with a token in
it. This gathers what an issue needs in one go (OS, Python, driver, GPUs and topology, nvcc,
torch/CUDA/NCCL/cuDNN, the profile and lock digests, the kernel builds with their cache keys
and whether their compiled modules import, Megatron's commit and patches, the findings of
`invoke check` run now, and the NCCL_*/CUDA_*/TORCH_* variables) and reports what is there
when nothing has been built yet.

`gather` is the only part with side effects (it probes the host and the environment, each
through the modules that own that knowledge); `render` is pure, the redaction is
megatron_env.redact's (shared with the snapshot's env.txt): a variable whose name says it holds
a secret is shown as `<redacted>`, every other value it prints (NCCL_*, MEGATRON_ENV_* ...)
passes the whole redaction (structure, then shape: what looks generated is masked), and as a
last pass the values of every secret-named variable of the process are removed wherever they
appear.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron_env import REPO_ROOT, __version__, files, output, proc, redact
from megatron_env.errors import UserError
from megatron_env.host import checks, parsers, snapshot
from megatron_env.profile import Profile

if TYPE_CHECKING:
    from megatron_env.recipes.recipe import Package

PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "MEGATRON_ENV_")


def variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The NCCL_/CUDA_/TORCH_/PYTORCH_/MEGATRON_ENV_ variables, secrets redacted. Pure."""
    return redact.variables({k: v for k, v in environ.items() if k.startswith(PREFIXES)})


# --------------------------------------------------------------------------- gathering


def gather(profile: Profile, prefix: Path, environ: Mapping[str, str] | None = None,
           imports: bool = False) -> dict[str, Any]:
    """Everything the report shows, probed now. Each part says why when it cannot be had.

    The environment is read from its files (versions from metadata, torch/version.py and
    TorchConfig.cmake; compiled modules by their files), in about a second; `imports` imports
    torch and every compiled module instead (10-30 s: what a build check does)."""
    from megatron_env import digest
    from megatron_env.kernels import build
    from megatron_env.megatron import checkout
    from megatron_env.pyenv import env, probe

    environ = os.environ if environ is None else environ
    facts: dict[str, Any] = {"megatron_env": _self_version(), "os": _os(),
                             "python": {"tool": platform.python_version()}}
    with tempfile.TemporaryDirectory(prefix="megatron-env-report-") as tmp:
        snap = snapshot.collect(Path(tmp), echo=lambda *_: None)
        facts.update(_host(snap), nvcc_path=proc.which("nvcc"))
        findings = checks.run_all(snap, profile)
    facts["check"] = [f.to_dict() for f in findings]
    facts["topology"] = next((f.summary for f in findings if f.id == "gpu.topology"), None)
    facts["profile"] = {"name": profile.name,
                        "profile.toml": digest.of_file(profile.path),
                        profile.lock_file.name: (digest.of_file(profile.lock_file)
                                         if (profile.lock_file).exists() else None)}
    py = env.interpreter(prefix)
    kernels = list(build.packages(profile).values())
    env_facts: dict[str, Any] = {"prefix": str(prefix)}
    seen: dict[str, Any] | None = None
    if py.exists():
        env_facts["resolved"] = str(prefix.resolve())
        try:
            modules = (*(m for k in kernels for m in k.modules), *checkout.MODULES)
            seen = (probe.probe(py, *modules) if imports
                    else probe.metadata(py, *modules))
        except UserError as e:
            env_facts["error"] = e.message
    else:
        env_facts["error"] = "not built (run `invoke setup` or `invoke env`)"
    facts["environment"] = env_facts
    if seen:
        facts["python"]["environment"] = seen.get("python")
        facts["torch"] = {k: seen.get(k) for k in ("torch", "torch_cuda", "nccl", "cudnn")}
    facts["kernels"] = [_kernel(k, py, profile, seen) for k in kernels]
    facts["megatron"] = _megatron(profile, seen)
    facts["megatron"]["unverified"] = setup_unverified(prefix)
    facts["variables"] = variables(environ)
    return facts


def _self_version() -> dict[str, Any]:
    from megatron_env import project

    if project.how() == "shipped":  # a wheel: no checkout to ask
        return {"version": __version__, "commit": None, "modified": None}
    head = proc.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, timeout=30)
    dirty = proc.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                     timeout=30)
    return {"version": __version__, "commit": head.stdout.strip() if head.ok else None,
            "modified": bool(dirty.stdout.strip()) if dirty.ok else None}


def _os() -> str:
    try:
        release = dict(line.split("=", 1) for line in
                       Path("/etc/os-release").read_text().splitlines() if "=" in line)
        name = release.get("PRETTY_NAME", "").strip('"')
    except OSError:
        name = ""
    return f"{name or platform.system()} (kernel {platform.release()}, {platform.machine()})"


def _host(snap: snapshot.Snapshot) -> dict[str, Any]:
    """Driver, GPUs and nvcc as the snapshot recorded them."""
    nvml = snap.nvml()
    out: dict[str, Any] = {"driver": nvml.get("driver_version"), "gpus": nvml.get("gpus", []),
                           "nvml_error": nvml.get("error")}
    if not out["driver"] and (smi := snap.text("nvidia-smi.txt")):
        with contextlib.suppress(parsers.ParseError):
            out["driver"] = parsers.driver_version(smi)
    cuda_driver = nvml.get("cuda_driver_version")
    out["driver_cuda"] = (f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}"
                          if isinstance(cuda_driver, int) else None)
    nvcc = snap.text("nvcc-version.txt")
    try:
        out["nvcc"] = parsers.nvcc_release(nvcc) if nvcc else None
    except parsers.ParseError:
        out["nvcc"] = None
    return out


def _kernel(pkg: Package, py: Path, profile: Profile,
            probe: dict[str, Any] | None) -> dict[str, Any]:
    from megatron_env.kernels import build

    row: dict[str, Any] = {"name": pkg.name, "pin": pkg.pin, "modules": list(pkg.modules)}
    if probe is None:
        row.update(installed=None, imports={}, cache_key=None, why="no environment")
        return row
    row["installed"] = probe["dists"].get(pkg.name)
    if "imported" in probe:
        row["imports"] = {m: m in probe["imported"] for m in pkg.modules}
    else:
        row["found"] = {m: m in probe["found"] for m in pkg.modules}
    if not probe.get("torch"):
        row.update(cache_key=None, why="torch is not installed in the environment")
        return row
    if probe.get("cxx11_abi") is None:
        row.update(cache_key=None, why="torch's C++ ABI is not recorded in its files "
                                       "(`invoke report --imports` asks torch)")
        return row
    facts = {"torch": probe["torch"], "cuda": probe.get("torch_cuda"), "abi": probe["cxx11_abi"],
             "tag": probe.get("cache_tag"), "platlib": probe.get("platlib")}
    try:
        plan = build.plan(pkg, py, profile.archs, facts=facts)
        row["cache_key"] = plan.key
        row["cached"] = any((build.cache_dir() / "wheels" / plan.key).glob("*.whl"))
    except UserError as e:
        row.update(cache_key=None, why=e.message)
    return row


def _megatron(profile: Profile, probe: dict[str, Any] | None) -> dict[str, Any]:
    from megatron_env.megatron import checkout

    m = profile.megatron
    out: dict[str, Any] = {"tag": m["tag"], "commit": m["commit"],
                           "patches": [p.name for p in checkout.patch_series(profile)]}
    stamp = checkout.source_dir(profile) / checkout.STAMP
    if stamp.exists():
        found, _ = files.read_json(stamp)
        recorded = found if isinstance(found, dict) else {}
        out.update(checkout=str(stamp.parent), commit=recorded.get("commit", m["commit"]),
                   patches=recorded.get("patches", out["patches"]))
    else:
        out["checkout"] = None
    out["installed"] = (probe or {}).get("dists", {}).get("megatron-core")
    return out


#: The setup steps that leave a stamp whenever they succeed, up to the one that imports
#: Megatron (the builds step is skipped without a GPU or with --no-builds, so its absence says
#: nothing; sources and patches run every time and leave none).
SETUP_STAMPED = ("lock", "env", "megatron", "verify")
_DIGEST = re.compile(r"[0-9a-f]{16}")


def setup_unverified(prefix: Path) -> str | None:
    """Why `invoke setup` has not proven Megatron in `prefix` (None: it has). The one place
    that reads the chain's stamps (`<prefix>.setup/<step>.json`, {"digest", "detail", "at"}):
    a step that fails removes its stamp, so a setup failing at any of these steps shows here
    even while the environment's files look complete."""
    stamps = prefix.with_name(prefix.name + ".setup")
    at: dict[str, datetime.datetime] = {}
    for step in SETUP_STAMPED:
        f = stamps / f"{step}.json"
        if not f.exists() and not f.is_symlink():
            return f"setup's {step} step has no stamp: it failed or has not run"
        doc, why = files.read_json(f)  # any content, depth or file kind: never raises or blocks
        if why:
            return f"setup's {step} step: its stamp {f.name} cannot be read ({why})"
        if not isinstance(doc, dict) or not _DIGEST.fullmatch(str(doc.get("digest"))):
            return f"setup's {step} step: {f.name} is not a stamp"
        with contextlib.suppress(TypeError, ValueError):
            at[step] = datetime.datetime.strptime(str(doc.get("at")), "%Y-%m-%dT%H:%M:%S%z")
    # the imports proven before Megatron was last installed (`invoke megatron` alone) prove
    # nothing about this install
    if {"megatron", "verify"} <= at.keys() and at["verify"] < at["megatron"]:
        return ("setup's verify step has not run since its megatron step installed Megatron; "
                "`invoke setup --verify-deep` proves it")
    return None


# --------------------------------------------------------------------------- rendering


def _gpus(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return "none visible"
    kinds: dict[str, int] = {}
    for g in gpus:
        label = (f"{g.get('name', '?')} ({g.get('memory_total', 0) / 2**30:.0f} GiB"
                 + (f", sm {g['compute_capability']}" if g.get("compute_capability") else "")
                 + ")")
        kinds[label] = kinds.get(label, 0) + 1
    return ", ".join(f"{n} x {k}" for k, n in kinds.items())


def megatron_line(mg: dict[str, Any]) -> str:
    """The report's Megatron row: tag and commit, installed or not, fetched, verified."""
    return (f"{mg['tag']} @ {mg['commit'][:12]}"
            + (f", installed {mg['installed']}" if mg.get("installed") else ", not installed")
            + ("" if mg.get("checkout") else " (not fetched)")
            + (f"; not verified ({mg['unverified']})" if mg.get("unverified") else
               "; verified by setup" if "unverified" in mg else ""))


def render(facts: dict[str, Any]) -> str:
    """The block for a bug report (Markdown code fence around aligned lines). Pure."""
    me = facts["megatron_env"]
    py = facts["python"]
    t = facts.get("torch") or {}
    prof = facts["profile"]
    envf = facts["environment"]
    mg = facts["megatron"]
    rows = [
        ("megatron-env", f"{me['version']}" + (f" (git {me['commit']}"
                                               + (", modified" if me["modified"] else "") + ")"
                                               if me["commit"] else "")),
        ("os", facts["os"]),
        ("python", f"{py['tool']} (this tool)" + (f", {py['environment']} (environment)"
                                                  if py.get("environment") else "")),
        ("driver", (facts["driver"] or f"none ({facts.get('nvml_error') or 'no NVIDIA driver'})")
         + (f" (CUDA {facts['driver_cuda']})" if facts.get("driver_cuda") else "")),
        ("gpus", _gpus(facts["gpus"])),
        ("topology", facts.get("topology") or "unknown"),
        ("nvcc", (facts["nvcc"] or "not found") + (f" ({facts['nvcc_path']})"
                                                   if facts.get("nvcc_path") else "")),
        ("torch", f"{t['torch']}, CUDA {t['torch_cuda']}, NCCL {t['nccl'] or '?'}, "
                  f"cuDNN {t['cudnn'] or '?'}"
         if t else "n/a (no environment)"),
        ("profile", f"{prof['name']}: profile.toml {prof['profile.toml'][:19]}, "
                    + ", ".join(f"{k} {v[:19] if v else 'missing'}" for k, v in prof.items()
                                if k not in ("name", "profile.toml"))),
        ("environment", envf["prefix"] + (f" -> {envf['resolved']}" if envf.get("resolved")
                                          else "") + (f": {envf['error']}"
                                                      if envf.get("error") else "")),
        ("megatron", megatron_line(mg)),
        ("patches", ", ".join(mg["patches"]) or "none"),
    ]
    width = max(len(k) for k, _ in rows) + 2
    out = ["```", *(f"{k:<{width}}{v}" for k, v in rows), "", "kernel builds"]
    deep = any("imports" in k for k in facts["kernels"])
    kt = [("package", "pin", "installed",
           "compiled modules import" if deep else "compiled modules found", "cache key")]
    for k in facts["kernels"]:
        imports = k.get("imports") or k.get("found") or {}
        bad = [m for m, ok in imports.items() if not ok]
        status = ("n/a" if not imports else f"no: {', '.join(bad)}" if bad else
                  f"yes ({len(imports)})")
        key = (k["cache_key"] + (" (cached)" if k.get("cached") else " (not in cache)")
               if k.get("cache_key") else f"n/a: {k.get('why', '')}")
        kt.append((k["name"], k["pin"][:12], k.get("installed") or "no", status, key))
    widths = [max(len(r[i]) for r in kt) for i in range(4)]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
            for r in kt]
    out += ["", "invoke check (now)"]
    idw = max((len(f["id"]) for f in facts["check"]), default=0)
    out += [f"  {f['id']:<{idw}}  {f['status']:<4}  {f['summary']}" for f in facts["check"]]
    out += ["", "variables (NCCL_*, CUDA_*, TORCH_*, PYTORCH_*, MEGATRON_ENV_*)"]
    out += [f"  {k}={v}" for k, v in facts["variables"].items()] or ["  none set"]
    out.append("```")
    return "\n".join(out) + "\n"


def main(profile: Profile, prefix: Path, as_json: bool,
         environ: Mapping[str, str] | None = None, imports: bool = False) -> str:
    """The report's text (JSON or the block), scrubbed of secrets."""
    environ = os.environ if environ is None else environ
    facts = gather(profile, prefix, environ, imports)
    text = json.dumps(facts, indent=2) + "\n" if as_json else render(facts)
    return redact.scrub(text, environ)


def write(text: str) -> None:
    output.block(text)
