"""Render findings for people (an aligned table, colour only for status) and for machines (JSON)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from .findings import ORDER, Finding

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def summary_line(findings: list[Finding]) -> str:
    counts = Counter(f.status for f in findings)
    return ", ".join(f"{counts[s]} {s}" for s in ("pass", "warn", "fail", "skip") if counts[s])


def table(findings: list[Finding], title: str = "") -> Table:
    t = Table(title=title or None, show_edge=False, box=None, pad_edge=False, expand=False)
    t.add_column("check", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("summary")
    for f in sorted(findings, key=lambda f: ORDER[f.status]):
        text = f.summary + (f"\n[dim]fix: {f.fix}[/dim]" if f.fix and f.status in
                            ("fail", "warn") else "")
        t.add_row(f.id, f"[{STYLE[f.status]}]{f.status}[/]", text)
    return t


def print_findings(findings: list[Finding], header: str, out: Console | None = None) -> None:
    out = out or console()
    out.print(header)
    out.print(table(findings))
    out.print(f"[bold]{summary_line(findings)}[/bold]")


def to_json(findings: list[Finding], **extra: Any) -> str:
    counts = Counter(f.status for f in findings)
    doc = {"findings": [f.to_dict() for f in findings],
           "summary": {s: counts[s] for s in ("pass", "warn", "fail", "skip")}, **extra}
    return json.dumps(doc, indent=2)


def emit_json(findings: list[Finding], **extra: Any) -> None:
    sys.stdout.write(to_json(findings, **extra) + "\n")


def print_fleet(nodes, exclude: list[str], out: Console | None = None) -> None:
    """One row per node (fleet.NodeResult) with its worst findings, then the --exclude line."""
    out = out or console()
    t = Table(show_edge=False, box=None, pad_edge=False)
    for col in ("host", "status", "worst findings"):
        t.add_column(col, no_wrap=col != "worst findings")
    for n in nodes:
        worst = [f for f in n.findings if f.status == n.status][:3]
        text = "\n".join(f"{f.id}: {f.summary.split(': ', 1)[-1]}" for f in worst)
        t.add_row(n.host, f"[{STYLE[n.status]}]{n.status}[/]",
                  f"{len(n.findings)} checks pass" if n.status == "pass" else text)
    out.print(t)
    if exclude:
        out.print(f"--exclude={','.join(exclude)}")
