"""Estimated versus measured collective time on NCCL (chapter 1, notebook 1.4). Needs >= 2 CUDA GPUs.

    torchrun --nproc-per-node 8 time_estimate.py --backend nccl

For each size, `torch.distributed._time_estimator()` simulates one all_reduce (nothing runs), then the same
all_reduce is timed for real with CUDA events (median of `--iters` after a warm-up). Rank 0 reports
`{size_bytes: {"estimated_us", "measured_us"}}` plus the NCCL version in use.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("nccl", "nccl-legacy", "nccl2"), default="nccl")
    p.add_argument("--sizes", type=int, nargs="+", default=[1 << 10, 1 << 20, 1 << 26], help="bytes per rank")
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args(argv)
    if a.iters < 1 or any(s < 4 for s in a.sizes):
        p.error(f"--iters must be >= 1 and every --sizes entry >= 4 bytes, got {a.iters} and {a.sizes}")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    dev = init_rank(a.backend).device  # cuda:LOCAL_RANK as device_id: the estimator needs an existing communicator
    out: dict[str, object] = {"nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    for size in a.sizes:
        t = torch.ones(size // 4, device=dev)
        dist.all_reduce(t)  # communicator warm, buffers registered
        with dist._time_estimator(device=dev) as est:
            dist.all_reduce(t)  # simulated, not run
        times = []  # device time between two CUDA events, the quantity the estimator simulates
        for _ in range(a.iters + 3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(t)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)  # ms -> us
        out[str(size)] = {"estimated_us": est.estimated_time, "measured_us": statistics.median(times[3:])}
    report(out)
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
