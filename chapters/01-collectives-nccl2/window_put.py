"""A one-sided put through an NCCL2 window (chapter 1, notebook 1.4). Needs >= 2 CUDA GPUs and NCCL >= 2.29.

    torchrun --nproc-per-node 2 window_put.py

Both ranks allocate from the backend's NCCL memory pool (`torch.cuda.MemPool(backend.mem_allocator)`),
register the pool symmetrically (`register_mem_pool(pool, symm=True)`, collective) and create a window over a
receive buffer (`dist._new_window`, collective). Rank 0 puts its source tensor into rank 1's window; `put`
also emits a signal (WindowNCCL.hpp), which rank 1 consumes with `wait_signal(0)` before it reads the buffer.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1024, help="float32 elements to put")
    a = p.parse_args(argv)
    if a.n < 1:
        p.error(f"--n must be >= 1, got {a.n}")
    me = init_rank("nccl")  # cuda:LOCAL_RANK, made current and passed as device_id
    rank, dev = me.rank, me.device
    out: dict[str, object] = {"nccl": ".".join(map(str, torch.cuda.nccl.version())),
                              "supports_window": dist._supports_window()}
    backend = dist.get_backend_impl(None, dev)
    pool = torch.cuda.MemPool(backend.mem_allocator)
    with torch.cuda.use_mem_pool(pool):
        recv = torch.zeros(a.n, device=dev)
        src = torch.arange(a.n, dtype=torch.float32, device=dev) + 1000 * rank
    backend.register_mem_pool(pool, symm=True)   # collective: puts need symmetric source segments
    win = dist._new_window(recv)                 # collective
    dist.barrier()
    if rank == 0:
        win.put(src, 1, 0, False)                # into rank 1's window at element offset 0
    elif rank == 1:
        win.wait_signal(0, False)                # the signal put emitted
        torch.cuda.synchronize()
        out["received_ok"] = bool(torch.equal(recv, torch.arange(a.n, dtype=torch.float32, device=dev)))
    dist.barrier()
    report(out)
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
