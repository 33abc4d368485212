#!/usr/bin/env python3
"""How much of the package can the test suite tell apart from a broken copy of itself?

A random sample of small mutants (a comparison or operator swapped, a constant changed, a return
value dropped, a statement removed, a condition negated), stratified over every module of
megatron_env (decorated functions too: the whole module's AST is mutated), each run against the
tests that execute its line and nothing else. Which tests execute which line comes from one
coverage run of the whole suite with a context per test, subprocesses included (a child Python
started by a test reports under that test's id). A mutant that survives its covering tests is
run again against every test file that imports its module; one that survives that too is
counted as surviving, unless it is listed as equivalent (it cannot change behaviour), each with
the reason, in EQUIVALENT below. Kills are checked too: every test that killed a mutant is run
on the unmutated copy, and a kill by a test that fails there would not count.

Why not mutmut: it skips decorated functions (every command, every lru_cache), takes hours for
the whole package, and its table measured a few modules at old commits. The sample is cheap
enough to run again at every release, and its 95% interval says how far to trust it.

    python bench/mutation_sample.py contexts            # the coverage run (about the suite's time)
    python bench/mutation_sample.py run                 # sample and run; writes the JSON
    python bench/mutation_sample.py run --only ID ...   # one mutant again, by its id

Runs in a copy of the tree (a temporary directory), one mutant at a time, each with a timeout (a
mutant that hangs its tests is counted as killed: the suite noticed). Results:
bench/results/mutation-sample.json.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import queue
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "megatron_env"
WORK = Path(os.environ.get("MUTATION_SAMPLE_DIR")
            or Path(tempfile.gettempdir()) / "mutation-sample")
RESULT = ROOT / "bench" / "results" / "mutation-sample.json"
CONTEXT_ENV = "MUTATION_SAMPLE_CONTEXT"  # the running test's id, read by child processes' coverage

# ---------------------------------------------------------------------------------------------
# The pytest plugin of the coverage run (loaded with -p mutation_sample): each test's lines go to
# a context named by its node id, in this process and in every Python it starts.


def pytest_runtest_logstart(nodeid, location):
    os.environ[CONTEXT_ENV] = nodeid
    import coverage

    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(nodeid)


_TIMES: dict[str, list] = {}


def pytest_runtest_logreport(report):
    t = _TIMES.setdefault(report.nodeid, [0.0, "passed"])
    t[0] += report.duration
    if report.failed or (report.skipped and report.when != "teardown"):
        t[1] = report.outcome


def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput") and os.environ.get("MUTATION_SAMPLE_TIMES"):
        Path(os.environ["MUTATION_SAMPLE_TIMES"]).write_text(json.dumps(_TIMES, indent=0))


def contexts(pytest_args: list[str]) -> int:
    """Run the suite under coverage, one context per test; WORK/coverage/ holds the data."""
    out = WORK / "coverage"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rc = out / "rc"
    rc.write_text("[run]\n"
                  f"data_file = {out / 'data'}\n"
                  "parallel = true\n"
                  f"source_pkgs = {PACKAGE}\n"
                  f"context = ${{{CONTEXT_ENV}-}}\n")
    env = dict(os.environ, COVERAGE_PROCESS_START=str(rc),
               MUTATION_SAMPLE_TIMES=str(out / "times.json"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "bench"),
                                                        os.environ.get("PYTHONPATH")])))
    env.pop(CONTEXT_ENV, None)
    code = subprocess.call([sys.executable, "-m", "pytest", "-p", "mutation_sample",
                            "-p", "no:cacheprovider", *pytest_args], cwd=ROOT, env=env)
    subprocess.call([sys.executable, "-m", "coverage", "combine", "--rcfile", str(rc), "-q"],
                    cwd=out)
    return code



# ---------------------------------------------------------------------------------------------
# The mutants: one small change of one AST node, written back into the source text at the
# node's span (the rest of the file is left byte for byte).


@dataclass
class Mutant:
    module: str  # megatron_env/pyenv/lock.py
    line: int  # first line of the changed node
    col: int
    end_line: int
    end_col: int
    stmt_line: int  # first line of the statement holding it (coverage reports statements)
    kind: str  # compare, binop, boolop, not, constant, return, negate, drop, delete, jump
    new: str  # the text that replaces the span

    @property
    def id(self) -> str:
        return f"{self.module}:{self.line}:{self.col}:{self.kind}"

    def apply(self, src: str) -> str:
        lines = src.splitlines(keepends=True)
        offset = [0]
        for line in lines:
            offset.append(offset[-1] + len(line.encode()))
        b = src.encode()
        start = offset[self.line - 1] + self.col
        end = offset[self.end_line - 1] + self.end_col
        return (b[:start] + self.new.encode() + b[end:]).decode()


SWAP_CMP = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt,
            ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In,
            ast.Is: ast.IsNot, ast.IsNot: ast.Is}
SWAP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
            ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
            ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr, ast.LShift: ast.RShift,
            ast.RShift: ast.LShift}


def _docstring(node: ast.AST) -> ast.AST | None:
    body = getattr(node, "body", None)
    if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
        return body[0]
    return None


def _skipped(tree: ast.Module) -> set[int]:
    """ids of nodes not mutated: docstrings, annotations, f-string parts (text the program does
    not act on, or cannot be rewritten at its span), `if TYPE_CHECKING:` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        parts: list[ast.AST | None] = [_docstring(node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts += [node.returns] + [a.annotation for a in ast.walk(node.args)
                                       if isinstance(a, ast.arg)]
        elif isinstance(node, ast.AnnAssign):
            parts.append(node.annotation)
        elif isinstance(node, ast.JoinedStr) or (
                isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            parts.append(node)
        for part in parts:
            if part is not None:
                out.update(id(n) for n in ast.walk(part))
    return out


def _changed_constant(v: object) -> str | None:
    """True<->False, an integer plus one, a float doubled plus one, a string emptied (an empty
    one made "XX")."""
    if isinstance(v, bool):
        return repr(not v)
    if isinstance(v, int):
        return repr(v + 1)
    if isinstance(v, float):
        return repr(v * 2 + 1)
    if isinstance(v, str):
        return repr(v[:0] if v else "XX")
    if isinstance(v, bytes):
        return repr(v[:0] if v else b"XX")
    return None


def _compares(node: ast.Compare) -> list[str]:
    out = []
    for i, op in enumerate(node.ops):
        if type(op) in SWAP_CMP:
            ops = list(node.ops)
            ops[i] = SWAP_CMP[type(op)]()
            out.append(ast.unparse(ast.Compare(node.left, ops, node.comparators)))
    return out


def _drops(node: ast.List | ast.Tuple | ast.Set) -> list[str]:
    """One element of a literal collection dropped, each in turn."""
    out = []
    for i in range(len(node.elts)):
        rest = node.elts[:i] + node.elts[i + 1:]
        rebuilt = ast.Set(rest) if isinstance(node, ast.Set) else type(node)(rest, ast.Load())
        text = ast.unparse(rebuilt)
        out.append("(" + text + ")" if isinstance(node, ast.Tuple) else text)
    return out


def _changes(node: ast.AST, segment: str) -> list[tuple[ast.AST, str, str]]:
    """(node whose span is replaced, kind, new text) for each mutant of one node."""
    if isinstance(node, ast.Compare):
        return [(node, "compare", text) for text in _compares(node)]
    if isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
        return [(node, "binop", ast.unparse(ast.BinOp(node.left, SWAP_BIN[type(node.op)](),
                                                      node.right)))]
    if isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        return [(node, "boolop", "(" + ast.unparse(ast.BoolOp(other, node.values)) + ")")]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        return [(node, "not", "(" + ast.unparse(node.operand) + ")")]
    if isinstance(node, ast.Constant):
        new = _changed_constant(node.value)
        return [(node, "constant", new)] if new is not None else []
    if isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        return [(node, "return", "return None")]
    if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
        return [(node.test, "negate", "not (" + segment + ")")]
    if (isinstance(node, (ast.List, ast.Tuple, ast.Set)) and len(node.elts) >= 2
            and all(isinstance(e, ast.Constant) for e in node.elts)
            and isinstance(getattr(node, "ctx", ast.Load()), ast.Load)):
        return [(node, "drop", text) for text in _drops(node)]
    if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)) or isinstance(
            node, ast.AugAssign):
        return [(node, "delete", "pass")]
    if isinstance(node, (ast.Break, ast.Continue)):
        return [(node, "jump", "continue" if isinstance(node, ast.Break) else "break")]
    return []


def candidates(module: str, src: str) -> list[Mutant]:
    """Every mutant of one module that compiles (deterministic order)."""
    tree = ast.parse(src)
    skip = _skipped(tree)
    stmt_of: dict[int, int] = {}

    def innermost(node: ast.AST, line: int) -> None:
        line = node.lineno if isinstance(node, ast.stmt) else line
        stmt_of[id(node)] = line
        for child in ast.iter_child_nodes(node):
            innermost(child, line)

    innermost(tree, 1)
    seen: dict[str, int] = {}
    out: list[Mutant] = []
    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "lineno"):
            continue
        test = getattr(node, "test", None)
        segment = ast.get_source_segment(src, test) if isinstance(test, ast.AST) else ""
        for target, kind, new in _changes(node, segment or ""):
            m = Mutant(module, target.lineno, target.col_offset,
                       target.end_lineno or target.lineno, target.end_col_offset or 0,
                       stmt_of.get(id(target), target.lineno), kind, new)
            n = seen[m.id] = seen.get(m.id, 0) + 1
            if n > 1:  # several mutants of one kind at one node (a tuple's elements): numbered
                m.kind += f"{n}"
            text = m.apply(src)
            try:
                compile(text, module, "exec")
            except SyntaxError:
                continue
            if text != src:
                out.append(m)
    return out


def modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / PACKAGE).rglob("*.py"))


def sample(n: int, seed: int, floor: int) -> tuple[list[Mutant], dict[str, int]]:
    """n mutants spread over the modules in proportion to their mutants, at least `floor` from
    each module that has any (stratified: a small module is never left out by chance)."""
    rng = random.Random(seed)
    every = {m: candidates(m, (ROOT / m).read_text()) for m in modules()}
    total = sum(map(len, every.values()))
    chosen: list[Mutant] = []
    for cands in every.values():
        k = min(len(cands), max(floor, round(n * len(cands) / total)))
        chosen += rng.sample(cands, k)
    return chosen, {m: len(c) for m, c in every.items()}


# ---------------------------------------------------------------------------------------------
# Which tests run a line: the coverage run's contexts. Which test files import a module: their
# import statements (one level through the tests' own helper modules).


def coverage_map() -> tuple[dict[tuple[str, int], set[str]], dict[str, float]]:
    from coverage.numbits import numbits_to_nums

    data = WORK / "coverage"
    db = sqlite3.connect(data / "data")
    files = {i: p for i, p in db.execute("select id, path from file")}
    ctxs = {i: c for i, c in db.execute("select id, context from context")}
    out: dict[tuple[str, int], set[str]] = {}
    for fid, cid, bits in db.execute("select file_id, context_id, numbits from line_bits"):
        path = files[fid]
        if f"/{PACKAGE}/" not in path:
            continue
        rel = PACKAGE + "/" + path.rsplit(f"/{PACKAGE}/", 1)[1]
        for line in numbits_to_nums(bits):
            out.setdefault((rel, line), set()).add(ctxs[cid])
    times = {k: v[0] for k, v in json.loads((data / "times.json").read_text()).items()
             if v[1] == "passed"}
    # a test of a file with a heavy module fixture (an environment built once for the file)
    # costs that fixture when it runs alone: its file's longest test added to its own time
    longest: dict[str, float] = {}
    for k, v in times.items():
        f = k.split("::")[0]
        longest[f] = max(longest.get(f, 0.0), v)
    return out, {k: v + (longest[k.split("::")[0]] if longest[k.split("::")[0]] > 30 else 0.0)
                 for k, v in times.items()}


def importers() -> dict[str, set[str]]:
    """module path -> the test files that import it (directly, or through a helper of tests/)."""
    tests = ROOT / "tests"

    def imported(path: Path) -> set[str]:
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = ("tests." if node.level else "") + node.module
                names.add(base)
                names.update(f"{base}.{a.name}" for a in node.names)
        return names

    helpers = {p.stem: imported(p) for p in tests.glob("*.py") if not p.name.startswith("test_")}
    out: dict[str, set[str]] = {}
    for p in sorted(tests.glob("test_*.py")):
        names = imported(p)
        for h, hnames in helpers.items():
            if f"tests.{h}" in names or h in names:
                names |= hnames
        for name in names:
            if name.startswith(PACKAGE):
                rel = name.replace(".", "/")
                for cand in (rel + ".py", rel + "/__init__.py"):
                    out.setdefault(cand, set()).add(f"tests/{p.name}")
    return out


# ---------------------------------------------------------------------------------------------
# Running: a copy of the tree (a git repository of its own: tests list its files with git), the
# mutant written into it, pytest on the chosen tests with that copy first on the path.

EQUIVALENT: dict[str, str] = {
    # mutant id -> why it cannot change what the program does (read and judged by hand)
    "megatron_env/bundle/manifest.py:151:59:constant":
        "the item's name kept in Item.extra as well: extra is read only through "
        "Item.__getitem__, which starts from the name and lets extra override it with the same "
        "value; nothing iterates extra, and a name is a string, so the type check passes too",
    "megatron_env/kernels/jobserver.py:38:18:constant":
        "Size not frozen: frozen forbids assignment after creation and makes instances "
        "hashable; no code assigns to a Size or hashes one (together.py reads .slots and .why)",
}


def _tree(name: str) -> Path:
    tree = WORK / name
    shutil.rmtree(tree, ignore_errors=True)
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    for rel in files:
        if (ROOT / rel).is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tree / rel)
    git = ["git", "-C", str(tree), "-c", "user.name=m", "-c", "user.email=m@m"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "tree"], check=True)
    return tree


def _env(tree: Path) -> dict[str, str]:
    """The tests' environment: the tree's package first on the path, no coverage."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    for k in ("COVERAGE_PROCESS_START", CONTEXT_ENV, "PYTEST_ADDOPTS"):
        env.pop(k, None)
    return env


def _pytest(tree: Path, tests: list[str], timeout: float,
            extra: tuple[str, ...] = ()) -> tuple[str, str]:
    """('killed'|'survived'|'timeout', the first failing test or '') for `tests` run in `tree`."""
    if not tests:
        return "survived", ""
    env = _env(tree)
    args = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-n", "0", "-p", "no:cacheprovider",
            "--basetemp", str(WORK / f"pt-{tree.name}"), *extra, *tests]
    with subprocess.Popen(args, cwd=tree, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as p:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the tests' children too (uv, compilers, daemons)
            p.communicate()
            return "timeout", ""
    r = subprocess.CompletedProcess(args, p.returncode, out, "")
    if r.returncode == 0:
        return "survived", ""
    if r.returncode == 5:  # all deselected (slow tests only): nothing more to run
        return "survived", ""
    failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in r.stdout.splitlines()
              if ln.startswith(("FAILED ", "ERROR "))]
    return "killed", failed[0] if failed else f"exit {r.returncode}"


def _failing(tree: Path, tests: list[str]) -> list[str]:
    """Those of `tests` that fail on the unmutated tree (all run in one pytest, no -x)."""
    if not tests:
        return []
    env = _env(tree)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfE", "-n", "0", "-p",
                        "no:cacheprovider", "--basetemp", str(WORK / f"pt-{tree.name}"), *tests],
                       cwd=tree,
                       env=env, capture_output=True, text=True)
    return sorted({ln.split(" ", 1)[1].split(" - ")[0] for ln in r.stdout.splitlines()
                   if ln.startswith(("FAILED ", "ERROR "))})


def _covering(m: Mutant, cov: dict[tuple[str, int], set[str]],
              times: dict[str, float]) -> list[str]:
    """The passing tests that ran the mutant's lines, fastest first."""
    lines = range(min(m.stmt_line, m.line), m.end_line + 1)
    ids = set().union(*(cov.get((m.module, n), set()) for n in lines)) - {""}
    return sorted((t for t in ids if t in times), key=lambda t: (times[t], t))


def _records() -> dict[str, dict]:
    """The last record of each mutant (by id and its module's text) in WORK/results.jsonl."""
    done: dict[str, dict] = {}
    log = WORK / "results.jsonl"
    if log.exists():
        for line in log.read_text().splitlines():
            r = json.loads(line)
            done[r["id"] + r["source_sha"]] = r
    return done


def run(n: int, seed: int, floor: int, only: list[str], budget: float, workers: int,
        added: list[str]) -> int:
    """Sample, run what has no record yet (or `only` these ids again, with the tests `added`
    since the coverage run put first among their covering tests), write the result."""
    everything, counts = sample(n, seed, floor)
    chosen = [m for m in everything if m.id in only] if only else everything
    cov, times = coverage_map()
    times.update(dict.fromkeys(added, 1.0))
    imp = importers()
    log = WORK / "results.jsonl"
    done = _records()
    trees = [_tree(f"tree{i}") for i in range(workers)]
    order = random.Random(seed).sample(chosen, len(chosen))  # a cut-short run is spread out
    lock = threading.Lock()
    # pass 1: every mutant against the cheapest tests covering its line; pass 2: survivors
    # against more of them; pass 3: survivors against every test file importing the module
    # (the slow part, and only for the few that live)
    for stage in ("covering", "rest", "confirm"):
        todo: queue.Queue[tuple[int, Mutant]] = queue.Queue()
        for i, m in enumerate(order):
            if _due(done.get(m.id + _sha((ROOT / m.module).read_text())), stage, bool(only)):
                todo.put((i, m))

        def work(tree: Path, stage: str = stage, todo: queue.Queue = todo) -> None:
            while True:
                try:
                    i, m = todo.get_nowait()
                except queue.Empty:
                    return
                src = (ROOT / m.module).read_text()
                rec = _one(m, src, tree, stage, added + _covering(m, cov, times), times, imp,
                           budget)
                with lock:
                    with log.open("a") as f:
                        f.write(json.dumps(rec) + "\n")
                    done[m.id + rec["source_sha"]] = rec
                    print(f"{stage[:5]} {i + 1:4}/{len(order)} {rec['result']:8} {m.id} "
                          f"{rec['secs']}s {rec['by']}", file=sys.stderr, flush=True)

        threads = [threading.Thread(target=work, args=(t,)) for t in trees]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return report(everything, counts, done, trees[0])


def _cheapest(tests: list[str], times: dict[str, float], budget: float) -> list[str]:
    """The first of `tests` (cheapest first) that fit in `budget` seconds, at least one."""
    out, spent = [], 0.0
    for t in tests:
        if out and spent + times[t] > budget:
            break
        out.append(t)
        spent += times[t]
    return out


def _due(old: dict | None, stage: str, again: bool) -> bool:
    """Whether a mutant with this last record runs in this pass."""
    if stage == "covering":
        return old is None or again
    before = {"rest": "covering", "confirm": "rest"}[stage]
    return old is not None and old["result"] == "survived" and old["stage"] == before


def _one(m: Mutant, src: str, tree: Path, stage: str, covering: list[str],
         times: dict[str, float], imp: dict[str, set[str]], budget: float) -> dict:
    """One mutant written into the tree, its tests run, the tree restored: its record."""
    (tree / m.module).write_text(m.apply(src))
    t0 = time.time()
    try:
        if stage in ("covering", "rest"):
            # the cheapest covering tests up to `budget` seconds of test time; then the next
            # ones, up to ten times that
            start = 0 if stage == "covering" else len(_cheapest(covering, times, budget))
            ran = _cheapest(covering[start:], times, budget * (1 if stage == "covering" else 10))
            timeout = 60 + 3 * sum(times[t] for t in ran)
            how, by = _pytest(tree, ran, timeout)
        else:
            # every test file importing the module, and the files of the covering tests, less
            # their slow tests (an environment built, minutes each): pass 1 ran those of them
            # that cover the line within its budget
            files = sorted(imp.get(m.module, set()) | {t.split("::")[0] for t in covering})
            ran = files
            timeout = min(900, 120 + 3 * sum(v for k, v in times.items()
                                             if k.split("::")[0] in files))
            how, by = _pytest(tree, files, timeout, extra=("-m", "not slow"))
    finally:
        (tree / m.module).write_text(src)
    return {**asdict(m), "id": m.id, "source_sha": _sha(src), "result": how, "by": by,
            "stage": stage, "covering": len(covering), "ran": ran, "timeout": timeout,
            "secs": round(time.time() - t0, 1)}


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of k successes in n."""
    if not n:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (round(c - h, 4), round(c + h, 4))


def report(chosen: list[Mutant], counts: dict[str, int], done: dict[str, dict],
           tree: Path, check_kills: bool = True) -> int:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    recs = []
    for m in chosen:
        r = done.get(m.id + _sha((ROOT / m.module).read_text()))
        if r is not None:
            recs.append(r)
    # a kill counts only if its test passes without the mutant
    killers = sorted({r["by"] for r in recs if r["result"] == "killed" and "::" in r["by"]})
    bad = _failing(tree, killers) if check_kills else []
    for r in recs:  # a timeout is a kill where the same tests end in time without the mutant
        if r["result"] == "timeout" and "hung" not in r:
            extra = ("-m", "not slow") if r["stage"] == "confirm" else ()
            r["hung"] = _pytest(tree, r["ran"], r["timeout"], extra)[0] == "survived"
    per: dict[str, dict] = {m: {"mutants_total": c, "sampled": 0, "killed": 0, "survived": 0,
                                "equivalent": 0} for m, c in counts.items()}
    survivors, equivalent = [], []
    for r in recs:
        row = per[r["module"]]
        row["sampled"] += 1
        if r["id"] in EQUIVALENT:
            row["equivalent"] += 1
            equivalent.append({"id": r["id"], "new": r["new"], "reason": EQUIVALENT[r["id"]]})
        elif (r["result"] == "killed" and r["by"] not in bad) or r.get("hung"):
            row["killed"] += 1
        else:
            row["survived"] += 1
            survivors.append({"id": r["id"], "new": r["new"], "covering_tests": r["covering"],
                              "confirmed": r["stage"] == "confirm"})
    killed = sum(r["killed"] for r in per.values())
    counted = len(recs) - len(equivalent)
    low, high = wilson(killed, counted)
    out = {
        "commit": commit,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "method": "bench/mutation_sample.py (see its docstring): stratified random sample, "
                  "each mutant run against the tests covering its line, survivors against "
                  "every test file importing the module",
        "seed_and_size": {"seed": SEED, "asked": len(chosen)},
        "modules": len(counts),
        "modules_sampled": sum(1 for r in per.values() if r["sampled"]),
        "modules_without_mutants": sorted(m for m, c in counts.items() if not c),
        "mutants": len(recs),
        "killed": killed,
        "timeouts_counted_killed": sum(1 for r in recs if r.get("hung")),
        "timeouts_not_counted": sum(1 for r in recs if r["result"] == "timeout"
                                    and not r.get("hung")),
        "survived": len(survivors),
        "equivalent": equivalent,
        "kill_rate": round(killed / counted, 4) if counted else None,
        "kill_rate_95": [low, high],
        "kills_checked": check_kills,  # each killing test run again without the mutant
        "kills_discarded": bad,
        "survivors": survivors,
        "per_module": per,
    }
    RESULT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{killed}/{counted} killed ({out['kill_rate']:.1%}, 95% {low:.1%}-{high:.1%}), "
          f"{len(equivalent)} equivalent, {len(survivors)} survived", file=sys.stderr)
    return 0


SEED = 46

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("contexts", help="the coverage run (per-test contexts)")
    c.add_argument("pytest_args", nargs="*", default=["-n", "2", "--dist", "loadfile", "-q"])
    r = sub.add_parser("run", help="sample the mutants and run them")
    r.add_argument("--budget", type=float, default=20.0,
                   help="seconds of (recorded) test time in a mutant's first run")
    r.add_argument("--workers", type=int, default=1,
                   help="mutants run at once, each in its own copy of the tree")
    r.add_argument("--only", nargs="*", default=[], help="mutant ids to run again")
    r.add_argument("--added", nargs="*", default=[],
                   help="tests written since the coverage run, run first for the --only ids")
    q = sub.add_parser("report", help="the JSON from the records so far (a run cut short)")
    q.add_argument("--unchecked", action="store_true",
                   help="kills not run again on the unmutated tree (a test that passed in the "
                        "coverage run is trusted to pass again)")
    for x in (r, q):
        x.add_argument("--mutants", type=int, default=380,
                       help="the size asked; each module gets at least --floor (403 in all)")
        x.add_argument("--floor", type=int, default=2, help="at least this many per module")
    a = ap.parse_args()
    if a.cmd == "contexts":
        sys.exit(contexts(a.pytest_args))
    if a.cmd == "report":
        chosen, counts = sample(a.mutants, SEED, a.floor)
        sys.exit(report(chosen, counts, _records(), _tree("tree-report"), not a.unchecked))
    sys.exit(run(a.mutants, SEED, a.floor, a.only, a.budget, a.workers, a.added))
