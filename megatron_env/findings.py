"""The finding: the one result shape of every check, here and in scripts/ (as plain dicts), its
verdict (`Status`: the one definition of pass/warn/fail/skip, their rank and exit meaning), and
its rendering for people (aligned lines, colour only for status) and for machines (JSON)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Protocol

from megatron_env import output
from megatron_env.errors import UserError

# the kind (and family) of a finding that says the input cannot tell (triage's log that stops
# with neither an error nor an end): exit 3 when nothing failed, so a wrapper tells "failed" (1)
# from "cannot tell" (3); 2 stays bad input, 70 a bug, 130 and 141 signals
INCONCLUSIVE = "inconclusive"
EXIT_INCONCLUSIVE = 3


class Status(str, Enum):
    """A check's verdict, and everything said about it, defined here once: its word (the same in
    text and in JSON, where other programs read it: a member is the string it names, so
    `Status.FAIL == "fail"` and JSON writes "fail"), its rank (worst first) and what it means
    for an exit status. Members are listed in the order summaries count them."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    # the input cannot tell (triage's log with neither a failure nor an end): not a failure to
    # a script that reads JSON, and exit 3 when nothing failed (`exit_code`)
    INCONCLUSIVE = "inconclusive"

    def __str__(self) -> str:
        return self.value

    @property
    def rank(self) -> int:
        """Worst first: fail 0, inconclusive 1, warn 2, skip 3, pass 4."""
        return _RANK.index(self)

    @property
    def exit_code(self) -> int:
        """A command's exit status for this verdict: 1 when a check failed, 3 when it cannot
        tell; warnings and skips do not fail a run."""
        return 1 if self is Status.FAIL else EXIT_INCONCLUSIVE if self is Status.INCONCLUSIVE else 0

    @property
    def health_code(self) -> int:
        """The health-checker scale fleet preflight exits with (gcm's and Nagios's OK / WARNING
        / CRITICAL): 0 pass or skip, 1 warn, 2 fail."""
        return {Status.FAIL: 2, Status.WARN: 1, Status.INCONCLUSIVE: 1}.get(self, 0)


_RANK = (Status.FAIL, Status.INCONCLUSIVE, Status.WARN, Status.SKIP, Status.PASS)


@dataclass(frozen=True)
class Finding:
    id: str
    status: Status
    summary: str
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    kind: str = ""  # a stable reason within the id, for code that must tell ("absent"); not text

    def __post_init__(self) -> None:
        # A status given as its word ("fail") becomes the member; any other word is refused
        # here, never carried on to a table or an exit status that does not know it.
        object.__setattr__(self, "status", Status(self.status))

    @classmethod
    def from_dict(cls, d: object, source: str) -> Finding:
        """A finding another program wrote (scripts/ print plain dicts; a node's gpu_health.json
        comes back through a shared filesystem): its shape checked once, here; a bad one is one
        UserError naming `source` and the field, never a KeyError further down."""

        def bad(what: str) -> UserError:
            return UserError(f"{source}: a finding {what}", fix="re-run the program that wrote "
                             "it with this version of megatron-env", kind="findings.invalid")

        if not isinstance(d, dict):
            raise bad(f"is {type(d).__name__}, not an object")
        for key in ("id", "status", "summary"):
            if not isinstance(d.get(key), str) or not d[key] and key != "summary":
                raise bad(f"has no {key} string")
        if d["status"] not in set(Status):
            raise bad(f"has status {d['status']!r}, not one of {', '.join(Status)}")
        evidence = d.get("evidence") or []
        if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
            raise bad("has evidence that is not a list of strings")
        for key in ("fix", "kind"):
            if not isinstance(d.get(key) or "", str):
                raise bad(f"has a {key} that is not a string")
        return cls(d["id"], Status(d["status"]), d["summary"], list(evidence), d.get("fix") or "",
                   d.get("kind") or "")

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape scripts/ share (id, status, summary, evidence, fix), plus `kind` where
        a finding has one."""
        d = asdict(self)
        d["status"] = self.status.value  # the plain word, as scripts/ write it
        if not self.kind:
            del d["kind"]
        return d


def worst(findings: list[Finding]) -> Status:
    """The verdict of a set of findings: its worst status, where a skipped check says nothing
    (a node where one kernel is not installed but every other check passed is a passing node);
    skip only when every check was skipped, pass when there are none."""
    judged = [f.status for f in findings if f.status is not Status.SKIP]
    if not judged:
        return Status.SKIP if findings else Status.PASS
    return min(judged, key=lambda s: s.rank)


def exit_code(findings: list[Finding]) -> int:
    """0 when nothing failed, 1 when a check failed (warnings do not fail a run), 3 when nothing
    failed but a finding cannot tell (`Status.INCONCLUSIVE`)."""
    statuses = {f.status for f in findings}
    return (1 if Status.FAIL in statuses else
            EXIT_INCONCLUSIVE if Status.INCONCLUSIVE in statuses else 0)


def summary_line(findings: list[Finding]) -> str:
    counts = Counter(f.status for f in findings)
    return ", ".join(f"{counts[s]} {s}" for s in Status if counts[s])


def rows(findings: list[Finding]) -> list[tuple[str, str, str]]:
    """(id, status, summary) worst first; a failed or warned check's fix follows as `hint:`."""
    out: list[tuple[str, str, str]] = []
    for f in sorted(findings, key=lambda f: f.status.rank):
        text = f.summary + (f"\nhint: {f.fix}" if f.fix and f.status.rank < Status.SKIP.rank
                            else "")
        out.append((f.id, f.status.value, text))
    return out


def print_findings(findings: list[Finding], header: str) -> None:
    output.result(header)
    output.table(rows(findings), status_col=1, indent="  ")
    output.summary(summary_line(findings), Status.FAIL.value)


def to_json(findings: list[Finding], **extra: Any) -> str:
    counts = Counter(f.status for f in findings)
    doc = {"findings": [f.to_dict() for f in findings],
           "summary": {s.value: counts[s] for s in Status}, **extra}
    return json.dumps(doc, indent=2)


def emit_json(findings: list[Finding], **extra: Any) -> None:
    output.block(to_json(findings, **extra) + "\n")


class Node(Protocol):
    """What the fleet table reads of a node's result (fleet.analysis.NodeResult)."""

    @property
    def host(self) -> str: ...
    @property
    def status(self) -> Status: ...
    @property
    def findings(self) -> list[Finding]: ...


def print_fleet(nodes: Iterable[Node], exclude: list[str]) -> None:
    """One row per node (fleet.NodeResult) with its worst findings, then the --exclude line."""
    rows: list[tuple[str, str, str]] = []
    for n in nodes:
        worst = [f for f in n.findings if f.status == n.status][:3]
        text = "\n".join(f"{f.id}: {f.summary.split(': ', 1)[-1]}" for f in worst)
        rows.append((n.host, n.status.value,
                     f"{len(n.findings)} checks pass" if n.status is Status.PASS else text))
    output.table(rows, status_col=1)
    if exclude:
        output.result(f"--exclude={','.join(exclude)}")
