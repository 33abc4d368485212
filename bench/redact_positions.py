#!/usr/bin/env python3
"""Credentials by where they are given, and generated names that are none: the project's
redaction beside detect-secrets and credsweeper on the same generated corpus, and what
masking a line costs now against another revision's redaction, in one run.

The corpus is tests/redact_positions.py's: POSITIONS (a tool's password option, a label in any
language, a value on the line after its label, config and connection syntaxes, reprs) x
VALUE_KINDS x CARRIERS, and HARMLESS generated names in their PLACES, each split into "tune"
(what the redaction was fixed on) and "held" (never looked at while fixing). For each side:
- leaks: cases where any part of the value is printed (tests/redact_positions.leaked). Ours is
  counted over every carrier and over the text alone; a scanner is given the text alone as a
  file, and what it reports is masked in it (a scanner used as a redactor);
- masked: harmless texts changed by ours, or in which a scanner reports anything.
Timing: redact.text and redact.Lines over the real lines of tests/fixtures (job, NCCL, ninja,
build-progress logs), this checkout against `--base` (default main) with only the redaction
taken from it (`git archive`), each in a child Python, best of `--rounds` alternated rounds
of best of 5, each from cold memo caches. CPU time of the child (`time.process_time`), not
wall time: on a machine shared with other work, wall time moved by 2x between runs.

    pip install detect-secrets            # in the project's environment
    python bench/redact_positions.py [--base main] [--rounds 5] [--no-credsweeper]

credsweeper is installed into a throwaway environment (`uv venv` + `uv pip install
credsweeper`) under a temporary directory, and run once over a directory of the cases; where it
does not install, its column says so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megatron_env import redact  # noqa: E402
from tests import redact_positions as gen  # noqa: E402

Reported = Callable[[list[str]], list[list[str]]]  # texts -> the values reported in each


def detect_secrets(tmp: Path) -> Reported | None:
    try:
        from detect_secrets.core.scan import scan_file
        from detect_secrets.settings import default_settings
    except ImportError:
        return None

    def run(texts: list[str]) -> list[list[str]]:
        out = []
        with default_settings():
            for text in texts:
                f = tmp / "case.txt"
                f.write_text(text)
                out.append([str(x.secret_value) for x in scan_file(str(f)) if x.secret_value])
        return out
    return run


def credsweeper(tmp: Path) -> Reported | str:
    """credsweeper as a redactor: the one beside this Python where it is installed, else one
    installed into a throwaway environment."""
    exe = Path(sys.executable).parent / "credsweeper"
    venv = tmp / "credsweeper-venv"
    if not exe.exists():
        try:
            subprocess.run(["uv", "venv", "-q", "-p", sys.executable, str(venv)], check=True,
                           capture_output=True, timeout=300)
            subprocess.run(["uv", "pip", "install", "-q", "-p", str(venv), "credsweeper"],
                           check=True, capture_output=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            return f"not installed: {type(e).__name__}"
        exe = venv / "bin" / "credsweeper"

    def run(texts: list[str]) -> list[list[str]]:
        cases = tmp / "cases"
        shutil.rmtree(cases, ignore_errors=True)
        cases.mkdir()
        for i, text in enumerate(texts):
            (cases / f"{i:05d}.txt").write_text(text)
        report = tmp / "credsweeper.json"
        subprocess.run([str(exe), "--path", str(cases), "--save-json",
                        str(report)], check=True, capture_output=True, timeout=3600)
        found: list[list[str]] = [[] for _ in texts]
        for cand in json.loads(report.read_text()):
            for ld in cand.get("line_data_list", []):
                if ld.get("value"):
                    found[int(Path(ld["path"]).stem)].append(ld["value"])
        return found
    return run


def as_redactor(text: str, values: list[str]) -> str:
    """What a scanner's findings would print: `text` with every reported value masked."""
    for v in sorted(values, key=len, reverse=True):
        text = text.replace(v, redact.REDACTED)
    return text


def quality(scanners: dict[str, Reported | str | None]) -> dict[str, object]:
    out: dict[str, object] = {}
    for side in ("tune", "held"):
        cases = gen.grid(side)
        alone = [c for c in cases if c.carrier == "alone"]
        ours_all = sum(bool(gen.leaked(gen.carry(c.carrier, c.text, lambda t: redact.text(t, {}),
                                                 lambda: redact.Lines({})), c.text,
                                       gen.secret_forms(c.position, c.value))) for c in cases)
        ours_alone = sum(bool(gen.leaked(redact.text(c.text, {}), c.text, gen.secret_forms(
            c.position, c.value))) for c in alone)
        harmless = gen.harmless(side)
        row: dict[str, object] = {
            "positions": len({c.position.name for c in cases}),
            "cases_all_carriers": len(cases), "cases_alone": len(alone),
            "ours_leaks_all_carriers": ours_all,
            "ours_leaks_all_carriers_pct": round(100 * ours_all / len(cases), 1),
            "ours_leaks_alone": ours_alone,
            "harmless": len(harmless),
            "ours_harmless_masked": sum(redact.text(h.text, {}) != h.text for h in harmless)}
        for name, scan in scanners.items():
            if not callable(scan):
                row[f"{name}"] = scan or "not installed"
                continue
            found = scan([c.text for c in alone])
            row[f"{name}_leaks_alone"] = sum(bool(gen.leaked(as_redactor(c.text, f), c.text,
                                                             gen.secret_forms(c.position,
                                                                              c.value)))
                                             for c, f in zip(alone, found, strict=True))
            row[f"{name}_harmless_masked"] = sum(bool(f) for f in scan([h.text for h in
                                                                      harmless]))
        out[side] = row
    return out


CHILD = r'''
import json, sys, time
from pathlib import Path
from megatron_env import redact
lines = []
for sub in ("job-logs", "nccl-logs", "ninja-logs", "build-progress"):
    for f in sorted((Path(sys.argv[1]) / sub).rglob("*")):
        if f.is_file() and f.suffix not in (".zst", ".gz"):
            lines += f.read_text(errors="replace").splitlines(True)


def clear():
    for name, mod in list(sys.modules.items()):
        if name.startswith("megatron_env.redact"):
            for obj in vars(mod).values():
                if hasattr(obj, "cache_clear"):
                    obj.cache_clear()


def best(fn):
    out = float("inf")
    for _ in range(5):
        clear()
        t = time.process_time()
        fn()
        out = min(out, time.process_time() - t)
    return out / len(lines) * 1e6


def stream():
    scrub = redact.Lines({})
    for line in lines:
        scrub(line)


print(json.dumps({"lines": len(lines),
                  "text_us_per_line": best(lambda: [redact.text(x, {}) for x in lines]),
                  "lines_us_per_line": best(stream)}))
'''


def measure(tree: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "tests" / "fixtures")],
                         cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def cost(base: str, rounds: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        shutil.copytree(ROOT / "megatron_env", tree / "megatron_env")
        shutil.rmtree(tree / "megatron_env" / "redact")
        (tree / "megatron_env" / "redact.py").unlink(missing_ok=True)
        listed = subprocess.run(["git", "ls-tree", "--name-only", base, "megatron_env/redact",
                                 "megatron_env/redact.py"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.split()
        archive = subprocess.run(["git", "archive", base, *listed], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        runs = [(measure(tree), measure(ROOT)) for _ in range(rounds)]
    out: dict[str, object] = {"base": base, "lines": runs[0][1]["lines"]}
    for key in ("text_us_per_line", "lines_us_per_line"):
        b, t = min(r[0][key] for r in runs), min(r[1][key] for r in runs)
        out[key] = {"base": round(b, 2), "this": round(t, 2), "this_over_base": round(t / b, 2)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="main")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-credsweeper", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="redact-positions-") as t:
        tmp = Path(t)
        scanners: dict[str, Reported | str | None] = {"detect_secrets": detect_secrets(tmp)}
        if not args.no_credsweeper:
            scanners["credsweeper"] = credsweeper(tmp)
        result: dict[str, object] = {"quality": quality(scanners)}
    if not args.no_timing:
        result["cost"] = cost(args.base, args.rounds)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
