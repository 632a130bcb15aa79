"""TORCH_NCCL_BLOCKING_WAIT=1 makes NCCL2's Work.wait() block the host (chapter 1, notebook 1.1).

    torchrun --nproc-per-node 1 blocking_wait.py                              # wait() orders the stream only
    TORCH_NCCL_BLOCKING_WAIT=1 torchrun --nproc-per-node 1 blocking_wait.py   # wait() blocks the host

On one GPU, a 1-rank NCCL2 group: `--busy-ms` of GPU work (`torch.cuda._sleep`) is queued on the current
stream, then an asynchronous all_reduce behind it. The host times `work.wait()` (no device synchronization in
the clock) and asks `work.is_completed()` right after it returns. Without blocking wait, wait() returns at once
and the collective is still queued; with it, wait() returns when the collective has finished.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown
from pt215.timing import Stopwatch


def sleep_cycles_per_ms(device: torch.device) -> float:
    """GPU clock cycles `torch.cuda._sleep` spins per millisecond, measured with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # warm-up
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize(device)
    return cycles / start.elapsed_time(end)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy-ms", type=float, default=200.0, help="GPU work queued ahead of the collective")
    a = p.parse_args(argv)
    if not a.busy_ms > 0:
        p.error(f"--busy-ms must be positive, got {a.busy_ms}")
    me = init_rank("nccl")
    x = torch.ones(1024, device=me.device)
    dist.all_reduce(x)  # the communicator is up before anything is timed
    torch.cuda.synchronize(me.device)
    per_ms = sleep_cycles_per_ms(me.device)
    torch.cuda._sleep(int(a.busy_ms * per_ms))
    work = dist.all_reduce(x, async_op=True)
    with Stopwatch() as clock:  # the host's view only: no device sync inside the clock
        work.wait()
    done = work.is_completed()
    torch.cuda.synchronize(me.device)
    result = {"blocking_wait": os.environ.get("TORCH_NCCL_BLOCKING_WAIT", "(unset)"), "busy_ms": a.busy_ms,
              "wait_ms": clock.seconds * 1e3, "completed_at_return": done,
              "backend_class": type(dist.get_backend_impl(None, me.device)).__name__}
    print(result)
    report(result)
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
