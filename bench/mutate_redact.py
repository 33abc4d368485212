#!/usr/bin/env python3
"""Do the redaction's tests notice when megatron_env/redact.py is broken on purpose?

Makes one mutant per small change of redact.py (an integer or quantifier off by one, a
comparison or boolean operator swapped, a word dropped from a name set, one alternative dropped
from a regex's `|` list, a character dropped from a short character class), loads each into
the running `megatron_env.redact` module and runs the in-process tests against it (pytest, -x):
tests/test_redact.py without its subprocess tests, and tests/test_redact_generated.py's text
properties with MEGATRON_ENV_REDACT_EXAMPLES examples (default here 60). JSON out: killed,
survived (with each survivor's change), score.

    python bench/mutate_redact.py [--sample N]
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
SOURCE = ROOT / "megatron_env" / "redact.py"
TESTS = ["tests/test_redact.py", "tests/test_redact_generated.py", "-k",
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sample", type=int, default=0, help="this many mutants, drawn at random")
    ap.add_argument("--seed", type=int, default=28)
    args = ap.parse_args()
    os.environ.setdefault("MEGATRON_ENV_REDACT_EXAMPLES", "60")
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    import pytest

    from megatron_env import redact

    src = SOURCE.read_text()
    todo = list(mutants(src))
    every = len(todo)
    if args.sample and args.sample < every:
        import random

        todo = random.Random(args.seed).sample(todo, args.sample)
    killed, survived, invalid = 0, [], 0
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        baseline = pytest.main(["-x", "-q", "-p", "no:cacheprovider", *TESTS])
    if baseline != 0:
        print(json.dumps({"error": "the tests fail on redact.py as it is"}))
        return 1
    for what, source in todo:
        try:
            code = compile(source, str(SOURCE), "exec")
            exec(code, redact.__dict__)
        except Exception:
            invalid += 1
            exec(compile(src, str(SOURCE), "exec"), redact.__dict__)
            continue
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                rc = pytest.main(["-x", "-q", "-p", "no:cacheprovider", *TESTS])
            except Exception:
                rc = 1
        if rc == 0:
            survived.append(what)
        else:
            killed += 1
        exec(compile(src, str(SOURCE), "exec"), redact.__dict__)
    total = killed + len(survived)
    print(json.dumps({"generated": every, "mutants": total, "invalid": invalid, "killed": killed,
                      "score": round(killed / total, 3) if total else None,
                      "survived": survived}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
