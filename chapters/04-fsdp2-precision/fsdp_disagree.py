"""Chapter 4, troubleshooting: what happens when ranks disagree about param_dtype_override_fn.

Rank 0 keeps router + norm weights fp32, rank 1 does not. Their all-gather buffers then differ in dtype and
size; on gloo the receiving side aborts with "Received data size doesn't match expected size". On NCCL
expect a hang or corrupted parameters instead. Run:  torchrun --nproc-per-node 2 fsdp_disagree.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from pt215.fsdp import MoEConfig, MoETransformer, keep_fp32_override, shard_model, synthetic_batch
from pt215.launch import init_rank, shutdown


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options
    rank = init_rank("gloo", timeout_s=20).rank
    cfg = MoEConfig()
    torch.manual_seed(0)
    model = MoETransformer(cfg)
    fn, _ = keep_fp32_override(model)
    # WRONG on purpose: a rank-dependent override (e.g. read from a per-host config file)
    shard_model(model, MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                            param_dtype_override_fn=fn if rank == 0 else None))
    print("sharded; now the first forward (its all-gathers) ...", flush=True)
    x, y = synthetic_batch(cfg, 2, 16, seed=rank)
    try:
        model.loss(x, y)
        print("forward finished (not expected)", flush=True)
    except RuntimeError as e:  # the rank whose peer aborted sees the connection drop
        print(f"{type(e).__name__}: {str(e).splitlines()[0][-90:]}", flush=True)
        time.sleep(30)  # let the aborted peer be the first failure the launcher reports (it then stops this one)
        return 1
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
