"""The job model of triage (model.Job): pids repeat across hosts, so a pid seen on one host
tells nothing of the same pid on another."""

from __future__ import annotations

from megatron_env.diagnose.model import Job


def test_a_pid_seen_on_another_host_does_not_take_its_rank():
    """pid 100 on node a, then a rank-0 line from pid 100 on node b: rank 0 belongs to b's
    process; a's pid 100 must not be called rank 0 (a finding would name the wrong host)."""
    job = Job()
    job.note(host="a", pid="100", gpu=3)
    job.note(rank=0, host="b", pid="100")
    assert job.who(host="a", pid="100") == {"rank": None, "host": "a", "pid": "100", "gpu": 3}
