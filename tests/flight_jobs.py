"""Small gloo jobs that hang on purpose, each rank dumping its flight recorder: real dumps for
tests/test_flight_recorder.py and bench/flight_recorder.py.

    python tests/flight_jobs.py OUT WORLD SCENARIO[,SCENARIO...] [COLLECTIVES]

Each scenario runs WORLD ranks (fork, one FileStore each, so no ports) under a 2 s gloo
timeout: after COLLECTIVES (default 3) all_reduces on the default group,
  skip      rank 2 skips the next all_reduce (it never arrives);
  other     rank 1 calls all_gather where the others call all_reduce;
  subgroup  rank 1 enters an all_reduce on the group {1, 2} while rank 2 stalls outside any
            collective, so ranks 0 and 3 wait for both in the default group;
  size      rank 3 all_reduces 9 elements where the others all_reduce 8;
  dtype     rank 3 all_reduces 4 doubles where the others all_reduce 8 floats (as many bytes);
            in both, the rank that receives rank 3's data aborts in gloo (no dump), as a
            crashed rank does;
  clean     nothing hangs.
Then every rank writes `_dump_fr_trace()` to OUT/SCENARIO/nccl_trace_rank_<rank> (the name
TORCH_NCCL_DEBUG_INFO_TEMP_FILE gives), `_dump_fr_trace_json()` to OUT/SCENARIO-json/.
torch is imported once, before the fork: stack symbolisation imports torch._inductor on first
use, which 12 processes would each pay for.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

SCENARIOS = ("skip", "other", "subgroup", "size", "dtype", "clean")
ABORTS = ("size", "dtype")  # gloo aborts a rank on a size mismatch
TIMEOUT_S = 2


def _body(rank: int, world: int, scenario: str, before: int) -> None:
    import torch
    import torch.distributed as dist

    sub = dist.new_group([1, 2], timeout=timedelta(seconds=TIMEOUT_S))
    x = torch.ones(8)
    for _ in range(before):
        dist.all_reduce(x)
    if scenario == "skip" and rank != 2:
        dist.all_reduce(x)
    elif scenario == "other":
        if rank == 1:
            dist.all_gather([torch.zeros(8) for _ in range(world)], x)
        else:
            dist.all_reduce(x)
    elif scenario == "subgroup":
        if rank == 1:
            dist.all_reduce(x, group=sub)
        elif rank == 2:
            time.sleep(TIMEOUT_S + 1)  # stalls outside any collective
        else:
            dist.all_reduce(x)
    elif scenario in ABORTS:
        y = torch.ones(8)
        if rank == 3:
            y = torch.ones(9) if scenario == "size" else torch.ones(4, dtype=torch.float64)
        dist.all_reduce(y)
    elif scenario == "clean":
        dist.barrier()


def worker(rank: int, world: int, scenario: str, out: str, before: int) -> None:
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, ".store"),
                            rank=rank, world_size=world, timeout=timedelta(seconds=TIMEOUT_S))
    try:
        _body(rank, world, scenario, before)
    except RuntimeError as e:  # gloo's timeout or a peer gone: the hang, now dumped
        print(f"rank {rank}: {str(e)[:120]}", file=sys.stderr)
    with open(os.path.join(out, f"nccl_trace_rank_{rank}"), "wb") as f:
        f.write(c10d._dump_fr_trace(True, True, False))  # type: ignore[attr-defined]
    os.makedirs(out + "-json", exist_ok=True)
    with open(os.path.join(out + "-json", f"nccl_trace_rank_{rank}.json"), "wb") as f:
        f.write(c10d._dump_fr_trace_json(True, False))  # type: ignore[attr-defined]
    if scenario != "clean":  # stay until the peers time out, as a hung rank does
        time.sleep(TIMEOUT_S + 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no destroy_process_group: the peers are gone


def main(out: str, world: int, scenarios: list[str], before: int = 3) -> int:
    import multiprocessing as mp

    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    import torch._inductor  # noqa: F401  (see the docstring)
    import torch.distributed  # noqa: F401

    ctx = mp.get_context("fork")
    procs = []
    for sc in scenarios:
        d = os.path.join(out, sc)
        os.makedirs(d, exist_ok=True)
        procs += [ctx.Process(target=worker, args=(r, world, sc, d, before))
                  for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    aborted = -6  # SIGABRT
    per_proc = [sc for sc in scenarios for _ in range(world)]
    bad = [p.exitcode for p, sc in zip(procs, per_proc, strict=True)
           if p.exitcode != 0 and not (sc in ABORTS and p.exitcode == aborted)]
    for sc in scenarios:
        store = os.path.join(out, sc, ".store")
        if os.path.exists(store):
            os.remove(store)
    return 1 if bad else 0


if __name__ == "__main__":
    a = sys.argv[1:]
    raise SystemExit(main(a[0], int(a[1]), a[2].split(","), int(a[3]) if len(a) > 3 else 3))
