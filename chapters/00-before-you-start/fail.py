"""A script in which one rank fails: shows how `pt215.launch.run` names the failing rank (chapter 0)."""

import os
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    del argv  # no options
    rank = int(os.environ["RANK"])
    print(f"rank {rank} starting")
    if rank == 1:
        print("rank 1: about to divide by zero", flush=True)
        print(1 / 0)
    print(f"rank {rank} done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
