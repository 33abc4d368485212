#!/usr/bin/env python3
"""Secrets drawn from a grammar of syntaxes, generated ids drawn as a family, and what the
evidence of real job logs loses: the project's redaction beside detect-secrets and credsweeper
on the same cases, and the cost per line against another revision's redaction, in one run.

The cases are tests/redact_grammar.py's (key x separator x quoting x continuation x carrier,
each axis split into tune/held before any tuning, and a fresh held part added later), ids its
ID_KINDS x ID_KEYS x ID_PLACES. For each side (tune, held, fresh):
- leaks: places where the secret, or 12 of its characters in a row, is printed; ours over each
  case's own carrier and over every case quoted as a triage finding's evidence; a scanner is
  given the text alone as a file, and what it reports is masked in it (a scanner as a redactor);
- ids masked: ids changed by ours, or in whose text a scanner reports anything.
Readability: every job log of tests/fixtures/job-logs through triage (`jobs.run`); each
finding's summary and evidence rendered as before this change (`redact.text`, `redact.Lines`)
and as now (`redact.quoted`, `redact.Evidence`); the share of the characters printed before
that are masked now (goal <= 1%). Cost: bench/redact_positions.cost (redact.text and
redact.Lines over the fixtures' real lines, this checkout against `--base`, CPU time, best of
alternated rounds).

    pip install detect-secrets credsweeper   # in the project's environment
    python bench/redact_grammar.py [--base main] [--rounds 5] [--no-scanners] [--no-timing]
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import redact_positions as positions  # noqa: E402

from megatron_env import redact  # noqa: E402
from megatron_env.diagnose import jobs  # noqa: E402
from tests import redact_grammar as g  # noqa: E402
from tests.redact_grammar_carry import carry, evidence  # noqa: E402


def _id_out(i: g.Id) -> str:
    return evidence(i.text).split("\n", 1)[1] if i.place == "evidence" else redact.text(
        i.text, {})


def quality(scanners: dict[str, positions.Reported | str | None]) -> dict[str, object]:
    out: dict[str, object] = {}
    for side in ("tune", "held", "fresh"):
        cases = g.cases(side)
        ids = g.ids(side)
        leaks = [c for c in cases if g.leaked(carry(c.carrier, c.text), c.value)]
        by_carrier: dict[str, list[int]] = {}
        for c in cases:
            row = by_carrier.setdefault(c.carrier, [0, 0])
            row[0] += 1
            row[1] += c in leaks
        as_evidence = sum(g.leaked(evidence(c.text), c.value) for c in cases)
        alone = sum(g.leaked(redact.text(c.text, {}), c.value) for c in cases)
        masked = [i for i in ids if _id_out(i) != i.text]
        result: dict[str, object] = {
            "cases": len(cases), "ours_leaks": len(leaks),
            "ours_leaks_pct": round(100 * len(leaks) / len(cases), 2),
            "ours_leaks_by_carrier": {k: f"{v[1]}/{v[0]}" for k, v in sorted(by_carrier.items())},
            "ours_leaks_text_alone": alone,
            "ours_leaks_every_case_as_evidence": as_evidence,
            "ids": len(ids), "ours_ids_masked": len(masked),
            "ours_ids_masked_per_60": round(60 * len(masked) / len(ids), 1),
            "ours_ids_masked_kinds": sorted({i.kind for i in masked})}
        for name, scan in scanners.items():
            if not callable(scan):
                result[name] = scan or "not installed"
                continue
            found = scan([c.text for c in cases])
            result[f"{name}_leaks_text_alone"] = sum(
                g.leaked(positions.as_redactor(c.text, f), c.value)
                for c, f in zip(cases, found, strict=True))
            result[f"{name}_ids_flagged"] = sum(bool(f) for f in scan([i.text for i in ids]))
        out[side] = result
    return out


def readability() -> dict[str, object]:
    total = masked = 0
    lines = 0
    for log in sorted((ROOT / "tests" / "fixtures" / "job-logs").glob("*.log")):
        found, n, _ = jobs.run([str(log)], [])
        lines += n
        for f in found:
            before_ev, now_ev = redact.Lines(), redact.Evidence()
            pairs = [(redact.text(f.summary), redact.quoted(f.summary))]
            pairs += [(before_ev(e), now_ev(e)) for e in f.evidence]
            for before, now in pairs:
                total += len(before)
                if before != now:
                    sm = difflib.SequenceMatcher(None, before, now, autojunk=False)
                    masked += len(before) - sum(b.size for b in sm.get_matching_blocks())
    return {"job_logs_lines": lines, "evidence_chars_printed_before": total,
            "evidence_chars_masked_now": masked,
            "masked_share_pct": round(100 * masked / total, 2) if total else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="main")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-scanners", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="redact-grammar-") as t:
        tmp = Path(t)
        scanners: dict[str, positions.Reported | str | None] = {}
        if not args.no_scanners:
            scanners = {"detect_secrets": positions.detect_secrets(tmp),
                        "credsweeper": positions.credsweeper(tmp)}
        result: dict[str, object] = {"quality": quality(scanners),
                                     "readability": readability()}
    if not args.no_timing:
        result["cost"] = positions.cost(args.base, args.rounds)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
