"""Which dtype does FSDP2 reduce gradients in, for each reduce_dtype setting? (chapter 7, notebook 07-1)

    torchrun --nproc-per-node 2 reduce_dtype_probe.py

Shards a small fp32 MLP with `param_dtype=torch.bfloat16` and three values of `reduce_dtype` (unset, bf16, fp32),
runs one forward/backward, and records the dtype of every reduce-scatter input (FSDP2's public
`set_custom_reduce_scatter` hook, through `pt215.fsdp.install_comm_counters`) and of the sharded `.grad`.
"""

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from pt215.fsdp import init_dist, install_comm_counters
from pt215.launch import report, shutdown

POLICIES = {
    "reduce_dtype unset": MixedPrecisionPolicy(param_dtype=torch.bfloat16),  # noqa: PT1505 - the case measured
    "reduce_dtype=torch.bfloat16": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16),
    "reduce_dtype=torch.float32": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
}

rank, world, _ = init_dist("gloo")
out = {}
for name, policy in POLICIES.items():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    log = install_comm_counters(model)
    model(torch.randn(4, 16)).float().sum().backward()
    reduced = sorted({r.dtype for r in log.records if r.kind == "reduce_scatter"})
    nbytes = sum(r.nbytes for r in log.records if r.kind == "reduce_scatter")
    grads = sorted({str(p.grad.dtype).replace("torch.", "") for p in model.parameters()})
    out[name] = {"reduce_scatter_dtype": reduced, "reduce_scatter_bytes": nbytes, "grad_dtype": grads}
report(out)
shutdown()
