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
    "BufferSegment",
    "all_gather_layout",
    "decode_all_gather",
    "draw_all_gather_bytes",
    "C10D_KINDS",
    "TraceSpan",
    "trace_spans",
    "profile_spans",
    "draw_comm_timeline",
    "reduce_scatter_ms",
    "reduce_cost_text",
    "reduce_scatter_widget",
    "record_forward_dtypes",
    "synthetic_batch",
    "expert_load",
    "routing_flips",
    "router_flip_rate",
    "unsharded_params",
    "plain_twin",
    "local_grad_step",
    "capture_step",
    "accumulation_model",
    "rel_grad_diff",
    "graph_split_accumulation",
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
    """One collective issued by FSDP2: its kind, the unit, and the input buffer's dtype, numel and bytes.

    With `install_comm_counters(..., keep_bytes=True)` an all-gather also keeps the bytes themselves: `sent` (this
    rank's input) and `gathered` (the whole output, every rank's input in rank order), as lists of ints."""

    kind: str
    unit: str
    dtype: str
    numel: int
    nbytes: int
    sent: list[int] | None = None
    gathered: list[int] | None = None


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


def _as_bytes(t: torch.Tensor) -> list[int]:
    return t.detach().reshape(-1).contiguous().view(torch.uint8).cpu().tolist()


class CountingAllGather(DefaultAllGather):
    """FSDP2's default all-gather, recording every call into a shared log (and, with `keep_bytes`, its bytes:
    the call then waits for the collective before it returns, which FSDP2 tolerates; use it on small units)."""

    def __init__(self, unit: str, log: _Log, keep_bytes: bool = False):
        self.unit, self.log, self.keep_bytes = unit, log, keep_bytes

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        rec = CommRecord("all_gather", self.unit, str(input_tensor.dtype).replace("torch.", ""),
                         input_tensor.numel(), input_tensor.numel() * input_tensor.element_size())
        self.log.records.append(rec)
        if self.keep_bytes:
            rec.sent = _as_bytes(input_tensor)
        work = super().__call__(output_tensor, input_tensor, group, async_op)
        if self.keep_bytes:
            if work is not None:
                work.wait()
            rec.gathered = _as_bytes(output_tensor)
        return work


class CountingReduceScatter(DefaultReduceScatter):
    """FSDP2's default reduce-scatter, recording every call into a shared log."""

    def __init__(self, unit: str, log: _Log):
        self.unit, self.log = unit, log

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self.log.records.append(CommRecord("reduce_scatter", self.unit,
                                           str(input_tensor.dtype).replace("torch.", ""), input_tensor.numel(),
                                           input_tensor.numel() * input_tensor.element_size()))
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


def install_comm_counters(model: nn.Module, *, keep_bytes: bool = False) -> _Log:
    """Give every `fully_shard` unit a counting all-gather and reduce-scatter (via `set_custom_all_gather` /
    `set_custom_reduce_scatter`). Returns the log: `.count("all_gather")`, `.dtypes("reduce_scatter")`,
    `.records`, `.clear()`. `keep_bytes=True` also keeps every all-gather's bytes (`CommRecord.sent`,
    `.gathered`): for a small unit whose buffer you want to look at."""
    log = _Log()
    for name, unit in fsdp_units(model).items():
        unit.set_custom_all_gather(CountingAllGather(name, log, keep_bytes))
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


# ---------------------------------------------------------------- one all-gather buffer, byte by byte


@dataclass(frozen=True)
class BufferSegment:
    """Where one parameter's shard from one rank lies in a unit's all-gather output: bytes [offset, offset+nbytes)."""

    rank: int
    name: str
    dtype: str
    offset: int
    nbytes: int
    numel: int


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"not a torch dtype name: {name!r} (e.g. 'bfloat16', 'float32')")
    return dt


def all_gather_layout(shards: Sequence[tuple[str, str, int]], world: int) -> list[BufferSegment]:
    """The byte layout of a `fully_shard` unit's all-gather output, from the unit's parameters alone.

    `shards` is one `(name, dtype name, shard numel)` per parameter, in the unit's parameter order (FSDP2 copies
    them in that order); every rank contributes one equal-sized input, and the output holds rank 0's input, then
    rank 1's, and so on. When the dtypes differ the buffer is `uint8` and each shard is its raw bytes
    (`_fsdp_collectives.foreach_all_gather`). Assumes even shards (no padding), as the chapter's units have.
    """
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"all_gather_layout: world must be an int >= 1, got {world!r}")
    if not shards:
        raise ValueError("all_gather_layout: shards must name at least one parameter")
    per_rank = []
    for name, dtype, numel in shards:
        if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
            raise ValueError(f"all_gather_layout: shard numel of {name!r} must be an int >= 0, got {numel!r}")
        per_rank.append((name, dtype, numel, numel * torch.empty((), dtype=_dtype(dtype)).element_size()))
    rank_bytes = sum(n for *_, n in per_rank)
    out = []
    for r in range(world):
        offset = r * rank_bytes
        for name, dtype, numel, nbytes in per_rank:
            out.append(BufferSegment(r, name, dtype, offset, nbytes, numel))
            offset += nbytes
    return out


def decode_all_gather(gathered: Sequence[int], layout: Sequence[BufferSegment]) -> dict[str, torch.Tensor]:
    """Each parameter's full (flattened) values read back from the gathered bytes: its shards, in rank order, viewed
    as its dtype. The inverse of what FSDP2's copy-out does; a check that `all_gather_layout` is the real layout."""
    data = torch.tensor(list(gathered), dtype=torch.uint8)
    end = max(s.offset + s.nbytes for s in layout)
    if data.numel() != end:
        raise ValueError(f"decode_all_gather: the buffer has {data.numel()} bytes, the layout describes {end}")
    parts: dict[str, list[torch.Tensor]] = {}
    for s in sorted(layout, key=lambda s: (s.rank, s.offset)):
        parts.setdefault(s.name, []).append(data[s.offset:s.offset + s.nbytes].view(_dtype(s.dtype)))
    return {name: torch.cat(p) for name, p in parts.items()}


def draw_all_gather_bytes(gathered: Sequence[int], layout: Sequence[BufferSegment], *, title: str | None = None):
    """Draw a small all-gather output byte by byte: one row per rank's contribution, one cell per byte (its hex
    value), coloured by parameter, each element's value written under its bytes. Returns (fig, ax)."""
    from pt215.diagrams import box, canvas, note

    segs = sorted(layout, key=lambda s: s.offset)
    world = max(s.rank for s in segs) + 1
    per_rank = sum(s.nbytes for s in segs if s.rank == 0)
    if per_rank > 32:
        raise ValueError(f"draw_all_gather_bytes: {per_rank} bytes per rank is too many to draw; use a unit of "
                         "at most 32 bytes per rank")
    if len(gathered) != per_rank * world:
        raise ValueError(f"draw_all_gather_bytes: {len(gathered)} bytes for a layout of {per_rank * world}")
    names = list(dict.fromkeys(s.name for s in segs))
    tones = ["blue", "orange", "green", "purple", "sky", "vermillion"]
    tone = {n: tones[i % len(tones)] for i, n in enumerate(names)}
    row_h = 1.9
    top = (world - 1) * row_h + 0.55 + 1.15
    fig, ax = canvas(7.4, 0.45 + 1.05 * world, xlim=(-3.2, per_rank + 0.1), ylim=(-0.05, top))
    for s in segs:
        y = (world - 1 - s.rank) * row_h + 0.55
        x0 = s.offset - s.rank * per_rank
        for b in range(s.nbytes):
            box(ax, x0 + b, y, 1, 0.62, f"{gathered[s.offset + b]:02X}", fill=tone[s.name], rounded=False,
                alpha=0.35, fontsize=7.5)
        size = s.nbytes // max(s.numel, 1)
        values = torch.tensor(list(gathered[s.offset:s.offset + s.nbytes]), dtype=torch.uint8).view(_dtype(s.dtype))
        for i, v in enumerate(values.tolist()):
            note(ax, x0 + i * size + size / 2, y - 0.22, f"{v:g}", fontsize=7.5)
            if i:  # a heavier line where one element ends and the next begins
                ax.plot([x0 + i * size] * 2, [y, y + 0.62], color="black", lw=2.0)
        note(ax, x0 + s.nbytes / 2, y + 0.86, f"{s.name} ({s.dtype})", fontsize=8, tone=tone[s.name])
    for r in range(world):
        y = (world - 1 - r) * row_h + 0.55
        note(ax, -0.2, y + 0.31, f"from rank {r}", ha="right", fontsize=9)
        note(ax, -0.2, y - 0.22, f"bytes {r * per_rank}-{(r + 1) * per_rank - 1}", ha="right", fontsize=7.5,
             tone="grey")
    if title:
        ax.set_title(title)
    return fig, ax


# ---------------------------------------------------------------- FSDP2's collectives on a profiler timeline


#: c10d ops FSDP2 issues, by the kind the chapter counts (the names `torch.profiler` records on the calling thread)
C10D_KINDS = {"c10d::_allgather_base_": "all_gather", "c10d::allgather_into_tensor_coalesced_": "all_gather",
              "c10d::_reduce_scatter_base_": "reduce_scatter", "c10d::reduce_scatter_tensor_coalesced_":
              "reduce_scatter", "c10d::allreduce_": "all_reduce"}
_BACKEND_PREFIXES = ("gloo:", "nccl:", "record_param_comms")


@dataclass(frozen=True)
class TraceSpan:
    """One bar of a step's timeline, in ms from the trace's first kept event.

    `lane`: "step" (an annotation of yours, `torch.profiler.record_function`), "calls" (a collective FSDP2
    issued, on the calling thread) or "backend" (the backend's own work on its threads, e.g. gloo's
    `pt_gloo_runloop`); `kind`: "mark", "all_gather", "reduce_scatter", "all_reduce" or "other"."""

    lane: str
    kind: str
    name: str
    start_ms: float
    end_ms: float


def trace_spans(trace, marks: Sequence[str] = ()) -> list[TraceSpan]:
    """The collectives of a step, read from a Chrome trace that `torch.profiler` exported (`export_chrome_trace`).

    `trace` is the file's path or its parsed JSON. Kept: the c10d collective calls (`C10D_KINDS`), the backend's
    work on its own threads (each attributed to the call issued last before it began, or "other"), and the user
    annotations whose names start with one of `marks`. Sorted by start.
    """
    import json
    from pathlib import Path

    if isinstance(trace, str | Path):
        trace = json.loads(Path(trace).read_text(encoding="utf-8"))
    if not isinstance(trace, dict) or "traceEvents" not in trace:
        raise ValueError("trace_spans: trace must be a Chrome trace (a path, or the dict with 'traceEvents')")
    if isinstance(marks, str):
        raise ValueError("trace_spans: marks must be a sequence of annotation-name prefixes, not one string")
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    calls = [e for e in events if e.get("name") in C10D_KINDS]
    backend = [e for e in events if str(e.get("name", "")).startswith(_BACKEND_PREFIXES)]
    user = [e for e in events if e.get("cat") == "user_annotation" and any(e["name"].startswith(m) for m in marks)]
    kept = calls + backend + user
    if not kept:
        return []
    t0 = min(e["ts"] for e in kept)

    def ms(e: dict) -> tuple[float, float]:
        return (e["ts"] - t0) / 1e3, (e["ts"] + e["dur"] - t0) / 1e3

    out = [TraceSpan("calls", C10D_KINDS[e["name"]], e["name"], *ms(e)) for e in calls]
    calls.sort(key=lambda c: c["ts"])
    for e in backend:  # the backend works on the call issued last before it started (calls only enqueue)
        owner = None
        for c in calls:
            if c["ts"] > e["ts"]:
                break
            owner = c
        out.append(TraceSpan("backend", C10D_KINDS[owner["name"]] if owner else "other", e["name"], *ms(e)))
    out += [TraceSpan("step", "mark", e["name"], *ms(e)) for e in user]
    return sorted(out, key=lambda s: (s.start_ms, s.lane))


def profile_spans(fn: Callable[[], object], marks: Sequence[str] = ()) -> list[TraceSpan]:
    """Run `fn()` under `torch.profiler` (CPU activity), export the Chrome trace to a temporary file, and return
    its `trace_spans` (the file is removed). What a reader does by hand: `prof.export_chrome_trace(path)`, then
    opens the file in Perfetto or reads it back."""
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    from pt215.memory import quiet_stderr

    if not callable(fn):
        raise TypeError(f"profile_spans: fn must be callable, got {type(fn).__name__}")
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        with quiet_stderr():
            prof.export_chrome_trace(path)
        return trace_spans(path, marks)
    finally:
        os.remove(path)


_KIND_TONES = {"all_gather": "blue", "reduce_scatter": "vermillion", "all_reduce": "purple", "other": "grey"}


def draw_comm_timeline(panels: dict[str, Sequence[TraceSpan]], *, title: str | None = None,
                       backend: str = "gloo"):
    """Draw one or more steps' `trace_spans` on a shared time axis: per panel a lane of your annotations, a lane of
    the collectives FSDP2 called, and a lane of the backend's threads. Short calls are widened to stay visible
    (at least 0.6 % of the axis). Returns (fig, ax)."""
    from pt215.diagrams import Span, timeline

    if not panels:
        raise ValueError("draw_comm_timeline: panels must hold at least one list of spans")
    lanes: list[str] = []
    bars: list[Span] = []
    end = max((s.end_ms for spans in panels.values() for s in spans), default=1.0)
    least = 0.006 * end
    marks_tones = ("sky", "yellow")
    for label, spans in panels.items():
        mine = {"step": f"{label}: your annotations", "calls": f"{label}: FSDP2's calls",
                "backend": f"{label}: {backend} threads"}
        lanes += list(mine.values())
        k = 0
        for s in spans:
            width_end = max(s.end_ms, s.start_ms + least)
            if s.lane == "step":  # a label only where it fits (else its first word); a finalization in green
                fits = [t for t in (s.name, s.name.split("(")[0].split("_")[0].split()[0])
                        if (s.end_ms - s.start_ms) >= 0.012 * end * max(len(t), 4)]
                text = fits[0] if fits else ""
                tone = "green" if s.name.startswith("finalize") else marks_tones[k % 2]
                bars.append(Span(mine["step"], s.start_ms, width_end, text, tone))
                k += 1
            else:
                bars.append(Span(mine[s.lane], s.start_ms, width_end, "", _KIND_TONES.get(s.kind, "grey")))
    names = {"blue": "all-gather", "vermillion": "reduce-scatter", "purple": "all-reduce", "green": "a finalization"}
    legend = {tone: text for tone, text in names.items() if any(b.tone == tone for b in bars)}
    fig, ax = timeline(lanes, bars, width=7.4, lane_height=0.42, xlabel="time from the first event (ms)",
                       title=title, legend=legend)
    ax.tick_params(axis="y", labelsize=8)
    return fig, ax


# ---------------------------------------------------------------- from toy to production: what a reduce-scatter costs


def reduce_scatter_ms(n_params: float, world: int, busbw_gbps: float, *, bytes_per_param: float = 4.0,
                      per_step: int = 1) -> float:
    """Milliseconds per optimizer step that FSDP2's gradient reduce-scatters need at bus bandwidth `busbw_gbps`.

    Each rank reduce-scatters its whole unsharded gradient, S = `n_params` x `bytes_per_param` bytes (4 for fp32,
    2 for bf16: what this chapter's counters measure), `per_step` times per step (1 with accumulation and
    `finalize_backward()`, the number of microbatches when every backward syncs). nccl-tests' convention (chapter
    1, `pt215.bench.bus_factor`) gives t = S (W-1)/W / busbw. A bound for a bandwidth-bound reduction: it leaves
    out latency and any overlap with compute.
    """
    from pt215.bench import GB, bus_factor

    checks = (("n_params", n_params, 0.0), ("busbw_gbps", busbw_gbps, 0.0), ("bytes_per_param", bytes_per_param, 0.0))
    for name, v, lo in checks:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= lo:
            raise ValueError(f"reduce_scatter_ms: {name} must be a positive number, got {v!r}")
    for name, v in (("world", world), ("per_step", per_step)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"reduce_scatter_ms: {name} must be an int >= 1, got {v!r}")
    return per_step * n_params * bytes_per_param * bus_factor("reduce_scatter", world) / (busbw_gbps * GB) * 1e3


def reduce_cost_text(n_params: float, world: int, busbw_gbps: float, per_step: int = 1,
                     fp32_bytes: float = 4.0, bf16_bytes: float = 2.0) -> str:
    """The three lines `reduce_scatter_widget` shows (and the notebook prints) for one set of inputs."""
    fp32 = reduce_scatter_ms(n_params, world, busbw_gbps, bytes_per_param=fp32_bytes, per_step=per_step)
    bf16 = reduce_scatter_ms(n_params, world, busbw_gbps, bytes_per_param=bf16_bytes, per_step=per_step)
    return (f"fp32 reduce-scatters: {fp32:.2f} ms per step\n"
            f"bf16 reduce-scatters: {bf16:.2f} ms per step\n"
            f"fp32 adds:            {fp32 - bf16:.2f} ms per step")


_COST_JS = r"""
(function (root) {
  function fixed(v, d) {  // Python's f"{v:.Df}": an exact decimal tie goes to the even digit
    var s = Math.abs(v).toFixed(d + 25), head = s.slice(0, s.length - 25).replace(/\.$/, "");
    var out = (/^50*$/.test(s.slice(s.length - 25)) && parseInt(head.slice(-1), 10) % 2 === 0) ? head
              : Math.abs(v).toFixed(d);
    return (v < 0 ? "-" : "") + out;
  }
  function cost(n, w, busbw, perStep, b32, b16) {
    var f = (w - 1) / w, ms32 = perStep * n * b32 * f / (busbw * 1e9) * 1e3,
        ms16 = perStep * n * b16 * f / (busbw * 1e9) * 1e3;
    return "fp32 reduce-scatters: " + fixed(ms32, 2) + " ms per step\n" +
           "bf16 reduce-scatters: " + fixed(ms16, 2) + " ms per step\n" +
           "fp32 adds:            " + fixed(ms32 - ms16, 2) + " ms per step";
  }
  root.pt215ReduceCost = cost;
})(window);
"""


def reduce_scatter_widget(presets: dict[str, tuple[float, int, float, int]], *, fp32_bytes: float = 4.0,
                          bf16_bytes: float = 2.0):
    """A calculator that computes in the browser (no kernel): parameters, GPUs, bus bandwidth and reductions per
    step in, the ms per step of fp32 and bf16 reduce-scatters out (`reduce_cost_text`, ported to JavaScript).

    `presets` maps a button label to `(n_params, world, busbw_gbps, per_step)`; the first fills the form.
    `fp32_bytes`/`bf16_bytes` are the bytes per parameter the reduce-scatters move (measured by the chapter).
    """
    import html
    import json

    from pt215.widgets import _html, _uid

    if not presets:
        raise ValueError("reduce_scatter_widget: presets must hold at least one (n_params, world, busbw, per_step)")
    for label, p in presets.items():
        if len(p) != 4:
            raise ValueError(f"reduce_scatter_widget: preset {label!r} must be (n_params, world, busbw_gbps, "
                             f"per_step), got {p!r}")
        reduce_cost_text(*p, fp32_bytes=fp32_bytes, bf16_bytes=bf16_bytes)  # validates the values
    data = json.dumps({k: list(v) for k, v in presets.items()})
    uid = _uid("rscost", data + f"{fp32_bytes},{bf16_bytes}")
    first = next(iter(presets.values()))
    fields = [("n", "parameters", first[0]), ("w", "GPUs W", first[1]), ("bw", "busbw (GB/s)", first[2]),
              ("k", "reduce-scatters per step", first[3])]
    inputs = "".join(f'<label for="{uid}-{k}">{html.escape(t)}</label> <input type="number" id="{uid}-{k}" '
                     f'min="{1 if k in ("w", "k") else 0}" step="any" value="{v:g}" style="width:9em"> '
                     for k, t, v in fields)
    buttons = "".join(f'<button type="button" data-preset="{html.escape(k)}">{html.escape(k)}</button> '
                      for k in presets)
    text = html.escape(reduce_cost_text(*first, fp32_bytes=fp32_bytes, bf16_bytes=bf16_bytes))
    return _html(f"""<div class="pt215-widget" id="{uid}">
<div>{buttons}</div>
<div style="margin-top:.4rem">{inputs}</div>
<pre id="{uid}-out" aria-live="polite">{text}</pre>
<script>{_COST_JS}(function () {{
  var presets = {data}, root = document.getElementById("{uid}"), out = document.getElementById("{uid}-out");
  function el(k) {{ return document.getElementById("{uid}-" + k); }}
  function show() {{
    var n = Number(el("n").value), w = Number(el("w").value), bw = Number(el("bw").value), k = Number(el("k").value);
    if (!(n > 0) || !(bw > 0)) out.textContent = "ValueError: parameters and busbw must be positive numbers";
    else if (!(w >= 1) || w % 1 || !(k >= 1) || k % 1)
      out.textContent = "ValueError: GPUs and reduce-scatters per step must be whole numbers >= 1";
    else out.textContent = window.pt215ReduceCost(n, w, bw, k, {fp32_bytes!r}, {bf16_bytes!r});
  }}
  root.querySelectorAll("button[data-preset]").forEach(function (b) {{
    b.addEventListener("click", function () {{
      var p = presets[b.getAttribute("data-preset")];
      el("n").value = p[0]; el("w").value = p[1]; el("bw").value = p[2]; el("k").value = p[3]; show();
    }});
  }});
  ["n", "w", "bw", "k"].forEach(function (k) {{ el(k).addEventListener("input", show); }});
  show();
}})();</script>
</div>""")


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


def accumulation_model(cfg: MoEConfig, device: torch.device | str = "cpu", *, graph_ready: bool = False,
                       ) -> tuple[MoETransformer, torch.optim.Optimizer]:
    """The chapter's model (router + norms fp32, the rest bf16, reduced in fp32), sharded, set up to accumulate:
    manual finalization, gradient sync off. `graph_ready` also keeps the unsharded storage (a CUDA graph's
    parameter addresses survive reshard and unshard) and skips resharding after forward (microbatch 0's backward
    needs no re-gather). Returns (model, SGD optimizer). Chapter 4, `fsdp_cuda_graph.py` and `fsdp_accum_dcp.py`."""
    torch.manual_seed(0)
    m = MoETransformer(cfg).to(device)
    fn, _ = keep_fp32_override(m)
    shard_model(m, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                        param_dtype_override_fn=fn))
    m.set_manual_backward_finalization(True)   # the reduction is a separate, eager step
    m.set_requires_gradient_sync(False)        # no reduce-scatter while accumulating
    if graph_ready:
        m.set_keep_unsharded_storage(True)
        m.set_reshard_after_forward(False)
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def _finalize(model: MoETransformer) -> None:
    """Sync on, then one reduce-scatter per unit; sync off again for the next window."""
    model.set_requires_gradient_sync(True)
    model.finalize_backward()
    model.set_requires_gradient_sync(False)


def rel_grad_diff(a: nn.Module, b: nn.Module) -> float:
    """max |grad_a - grad_b| / max |grad_b| over all parameters (full tensors: a collective on every rank)."""
    diff = max((p.grad.full_tensor() - q.grad.full_tensor()).abs().max().item()
               for p, q in zip(a.parameters(), b.parameters(), strict=True))
    return diff / max(q.grad.full_tensor().abs().max().item() for q in b.parameters())


def graph_split_accumulation(micro: int, n_windows: int, rank: int, device: torch.device | str = "cpu", *,
                             graphed: bool = False, echo: Callable[[str], None] | None = None) -> list[dict]:
    """Gradient accumulation with a CUDA graph beside FSDP2, checked against plain FSDP2 accumulation (chapter 4).

    Per optimizer step ("window") of `micro` microbatches: microbatch 0 runs eagerly through FSDP2 (its hooks
    all-gather into the kept storage, its backward leaves unsharded gradients); those gradients are copied into
    static buffers that become the unsharded parameters' `.grad`; microbatches 1..micro-1 run the twin's step
    (`local_grad_step`), replayed from a graph captured in the first window when `graphed`, called eagerly in its
    place otherwise; then one `finalize_backward()` reduces the buffers, once per unit. Returns one row per window
    (all-gathers and reduce-scatters per unit, whether every parameter kept its memory, the relative gradient
    difference to plain FSDP2); raises if a unit reduced twice, a parameter moved, or the gradients differ."""
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 2:
        raise ValueError(f"graph_split_accumulation: micro must be an int >= 2 (microbatch 0 runs through FSDP2, "
                         f"the rest are replays), got {micro!r}")
    if isinstance(n_windows, bool) or not isinstance(n_windows, int) or n_windows < 1:
        raise ValueError(f"graph_split_accumulation: n_windows must be an int >= 1, got {n_windows!r}")
    cfg = MoEConfig(dispatch="dense")          # static shapes: no per-expert host sync inside the graph
    windows = [[tuple(t.to(device) for t in synthetic_batch(cfg, 2, 16, seed=1000 * w + 10 * i + rank))
                for i in range(micro)] for w in range(n_windows)]
    ref, ref_opt = accumulation_model(cfg, device)
    model, opt = accumulation_model(cfg, device, graph_ready=True)
    log = install_comm_counters(model)
    static_x, static_y = (torch.zeros_like(t) for t in windows[0][0])
    params: list[nn.Parameter] = []
    bufs: list[torch.Tensor] = []
    ptrs: list[int] = []
    run_step = None
    rows = []
    for w, batches in enumerate(windows):
        for x, y in batches:                   # the reference: plain FSDP2 accumulation, then one reduction
            (ref.loss(x, y)[0] / micro).backward()
        _finalize(ref)
        log.clear()
        model.set_reshard_after_backward(False)
        x0, y0 = batches[0]
        (model.loss(x0, y0)[0] / micro).backward()          # FSDP2's own forward + backward, eager
        current = unsharded_params(model)
        if run_step is None:                   # first window: twin, static buffers, and the capture
            params = list(current.values())
            ptrs = [q.data_ptr() for q in params]
            bufs = [torch.zeros_like(q.grad) for q in params]    # in the accumulation dtype (fp32)
            step = local_grad_step(plain_twin(model), params, bufs, static_x, static_y, 1.0 / micro)
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
        _finalize(model)
        rel = rel_grad_diff(model, ref)
        row = {"window": w, "all_gather": log.count("all_gather"), "reduce_scatter": log.count("reduce_scatter"),
               "same_storage": same, "rel_diff": rel}
        rows.append(row)
        if echo is not None:
            how = "replayed" if graphed else "run eagerly in place of replays"
            echo(f"window {w}: microbatch 0 through FSDP2, {micro - 1} {how}; all-gathers per unit "
                 f"{row['all_gather']}, reduce-scatters per unit {row['reduce_scatter']}; same parameter "
                 f"memory: {same}; gradients vs plain FSDP2: max |diff| / max |grad| = {rel:.1e}")
        if not all(c == 1 for c in row["reduce_scatter"].values()):
            raise AssertionError(f"a unit reduced more than once in window {w}: {row['reduce_scatter']}")
        if not rel < 1e-3:
            raise AssertionError(f"window {w}: gradients differ from plain FSDP2 by {rel:.1e} (> 1e-3)")
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    return rows


def strip_stride_metadata(checkpoint_dir: str, out_file: str | None = None) -> int:
    """Re-pickle a DCP checkpoint's `.metadata` with every `TensorProperties` in the pre-2.15 5-element form
    (dropping the 2.15 `strides` field); 2.15 reads such files back with `strides=None`.

    Writes to `out_file` (default: overwrite `<checkpoint_dir>/.metadata`) and returns how many entries were
    rewritten. This removes the one metadata change 2.15's release names. The book's torch 2.14.1 record (chapter
    4) shows 2.14 loading a stripped copy of a small checkpoint (two tensors, one process) with equal values; a
    sharded job's checkpoint with its optimizer state is not recorded: test it in your rollback environment.
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
