"""Shell completion scripts for `megatron-env`, written from its parser: the commands, each
one's options, and the values a person would otherwise look up (profile names after
`--profile`, kernel recipes for `build` and `--without`, setup steps after `--only`/`--from`,
the shells after `completion`). The names are those of the project in use when the script is
written (`eval "$(megatron-env completion bash)"` in a shell's startup writes it afresh).

bash: a completion function; zsh: the same through bashcompinit; fish: `complete` lines."""

from __future__ import annotations

import argparse
import contextlib

from megatron_env import recipes
from megatron_env.errors import UserError
from megatron_env.profile import load_all

SHELLS = ("bash", "zsh", "fish")
_GLOBAL_VALUES = ("--project", "--cache-dir")  # global options that take a directory


def _subparsers(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subs.choices)


def names() -> dict[str, list[str]]:
    """The values to offer, by what they are: profiles, kernels, steps."""
    from megatron_env.setup.steps import STEPS  # the setup wing: only when completing

    profiles: list[str] = []
    with contextlib.suppress(UserError, OSError):  # a project without profiles: none offered
        profiles = [p.name for p in load_all()]
    return {"profile": profiles, "kernel": sorted(recipes.declared()), "step": list(STEPS)}


def _values(sub: argparse.ArgumentParser, command: str, known: dict[str, list[str]]
            ) -> tuple[dict[str, list[str]], list[str]]:
    """(option string -> the values it takes, the values of the positional argument)."""
    by_dest = {"profile": known["profile"], "without": known["kernel"],
               "only": known["step"], "from_": known["step"]}
    opts = {o: by_dest[a.dest] for a in sub._actions if a.dest in by_dest
            for o in a.option_strings}
    positional = {"build": [*known["kernel"], "all"], "completion": list(SHELLS)}
    return opts, positional.get(command, [])


def _long_opts(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--"))


def bash(top: argparse.ArgumentParser, prog: str, known: dict[str, list[str]]) -> str:
    subs = _subparsers(top)
    cases = []
    for name, sub in subs.items():
        opts, positional = _values(sub, name, known)
        by_words: dict[str, list[str]] = {}
        for o, vals in opts.items():
            by_words.setdefault(" ".join(vals), []).append(o)
        prev = "".join(f' {"|".join(os_)}) vals="{w}" ;;' for w, os_ in by_words.items())
        cases.append(f'        {name}) opts="{" ".join(_long_opts(sub) + positional)}"'
                     + (f'; case "$prev" in{prev} esac' if prev else "") + " ;;")
    takes_dir = "|".join(_GLOBAL_VALUES)
    return "\n".join([
        "_megatron_env() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local cmd="" w opts="" vals="" skip=""',
        '    for w in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do',
        '        if [ -n "$skip" ]; then skip=""; continue; fi',  # the value of --project
        f'        case "$w" in {takes_dir}) skip=1 ;; -*) ;; *) cmd="$w"; break ;; esac',
        "    done",
        '    if [ -n "$skip" ]; then COMPREPLY=(); return; fi',  # a directory: -o default
        '    if [ -z "$cmd" ]; then',
        f'        COMPREPLY=($(compgen -W "{" ".join(subs)} {" ".join(_long_opts(top))}" '
        '-- "$cur"))',
        "        return",
        "    fi",
        '    case "$cmd" in',
        *cases,
        "    esac",
        '    if [ -n "$vals" ]; then COMPREPLY=($(compgen -W "$vals" -- "$cur")); return; fi',
        '    COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        "}",
        f"complete -o default -F _megatron_env {prog}",
    ]) + "\n"


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _about(help_: str | None) -> str:
    line = (help_ or "").split(" (default")[0].strip()
    return line if len(line) <= 60 else line[:57].rsplit(" ", 1)[0] + "..."


def fish(top: argparse.ArgumentParser, prog: str, known: dict[str, list[str]]) -> str:
    subs = _subparsers(top)
    lines = [f"complete -c {prog} -f"]  # no file names unless an option takes a path
    for a in top._actions:
        if not a.option_strings or a.dest == "help":
            continue
        longs = [o[2:] for o in a.option_strings if o.startswith("--")]
        takes = "-r -F " if a.option_strings[-1] in _GLOBAL_VALUES else ""
        lines.append(f"complete -c {prog} -n __fish_use_subcommand -l {longs[0]} {takes}"
                     f"-d {_quote(_about(a.help))}")
    for name, sub in subs.items():
        lines.append(f"complete -c {prog} -n __fish_use_subcommand -a {name} "
                     f"-d {_quote(_about(sub.description))}")
        when = f"'__fish_seen_subcommand_from {name}'"
        opts, positional = _values(sub, name, known)
        if positional:
            lines.append(f"complete -c {prog} -n {when} -a {_quote(' '.join(positional))}")
        for a in sub._actions:
            if not a.option_strings or a.dest == "help":
                continue
            longs = [o[2:] for o in a.option_strings if o.startswith("--")]
            shorts = [o[1:] for o in a.option_strings if not o.startswith("--")]
            flag = f"-l {longs[0]}" + "".join(f" -s {s}" for s in shorts)
            if a.option_strings[-1] in opts:
                value = f" -x -a {_quote(' '.join(opts[a.option_strings[-1]]))}"
            elif a.nargs == 0:
                value = ""
            else:
                value = " -r -F"  # a file, a directory or a number: the shell's own
            lines.append(f"complete -c {prog} -n {when} {flag}{value} "
                         f"-d {_quote(_about(a.help))}")
    return "\n".join(lines) + "\n"


def script(top: argparse.ArgumentParser, shell: str, prog: str) -> str:
    """The completion script of `shell` for the parser `top` of the command `prog`."""
    known = names()
    if shell == "fish":
        return fish(top, prog, known)
    text = bash(top, prog, known)
    return ("autoload -U +X bashcompinit && bashcompinit\n" + text) if shell == "zsh" else text
