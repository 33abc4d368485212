"""Every physical line counted as `wc -l` counts it, whatever the joining of wrapped lines does,
and the last iteration named is the last one logged.

The count is checked against the real `wc -l` on every real fixture log, and on generated logs
made of what breaks a wrap detector: runs of lines of one width (a trainer's columns), lines
that begin with a space (Megatron's iteration lines), blank lines, a last line without a line
end."""

import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_env.diagnose import joblog, jobs, logfiles, twocore

from .conftest import FIXTURES

LOGS = FIXTURES / "job-logs"
WC = shutil.which("wc")


def _wc(path) -> int:
    """`wc -l`, plus one for a last line without a line end (as `grep -c ''` counts it)."""
    n = int(subprocess.run([WC, "-l", str(path)], capture_output=True, text=True,
                           check=True).stdout.split()[0])
    data = path.read_bytes()
    return n + (1 if data and not data.endswith(b"\n") else 0)


def _megatron(n: int, start: int = 1) -> list[str]:
    """Megatron-LM's iteration lines as training.py's training_log prints them: every field
    padded to a fixed width, so every line of a run is as wide as the others, and each begins
    with a space."""
    return [f" iteration {i:8d}/{500000:8d} | consumed samples: {i * 512:12d} | elapsed time "
            f"per iteration (ms): {1234.5:.1f} | learning rate: {1.5e-4:.3E} | global batch "
            f"size: {512:5d} | lm loss: {2.5 - i / 1e6:.6E} | loss scale: 1.0 | grad norm: "
            f"{0.812:.3f} | number of skipped iterations: {0:3d} | number of nan iterations: "
            f"{0:3d} |" for i in range(start, start + n)]


@pytest.mark.skipif(WC is None, reason="no wc")
@pytest.mark.parametrize("log", sorted(LOGS.glob("*.log")), ids=lambda p: p.name[:60])
def test_every_fixture_log_counts_as_wc_l(log):
    ev = jobs.read(log)
    assert ev is None or ev.lines == _wc(log)


def test_five_thousand_iteration_lines_are_five_thousand_lines_and_the_last_is_named(tmp_path):
    log = tmp_path / "train.log"
    head = "x" * (len(_megatron(1)[0]))  # a line of the very same width just before them
    log.write_text("\n".join([head, *_megatron(5000)]) + "\n")
    assert len(list(joblog.lines(log.read_text().splitlines()))) == 5001
    fs, lines, _ = jobs.run([log])
    assert lines == 5001
    stopped = next(f for f in fs if f.id == "job.stopped")
    assert "iteration     5000/  500000" in stopped.summary


@pytest.mark.parametrize("mode", ["one", "two"])
def test_the_count_is_the_same_in_one_or_two_processes(tmp_path, monkeypatch, mode):
    log = tmp_path / "big.log"
    log.write_text("\n".join(_megatron(20000)) + "\n" + "RuntimeError: boom\n" * 3)
    monkeypatch.setattr(twocore, "MODE", mode)
    assert jobs.read(log).lines == 20003 == _wc(log)


_LINE = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\n\r\0"), max_size=120),
    st.sampled_from(["", " ", "  iteration 1/ 10 |", "Traceback (most recent call last):",
                     "[rank0]:[E ProcessGroupNCCL.cpp:1] Watchdog caught collective "
                     "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE",
                     " NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600011 ms"]),
    st.integers(60, 130).map(lambda w: " " + "y" * (w - 1)),
    st.integers(60, 130).map(lambda w: "z" * w))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_LINE, max_size=80), end=st.booleans())
def test_generated_logs_count_as_wc_l(tmp_path, lines, end):
    log = tmp_path / "gen.log"
    log.write_bytes(("\n".join(lines) + ("\n" if end and lines else "")).encode())
    tally = logfiles.Tally()
    made = list(joblog.lines(logfiles.physical(log, None, tally), str(log)))
    assert tally.lines == _wc(log)
    if made:  # the messages cover the lines, in order, without overlap
        assert made[0].number >= 1 and made[-1].last <= tally.lines
        assert all(a.last < b.number for a, b in zip(made, made[1:], strict=False))


def test_equal_width_progress_lines_are_records_not_wraps(tmp_path):
    # a progress line per step, all as wide (tqdm pads its counters): no terminal wrapped them
    steps = [f"Epoch 3: {i // 10:3d}%|{'#' * (i // 100):<10}| {i:4d}/1000 [01:02<01:16, "
             f"7.20it/s, loss=0.{i:04d}]" for i in range(1, 1001)]
    assert len({len(x) for x in steps}) == 1
    log = tmp_path / "fit.log"
    log.write_text("\n".join(steps) + "\n")
    assert len(list(joblog.lines(steps))) == 1000
    fs, lines, _ = jobs.run([log])
    assert lines == 1000
    assert "1000/1000" in next(f for f in fs if f.id == "job.stopped").summary


def test_a_big_file_says_how_far_reading_has_come_on_stderr(tmp_path, monkeypatch, capsys):
    log = tmp_path / "train.log"
    log.write_text("\n".join(_megatron(30000)) + "\n")
    monkeypatch.setattr(jobs, "PROGRESS_BYTES", 1 << 20)
    monkeypatch.setattr(twocore, "MODE", "one")
    fs, lines, _ = jobs.run([log])
    out = capsys.readouterr()
    said = [x for x in out.err.splitlines() if x.startswith("triage: train.log: ")]
    steps = [int(x.split(": ")[2].split("%")[0]) for x in said]
    assert len(steps) >= 5 and steps == sorted(set(steps)) and steps[-1] == 100
    assert lines == 30000 and out.out == ""
    monkeypatch.setattr(jobs, "PROGRESS_BYTES", 1 << 30)  # a small file says nothing
    jobs.run([log])
    assert "triage:" not in capsys.readouterr().err
