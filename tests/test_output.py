"""The output module: status on stderr, results on stdout, aligned tables, `hint:` for fixes,
colour only on a terminal and never with NO_COLOR, no markup shown literally."""

import io

from megatron_env import output
from megatron_env.commands import cli
from megatron_env.errors import UserError


def test_streams_and_hint(capsys, monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    output.status("fetching", "x")
    output.result("a result")
    output.summary("setup ready: 3 done", "ready")
    output.error("no such thing", "pass another thing")
    out, err = capsys.readouterr()
    assert out == "a result\nsetup ready: 3 done\n"
    assert err == "fetching x\nerror: no such thing\nhint: pass another thing\n"


def test_table_aligns_and_indents_continuation_lines(capsys):
    output.table([("env", "done", "1.0", "built"), ("megatron", "failed", "12.5", "broke\nhint: fix")],
                 status_col=1)
    assert capsys.readouterr().out.splitlines() == [
        "env       done    1.0   built",
        "megatron  failed  12.5  broke",
        "                        hint: fix"]


def test_colour_only_for_a_terminal_and_not_with_no_color(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert output.paint("fail", Tty()) == "\033[1;31mfail\033[0m"
    assert output.paint("fail", io.StringIO()) == "fail"
    assert output.paint("anything", Tty()) == "anything"  # no meaning, no colour
    monkeypatch.setenv("NO_COLOR", "1")
    assert output.paint("fail", Tty()) == "fail"


def test_a_user_error_is_one_error_line_and_its_hint(capsys):
    @cli.guarded
    def broken() -> int:
        raise UserError("profile x: bad key", fix="edit profile x", kind="profile.invalid")

    assert broken() == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: profile x: bad key\nhint: edit profile x\n"
    assert "[" not in err  # no markup
