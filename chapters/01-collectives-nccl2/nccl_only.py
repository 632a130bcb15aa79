"""The NCCL-only APIs of torch 2.15, called for real (chapter 1, notebook 1.2).

    torchrun --nproc-per-node 2 nccl_only.py --backend nccl    # >= 2 GPUs: the real calls
    torchrun --nproc-per-node 2 nccl_only.py                   # gloo on CPU: the error each call gives

1. dist._time_estimator: simulates the collectives issued in its context, returns microseconds
2. the backend's tensor allocator: supports_tensor_alloc, allocate_tensor, mem_allocator, register_mem_pool
3. dist.shrink_group: a smaller group without the last rank, built from the parent communicator (on NCCL
   a sub-group is shrunk, never the default group: that would destroy every other group)

It also times init_process_group(device_id=...) and the first two all_reduces (eager_init.py compares
eager and lazy init on GPUs).
"""

from __future__ import annotations

import argparse
import os
import re
import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown
from pt215.timing import Stopwatch


def err(e: Exception) -> str:
    """The first line of an exception, with object addresses replaced (so the line is the same every run)."""
    first = str(e).splitlines()[0]
    return f"{type(e).__name__}: " + re.sub(r"<[^<>]* object at 0x[0-9a-f]+>", "<backend object>", first)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="gloo")
    a = p.parse_args(argv)

    cuda = a.backend.startswith("nccl")
    if cuda:  # the CUDA context is made before the clock starts: init_ms times init_process_group alone
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # device_id makes the communicator eager: the estimator needs an initialized communicator. nccl: init_rank
    # passes cuda:LOCAL_RANK; gloo gets cpu:0 (an indexed device).
    with Stopwatch() as init:
        me = init_rank(a.backend, **({} if cuda else {"device_id": torch.device("cpu", 0)}))
    rank, n = me.rank, me.world
    dev = me.device if cuda else torch.device("cpu", 0)
    out: dict[str, str] = {}
    first = []  # the first two collectives after init, timed (eager_init.py compares eager and lazy init)
    for _ in range(2):
        with Stopwatch(dev) as clock:
            dist.all_reduce(torch.ones(1024, device=dev))
        first.append(clock.seconds)
    timing = {"init_ms": init.seconds * 1e3, "first_ms": first[0] * 1e3, "second_ms": first[1] * 1e3}

    def say(key: str, text: str) -> None:
        out[key] = text
        print(f"{key:<22} {text}")

    be = dist.get_backend_impl(dist.group.WORLD, dev)
    say("backend class", type(be).__name__)
    say("bound_device_id", str(dist.group.WORLD.bound_device_id))

    # 1. runtime estimate: nothing runs inside the context
    t = torch.ones(1 << 20, device=dev)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # _get_pg_default_device deprecation note
            with dist._time_estimator() as est:
                dist.all_reduce(t)
                dist.all_gather_into_tensor(torch.empty(n * t.numel(), device=dev), t)
        say("_time_estimator", f"{est.estimated_time:.1f} us estimated; tensor untouched: {bool((t == 1).all())}")
    except Exception as e:  # noqa: BLE001
        say("_time_estimator", err(e))

    # 2. tensors allocated by the backend (NCCL memory, registered for zero-copy / symmetric use)
    say("supports_tensor_alloc", str(be.supports_tensor_alloc(dev)))
    try:
        buf = be.allocate_tensor(1 << 20, dtype=torch.float32, device=dev)  # 1-D, 1 Mi elements
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
        say("allocate_tensor", f"{tuple(buf.shape)} {buf.dtype} on {buf.device.type}, all_reduce -> {buf[0].item():.0f}")
    except Exception as e:  # noqa: BLE001
        say("allocate_tensor", err(e))
    try:
        pool = torch.cuda.MemPool(be.mem_allocator)  # a CUDA memory pool backed by the backend's allocator
        with torch.cuda.use_mem_pool(pool):
            y = torch.full((1 << 20,), float(rank + 1), device=dev)
        be.register_mem_pool(pool)  # register the pool's segments with the communicator
        dist.all_reduce(y)
        be.deregister_mem_pool(pool)
        say("mem_allocator + pool", f"all_reduce on pool memory -> {y[0].item():.0f}")
    except Exception as e:  # noqa: BLE001
        say("mem_allocator + pool", err(e))
    try:
        be.register_mem_pool  # noqa: B018 - only NCCL backends have it
        say("register_mem_pool", "present")
    except Exception as e:  # noqa: BLE001
        say("register_mem_pool", err(e))

    # 3. shrink_group: only the ranks that stay call it; the excluded rank leaves. Shrinking the default group
    # makes the result the new default group and destroys every other group (a job's TP/FSDP sub-groups with
    # it), so on NCCL the script shrinks a sub-group over all ranks instead; gloo shows its error on the default
    # group. Any world size works: the last rank is excluded. Unverified on hardware.
    work = dist.new_group(list(range(n)), group_desc="work") if cuda else None
    try:
        if rank != n - 1:
            small = dist.shrink_group([n - 1], group=work)
            z = torch.ones(4, device=dev)
            dist.all_reduce(z, group=small)
            say("shrink_group", f"new size {small.size()}, all_reduce -> {z[0].item():.0f}")
        else:
            say("shrink_group", "excluded: this rank does not call shrink_group")
    except Exception as e:  # noqa: BLE001
        say("shrink_group", err(e))

    report(out | timing)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown); nothing if no group is left
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
