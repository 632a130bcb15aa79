"""Chapter 4: capture one microbatch's forward+backward of the FSDP2 MoE model in a CUDA graph, replay it for
gradient accumulation, then reduce once with finalize_backward(). Needs >= 2 CUDA GPUs (nccl).

NOT RUN by the book's CI (no GPU there). Written against the 2.15 docstrings of set_keep_unsharded_storage,
set_manual_backward_finalization, finalize_backward and set_requires_gradient_sync. It checks itself: the
graph-accumulated gradients are compared with the same accumulation run eagerly.

Run:  torchrun --nproc-per-node 2 fsdp_cuda_graph.py --micro 4
"""

import argparse

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from pt215.fsdp import (
    MoEConfig,
    MoETransformer,
    init_dist,
    install_comm_counters,
    keep_fp32_override,
    shard_model,
    synthetic_batch,
    teardown,
)
from pt215.launch import report

ap = argparse.ArgumentParser()
ap.add_argument("--micro", type=int, default=4)
a = ap.parse_args()
rank, world, device = init_dist("nccl")
cfg = MoEConfig(dispatch="dense")              # static shapes: no nonzero() host syncs inside the graph
batches = [tuple(t.to(device) for t in synthetic_batch(cfg, 2, 16, seed=10 * i + rank)) for i in range(a.micro)]


def build():
    torch.manual_seed(0)
    m = MoETransformer(cfg).to(device)
    fn, _ = keep_fp32_override(m)
    shard_model(m, MixedPrecisionPolicy(param_dtype=torch.bfloat16, param_dtype_override_fn=fn))
    m.set_manual_backward_finalization(True)   # reduction is a separate, eager step
    m.set_requires_gradient_sync(False)        # no reduce-scatter inside the accumulation
    return m


# Reference: the same accumulation, eagerly.
ref = build()
for x, y in batches:
    (ref.loss(x, y)[0] / a.micro).backward()
ref.set_requires_gradient_sync(True)
ref.finalize_backward()

model = build()
log = install_comm_counters(model)
model.set_keep_unsharded_storage(True)        # same addresses every replay
model.set_reshard_after_forward(False)        # stay unsharded: no FSDP Python hooks needed on replay
model.set_reshard_after_backward(False)
static_x, static_y = (t.clone() for t in batches[0])

# Warm up on a side stream with a zero-weighted loss: allocates every buffer (gradients included) at
# zero, so the captured backward accumulates in place and the warm-up adds nothing.
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(2):
        (model.loss(static_x, static_y)[0] * 0.0).backward()
torch.cuda.current_stream().wait_stream(side)

graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):                 # recorded, not executed
    static_loss = model.loss(static_x, static_y)[0] / a.micro
    static_loss.backward()

log.clear()
for x, y in batches:                          # accumulation = replays; only the inputs change
    static_x.copy_(x)
    static_y.copy_(y)
    graph.replay()
model.set_requires_gradient_sync(True)
model.set_reshard_after_backward(True)
model.finalize_backward()                     # one reduce-scatter per unit, eager, outside the graph
torch.cuda.synchronize()
rs = log.count("reduce_scatter")
diff = max((p.grad.full_tensor() - q.grad.full_tensor()).abs().max().item()   # collectives: all ranks
           for p, q in zip(model.parameters(), ref.parameters(), strict=True))
scale = max(q.grad.full_tensor().abs().max().item() for q in ref.parameters())
if rank == 0:
    print(f"replayed {a.micro} microbatches; reduce-scatters per unit after finalize: {rs}")
    print(f"graph-accumulated gradients vs eager: max |diff| / max |grad| = {diff / scale:.1e}")
report({"reduce_scatter": rs, "rel_diff": diff / scale})
teardown()
