#!/usr/bin/env python3
"""Do the redaction's tests notice when megatron_env/redact/ is broken on purpose?

Makes one mutant per small change of a module of the package (an integer or quantifier off by
one, a comparison or boolean operator swapped, a word dropped from a name set, one alternative
dropped from a regex's `|` list, a character dropped from a short character class), loads each
into its running module (`megatron_env.redact.shape` ...; the package's own names that modules
import from each other are refreshed too) and runs the in-process tests against it (pytest,
-x): tests/test_redact*.py without their subprocess and command tests, the generated text
properties with MEGATRON_ENV_REDACT_EXAMPLES examples (default here 60). JSON out: killed,
survived (with each survivor's change), score, per module.

    python bench/mutate_redact.py [--sample N] [--module shape]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "megatron_env" / "redact"
MODULES = ("names", "shape", "structure", "options", "context", "__init__")
TESTS = ["tests/test_redact.py", "tests/test_redact_generated.py", "tests/test_redact_vendors.py",
         "tests/test_redact_positions.py",
         "tests/test_redact_harmless.py", "-k",
         "not triage_prints and not mirror and not collect_writes and not command"]


def _docstrings(src: str) -> set[int]:
    """Line numbers (0-based) of docstrings: text, not code."""
    import ast

    out: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(
                body[0].value.value, str):
            out.update(range(body[0].lineno - 1, body[0].end_lineno))
    return out


def _edits(code: str) -> list[tuple[int, int, str]]:
    """(start, end, replacement) for each small change of one line of code."""
    edits = []
    for m in re.finditer(r"(?<![\w.])\d+(?![\w.])", code):
        n = int(m.group())
        edits += [(m.start(), m.end(), str(n + 1)), (m.start(), m.end(), str(max(0, n - 1)))]
    for a, b in ((">=", ">"), ("<=", "<"), (" > ", " >= "), (" < ", " <= "), ("==", "!="),
                 (" and ", " or "), (" or ", " and "), ("not ", ""), ("True", "False")):
        edits += [(m.start(), m.end(), b) for m in re.finditer(re.escape(a), code)]
    # a word of a set or tuple; a regex alternative
    edits += [(m.start(), m.end(), "") for m in re.finditer(r"\"([a-z_]{2,})\",? ?", code)]
    edits += [(m.start(), m.end(), "") for m in re.finditer(r"(?<=[(|])([^()|\[\]\\]{2,})\|",
                                                          code)]
    for m in re.finditer(r"\[([^\]\\]{2,8})\]", code if 'r"' in code else ""):  # a regex's class
        edits += [(m.start() + 1 + j, m.start() + 2 + j, "") for j, c in enumerate(m.group(1))
                  if c not in "^-"]
    return edits


def mutants(src: str):
    lines = src.splitlines(keepends=True)
    skip = _docstrings(src)
    for i, line in enumerate(lines):
        if i in skip or line.lstrip().startswith("#") or not line.strip():
            continue
        for start, end, new in _edits(line):
            mutated = line[:start] + new + line[end:]
            if mutated != line:
                yield (f"line {i + 1}: {line[start:end]!r} -> {new!r}",
                       "".join(lines[:i] + [mutated] + lines[i + 1:]))


def _load(modname: str, source: str) -> None:
    """`source` as the code of megatron_env.redact[.modname], then the names the other modules
    took from it refreshed (a rule table built from a mutated function must use it)."""
    import importlib

    full = "megatron_env.redact" + ("" if modname == "__init__" else "." + modname)
    mod = importlib.import_module(full)
    exec(compile(source, str(PACKAGE / f"{modname}.py"), "exec"), mod.__dict__)
    for other in MODULES:
        if other != modname:
            o = importlib.import_module("megatron_env.redact" + (
                "" if other == "__init__" else "." + other))
            for k, v in list(vars(o).items()):
                if k in mod.__dict__ and getattr(v, "__module__", None) == full:
                    setattr(o, k, mod.__dict__[k])
    for m in MODULES:  # every memo emptied: a cached verdict of the last code is no verdict
        o = importlib.import_module("megatron_env.redact" + ("" if m == "__init__" else "." + m))
        for v in vars(o).values():
            if hasattr(v, "cache_clear"):
                v.cache_clear()


def _pytest() -> int:
    import pytest

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *TESTS]))
        except Exception:
            return 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sample", type=int, default=0, help="this many mutants, drawn at random")
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--module", choices=MODULES, action="append")
    args = ap.parse_args()
    os.environ.setdefault("MEGATRON_ENV_REDACT_EXAMPLES", "60")
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    todo = []
    sources = {m: (PACKAGE / f"{m}.py").read_text() for m in args.module or MODULES}
    for m, src in sources.items():
        todo += [(m, what, code) for what, code in mutants(src)]
    every = len(todo)
    if args.sample and args.sample < every:
        import random

        todo = random.Random(args.seed).sample(todo, args.sample)
    if _pytest() != 0:
        print(json.dumps({"error": "the tests fail on the redaction as it is"}))
        return 1
    killed = dict.fromkeys(sources, 0)
    survived: dict[str, list[str]] = {m: [] for m in sources}
    invalid = 0
    for m, what, source in todo:
        try:
            _load(m, source)
        except Exception:
            invalid += 1
            _load(m, sources[m])
            continue
        if _pytest() == 0:
            survived[m].append(what)
        else:
            killed[m] += 1
        _load(m, sources[m])
    total = sum(killed.values()) + sum(map(len, survived.values()))
    print(json.dumps({"generated": every, "mutants": total, "invalid": invalid,
                      "killed": sum(killed.values()),
                      "score": round(sum(killed.values()) / total, 3) if total else None,
                      "per_module": {m: {"killed": killed[m], "survived": len(survived[m])}
                                     for m in sources},
                      "survived": [f"{m} {w}" for m in sources for w in survived[m]]},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
