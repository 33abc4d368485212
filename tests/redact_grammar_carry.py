"""How a case of tests/redact_grammar.py reaches the redaction: each carrier the way the tool
prints (shared by tests/test_redact_grammar.py and bench/redact_grammar.py)."""

from __future__ import annotations

import json

from megatron_env import redact
from megatron_env.diagnose import render
from megatron_env.findings import Finding, Status


def evidence(text: str) -> str:
    """`text` as a finding's summary and evidence leave triage (render.shown, JSON's form)."""
    f = render.shown([Finding("job.nccl_error", Status.FAIL, text.replace("\n", " "),
                              text.splitlines(), "rerun")])[0]
    return f.summary + "\n" + "\n".join(f.evidence)


def carry(carrier: str, text: str) -> str:
    if carrier == "alone":
        return redact.text(text, {})
    if carrier == "log":
        return redact.text("2026-12-05T10:00:01Z node03 job[4121]: " + text, {})
    if carrier == "stream":
        lines = redact.Lines({})
        return "".join(lines(x) for x in f"step 41 loss 2.31\n{text}\nstep 42\n".splitlines(True))
    if carrier == "json":
        return redact.text(json.dumps({"step": 3, "log": text}), {})
    if carrier == "evidence":
        return evidence(text)
    if carrier == "summary-only":
        return evidence(text).split("\n", 1)[0]
    # env: the value of a variable the tool prints, under an NCCL_ name and a typed one
    v = text.replace("\n", " ")
    shown = redact.variables({"NCCL_PLUGIN_COPY": v, "NCCL_NET_PLUGIN": v, "MASTER_ADDR": v})
    return "\n".join(f"{k}={x}" for k, x in shown.items())
