"""ninja's per-object log and the build's progress line, on logs captured from real builds
(fixtures/ninja-logs/README.md, fixtures/build-progress/)."""

import re
from pathlib import Path

import pytest

from megatron_env.kernels import ninjalog, progress

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "ninja-logs"
TINY = LOGS / "tinycuda-sm90-2cores.ninja_log"
FLASH = LOGS / "flash-attn-2.8.3-hdim128-bf16-sm90-2cores.ninja_log"


def test_a_real_log_gives_each_object_its_time():
    steps = {Path(s.output).name: s for s in ninjalog.read([TINY])}
    assert set(steps) == {"add_one.o", "bind.o"}
    assert steps["add_one.o"].seconds == pytest.approx(1.145)
    assert steps["bind.o"].seconds == pytest.approx(54.793)
    assert min(s.start for s in steps.values()) == 0.0
    s = ninjalog.summary(list(steps.values()))
    assert s["steps"] == 2 and s["wall_seconds"] == 54.8 and s["peak_parallel"] == 2
    assert s["slowest"][0] == {"output": "csrc/bind.o", "seconds": 54.8, "start": 0.0}


def test_the_flash_attn_variant_build_compiles_only_its_kernels():
    steps = ninjalog.read([FLASH])
    s = ninjalog.summary(steps, top=3)
    assert s["steps"] == len(FLASH.read_text().splitlines()) - 1
    assert all(re.search(r"hdim128_bf16|flash_api", x["output"]) for x in s["slowest"])
    assert [x["seconds"] for x in s["slowest"]] == sorted((x["seconds"] for x in s["slowest"]),
                                                          reverse=True)
    assert s["peak_parallel"] == 2  # MAX_JOBS=2
    assert s["mean_parallel"] == pytest.approx(s["compile_seconds"] / s["wall_seconds"], abs=0.01)
    series = ninjalog.concurrency(steps, every=60)
    assert series[0][0] == 0.0 and all(0 <= n <= 2 for _, n in series)
    assert sum(n * 60 for _, n in series) == pytest.approx(s["compile_seconds"], rel=0.01)


def test_logs_of_separate_ninjas_share_one_clock():
    # one ninja per extension; each log's own clock starts at 0, the mtime column (the time
    # that ninja run started) places it: the CUDA test's build began 807.8 s after the
    # flash-attn build on the same machine
    both = {Path(s.output).name: s for s in ninjalog.read([TINY, FLASH])}
    assert len(both) == 9 and both["flash_api.o"].start == 0.0
    assert both["add_one.o"].start == pytest.approx(807.8, abs=0.1)
    assert both["bind.o"].end == pytest.approx(807.8 + 54.793, abs=0.1)


@pytest.mark.parametrize(("text", "error"), [
    ("", "no '# ninja log vN' header"),
    ("ninja: build stopped\n", "no '# ninja log vN' header"),
    ("# ninja log v4\n1 2 3 x\n", "ninja log v4; v5 or newer is read"),
    ("# ninja log v7\n0\t10\tx.o\n", ":2: 3 fields, a v7 line has 5"),
    ("# ninja log v7\n0\tten\t0\tx.o\tabc\n", ":2: start, end and mtime must be integers"),
])
def test_a_file_that_is_not_a_ninja_log_is_named(text, error):
    with pytest.raises(ninjalog.NinjaLogError, match=re.escape(error)):
        ninjalog.parse(text, "some/.ninja_log")


def test_one_progress_line_over_apex_extensions_built_in_parallel():
    # apex 25.09 on the H200, 4 extensions at once: each ninja restarts its own [i/n]
    lines = (FIXTURES / "build-progress" / "apex-25.09-h200-parallel4.log").read_text()
    counts = progress.Progress()
    seen = []
    for line in lines.splitlines():
        if counts.feed(line):
            seen.append(counts.line("apex", 0))
    done = [int(re.search(r"compiled (\d+)/", s).group(1)) for s in seen]
    assert done == sorted(done) and done[-1] == 37  # never goes back
    assert seen[-1] == "apex: compiled 37/37 objects of the 12 extensions started, 0 s"
    assert not any("left" in s for s in seen)  # the total grows: no guess from it


def test_a_single_ninja_keeps_its_time_left_guess():
    counts = progress.Progress()
    nvcc = "/usr/local/cuda/bin/nvcc -c x.cu -DTORCH_EXTENSION_NAME=flash_attn_2_cuda"
    for i in range(1, 30):
        counts.feed(f"[{i}/73] {nvcc}")
    assert counts.line("flash-attn", 470) == progress.progress_line("flash-attn", 29, 73, 470)
