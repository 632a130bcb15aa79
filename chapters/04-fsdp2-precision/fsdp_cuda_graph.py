"""Chapter 4, notebook 4.2: gradient accumulation with a CUDA graph beside FSDP2, reduced once per step.

FSDP2's hooks, side streams and collectives stay eager; the graph holds only what is capturable: one
microbatch's forward and backward on a hook-free twin of the model that shares FSDP2's unsharded parameters
(`pt215.fsdp.plain_twin`), its gradients added into static buffers (`pt215.fsdp.local_grad_step`). Per
optimizer step ("window") of N microbatches:

1. microbatch 0 runs eagerly through FSDP2 with gradient sync and resharding off: every unit all-gathers into
   its kept unsharded storage (`set_keep_unsharded_storage(True)`) and backward leaves unsharded gradients;
2. those gradients are copied into the static buffers, which become the unsharded parameters' `.grad`;
3. microbatches 1..N-1 are graph replays; only the static token inputs change;
4. sync and resharding back on, `finalize_backward()`: one reduce-scatter per unit, of the buffers, eager.

`--device cuda` (nccl, one GPU per rank) captures and replays the graph. `--device cpu` (gloo) calls the same
step eagerly where the replays would be, so everything around the graph runs on any machine. Both check each
window's reduced gradients against plain FSDP2 accumulation of the same microbatches, then take an SGD step. The
loop is `pt215.fsdp.graph_split_accumulation`, which notebook 4.2 also runs on CPU inside `fsdp_accum_dcp.py`.

`--whole-step` (CUDA only) is an experiment instead: capture one whole FSDP2 microbatch, forward and backward
through FSDP2's own hooks and collectives, in a CUDA graph, replay it, and report what happened (captured and
replayed with the eager gradients, or the error). torch 2.15's docstrings exclude only CPU gradient offload and
an outstanding async unshard from graph capture (`FSDPModule.finalize_backward`) and call kept unsharded storage
useful for it (`set_keep_unsharded_storage`, both in `torch/distributed/fsdp/_fully_shard/_fully_shard.py`);
whether the rest captures is what this run records.

Run:  torchrun --nproc-per-node 2 fsdp_cuda_graph.py --micro 4                 (2+ CUDA GPUs)
      torchrun --nproc-per-node 2 fsdp_cuda_graph.py --whole-step              (2+ CUDA GPUs, the experiment)
      torchrun --nproc-per-node 2 fsdp_cuda_graph.py --micro 4 --device cpu    (gloo, no graph)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from pt215.fsdp import (
    MoEConfig,
    MoETransformer,
    accumulation_model,
    capture_step,
    graph_split_accumulation,
    synthetic_batch,
    unsharded_params,
)
from pt215.hardware import requires
from pt215.launch import init_rank, report, shutdown


def whole_step(model: MoETransformer, batch: tuple[torch.Tensor, torch.Tensor], micro: int) -> dict[str, object]:
    """The experiment: one whole FSDP2 microbatch (its hooks, side streams and all-gathers included) captured in
    a CUDA graph and replayed; the gradients compared with the same microbatch run eagerly."""
    x, y = (t.clone() for t in batch)

    def step() -> None:
        (model.loss(x, y)[0] / micro).backward()

    def grads() -> list[torch.Tensor]:
        return [q.grad.detach().clone() for q in unsharded_params(model).values()]

    step()                                      # eager reference (and FSDP2's lazy init)
    eager = grads()
    model.zero_grad(set_to_none=False)
    try:
        graph = capture_step(step, warmup=2)
        model.zero_grad(set_to_none=False)      # the warm-up and capture ran `step`: start from zero
        graph.replay()
        torch.cuda.synchronize()
        replayed = grads()
        diff = max((r - e).abs().max().item() for r, e in zip(replayed, eager, strict=True))
        return {"outcome": "captured and replayed", "max_abs_grad_diff": diff}
    except Exception as e:  # noqa: BLE001 - the error is the result of the experiment
        return {"outcome": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: nccl and a captured graph (default); cpu: gloo, the step run eagerly instead")
    p.add_argument("--micro", type=int, default=4, help="microbatches per optimizer step (>= 2)")
    p.add_argument("--windows", type=int, default=2, help="optimizer steps (>= 1); the graph is captured once")
    p.add_argument("--whole-step", action="store_true",
                   help="cuda only: try to capture a whole FSDP2 microbatch in a graph and report what happens")
    a = p.parse_args(argv)
    if a.whole_step and a.device != "cuda":
        p.error("--whole-step captures a CUDA graph: it needs --device cuda")
    if a.micro < 2:
        p.error(f"--micro must be >= 2 (microbatch 0 runs through FSDP2, the rest are replays), got {a.micro}")
    if a.windows < 1:
        p.error(f"--windows must be >= 1, got {a.windows}")
    graphed = a.device == "cuda"
    if graphed and not requires("cuda", "nccl", shows="a captured microbatch replayed for accumulation, "
                                "one reduce-scatter per unit (run with --device cpu for the rest)"):
        return 1
    me = init_rank("nccl" if graphed else "gloo")
    if a.whole_step:
        cfg = MoEConfig(dispatch="dense")      # static shapes: no per-expert host sync inside the graph
        model, _ = accumulation_model(cfg, me.device, graph_ready=True)
        batch = tuple(t.to(me.device) for t in synthetic_batch(cfg, 2, 16, seed=me.rank))
        report({"device": a.device, "whole_step": whole_step(model, batch, a.micro)})
        shutdown()
        return 0
    rows = graph_split_accumulation(a.micro, a.windows, me.rank, me.device, graphed=graphed,
                                    echo=print if me.rank == 0 else None)
    report({"device": a.device, "graphed": graphed, "micro": a.micro, "windows": rows})
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
