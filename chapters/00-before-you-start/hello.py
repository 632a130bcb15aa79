"""Smallest multi-rank demo: every rank joins a gloo group, all-reduces its rank and reports.

Runs unchanged under `torchrun --nproc-per-node N hello.py` or from a notebook with
`pt215.launch.run("hello.py", nproc=N)` (chapter 0).
"""

from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown


def main(argv: Sequence[str] | None = None) -> int:
    del argv  # no options
    me = init_rank("gloo")
    t = torch.tensor([float(me.rank)])
    dist.all_reduce(t)
    print(f"hello from rank {me.rank} of {me.world}; sum of ranks = {t.item():.0f}")
    report({"rank": me.rank, "world_size": me.world, "backend": dist.get_backend(), "sum": t.item()})
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
