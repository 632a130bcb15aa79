"""One-sided NIXL vs two-sided gloo send/recv vs the copy limit, interleaved over a size sweep (chapter 3).

    torchrun --nproc-per-node 2 transfer_sweep.py [--min-kib 4 --max-mib 64 --step 4]

Every sample is "time until the initiator knows the bytes are in the other buffer". For each size the four arms
are timed round-robin, one sample of each per round (`pt215.timing.interleaved_samples`, 2 warm-up rounds, then
9 to 30 timed rounds), so a busy moment of the machine falls on all four alike and their ratios are comparable.
Below 64 KiB a sample is several back-to-back calls (64 KiB moved per sample), the time divided by the calls:
one call of a few microseconds is too short to time alone on a busy machine.
- NIXL write/read: a synchronous `write`/`read` from rank 0 into/out of rank 1's registered buffer
  (rank 1 makes no call for it: it is blocked in the `recv` of the next gloo round);
- gloo: rank 0 `send`s, rank 1 `recv`s and answers with a 1-byte `send` (the ack rank 0 needs to know);
- copy: `pt215.roofline.copy_step(n)`, one `dst.copy_(src)` of the same size inside rank 0: the limit on one
  machine, since a transfer between two processes is at least one copy of its bytes.
Every transfer is checked after each size: rank 1 compares the bytes NIXL wrote into its buffer and the bytes
gloo delivered with the expected pattern, rank 0 the bytes NIXL read back.

The samples are seconds. A rate computed from them is a payload rate, n bytes per sample: for the copy arm that
is `pt215.roofline.copy_bandwidth(n) / 2`, because `copy_bandwidth` counts a copy's read and write (2n bytes)
while a transfer delivers n.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown
from pt215.roofline import copy_step
from pt215.timing import interleaved_samples
from pt215.transport import fetch, pair, publish, quiet_nixl

TIMEOUT = 30.0
WARMUP = 2  # untimed rounds per size (rank 1 answers them too)
SAMPLE_BYTES = 64 * 2**10  # below this size, a sample is several calls: SAMPLE_BYTES moved per sample
ARMS = ("nixl_write", "nixl_read", "gloo", "copy")


def calls_for(nbytes: int) -> int:
    """Back-to-back calls per sample: enough for SAMPLE_BYTES moved, at least 1."""
    return max(1, SAMPLE_BYTES // nbytes)


def iters_for(nbytes: int, budget_mib: int) -> int:
    """Timed rounds for one size: `budget_mib` MiB moved per arm, between 9 and 30 rounds."""
    return max(9, min(30, budget_mib * 2**20 // (nbytes * calls_for(nbytes))))


def pattern(nbytes: int, salt: int) -> torch.Tensor:
    return ((torch.arange(nbytes, dtype=torch.int32) + salt) % 251).to(torch.uint8)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-kib", type=int, default=4)
    p.add_argument("--max-mib", type=int, default=64)
    p.add_argument("--step", type=int, default=4)
    p.add_argument("--budget-mib", type=int, default=256, help="bytes moved per size and arm (sets the rounds)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
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
    buf = torch.zeros(big, dtype=torch.uint8)           # rank 0: the source of writes; rank 1: the peer's buffer
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
        iters, calls = iters_for(n, a.budget_mib), calls_for(n)
        sent = pattern(n, i + 13)
        if rank == 0:
            buf[:n].copy_(pattern(n, i))
            back[:n].zero_()
        else:
            buf[:n].zero_()                             # so that the check below sees what NIXL wrote
        dist.barrier()
        if rank == 0:
            view, rview = mem.to_view(0, n), back_mem.to_mutable_view(0, n)

            def ping(src: torch.Tensor = sent) -> None:
                dist.send(src, dst=1)
                dist.recv(ack, src=1)

            arms = {"nixl_write": lambda view=view: t.write(view, remote),
                    "nixl_read": lambda rview=rview: t.read(rview, remote),  # reads back what the write put there
                    "gloo": ping,
                    "copy": copy_step(n)}  # copy_bandwidth's unit of work, counted as 2n
            samples = interleaved_samples(arms, iters=iters, warmup=WARMUP, calls=calls)  # seconds per call
            rows.append({"bytes": n, "iters": iters, "calls": calls, **samples})
            ok.append(torch.equal(back[:n], pattern(n, i)))
        else:
            dst = torch.zeros(n, dtype=torch.uint8)
            for _ in range(WARMUP + iters * calls):     # one gloo round trip per call on rank 0
                dist.recv(dst, src=0)
                dist.send(ack, dst=0)
            ok.append(torch.equal(dst, sent))
        dist.barrier()
        if rank == 1:
            ok.append(torch.equal(buf[:n], pattern(n, i)))

    print(f"{len(sizes)} sizes from {sizes[0] // 1024} KiB to {big // 2**20} MiB, {len(ARMS)} arms interleaved "
          f"per round; every transfer verified: {all(ok)}")
    dist.barrier()
    t.unregister_memory(back_mem)
    t.unregister_memory(mem)
    t.close(timeout=TIMEOUT)
    report({"rows": rows, "verified": all(ok), "arms": list(ARMS), "warmup": WARMUP,
            "when": time.strftime("%Y-%m-%d")})
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
