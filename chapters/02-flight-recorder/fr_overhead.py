"""What the flight recorder costs on a healthy run (chapter 2): gloo all_reduce latency on 2 ranks.

    torchrun --nproc-per-node 2 fr_overhead.py                              # recorder on (default 2000 entries)
    TORCH_FR_BUFFER_SIZE=0 torchrun --nproc-per-node 2 fr_overhead.py       # recorder off

Reports the median, 10th and 90th percentile latency per size (microseconds, rank 0's clock, timed with
`pt215.timing.time_samples` after 20 warmup calls) and how many entries the recorder holds at the end.
The recorder reads its buffer size once per process, so an on/off comparison needs one launch per arm;
notebook 2.4 alternates several launches of each arm in one cell.
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
from pt215.timing import time_samples


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 262144], help="float32 elements")
    a = p.parse_args(argv)
    if a.iters < 10 or any(n < 1 for n in a.sizes):
        p.error(f"--iters must be >= 10 and --sizes >= 1 element, got {a.iters} and {a.sizes}")
    rank = init_rank("gloo").rank
    out = {}
    for n in a.sizes:
        x = torch.ones(n)
        lat = sorted(s * 1e6 for s in time_samples(lambda x=x: dist.all_reduce(x), iters=a.iters, warmup=20))
        out[str(n)] = {"median_us": statistics.median(lat), "p10_us": lat[len(lat) // 10],
                       "p90_us": lat[len(lat) * 9 // 10]}
    out["entries"] = len(pickle.loads(c10d._dump_fr_trace())["entries"])
    if rank == 0:
        print(f"recorder holds {out['entries']} entries")
    report(out)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
