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
window's reduced gradients against plain FSDP2 accumulation of the same microbatches, then take an SGD step.

`--whole-step` (CUDA only) is an experiment instead: capture one whole FSDP2 microbatch, forward and backward
through FSDP2's own hooks and collectives, in a CUDA graph, replay it, and report what happened (captured and
replayed with the eager gradients, or the error). torch 2.15's `fully_shard` docstrings exclude only CPU offload
and an outstanding async unshard from graph capture (`torch/distributed/fsdp/_fully_shard/_fully_shard.py`,
`set_keep_unsharded_storage`); whether the rest captures is what this run records.

Run:  torchrun --nproc-per-node 2 fsdp_cuda_graph.py --micro 4                 (2+ CUDA GPUs)
      torchrun --nproc-per-node 2 fsdp_cuda_graph.py --whole-step              (2+ CUDA GPUs, the experiment)
      torchrun --nproc-per-node 2 fsdp_cuda_graph.py --micro 4 --device cpu    (gloo, no graph)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from pt215.fsdp import (
    MoEConfig,
    MoETransformer,
    capture_step,
    install_comm_counters,
    keep_fp32_override,
    local_grad_step,
    plain_twin,
    shard_model,
    synthetic_batch,
    unsharded_params,
)
from pt215.hardware import requires
from pt215.launch import init_rank, report, shutdown


def build(cfg: MoEConfig, device: torch.device) -> tuple[MoETransformer, torch.optim.Optimizer]:
    """The chapter's MoE model (router + norms fp32, the rest bf16), sharded, accumulating without sync."""
    torch.manual_seed(0)
    m = MoETransformer(cfg).to(device)
    fn, _ = keep_fp32_override(m)
    shard_model(m, MixedPrecisionPolicy(param_dtype=torch.bfloat16, param_dtype_override_fn=fn))
    m.set_manual_backward_finalization(True)   # the reduction is a separate, eager step
    m.set_requires_gradient_sync(False)        # no reduce-scatter while accumulating
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def finalize(model: MoETransformer) -> None:
    """Sync on, then one reduce-scatter per unit; sync off again for the next window."""
    model.set_requires_gradient_sync(True)
    model.finalize_backward()
    model.set_requires_gradient_sync(False)


def rel_grad_diff(a: MoETransformer, b: MoETransformer) -> float:
    """max |grad_a - grad_b| / max |grad_b| over all parameters (full tensors: a collective on every rank)."""
    diff = max((p.grad.full_tensor() - q.grad.full_tensor()).abs().max().item()
               for p, q in zip(a.parameters(), b.parameters(), strict=True))
    return diff / max(q.grad.full_tensor().abs().max().item() for q in b.parameters())


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
    cfg = MoEConfig(dispatch="dense")          # static shapes: no per-expert host sync inside the graph
    windows = [[tuple(t.to(me.device) for t in synthetic_batch(cfg, 2, 16, seed=1000 * w + 10 * i + me.rank))
                for i in range(a.micro)] for w in range(a.windows)]
    ref, ref_opt = build(cfg, me.device)
    model, opt = build(cfg, me.device)
    log = install_comm_counters(model)
    model.set_keep_unsharded_storage(True)     # the graph's parameter addresses survive reshard/unshard
    model.set_reshard_after_forward(False)     # microbatch 0's backward needs no re-gather
    static_x, static_y = (torch.zeros_like(t) for t in windows[0][0])
    if a.whole_step:
        report({"device": a.device, "whole_step": whole_step(model, windows[0][0], a.micro)})
        shutdown()
        return 0
    params: list[torch.nn.Parameter] = []
    bufs: list[torch.Tensor] = []
    ptrs: list[int] = []
    run_step = None
    rows = []
    for w, batches in enumerate(windows):
        for x, y in batches:                   # the reference: plain FSDP2 accumulation, then one reduction
            (ref.loss(x, y)[0] / a.micro).backward()
        finalize(ref)

        log.clear()
        model.set_reshard_after_backward(False)
        x0, y0 = batches[0]
        (model.loss(x0, y0)[0] / a.micro).backward()        # FSDP2's own forward + backward, eager
        current = unsharded_params(model)
        if run_step is None:                   # first window: twin, static buffers, and the capture
            params = list(current.values())
            ptrs = [q.data_ptr() for q in params]
            bufs = [torch.zeros_like(q.grad) for q in params]    # in the accumulation dtype (fp32)
            step = local_grad_step(plain_twin(model), params, bufs, static_x, static_y, 1.0 / a.micro)
            run_step = capture_step(step).replay if graphed else step
        same = all(q is r for q, r in zip(current.values(), params, strict=True)) \
            and [q.data_ptr() for q in params] == ptrs
        if not same:
            raise RuntimeError("FSDP2 moved an unsharded parameter: the captured graph would read stale memory")
        for q, b in zip(params, bufs, strict=True):
            b.copy_(q.grad)                    # microbatch 0's gradients into the static buffers ...
            q.grad = b                         # ... which FSDP2 reduces at finalize_backward()
        for x, y in batches[1:]:
            static_x.copy_(x)
            static_y.copy_(y)
            run_step()                         # a replay on cuda; the same step, eagerly, on cpu
        model.set_reshard_after_backward(True)  # finalize reshards (the storage is kept)
        finalize(model)
        rel = rel_grad_diff(model, ref)
        row = {"window": w, "all_gather": log.count("all_gather"), "reduce_scatter": log.count("reduce_scatter"),
               "same_storage": same, "rel_diff": rel}
        rows.append(row)
        if me.rank == 0:
            how = "replayed" if graphed else "run eagerly in place of replays"
            print(f"window {w}: microbatch 0 through FSDP2, {a.micro - 1} {how}; all-gathers per unit "
                  f"{row['all_gather']}, reduce-scatters per unit {row['reduce_scatter']}; same parameter "
                  f"memory: {same}; gradients vs plain FSDP2: max |diff| / max |grad| = {rel:.1e}")
        assert all(c == 1 for c in row["reduce_scatter"].values()), row["reduce_scatter"]
        assert rel < 1e-3, rel
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    report({"device": a.device, "graphed": graphed, "micro": a.micro, "windows": rows})
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
