"""Eager communicator init with device_id, and what it does to the first collective (chapter 1, notebook 02).

    torchrun --nproc-per-node 2 eager_init.py                                # gloo, device_id=cpu:0
    torchrun --nproc-per-node 2 eager_init.py --backend nccl-legacy --lazy   # no device_id: lazy communicator
    torchrun --nproc-per-node 2 eager_init.py --backend nccl-legacy          # eager: device_id=cuda:LOCAL_RANK
    torchrun --nproc-per-node 2 eager_init.py --backend nccl                 # NCCL2: eager either way

Only nccl-legacy (ProcessGroupNCCL) is lazy without device_id. NCCL2, the default `nccl` of 2.15, binds
cuda:LOCAL_RANK and creates its communicator in init_process_group even without device_id (`_nccl2_device`;
lazy creation there is the opt-in `Options.lazy_init`), so `--lazy` changes nothing on it.

Times init_process_group, the first all_reduce and the second one (mean over ranks, milliseconds).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

from pt215.launch import report, shutdown

p = argparse.ArgumentParser()
p.add_argument("--backend", default="gloo")
p.add_argument("--lazy", action="store_true", help="do not pass device_id (the communicator is made on first use)")
a = p.parse_args()

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
if a.backend.startswith("nccl"):
    dev = torch.device("cuda", local_rank)  # an *indexed* device: cuda:0, cuda:1, ...
    torch.cuda.set_device(dev)
else:
    dev = torch.device("cpu", 0)  # gloo accepts an indexed CPU device too
t0 = time.perf_counter()
dist.init_process_group(a.backend, device_id=None if a.lazy else dev)
t_init = time.perf_counter() - t0
pg = dist.group.WORLD
x = torch.ones(1024, device=dev)
times = []
for _ in range(2):
    t0 = time.perf_counter()
    dist.all_reduce(x)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    times.append(time.perf_counter() - t0)
ms = torch.tensor([t_init, *times], dtype=torch.float64, device=dev) * 1e3
dist.all_reduce(ms)
ms = (ms / dist.get_world_size()).tolist()
info = {"backend": a.backend, "eager": not a.lazy, "bound_device_id": str(pg.bound_device_id),
        "sum": x[0].item(), "init_ms": ms[0], "first_ms": ms[1], "second_ms": ms[2]}
print(f"bound_device_id={info['bound_device_id']}; ones after two all_reduces: {info['sum']:.0f}")
report(info)
shutdown()  # barrier, all ranks confirm, then destroy (a clean gloo teardown)
