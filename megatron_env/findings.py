"""The finding: the one result shape of every check, here and in scripts/ (as plain dicts), and
its rendering for people (aligned lines, colour only for status) and for machines (JSON)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from megatron_env import output

Status = Literal["pass", "warn", "fail", "skip"]
ORDER: dict[str, int] = {"fail": 0, "warn": 1, "skip": 2, "pass": 3}


@dataclass(frozen=True)
class Finding:
    id: str
    status: Status
    summary: str
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    kind: str = ""  # a stable reason within the id, for code that must tell ("absent"); not text

    def to_dict(self) -> dict:
        """The JSON shape scripts/ share (id, status, summary, evidence, fix), plus `kind` where
        a finding has one."""
        d = asdict(self)
        if not self.kind:
            del d["kind"]
        return d


def worst(findings: list[Finding]) -> str:
    """The verdict of a set of findings: its worst status, where a skipped check says nothing
    (a node where one kernel is not installed but every other check passed is a passing node);
    skip only when every check was skipped, pass when there are none."""
    judged = [f.status for f in findings if f.status != "skip"]
    if not judged:
        return "skip" if findings else "pass"
    return min(judged, key=ORDER.__getitem__)


def exit_code(findings: list[Finding]) -> int:
    """0 when nothing failed, 1 when a check failed (warnings do not fail a run)."""
    return 1 if any(f.status == "fail" for f in findings) else 0


def summary_line(findings: list[Finding]) -> str:
    counts = Counter(f.status for f in findings)
    return ", ".join(f"{counts[s]} {s}" for s in ("pass", "warn", "fail", "skip") if counts[s])


def rows(findings: list[Finding]) -> list[tuple[str, str, str]]:
    """(id, status, summary) worst first; a failed or warned check's fix follows as `hint:`."""
    out = []
    for f in sorted(findings, key=lambda f: ORDER[f.status]):
        text = f.summary + (f"\nhint: {f.fix}" if f.fix and f.status in ("fail", "warn") else "")
        out.append((f.id, f.status, text))
    return out


def print_findings(findings: list[Finding], header: str) -> None:
    output.result(header)
    output.table(rows(findings), status_col=1, indent="  ")
    output.summary(summary_line(findings), "fail")


def to_json(findings: list[Finding], **extra: Any) -> str:
    counts = Counter(f.status for f in findings)
    doc = {"findings": [f.to_dict() for f in findings],
           "summary": {s: counts[s] for s in ("pass", "warn", "fail", "skip")}, **extra}
    return json.dumps(doc, indent=2)


def emit_json(findings: list[Finding], **extra: Any) -> None:
    output.block(to_json(findings, **extra) + "\n")


def print_fleet(nodes, exclude: list[str]) -> None:
    """One row per node (fleet.NodeResult) with its worst findings, then the --exclude line."""
    rows = []
    for n in nodes:
        worst = [f for f in n.findings if f.status == n.status][:3]
        text = "\n".join(f"{f.id}: {f.summary.split(': ', 1)[-1]}" for f in worst)
        rows.append((n.host, n.status,
                     f"{len(n.findings)} checks pass" if n.status == "pass" else text))
    output.table(rows, status_col=1)
    if exclude:
        output.result(f"--exclude={','.join(exclude)}")
