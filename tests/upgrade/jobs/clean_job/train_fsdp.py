"""Pre-train a small MoE with FSDP2, upgraded to torch 2.15.

Nothing here should be flagged. The docstring may name TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and "nccl-legacy" (it
documents what was removed); code uses the TORCH_FR_* names, an explicit reduce_dtype, an existing acc_policy and
weights-only loading.
"""

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp_reader  # reading only: no save call
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy, fully_shard


@dataclass
class RunConfig:
    lr: float = 3e-4


os.environ["TORCH_FR_BUFFER_SIZE"] = "20000"
os.environ.setdefault("TORCH_FR_DUMP_ON_TIMEOUT", "1")


def build(model: torch.nn.Module, keep_fp32: set[int], **policy_kw) -> torch.nn.Module:
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16,
        reduce_dtype=torch.float32,
        param_dtype_override_fn=lambda p: p.dtype if id(p) in keep_fp32 else None,
    )
    fp32_policy = MixedPrecisionPolicy()  # no param_dtype: nothing changes in 2.15
    custom = MixedPrecisionPolicy(param_dtype=torch.bfloat16, **policy_kw)  # cannot tell: not flagged
    legacy_fsdp1 = MixedPrecision(param_dtype=torch.bfloat16)  # FSDP1 still reduces in param_dtype
    del legacy_fsdp1, custom
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model.head, mp_policy=fp32_policy)
    return fully_shard(model, mp_policy=policy)


def main() -> None:
    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    torch.serialization.add_safe_globals([RunConfig])
    state = torch.load("init.pt", weights_only=True)
    model = build(state["model"], set())
    loss_opts = torch.nn.LinearCrossEntropyOptions(acc_policy="compact")
    for step in range(10):
        model(step, options=loss_opts).backward()
    dcp_reader.load({"model": model.state_dict()}, checkpoint_id="ckpt/step0")


if __name__ == "__main__":
    main()
