"""The finding: the one result shape of every check, here and in scripts/ (as plain dicts)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

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
    return min((f.status for f in findings), key=ORDER.__getitem__, default="pass")


def exit_code(findings: list[Finding]) -> int:
    """0 when nothing failed, 1 when a check failed (warnings do not fail a run)."""
    return 1 if any(f.status == "fail" for f in findings) else 0
