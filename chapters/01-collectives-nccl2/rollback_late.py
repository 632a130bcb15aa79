"""TORCH_DIST_USE_NCCL2=0 set inside a launched job: before the first `nccl` group, and too late (chapter 1, 1.2).

    torchrun --nproc-per-node 2 rollback_late.py                  # rank 1 sets the variable too late
    torchrun --nproc-per-node 2 rollback_late.py --late-ranks     # every rank sets it in time

The job runs on gloo and hides the machine's GPUs from itself (CUDA_VISIBLE_DEVICES=""), so it behaves the
same on every machine: ranks that disagree about the class must never meet on real GPUs. Each rank sets
TORCH_DIST_USE_NCCL2=0 in os.environ, either before its first `nccl` group (in time) or after it
(`--late-ranks`: too late), then asks for an `nccl` group twice with `new_group(backend="nccl")`. The registry
reads the variable once per process, when "nccl" is first resolved. Each attempt fails without a GPU, and the
error names the class it tried to build: "nccl2 requires at least one CUDA device" (ProcessGroupNCCL2) or
"ProcessGroupNCCL is only supported with GPUs" (the legacy ProcessGroupNCCL).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown

VARIABLE = "TORCH_DIST_USE_NCCL2"


def nccl_group() -> str:
    """Ask for an `nccl` group of every rank; without a GPU it fails, and the first line of its error names the
    class it tried to build."""
    try:
        dist.new_group(backend="nccl")
    except (RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    raise RuntimeError("an nccl group was built: this demo must run with its GPUs hidden")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--late-ranks", type=int, nargs="*", default=[1],
                   help="ranks that set the variable after their first nccl group (default: rank 1)")
    a = p.parse_args(argv)
    os.environ.pop(VARIABLE, None)  # whatever the launcher passed: this job sets it itself
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything asks CUDA: no GPU, the same run on every machine
    me = init_rank("gloo")
    late = me.rank in a.late_ranks
    if not late:
        os.environ[VARIABLE] = "0"  # before the first nccl group: counts
    first = nccl_group()
    if late:
        os.environ[VARIABLE] = "0"  # after it: too late, "nccl" is resolved already
    second = nccl_group()
    print(f"set {'after' if late else 'before'} the first nccl group; first: {first}; second: {second}")
    report({"rank": me.rank, "set": "after" if late else "before", "first": first, "second": second})
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
