"""`invoke triage` on PyTorch flight-recorder dumps made here by real gloo jobs that hang
(tests/flight_jobs.py: a rank that skips a collective, one that calls another op, one that
stalls a subgroup so the default group waits), torch's own analyzer as the oracle for the
missing ranks, and dumps that are cut, garbage or hostile."""

from __future__ import annotations

import importlib.util
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_env.diagnose import jobs
from megatron_env.diagnose.flight import analysis, dump, report
from megatron_env.errors import UserError
from megatron_env.findings import Status

ROOT = Path(__file__).resolve().parent.parent
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch makes the dumps")
HANGS = ("skip", "other", "subgroup")
# the real console log whose watchdog lines are fused with the dumps (tests/fixtures/job-logs)
WATCHDOG_LOG = ROOT / "tests/fixtures/job-logs/watchdog-blocking-wait-allreduce-diffusers12422.log"


@pytest.fixture(scope="session")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of every scenario (12 ranks at once, torch imported once), for the session."""
    if not HAS_TORCH:
        pytest.skip("torch makes the dumps")
    out = tmp_path_factory.mktemp("flight")
    r = subprocess.run(["timeout", "-k", "5", "120", sys.executable,
                        str(ROOT / "tests/flight_jobs.py"), str(out), "4",
                        ",".join((*HANGS, "size", "dtype", "clean"))], capture_output=True,
                       text=True,
                       env={**os.environ, "TORCH_FR_BUFFER_SIZE": "64"})
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def _dumps(d: Path) -> list[dump.Dump]:
    return report.read(sorted(d.iterdir()))


@needs_torch
@pytest.mark.parametrize("form", ["", "-json"])
@pytest.mark.parametrize("scenario,root,op,pg,waiting", [
    ("skip", [2], "all_reduce", "0", {0: "0", 1: "0", 3: "0"}),
    ("other", [1], "all_gather", "0", {0: "0", 2: "0", 3: "0"}),
    ("subgroup", [2], "all_reduce", "0", {1: "1", 0: "0", 3: "0"}),
])
def test_each_hang_is_traced_to_its_root(made: Path, form: str, scenario: str, root: list[int],
                                          op: str, pg: str, waiting: dict[int, str]) -> None:
    h = analysis.analyse(_dumps(made / f"{scenario}{form}"))
    assert h is not None
    assert h.roots == root
    assert {w.rank: w.pg for w in h.waits if w.rank not in root} == waiting
    assert [w.rank for w in h.waits if w.rank not in root][0] == next(iter(waiting))
    dv = h.divergences[0]
    assert (dv.pg, dv.seq) == (pg, 4)
    if scenario == "other":
        assert dv.other_op == {1: op} and dv.op == "all_reduce"
    else:
        assert op == dv.op and set(root) <= set(dv.missing)
    # every rank completed the three all_reduces before it
    assert set(h.last_done.values()) == {("0", "default_pg", 3, "all_reduce")}
    if not form:  # the pickle holds the stacks: the root's own line of tests/flight_jobs.py
        assert any(f[1].endswith("flight_jobs.py") for f in h.frames[root[0]])


@needs_torch
@pytest.mark.parametrize("scenario,differs", [("size", "sizes [[9]]"),
                                              ("dtype", "dtypes ['Double']")])
def test_size_or_dtype_mismatch_names_the_odd_rank(made: Path, scenario: str,
                                                   differs: str) -> None:
    """gloo aborts the rank that receives the odd data, so one dump is missing: the odd rank
    is still the root, and the missing dump is said."""
    dumped = {dump.rank_of(p) for p in (made / scenario).iterdir()}
    assert len(dumped) == 3 and 3 in dumped
    fs, _, _ = jobs.run([str(made / scenario)])
    f = fs[0]
    assert (f.id, f.status) == ("job.hang", Status.FAIL)
    assert f.summary.startswith("hang: rank 3 entered all_reduce #4 of the default group with "
                                "sizes "), f.summary
    assert differs in f.summary
    (absent,) = {0, 1, 2, 3} - dumped
    assert any(e.startswith(f"no dump of rank {absent}, which the process-group config names")
               for e in f.evidence), f.evidence


@needs_torch
def test_subgroup_stall_names_root_first_then_the_waiters(made: Path) -> None:
    fs, lines, srcs = jobs.run([str(made / "subgroup")])
    f = fs[0]
    assert (f.id, f.status, f.kind) == ("job.hang", Status.FAIL, "communication")
    assert f.summary.startswith("hang: rank 2 never arrived")
    assert f.summary.index("rank 1 waits in all_reduce #1 of group 1") < f.summary.index(
        "ranks 0 and 3 wait in all_reduce #4 of the default group")
    assert lines == 0 and len(srcs) == 4


@needs_torch
def test_clean_job_shows_no_hang(made: Path) -> None:
    """Dumped right after the last barrier: gloo may not have marked it completed yet, which
    is at most a warning that names no rank, never a failure."""
    fs, _, _ = jobs.run([str(made / "clean")])
    assert [f.id for f in fs] == ["job.hang"]
    assert fs[0].status is Status.PASS or (
        fs[0].status is Status.WARN and fs[0].summary.endswith("no rank is behind"))


@needs_torch
@pytest.mark.parametrize("scenario", HANGS)
def test_torch_analyzer_names_the_same_missing_ranks(made: Path, scenario: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """torch's analyzer, given the membership gloo leaves out and the entries' backend renamed
    (it asserts nccl/xccl), names the same missing ranks per collective; where a rank entered
    another op it flags the collective without naming the rank, which ours does."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig

    groups = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("undefined", [1, 2])}
    details = {}
    for p in sorted((made / scenario).iterdir()):
        r = dump.rank_of(p)
        raw = pickle.loads(p.read_bytes())  # our own job's file: trusted here, for the oracle
        details[p.name] = {
            "host_name": f"host{r}", "rank": r, "version": raw["version"],
            "entries": [{**e, "profiling_name": e["profiling_name"].replace("gloo:", "nccl:")}
                        for e in raw["entries"]],
            "pg_config": {g: {"name": g, "desc": d, "ranks": str(ms)}
                          for g, (d, ms) in groups.items() if r in ms}}
    db = build_db(details, JobConfig().parse_args([str(made / scenario)]), raw["version"])
    capsys.readouterr()
    theirs = {(c.group_id, c.collective_seq_id): sorted(c.missing_ranks or [])
              for c in db.collectives if c.missing_ranks or not c.pass_check}
    h = analysis.analyse(_dumps(made / scenario))
    assert h is not None
    ours = {(dv.pg, dv.seq): dv.missing for dv in h.divergences}
    ours |= {(w.pg, w.seq): w.on for w in h.waits if w.pg in h.unknown_peers}
    assert ours == theirs


@needs_torch
def test_logs_fused_agree_and_differ(made: Path, tmp_path: Path) -> None:
    """The watchdog lines of a real log (SeqNum 2521) differ from the dumps (#4); the same
    lines with the dumps' SeqNum agree for the rank both hold (the log has ranks 1, 5, 7)."""
    real = WATCHDOG_LOG.read_text()
    (tmp_path / "job.log").write_text(real)
    fs, _, _ = jobs.run([str(made / "skip"), str(tmp_path / "job.log")])
    hang = next(f for f in fs if f.id == "job.hang")
    assert any("differ: rank 1's log timed out in ALLREDUCE SeqNum 2521" in e
               for e in hang.evidence)
    (tmp_path / "job.log").write_text(real.replace("SeqNum=2521", "SeqNum=4"))
    fs, _, _ = jobs.run([str(made / "skip"), str(tmp_path / "job.log")])
    ids = [f.id for f in fs]
    assert ids.index("job.hang") < ids.index("job.timeout")
    hang = fs[ids.index("job.hang")]
    said = "\n".join(hang.evidence)
    assert "the logs agree: the watchdog of rank 1 timed out" in said, said
    assert "no dump of ranks 5 and 7, whose logs timed out" in said


@needs_torch
def test_hosts_from_directory_names(made: Path, tmp_path: Path) -> None:
    for p in (made / "skip").iterdir():
        r = dump.rank_of(p)
        (tmp_path / f"node{r // 2}").mkdir(exist_ok=True)
        shutil.copy(p, tmp_path / f"node{r // 2}" / p.name)
    fs, _, _ = jobs.run([str(tmp_path / "node0"), str(tmp_path / "node1")])
    assert fs[0].summary.startswith("hang: rank 2 on node1 never arrived")


def _cli(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", "triage", *map(str, paths)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


@needs_torch
def test_cli_exit_1_root_first(made: Path) -> None:
    r = _cli(made / "other-json")
    assert r.returncode == 1, r.stderr
    assert "job.hang  fail  hang: rank 1 entered all_gather #4 of the default group" in r.stdout


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("proto", [2, 4])
def test_hostile_pickle_runs_nothing(tmp_path: Path, proto: int) -> None:
    marker = tmp_path / "ran"
    bad = tmp_path / "nccl_trace_rank_0"
    bad.write_bytes(pickle.dumps({"version": "2.10", "entries": [_Evil(marker)]},
                                 protocol=proto))
    r = _cli(bad)
    assert r.returncode == 2
    assert not marker.exists()
    assert "Traceback" not in r.stderr
    said = [x for x in r.stderr.splitlines() if str(bad) in x]
    assert len(said) == 1 and "refused GLOBAL" in said[0] and "system" in said[0], r.stderr
    with pytest.raises(UserError) as e:
        dump.read(bad)
    assert e.value.kind == "triage.bad-dump" and not marker.exists()


def test_protocol_0_pickle_is_no_dump_and_runs_nothing(tmp_path: Path) -> None:
    """A text (protocol 0) pickle is not what torch writes: read as a log, never unpickled."""
    marker = tmp_path / "ran"
    p = tmp_path / "trace_0"
    p.write_bytes(pickle.dumps(_Evil(marker), protocol=0))
    assert not dump.sniff(p)
    _cli(p)
    assert not marker.exists()


def test_json_that_is_not_a_dump_is_read_as_a_log(tmp_path: Path) -> None:
    p = tmp_path / "events.json"
    p.write_text('{"level": "error", "msg": "CUDA error: an illegal memory access was '
                 'encountered"}\n')
    assert not dump.sniff(p)
    fs, lines, _ = jobs.run([str(p)])
    assert lines == 1 and all(f.id != "job.hang" for f in fs)


@needs_torch
def test_old_version_refused_by_name(made: Path, tmp_path: Path) -> None:
    raw = pickle.loads((made / "skip" / "nccl_trace_rank_0").read_bytes())
    p = tmp_path / "nccl_trace_rank_0"
    p.write_bytes(pickle.dumps({**raw, "version": "2.2"}, protocol=2))
    with pytest.raises(UserError) as e:
        dump.read(p)
    assert e.value.kind == "triage.old-dump" and "version 2.2" in e.value.message


@needs_torch
def test_a_wrapped_buffer_is_known_by_its_first_record_id(made: Path, tmp_path: Path) -> None:
    src = made / "skip" / "nccl_trace_rank_0"
    raw = pickle.loads(src.read_bytes())
    p = tmp_path / "nccl_trace_rank_0"
    p.write_bytes(pickle.dumps({**raw, "entries": raw["entries"][2:]}, protocol=2))
    assert not dump.read(src).wrapped and dump.read(p).wrapped


@needs_torch
def test_two_dumps_of_one_rank_refused(made: Path) -> None:
    with pytest.raises(UserError) as e:
        jobs.run([str(made / "skip" / "nccl_trace_rank_1"),
                  str(made / "skip-json" / "nccl_trace_rank_1.json")])
    assert e.value.kind == "triage.dump-twice"


_REAL: dict[str, bytes] = {}


def _real(made: Path, name: str) -> bytes:
    if name not in _REAL:
        _REAL[name] = (made / name).read_bytes()
    return _REAL[name]


@needs_torch
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_cut_dump_is_one_clear_error(made: Path, tmp_path: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(["subgroup/nccl_trace_rank_1",
                                      "subgroup-json/nccl_trace_rank_1.json"]))
    raw = _real(made, name)
    cut = data.draw(st.integers(64, len(raw) - 2))  # shorter: its first key is cut, no dump
    p = tmp_path / "nccl_trace_rank_1"
    p.write_bytes(raw[:cut])
    assert dump.sniff(p)
    with pytest.raises(UserError) as e:
        dump.read(p)
    assert e.value.kind == "triage.bad-dump" and str(p) in e.value.message


@needs_torch
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=st.sampled_from(HANGS), data=st.data())
def test_a_wrapped_ring_buffer_does_not_move_the_root(made: Path, scenario: str,
                                                      data: st.DataObject) -> None:
    """Each rank's buffer holds only its newest entries: whatever number of the oldest ones
    each rank has lost (before the collective the ranks diverge at), the root is the same."""
    dumps = _dumps(made / scenario)
    want = analysis.analyse(dumps)
    assert want is not None
    for d in dumps:
        # a ring that wrapped is full: it never loses its newest entry
        cut = data.draw(st.integers(0, min(3, len(d.entries) - 1)),
                        label=f"entries rank {d.rank} lost")
        d.entries = d.entries[cut:]
        d.wrapped = cut > 0  # as read from such a file: its first record_id is then > 0
    got = analysis.analyse(dumps)
    assert got is not None
    assert got.roots == want.roots
    assert {w.rank: (w.pg, w.seq) for w in got.waits} == {
        w.rank: (w.pg, w.seq) for w in want.waits}
    for g, w in zip(got.divergences, want.divergences, strict=True):
        assert (g.pg, g.seq, g.op, g.other_op, g.mismatch) == (
            w.pg, w.seq, w.op, w.other_op, w.mismatch)
        assert set(g.missing) | set(g.unknown) == set(w.missing)  # lost: unknown, not missing


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=st.sampled_from([b"\x80\x02", b"\x80\x04", b'{"entries": ', b'{"version": "2.10", ']),
       body=st.binary(max_size=300))
def test_garbage_after_a_dump_head_is_a_user_error(tmp_path: Path, head: bytes,
                                                   body: bytes) -> None:
    p = tmp_path / "trace_3"
    p.write_bytes(head + body)
    try:
        d = dump.read(p)
    except UserError as e:
        assert e.kind in ("triage.bad-dump", "triage.old-dump") and str(p) in e.message
    else:
        assert d.rank == 3
