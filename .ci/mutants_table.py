"""The table of `nox -s mutants`: per module, its mutants, killed, survived and kill rate, from
`mutmut results --all true` on stdin; exit 1 when a module is under the threshold.

A mutant no test reaches ("no tests") counts as survived: a break nothing notices. A mutant
listed in .ci/mutants-equivalent.txt (name, then why it cannot change behaviour) is left out of
its module's count; an entry that names no mutant of this run is reported, so the list cannot
go stale unseen.
"""

import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

THRESHOLD = 0.85
KILLED = {"killed", "timeout"}  # a mutant that hangs the tests is caught by them too
EQUIVALENT = Path(__file__).with_name("mutants-equivalent.txt")


def module_of(mutant: str) -> str:
    """megatron_env.bundle.layout.x_parse__mutmut_3 -> megatron_env.bundle.layout (methods are
    named xǁClassǁmethod__mutmut_N)."""
    return re.sub(r"\.x[_ǁ][^.]*__mutmut_\d+$", "", mutant)


def equivalent() -> dict[str, str]:
    out = {}
    for line in EQUIVALENT.read_text().splitlines() if EQUIVALENT.exists() else []:
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            out[name] = why.strip()
    return out


def main() -> int:
    results = {}
    for line in sys.stdin:
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            results[name] = status
    allowed = equivalent()
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for name, status in results.items():
        if name not in allowed:
            counts[module_of(name)]["killed" if status in KILLED else status] += 1
    failed = []
    print(f"{'module':40} {'mutants':>7} {'killed':>7} {'survived':>8} {'equiv':>5} {'rate':>6}")
    for module in sorted(counts):
        c = counts[module]
        total, killed = sum(c.values()), c["killed"]
        equiv = sum(1 for n in allowed if n in results and module_of(n) == module)
        rate = killed / total if total else 1.0
        failed += [module] if rate < THRESHOLD else []
        print(f"{module:40} {total:7} {killed:7} {total - killed:8} {equiv:5} {rate:6.1%}")
    for name in sorted(set(allowed) - set(results)):
        print(f"stale entry in {EQUIVALENT.name}: {name}", file=sys.stderr)
    if failed:
        print(f"under {THRESHOLD:.0%}: {', '.join(failed)}; "
              "hint: `mutmut show NAME` shows a survivor", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
