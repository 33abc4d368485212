#!/usr/bin/env python3
"""What the redaction masks that is no secret: the false-positive rate on the job-log corpus,
and the harmless corpus the tests hold it to.

Default: every job log of tests/fixtures/job-logs through megatron_env.redact.text line by
line; the characters masked (the original characters a mask replaced; the corpus holds no
secret, so every one is a false positive) over all characters, for the whole corpus and split
into the logs present at `--seen` (the revision the shape pass was tuned against) and those
added after it (held out). JSON out, with each masked span.

`--write`: draws the harmless corpus tests/fixtures/harmless/values.txt from the fixtures
(lock pins and hashes, NCCL log words, a snapshot's env.txt and JSON values, nvidia-smi -q
values, job-log words), evenly over each source's sorted unique values; no redaction is run to
choose them.

    python bench/redact_corpus.py --seen cd09f9c
    python bench/redact_corpus.py --write
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures"
VALUES = FIXTURES / "harmless" / "values.txt"
_TOKEN = re.compile(r"[^\s\"'`()\[\]{},;<>|]{8,}")


def _even(values: set[str], n: int) -> list[str]:
    ordered = sorted(values)
    if len(ordered) <= n:
        return ordered
    return [ordered[i * len(ordered) // n] for i in range(n)]


def _tokens(files: list[Path]) -> set[str]:
    out: set[str] = set()
    for f in files:
        out.update(m.group().rstrip(".:") for m in _TOKEN.finditer(f.read_text(errors="replace")))
    return {t for t in out if len(t) >= 8}


def _json_strings(obj: object) -> set[str]:
    if isinstance(obj, dict):
        return set().union(*(_json_strings(v) for v in obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(_json_strings(v) for v in obj)) if obj else set()
    return {obj} if isinstance(obj, str) and obj.strip() else set()


def draw() -> dict[str, list[str]]:
    """(source, values): the harmless corpus."""
    locks = sorted((ROOT / "envs").glob("*/requirements.lock"))
    pins: set[str] = set()
    for f in locks:
        for line in f.read_text().splitlines():
            line = line.strip().rstrip("\\").strip()
            if line and not line.startswith("#"):
                pins.add(line)
    snap = FIXTURES / "h200-live"
    snapshot = {x for x in (snap / "env.txt").read_text().splitlines() if x}
    for name in ("nvml.json", "meta.json"):
        snapshot |= _json_strings(json.loads((snap / name).read_text()))
    smi = set()
    for f in sorted(FIXTURES.glob("h200-*/nvidia-smi-q.txt")):
        for line in f.read_text().splitlines():
            if " : " in line:
                smi.add(line.split(" : ", 1)[1].strip())
    nccl = sorted((FIXTURES / "nccl-logs").glob("*.log")) + [FIXTURES / "h200-1gpu" /
                                                             "nccl-debug-1rank.log"]
    return {
        "locks": _even(pins, 70),
        "nccl-logs": _even(_tokens(nccl), 80),
        "snapshot": _even(snapshot, 40),
        "nvidia-smi": _even({v for v in smi if len(v) >= 3}, 40),
        "job-logs": _even(_tokens(sorted((FIXTURES / "job-logs").glob("*.log"))), 120),
    }


def write() -> int:
    VALUES.parent.mkdir(exist_ok=True)
    lines = ["# Harmless values drawn from the fixtures by `python bench/redact_corpus.py --write`",
             "# (evenly over each source's sorted unique values; none chosen by the redaction)."]
    seen: set[str] = set()
    for source, values in draw().items():
        lines += [f"## {source}", *(v for v in values if v not in seen)]
        seen.update(values)
    VALUES.write_text("\n".join(lines) + "\n")
    print(f"{sum(1 for x in lines if not x.startswith('#'))} values -> {VALUES}")
    return 0


def masked_spans(line: str, out: str) -> list[str]:
    ops = difflib.SequenceMatcher(None, line, out, autojunk=False).get_opcodes()
    return [line[a1:a2] for op, a1, a2, _, _ in ops if op != "equal" and a2 > a1]


def rate(seen: str) -> int:
    from megatron_env import redact

    REDACTED = redact.REDACTED
    listed = subprocess.run(["git", "ls-tree", "--name-only", seen, "tests/fixtures/job-logs/"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    old = {Path(x).name for x in listed.split()}
    totals = {"seen": [0, 0], "held_out": [0, 0]}
    spans: dict[str, list[str]] = {}
    for f in sorted((FIXTURES / "job-logs").glob("*.log")):
        part = "seen" if f.name in old else "held_out"
        for line in f.read_text(errors="replace").splitlines():
            out = redact.text(line, {})
            totals[part][1] += len(line)
            if out != line:
                # a mask replaces what it hides: the characters gone are the masked ones
                marks = sum(len(m) * (out.count(m) - line.count(m)) for m in (REDACTED, "***"))
                totals[part][0] += len(line) - (len(out) - marks)
                spans.setdefault(f.name, []).extend(masked_spans(line, out))
    masked = sum(t[0] for t in totals.values())
    chars = sum(t[1] for t in totals.values())
    result = {"logs": len(list((FIXTURES / "job-logs").glob("*.log"))), "seen_at": seen,
              "chars": chars, "masked": masked, "rate": round(masked / chars, 6)}
    for part, (m, c) in totals.items():
        result[part] = {"chars": c, "masked": m, "rate": round(m / c, 6) if c else None}
    result["spans"] = {k: sorted(set(v)) for k, v in spans.items()}
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--seen", default="cd09f9c")
    args = ap.parse_args()
    return write() if args.write else rate(args.seen)


if __name__ == "__main__":
    raise SystemExit(main())
