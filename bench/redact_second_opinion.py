#!/usr/bin/env python3
"""Would a well-kept detector library add anything to megatron_env.redact? detect-secrets
(Yelp's; its plugins: vendor formats, keyword, high-entropy strings) as a second opinion.

On the generated secrets of tests/redact_formats.py (every format in every surrounding it may
stand in, `--draws` times each, one seed) this counts: the cases our redaction leaks (12
characters of a secret in a row survive), the cases detect-secrets finds (a value it reports
overlaps a secret by 12 characters), and what it would add (found by it, leaked by us). On
the real lines of tests/fixtures it times both (microseconds per line) and counts the lines
detect-secrets flags (its false positives: the corpus holds no secret). JSON out.

    pip install detect-secrets && python bench/redact_second_opinion.py
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megatron_env import redact  # noqa: E402
from tests.redact_formats import FORMATS, SURROUNDINGS, plant  # noqa: E402


def leaked(out: str, secrets: list[str]) -> bool:
    return any(s[i:i + 12] in out for s in secrets for i in range(max(1, len(s) - 11)))


def corpus() -> list[str]:
    lines: list[str] = []
    for sub in ("job-logs", "nccl-logs", "ninja-logs", "build-progress"):
        for f in sorted((ROOT / "tests" / "fixtures" / sub).rglob("*")):
            if f.is_file() and f.suffix not in (".zst", ".gz"):
                lines += f.read_text(errors="replace").splitlines()
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--seed", type=int, default=34)
    args = ap.parse_args()
    from detect_secrets.core.scan import scan_file
    from detect_secrets.settings import default_settings

    tmp = Path(tempfile.mkdtemp(prefix="redact-second-opinion-"))

    def found(text: str) -> list[str]:
        """What detect-secrets reports in `text` as a file (its filters on: a file scan,
        not its ad-hoc string mode, which reports every word as a candidate)."""
        f = tmp / "case.txt"
        f.write_text(text)
        return [str(x.secret_value) for x in scan_file(str(f)) if x.secret_value]

    rng = random.Random(args.seed)
    cases = ours = theirs = adds = 0
    added: dict[str, int] = {}
    with default_settings():
        for fmt in FORMATS:
            for where in SURROUNDINGS:
                for _ in range(args.draws):
                    planted = plant(rng, fmt, where)
                    if planted is None:
                        continue
                    secrets, text = planted
                    cases += 1
                    leak = leaked(redact.text(text, {}), secrets)
                    hit = any(leaked(v, secrets) or any(v in s and len(v) >= 12 for s in secrets)
                              for v in found(text))
                    ours += leak
                    theirs += hit
                    if leak and hit:
                        adds += 1
                        added[f"{fmt} in {where}"] = added.get(f"{fmt} in {where}", 0) + 1
        lines = corpus()
        (tmp / "corpus.log").write_text("\n".join(lines) + "\n")
        t = time.perf_counter()
        flagged = {x.line_number for x in scan_file(str(tmp / "corpus.log"))}
        ds_us = (time.perf_counter() - t) / len(lines) * 1e6
    shutil.rmtree(tmp)
    t = time.perf_counter()
    for line in lines:
        redact.text(line, {})
    ours_us = (time.perf_counter() - t) / len(lines) * 1e6
    json.dump({"cases": cases, "formats": len(FORMATS), "surroundings": len(SURROUNDINGS),
               "leaked_by_redact": ours, "found_by_detect_secrets": theirs,
               "detect_secrets_would_add": adds, "added": added,
               "corpus_lines": len(lines), "detect_secrets_flags_harmless_lines": len(flagged),
               "us_per_line": {"redact": round(ours_us, 1), "detect_secrets": round(ds_us, 1),
                               "both_over_redact": round((ours_us + ds_us) / ours_us, 2)}},
              sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
