"""Does gloo dump the flight recorder on a timeout by itself? (chapter 2, notebook 2.4)

    TORCH_FR_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/tmp/fr_auto/rank_ \\
        torchrun --nproc-per-node 2 gloo_no_autodump.py

Rank 1 never joins the third all_reduce; rank 0 waits for it until the gloo timeout (3 s). Nothing here
dumps on purpose: whatever appears under TORCH_FR_DUMP_TEMP_FILE was written by torch itself.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.parse_args(argv)  # no options: the environment variables above are what is being tested
    rank = init_rank("gloo", timeout_s=3).rank
    for _ in range(2):
        dist.all_reduce(torch.ones(8))
    outcome = "no error"
    if rank == 1:
        time.sleep(5)  # never joins; exits after rank 0 has timed out
        outcome = "skipped the collective"
    else:
        try:
            dist.all_reduce(torch.ones(8))
        except RuntimeError as e:
            outcome = "RuntimeError (timeout)" if "Timed out" in str(e) else "RuntimeError"
    time.sleep(2)  # leave time for any dump torch might write on its own
    print(f"outcome: {outcome}")
    report({"outcome": outcome})
    os._exit(0)  # the group is broken: do not wait on it


if __name__ == "__main__":
    raise SystemExit(main())
