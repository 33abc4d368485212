"""The one exception type that reaches a person.

Every error a user can cause (a bad profile, a missing tool, a garbage file) is raised as a
`UserError` carrying what went wrong and what to do about it; the front doors print it in one
line and exit with status 2 instead of a traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix: `message` says what, `fix` says how, `kind` names the problem
    for code (a stable id such as "profile.invalid" or "source.sha256"; the wording of `message`
    may change, the kind does not: callers and tests decide by it)."""

    exit_code = 2

    def __init__(self, message: str, fix: str = "", *, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.fix}" if self.fix else self.message
