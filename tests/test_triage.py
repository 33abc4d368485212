"""`invoke triage` on real console logs of failed and hung jobs (tests/fixtures/job-logs/README.md)."""

import json
import os
import subprocess
import sys

import pytest

from megatron_env.diagnose import events as events_mod
from megatron_env.diagnose import joblog, jobs, logfiles, nccl_log, triage
from megatron_env.errors import UserError

from .conftest import FIXTURES

ROOT = FIXTURES.parent.parent
LOGS = FIXTURES / "job-logs"
NCCL_LOGS = FIXTURES / "nccl-logs"


# torchrun's elastic agent when every worker exited 0 (torch/distributed/elastic/agent/server/
# api.py, `_invoke_run`: "[%s] worker group successfully finished. Waiting %s seconds for other
# agents to finish.")
CLEAN_END = ("INFO:torch.distributed.elastic.agent.server.api:[default] worker group successfully "
             "finished. Waiting 300 seconds for other agents to finish.\n")


def run(*names, where=LOGS):
    fs = triage.triage(logfiles.read([where / n for n in names]))
    return fs, {f.id: f for f in fs}


def test_watchdog_timeout_names_ranks_op_seqnum_sizes_and_timeout():
    fs, f = run("watchdog-allreduce-basicsr737.log")
    t = f["job.timeout"]
    assert t.summary.startswith("ranks 0, 1 and 2 timed out in ALLREDUCE (SeqNum 808, 9801523 elements")
    assert "Timeout(ms)=600000" in t.summary and "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in t.fix
    assert "rank 1: failed at work 808, last enqueued 811, last completed 807" in t.evidence
    assert fs[0].id == "job.timeout" and "job.odd_rank" not in f


def test_reduce_scatter_sizes_in_and_out():
    _, f = run("watchdog-reduce-scatter-llamafactory6269.log")
    s = f["job.timeout"].summary
    assert "ranks 0, 3 and 4" in s and "_REDUCE_SCATTER_BASE" in s
    assert "544997376 elements in / 68124672 out" in s


def test_odd_rank_out_comes_first():
    fs, f = run("watchdog-odd-rank-pytorch118369.log")
    assert fs[0].id == "job.odd_rank"
    assert f["job.odd_rank"].summary.startswith("rank 7 is the odd one out: stuck at SeqNum 64088")
    assert "96117-96125" in f["job.odd_rank"].summary
    # ran for 25624887 ms against a 30 min timeout: the watchdog itself was late
    assert "noticed after 7.1 h" in f["job.timeout"].summary


def test_wrapped_paste_is_joined_before_parsing():
    lines = list(logfiles.read([LOGS / "watchdog-wrapped-broadcast-openr1-620.log"]))
    assert len(lines) == 5 and all("OpType=BROADCAST" in x.text for x in lines)
    _, f = run("watchdog-wrapped-broadcast-openr1-620.log")
    assert f["job.timeout"].summary.startswith("ranks 1, 2, 3, 5 and 6 timed out in BROADCAST (SeqNum 4")


def test_desync_report_names_the_lagging_rank():
    fs, f = run("desync-report-pytorch152623.log")
    assert fs[0].id == "job.desync"
    d = f["job.desync"]
    assert "rank 7" in d.summary and "didn't join collective #183" in d.summary
    assert "timeout at collective ALLREDUCE #315" in d.evidence
    assert "[3, 4, 5, 6] started _ALLGATHER_BASE" in d.evidence


@pytest.mark.parametrize("name, hosts, what", [
    ("ib-completion-error-nccl928.log", "H100-2 [1], H100-1 [1], H100-5 [3]",
     "status 4 (local protection error), vendor err 81"),
    ("ib-completion-error-nccl1405.log", "kp-ddp-worker-0 [4]",
     "status 12 (transport retry counter exceeded), vendor err 129"),
])
def test_ib_completion_errors_name_host_device_and_vendor_error(name, hosts, what):
    fs, f = run(name)
    assert fs[0].id == "nccl.ib_completion"
    assert f["nccl.ib_completion"].summary == f"InfiniBand completion error on {hosts}: {what}"
    assert "invoke preflight" in f["nccl.ib_completion"].fix


def test_remote_error_with_its_last_error():
    _, f = run("remote-error-nccl2076.log")
    e = f["job.nccl_error"]
    assert "remote process exited or there was a network error" in e.summary
    assert "(NCCL 2.21.5)" in e.summary and "Connection reset by peer" in e.summary
    assert "root cause" in e.fix


def test_nccl_cuda_oom_names_host_and_device_before_the_lost_peer():
    fs, f = run("nccl-cuda-oom-nccl1235.log")
    assert [x.id for x in fs] == ["nccl.cuda", "nccl.peer_lost"]
    assert f["nccl.cuda"].summary == "a CUDA call inside NCCL failed ('out of memory') on ng30903 [3]"
    assert "Failed to CUDA calloc 6291456 bytes" in f["nccl.cuda"].evidence


def test_unhandled_system_error_points_at_memlock():
    fs, f = run("unhandled-system-error-horovod98.log")
    assert [x.id for x in fs] == ["nccl.system_error", "job.nccl_error"]
    assert "ulimit -l unlimited" in f["nccl.system_error"].fix
    assert "ibv_create_qp failed" in f["nccl.system_error"].evidence[0]
    assert "memlock" in f["job.nccl_error"].fix


def test_pdsh_host_tags_are_stripped_so_nccl_lines_parse():
    lines = list(logfiles.read([LOGS / "register-memory-pdsh-prefix-nccl563.log"]))
    assert lines[0].host == "10.0.87.143" and lines[0].text.startswith("ip-10-0-87-143:149:298 [5]")
    _, f = run("register-memory-pdsh-prefix-nccl563.log")
    assert "ip-10-0-87-143 [5]" in f["nccl.system_error"].summary


@pytest.mark.parametrize("name, summary, fix", [
    ("cuda-illegal-address-megatron-miles308.log",
     "a rank hit CUDA error: an illegal memory access was encountered", "CUDA_LAUNCH_BLOCKING=1"),
    ("cuda-ecc-watchdog-kohya1434.log", "rank 1 hit CUDA error: uncorrectable ECC error encountered"
     " (a GPU hardware fault, not the code's)",
     "drain the node"),
])
def test_cuda_errors(name, summary, fix):
    fs, f = run(name)
    assert [x.id for x in fs] == ["job.cuda_error"]
    assert f["job.cuda_error"].summary == summary and fix in f["job.cuda_error"].fix


def test_cuda_oom_with_host_and_rank_tags():
    _, f = run("cuda-oom-host-rank-prefix-accelerate1519.log")
    assert f["job.cuda_oom"].summary == ("rank 1 on gpu187 ran out of GPU memory: tried to allocate "
                                         "3.00 GiB on GPU 1 (79.35 GiB total)")


def test_xid_lines_name_the_gpus_and_the_first_error():
    _, f = run("xid-kernel-log-ogkm1150.log")
    s = f["job.gpu_xid"].summary
    assert "Xid 45 (preemptive cleanup after an earlier error)" in s
    assert "on 4 GPU(s)" in s and "PCI:0000:dc:00" in s and "the first error was Xid 145, 149" in s


def test_torchrun_root_cause_exit_code_and_host():
    _, f = run("torchrun-root-cause-minigpt4-237.log")
    r = f["job.root_cause"]
    assert r.summary == ("torchrun's first observed failure: rank 0 (local rank 0) on host "
                         "n136-117-136.byted.org (pid 78970), exit code 1; failed: ranks 0 and 1")
    assert "also failed: rank 1 on n136-117-136.byted.org, exit code 1" in r.evidence


def test_sigabrt_root_cause_ranks_after_the_timeout_that_caused_it():
    fs, f = run("watchdog-odd-rank-pytorch118369.log", "torchrun-root-cause-sigabrt-picotron6.log")
    assert "killed by signal SIGABRT (exit code -6)" in f["job.root_cause"].summary
    ids = [x.id for x in fs]
    assert ids.index("job.timeout") < ids.index("job.root_cause")
    assert "watchdog" in f["job.root_cause"].fix


def test_nccl_debug_lines_use_the_verify_nccl_analysis():
    # the socket fallback between nodes that verify_nccl.py --analyze-log reports
    text = (NCCL_LOGS / "h200-1rank-nccl2.28.log").read_text() + (NCCL_LOGS / "socket-between-nodes-nccl952.log").read_text()
    fs = triage.triage(joblog.normalise(text, "job.log"))
    f = {x.id: x for x in fs}
    assert f["nccl.net"].status == "fail" and "TCP sockets" in f["nccl.net"].summary
    script = nccl_log.script()
    assert {**f["nccl.net"].to_dict(), "kind": ""} == {"kind": "", **next(x for x in script.log_findings(script.analyze_log(text))
                                           if x["id"] == "nccl.net")}


def test_nccl_debug_with_rank_tags_still_parses():
    raw = (NCCL_LOGS / "roce-h100-nccl2.19.log").read_text().splitlines()
    tagged = "\n".join(f"[rank{i % 8}]:{x}" for i, x in enumerate(raw))
    f = {x.id: x for x in triage.triage(joblog.normalise(tagged))}
    assert f["nccl.net"].status == "pass" and "IB" in f["nccl.net"].summary


def test_a_log_that_just_stops_is_a_failure_not_a_pass():
    fs = triage.triage(joblog.normalise("step 10 loss 2.3\nstep 20 loss 2.1\n"))
    assert [(x.id, x.status) for x in fs] == [("job.stopped", "inconclusive")]


def test_ranks_read_as_a_person_would():
    assert triage.ranks([5]) == "rank 5"
    assert triage.ranks([0, 1, 2, 3, 4, 5, 6, 7]) == "ranks 0-7"
    assert triage.ranks([2, 0, 1]) == "ranks 0, 1 and 2"


def test_rank_from_file_name_and_srun_labels(tmp_path):
    (tmp_path / "train-rank3.log").write_text((LOGS / "cuda-illegal-address-megatron-miles308.log").read_text())
    _, f = run("train-rank3.log", where=tmp_path)
    assert f["job.cuda_error"].summary.startswith("rank 3 hit CUDA error")
    labelled = "\n".join(f"5: {x}" for x in (LOGS / "cuda-illegal-address-megatron-miles308.log").read_text().splitlines())
    f = {x.id: x for x in triage.triage(joblog.normalise(labelled))}
    assert f["job.cuda_error"].summary.startswith("rank 5 hit")


def test_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        logfiles.read([tmp_path / "missing.log"])
    (tmp_path / "core").write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    with pytest.raises(UserError, match="not a text log"):
        logfiles.read([tmp_path / "core"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no log files"):
        logfiles.read([tmp_path / "empty"])


def test_cli_json_directory_and_exit_codes(tmp_path):
    r = subprocess.run([sys.executable, "-m", "invoke", "triage", str(LOGS / "torchrun-root-cause-*.log"), "--json"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["findings"][0]["id"] == "job.root_cause" and len(doc["logs"]) == len(list(LOGS.glob("torchrun-root-cause-*.log")))
    (tmp_path / "ok.log").write_text(CLEAN_END)
    r = subprocess.run([sys.executable, "-m", "invoke", "triage", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "job.clean" in r.stdout
    r = subprocess.run([sys.executable, "-m", "invoke", "triage", str(tmp_path / "nope.log")], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no such file or directory" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""  # no JSON asked: the error is the line on stderr only


@pytest.mark.parametrize("make, kind", [
    (lambda d: d / "nope.log", "triage.no-such-log"),
    (lambda d: (d / "empty.log").write_text("") and None or d / "empty.log", "triage.empty-log"),
    (lambda d: str(d / "*.none"), "triage.no-match"),
])
def test_cli_json_errors_are_one_json_object_on_stdout(tmp_path, make, kind):
    r = subprocess.run([sys.executable, "-m", "invoke", "triage", str(make(tmp_path)), "--json"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["command"] == "triage" and doc["error"]["kind"] == kind
    assert doc["error"]["message"] in r.stderr and doc["error"]["fix"]


def test_one_file_per_rank_the_silent_rank_is_the_suspect(tmp_path):
    """Per-rank files (rank from the file name), arranged from two real logs: ranks 0-2 time out
    (BasicSR 737) while rank 3's file holds the illegal memory access of miles 308."""
    for line in (LOGS / "watchdog-allreduce-basicsr737.log").read_text().splitlines():
        rank = line[len("[rank"):line.index("]")]
        with open(tmp_path / f"train-rank{rank}.log", "a") as f:
            f.write(line + "\n")
    (tmp_path / "train-rank3.log").write_text((LOGS / "cuda-illegal-address-megatron-miles308.log").read_text())
    fs = triage.triage(logfiles.read([tmp_path]))
    assert [f.id for f in fs] == ["job.cuda_error", "job.odd_rank", "job.timeout"]
    assert fs[0].summary.startswith("rank 3 hit CUDA error: an illegal memory access")
    assert fs[1].summary.startswith("rank 3 printed no watchdog timeout while ranks 0, 1 and 2 did")
    assert "(rank 3)" in fs[2].fix


def test_heartbeat_monitor_padded_terminal_paste():
    # every line padded to the terminal's 116 columns; the message is cut mid-word
    lines = list(logfiles.read([LOGS / "watchdog-stuck-wrapped-vlmr1-257.log"]))
    assert len(lines) == 2 and "ProcessGroupNCCL's watchdog got stuck for 480 seconds" in lines[0].text
    assert "This typically indicates a NCCL/CUDA API" in lines[0].text
    fs, f = run("watchdog-stuck-wrapped-vlmr1-257.log")
    assert [x.id for x in fs] == ["job.watchdog_stuck"]
    assert f["job.watchdog_stuck"].summary.startswith("the NCCL watchdog of rank 6 got stuck for 480 s")


# --------------------------------------------------------------------------- any input, any size


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "invoke", "triage", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _one_error(r, *words):
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len([x for x in r.stderr.splitlines() if x.startswith("error: ")]) == 1, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_a_quoted_glob_that_matches_nothing_is_an_error(tmp_path):
    _one_error(_cli(str(tmp_path / "*.out")), "matches no file")


def test_devices_and_pipes_are_refused_at_once(tmp_path):
    _one_error(_cli("/dev/null"), "/dev/null is not a regular file (a character device)")
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)  # reading it would block forever
    _one_error(_cli(str(fifo)), "is not a regular file (a pipe)")
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "d" / "p")
    (tmp_path / "d" / "rank0.log").write_text(CLEAN_END)
    assert _cli(str(tmp_path / "d")).returncode == 0  # a pipe inside a directory is passed over


def test_nul_padded_crash_log_is_read(tmp_path):
    """A node that died mid-write leaves the file's last blocks zero-filled."""
    text = (LOGS / "cuda-ecc-watchdog-kohya1434.log").read_bytes()
    log = tmp_path / "rank1.log"
    log.write_bytes(text[:len(text) // 2] + b"\0" * 100_000 + text[len(text) // 2:] + b"\0" * 8192)
    _, f = run("rank1.log", where=tmp_path)
    assert f["job.cuda_error"].summary.startswith("rank 1 hit CUDA error: uncorrectable ECC error encountered")


def test_logs_of_unrelated_jobs_are_not_compared_as_one(tmp_path):
    for name in ("watchdog-allreduce-basicsr737.log", "watchdog-reduce-scatter-llamafactory6269.log",
                 "watchdog-lineno-prefix-llamafactory7396.log"):
        (tmp_path / name).write_text((LOGS / name).read_text())
    fs, _, _ = jobs.run([tmp_path])
    assert fs[0].id == "job.mixed" and fs[0].status == "warn"
    assert "look like 3 different jobs" in fs[0].summary
    assert "job.odd_rank" not in {f.id for f in fs}  # no rank compared across jobs
    assert any(f.summary.startswith("[watchdog-allreduce-basicsr737.log] ranks 0, 1 and 2 timed out")
               for f in fs)


def test_one_job_split_over_files_stays_one_job(tmp_path):
    """Per-rank files of one job share their timeout and dates: one job, as before."""
    for line in (LOGS / "watchdog-allreduce-basicsr737.log").read_text().splitlines():
        rank = line[len("[rank"):line.index("]")]
        with open(tmp_path / f"train-rank{rank}.log", "a") as f:
            f.write(line + "\n")
    fs, _, sources = jobs.run([tmp_path])
    assert len(sources) == 3 and "job.mixed" not in {f.id for f in fs}


def test_unknown_prefixes_and_broken_lines_still_parse():
    """The issue's case: an aggregator's `<job>.<host> [stderr] ` before the rank tag, the
    WorkNCCL part on the next line without any tag."""
    lines = joblog.normalise(
        "job7.node-12 [stderr] [rank14]:[E909 09:55:29.340 ProcessGroupNCCL.cpp:607] [Rank 14] "
        "Watchdog caught collective operation timeout: \n"
        "WorkNCCL(SeqNum=9, OpType=REDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600068 milliseconds before timing out.\n"
        "2024-01-02T03:04:05.678Z [rank3]: RuntimeError: NCCL Error 2: unhandled system error "
        "(run with NCCL_DEBUG=INFO for details)\n")
    assert [(x.rank, x.host) for x in lines] == [(14, "node-12"), (3, None)]
    f = {x.id: x for x in triage.triage(lines)}
    assert f["job.timeout"].summary.startswith("rank 14 timed out in REDUCE (SeqNum 9")
    assert "rank 14 on node-12" in f["job.timeout"].evidence[0]
    assert f["job.nccl_error"].summary == "NCCL error 'unhandled system error' on rank 3"


def test_memory_stays_bounded_on_a_long_log():
    """Event lists are capped and the NCCL analysis is batched: a million repeated signature
    lines leave bounded state (the size benchmark is bench/triage_stream.py)."""
    line = ("[rank{r}]:[E ProcessGroupNCCL.cpp:563] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600027 milliseconds before timing out.")
    gen = (line.format(r=i % 8, s=i) for i in range(200_000))
    ev = events_mod.events(joblog.lines(gen, "big.log"))
    assert ev.lines == 200_000 and len(ev.timeouts) == events_mod.CAP
    assert not ev._batch and len(ev.nccl["warnings"]) <= 500


def test_an_endless_line_is_cut_not_held(tmp_path):
    log = tmp_path / "one-line.log"
    with open(log, "wb") as f:
        f.write(b"x" * (8 << 20) + b" CUDA error: an illegal memory access was encountered\n")
        f.write(b"[rank2]: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    got = list(logfiles.read([log]))
    assert len(got) == 2 and len(got[0].text) <= joblog.MAX_LINE
    _, f = run("one-line.log", where=tmp_path)
    assert f["job.cuda_error"].summary.startswith("rank 2 hit CUDA error")


CAPTURED = FIXTURES / "captured-runs"


def test_the_root_cause_is_the_ranks_own_exception_not_the_table():
    """A real torchrun run (gloo, 2 ranks): rank 1 raises KeyError, aborts (SIGABRT: 'terminate
    called'), rank 0's barrier then fails and torchrun SIGTERMs it. The table says rank 1
    SIGABRT; the finding is rank 1's KeyError, with the table's pid, time and exit."""
    fs, f = run("torchrun-keyerror-rank1.log", where=CAPTURED)
    assert fs[0].id == "job.root_cause" and fs[0].kind == "user"
    s = fs[0].summary
    assert s.startswith("rank 1 (local rank 1) on host localhost raised KeyError: 1 "
                        "(/job/train.py:13); torchrun's first observed failure")
    assert "pid 11872" in s and "2026-12-05 15:31:40" in s and "SIGABRT (exit code -6)" in s
    assert "Connection reset by peer" not in s  # rank 0's error came after, because of it


def test_an_exit_code_1_without_the_exception_is_not_a_signal():
    fs, f = run("torchrun-root-cause-minigpt4-237.log")
    assert f["job.root_cause"].kind != "signal" and "exit code 1" in f["job.root_cause"].summary


def test_the_first_observed_failure_that_only_timed_out_is_not_the_root_cause(tmp_path):
    """Arranged from real logs: ranks 0-2 time out in ALLREDUCE (BasicSR 737), rank 3 raised a
    CUDA error (miles 308), and torchrun's table (MiniGPT-4 237) names rank 0 first: its watchdog
    ended it first, but it was waiting for rank 3."""
    for line in (LOGS / "watchdog-allreduce-basicsr737.log").read_text().splitlines():
        rank = line[len("[rank"):line.index("]")]
        with open(tmp_path / f"train-rank{rank}.log", "a") as f:
            f.write(line + "\n")
    (tmp_path / "train-rank3.log").write_text(
        (LOGS / "cuda-illegal-address-megatron-miles308.log").read_text())
    (tmp_path / "launcher.log").write_text((LOGS / "torchrun-root-cause-minigpt4-237.log").read_text())
    fs = triage.triage(logfiles.read([tmp_path]))
    root = next(f for f in fs if f.id == "job.root_cause")
    assert root.summary.startswith("rank 3 raised ") and "illegal memory access" in root.summary
    assert "rank 0 (local rank 0) on host n136-117-136.byted.org, only timed out waiting" in root.summary
