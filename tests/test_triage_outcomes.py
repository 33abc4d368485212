"""The four ways a log ends (DESIGN: triage outcomes): a named failure, `job.unrecognised`,
`job.stopped`, a clean end; and empty input, which is an error. Logs here are real: what a real
Python process printed as it raised or was killed, real fixture lines, or a real log cut where a
job that hung would have stopped printing."""

import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_env.diagnose import families, joblog, jobs, triage

from .conftest import FIXTURES

ROOT = FIXTURES.parent.parent
LOGS = FIXTURES / "job-logs"
# torchrun's elastic agent when every worker exited 0 (torch/distributed/elastic/agent/server/
# api.py: "[%s] worker group successfully finished. Waiting %s seconds for other agents ...")
CLEAN_END = ("INFO:torch.distributed.elastic.agent.server.api:[default] worker group successfully "
             "finished. Waiting 300 seconds for other agents to finish.\n")

TRAIN = """
import sys, time
for step in range(1, 4):
    print(f" iteration {step:8d}/     100 | lm loss: {2.5 - step / 10:.4E} |", flush=True)
{end}
"""


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "invoke", "triage", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _captured(tmp_path, end: str, name: str = "train.py") -> tuple:
    """Run a small training-shaped script for real; its stdout and stderr are the log."""
    script = tmp_path / name
    script.write_text(TRAIN.replace("{end}", end))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=60)
    log = tmp_path / "job.log"
    log.write_text(r.stdout + r.stderr)
    return log, r


def test_an_unfamiliar_exception_is_unrecognised_not_success(tmp_path):
    log, r = _captured(tmp_path, "params = {}\nprint(params['embedding.word_embeddings'])")
    assert r.returncode == 1 and "KeyError" in r.stderr
    out = _cli(log)
    assert out.returncode == 1, out.stdout
    (f,) = jobs.run([log])[0]
    assert f.id == "job.exception" and f.status == "fail" and f.kind == "user"
    assert "KeyError" in f.summary and "raised in the training code" in f.summary
    assert "train.py:" in f.summary and "KeyError: 'embedding.word_embeddings'" in f.evidence
    assert families.FAMILIES["user"].advice in f.fix


def test_an_exception_inside_a_package_says_so(tmp_path):
    log, _ = _captured(tmp_path, "import json\njson.loads('{\"lr\": 0.1,}')")
    (f,) = jobs.run([log])[0]
    assert f.id == "job.exception" and f.kind == "framework"
    assert "JSONDecodeError" in f.summary and "inside an installed package" in f.summary


def test_a_process_killed_without_a_word_leaves_a_stopped_log(tmp_path):
    """The job's own output ends mid-training: nothing says why (the kill came from outside)."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN.replace("{end}", "time.sleep(60)"))
    log = tmp_path / "job.log"
    with open(log, "w") as out:
        p = subprocess.Popen([sys.executable, str(script)], stdout=out, stderr=out)
        deadline = time.monotonic() + 30
        while "iteration        3" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    r = _cli(log)
    assert r.returncode == 3 and "job.stopped" in r.stdout  # inconclusive, not "failed"
    (f,) = jobs.run([log])[0]
    assert f.id == "job.stopped" and "last progress: iteration        3/     100" in f.summary
    for advice in ("py-spy dump", "NCCL_DEBUG=INFO", "TORCH_NCCL_TRACE_BUFFER_SIZE",
                   "TORCH_NCCL_DUMP_ON_TIMEOUT"):
        assert advice in f.fix


def test_the_shell_that_saw_the_kill_names_it(tmp_path):
    """bash reports its child's death by SIGKILL (the OOM killer's signal): a named failure."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN.replace("{end}", "import os, signal\nos.kill(os.getpid(), "
                                               "signal.SIGKILL)"))
    r = subprocess.run(["bash", "-c", f"{sys.executable} {script}; true"],
                       capture_output=True, text=True, timeout=60)
    assert "Killed" in r.stderr  # bash's own words
    log = tmp_path / "job.log"
    log.write_text(r.stdout + r.stderr)
    fs = jobs.run([log])[0]
    assert fs[0].id == "job.signal" and "SIGKILL" in fs[0].summary
    assert "OOM killer" in fs[0].fix


def test_a_normal_end_is_the_only_exit_0(tmp_path):
    log, _ = _captured(tmp_path, f"print({CLEAN_END.strip()!r})")
    r = _cli(log)
    assert r.returncode == 0 and "job.clean" in r.stdout, r.stdout
    log.write_text(log.read_text() + " iteration        4/     100 | lm loss: 2.1E+00 |\n")
    assert _cli(log).returncode == 3  # progress after the end: another run, which stopped


def test_empty_input_is_an_error_naming_it(tmp_path):
    (tmp_path / "empty.log").write_text("")
    r = _cli(tmp_path / "empty.log")
    assert r.returncode == 2 and "empty.log is empty" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.log").write_text("\n  \n")
    r = _cli(tmp_path / "d")
    assert r.returncode == 2 and "a.log is empty" in r.stderr


def test_a_real_log_cut_before_its_error_is_stopped_with_the_ranks_still_printing():
    """A hang that never reached the watchdog: the lines before the first timeout of a real
    log, where ranks 0-2 print."""
    text = (LOGS / "watchdog-service-thread-closed-megatron735.log").read_text().splitlines()
    fs = triage.findings(_merged(joblog.normalise("\n".join(
        [x for x in text if "Watchdog" not in x][:6]) + "\n")))
    assert [f.id for f in fs] == ["job.stopped"]


def _merged(lines):
    from megatron_env.diagnose import events as events_mod
    from megatron_env.diagnose import sig_end
    ev = events_mod.events(lines)
    ev.tail = sig_end.end_state([x.text if x.rank is None else f"[rank{x.rank}]:{x.text}"
                                   for x in lines])
    return ev


# a real line: msswift 6695's rank 1 (tests/fixtures/job-logs/stale-file-handle-rank-prefix-...)
STALE = "OSError: [Errno 116] Stale file handle: xxx"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 63), min_size=2, max_size=12, unique=True), st.randoms())
def test_the_first_error_in_time_comes_first_whatever_order_it_was_printed_in(ranks, rnd):
    times = {r: i for i, r in enumerate(ranks)}  # ranks[0] failed first
    printed = list(ranks)
    rnd.shuffle(printed)
    text = "".join(f"2024-05-01 10:{times[r] // 60:02d}:{times[r] % 60:02d},123 [rank{r}]: {STALE}\n"
                   for r in printed)
    fs = triage.findings(_merged(joblog.normalise(text)))
    (f,) = [x for x in fs if x.id == "job.disk"]
    assert f.evidence[0].startswith(f"rank {ranks[0]}, 2024-05-01 10:00:00.123: ")
    assert triage.ranks(ranks) in f.summary


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["KeyError: 'w'", "ValueError: bad shape", "TypeError: None"]),
                min_size=2, max_size=6, unique=True), st.randoms())
def test_the_unrecognised_failure_quoted_first_is_the_first_in_time(errors, rnd):
    order = list(enumerate(errors))
    rnd.shuffle(order)
    text = "".join(f"[E0501 10:00:{i:02d}.000 train.py:1] [rank{i}]: x\n[rank{i}]: {e}\n"
                   for i, e in order)
    (f,) = triage.findings(_merged(joblog.normalise(text)))
    assert f.id == "job.exception" and f.summary.split("; also: ")[0].endswith(errors[0])
    assert f.evidence[0] == errors[0]


def test_every_finding_has_a_family_with_advice_and_an_exit_meaning():
    for fid in triage.ORDER + ["job.unrecognised", "job.stopped", "job.clean", "job.root_cause"]:
        assert fid in families.FAMILY_OF, fid
    for fam in families.FAMILIES.values():
        assert fam.means and (fam.advice or fam.name == "clean")
    assert {families.family(x).name for x in families.FAMILY_OF} <= set(families.FAMILIES)


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.log")
                                        if "tune" in (LOGS / "README.md").read_text()
                                        .split(p.name, 1)[-1].split("\n", 1)[0]))
def test_every_tune_log_is_a_failure_in_a_family(name):
    fs = jobs.run([LOGS / name])[0]
    assert fs[0].status in ("fail", "pass", "inconclusive") and all(
        f.kind in families.FAMILIES for f in fs)


def test_the_collective_of_a_native_stack_is_named():
    """UCX's backtrace of a SIGSEGV inside NCCL (NeMo, nccl 1050): the collective is only in
    the native frames (pncclReduceScatter)."""
    fs = jobs.run([LOGS / "sigsegv-reduce-scatter-backtrace-nemo-nccl1050.log"])[0]
    assert fs[0].id == "job.signal" and fs[0].summary.endswith("in ReduceScatter")


@pytest.mark.parametrize("line, fid, words", [
    # https://github.com/ofsoundof/GRL-Image-Restoration/issues/27 (torch c10d socket.cpp)
    ("[W socket.cpp:558] [c10d] The client socket has failed to connect to [::ffff:0.0.0.5]:40323 "
     "(errno: 110 - Connection timed out).", "job.rendezvous",
     ["::ffff:0.0.0.5:40323", "Connection timed out"]),
    # https://github.com/lzhxmu/CPPO/issues/6
    ("[E521 15:43:02.707733876 socket.cpp:1023] [c10d] The client socket has timed out after "
     "600000ms while trying to connect to (172.18.21.4, 37907).", "job.rendezvous",
     ["172.18.21.4:37907", "600000ms"]),
    # https://github.com/chrisknewman/tusas/issues/149 (slurmstepd, Slurm 23)
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=440575.0. Some of the step tasks "
     "have been OOM Killed.\nsrun: error: nid001277: tasks 1-3: Out Of Memory\nslurmstepd: error: "
     "*** STEP 440575.0 ON nid001277 CANCELLED AT 2023-12-05T07:16:01 ***", "job.oom_killer",
     ["in 440575.0:", "srun tasks 1, 2 and 3 on nid001277"]),
    # https://github.com/hafs-community/HAFS/issues/101 (older slurmstepd wording)
    ("slurmstepd: error: Detected 1 oom-kill event(s) in step 3495064.0 cgroup. Some of your "
     "processes may have been killed by the cgroup out-of-memory handler.\nsrun: error: "
     "Orion-01-01: task 4: Out Of Memory", "job.oom_killer", ["3495064.0", "srun task 4"]),
    # https://github.com/HRNet/HigherHRNet-Human-Pose-Estimation/issues/47 (torch.multiprocessing)
    ("Exception: process 1 terminated with signal SIGKILL", "job.signal",
     ["local rank 1", "SIGKILL"]),
])
def test_messages_of_the_sources_land_in_their_family(line, fid, words):
    """One line each, as public threads quote them: the c10d store client and spawn's exit."""
    fs = triage.findings(_merged(joblog.normalise(line + "\n")))
    assert fs[0].id == fid and fs[0].status == "fail", fs
    for w in words:
        assert w in fs[0].summary, fs[0].summary


@given(st.integers(0, 7))
def test_a_role_tag_is_a_local_rank_not_a_global_one(local):
    """torchrun --tee's `[default3]:` numbers the processes of one node: local rank 3 of any
    node, not global rank 3."""
    fs = triage.findings(_merged(joblog.normalise(f"[default{local}]:{STALE}\n")))
    (f,) = [x for x in fs if x.id == "job.disk"]
    assert f"(local rank {local})" in f.summary and f"(rank {local})" not in f.summary


def test_the_host_of_a_pasted_shell_prompt_names_where_it_happened():
    """A user's paste: the prompt (ray 45179's) then a kernel line without a host (eris 42's)."""
    prompt = (LOGS / "ray-node-marked-dead-heartbeats-ray45179.log").read_text().splitlines()[0]
    oom = (LOGS / "oom-killer-dmesg-T-sacrifice-child-eris42.log").read_text().splitlines()[0]
    (f,) = triage.findings(_merged(joblog.normalise(f"{prompt}\n{oom}\n")))
    assert f.id == "job.oom_killer" and "on ol8ray-1" in f.summary, f.summary


# a real NCCL_DEBUG line (megatron 735's), as each rank would print it under torchrun --tee
INFO = "9aee1c01f3e7:6727:7168 [1] NCCL INFO [Service thread] Connection closed by localRank 2"


@settings(max_examples=25, deadline=None)
@given(st.sets(st.integers(0, 31), min_size=2, max_size=12), st.data())
def test_a_stopped_log_names_the_ranks_still_printing_and_the_silent_ones(ranks, data):
    late = data.draw(st.sets(st.sampled_from(sorted(ranks)), min_size=1,
                             max_size=len(ranks) - 1))
    early = "".join(f"[rank{r}]: {INFO}\n" for r in sorted(ranks))
    filler = "".join(f"[rank{r}]: {INFO}\n" for r in sorted(late)) * 60  # the last lines
    lines = joblog.normalise(early + filler)
    (f,) = triage.findings(_merged(lines))
    assert f.id == "job.stopped"
    assert f"{triage.ranks(late)} still printing at the end" in f.summary
    assert f"{triage.ranks(ranks - late)} silent at the end" in f.summary


# a process that leaves a named semaphore registered: multiprocessing's resource tracker warns
# at shutdown (its own words), after the script's own output ended
LEAK = """
from multiprocessing import resource_tracker
import multiprocessing as mp
sem = mp.get_context('spawn').Semaphore(1)
resource_tracker.register(sem._semlock.name, 'semaphore')
{raise_}
import os, sys
sys.stdout.flush()
os._exit(0)  # as a spawned worker exits: no finalizer unregisters the semaphore
"""


def _with_tracker(tmp_path, raise_: str = "") -> tuple:
    log, r = _captured(tmp_path, LEAK.replace("{raise_}", raise_))
    for _ in range(100):  # the tracker is its own process: its warning may come after exit
        if "leaked semaphore" in log.read_text():
            break
        time.sleep(0.05)
    return log, r


def test_a_process_that_ended_on_its_own_is_clean_by_its_exit_path(tmp_path):
    log, r = _with_tracker(tmp_path)
    assert r.returncode == 0 and "leaked semaphore objects" in log.read_text()
    out = _cli(log)
    assert out.returncode == 0 and "job.clean" in out.stdout, out.stdout
    (f,) = jobs.run([log])[0]
    assert "exited on their own" in f.summary and "resource_tracker" in f.summary


def test_an_exit_path_after_an_exception_is_still_the_failure(tmp_path):
    log, r = _with_tracker(tmp_path, "raise ValueError('bad shard 7')")
    assert r.returncode == 1
    out = _cli(log)
    assert out.returncode == 1 and "job.exception" in out.stdout, out.stdout


def test_an_exception_the_interpreter_ignored_at_teardown_is_not_the_failure(tmp_path):
    """CPython prints 'Exception ignored in: <function ...__del__>' and its traceback, then
    exits 0: with no end line the log cannot tell (exit 3), never 'failed'."""
    log, r = _captured(tmp_path, "class Loader:\n    def __del__(self):\n        raise "
                                 "OSError('worker pipe closed')\nkeep = Loader()")
    assert r.returncode == 0 and "Exception ignored in" in r.stderr and "OSError" in r.stderr
    assert _cli(log).returncode == 3
    log.write_text(log.read_text() + "OSError: a real one\n")
    assert _cli(log).returncode == 1


@pytest.mark.parametrize("end", [
    "`Trainer.fit` stopped: `max_steps=1000` reached.",  # lightning/pytorch/loops/fit_loop.py
    "done training in 3512.4 seconds",  # fairseq_cli/train.py
    "TrainOutput(global_step=500, training_loss=0.71, metrics={'train_runtime': 912.1})",
    "[after training is done] datetime: 2024-05-01 10:00:00 ",  # megatron/training/training.py
])
def test_a_trainer_end_line_is_clean_and_named(tmp_path, end):
    log, _ = _captured(tmp_path, f"print({end!r})")
    out = _cli(log)
    assert out.returncode == 0 and "job.clean" in out.stdout and end.split()[0] in out.stdout


# PyTorch's watchdog line (ProcessGroupNCCL.cpp, as in tests/fixtures/job-logs/
# watchdog-broadcast-ray-actor-pg-rank-lmmr1-67.log) and abseil's failure signal handler's line
# (as in watchdog-ray-ansi-gather-vllm6042.log), tagged by torchrun's --tee prefix
WATCHDOG = ("[rank{r}]:[E416 13:21:26.968941948 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID "
            "0(default_pg) Rank {r}] Process group watchdog thread terminated with exception: "
            "[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
            "OpType={op}, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600012 "
            "milliseconds before timing out.")
ABORT = "[rank{r}]:*** SIGABRT received at time=1720159248 on cpu 5 ***"


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 63), st.sampled_from(["BROADCAST", "ALLREDUCE", "_ALLGATHER_BASE",
                                            "_REDUCE_SCATTER_BASE", "ALLTOALL_BASE"]),
       st.integers(1, 10**6), st.booleans())
def test_an_abort_is_listed_under_the_watchdog_timeout_that_caused_it(r, op, seq, abort_first):
    """The watchdog aborts its own process after a timeout: the SIGABRT is a consequence, after
    the timeout and named in its evidence, whichever was printed first."""
    lines = [WATCHDOG.format(r=r, seq=seq, op=op), ABORT.format(r=r)]
    if abort_first:
        lines.reverse()
    fs = triage.triage(joblog.normalise("\n".join(lines) + "\n"))
    assert [f.id for f in fs] == ["job.timeout", "job.signal"]
    assert f"consequence: rank {r}'s SIGABRT follows its NCCL watchdog timeout in {op}" in (
        fs[0].evidence)


def test_a_math_library_allocation_failure_follows_the_out_of_memory():
    """cuBLAS failing to allocate its workspace is what running out of GPU memory looks like
    from inside it: the OOM leads, the cuBLAS error is listed under it."""
    text = ("[rank1]: RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
            "`cublasCreate(handle)`\n[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried "
            "to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which 3.88 MiB "
            "is free.\n")
    fs = triage.triage(joblog.normalise(text))
    assert [f.id for f in fs] == ["job.cuda_oom", "job.cuda_error"]
    assert any(e.startswith("consequence: CUBLAS_STATUS_ALLOC_FAILED") for e in fs[0].evidence)


# a rank's traceback cut before its exception line (torchtitan 3360's tags), in any rank's tag
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 511), st.integers(1, 6))
def test_a_cut_traceback_is_a_failure_of_its_rank(r, frames):
    body = "".join(f'[rank{r}]:   File "/workspace/torchtitan/train.py", line {60 + i}, in main\n'
                   f"[rank{r}]:     trainer.train()\n" for i in range(frames))
    fs = triage.triage(joblog.normalise(f"[rank{r}]: Traceback (most recent call last):\n{body}"))
    assert fs[0].id == "job.unrecognised" and fs[0].status == "fail"
    assert fs[0].summary.startswith(f"rank {r}'s traceback was cut before its exception line")
    assert f"train.py:{60 + frames - 1}" in fs[0].summary
    # the exception line, once there, closes it: the exception is the finding
    closed = triage.triage(joblog.normalise(f"[rank{r}]: Traceback (most recent call last):\n"
                                            f"{body}[rank{r}]: ValueError: bad shard\n"))
    assert closed[0].id == "job.exception" and "ValueError: bad shard" in closed[0].summary


def _megatron_run(iters: int, dated: bool, evaluate: list[str], save: bool) -> str:
    """A finished Megatron-LM run's last lines as its training.py and checkpointing.py print
    them: iteration lines (all as wide: the widest lines of the log), print_datetime's end line,
    the checkpoint saved after training and evaluate_and_print_results' reports, each framed by
    '-' * (len(report) + 1)."""
    out = []
    for i in range(1, iters + 1):
        head = f" [2026-12-06 10:00:{i % 60:02d}]" if dated else ""
        out.append(f"{head} iteration {i:8d}/{iters:8d} | consumed samples: {8 * i:12d} | "
                   f"elapsed time per iteration (ms): 1234.5 | learning rate: 1.000000E-04 | "
                   f"global batch size:     8 | lm loss: 9.876543E+00 | loss scale: 1.0 | "
                   f"grad norm: 3.210 | number of skipped iterations:   0 | number of nan "
                   f"iterations:   0 |")
    out.append("[after training is done] datetime: 2026-12-06 10:01:00 ")
    if save:
        out.append(f"saving checkpoint at iteration {iters:7d} to /ckpt in torch_dist format")
        out.append(f"  successfully saved checkpoint from iteration {iters:7d} to /ckpt "
                   "[ t 1/1, p 1/1 ]")
    for which in evaluate:
        report = (f" validation loss at iteration {iters} on {which} set | lm loss value: "
                  "9.700000E+00 | lm loss PPL: 1.632799E+04 | ")
        out += ["-" * (len(report) + 1), report, "-" * (len(report) + 1)]
    return "\n".join(out) + "\n"


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 30), st.booleans(),
       st.lists(st.sampled_from(["validation", "test"]), max_size=2, unique=True), st.booleans())
def test_a_finished_megatron_run_ends_normally_on_its_own_line(tmp_path_factory, iters, dated,
                                                               evaluate, save):
    """Issue 49: the end line is not glued to the iteration line before it (both as wide as the
    widest line), the evaluation report not to its rule, and the checkpoint and evaluation
    printed after the end are the same run's, not progress of another."""
    log = tmp_path_factory.mktemp("megatron") / "train.log"
    text = _megatron_run(iters, dated, evaluate, save)
    log.write_text(text)
    fs, lines, _ = jobs.run([log])
    assert lines == text.count("\n")
    assert [(f.id, f.status) for f in fs] == [("job.clean", "pass")]
    assert fs[0].summary == ("the log ends normally: [after training is done] datetime: "
                             "2026-12-06 10:01:00")


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 6), st.integers(0, 40), st.integers(1, 10**6))
def test_a_seqnum_is_the_same_in_every_file_of_a_job(tmp_path_factory, files, before, seq):
    """Each rank's file times out at the same SeqNum: no rank is 'the odd one out'. (Events of
    a later file are placed after the files before it: that shifted the order of reading, and,
    while events were dicts whose `seq` was the timeout's SeqNum, the SeqNum itself.)"""
    where = tmp_path_factory.mktemp("job")
    logs = []
    for r in range(files):
        log = where / f"train-rank{r}.log"
        log.write_text("".join(f"step {i} loss 2.0\n" for i in range(before))
                       + WATCHDOG.format(r=r, seq=seq, op="ALLREDUCE") + "\n")
        logs.append(log)
    fs, _, _ = jobs.run(logs)
    assert fs[0].id == "job.timeout" and f"(SeqNum {seq}," in fs[0].summary
    assert not any(f.id == "job.odd_rank" for f in fs)
