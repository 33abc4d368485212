"""Findings of job logs as they leave the tool: each text redacted whole, only then cut.

Why a step of its own: the events keep log lines whole (bounded only by the line reader's
limit), because a line cut before redaction can keep half a secret that no longer looks like
one (`https://user:pass` without its `@host`). Cutting for people is presentation, so it is
done last, on text that has already been through the redaction. What a log said is quoted by
what it is (`redact.quoted`, `redact.Evidence`): a token that reads as none of the harmless
kinds is masked, whatever syntax carried it.
"""

from __future__ import annotations

from megatron_env import redact
from megatron_env.diagnose import families
from megatron_env.findings import Finding, Status

EVIDENCE = 300  # characters of one evidence line shown
SUMMARY = 600  # characters of a summary shown (its head and its tail: the tail says why)


def cut(text: str, limit: int) -> str:
    """`text` at most `limit` characters long, its end marked when cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def cut_middle(text: str, limit: int) -> str:
    """`text` at most `limit` characters long, the middle left out when cut."""
    if len(text) <= limit:
        return text
    head = (limit - 3) * 2 // 3
    return text[:head] + " … " + text[len(text) - (limit - 3 - head):]


def shown(findings: list[Finding], family: bool = False) -> list[Finding]:
    """The findings as printed: summary, evidence and fix redacted, then cut to length; with
    `family`, a failing finding's fix ends with its family and what that means (for people:
    JSON has the family as `kind`)."""
    return [Finding(f.id, f.status, cut_middle(redact.quoted(f.summary), SUMMARY),
                    [cut(e, EVIDENCE) for e in map(redact.Evidence(), f.evidence)],  # in context
                    redact.text(f.fix) + (_family(f) if family else ""), f.kind)
            for f in findings]


def _family(f: Finding) -> str:
    if f.status is not Status.FAIL or f.kind not in families.FAMILIES:
        return ""
    fam = families.FAMILIES[f.kind]
    return f"\nfamily: {fam.title}; {fam.means}"
