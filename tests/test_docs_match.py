"""The docs name what the code reads (issue 41): the table of mirror and local-copy variables in
docs/setup.md is the one `megatron-env kernels --mirrors` makes from the recipes and profiles,
every such variable the docs or the code's docstrings name is one of them, and the README's
first commands make a virtual environment and say what the first setup costs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from megatron_env.commands import mirrors
from megatron_env.profile import load_all

ROOT = Path(__file__).resolve().parent.parent
VARIABLE = re.compile(r"MEGATRON_ENV_(?:MIRROR|SOURCE)_[A-Z0-9_]*[A-Z0-9]")


def _table_variables() -> set[str]:
    return {r[0].strip("`") for r in mirrors.rows(load_all())}


def test_the_docs_table_is_the_one_made_from_the_recipes():
    held = mirrors.in_doc((ROOT / "docs" / "setup.md").read_text())
    assert held is not None, "docs/setup.md has no mirrors table between its markers"
    assert held == mirrors.markdown(load_all()), \
        "docs/setup.md's table differs: paste `megatron-env kernels --mirrors` between the markers"


def test_every_variable_named_is_one_the_code_reads():
    """Before: nothing tied the names in prose to the ones the fetching code builds."""
    known = _table_variables()
    assert {"MEGATRON_ENV_MIRROR_MEGATRON", "MEGATRON_ENV_SOURCE_CUTLASS_HEADERS",
            "MEGATRON_ENV_SOURCE_CUDNN_FRONTEND_CMAKE"} <= known
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
             *(ROOT / "megatron_env").rglob("*.py")]
    named = {(f.relative_to(ROOT).as_posix(), v) for f in texts
             for v in VARIABLE.findall(f.read_text())}
    assert not [(f, v) for f, v in named if v not in known], sorted(named)


def test_the_kernels_command_prints_the_table(capsys):
    from megatron_env.commands import host

    assert host.kernels.fn(mirrors=True) == 0
    assert capsys.readouterr().out == mirrors.markdown(load_all())


def test_the_readme_starts_with_a_venv_and_says_what_the_first_setup_costs():
    text = (ROOT / "README.md").read_text()
    first = text.split("## Two commands", 1)[1].split("\n\n    ", 1)[1].split("\n\n", 1)[0]
    assert first.lstrip().startswith("python3 -m venv .venv"), first
    assert "invoke setup" in first
    for fact in ("2.6 GB", "4.5 GiB", "about 12 GB", "`.nox/`", "about 5 GB"):
        assert fact in text, fact
    # the first setup's time is the cited cold record's, as measured
    cited = re.search(r"(\d+) s cold \(\d+ min\)[^()]*?\((bench/results/[\w.-]+)\)", text, re.S)
    assert cited, "the README names the first setup's time and the record it comes from"
    record = json.loads((ROOT / cited.group(2) / "result.json").read_text())
    assert int(cited.group(1)) == round(record["cold_s"]), (cited.group(0), record["cold_s"])
    bundle = (ROOT / "docs" / "bundle.md").read_text()
    assert "tool: 50 MiB" not in bundle and "89.5 MiB (176 files)" in bundle


def test_the_readme_profile_table_is_the_one_made_from_the_profiles(capsys):
    """Before: written by hand, it listed two kernels for core_v0.19.0-cu130, which pins
    three (transformer-engine was missing)."""
    from megatron_env.commands import host, profile_table
    from megatron_env.profile import default_name

    items = load_all()
    held = mirrors.in_doc((ROOT / "README.md").read_text(), profile_table.BEGIN,
                          profile_table.END)
    assert held is not None, "README.md has no profiles table between its markers"
    made = profile_table.markdown(items, default_name(items))
    assert held == made, "README.md's table differs: paste `megatron-env profiles --markdown`"
    for p in items:  # every kernel a profile pins is in its row
        (row,) = [r for r in made.splitlines() if f"`{p.name}`" in r]
        assert all(k in row for k in p.kernels), (p.name, row)
    assert host.profiles.fn(markdown=True) == 0
    assert capsys.readouterr().out == made


def test_prefix_help_names_where_a_wheel_really_writes(tmp_path, monkeypatch):
    """Before: from a wheel, `--prefix`'s help said `.megatron-env/<profile>`, a directory it
    never writes there (it writes to the user's data directory)."""
    from megatron_env import project
    from megatron_env.commands import main

    monkeypatch.setattr(project, "_root", (project.SHIPPED, "shipped"))
    monkeypatch.delenv(project.STATE_ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    subs = next(a for a in main.parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    helps = {name: a.help for name, sub in subs.choices.items() for a in sub._actions
             if a.dest == "prefix" and name != "clean"}
    assert helps, "no command takes --prefix"
    for name, text in helps.items():
        assert f"{tmp_path / 'data' / 'megatron-env' / 'envs'}/<profile>" in text, (name, text)
        assert ".megatron-env" not in text, (name, text)
