"""Every collective once, with each rank's tensors before and after (chapter 1, notebook 1.1).

    torchrun --nproc-per-node 4 collectives.py                   # gloo on CPU
    torchrun --nproc-per-node 4 collectives.py --backend nccl    # one GPU per rank

Values encode their origin: rank r starts with 10*(r+1) + i in slot i, so after a collective
a value of 20..29 came from rank 1, and a value >= 100 is a sum over the four ranks.
Each rank prints one line per collective and hands the tensors to pt215.launch.report.

Last, a ring all-reduce written out with send/recv: n - 1 reduce-scatter steps, then n - 1 all-gather steps,
each rank sending one chunk of S/n bytes to its right neighbour per step. Each rank reports its tensor after
every step and the bytes it sent, 2(n-1)/n * S: where all_reduce's bus-bandwidth factor comes from.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown


def lst(x) -> list | None:
    """A tensor, or a list of tensors, as one flat Python list (None stays None)."""
    if x is None:
        return None
    if isinstance(x, list | tuple):
        return [v for t in x for v in lst(t)]
    return x.cpu().tolist()


def ring_all_reduce(t: torch.Tensor, rank: int, n: int) -> tuple[list[list], int]:
    """Sum `t` (1-D, n chunks) over the ranks in a ring, in place; return t after every step and the bytes sent.

    Reduce-scatter: at step s a rank sends chunk (rank - s) % n to the right and adds what arrives from the
    left into chunk (rank - s - 1) % n; after n - 1 steps rank r holds the full sum of chunk (r + 1) % n.
    All-gather: the finished chunks travel on around the ring, copied instead of added.
    """
    chunks = list(t.chunk(n))  # views of t: updating a chunk updates t
    right, left = (rank + 1) % n, (rank - 1) % n
    steps, sent = [t.tolist()], 0
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            out = (rank - s) % n if phase == "reduce-scatter" else (rank + 1 - s) % n
            into = (out - 1) % n
            buf = torch.empty_like(chunks[into])
            ops = [dist.P2POp(dist.isend, chunks[out], right), dist.P2POp(dist.irecv, buf, left)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            if phase == "reduce-scatter":
                chunks[into] += buf
            else:
                chunks[into].copy_(buf)
            sent += chunks[out].numel() * chunks[out].element_size()
            steps.append(t.tolist())
    return steps, sent


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (one CUDA device per rank)")
    a = p.parse_args(argv)
    me = init_rank(a.backend)  # nccl: cuda:LOCAL_RANK, passed as device_id (eager NCCL init)
    rank, n, dev = me.rank, me.world, me.device
    log: dict[str, dict] = {}

    def own(k: int) -> torch.Tensor:
        """k slots whose values say 'rank r, slot i': 10*(r+1) + i."""
        return torch.arange(k, device=dev) + 10 * (rank + 1)

    def show(name: str, before, after, **extra) -> None:
        log[name] = {"before": lst(before), "after": lst(after), **extra}
        print(f"{name:<26} before {lst(before)!s:<18} after {lst(after)}")

    # -- reductions: every rank contributes, the sum lands on all ranks (all_reduce) or one (reduce)
    t = own(2)
    b = t.clone()
    dist.all_reduce(t)  # op=dist.ReduceOp.SUM
    show("all_reduce", b, t)

    t = own(2)
    b = t.clone()
    dist.reduce(t, dst=0)
    show("reduce", b, t)

    # -- one to all
    t = own(2)
    b = t.clone()
    dist.broadcast(t, src=0)
    show("broadcast", b, t)

    # -- all_gather: each rank's 1 slot ends up everywhere
    t = own(1)
    out = [torch.zeros(1, dtype=t.dtype, device=dev) for _ in range(n)]
    dist.all_gather(out, t)
    show("all_gather", t, out)

    out_t = torch.zeros(n, dtype=t.dtype, device=dev)
    dist.all_gather_into_tensor(out_t, t)
    show("all_gather_into_tensor", t, out_t)

    # -- reduce_scatter: slot j of every rank is summed and lands on rank j
    t = own(n)
    out1 = torch.zeros(1, dtype=t.dtype, device=dev)
    dist.reduce_scatter(out1, list(t.chunk(n)))
    show("reduce_scatter", t, out1)

    out1 = torch.zeros(1, dtype=t.dtype, device=dev)
    dist.reduce_scatter_tensor(out1, t)
    show("reduce_scatter_tensor", t, out1)

    # -- all_to_all: slot j of rank i goes to rank j (a transpose of the rank x slot matrix)
    t = own(n)
    outs = [torch.zeros(1, dtype=t.dtype, device=dev) for _ in range(n)]
    dist.all_to_all(outs, list(t.chunk(n)))
    show("all_to_all", t, outs)

    out_t = torch.zeros(n, dtype=t.dtype, device=dev)
    dist.all_to_all_single(out_t, t)
    show("all_to_all_single", t, out_t)

    # -- gather to rank 0 / scatter from rank 0
    t = own(1)
    glist = [torch.zeros(1, dtype=t.dtype, device=dev) for _ in range(n)] if rank == 0 else None
    dist.gather(t, gather_list=glist, dst=0)
    show("gather", t, glist if rank == 0 else None)

    t = own(n)
    out1 = torch.zeros(1, dtype=t.dtype, device=dev)
    dist.scatter(out1, scatter_list=list(t.chunk(n)) if rank == 0 else None, src=0)
    show("scatter", t if rank == 0 else None, out1)

    # -- barrier: nobody leaves before everybody arrived (counted in the store; add() returns once the store counted it)
    store = dist.distributed_c10d._get_default_store()
    store.add("arrived", 1)
    dist.barrier()
    seen = store.add("arrived", 0)
    log["barrier"] = {"arrivals_seen_after_barrier": seen}
    print(f"{'barrier':<26} arrivals seen after the barrier: {seen} of {n}")

    # -- point to point: even ranks send to the next odd rank (with an odd world size the last rank has no partner)
    t = own(2)
    b = t.clone()
    peer = rank + 1 if rank % 2 == 0 else rank - 1
    if peer >= n:
        peer = None
    elif rank % 2 == 0:
        dist.send(t, dst=peer)
    else:
        dist.recv(t, src=peer)
    show("send_recv", b, t, peer=peer)

    # -- batch_isend_irecv: a ring, everyone sends right and receives from the left, in one batch
    t = own(2)
    r_buf = torch.zeros_like(t)
    ops = [dist.P2POp(dist.isend, t, (rank + 1) % n), dist.P2POp(dist.irecv, r_buf, (rank - 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    show("batch_isend_irecv", t, r_buf)

    # -- async_op=True returns a Work at once; wait() before touching the tensor
    t = own(2)
    b = t.clone()
    work = dist.all_reduce(t, async_op=True)
    other = (torch.arange(4.0, device=dev) ** 2).sum().item()  # unrelated work overlaps the collective
    work.wait()
    show("all_reduce(async_op=True)", b, t, work_type=type(work).__name__, completed=work.is_completed(),
         overlapped=other)

    # -- sub-groups: new_group (every rank calls it for every group) and split_group (one call, many groups)
    half = n // 2
    lo, hi = dist.new_group(list(range(half))), dist.new_group(list(range(half, n)))
    mine = lo if rank < half else hi
    t = own(1)
    b = t.clone()
    dist.all_reduce(t, group=mine)
    show("new_group halves", b, t, group_ranks=dist.get_process_group_ranks(mine))

    parity = dist.split_group(split_ranks=[list(range(0, n, 2)), list(range(1, n, 2))])
    t = own(1)
    b = t.clone()
    dist.all_reduce(t, group=parity)
    show("split_group even/odd", b, t, group_ranks=dist.get_process_group_ranks(parity),
         group_rank=dist.get_rank(parity))

    # -- a ring all-reduce by hand: what all_reduce's 2(n-1)/n comes from (one element per chunk)
    t = own(n)
    steps, sent = ring_all_reduce(t, rank, n)
    ref = own(n)
    dist.all_reduce(ref)
    ring = {"steps": steps, "sent_bytes": sent, "nbytes": t.numel() * t.element_size(),
            "equals_all_reduce": bool(torch.equal(t, ref))}
    print(f"{'ring all_reduce by hand':<26} {len(steps) - 1} steps, sent {sent} of {ring['nbytes']} bytes, "
          f"after {t.tolist()}")

    report({"rank": rank, "world_size": n, "backend": str(dist.get_backend()), "ops": log, "ring": ring})
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
