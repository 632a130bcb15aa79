"""A script in which one rank fails: shows how `pt215.launch.run` names the failing rank (chapter 0)."""

import os
import sys

rank = int(os.environ["RANK"])
print(f"rank {rank} starting")
if rank == 1:
    print("rank 1: about to divide by zero", flush=True)
    print(1 / 0)
print(f"rank {rank} done")
sys.exit(0)
