"""invoke's own usage errors, over every task of `commands.registry()`: an unknown option, an
unknown task, a required value left out, a flag given no value, a word where a number goes, an
option where the positional goes. Before: invoke's message ("No idea what '--bogus' is!",
"Flag <Argument: out (o) *> needed value and was not given one!"), exit 1, no hint; a
ValueError traceback for `invoke preflight --size many`; `invoke collect --bogus` wrote a
snapshot into ./--bogus. Now both doors say each as one `error:` line and its `hint:`, exit 2,
the JSON error object (kind input.usage) under --json, and write nothing; through the `invoke`
script and `python -m invoke` both (invoke's own entry points, a plain Program)."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_env import commands

from .test_front_doors import ROOT, _door, _flag, _required, _said_as_usage, _written, empty

__all__ = ["empty"]  # the fixture, used by name

INVOKE = Path(sys.executable).with_name("invoke")


def _takes_value(p: inspect.Parameter) -> bool:
    """An option given as `--flag VALUE` (not a switch) in both doors."""
    return p.default is not False and "bool" not in str(p.annotation).replace("list[", "")


def _fill(name: str) -> list[str]:
    return [w for p in _required(name) for w in (_flag(p), "x")]


def _per_task() -> list[tuple[str, list[str]]]:
    """Per task: an unknown option, an unknown option where its positional goes, each
    required value left out, each whole-number option given a word."""
    out = []
    for name, cmd in commands.registry().items():
        fill, required = _fill(name), _required(name)
        out.append((name, ["--no-such-option", *fill]))
        if required:
            out.append((name, ["--no-such-option"]))
        for p in required:
            out.append((name, [w for q in required if q != p for w in (_flag(q), "x")]))
        for p, v in inspect.signature(cmd.fn).parameters.items():
            if isinstance(v.default, int) and not isinstance(v.default, bool):
                out.append((name, [*fill, _flag(p), "many"]))
    return out


#: (task, option) for every option of every task that takes a value
VALUED = [(name, p) for name, cmd in commands.registry().items()
          for p, v in inspect.signature(cmd.fn).parameters.items() if _takes_value(v)]


def _invoke(i: int, *args: str) -> list[str]:
    """Through invoke's two entry points in turn: the script, `python -m invoke`."""
    if i % 2:
        return [str(INVOKE), "-r", str(ROOT), *args]
    return [sys.executable, "-m", "invoke", "-r", str(ROOT), *args]


def _both_doors(i: int, name: str, args: list[str], as_json: bool, empty) -> None:
    """The same words through both doors: each a usage error said as one; invoke's names the
    task and its help; nothing written."""
    tmp_path, cwd, env = empty
    argv = [name, "--json", *args] if as_json else [name, *args]
    r = subprocess.run(_invoke(i, *argv), cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=120)
    _said_as_usage(r, as_json)
    assert r.stderr.startswith(f"error: invoke {name}: "), r.stderr
    assert f"`invoke {name} --help`" in r.stderr, r.stderr
    assert "Argument" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    other = subprocess.run(_door("megatron-env", *argv), cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=120)
    _said_as_usage(other, as_json)
    assert _written(tmp_path) == [], (r.stderr, other.stderr)


def test_the_cases_cover_every_task_and_each_kind():
    """A registry change that leaves a kind of case out shows here."""
    cases = _per_task()
    assert {n for n, _a in cases} == set(commands.registry())
    assert any(args[-1:] == ["many"] for _n, args in cases)
    assert any(args == ["--no-such-option"] and _required(n) for n, args in cases)
    assert {n for n, _p in VALUED} >= {n for n in commands.registry() if n != "profiles"}


@pytest.mark.parametrize("i, name, args", [(i, n, a) for i, (n, a) in enumerate(_per_task())])
def test_a_usage_error_of_each_task_is_one_line_with_a_hint(i, name, args, empty):
    """`--json` on every other case, the entry point alternating with it (all four pairs)."""
    _both_doors(i, name, args, as_json=bool(i // 2 % 2), empty=empty)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(valued=st.sampled_from(VALUED), then=st.sampled_from(["end", "switch", "option"]),
       as_json=st.booleans(), i=st.integers(0, 1))
def test_a_flag_given_no_value_is_a_usage_error(valued, then, as_json, i, empty):
    """A flag that takes a value, given none: last, before one of its task's switches, or
    before an unknown option (before: a repeatable one last or before a switch was taken as
    given nothing, `setup --bundle` ran without a bundle; `--prefix --bogus` took the
    option as the value)."""
    name, p = valued
    params = inspect.signature(commands.registry()[name].fn).parameters
    switch = next((_flag(q) for q, v in params.items() if v.default is False and q != "json"),
                  None)
    args = [*_fill(name), _flag(p)]
    if then == "switch" and switch:
        args.append(switch)
    elif then == "option":
        args.append("--no-such-option")
    _both_doors(i, name, args, as_json, empty)


def test_a_flag_given_twice_the_second_without_a_value_is_a_usage_error(empty):
    """Before: `invoke collect --out x --out` wrote the snapshot to x, exit 0."""
    _both_doors(0, "collect", ["--out", "x", "--out"], as_json=False, empty=empty)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(word=st.from_regex(r"[a-z][a-z0-9_-]{0,12}", fullmatch=True)
       .filter(lambda w: w not in commands.registry() and w != "completion"),
       as_json=st.booleans(), i=st.integers(0, 1))
def test_an_unknown_task_is_one_line_with_a_hint_through_both_doors(word, as_json, i, empty):
    tmp_path, cwd, env = empty
    argv = [word, "--json"] if as_json else [word]
    r = subprocess.run(_invoke(i, *argv), cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=120)
    _said_as_usage(r, as_json)
    assert r.stderr.startswith("error: invoke: ") and "`invoke --list`" in r.stderr, r.stderr
    other = subprocess.run(_door("megatron-env", *argv), cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=120)
    _said_as_usage(other, as_json)
    assert _written(tmp_path) == []


def test_a_task_still_runs_and_its_numbers_still_parse(empty):
    """The door changes only what a usage error says: a good command line runs as before."""
    _tmp, cwd, env = empty
    r = subprocess.run(_invoke(0, "profiles"), cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(_invoke(1, "preflight", "--size", "64", "--help"), cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--size=INT" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("name", list(commands.registry()))
def test_every_short_flag_is_a_letter(name, empty):
    """Before: preflight's --nccl-args had the short flag `--` (invoke gives the first
    character of the name not yet taken, and of n, c, c, l and - only - was left), listed
    in its help as `--=STRING`."""
    _tmp, cwd, env = empty
    r = subprocess.run(_invoke(0, name, "--help"), cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    names = [re.split(r"\[?=| ", part)[0]
             for line in r.stdout.split("Options:", 1)[1].splitlines()
             if (m := re.match(r"  (-\S.*?)(?:\s{2,}|$)", line))
             for part in m.group(1).split(", ")]
    assert names and all(re.fullmatch(r"-[a-zA-Z]|--\S+", n) and n != "--" for n in names), \
        names


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("args", [["build", "--what", "x", "--cache-dir"],
                                  ["check", "--project"], ["--cache-dir"]])
def test_a_global_option_given_no_value_is_a_usage_error(args, as_json, empty):
    """megatron-env reads --project and --cache-dir before the command (build's --cache-dir
    among them). Before: given no value, argparse's usage block and its own error line."""
    tmp_path, cwd, env = empty
    argv = [*args[:1], "--json", *args[1:]] if as_json else args
    r = subprocess.run(_door("megatron-env", *argv), cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    _said_as_usage(r, as_json)
    assert _written(tmp_path) == []


@pytest.mark.parametrize("argv", [["setup", "--help"], ["bundle", "-h"], ["--list"]])
def test_help_read_by_a_reader_that_left_is_no_traceback(argv):
    """Before: `invoke setup --help | head -1` ended in a BrokenPipeError traceback; now as
    the megatron-env door: nothing more said, exit 141 (as a program killed by SIGPIPE). The
    reader has left before the first write (its end of the pipe closed): no race. (A bare
    `invoke --help` is printed before tasks.py loads: invoke's own, out of this door's reach.)"""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([str(INVOKE), *argv], cwd=ROOT, stdout=write, stderr=subprocess.PIPE,
                           text=True, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in r.stderr and r.stderr == "", r.stderr
    assert r.returncode == 141, r.stderr
