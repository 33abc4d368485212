"""Triage by the log's structure (tests/fixtures/job-logs/README.md cites every log): lines made
plain before tags are read, the signatures of fatal signals, stalls, bare NCCL errors and ibv_*
errnos, one model of the job's processes, rank ranges, and the inputs a user has (compressed
logs, stdin, a directory holding things that are not logs)."""

import bz2
import gzip
import lzma
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_env.diagnose import events as events_mod
from megatron_env.diagnose import joblog, jobs, launch, logfiles, model, triage

from .conftest import FIXTURES, user_error

LOGS = FIXTURES / "job-logs"
ROOT = FIXTURES.parent.parent


def run(name):
    fs = triage.triage(logfiles.read([LOGS / name]))
    return fs, {f.id: f for f in fs}


def blob(fs):
    return "\n".join(f"{f.id} {f.status} {f.summary} | {' | '.join(f.evidence)} | {f.fix}"
                     for f in fs)


# ---------------------------------------------------------------------------- signatures


def test_ibv_einval_is_not_given_the_memlock_advice_and_names_the_collective():
    fs, f = run("ibv-reg-mr-einval-coalesced-nccl1842.log")
    e = f["nccl.ibverbs_call"]
    assert fs[0].id == "nccl.ibverbs_call"
    assert "ibv_reg_mr_iova2 failed with EINVAL (Invalid argument)" in e.summary
    assert "in allgather_into_tensor_coalesced" in e.summary
    assert "ulimit" not in e.fix and "memlock" not in e.fix and "GPUDirect" in e.fix
    assert "nccl.system_error" not in f  # the analysis' memlock advice is dropped for EINVAL


def test_ibv_enomem_gets_the_memlock_advice():
    _, f = run("ibv-reg-mr-enomem-title-nccltests206.log")
    e = f["nccl.ibverbs_call"]
    assert "ENOMEM" in e.summary and "ulimit -l unlimited" in e.fix


def test_a_paste_without_the_head_of_its_nccl_error_line_is_still_that_error():
    _, f = run("last-error-without-head-lightning-nccl1514.log")
    e = f["job.nccl_error"]
    assert "'internal error'" in e.summary and "2.14.3" in e.summary
    assert "Connection closed by remote peer user<43236>" in e.summary


def test_ray_prefix_peeled_so_last_error_and_host_are_read():
    _, f = run("nccl-internal-last-error-ray-vllm798.log")
    e = f["job.nccl_error"].summary
    assert "on 10.58.226.15" in e and "Connection refused" in e


def test_bus_error_names_each_process_and_points_at_shared_memory():
    fs, f = run("bus-error-two-pids-resiliency6.log")
    s = f["job.signal"]
    assert fs[0].id == "job.signal" and "SIGBUS (Bus error)" in s.summary
    assert s.summary.startswith("pids 1034, 1035 on dgxa100 killed by SIGBUS")
    assert "--ipc=host" in s.fix


def test_faulthandler_segfault_is_a_signal_finding():
    _, f = run("segfault-faulthandler-torchrun-pytorch72086.log")
    assert "SIGSEGV (Segmentation fault)" in f["job.signal"].summary
    assert "build-check" in f["job.signal"].fix


def test_torchrun_table_sigbus_root_cause_with_pid():
    _, f = run("sigbus-torchrun-table-openocr71.log")
    r = f["job.root_cause"]
    assert r.summary == ("torchrun's first observed failure: rank 0 (local rank 0) on host "
                         "server (pid 467397), killed by signal SIGBUS (exit code -7); failed: ranks 0 and 1")
    assert "/dev/shm" in r.fix


def test_failure_table_without_any_heading_is_read():
    """The same real table from its `[0]:` entry on: no `Failures:`, no `Root Cause` line."""
    text = (LOGS / "sigbus-torchrun-table-openocr71.log").read_text().splitlines()
    start = next(i for i, x in enumerate(text) if x.startswith("Root Cause"))
    fs = triage.triage(joblog.normalise("\n".join(text[start + 1:])))
    r = {f.id: f for f in fs}["job.root_cause"]
    assert "rank 0 (local rank 0) on host server (pid 467397)" in r.summary
    assert "SIGBUS" in r.summary


def test_horovod_stall_names_the_missing_rank():
    fs, f = run("horovod-stall-mpirun-tag-split-horovod1012.log")
    s = f["job.stall"]
    assert fs[0].id == "job.stall"
    assert s.summary.startswith("Horovod's stall inspector: rank 1 never submitted")
    assert "e.g. HorovodBroadcast_dense_1_bias_Momentum_0" in s.summary  # the first reported


def test_nccl_init_line_ties_rank_to_host_and_gpu():
    _, f = run("watchdog-broadcast-seq1-interleaved-info-lightning20434.log")
    assert any(x.startswith("rank 3 on babel-0-31 (GPU 3, pid 2324239)")
               for x in f["job.timeout"].evidence)


def test_job_model_links_rank_host_gpu_and_pid_from_any_two():
    job = model.Job()
    job.note(rank=None, host="node5", pid="240", gpu=6)  # an NCCL INFO line
    job.note(rank=14, host=None, pid="240")  # a line with a rank tag and the pid
    assert job.who(rank=14) == {"rank": 14, "host": "node5", "pid": "240", "gpu": 6}
    assert job.who(pid="240")["rank"] == 14
    assert job.who(rank=14, host="other")["gpu"] is None  # another host's rank 14: not this one
    job.note(rank=None, host="node6", pid="240")  # the same pid on another host: not merged
    assert job.who(pid="240")["host"] == "node5"


# ---------------------------------------------------------------------------- normalisation


REAL = (LOGS / "watchdog-allreduce-basicsr737.log").read_text().splitlines()


@settings(max_examples=60, deadline=None)
@given(pad=st.integers(1, 40), colour=st.sampled_from(["", "\x1b[31m", "\x1b[1;33m", "[36m"]),
       bar=st.booleans())
def test_padding_colour_and_carriage_returns_do_not_change_the_lines(pad, colour, bar):
    """A terminal paste pads every line with spaces to its width; colour codes wrap lines; a
    progress bar rewrites the line with CR before the message: none of it changes what is read
    (before: padded lines were joined into one)."""
    plain = [(x.text, x.rank) for x in joblog.normalise("\n".join(REAL))]
    width = max(map(len, REAL)) + pad
    dressed = []
    for x in REAL:
        line = (f"{colour}{x}\x1b[0m" if colour.startswith("\x1b") else
                f"{colour}{x}[0m" if colour else x)
        line = line.ljust(width + (len(line) - len(x)))
        dressed.append((" 12%|##   | 3/25\r" if bar else "") + line)
    got = [(x.text, x.rank) for x in joblog.normalise("\n".join(dressed))]
    assert got == plain


def test_padded_short_lines_are_not_joined():
    """Seven real lines of different lengths, padded to one width: still seven messages."""
    src = [x for x in REAL if x.strip()][:7]
    width = max(map(len, src)) + 3
    got = joblog.normalise("\n".join(x.ljust(width) for x in src))
    assert len(got) == len(src)


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 600), min_size=1, max_size=600))
def test_rank_lists_are_ranges_that_say_exactly_the_set(rs):
    said = launch.ranks(rs)
    if "more" in said:  # past 12 runs the rest is counted, not listed
        return
    named: set[int] = set()
    for a, b in re.findall(r"(\d+)(?:-(\d+))?", said):
        named |= set(range(int(a), int(b or a) + 1))
    assert named == rs
    assert len(said) < 100  # 500 ranks are a range, not 500 numbers


def test_500_ranks_one_missing():
    assert triage.ranks([*range(499), 500]) == "ranks 0-498 and 500"


# ---------------------------------------------------------------------------- inputs


NAME = "watchdog-allreduce-basicsr737.log"


def _findings(paths, skipped=None):
    fs, _, _ = jobs.run(paths, skipped)
    return [(f.id, f.summary) for f in fs]


@pytest.mark.parametrize("pack", [gzip.compress, lzma.compress, bz2.compress,
                                  lambda b: pytest.importorskip("zstandard").compress(b)])
def test_compressed_logs_are_read_by_their_magic_bytes(tmp_path, pack):
    raw = (LOGS / NAME).read_bytes()
    f = tmp_path / "rank0.log"  # the name says nothing about the compression
    f.write_bytes(pack(raw))
    assert _findings([f]) == _findings([LOGS / NAME])


def test_zstd_without_a_reader_is_one_clear_error(tmp_path, monkeypatch):
    zstandard = pytest.importorskip("zstandard")
    f = tmp_path / "job.log.zst"
    f.write_bytes(zstandard.ZstdCompressor().compress(b"hello\n"))
    monkeypatch.setitem(sys.modules, "zstandard", None)
    monkeypatch.setitem(sys.modules, "compression", None)
    with user_error("triage.zstd-missing") as e:
        logfiles.files([f])
    assert str(f) in e.value.message and "zstandard" in e.value.fix


def test_a_damaged_archive_is_one_clear_error(tmp_path):
    f = tmp_path / "cut.log.gz"
    f.write_bytes(gzip.compress((LOGS / NAME).read_bytes())[:40])
    with user_error("triage.unreadable") as e:
        list(logfiles.read([f]))
    assert str(f) in e.value.message


def test_directory_skips_what_it_cannot_read_and_triages_the_rest(tmp_path):
    (tmp_path / "a.log.gz").write_bytes(gzip.compress((LOGS / NAME).read_bytes()))
    (tmp_path / "core").write_bytes(bytes(range(1, 32)) * 300)
    skipped: list[str] = []
    got = _findings([tmp_path], skipped)
    assert got == _findings([LOGS / NAME])
    assert len(skipped) == 1 and "core" in skipped[0] and "binary" in skipped[0]
    (tmp_path / "a.log.gz").unlink()
    with user_error("triage.empty-directory"):
        logfiles.files([tmp_path])
    with user_error("triage.binary"):  # named on its own, a binary file is still refused
        logfiles.files([tmp_path / "core"])


def test_cli_reads_stdin_and_names_skipped_files(tmp_path):
    raw = (LOGS / NAME).read_bytes()
    r = subprocess.run([sys.executable, "-m", "invoke", "triage", "-"], input=gzip.compress(raw),
                       cwd=ROOT, capture_output=True)
    assert r.returncode == 1 and b"ranks 0, 1 and 2 timed out in ALLREDUCE" in r.stdout, r.stderr
    (tmp_path / "a.log").write_bytes(raw)
    (tmp_path / "b.bin").write_bytes(bytes(range(1, 32)) * 300)
    r = subprocess.run([sys.executable, "-m", "invoke", "triage", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "timed out in ALLREDUCE" in r.stdout
    assert r.stderr.count("skipped") == 1 and "b.bin" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("line, name, host, pid", [
    # Open MPI's handler, as posted in https://github.com/ChenRocks/UNITER/issues/82
    ("[1,0]<stderr>:[1a62e574072d:00334] Signal: Bus error (7)", "SIGBUS", "1a62e574072d",
     "00334"),
    # the error line as posted in https://github.com/sgl-project/sglang/issues/6083
    ("Fatal Python error: Bus error", "SIGBUS", None, None),
])
def test_signal_forms_name_signal_host_and_pid(line, name, host, pid):
    ev = events_mod.events(joblog.normalise(line))
    (s,) = ev.signals
    assert (s.signal, s.host, s.pid) == (name, host, pid)


def test_job_model_keeps_what_it_knew_first():
    job = model.Job()
    job.note(host="node5", pid="240", gpu=1)
    job.note(pid="240", gpu=2)  # a later line does not overwrite the GPU already known
    assert job.who(pid="240")["gpu"] == 1
