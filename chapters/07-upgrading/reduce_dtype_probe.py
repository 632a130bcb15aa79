"""Which dtype does FSDP2 reduce gradients in, for each reduce_dtype setting? (chapter 7, notebook 7.1)

    torchrun --nproc-per-node 2 reduce_dtype_probe.py

Shards a small MLP with `param_dtype=torch.bfloat16` and three values of `reduce_dtype` (unset, bf16, fp32) on
fp32-stored parameters, and `reduce_dtype` unset on a model converted to bf16 before `fully_shard`; runs one
forward/backward, and records the dtype of every reduce-scatter input (FSDP2's public `set_custom_reduce_scatter`
hook, through `pt215.fsdp.install_comm_counters`) and of the sharded `.grad`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from pt215.fsdp import install_comm_counters
from pt215.launch import init_rank, report, shutdown


def policies() -> dict[str, tuple[MixedPrecisionPolicy, torch.dtype]]:
    """The settings compared, all with `param_dtype=bf16`: (policy, the dtype the parameters are stored in)."""
    unset = MixedPrecisionPolicy(param_dtype=torch.bfloat16)  # noqa: PT1505 - the case measured
    return {
        "reduce_dtype unset": (unset, torch.float32),
        "reduce_dtype=torch.bfloat16": (MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                             reduce_dtype=torch.bfloat16), torch.float32),
        "reduce_dtype=torch.float32": (MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                            reduce_dtype=torch.float32), torch.float32),
        "unset, model stored in bf16": (unset, torch.bfloat16),
    }


def probe(policy: MixedPrecisionPolicy, stored: torch.dtype = torch.float32) -> dict:
    """One forward/backward of a small sharded MLP whose parameters are stored in `stored`: reduce-scatter input
    dtypes and bytes, sharded grad dtypes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(stored)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    log = install_comm_counters(model)
    model(torch.randn(4, 16, dtype=stored)).float().sum().backward()
    reduced = sorted({r.dtype for r in log.records if r.kind == "reduce_scatter"})
    nbytes = sum(r.nbytes for r in log.records if r.kind == "reduce_scatter")
    grads = sorted({str(p.grad.dtype).replace("torch.", "") for p in model.parameters()})
    return {"reduce_scatter_dtype": reduced, "reduce_scatter_bytes": nbytes, "grad_dtype": grads}


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options
    init_rank("gloo", timeout_s=60)
    report({name: probe(policy, stored) for name, (policy, stored) in policies().items()})
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
