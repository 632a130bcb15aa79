"""A small mixture-of-experts transformer and FSDP2 helpers for chapter 4 ("FSDP2 precision overrides").

The model is deliberately tiny (it trains a few dozen steps on 2 CPU ranks in seconds) but has every part
whose precision the chapter discusses: token embedding, RMSNorm, causal attention, a top-k router, a bank of
experts and an LM head. The helpers build the per-parameter precision override for
`MixedPrecisionPolicy(param_dtype_override_fn=...)`, shard the model with `fully_shard`, count FSDP2's
all-gathers and reduce-scatters through its public custom-communication hooks, and summarise routing.
Chapter scripts join their job with `pt215.launch.init_rank` and end with `pt215.launch.shutdown`; notebooks
start them with `pt215.launch.run`.

    cfg = MoEConfig()
    model = MoETransformer(cfg)
    fn, kept = keep_fp32_override(model)            # router + norm weights stay fp32
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, param_dtype_override_fn=fn)
    shard_model(model, policy)                      # one fully_shard unit per block, plus the root
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from pt215.moe import expert_matmul, expert_mlp, expert_mlp_dense, route, sort_routes

__all__ = [
    "MoEConfig",
    "RMSNorm",
    "Attention",
    "Router",
    "Experts",
    "MoELayer",
    "Block",
    "MoETransformer",
    "keep_fp32_override",
    "shard_model",
    "fsdp_units",
    "CommRecord",
    "CountingAllGather",
    "CountingReduceScatter",
    "install_comm_counters",
    "record_forward_dtypes",
    "synthetic_batch",
    "expert_load",
    "routing_flips",
    "router_flip_rate",
    "unsharded_params",
    "plain_twin",
    "local_grad_step",
    "capture_step",
    "strip_stride_metadata",
    "metadata_state_lengths",
]


# ---------------------------------------------------------------- the model


@dataclass(frozen=True)
class MoEConfig:
    """Sizes of the chapter's MoE transformer. Defaults train in seconds on 2 CPU ranks."""

    vocab_size: int = 64
    dim: int = 32
    n_heads: int = 2
    n_layers: int = 2
    n_experts: int = 8
    top_k: int = 2
    hidden: int = 64
    aux_coef: float = 0.01
    dispatch: str = "sparse"  # "sparse": gather each expert's tokens; "dense": static shapes (CUDA-graph capturable)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_heads", "n_layers", "n_experts", "top_k", "hidden"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MoEConfig: {name} must be a positive int, got {v!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"MoEConfig: dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if self.top_k > self.n_experts:
            raise ValueError(f"MoEConfig: top_k ({self.top_k}) must be <= n_experts ({self.n_experts})")
        if self.dispatch not in ("sparse", "dense"):
            raise ValueError(f"MoEConfig: dispatch must be 'sparse' or 'dense', got {self.dispatch!r}")
        if not self.aux_coef >= 0:
            raise ValueError(f"MoEConfig: aux_coef must be >= 0, got {self.aux_coef!r}")


class RMSNorm(nn.Module):
    """RMSNorm that normalises in fp32 and returns the input's dtype; the weight is applied in its own dtype.

    With an fp32 weight (the override) the scale keeps fp32 resolution; with a bf16 weight the scale is
    rounded to bf16 (spacing 2**-7 near 1.0) before it touches the activations.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


class Attention(nn.Module):
    """Causal multi-head self-attention (fused qkv projection + output projection, no bias)."""

    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x.to(self.qkv.weight.dtype)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Router(nn.Module):
    """Top-k router: logits are computed in the gate weight's dtype, softmax in fp32.

    Keeping `gate.weight` in fp32 (the override) therefore makes the logits, and the top-k choice, fp32.
    """

    def __init__(self, dim: int, n_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(dim, n_experts, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`x` (tokens, dim) -> (probs fp32 (tokens, E), top-k indices (tokens, k), top-k weights (tokens, k)),
        by the book's one router, `pt215.moe.route`."""
        return route(self.gate(x.to(self.gate.weight.dtype)), self.top_k)


class Experts(nn.Module):
    """`n_experts` two-layer SiLU MLPs stored as stacked 3-D weights (sharded along the expert dim).

    The computation is `pt215.moe`'s (`w_in.mT`, `w_out.mT` are its `(E, N, K)` layout).
    `dispatch="sparse"` runs each expert on its own tokens (`moe.expert_mlp` with `moe.moe_loop`:
    data-dependent shapes, one host read of the expert boundaries per layer); `dispatch="dense"` runs every
    expert on every token and zero-weights the unchosen ones (`moe.expert_mlp_dense`): E/k times the FLOPs,
    but static shapes and no host sync, which CUDA-graph capture needs.
    """

    def __init__(self, n_experts: int, dim: int, hidden: int, dispatch: str = "sparse"):
        super().__init__()
        self.dispatch = dispatch
        self.w_in = nn.Parameter(torch.randn(n_experts, dim, hidden) / math.sqrt(dim))
        self.w_out = nn.Parameter(torch.randn(n_experts, hidden, dim) / math.sqrt(hidden))

    def forward(self, x: torch.Tensor, probs: torch.Tensor, idx: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor:
        """Tokens `x` (T, dim) go to experts `idx` (T, k), mixed with `weights` (T, k): the `Router`'s
        `(probs, idx, weights)`. Returns (T, dim) in the experts' dtype."""
        x = x.to(self.w_in.dtype)
        w_in, w_out = self.w_in.mT, self.w_out.mT
        if self.dispatch == "dense":
            return expert_mlp_dense(x, idx, weights, w_in, w_out)
        r = sort_routes(probs, idx, weights)
        return expert_mlp(x, r, expert_matmul("loop", r.offs), w_in, w_out)


class MoELayer(nn.Module):
    """Router + experts. Keeps the last routing decision (`last_idx`) and load-balancing loss (`last_aux`)."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.n_experts = cfg.n_experts
        self.router = Router(cfg.dim, cfg.n_experts, cfg.top_k)
        self.experts = Experts(cfg.n_experts, cfg.dim, cfg.hidden, cfg.dispatch)
        self.last_idx: torch.Tensor | None = None
        self.last_aux: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        probs, idx, weights = self.router(flat)
        # Switch-style balance loss: E * sum_e (fraction of assignments to e) * (mean router prob of e)
        chosen = torch.zeros_like(probs).scatter(1, idx, 1.0)  # (T, E) 0/1, no host sync (unlike one_hot)
        frac = chosen.sum(dim=0) / idx.numel()
        self.last_aux = self.n_experts * (frac * probs.mean(dim=0)).sum()
        self.last_idx = idx.detach()
        return self.experts(flat, probs, idx, weights).reshape(b, t, d).to(x.dtype)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + moe(norm2(x))."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.norm1 = RMSNorm(cfg.dim)
        self.attn = Attention(cfg.dim, cfg.n_heads)
        self.norm2 = RMSNorm(cfg.dim)
        self.moe = MoELayer(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x)).to(x.dtype)
        return x + self.moe(self.norm2(x))


class MoETransformer(nn.Module):
    """Embedding -> blocks -> final RMSNorm -> LM head. `forward(tokens)` returns fp32 logits."""

    def __init__(self, cfg: MoEConfig | None = None):
        super().__init__()
        self.cfg = cfg if cfg is not None else MoEConfig()
        c = self.cfg
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"MoETransformer: tokens must be a 2-D integer tensor (batch, seq), got "
                             f"shape {tuple(tokens.shape)} dtype {tokens.dtype}")
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        return self.head(x.to(self.head.weight.dtype)).float()

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(total loss = cross-entropy + aux_coef * balance loss, cross-entropy alone)."""
        logits = self(tokens)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return ce + self.cfg.aux_coef * self.aux_loss(), ce

    def aux_loss(self) -> torch.Tensor:
        """Sum of the blocks' load-balancing losses from the last forward."""
        vals = [b.moe.last_aux for b in self.blocks if b.moe.last_aux is not None]
        if not vals:
            raise RuntimeError("MoETransformer.aux_loss(): run a forward first")
        return torch.stack(vals).sum()

    def routing(self) -> list[torch.Tensor]:
        """Top-k expert indices of the last forward, one (tokens, k) tensor per block."""
        out = [b.moe.last_idx for b in self.blocks]
        if any(i is None for i in out):
            raise RuntimeError("MoETransformer.routing(): run a forward first")
        return [i for i in out if i is not None]


# ---------------------------------------------------------------- the precision override


def keep_fp32_override(model: nn.Module, keep: Sequence[str] = ("router", "norm"),
                       ) -> tuple[Callable[[nn.Parameter], torch.dtype | None], list[str]]:
    """Build a `param_dtype_override_fn` that keeps the parameters whose name has a part starting with one of
    `keep` (e.g. `router`, `norm1`) in their original dtype; every other parameter gets `param_dtype`.

    The decision depends only on parameter names, so it is identical on every rank (the rule FSDP2 asks
    for). Call it *before* `fully_shard`, which replaces the parameters. Returns (fn, kept names).
    """
    if isinstance(keep, str) or not all(isinstance(k, str) and k for k in keep):
        raise ValueError(f"keep_fp32_override: keep must be a sequence of non-empty strings, got {keep!r}")
    kept: list[str] = []
    ids: set[int] = set()
    for name, p in model.named_parameters():
        if any(part.startswith(k) for part in name.split(".") for k in keep):
            kept.append(name)
            ids.add(id(p))

    def override(param: nn.Parameter) -> torch.dtype | None:
        return param.dtype if id(param) in ids else None

    return override, kept


def shard_model(model: MoETransformer, mp_policy: MixedPrecisionPolicy | None = None, *,
                mesh=None, reshard_after_forward: bool = True) -> MoETransformer:
    """`fully_shard` each block, then the root (embedding, final norm, head): n_layers + 1 units.

    Without `mesh`, shards over all ranks of the default process group on the model's device type."""
    if not isinstance(model, MoETransformer):
        raise TypeError(f"shard_model: model must be a MoETransformer, got {type(model).__name__}")
    if mesh is None:  # a 1-D mesh on the model's device type (so a GPU machine running gloo stays on CPU)
        if not dist.is_initialized():
            raise RuntimeError("shard_model: initialise the default process group first (dist.init_process_group)")
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(next(model.parameters()).device.type, (dist.get_world_size(),))
    kw: dict = {"mp_policy": mp_policy or MixedPrecisionPolicy(), "mesh": mesh}
    for blk in model.blocks:
        fully_shard(blk, reshard_after_forward=reshard_after_forward, **kw)
    fully_shard(model, **kw)
    return model


def fsdp_units(model: nn.Module) -> dict[str, FSDPModule]:
    """The model's `fully_shard` units by name (`root` for the model itself)."""
    units = {(name or "root"): m for name, m in model.named_modules() if isinstance(m, FSDPModule)}
    if not units:
        raise ValueError("fsdp_units: the model has no fully_shard units; call shard_model first")
    return units


# ---------------------------------------------------------------- counting collectives


@dataclass
class CommRecord:
    """One collective issued by FSDP2: its kind, the unit, and the input buffer's dtype, numel and bytes."""

    kind: str
    unit: str
    dtype: str
    numel: int
    nbytes: int


@dataclass
class _Log:
    records: list[CommRecord] = field(default_factory=list)

    def count(self, kind: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            if r.kind == kind:
                out[r.unit] = out.get(r.unit, 0) + 1
        return out

    def dtypes(self, kind: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for r in self.records:
            if r.kind == kind and r.dtype not in out.setdefault(r.unit, []):
                out[r.unit].append(r.dtype)
        return out

    def clear(self) -> None:
        self.records.clear()


class CountingAllGather(DefaultAllGather):
    """FSDP2's default all-gather, recording every call into a shared log."""

    def __init__(self, unit: str, log: _Log):
        self.unit, self.log = unit, log

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        self.log.records.append(CommRecord("all_gather", self.unit, str(input_tensor.dtype).replace("torch.", ""),
                                           input_tensor.numel(), input_tensor.numel() * input_tensor.element_size()))
        return super().__call__(output_tensor, input_tensor, group, async_op)


class CountingReduceScatter(DefaultReduceScatter):
    """FSDP2's default reduce-scatter, recording every call into a shared log."""

    def __init__(self, unit: str, log: _Log):
        self.unit, self.log = unit, log

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self.log.records.append(CommRecord("reduce_scatter", self.unit,
                                           str(input_tensor.dtype).replace("torch.", ""), input_tensor.numel(),
                                           input_tensor.numel() * input_tensor.element_size()))
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


def install_comm_counters(model: nn.Module) -> _Log:
    """Give every `fully_shard` unit a counting all-gather and reduce-scatter (via `set_custom_all_gather` /
    `set_custom_reduce_scatter`). Returns the log: `.count("all_gather")`, `.dtypes("reduce_scatter")`,
    `.records`, `.clear()`."""
    log = _Log()
    for name, unit in fsdp_units(model).items():
        unit.set_custom_all_gather(CountingAllGather(name, log))
        unit.set_custom_reduce_scatter(CountingReduceScatter(name, log))
    return log


def record_forward_dtypes(model: nn.Module, modules: Iterable[str] | None = None):
    """Register forward pre-hooks that record the dtype of each module's own parameters (as seen inside
    forward, after FSDP2's unshard) and of its first tensor input. Returns (table, handles);
    `table[module_name][param_name or "__input"] = dtype name`. Remove the hooks with `h.remove()`."""
    table: dict[str, dict[str, str]] = {}
    wanted = set(modules) if modules is not None else None
    handles = []
    for mname, mod in model.named_modules():
        if wanted is not None and mname not in wanted:
            continue
        own = list(mod.named_parameters(recurse=False))
        if not own:
            continue

        def hook(m, args, _name=mname):
            row = table.setdefault(_name, {})
            for pname, p in m.named_parameters(recurse=False):
                row[pname] = str(p.dtype).replace("torch.", "")
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None:
                row["__input"] = str(first.dtype).replace("torch.", "")

        handles.append(mod.register_forward_pre_hook(hook))
    return table, handles


# ---------------------------------------------------------------- data and routing statistics


def synthetic_batch(cfg: MoEConfig, batch: int, seq: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable token stream: next = (3 * cur + 7 + small noise) mod vocab. Returns (tokens, targets)."""
    if batch < 1 or seq < 2:
        raise ValueError(f"synthetic_batch: need batch >= 1 and seq >= 2, got batch={batch}, seq={seq}")
    g = torch.Generator().manual_seed(seed)
    v = cfg.vocab_size
    seqs = torch.empty(batch, seq + 1, dtype=torch.int64)
    seqs[:, 0] = torch.randint(0, v, (batch,), generator=g)
    noise = torch.randint(0, 3, (batch, seq), generator=g) * (torch.rand(batch, seq, generator=g) < 0.2)
    for i in range(seq):
        seqs[:, i + 1] = (3 * seqs[:, i] + 7 + noise[:, i]) % v
    return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


def expert_load(idx: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Fraction of top-k assignments that went to each expert (sums to 1)."""
    if idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"expert_load: idx must be an integer tensor of expert indices, got {idx.dtype}")
    counts = torch.bincount(idx.reshape(-1).long(), minlength=n_experts).float()
    return counts / counts.sum()


def routing_flips(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of tokens whose *set* of top-k experts differs between two routings of the same tokens."""
    if a.shape != b.shape:
        raise ValueError(f"routing_flips: routings must have the same shape, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    return (a.sort(dim=-1).values != b.sort(dim=-1).values).any(dim=-1).float().mean().item()


def router_flip_rate(dim: int, n_experts: int, top_k: int = 2, *, tokens: int = 4096, seed: int = 0,
                     weight_dtype: torch.dtype = torch.bfloat16,
                     input_dtype: torch.dtype = torch.bfloat16) -> float:
    """Fraction of tokens whose top-k expert set changes when a freshly initialised router (nn.Linear init)
    sees RMS-normalised inputs cast to `input_dtype` and its weight cast to `weight_dtype`, against fp32.

    The same casts FSDP2 applies at the all-gather (`param_dtype`) and at unit boundaries
    (`cast_forward_inputs`), isolated from training: a single process, no communication.
    """
    if top_k > n_experts:
        raise ValueError(f"router_flip_rate: top_k ({top_k}) must be <= n_experts ({n_experts})")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, dim, generator=g)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))
    bound = 1 / math.sqrt(dim)
    w = (torch.rand(n_experts, dim, generator=g) * 2 - 1) * bound
    ref = (x @ w.t()).topk(top_k, dim=-1).indices
    dt = torch.promote_types(weight_dtype, input_dtype)
    low = (x.to(input_dtype).to(dt) @ w.to(weight_dtype).to(dt).t()).float().topk(top_k, dim=-1).indices
    return routing_flips(low, ref)


# ---------------------------------------------------------------- a capturable accumulation step (CUDA graphs)


def unsharded_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """The model's parameters by name while every `fully_shard` unit is unsharded: FSDP2 registers its
    unsharded `nn.Parameter`s (in `param_dtype`, or the kept dtype) on the modules. Raises if one is still a
    sharded DTensor (run a forward/backward with `reshard_after_forward`/`reshard_after_backward` off first)."""
    from torch.distributed.tensor import DTensor

    out = dict(model.named_parameters())
    sharded = [n for n, p in out.items() if isinstance(p, DTensor)]
    if sharded:
        raise RuntimeError(f"unsharded_params: {len(sharded)} parameters are still sharded (e.g. {sharded[0]!r}); "
                           "unshard the model first")
    return out


def plain_twin(model: MoETransformer) -> MoETransformer:
    """A plain `MoETransformer` (no FSDP hooks, no side streams) whose parameters ARE `model`'s unsharded
    parameters (the same `nn.Parameter` objects, so the same memory). Build it once while `model` is unsharded
    with `set_keep_unsharded_storage(True)`: later unshards all-gather into that same memory, and the twin
    (or a CUDA graph captured from it) sees the new weights. Chapter 4, `fsdp_cuda_graph.py`."""
    if not isinstance(model, MoETransformer):
        raise TypeError(f"plain_twin: model must be a MoETransformer, got {type(model).__name__}")
    params = unsharded_params(model)
    with torch.device("meta"):
        twin = MoETransformer(model.cfg)
    for name, p in params.items():
        owner, _, leaf = name.rpartition(".")
        setattr(twin.get_submodule(owner) if owner else twin, leaf, p)
    return twin


def local_grad_step(twin: MoETransformer, params: Sequence[nn.Parameter], grads: Sequence[torch.Tensor],
                    tokens: torch.Tensor, targets: torch.Tensor, scale: float) -> Callable[[], None]:
    """One microbatch's forward and backward on `twin`, added into the static buffers `grads` (one per
    parameter, in its accumulation dtype): no FSDP hook, no collective, no host sync (with
    `dispatch="dense"`), no `AccumulateGrad` (`torch.autograd.grad` returns fresh gradients, `_foreach_add_`
    adds them). The returned callable is what `capture_step` records; `tokens`/`targets` are static inputs."""
    params, grads = list(params), list(grads)
    if len(params) != len(grads) or any(p.shape != g.shape for p, g in zip(params, grads, strict=False)):
        raise ValueError("local_grad_step: grads must be one buffer per parameter, of the parameter's shape")
    if twin.cfg.dispatch != "dense":
        raise ValueError("local_grad_step: the twin needs MoEConfig(dispatch='dense'): sparse dispatch reads "
                         "expert counts on the host, which a CUDA graph cannot capture")

    def step() -> None:
        loss = twin.loss(tokens, targets)[0] * scale
        new = torch.autograd.grad(loss, params)
        torch._foreach_add_(grads, [g.to(b.dtype) for g, b in zip(new, grads, strict=True)])

    return step


def capture_step(step: Callable[[], None], warmup: int = 3):
    """Record `step` in a `torch.cuda.CUDAGraph` as `torch.cuda.make_graphed_callables` does: synchronize,
    warm up on a side stream, capture on that same stream (`capture_error_mode="thread_local"`, so that a
    process group's watchdog thread polling its events cannot invalidate the capture). The warm-up runs
    `step`, so reset its buffers afterwards. Chapter 4; needs a CUDA device (checked on hardware only through
    `python -m pt215.verify`)."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"capture_step: warmup must be an int >= 1, got {warmup!r}")
    torch.cuda.synchronize()                    # nothing in flight (all-gathers, reduce-scatters) at capture
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
        step()
    torch.cuda.current_stream().wait_stream(side)
    return graph


def strip_stride_metadata(checkpoint_dir: str, out_file: str | None = None) -> int:
    """Re-pickle a DCP checkpoint's `.metadata` with every `TensorProperties` in the pre-2.15 5-element form
    (dropping the 2.15 `strides` field); 2.15 reads such files back with `strides=None`.

    Writes to `out_file` (default: overwrite `<checkpoint_dir>/.metadata`) and returns how many entries were
    rewritten. This removes the one metadata change 2.15's release names; that an older torch then loads the
    checkpoint is NOT verified by the book (no 2.14 here): test it in your rollback environment.
    """
    import copyreg
    import io
    import os
    import pickle

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorProperties

    src = os.path.join(checkpoint_dir, ".metadata")
    if not os.path.isfile(src):
        raise FileNotFoundError(f"strip_stride_metadata: checkpoint_dir has no .metadata file: {checkpoint_dir!r}")
    meta = FileSystemReader(checkpoint_dir).read_metadata()
    count = 0

    class _FiveTuple(pickle.Pickler):
        def reducer_override(self, obj):
            nonlocal count
            if type(obj) is TensorProperties:
                count += 1
                return (copyreg.__newobj__, (TensorProperties,), obj.__getstate__()[:5])
            return NotImplemented

    buf = io.BytesIO()
    _FiveTuple(buf).dump(meta)
    with open(out_file or src, "wb") as f:
        f.write(buf.getvalue())
    return count


def metadata_state_lengths(checkpoint_dir: str) -> list[int]:
    """Lengths of the pickled `TensorProperties` states in a DCP `.metadata` file as stored on disk
    (6 when written by 2.15, 5 in the older layout)."""
    import os
    import pickle

    from torch.distributed.checkpoint.metadata import TensorProperties

    src = os.path.join(checkpoint_dir, ".metadata")
    if not os.path.isfile(src):
        raise FileNotFoundError(f"metadata_state_lengths: checkpoint_dir has no .metadata file: {checkpoint_dir!r}")
    lengths: list[int] = []

    class _Recording(TensorProperties):
        def __setstate__(self, state):
            lengths.append(len(state))
            super().__setstate__(state)

    class _Spy(pickle.Unpickler):
        def find_class(self, module, name):
            cls = super().find_class(module, name)
            return _Recording if cls is TensorProperties else cls

    with open(src, "rb") as f:
        _Spy(f).load()
    return lengths
