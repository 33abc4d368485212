"""Every `UserError(...)` in the package names its problem with a stable `kind`.

Callers and tests decide by the kind, never by the wording of the message (which may change);
a `UserError` without one cannot be told apart from any other. This reads the package's source
(no import, so it is cheap and sees every call, including ones on paths no test reaches).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from megatron_env import errors
from megatron_env.errors import UserError

PACKAGE = Path(errors.__file__).parent
KIND = re.compile(r"^[a-z]+(\.[a-z0-9-]+)+$")


def _kind_literals(node: ast.expr) -> list[str] | None:
    """The kinds a `kind=` value can take: a string literal, or a re-raise that keeps the
    inner error's kind with a literal as its fallback (`e.kind or "source.unreachable"`).
    None when the value is anything else (a variable, a computed string)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)
            and isinstance(node.values[-1], ast.Constant)
            and all(isinstance(v, ast.Attribute) and v.attr == "kind" for v in node.values[:-1])):
        return [node.values[-1].value]
    return None


def user_error_calls(source: str) -> list[ast.Call]:
    def named(f: ast.expr) -> bool:
        return (isinstance(f, ast.Name) and f.id == "UserError"
                or isinstance(f, ast.Attribute) and f.attr == "UserError")
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and named(n.func)]


def problems_in(source: str, where: str) -> list[str]:
    """One line per `UserError(...)` call of `source` whose kind is missing or malformed."""
    out = []
    for call in user_error_calls(source):
        kw = [k for k in call.keywords if k.arg == "kind"]
        if not kw:
            out.append(f"{where}:{call.lineno}: UserError without kind=")
            continue
        kinds = _kind_literals(kw[0].value)
        if kinds is None:
            out.append(f"{where}:{call.lineno}: kind= is not a string literal "
                       f"({ast.unparse(kw[0].value)})")
        out += [f"{where}:{call.lineno}: kind {k!r} is not wing.what (lowercase, dotted)"
                for k in kinds or [] if not (isinstance(k, str) and KIND.match(k))]
    return out


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_user_error_in_the_package_has_a_literal_wing_what_kind():
    files = _sources()
    calls = sum(len(user_error_calls(p.read_text())) for p in files)
    assert calls > 100, f"only {calls} UserError calls found under {PACKAGE}: wrong directory?"
    problems = [line for p in files
                for line in problems_in(p.read_text(), str(p.relative_to(PACKAGE.parent)))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source, bad", [
    ('raise UserError("x", fix="y")', "without kind="),
    ('raise errors.UserError("x")', "without kind="),
    ('raise UserError("x", kind=KIND)', "not a string literal"),
    ('raise UserError("x", kind=f"a.{b}")', "not a string literal"),
    ('raise UserError("x", kind="")', "is not wing.what"),
    ('raise UserError("x", kind="profile")', "is not wing.what"),
    ('raise UserError("x", kind="bundle.no_such_thing")', "is not wing.what"),
    ('raise UserError("x", kind="Bundle.missing")', "is not wing.what"),
    ('raise UserError("x", kind=e.kind or "Nope")', "is not wing.what"),
    ('raise UserError("x", kind=e.kind or other)', "not a string literal"),
])
def test_the_check_refuses_each_kind_of_bad_call(source, bad):
    found = problems_in(source, "m.py")
    assert len(found) == 1 and bad in found[0], found


@pytest.mark.parametrize("source", [
    'raise UserError("x", kind="bundle.not-a-chain")',
    'raise errors.UserError("x", "fix", kind="env.python-3-12")',
    'raise UserError("x", fix="y", kind=e.kind or "source.unreachable") from None',
    'raise ValueError("x")',
])
def test_the_check_accepts_well_formed_calls(source):
    assert problems_in(source, "m.py") == []


def test_kind_is_keyword_only_and_required():
    params = inspect.signature(UserError).parameters
    assert params["kind"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["kind"].default is inspect.Parameter.empty
    with pytest.raises(TypeError):
        UserError("a message", "a fix")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        UserError("a message", "a fix", "profile.unknown")  # type: ignore[misc]
    e = UserError("a message", "a fix", kind="profile.unknown")
    assert (e.message, e.fix, e.kind, e.exit_code) == ("a message", "a fix", "profile.unknown", 2)


def test_one_problem_keeps_one_kind_across_the_package():
    """The shared kinds are shared on purpose (the same problem raised in several places):
    e.g. every "git is not installed" is tool.no-git, every pinned hash that does not match is
    source.sha256. A message raised with two different kinds would split one problem."""
    by_message: dict[str, set[str]] = {}
    for p in _sources():
        for call in user_error_calls(p.read_text()):
            kw = [k for k in call.keywords if k.arg == "kind"]
            first = call.args[0] if call.args else None
            if kw and isinstance(first, ast.Constant) and isinstance(kw[0].value, ast.Constant):
                by_message.setdefault(first.value, set()).add(kw[0].value.value)
    split = {m: k for m, k in by_message.items() if len(k) > 1}
    assert not split, split
    assert by_message.get("git is not installed") == {"tool.no-git"}
