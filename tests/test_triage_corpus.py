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
    "k8s-describe-oomkilled-exit-code-0-kubernetes131530.log",
    "k8s-describe-last-state-oomkilled-137-gimlet649.log",
    "stop-waveglow-slurm-64gpu-nvlog-epoch-434-waveglow160.log",
    "hw-nvlink-uncorrectable-terminate-two-whats-pytorch58155.log",
    "data-tokenizer-textencodeinput-title-happytransformer323.log",
    "deepspeed-launcher-kills-four-local-rank-3-cut-llamafactory2061.log",
    "torchrun-python-logging-exitcode-6-colossalai1400.log",
    "torchrun-table-sigabrt-odd-ranks-ec2-vlmevalkit1131.log",
    "sigill-illegal-instruction-after-pretrained-load-hrnet150.log",
    "k8s-get-pods-crashloopbackoff-katib1112.log",
    "lightning-slurm-time-limit-sigterm-bypassed-lightning20542.log",
    "srun-task-0-killed-force-terminated-arjuna48.log",
    "ray-raylet-workers-killed-memory-pressure-wrapped-wmpo3.log",
    "accelerate-calledprocesserror-exit-1-macos-sdscripts1354.log",
    "user-code-nameerror-deepspeed-launcher-rc0-deepspeed618.log",
    "stop-fsdp-fingerprint-then-nccl-init-hang-nccl1160.log",
    "stop-megatron-nccl-init-info-then-nothing-nccl997.log",
    "hw-ib-async-event-port-error-nccl905.log",
    "mpirun-primary-job-rank1-signal-9-redacted-awareofhistory2.log",
    "mpiexec-signal-6-aborted-total-killed-adda151.log",
    "mpirun-exited-on-signal-9-dashes-relion112.log",
    "data-unidentified-image-worker-0-translatingmaps27.log",
    "framework-deepspeed-batch-assert-rich-box-starcoder77.log",
    "numerics-anomaly-solvebackward-nan-pytorch37712.log",
    "numerics-loss-scale-stuck-at-1-zero2-transformers14531.log",
    "numerics-overflow-scale-falling-progress-llamaalpaca534.log",
    "numerics-grad-norm-nan-megatron-iterations-megatrondeepspeed396.log",
    "store-connection-reset-init-sequence-number-pytorch74146.log",
    "store-recvvalue-reset-rank-prefix-k8s-sglang20859.log",
    "store-get-unique-id-backtrace-test-plan-pytorch68597.log",
    "store-get-unique-id-socket-timeout-title-nccl845.log",
    "heartbeat-keepalive-timer-thread-exception-pytorch62029.log",
    "port-in-use-eaddrinuse-second-run-vlmr1-289.log",
    "port-in-use-eaddrinuse-code98-msswift3988.log",
    "k8s-eviction-node-low-memory-kubeflow1261.log",
    "killed-bash-job-control-line-argo8981.log",
    "k8s-exit-137-kubectl-exec-jupyter736.log",
    "killed-bare-after-progress-bar-hedwig70.log",
    "slurm-job-time-limit-after-shell-trace-nextdenovo114.log",
    "slurm-job-time-limit-after-progress-canu1052.log",
    "slurm-step-time-limit-srun-task-ranges-desitarget628.log",
    "dataloader-segfault-one-line-db94.log",
    "dataloader-killed-python27-dcpdn12.log",
    "oom-killer-dmesg-T-sacrifice-child-eris42.log",
    "oom-killer-dmesg-terminal-wrapped-tranx41.log",
    "stale-file-handle-rank-prefix-msswift6695.log",
    "stale-file-handle-log-write-taiyaki66.log",
    "disk-no-space-safetensors-title-llamafactory5155.log",
    "disk-no-space-torch-save-metaflow-prefix-dolly139.log",
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


# What the held-out half missed when it was last measured (bench/triage_corpus.py --split heldout,
# once, after issue 28's parser change: 141/193 checks, 32/59 logs whole; the first 19 logs
# scored 56/80 before it). Listed, not fixed: tuning to them would make the held-out score
# meaningless. tests/fixtures/job-logs/README.md says what each miss is.
HELDOUT_MISSES = {
    'watchdog-wrapped-after-other-output-sglang3836.log': [
        'id:job.timeout',
        'rank 5',
        'ALLREDUCE',
        'SeqNum 5653',
        '58720256',
    ],
    'watchdog-old-format-no-seqnum-wrapped-accelerate157.log': [
        'id:job.timeout',
        'rank 0',
        'ALLREDUCE',
        'Timeout(ms)=1800000',
    ],
    'watchdog-silent-rank0-python-logging-ace348.log': [
        'ranks 1, 2 and 3',
        'id:job.odd_rank',
        're:job.odd_rank fail rank 0 ',
    ],
    'watchdog-terminate-python-logging-internlm290.log': [
        'f363ff97a009',
    ],
    'dump-signal-ray-ansi-skyrl757.log': [
        'id:job.timeout',
        'rank 0',
    ],
    'invalid-usage-mpi-stdout-allreduce-horovod3625.log': [
        're:(?m)^\\S+ fail .*invalid (usage|root)',
        'biomind',
    ],
    'remote-error-one-line-collapsed-alpaca207.log': [
        'vendor err 129',
    ],
    'invalid-usage-duplicate-gpu-lrgt13.log': [
        're:(?m)^\\S+ fail .*Duplicate GPU',
        'ubun',
    ],
    'unhandled-system-error-srun-task-exit-horovod1651.log': [
        'jwc09n018',
    ],
    'xid-dmesg-T-three-gpus-akash244.log': [
        'node4',
    ],
    'horovod-stall-inspector-new-format-horovod3950.log': [
        're:(?m)^\\S+ fail .*(?i:stall|missing rank)',
        'broadcast.assign_conv',
    ],
    'watchdog-lineno-prefix-pg1-llamafactory8261.log': [
        're:(?m)^job\\.\\w+ fail ',
        'rank 4',
    ],
    'sigkill-deepspeed-launcher-rc9-deepspeed3232.log': [
        're:(?m)^\\S+ fail .*(?i:sigkill|-9|killed)',
    ],
    'ray-actor-died-raylet-easyr1-300.log': [
        're:(?m)^\\S+ fail .*(?i:actor|ray|worker)',
        '1009098',
        '172.23.166.108',
    ],
    'ray-actor-died-tab-fields-toolstar10.log': [
        're:(?m)^\\S+ fail .*(?i:actor|ray|worker)',
        '694415',
    ],
    'rendezvous-tcpstore-connect-timed-out-pytorch69197.log': [
        'id:job.rendezvous',
        '60000',
    ],
    'rendezvous-json-escaped-callstack-pytorch67581.log': [
        're:connect\\(\\) timed out|60000',
    ],
    'watchdog-recv-collector-host-prefix-k8s-chitu80.log': [
        'sm228-a100-40g-23',
    ],
    'socket-poll-no-route-sglang3820.log': [
        'id:nccl.socket',
        '10.0.0.4',
        'No route to host',
        'node5',
    ],
    'connect-refused-nccl2-redacted-host-nccl111.log': [
        're:(?m)^\\S+ fail .*(?i:connection refused|connect)',
    ],
    'sigsegv-handler-horovod-comm-init-nccl529.log': [
        're:(?m)^\\S+ fail .*(?i:segmentation fault|sigsegv)',
        'ncclCommInitRank',
    ],
    'sigkill-mp-spawn-process-exited-prompt4nr3.log': [
        're:(?m)^\\S+ fail .*SIGKILL',
        'process 0',
    ],
    'rendezvous-terminal-padded-wrapped-torchtune2676.log': [
        'id:job.rendezvous',
    ],
    'rendezvous-ray-commandactor-prefix-torchx540.log': [
        'id:job.rendezvous',
        '10.130.6.168',
    ],
    'unhandled-system-error-last-error-poll-barrier-veomni131.log': [
        're:(?i)barrier',
    ],
    'collective-fingerprint-seq-mismatch-deepspeed4890.log': [
        're:(?m)^\\S+ fail .*(?i:1277|1275|mismatch|desync)',
        'rank 0',
    ],
    'sigsegv-deepspeed-launcher-rc11-glued-deepspeedexamples626.log': [
        're:(?m)^\\S+ fail .*(?i:sigsegv|-11|segmentation)',
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
