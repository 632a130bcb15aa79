"""One-sided NIXL vs two-sided gloo send/recv vs in-process memcpy, over a size sweep (chapter 3).

    torchrun --nproc-per-node 2 transfer_sweep.py [--min-kib 4 --max-mib 64 --step 4]

Every sample is "time until the initiator knows the bytes are in the other buffer" (5 to 30 per size):
- NIXL write/read: a synchronous `write`/`read` from rank 0 into/out of rank 1's registered buffer
  (rank 1 waits in a barrier meanwhile: it makes no call for the transfer);
- gloo: rank 0 `send`s, rank 1 `recv`s and answers with a 1-byte `send` (the ack rank 0 needs to know);
- memcpy: `dst.copy_(src)` of the same size inside rank 0 (the physical limit on one machine).
Every transfer is checked: the receiver compares its bytes with the expected pattern after each size.

The samples are seconds (`pt215.timing.time_samples`). A rate computed from them is a payload rate, n bytes
per sample: for the memcpy column that is `pt215.roofline.copy_bandwidth(n) / 2`, because
`copy_bandwidth` counts a copy's read and write (2n bytes) while a transfer delivers n.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown
from pt215.roofline import copy_step
from pt215.timing import time_samples
from pt215.transport import fetch, pair, publish, quiet_nixl

TIMEOUT = 30.0


def iters_for(nbytes: int, budget_mib: int) -> int:
    """Samples for one size and method: `budget_mib` MiB moved in all, between 5 and 30 samples."""
    return max(5, min(30, budget_mib * 2**20 // nbytes))


def pattern(nbytes: int, salt: int) -> torch.Tensor:
    return ((torch.arange(nbytes, dtype=torch.int32) + salt) % 251).to(torch.uint8)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-kib", type=int, default=4)
    p.add_argument("--max-mib", type=int, default=64)
    p.add_argument("--step", type=int, default=4)
    p.add_argument("--budget-mib", type=int, default=256, help="bytes moved per size and method (sets iters)")
    a = p.parse_args(argv)
    if a.min_kib < 1 or a.step < 2 or a.budget_mib < 1 or a.max_mib * 1024 < a.min_kib:
        p.error(f"need --min-kib >= 1, --step >= 2, --budget-mib >= 1 and --max-mib >= --min-kib / 1024, got "
                f"{a.min_kib}, {a.step}, {a.budget_mib} and {a.max_mib}")
    quiet_nixl()
    rank = init_rank("gloo").rank
    store = dist.distributed_c10d._get_default_store()
    sizes, n = [], a.min_kib * 1024
    while n <= a.max_mib * 2**20:
        sizes.append(n)
        n *= a.step
    big = sizes[-1]

    t = pair(1 - rank, rank=rank, timeout=TIMEOUT, agent_name=f"sweep-rank{rank}")
    buf = torch.zeros(big, dtype=torch.uint8)           # rank 0: source; rank 1: the peer's buffer
    mem = t.register_memory(buf)
    if rank == 1:
        publish(store, "sweep/buf", mem)
    else:
        remote = fetch(store, "sweep/buf", timeout=TIMEOUT)
    back = torch.zeros(big, dtype=torch.uint8)          # rank 0 reads into this
    back_mem = t.register_memory(back)
    ack = torch.zeros(1, dtype=torch.uint8)
    rows, ok = [], []
    for i, n in enumerate(sizes):
        iters = iters_for(n, a.budget_mib)
        row = {"bytes": n, "iters": iters}
        # --- one-sided NIXL: only rank 0 calls anything; rank 1 sits in the barrier
        if rank == 0:
            buf[:n].copy_(pattern(n, i))
            view = mem.to_view(0, n)
            row["nixl_write"] = time_samples(lambda view=view: t.write(view, remote), iters=iters)
        dist.barrier()
        if rank == 1:
            ok.append(torch.equal(buf[:n], pattern(n, i)))
            buf[:n].copy_(pattern(n, i + 7))           # new content for rank 0 to read back
        dist.barrier()
        if rank == 0:
            rview = back_mem.to_mutable_view(0, n)
            row["nixl_read"] = time_samples(lambda rview=rview: t.read(rview, remote), iters=iters)
            ok.append(torch.equal(back[:n], pattern(n, i + 7)))
        dist.barrier()
        # --- two-sided gloo send/recv + 1-byte ack (both ranks run the same number of rounds)
        if rank == 0:
            src = pattern(n, i + 13)

            def ping(src: torch.Tensor = src) -> None:
                dist.send(src, dst=1)
                dist.recv(ack, src=1)

            row["gloo"] = time_samples(ping, iters=iters)
        else:
            dst = torch.zeros(n, dtype=torch.uint8)
            for _ in range(iters + 2):                  # 2 warmup rounds, as time_samples does
                dist.recv(dst, src=0)
                dist.send(ack, dst=0)
            ok.append(torch.equal(dst, pattern(n, i + 13)))
        dist.barrier()
        # --- memcpy inside rank 0, same size
        if rank == 0:
            row["memcpy"] = time_samples(copy_step(n), iters=iters)  # copy_bandwidth's unit of work
            rows.append(row)
        dist.barrier()

    print(f"{len(sizes)} sizes from {sizes[0] // 1024} KiB to {big // 2**20} MiB; every transfer verified: {all(ok)}")
    dist.barrier()
    t.unregister_memory(back_mem)
    t.unregister_memory(mem)
    t.close(timeout=TIMEOUT)
    report({"rows": rows, "verified": all(ok), "when": time.strftime("%Y-%m-%d")})
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
