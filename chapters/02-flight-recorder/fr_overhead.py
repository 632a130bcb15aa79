"""What the flight recorder costs on a healthy run (chapter 2): gloo all_reduce latency on 2 ranks.

    torchrun --nproc-per-node 2 fr_overhead.py                              # recorder on (default 2000 entries)
    TORCH_FR_BUFFER_SIZE=0 torchrun --nproc-per-node 2 fr_overhead.py       # recorder off

Reports, per size: the median, 10th and 90th percentile latency (microseconds, rank 0's clock, timed with
`pt215.timing.time_samples` after 20 warmup calls), and the CPU time the issuing thread spends per call
(`pt215.timing.thread_cpu_samples` around `--blocks` blocks of calls, the median block): the recorder writes its entry on
that thread, and CPU time does not count the time the thread waits for its peer or for a core on a loaded
machine, so it resolves a cost that the latency's spread hides. Also how many entries the recorder holds at
the end. The recorder reads its buffer size once per process, so an on/off comparison needs one launch per
arm; notebook 2.4 alternates several launches of each arm in one cell.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
from collections.abc import Sequence

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown
from pt215.timing import thread_cpu_samples, time_samples


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 262144], help="float32 elements")
    p.add_argument("--blocks", type=int, default=10, help="blocks of --iters calls timed in thread CPU time")
    a = p.parse_args(argv)
    if a.iters < 10 or any(n < 1 for n in a.sizes):
        p.error(f"--iters must be >= 10 and --sizes >= 1 element, got {a.iters} and {a.sizes}")
    if a.blocks < 1:
        p.error(f"--blocks must be >= 1, got {a.blocks}")
    rank = init_rank("gloo").rank
    out = {}
    for n in a.sizes:
        x = torch.ones(n)
        lat = sorted(s * 1e6 for s in time_samples(lambda x=x: dist.all_reduce(x), iters=a.iters, warmup=20))
        # CPU time of this (the issuing) thread per call, one figure per block of --iters calls
        cpu = [s * 1e6 for s in thread_cpu_samples(lambda x=x: dist.all_reduce(x), iters=a.blocks, calls=a.iters)]
        out[str(n)] = {"median_us": statistics.median(lat), "p10_us": lat[len(lat) // 10],
                       "p90_us": lat[len(lat) * 9 // 10], "thread_cpu_us": statistics.median(cpu)}
    out["entries"] = len(pickle.loads(c10d._dump_fr_trace())["entries"])
    if rank == 0:
        print(f"recorder holds {out['entries']} entries")
    report(out)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
