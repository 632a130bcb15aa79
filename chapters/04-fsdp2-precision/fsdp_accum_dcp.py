"""Chapter 4, notebook 4.2: gradient accumulation without per-microbatch communication, stable unsharded
storage, and a DCP checkpoint with its 2.15 stride metadata.

The default and the accumulation recipe each run under `torch.profiler`; every rank reports the spans of its
trace (`pt215.fsdp.profile_spans`: the collectives FSDP2 issued, gloo's threads, one annotation per microbatch),
so the notebook can draw both on a timeline.

Last, the accumulation that a CUDA graph would hold beside FSDP2 (`pt215.fsdp.graph_split_accumulation`, the loop
of `fsdp_cuda_graph.py`), with the twin's step run eagerly where the replays would be: gloo, no graph.

Run:  torchrun --nproc-per-node 2 fsdp_accum_dcp.py [--ckpt DIR] [--micro 4] [--graph-micro 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.profiler import record_function

from pt215.fsdp import (
    MoEConfig,
    MoETransformer,
    fsdp_units,
    graph_split_accumulation,
    install_comm_counters,
    keep_fp32_override,
    profile_spans,
    shard_model,
    synthetic_batch,
)
from pt215.launch import init_rank, report, shutdown


def build(cfg: MoEConfig, seed: int = 0) -> MoETransformer:
    """The chapter's MoE model, router + norms fp32 and the rest bf16, sharded over all ranks."""
    torch.manual_seed(seed)
    m = MoETransformer(cfg)
    fn, _ = keep_fp32_override(m)
    return shard_model(m, MixedPrecisionPolicy(param_dtype=torch.bfloat16, param_dtype_override_fn=fn))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro", type=int, default=4, help="microbatches per optimizer step")
    ap.add_argument("--ckpt", default=None, help="checkpoint folder (default: a temporary one, removed after)")
    ap.add_argument("--graph-micro", type=int, default=2,
                    help="microbatches per step of the graph split, run eagerly (>= 2; 0 skips it)")
    a = ap.parse_args(argv)
    if a.micro < 1:
        ap.error(f"--micro must be >= 1, got {a.micro}")
    if a.graph_micro == 1 or a.graph_micro < 0:
        ap.error(f"--graph-micro must be 0 (skip) or >= 2, got {a.graph_micro}")

    rank = init_rank("gloo", timeout_s=60).rank
    cfg = MoEConfig()
    out: dict = {}

    def say(*args: object) -> None:
        if rank == 0:
            print(*args)

    micro = [synthetic_batch(cfg, batch=2, seq=16, seed=10 * i + rank) for i in range(a.micro)]
    n_units = cfg.n_layers + 1

    # ---- A. the default: every backward reduce-scatters
    ref = build(cfg)
    log = install_comm_counters(ref)

    def default() -> None:
        for i, (x, y) in enumerate(micro):
            with record_function(f"microbatch {i}"):
                (ref.loss(x, y)[0] / a.micro).backward()

    spans = {"default": profile_spans(default, marks=("microbatch",))}
    default_rs = log.count("reduce_scatter")
    default_ag = log.count("all_gather")
    say(f"== default, {a.micro} microbatches: reduce-scatters per unit {default_rs}, all-gathers {default_ag}")
    assert all(c == a.micro for c in default_rs.values()) and len(default_rs) == n_units

    # ---- B. no sync during accumulation, one manual finalization at the end
    model = build(cfg)
    log = install_comm_counters(model)
    model.set_manual_backward_finalization(True)   # on the root, before backward
    model.set_requires_gradient_sync(False)        # accumulate unsharded gradients locally (fp32 here)
    before: dict[str, int] = {}

    def manual() -> None:
        for i, (x, y) in enumerate(micro):
            with record_function(f"microbatch {i}"):
                (model.loss(x, y)[0] / a.micro).backward()
        before.update(log.count("reduce_scatter"))
        model.set_requires_gradient_sync(True)     # re-enable, then finalize: one reduce-scatter per unit
        with record_function("finalize_backward()"):
            model.finalize_backward()

    spans["manual"] = profile_spans(manual, marks=("microbatch", "finalize"))
    manual_rs = log.count("reduce_scatter")
    say(f"== sync off + finalize_backward(): reduce-scatters before finalize {before}, after {manual_rs}")
    assert before == {} and all(c == 1 for c in manual_rs.values()) and len(manual_rs) == n_units
    diff = max((p.grad.full_tensor() - q.grad.full_tensor()).abs().max().item()
               for p, q in zip(model.parameters(), ref.parameters(), strict=True))
    scale = max(q.grad.full_tensor().abs().max().item() for q in ref.parameters())
    say(f"   same gradients as the default? max |diff| / max |grad| = {diff / scale:.1e} (< 1e-5: "
        f"{diff / scale < 1e-5})")
    assert diff / scale < 1e-5
    out["accumulate"] = {"micro": a.micro, "default_rs": default_rs, "default_ag": default_ag,
                         "manual_rs": manual_rs, "manual_ag": log.count("all_gather"), "rel_diff": diff / scale}
    out["spans"] = {k: [dataclasses.asdict(s) for s in v] for k, v in spans.items()}

    # ---- B2. the same, and keep the parameters unsharded between microbatches: one all-gather per unit too
    m3 = build(cfg)
    log3 = install_comm_counters(m3)
    m3.set_manual_backward_finalization(True)
    m3.set_requires_gradient_sync(False)
    m3.set_reshard_after_forward(False)
    m3.set_reshard_after_backward(False)
    for x, y in micro:
        (m3.loss(x, y)[0] / a.micro).backward()
    m3.set_requires_gradient_sync(True)
    m3.set_reshard_after_backward(True)            # finalize follows the current settings: reshard at the end
    m3.finalize_backward()
    kept_ag, kept_rs = log3.count("all_gather"), log3.count("reduce_scatter")
    say(f"== + reshard_after_forward/backward=False: all-gathers {kept_ag}, reduce-scatters {kept_rs}")
    assert all(c == 1 for c in kept_ag.values()) and all(c == 1 for c in kept_rs.values())
    out["accumulate"].update({"unsharded_ag": kept_ag, "unsharded_rs": kept_rs})

    # ---- C. set_keep_unsharded_storage: the unsharded parameter keeps its memory across reshard
    keep_rows = {}
    for keep in (False, True):
        m = build(cfg)
        m.set_keep_unsharded_storage(keep)
        blk = m.blocks[0]
        blk.unshard()
        w = blk.attn.qkv.weight          # the unsharded parameter while the unit is unsharded
        ptr = w.data_ptr()
        blk.reshard()
        alive = w.untyped_storage().nbytes() > 0
        blk.unshard()
        same_obj = blk.attn.qkv.weight is w
        same_ptr = w.data_ptr() == ptr
        blk.reshard()
        keep_rows[str(keep)] = {"storage_kept_after_reshard": alive, "same_param_object": same_obj,
                                "same_data_ptr": same_ptr}
        line = f"== keep_unsharded_storage={keep}: storage kept after reshard: {alive}; same Parameter object: {same_obj}"
        if keep:  # with keep=False a re-allocation *may* land on the same address: not a guarantee, not printed
            line += f"; same data_ptr after re-unshard: {same_ptr}"
            assert alive and same_ptr
        else:
            assert not alive
        say(line)
    out["keep"] = keep_rows

    # ---- D. DCP save, stride metadata, load back
    path = a.ckpt
    tmp = None
    if path is None:
        holder = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
        dist.broadcast_object_list(holder, src=0)
        path = tmp = holder[0]
    plain_t = torch.arange(12.0).reshape(3, 4).t()          # a transposed (non-contiguous) plain tensor
    state = {"model": model.state_dict(), "plain_T": plain_t}
    dcp.save(state, checkpoint_id=path)
    meta = dcp.FileSystemReader(path).read_metadata()
    rows = {}
    for fqn in ("model.blocks.0.moe.experts.w_in", "model.blocks.0.moe.router.gate.weight", "plain_T"):
        md = meta.state_dict_metadata[fqn]
        rows[fqn] = {"size": list(md.size), "dtype": str(md.properties.dtype), "strides": list(md.properties.strides),
                     "chunks": len(md.chunks)}
        say(f"== {fqn}: size {tuple(md.size)} strides {md.properties.strides} chunks {len(md.chunks)} "
            f"dtype {md.properties.dtype}")
    state_len = len(meta.state_dict_metadata["plain_T"].properties.__getstate__())
    say(f"== TensorProperties pickled state has {state_len} elements")
    fresh = build(cfg, seed=123)                            # different weights, then load
    target = {"model": fresh.state_dict(), "plain_T": torch.zeros(4, 3)}
    dcp.load(target, checkpoint_id=path)
    fresh.load_state_dict(target["model"])
    same = all(torch.equal(p.full_tensor(), q.full_tensor())
               for p, q in zip(fresh.parameters(), model.parameters(), strict=True))
    say(f"== loaded into a fresh model: parameters equal {same}; plain_T equal "
        f"{torch.equal(target['plain_T'], plain_t)}, loaded stride {target['plain_T'].stride()}")
    assert same and torch.equal(target["plain_T"], plain_t)
    out["dcp"] = {"rows": rows, "state_len": state_len, "loaded_equal": same}
    dist.barrier()
    if tmp is not None and rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    out["units"] = list(fsdp_units(model))

    # ---- E. the graph split of fsdp_cuda_graph.py, on CPU: the twin's step run eagerly where replays would be
    if a.graph_micro:
        say(f"== the graph split, {a.graph_micro} microbatches per step, no graph on CPU:")
        out["graph_split"] = graph_split_accumulation(a.graph_micro, 2, rank, graphed=False,
                                                      echo=say if rank == 0 else None)
    report(out)
    shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
