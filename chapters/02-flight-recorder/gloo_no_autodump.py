"""Does gloo dump the flight recorder on a timeout by itself? (chapter 2, notebook 2.4)

    TORCH_FR_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/tmp/fr_auto/rank_ \\
        torchrun --nproc-per-node 2 gloo_no_autodump.py

Rank 1 never joins the third all_reduce; rank 0 waits for it until the gloo timeout (`--timeout`, 2 s). Rank 1
stays until rank 0 has timed out (it waits for rank 0's word in the rendezvous store), so rank 0 sees a real
timeout, not a peer that left. Nothing here dumps on purpose: whatever appears under TORCH_FR_DUMP_TEMP_FILE
once both processes have ended was written by torch itself.
"""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timeout", type=float, default=2.0, help="gloo collective timeout, seconds")
    a = p.parse_args(argv)  # the environment variables above are what is being tested
    if a.timeout <= 0:
        p.error(f"--timeout must be > 0 seconds, got {a.timeout}")
    rank = init_rank("gloo", timeout_s=a.timeout).rank
    for _ in range(2):
        dist.all_reduce(torch.ones(8))
    store = dist.distributed_c10d._get_default_store()
    outcome = "no error"
    if rank == 1:
        store.wait(["rank0/timed-out"], datetime.timedelta(seconds=a.timeout + 60))  # never joins; waits for it
        outcome = "skipped the collective"
    else:
        try:
            dist.all_reduce(torch.ones(8))
        except RuntimeError as e:
            outcome = "RuntimeError (timeout)" if "Timed out" in str(e) else "RuntimeError"
        store.set("rank0/timed-out", "1")
    print(f"outcome: {outcome}")
    report({"outcome": outcome})
    os._exit(0)  # the group is broken: do not wait on it


if __name__ == "__main__":
    raise SystemExit(main())
