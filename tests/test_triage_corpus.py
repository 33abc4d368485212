"""The job-log corpus (tests/fixtures/job-logs/README.md) against what a correct triage reports
(EXPECT.md), through the checks bench/triage_corpus.py scores: every check of the tune half
holds; of the held-out half, the checks that held when it was measured (the misses are listed
in the README, not hidden here)."""

import hashlib

import pytest

from bench import triage_corpus as corpus
from megatron_env.diagnose import jobs


def _readme_split() -> dict[str, str]:
    rows = [line.split("|") for line in (corpus.LOGS / "README.md").read_text().splitlines()
            if line.startswith("| ") and line.endswith(" |") and ".log" in line]
    return {r[1].strip(): r[-2].strip() for r in rows
            if r[-2].strip() in ("tune", "heldout", "tune2", "heldout2", "tune3", "heldout3")}


def test_every_log_has_its_source_and_split():
    split = _readme_split()
    logs = sorted(p.name for p in corpus.LOGS.glob("*.log"))
    assert logs == sorted(split) and len(logs) >= 35
    assert {"tune", "heldout"} <= set(split.values())
    assert {k for k, v in split.items() if v == "heldout"} == set(corpus.HELDOUT)
    assert set(corpus.TUNE) <= {k for k, v in split.items() if v == "tune"}
    assert {k for k, v in split.items() if v == "tune2"} == set(corpus.TUNE2)
    assert {k for k, v in split.items() if v == "heldout2"} == set(corpus.HELDOUT2)
    assert {k for k, v in split.items() if v == "tune3"} == set(corpus.TUNE3)
    assert {k for k, v in split.items() if v == "heldout3"} == set(corpus.HELDOUT3)


def test_issue51_halves_are_the_hash_of_the_name():
    """Issue 51's logs were split by sha256(file name) before the tool ran on them: a log moved
    to the half it does well in fails here."""
    for half, logs in (("heldout3", corpus.HELDOUT3), ("tune3", corpus.TUNE3)):
        for name in logs:
            odd = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 2
            assert ("heldout3" if odd else "tune3") == half, name
    assert len(corpus.TUNE3) + len(corpus.HELDOUT3) >= 40


# Tune logs added with the second batch whose checks the parser does not meet yet: the parser
# change this half exists for makes them pass, and strict xfail makes a passing one fail until it
# is taken off this list.
NOT_YET_TUNED: set[str] = set()


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="shape not read yet"))
    if n in NOT_YET_TUNED else n for n in sorted(corpus.TUNE)])
def test_tune_logs_give_what_expect_says(name):
    findings, _, _ = jobs.run([corpus.LOGS / name])
    text = corpus.blob(findings)
    missed = [c for c in corpus.TUNE[name] if not corpus.holds(c, findings, text)]
    assert not missed, text


@pytest.mark.parametrize("name", sorted(corpus.TUNE2))
def test_issue42_tune_logs_give_what_expect_says(name):
    """Issue 42's tune half: finished runs exit 0, logs that stop exit 3 with the physical line
    count, the families of failures seen, the rank's own error before the launcher's table."""
    findings, lines, _ = jobs.run([corpus.LOGS / name])
    text = corpus.blob(findings)
    missed = [c for c in corpus.TUNE2[name] if not corpus.holds(c, findings, text, lines)]
    assert not missed, text


@pytest.mark.parametrize("name", sorted(corpus.TUNE3))
def test_issue51_tune_logs_give_what_expect_says(name):
    """Issue 51's tune half: a failure exits 1 with its cause as the first finding (a rank's own
    exception, a traceback cut before its exception line, a compiler's error records), a run
    cut mid-way exits 3 and says no `fail` in JSON, a logger's end exits 0."""
    findings, lines, _ = jobs.run([corpus.LOGS / name])
    text = corpus.blob(findings)
    missed = [c for c in corpus.TUNE3[name] if not corpus.holds(c, findings, text, lines)]
    assert not missed, text


# What the held-out half missed when it was last measured (bench/triage_corpus.py --split heldout,
# once, after issue 35's families: 266/323 checks (82%), 72/109 logs whole, 0 failed logs exit 0;
# issue 28's measurement before it: 141/193 checks, 32/59 logs). Listed, not fixed: tuning to
# them would make the held-out score meaningless.
FAIL_RE = corpus.FAIL
HELDOUT_MISSES = {
    'collective-fingerprint-seq-mismatch-deepspeed4890.log': [
        'rank 0',
        # met until issue 51 only because "cannot tell" was printed as `fail` (job.stopped's
        # line holds the SeqNum); the mismatch itself was never read
        FAIL_RE + r".*(?i:1277|1275|mismatch|desync)",
    ],
    'comm-nccl-socket-reset-k8s-timestamps-nccl1920.log': [
        'gpu-server320',
    ],
    'connect-refused-nccl2-redacted-host-nccl111.log': [
        're:(?m)^\\S+ fail .*(?i:connection refused|connect)',
    ],
    'dump-signal-ray-ansi-skyrl757.log': [
        'id:job.timeout',
        'rank 0',
    ],
    'gpu-pcie-aer-nvidia-smi-unknown-error-returnn1486.log': [
        'id:job.hardware',
        'cn-234',
    ],
    'horovod-stall-inspector-new-format-horovod3950.log': [
        're:(?m)^\\S+ fail .*(?i:stall|missing rank)',
    ],
    'hw-ecc-node-dgk713-jade194.log': [
        'id:job.hardware',
    ],
    'hw-ecc-rich-box-accelerate-sigterm-accelerate1192.log': [
        'first:job.hardware',
    ],
    'hw-ecc-two-lines-alpacalora123.log': [
        'id:job.hardware',
    ],
    'hw-fallen-off-bus-multiline-no-xid-nvsentinel155.log': [
        'id:job.hardware',
        '0000:b3:00.0',
        're:(?i)fallen off the bus',
    ],
    'hw-ibv-open-device-failed-pod-imagereward65.log': [
        're:(?m)^\\S+ fail .*(?i:ibv_open_device|Unable to open device)',
    ],
    'hw-rdma-link-down-polling-rccl1423.log': [
        'id:job.hardware',
    ],
    'invalid-usage-duplicate-gpu-lrgt13.log': [
        're:(?m)^\\S+ fail .*Duplicate GPU',
        'ubun',
    ],
    'invalid-usage-mpi-stdout-allreduce-horovod3625.log': [
        're:(?m)^\\S+ fail .*invalid (usage|root)',
    ],
    'k8s-describe-last-state-exit-137-reason-error-fontbakery100.log': [
        'id:job.signal',
        '137',
    ],
    'killed-bare-after-iterations-fastmaskrcnn172.log': [
        'id:job.signal',
    ],
    'mpich-bad-termination-exit-code-9-hydra-cbiocluster256.log': [
        'id:job.signal',
        're:(?i)exit code:? 9|SIGKILL',
    ],
    'ray-oom-release-test-blank-lines-ray28776.log': [
        '172.31.69.247',
    ],
    'ray-oom-task-killed-traceback-flingbot11.log': [
        '192.168.0.107',
        '4331',
    ],
    'rendezvous-gloo-unable-to-find-address-pipedream32.log': [
        'id:job.rendezvous',
    ],
    'rendezvous-json-escaped-callstack-pytorch67581.log': [
        're:connect\\(\\) timed out|60000',
    ],
    'rendezvous-ray-commandactor-prefix-torchx540.log': [
        'id:job.rendezvous',
        '10.130.6.168',
    ],
    'rendezvous-tcpstore-connect-timed-out-pytorch69197.log': [
        'id:job.rendezvous',
    ],
    'rendezvous-terminal-padded-wrapped-torchtune2676.log': [
        'id:job.rendezvous',
    ],
    'sigsegv-handler-horovod-comm-init-nccl529.log': [
        're:(?m)^\\S+ fail .*(?i:segmentation fault|sigsegv)',
    ],
    'socket-poll-no-route-sglang3820.log': [
        'id:nccl.socket',
        '10.0.0.4',
        'No route to host',
        'node5',
    ],
    'stop-slurm-gcp-nccl-socket-channels-nccl447.log': [
        'id:job.stopped',
        'slurm-train-compute-0-0',
    ],
    'unhandled-system-error-last-error-poll-barrier-veomni131.log': [
        're:(?i)barrier',
    ],
    'unhandled-system-error-srun-task-exit-horovod1651.log': [
        'jwc09n018',
    ],
    'user-code-keyerror-two-ranks-interleaved-doctamper87.log': [
        'KeyError',
    ],
    'watchdog-lineno-prefix-pg1-llamafactory8261.log': [
        'rank 4',
        # met until issue 51 only because "cannot tell" was printed as `fail`
        r"re:(?m)^job\.\w+ fail ",
    ],
    'watchdog-old-format-no-seqnum-wrapped-accelerate157.log': [
        'id:job.timeout',
        'rank 0',
        'ALLREDUCE',
        'Timeout(ms)=1800000',
    ],
    'watchdog-recv-collector-host-prefix-k8s-chitu80.log': [
        'sm228-a100-40g-23',
    ],
    'watchdog-silent-rank0-python-logging-ace348.log': [
        'ranks 1, 2 and 3',
        'id:job.odd_rank',
        're:job.odd_rank fail rank 0 ',
    ],
    'watchdog-terminate-python-logging-internlm290.log': [
        'f363ff97a009',
    ],
    'watchdog-wrapped-after-other-output-sglang3836.log': [
        'id:job.timeout',
        'SeqNum 5653',
        'not:re:\\b5872\\b',
    ],
    'xid-dmesg-T-three-gpus-akash244.log': [
        'node4',
    ],
}


# held-out logs not yet measured are not triaged here: their first triage is the measurement
@pytest.mark.parametrize("name", sorted(set(corpus.HELDOUT) - corpus.NOT_YET_MEASURED))
def test_heldout_logs_keep_what_they_got_right(name):
    findings, _, _ = jobs.run([corpus.LOGS / name])
    text = corpus.blob(findings)
    known = HELDOUT_MISSES.get(name, [])
    assert set(known) <= set(corpus.HELDOUT[name])
    missed = [c for c in corpus.HELDOUT[name]
              if c not in known and not corpus.holds(c, findings, text)]
    assert not missed, text


# What issue 51's held-out half missed when it was measured (README, "Issue 51's held-out
# result"): the rest must stay right
HELDOUT3_MISSES = {
    "flashattention-ampere-one-line-windows-c10-frames-iftrellis40.log": [
        "exit:1", "lead:FlashAttention only supports Ampere"],
}


@pytest.mark.parametrize("name", sorted(corpus.HELDOUT3))
def test_issue51_heldout_logs_keep_what_they_got_right(name):
    findings, lines, _ = jobs.run([corpus.LOGS / name])
    text = corpus.blob(findings)
    known = HELDOUT3_MISSES.get(name, [])
    assert set(known) <= set(corpus.HELDOUT3[name])
    missed = [c for c in corpus.HELDOUT3[name]
              if c not in known and not corpus.holds(c, findings, text, lines)]
    assert not missed, text
