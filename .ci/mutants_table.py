"""The table of `nox -s mutants`: per module, its mutants, killed, survived, equivalent and kill
rate, from `mutmut results --all true` on stdin; with `--json PATH`, the same as
{"commit", "modules": {"megatron_env/<path>.py": {"killed", "survived", "equivalent"}}} with
every module of the package present (one whose mutants have not been run yet says so:
"not_run": true, counts null). Exit 1 when a module that ran is under 85% or all of them
together under 90%.

A mutant no test reaches ("no tests") counts as survived: a break nothing notices (it is also
counted apart, as no_tests: mutmut picks a mutant's tests by the calls it saw in the tests' own
process, so a function reached only through a front door run as a child process has "no
tests"); one that hangs the tests ("timeout") as killed. A mutant listed in
.ci/mutants-equivalent.txt (name, then why it cannot change behaviour) is counted as
equivalent, apart from killed and survived; an entry that names no mutant of this run is
reported, so the list cannot go stale unseen.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

MODULE_THRESHOLD = 0.85
OVERALL_THRESHOLD = 0.90
KILLED = {"killed", "timeout"}
NOT_RUN = {"not checked", "skipped", "check was interrupted by user"}
ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = Path(__file__).with_name("mutants-equivalent.txt")


def module_of(mutant: str) -> str:
    """megatron_env.bundle.layout.x_parse__mutmut_3 -> megatron_env.bundle.layout (methods are
    named xǁClassǁmethod__mutmut_N)."""
    return re.sub(r"\.x[_ǁ][^.]*__mutmut_\d+$", "", mutant)


def path_of(module: str, root: Path = ROOT) -> str:
    """megatron_env.pyenv.lock -> megatron_env/pyenv/lock.py (a package: its __init__.py)."""
    base = module.replace(".", "/")
    return f"{base}/__init__.py" if (root / base / "__init__.py").is_file() else f"{base}.py"


def modules(root: Path = ROOT) -> list[str]:
    """Every module of the package, as a path."""
    return sorted(str(p.relative_to(root)) for p in (root / "megatron_env").rglob("*.py")
                  if "__pycache__" not in p.parts and not p.name.startswith("."))


def equivalent(path: Path = EQUIVALENT) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            if not why.strip():
                raise SystemExit(f"{path.name}: {name} gives no reason")
            out[name] = why.strip()
    return out


def parse(lines: list[str]) -> dict[str, str]:
    """mutant name -> status, from `mutmut results --all true`."""
    results = {}
    for line in lines:
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            results[name] = status
    return results


def count(results: dict[str, str], allowed: dict[str, str]) -> dict[str, Counter[str]]:
    """module path -> Counter of killed / survived / equivalent / not run."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for name, status in results.items():
        c = counts[path_of(module_of(name))]
        if status in NOT_RUN:
            c["not run"] += 1
        elif name in allowed:
            c["equivalent"] += 1
        else:
            c["killed" if status in KILLED else "survived"] += 1
            c["no tests"] += status == "no tests"
    return counts


def mutated(path: str, root: Path = ROOT) -> bool:
    """mutmut made this module's mutants (its mutants/<path>.meta exists): a module with no
    results then has none to make, where one without a .meta was never mutated."""
    return (root / "mutants" / (path + ".meta")).is_file()


def table(counts: dict[str, Counter[str]], every: list[str],
          made: Callable[[str], bool] = mutated) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for path in every:
        c = counts.get(path, Counter())
        ran = c["killed"] + c["survived"] + c["equivalent"]
        if (c["not run"] and not ran) or (path not in counts and not made(path)):
            out[path] = {"killed": None, "survived": None, "equivalent": None, "not_run": True}
        else:
            # no_tests: of the survivors, those no test reached in the tests' own process
            # (mutmut's stats do not follow a front door run as a child process)
            out[path] = {"killed": c["killed"], "survived": c["survived"],
                         "equivalent": c["equivalent"], "no_tests": c["no tests"]}
            if c["not run"]:
                out[path]["not_run_mutants"] = c["not run"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the per-module table here")
    ap.add_argument("--note", default="", help="how this run was made, kept in the JSON")
    ap.add_argument("--commit", help="the commit whose code was mutated (default: HEAD)")
    args = ap.parse_args(argv)
    results = parse(sys.stdin.read().splitlines())
    allowed = equivalent()
    counts = count(results, allowed)
    rows = table(counts, modules())
    failed = []
    print(f"{'module':46} {'killed':>6} {'survived':>8} {'equiv':>5} {'rate':>6}")
    killed = survived = 0
    for path, row in rows.items():
        if row.get("not_run"):
            print(f"{path:46} {'not run':>6}")
            continue
        c = counts.get(path, Counter())
        k, s, e = c["killed"], c["survived"], c["equivalent"]
        killed, survived = killed + k, survived + s
        rate = k / (k + s) if k + s else 1.0
        failed += [path] if rate < MODULE_THRESHOLD else []
        print(f"{path:46} {k:6} {s:8} {e:5} {rate:6.1%}" + ("" if k + s else "  (no mutants)"))
    overall = killed / (killed + survived) if killed + survived else 1.0
    not_run = [p for p, r in rows.items() if r.get("not_run")]
    print(f"{'all that ran':46} {killed:6} {survived:8} {'':5} {overall:6.1%}; "
          f"{len(rows) - len(not_run)} of {len(rows)} modules ran")
    for name in sorted(set(allowed) - set(results)):
        print(f"stale entry in {EQUIVALENT.name}: {name}", file=sys.stderr)
    if args.json:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.commit or "HEAD"],
                                capture_output=True, text=True).stdout.strip() or None
        doc = {"commit": commit, **({"note": args.note} if args.note else {}), "modules": rows}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    if failed:
        print(f"under {MODULE_THRESHOLD:.0%}: {', '.join(failed)}; "
              "hint: `mutmut show NAME` shows a survivor", file=sys.stderr)
    if overall < OVERALL_THRESHOLD:
        print(f"all modules together under {OVERALL_THRESHOLD:.0%}", file=sys.stderr)
    return 1 if failed or overall < OVERALL_THRESHOLD else 0


if __name__ == "__main__":
    sys.exit(main())
