"""Pre-train a small MoE with FSDP2 (written for torch 2.14).

Run under the Slurm launcher: `sbatch launch.slurm`. The old flight-recorder name TORCH_NCCL_TRACE_BUFFER_SIZE
in this docstring is documentation, not a setting.
"""

import os
import subprocess

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "20000"  # expect: PT1501
os.environ.setdefault(
    "TORCH_NCCL_DUMP_ON_TIMEOUT",  # expect: PT1501
    "1",
)
os.putenv("TORCH_NCCL_ENABLE_FLIGHT_RECORDER", "1")  # expect: PT1502


def build(model: torch.nn.Module, keep_fp32: set[int]) -> torch.nn.Module:
    policy = MixedPrecisionPolicy(  # expect: PT1505
        param_dtype=torch.bfloat16,
        param_dtype_override_fn=lambda p: p.dtype if id(p) in keep_fp32 else None,
    )
    head_policy = MixedPrecisionPolicy(torch.bfloat16, None)  # expect: PT1505
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model.head, mp_policy=head_policy)
    return fully_shard(model, mp_policy=policy)


def main() -> None:
    if os.environ.get("TORCH_DIST_USE_NCCL2") == "1":  # expect: PT1517
        print("opted in to NCCL2 (2.14's opt-in; 2.15's default)")
    backend = os.environ.get("BACKEND", "nccl-legacy")  # expect: PT1504
    dist.init_process_group(backend)
    model = build(torch.load("init.pt", weights_only=False), set())  # expect: PT1510
    loss_opts = torch.nn.LinearCrossEntropyOptions(acc_policy="balanced")  # expect: PT1506
    for step in range(10):
        loss = model(step, options=loss_opts)
        loss.backward()
    dcp.save({"model": model.state_dict()}, checkpoint_id="ckpt/step10")  # expect: PT1507
    eval_env = dict(os.environ, TORCH_DIST_USE_NCCL2="0")  # expect: PT1503
    subprocess.run(["python", "eval.py", "ckpt/step10"], env=eval_env, check=True)


def evaluate() -> None:
    dist.init_process_group("nccl")  # expect: PT1515
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
