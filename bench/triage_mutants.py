#!/usr/bin/env python3
"""How strong are the triage tests: break diagnose/events.py and diagnose/triage.py on purpose,
one change at a time, and count the changes the fast triage tests catch (killed).

Each mutant is one AST edit (a comparison flipped, `and`/`or` swapped, a `not` dropped, an `if`
negated, an integer moved by one, a returned/added value replaced by None); docstrings and
imports are left alone. A seeded sample of the sites is tried (all with --all). The tests run in
a child pytest (-x: a killed mutant stops at its first failure). The source is restored after
each one, whatever happens. JSON out.

    python bench/triage_mutants.py --sample 40          # {"killed": .., "survived": [...]}
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ["megatron_env/diagnose/events.py", "megatron_env/diagnose/triage.py"]
TESTS_ALL = ["tests/test_triage.py", "tests/test_triage_structure.py",
             "tests/test_triage_corpus.py"]
TESTS = [t for t in TESTS_ALL if (ROOT / t).exists()]
FLIP = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE,
        ast.LtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot,
        ast.IsNot: ast.Is}


def sites(tree: ast.AST) -> list[tuple[int, str]]:
    """(node index in ast.walk order, kind of edit) for every place a mutant can be made."""
    out = []
    for i, n in enumerate(ast.walk(tree)):
        if isinstance(n, ast.Compare) and type(n.ops[0]) in FLIP:
            out.append((i, "flip"))
        elif isinstance(n, ast.BoolOp):
            out.append((i, "boolop"))
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            out.append((i, "not"))
        elif isinstance(n, ast.If):
            out.append((i, "if"))
        elif (isinstance(n, ast.Constant) and type(n.value) is int):
            out.append((i, "int"))
        elif isinstance(n, ast.Return) and n.value is not None:
            out.append((i, "return"))
    return out


def mutate(tree: ast.AST, index: int, kind: str) -> str:
    n = list(ast.walk(tree))[index]
    if kind == "flip":
        n.ops[0] = FLIP[type(n.ops[0])]()
    elif kind == "boolop":
        n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()
    elif kind == "not":
        n.__class__, n.__dict__ = n.operand.__class__, n.operand.__dict__
    elif kind == "if":
        n.test = ast.UnaryOp(ast.Not(), n.test)
    elif kind == "int":
        n.value += 1
    elif kind == "return":
        n.value = ast.Constant(None)
    return ast.unparse(ast.fix_missing_locations(tree))


def killed(python: str) -> bool:
    r = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    return r.returncode != 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sample", type=int, default=40, help="mutants tried (seeded)")
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    todo = [(f, i, k) for f in FILES
            for i, k in sites(ast.parse((ROOT / f).read_text()))]
    if not a.all:
        todo = random.Random(a.seed).sample(todo, min(a.sample, len(todo)))
    if killed(sys.executable):  # the tests must pass unmutated, or every mutant looks killed
        raise SystemExit("error: the triage tests fail without any mutant; fix them first")
    results = {"killed": 0, "survived": [], "sites": 0}
    for f, i, k in todo:
        path = ROOT / f
        original = path.read_text()
        try:
            path.write_text(mutate(ast.parse(original), i, k))
            if killed(sys.executable):
                results["killed"] += 1
            else:
                line = getattr(list(ast.walk(ast.parse(original)))[i], "lineno", "?")
                results["survived"].append(f"{f}:{line} {k}")
        finally:
            path.write_text(original)
        results["sites"] += 1
    results["kill_rate"] = round(results["killed"] / max(1, results["sites"]), 3)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
