"""Failures that were seen but not named: each is a failure of its own family (exit 1), never
`job.stopped` or `job.unrecognised`. The logs are real: captured from real runs made for these
tests (tests/fixtures/captured-runs, each with the script that made it), and, where a run here
cannot make the shape (two ranks' lines glued into one), real lines of those captures put
together the way the shape has them."""

import subprocess
import sys

import pytest

from megatron_env.diagnose import families, jobs

from .conftest import FIXTURES

ROOT = FIXTURES.parent.parent
CAPTURED = FIXTURES / "captured-runs"


def _first(path):
    fs, _, _ = jobs.run([path])
    return fs[0]


@pytest.mark.parametrize("log, fid, family, said", [
    ("dataloader-worker-segfault.log", "job.data", "data",
     "a DataLoader worker crashed: segmentation fault"),
    ("dataloader-timeout.log", "job.data", "data",
     "a DataLoader batch took longer than its timeout (2 s)"),
    ("compile-backend-failed.log", "job.compiler", "compiler",
     "torch.compile's backend my_backend failed: RuntimeError: fused kernel for aten.mm"),
    ("torchrun-undefined-symbol.log", "job.kernel_abi", "framework",
     "fused_ops.cpython-312-x86_64-linux-gnu.so needs the undefined symbol "
     "_ZN3c104cuda20getCurrentCUDAStreamEa (ranks 0 and 1)"),
    ("mpi-abort-rank1.log", "job.mpi_abort", "abort",
     "rank 1 called MPI_ABORT on MPI_COMM_WORLD"),
    ("jax-resource-exhausted.log", "job.accelerator_oom", "user",
     "RESOURCE_EXHAUSTED Out of memory allocating 640000000000 bytes"),
])
def test_a_failure_seen_is_named_in_its_family(log, fid, family, said):
    f = _first(CAPTURED / log)
    assert (f.id, f.status, f.kind) == (fid, "fail", family)
    assert said in f.summary


@pytest.mark.parametrize("tags", [("[rank1]: ", "[rank0]: "), ("", "")])
def test_two_ranks_undefined_symbol_on_one_line(tmp_path, tags):
    """Two ranks' ImportError lines written into one line (their writes raced), from the real
    lines of the torchrun capture."""
    lines = (CAPTURED / "torchrun-undefined-symbol.log").read_text().splitlines()
    err = [x.split("]: ", 1)[1] for x in lines if "ImportError:" in x][:2]
    log = tmp_path / "job.log"
    log.write_text(f"{tags[0]}{err[0]}{tags[1]}{err[1]}\n")
    f = _first(log)
    assert f.id == "job.kernel_abi" and f.summary.count("getCurrentCUDAStreamEa") == 1
    assert "needs the undefined symbol _ZN3c104cuda20getCurrentCUDAStreamEa" in f.summary
    assert "ImportError" not in f.summary.split("undefined symbol ")[1]


def test_the_cli_exits_1_for_each(tmp_path):
    for log in ("dataloader-worker-segfault.log", "mpi-abort-rank1.log"):
        r = subprocess.run([sys.executable, "-m", "invoke", "triage", str(CAPTURED / log)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stdout


def test_every_id_triage_reports_is_a_finding_id_with_a_family():
    """Finding ids are one enum (diagnose/ids.py): every finding of every log in the corpus has
    an id that is a member (so, a family), and an id that is not one is refused."""
    from megatron_env.diagnose.ids import FindingId
    from megatron_env.findings import Finding

    seen = set()
    for log in sorted(FIXTURES.joinpath("job-logs").glob("*.log")):
        seen |= {f.id for f in jobs.run([log])[0]}
    assert seen <= {i.value for i in FindingId}
    assert {i.value for i in FindingId} <= set(families.FAMILY_OF)
    assert Finding(FindingId.JOB_TIMEOUT, "fail", "x").to_dict()["id"] == "job.timeout"
    with pytest.raises(ValueError):
        FindingId("job.timout")
