"""Every command of `commands.registry()`, through both front doors (invoke's tasks and the
`megatron-env` command), generated from the registry rather than listed by hand: `--help`
prints the help and exits 0 without running the command (before: `invoke collect --help`
wrote a snapshot into `./--help`, `invoke bundle --help` started a bundle, `invoke triage
--help` read `--help` as a log); a usage error is one `error:` line with its `hint:` and exit
2, and with `--json` one JSON object on stdout."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_env import commands, project

ROOT = Path(__file__).resolve().parent.parent
EXE = Path(sys.executable).with_name("megatron-env")
NAMES = list(commands.registry())


def _flag(name: str) -> str:
    return "--" + name.rstrip("_").replace("_", "-")


def _required(name: str) -> list[str]:
    cmd = commands.registry()[name]
    return [p for p, v in inspect.signature(cmd.fn).parameters.items()
            if v.default is inspect.Parameter.empty]


@pytest.fixture
def empty(tmp_path):
    """An empty working directory, with the tool's state, cache and the user's directories
    in empty directories of this test too: whatever a command writes shows up in one."""
    dirs = {n: tmp_path / n for n in ("cwd", "state", "cache", "home", "xdg")}
    for d in dirs.values():
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (project.ENV, project.CACHE_ENV)}
    env.update({project.STATE_ENV: str(dirs["state"]), project.CACHE_ENV: str(dirs["cache"]),
                "HOME": str(dirs["home"]), "XDG_CACHE_HOME": str(dirs["xdg"] / "cache"),
                "XDG_DATA_HOME": str(dirs["xdg"] / "data"), "PYTHONPATH": str(ROOT),
                # nothing a command might start reaches a network
                "UV_OFFLINE": "1", "HTTPS_PROXY": "http://127.0.0.1:9",
                "HTTP_PROXY": "http://127.0.0.1:9", "COLUMNS": "120"})
    return tmp_path, dirs["cwd"], env


def _written(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if p.is_file() or p.is_symlink())


def _door(door: str, name: str, *args: str) -> list[str]:
    if door == "invoke":
        return [sys.executable, "-m", "invoke", "-r", str(ROOT), name, *args]
    return [str(EXE), name, *args]


@pytest.mark.parametrize("door, word", [("invoke", "--help"), ("invoke", "-h"),
                                        ("megatron-env", "--help")])
@pytest.mark.parametrize("name", NAMES)
def test_help_prints_help_and_writes_nothing(name, door, word, empty):
    tmp_path, cwd, env = empty
    r = subprocess.run(_door(door, name, word), cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.lower().startswith("usage:"), r.stdout
    for p in inspect.signature(commands.registry()[name].fn).parameters:
        assert _flag(p) in r.stdout, (p, r.stdout)
    assert _written(tmp_path) == [], r.stderr


def _said_as_usage(r: subprocess.CompletedProcess[str], as_json: bool) -> None:
    """One `error:` line and its `hint:` on stderr, exit 2; with --json one JSON object on
    stdout (kind input.usage, a fix), else nothing on stdout."""
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: "), r.stderr
    assert lines[1].startswith("hint: ") and len(lines[1]) > len("hint: "), r.stderr
    if not as_json:
        assert r.stdout == "", r.stdout
        return
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["error"]["kind"] == "input.usage", doc
    assert doc["error"]["fix"] and doc["error"]["message"] == lines[0][len("error: "):], doc


def _usage_errors() -> list[tuple[str, list[str]]]:
    """Per command: an unknown option, each required value left out, each whole-number
    option given a word."""
    out = []
    for name, cmd in commands.registry().items():
        params = inspect.signature(cmd.fn).parameters
        required = _required(name)
        fill = [w for p in required for w in (_flag(p), "x")]
        out.append((name, ["--no-such-option", *fill]))
        for p in required:
            out.append((name, [w for q in required if q != p for w in (_flag(q), "x")]))
        for p, v in params.items():
            if isinstance(v.default, int) and not isinstance(v.default, bool):
                out.append((name, [*fill, _flag(p), "many"]))
    return out


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("name, args", _usage_errors())
def test_usage_errors_are_one_line_with_a_hint_and_json_under_json(name, args, as_json, empty):
    """Before: `megatron-env check --json --bogus` printed argparse's usage block and nothing
    on stdout; `megatron-env triage` without logs printed the help and exited 0."""
    tmp_path, cwd, env = empty
    argv = [*args, "--json"] if as_json else args
    r = subprocess.run(_door("megatron-env", name, *argv), cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    _said_as_usage(r, as_json)
    assert _written(tmp_path) == []


@pytest.mark.parametrize("door", ["invoke", "megatron-env"])
def test_an_unknown_setup_step_says_the_fix(door, empty):
    """Before: `"fix": ""`."""
    _tmp, cwd, env = empty
    r = subprocess.run(_door(door, "setup", "--only", "bogus", "--dry-run", "--json"), cwd=cwd,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    assert doc["error"]["kind"] == "input.value" and "--only" in doc["error"]["fix"], doc
    assert "\nhint: pass --only" in r.stderr


# --------------------------------------------------------------------- garbage in files


#: The options that name a file or directory the command reads (not one it writes, and not
#: an interpreter it runs): each must be an option of some command of the registry.
READS = ("snapshot", "bundle", "trust", "logs", "since", "sign", "fleet", "against",
         "find_links", "pypi_to_conda_lookup_file")
TAKING = [(name, p) for name, cmd in commands.registry().items()
          for p in inspect.signature(cmd.fn).parameters if p in READS]


def test_every_file_option_named_is_one_a_command_takes():
    assert {p for _n, p in TAKING} == set(READS)


@pytest.fixture(scope="module")
def signed_bundle(tmp_path_factory) -> Path | None:
    """A small bundle signed by a real ssh-keygen key (None without ssh-keygen): --trust's
    file is read only beside a --bundle (alone it is refused before anything is read), and
    only of a signed one."""
    from megatron_env.bundle import provenance

    from .test_bundle_provenance import keypair
    from .test_bundle_unpack import FILES, write_bundle

    if shutil.which("ssh-keygen") is None:
        return None
    d = tmp_path_factory.mktemp("signed")
    tar = write_bundle(d / "b.tar", FILES)
    provenance.sign(tar, keypair(d, "maker"))
    return tar


def _beside(option: str, signed_bundle: Path | None) -> dict[str, object]:
    """What a command is given beside `option` so that the file is what it works from: --trust
    is read only for a signed --bundle; --find-links adds to the index, and a file uv reads as
    an empty page of links adds nothing (the environment is then built from the index, which
    is not the file's handling): with --no-index the file is the only source."""
    if option == "trust":
        if signed_bundle is None:
            pytest.skip("no ssh-keygen: --trust's file is read only for a signed bundle")
        return {"bundle": [str(signed_bundle)]}
    return {"no_index": True} if option == "find_links" else {}


@pytest.mark.parametrize("name, option", TAKING)
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(min_size=1, max_size=512))
def test_garbage_in_a_file_option_never_reaches_the_bug_handler(tmp_path, monkeypatch, capsys,
                                                                 signed_bundle, name, option,
                                                                 garbage):
    """Every (command, file option) pair, each with its own examples of the bytes. Before: 60
    examples took 225 s, nearly all of it in three pairs that did their work before reading
    the file (`setup`/`env --trust` built an environment and ignored the file, `bundle
    --sign` downloaded the bundle's wheels before it read the key) and in `env --find-links`
    building an environment from the index beside a file uv read as an empty page."""
    cmd = commands.registry()[name]
    d = Path(tempfile.mkdtemp(dir=tmp_path))  # one directory per example: nothing carried over
    f = d / "garbage"
    f.write_bytes(garbage)
    monkeypatch.setenv("UV_OFFLINE", "1")  # whatever a command starts reaches no network
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv(project.STATE_ENV, str(d / "state"))
    monkeypatch.chdir(d)
    kwargs: dict[str, object] = {p: str(d / "out") for p in _required(name) if p != option}
    kwargs.update(_beside(option, signed_bundle))
    kwargs[option] = [str(f)] if option in cmd.iterable else str(f)
    code = cmd(**kwargs)
    err = capsys.readouterr().err
    assert code != 70 and "bug:" not in err, err


#: Options that check a --bundle (and nothing else).
CHECKS_A_BUNDLE = {"trust": "allowed_signers", "expect_sha256": "0" * 64}


@pytest.mark.parametrize("name, option, as_json", [
    (name, p, as_json) for name, cmd in commands.registry().items()
    for p in inspect.signature(cmd.fn).parameters if p in CHECKS_A_BUNDLE
    for as_json in ([False, True] if "json" in inspect.signature(cmd.fn).parameters else [False])])
def test_a_bundle_check_without_a_bundle_is_refused_before_any_work(name, option, as_json,
                                                                     empty):
    """Before: `setup --trust F` and `env --trust F` without --bundle ignored the option and
    built the environment from the network (exit 0: the user took the check as passed);
    `build --trust F` said only that no environment was there."""
    tmp_path, cwd, env = empty
    (cwd / "allowed_signers").write_text("maker@example.org ssh-ed25519 AAAA\n")
    fill = [w for p in _required(name) for w in (_flag(p), "all")]
    argv = [*fill, _flag(option), CHECKS_A_BUNDLE[option], *(["--json"] if as_json else [])]
    r = subprocess.run(_door("megatron-env", name, *argv), cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=300)
    _said_as_usage(r, as_json)
    assert _flag(option) in r.stderr.splitlines()[0] and "--bundle" in r.stderr, r.stderr
    assert _written(tmp_path) == ["cwd/allowed_signers"], r.stderr


# ------------------------------------------------------------------ a lock that is not UTF-8


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    from .test_lock import copy_repo

    return copy_repo(tmp_path_factory.mktemp("lockrepo"))


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=0, max_value=10**6), st.sampled_from([b"\xff", b"\x80\x81",
                                                                   b"\xc3(", b"\xed\xa0\x80"]))
def test_a_lock_that_is_not_utf8_is_one_error_naming_it(repo, empty, at, bad):
    """Before: `bug: UnicodeDecodeError` (exit 70) in setup, lock --check and lock-diff,
    nothing on stdout under --json."""
    _tmp, cwd, env = empty
    lock = repo / "envs" / "core_v0.4.0-cu121" / "requirements.lock"
    good = lock.read_bytes()
    cut = at % len(good)
    lock.write_bytes(good[:cut] + bad + good[cut:])
    try:
        for args, as_json in ((["setup", "--only", "lock", "--json", "--prefix",
                                str(cwd / "env")], True),
                              (["lock", "--check"], False),
                              (["lock-diff", "--offline", "--base", "HEAD", "--json"], True)):
            r = subprocess.run([str(EXE), "--project", str(repo), *args,
                                "--profile", "core_v0.4.0-cu121"], cwd=cwd, env=env,
                               capture_output=True, text=True, timeout=300)
            assert r.returncode in (1, 2) and "bug:" not in r.stderr, (args, r.stderr)
            assert str(lock) in r.stderr or str(lock) in r.stdout, (args, r.stderr)
            if as_json:
                doc = json.loads(r.stdout)
                said = doc.get("error") or doc
                assert "not UTF-8" in json.dumps(said), (args, doc)
    finally:
        lock.write_bytes(good)
