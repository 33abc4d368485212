"""The job-log corpus (tests/fixtures/job-logs/README.md) against what a correct triage reports
(EXPECT.md), through the checks bench/triage_corpus.py scores: every check of the tune half
holds; of the held-out half, the checks that held when it was measured (the misses are listed
in the README, not hidden here)."""

import importlib.util

import pytest

from megatron_env.diagnose import jobs

from .conftest import FIXTURES

ROOT = FIXTURES.parent.parent
_spec = importlib.util.spec_from_file_location("triage_corpus", ROOT / "bench" / "triage_corpus.py")
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)


def _readme_split() -> dict[str, str]:
    rows = [line.split("|") for line in (corpus.LOGS / "README.md").read_text().splitlines()
            if line.startswith("| ") and line.endswith(" |") and ".log" in line]
    return {r[1].strip(): r[-2].strip() for r in rows if r[-2].strip() in ("tune", "heldout")}


def test_every_log_has_its_source_and_split():
    split = _readme_split()
    logs = sorted(p.name for p in corpus.LOGS.glob("*.log"))
    assert logs == sorted(split) and len(logs) >= 35
    assert set(split.values()) == {"tune", "heldout"}
    assert {k for k, v in split.items() if v == "heldout"} == set(corpus.HELDOUT)
    assert set(corpus.TUNE) <= {k for k, v in split.items() if v == "tune"}


# Tune logs added with the second batch whose checks the parser does not meet yet: the parser
# change this half exists for makes them pass, and strict xfail makes a passing one fail until it
# is taken off this list.
NOT_YET_TUNED = {
    "ofi-cq-einval-cloudwatch-table-prefix-awsofi715.log",
    "ray-node-marked-dead-heartbeats-ray45179.log",
}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="shape not read yet"))
    if n in NOT_YET_TUNED else n for n in sorted(corpus.TUNE)])
def test_tune_logs_give_what_expect_says(name):
    findings, _, _ = jobs.run([corpus.LOGS / name])
    text = corpus.blob(findings)
    missed = [c for c in corpus.TUNE[name] if not corpus.holds(c, findings, text)]
    assert not missed, text


# What the held-out half missed when it was measured (bench/triage_corpus.py --split heldout:
# 56/80 checks, 7/19 logs whole). Listed, not fixed: tuning to them would make the held-out
# score meaningless. tests/fixtures/job-logs/README.md says what each miss is.
HELDOUT_MISSES = {
    "watchdog-ray-ip-allgather-simplerl25.log": ["10.7.35.246"],
    "watchdog-wrapped-after-other-output-sglang3836.log": [
        "id:job.timeout", "rank 5", "ALLREDUCE", "SeqNum 5653", "58720256"],
    "watchdog-old-format-no-seqnum-wrapped-accelerate157.log": [
        "id:job.timeout", "rank 0", "ALLREDUCE", "Timeout(ms)=1800000"],
    "watchdog-silent-rank0-python-logging-ace348.log": [
        "ranks 1, 2 and 3", "id:job.odd_rank", "re:job.odd_rank fail rank 0 "],
    "watchdog-terminate-python-logging-internlm290.log": ["f363ff97a009"],
    "dump-signal-ray-ansi-skyrl757.log": ["id:job.timeout", "rank 0"],
    "invalid-usage-mpi-stdout-allreduce-horovod3625.log": [
        "re:(?m)^\\S+ fail .*invalid (usage|root)", "biomind"],
    "remote-error-one-line-collapsed-alpaca207.log": ["vendor err 129"],
    "remote-error-ofi-rank-prefix-nccl1928.log": ["UNDELIVERABLE"],
    "invalid-usage-duplicate-gpu-lrgt13.log": ["re:(?m)^\\S+ fail .*Duplicate GPU", "ubun"],
    "unhandled-system-error-srun-task-exit-horovod1651.log": ["jwc09n018"],
    "xid-dmesg-T-three-gpus-akash244.log": ["node4"],
}


# Held-out logs added after that measurement: their checks were written before the tool ran on
# them, and they are not triaged until the one held-out measurement at the end of the change that
# tunes the parser; that measurement fills HELDOUT_MISSES for them and empties this set.
NOT_YET_MEASURED = {
    "bus-error-backtrace-p2p-megatron516.log",
    "bus-error-nccl-info-interleaved-deepspeed2638.log",
    "collective-fingerprint-seq-mismatch-deepspeed4890.log",
    "connect-refused-nccl2-redacted-host-nccl111.log",
    "connection-closed-nccl-failure-nccltests15.log",
    "cuda-oom-pdsh-host-prefix-deepspeed2899.log",
    "cuda-oom-training-log-deepspeedexamples279.log",
    "horovod-stall-inspector-new-format-horovod3950.log",
    "horovod-stalled-ops-old-format-horovod534.log",
    "invalid-argument-srun-task-ranges-parlai3084.log",
    "ray-actor-died-raylet-easyr1-300.log",
    "ray-actor-died-tab-fields-toolstar10.log",
    "ray-task-error-taskrunner-verl2995.log",
    "rendezvous-create-tcp-store-ray-torchtune2450.log",
    "rendezvous-json-escaped-callstack-pytorch67581.log",
    "rendezvous-ray-commandactor-prefix-torchx540.log",
    "rendezvous-tcpstore-connect-timed-out-pytorch69197.log",
    "rendezvous-terminal-padded-wrapped-torchtune2676.log",
    "sigkill-deepspeed-launcher-rc9-deepspeed3232.log",
    "sigkill-mp-spawn-process-exited-prompt4nr3.log",
    "sigkill-root-cause-k8s-pod-host-accelerate-cppo6.log",
    "sigkill-torchrun-root-cause-rank7-recurrentdrafter5.log",
    "sigsegv-deepspeed-launcher-rc11-glued-deepspeedexamples626.log",
    "sigsegv-handler-horovod-comm-init-nccl529.log",
    "sigsegv-openmpi-handler-libmlx4-chainer7586.log",
    "sigsegv-openmpi-handler-timestamp-k8s-nccl2380.log",
    "sigsegv-ucx-caught-signal-prterun-nccl1419.log",
    "slurm-time-limit-cancelled-zettautils671.log",
    "socket-connect-abort-proxy-recv-nccltests166.log",
    "socket-poll-no-route-sglang3820.log",
    "unhandled-cuda-error-terminate-what-objdetect9.log",
    "unhandled-system-error-interleaved-chars-fabric-nccl1000.log",
    "unhandled-system-error-last-error-poll-barrier-veomni131.log",
    "unhandled-system-error-repeated-nemo833.log",
    "watchdog-allreduce-failure-detected-vlmr1-294.log",
    "watchdog-coalesced-first-work-nccl1504.log",
    "watchdog-coalesced-pg-guid-diffsynth458.log",
    "watchdog-lineno-prefix-pg1-llamafactory8261.log",
    "watchdog-old-bracket-e-slurm-llmtraining7.log",
    "watchdog-recv-collector-host-prefix-k8s-chitu80.log",
}


@pytest.mark.parametrize("name", sorted(corpus.HELDOUT))
def test_heldout_logs_keep_what_they_got_right(name):
    if name in NOT_YET_MEASURED:
        pytest.skip("held out, not measured yet")
    findings, _, _ = jobs.run([corpus.LOGS / name])
    text = corpus.blob(findings)
    known = HELDOUT_MISSES.get(name, [])
    assert set(known) <= set(corpus.HELDOUT[name])
    missed = [c for c in corpus.HELDOUT[name]
              if c not in known and not corpus.holds(c, findings, text)]
    assert not missed, text
