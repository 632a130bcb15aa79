"""Smallest multi-rank demo: every rank joins a gloo group, all-reduces its rank and reports.

Runs unchanged under `torchrun --nproc-per-node N hello.py` or from a notebook with
`pt215.launch.run("hello.py", nproc=N)` (chapter 0).
"""

import torch
import torch.distributed as dist

from pt215.launch import report, shutdown


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    print(f"hello from rank {rank} of {world}; sum of ranks = {t.item():.0f}")
    report({"rank": rank, "world_size": world, "backend": dist.get_backend(), "sum": t.item()})
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)


if __name__ == "__main__":
    main()
