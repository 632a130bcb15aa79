"""A script in which one rank hangs forever: `pt215.launch.run` ends it at the timeout (chapter 0)."""

import os
import time
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    del argv  # no options
    rank = int(os.environ["RANK"])
    print(f"rank {rank} starting", flush=True)
    if rank == 1:
        print("rank 1: stuck (sleeping forever)", flush=True)
        while True:
            time.sleep(1)
    print(f"rank {rank} done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
