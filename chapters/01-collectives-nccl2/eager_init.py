"""Eager communicator init with device_id, and what it does to the first collective (chapter 1, notebook 1.2).

    torchrun --nproc-per-node 2 eager_init.py                                # gloo, device_id=cpu:0
    torchrun --nproc-per-node 2 eager_init.py --backend nccl-legacy --lazy   # no device_id: lazy communicator
    torchrun --nproc-per-node 2 eager_init.py --backend nccl-legacy          # eager: device_id=cuda:LOCAL_RANK
    torchrun --nproc-per-node 2 eager_init.py --backend nccl                 # NCCL2: eager either way

Only nccl-legacy (ProcessGroupNCCL) is lazy without device_id. NCCL2, the default `nccl` of 2.15, binds
cuda:LOCAL_RANK and creates its communicator in init_process_group even without device_id (`_nccl2_device`;
lazy creation there is the opt-in `Options.lazy_init`), so `--lazy` changes nothing on it.

Times init_process_group, the first all_reduce and the second one (mean over ranks, milliseconds).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

from pt215.launch import init_rank, report, shutdown
from pt215.timing import Stopwatch


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="gloo")
    p.add_argument("--lazy", action="store_true", help="do not pass device_id (the communicator is made on first use)")
    a = p.parse_args(argv)

    cuda = a.backend.startswith("nccl")
    if cuda:  # the CUDA context is made before the clock starts: init_ms times init_process_group alone
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    with Stopwatch() as init:
        # nccl: init_rank passes the indexed device_id=cuda:LOCAL_RANK unless --lazy; gloo accepts cpu:0 too
        me = init_rank(a.backend, bind_device=not a.lazy,
                       **({} if cuda or a.lazy else {"device_id": torch.device("cpu", 0)}))
    dev = me.device
    pg = dist.group.WORLD
    x = torch.ones(1024, device=dev)
    times = []
    for _ in range(2):
        with Stopwatch(dev) as clock:
            dist.all_reduce(x)
        times.append(clock.seconds)
    ms = torch.tensor([init.seconds, *times], dtype=torch.float64, device=dev) * 1e3
    dist.all_reduce(ms)
    ms = (ms / me.world).tolist()
    info = {"backend": a.backend, "eager": not a.lazy, "bound_device_id": str(pg.bound_device_id),
            "sum": x[0].item(), "init_ms": ms[0], "first_ms": ms[1], "second_ms": ms[2]}
    print(f"bound_device_id={info['bound_device_id']}; ones after two all_reduces: {info['sum']:.0f}")
    report(info)
    shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
