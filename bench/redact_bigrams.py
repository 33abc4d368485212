#!/usr/bin/env python3
"""The letter pairs the redaction's shape pass counts as written (megatron_env/redact/shape.py's
`_BIGRAM_TEXT`): those that make up `--share` (default 95%) of the letter pairs in the words of
this Python's standard library (identifiers split the way the shape pass splits them, comments
and docstrings), and how often a random string of letters hits one of them.

    python bench/redact_bigrams.py [--share 0.95]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import string
import sys
import sysconfig
from pathlib import Path

UNITS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--share", type=float, default=0.95)
    args = ap.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        for unit in UNITS.findall(f.read_text(errors="replace")):
            low = unit.lower()
            counts.update(low[i:i + 2] for i in range(len(low) - 1))
    total, acc, keep = sum(counts.values()), 0, []
    for pair, n in counts.most_common():
        if acc >= args.share * total:
            break
        acc += n
        keep.append(pair)
    chosen = set(keep)
    rng = random.Random(0)
    letters = "".join(rng.choice(string.ascii_lowercase) for _ in range(100_000))
    hit = sum(letters[i:i + 2] in chosen for i in range(len(letters) - 1)) / len(letters)
    json.dump({"pairs": len(keep), "of": len(counts), "random_hit_rate": round(hit, 3),
               "text": "".join(sorted(keep))}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
