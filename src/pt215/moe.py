"""The book's one mixture-of-experts (MoE): routing, grouping by expert, and the expert computation (chapters 4-6).

- `route`: the router. Softmax in fp32 over the router logits, the top-k experts per token, their weights
  renormalised over the k chosen. The caller computes the logits, in the dtype it chooses (chapter 4 keeps
  the gate in fp32, chapter 5's model uses its own dtype, `SeededMoE` upcasts to fp32).
- `group_by_expert`: sorts routed rows by expert and gives the int32 cumulative end offsets (`offs`) that
  `torch.nn.functional.grouped_mm` wants. `sort_routes` sorts `route`'s (token, expert) pairs that way and
  returns a `Routing`, ready for the expert matmuls; `dispatch` is `route` + `sort_routes` in one step.
- `moe_grouped`: one `F.grouped_mm` call for all experts (bf16/fp16/fp32); `moe_loop`: its per-expert
  reference; `moe_loop_fp8`: FP8 experts, one `pt215.fp8.scaled_matmul` (`F.scaled_mm`) per expert, because
  `grouped_mm` takes no FP8 and `F.scaled_grouped_mm` is CUDA-only. `expert_matmul` picks one of the three.
- `expert_mlp`: the experts' feed-forward, written once: each routed token through its experts' SiLU MLP
  (or SwiGLU) by one of those matmuls, mixed with the router weights. `expert_mlp_dense`: the same with every
  expert on every token (static shapes, no host read: what a CUDA graph can capture, chapter 4).
- `SeededMoE`: a small seeded MoE feed-forward layer (router + SwiGLU experts) whose expert count and batch
  size the reader chooses (chapter 6). `MoEVariant`, `moe_variant`: the chapter-5 model's MoE blocks
  (`pt215.model.MoE`, built on `dispatch` and `moe_grouped`) with their experts computed by `grouped_mm`, a
  loop, or FP8 `scaled_mm` (chapter 6). Chapter 4's `pt215.fsdp.Experts` runs `expert_mlp` with `moe_loop`.
- `count_mm_calls`: the `aten::mm` kernels one call runs on CPU (the profiler's count), 6.2's control.
- `draw_grouping`: notebook 6.2's picture of one `grouped_mm` call against the per-expert loop, from real `offs`.

Expert weights are stacked `(E, N, K)` tensors: expert `e` computes `x @ w[e].T`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from pt215.fp8 import FP8Tensor, Scaling, quantize_experts, scaled_matmul

__all__ = [
    "GROUPED_MM_DTYPES",
    "MoEImpl",
    "MoEVariant",
    "Routing",
    "SeededMoE",
    "count_mm_calls",
    "dispatch",
    "draw_grouping",
    "expert_matmul",
    "expert_mlp",
    "expert_mlp_dense",
    "group_by_expert",
    "moe_grouped",
    "moe_loop",
    "moe_loop_fp8",
    "moe_variant",
    "route",
    "sort_routes",
]

GROUPED_MM_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
MoEImpl = Literal["grouped", "loop", "fp8"]
ExpertMatmul = Callable[[torch.Tensor, Any], torch.Tensor]  # mm(rows grouped by expert, stacked weights)


# ----------------------------------------------------------------------------------------------- routing


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The router: `(probs, idx, weights)` from router logits `(tokens, E)`.

    `probs = softmax(logits.float())` (fp32, `(tokens, E)`); `idx` (int64, `(tokens, top_k)`) and `weights`
    (fp32) are `probs.topk(top_k)` with the weights renormalised to sum to 1 over the k chosen. The logits'
    dtype is the caller's choice (it decides the top-k choice); everything after them is fp32.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        raise ValueError(f"logits must be a floating-point tensor (tokens, E), got "
                         f"{getattr(logits, 'dtype', type(logits).__name__)}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= logits.shape[-1]:
        raise ValueError(f"top_k must be an int in [1, E={logits.shape[-1]}], got {top_k!r}")
    probs = logits.float().softmax(dim=-1)
    weights, idx = probs.topk(top_k, dim=-1)
    return probs, idx, weights / weights.sum(dim=-1, keepdim=True)


def _sort_by_expert(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(order, counts)`: a stable sort of the rows by expert and the rows per expert (no host read)."""
    return torch.argsort(expert_ids, stable=True), torch.bincount(expert_ids, minlength=num_experts)


def group_by_expert(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort routed rows by expert: returns `(order, offs)`.

    `order` permutes rows so that each expert's rows are contiguous (a stable sort: rows of one expert keep
    their order); `offs` (int32, length `num_experts`) are the cumulative END offsets `grouped_mm` wants
    (expert e owns rows `offs[e-1]:offs[e]`; empty groups allowed). Checking the ids' range reads them on
    the host (a sync on a GPU); `dispatch` skips that for ids that come from `route`.
    """
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if expert_ids.dtype not in (torch.int32, torch.int64) or expert_ids.dim() != 1:
        raise ValueError(f"expert_ids must be a 1-D integer tensor, got {expert_ids.dtype} of shape "
                         f"{tuple(expert_ids.shape)}")
    if expert_ids.numel() and (int(expert_ids.min()) < 0 or int(expert_ids.max()) >= num_experts):
        raise ValueError(f"expert_ids must lie in [0, {num_experts}), got range "
                         f"[{int(expert_ids.min())}, {int(expert_ids.max())}]")
    order, counts = _sort_by_expert(expert_ids, num_experts)
    return order, torch.cumsum(counts, 0).to(torch.int32)


@dataclass(frozen=True)
class Routing:
    """Top-k routing of N tokens over E experts, with the (token, expert) pairs sorted by expert.

    `probs` (N, E) fp32 router probabilities; `token_idx` (N*k,) the token of each sorted pair; `weights`
    (N*k,) its renormalised router weight (fp32); `counts` (E,) pairs per expert; `offs` (E,) int32
    cumulative end offsets, the `offs` argument of `torch.nn.functional.grouped_mm`.
    """

    probs: torch.Tensor
    token_idx: torch.Tensor
    weights: torch.Tensor
    counts: torch.Tensor
    offs: torch.Tensor


def sort_routes(probs: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> Routing:
    """Sort `route`'s output `(probs, idx, weights)` into a `Routing`: the N*k (token, expert) pairs by expert.

    The routed rows are `x[routing.token_idx]`; expert e owns rows `offs[e-1]:offs[e]` of them. Nothing is
    read on the host, so a GPU step keeps running ahead.
    """
    if idx.dim() < 1 or weights.shape != idx.shape or idx.shape[:-1] != probs.shape[:-1]:
        raise ValueError(f"probs, idx, weights must be route's (N, E), (N, k), (N, k), got shapes "
                         f"{tuple(probs.shape)}, {tuple(idx.shape)}, {tuple(weights.shape)}")
    top_k = idx.shape[-1]
    order, counts = _sort_by_expert(idx.reshape(-1), probs.shape[-1])
    return Routing(probs, order // top_k, weights.reshape(-1)[order], counts, counts.cumsum(0).to(torch.int32))


def dispatch(logits: torch.Tensor, top_k: int) -> Routing:
    """`route` the logits `(N, E)`, then `sort_routes`: the (token, expert) pairs sorted by expert."""
    return sort_routes(*route(logits, top_k))


# ------------------------------------------------------------------------------------------ expert matmuls


def _check_moe(x: torch.Tensor, w: torch.Tensor | Sequence[FP8Tensor], offs: torch.Tensor) -> int:
    if x.dim() != 2:
        raise ValueError(f"x must be (rows, K), got shape {tuple(x.shape)}")
    num_experts = w.shape[0] if isinstance(w, torch.Tensor) else len(w)
    if offs.dtype != torch.int32:
        raise ValueError(f"offs must be int32 cumulative end offsets (grouped_mm rejects {offs.dtype})")
    if offs.dim() != 1 or offs.numel() != num_experts:
        raise ValueError(f"offs must have one entry per expert ({num_experts}), got shape {tuple(offs.shape)}")
    o = offs.cpu()
    if o.numel() and (bool((o[1:] < o[:-1]).any()) or int(o[0]) < 0):
        raise ValueError(f"offs must be non-decreasing and >= 0, got {o.tolist()}")
    if o.numel() and int(o[-1]) != x.shape[0]:
        raise ValueError(f"offs[-1] must equal the {x.shape[0]} rows of x, got {int(o[-1])} (grouped_mm leaves "
                         "rows past offs[-1] uninitialized and, on CPU, does not check offs past the end)")
    return num_experts


def moe_grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
    """One `F.grouped_mm` call: rows `offs[e-1]:offs[e]` of `x` (rows, K) times `w[e].T`, `w` is (E, N, K).

    Checks what `grouped_mm` needs (same dtype in bf16/fp16/fp32, int32 offsets) and raises a clear error;
    also insists on `offs[-1] == rows` (grouped_mm itself leaves later rows uninitialized). Reading `offs`
    costs a device-to-host sync on a GPU: pass `validate=False` in a timed loop whose `offs` you built with
    `group_by_expert` (dtype and shape checks stay on).
    """
    if w.dim() != 3:
        raise ValueError(f"w must be stacked expert weights (E, N, K), got shape {tuple(w.shape)}")
    if validate:
        _check_moe(x, w, offs)
    elif offs.dtype != torch.int32 or offs.dim() != 1 or offs.numel() != w.shape[0]:
        raise ValueError(f"offs must be int32 with one entry per expert ({w.shape[0]}), got {offs.dtype} "
                         f"of shape {tuple(offs.shape)}")
    if x.dtype not in GROUPED_MM_DTYPES or w.dtype != x.dtype:
        raise ValueError(f"grouped_mm needs x and w in the same dtype among float32/bfloat16/float16, got "
                         f"{x.dtype} and {w.dtype} (FP8 experts: use moe_loop_fp8)")
    if x.shape[1] != w.shape[2]:
        raise ValueError(f"x has K={x.shape[1]} but w is (E, N, K) with K={w.shape[2]}")
    return F.grouped_mm(x, w.transpose(-2, -1), offs=offs)


def _bounds(x: torch.Tensor, w: torch.Tensor | Sequence[FP8Tensor], offs: torch.Tensor,
            bounds: Sequence[int] | None, validate: bool) -> list[int]:
    """The expert end offsets as Python ints: `bounds` when given (no device read), else `offs.tolist()`."""
    num_experts = w.shape[0] if isinstance(w, torch.Tensor) else len(w)
    if validate:
        _check_moe(x, w, offs)
    elif offs.dtype != torch.int32 or offs.dim() != 1 or offs.numel() != num_experts:
        raise ValueError(f"offs must be int32 with one entry per expert ({num_experts}), got {offs.dtype} "
                         f"of shape {tuple(offs.shape)}")
    if bounds is None:
        return offs.tolist()  # one device-to-host sync on a GPU or a Mac
    bounds = list(bounds)
    if len(bounds) != num_experts or not all(isinstance(b, int) for b in bounds):
        raise ValueError(f"bounds must be {num_experts} Python ints (offs.tolist()), got {bounds!r}")
    return bounds


def moe_loop(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, *, validate: bool = True,
             bounds: Sequence[int] | None = None) -> torch.Tensor:
    """Reference for `moe_grouped`: one matmul per non-empty expert, results concatenated in row order.

    A loop needs the expert boundaries on the host: it reads `offs` once (a sync on a GPU or a Mac) unless
    `bounds` (that read, done once per MoE layer for its three projections) is passed; `validate=False`
    skips the value checks of `offs` (dtype and shape checks stay on).
    """
    if w.dim() != 3:
        raise ValueError(f"w must be stacked expert weights (E, N, K), got shape {tuple(w.shape)}")
    ends = _bounds(x, w, offs, bounds, validate)
    out = x.new_zeros(x.shape[0], w.shape[1])
    start = 0
    for e, end in enumerate(ends):
        if end > start:
            out[start:end] = x[start:end] @ w[e].t()
        start = end
    return out


def moe_loop_fp8(
    x: torch.Tensor, w: Sequence[FP8Tensor], offs: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
    validate: bool = True, bounds: Sequence[int] | None = None,
) -> torch.Tensor:
    """FP8 experts: one `scaled_matmul` (i.e. `F.scaled_mm`) per non-empty expert.

    This is the FP8 MoE path for MPS and CPU: `grouped_mm` takes no FP8, and the FP8 grouped op
    (`F.scaled_grouped_mm`) is CUDA-only. `validate` and `bounds` as in `moe_loop`: a timed loop reads the
    boundaries once per layer and passes them to the three projections, exactly as the bf16 loop does.
    """
    if isinstance(w, FP8Tensor) or not all(isinstance(t, FP8Tensor) for t in w):
        raise TypeError("w must be a list of FP8Tensor, one per expert (see quantize_experts)")
    ends = _bounds(x, w, offs, bounds, validate)
    out = torch.zeros(x.shape[0], w[0].data.shape[0], dtype=out_dtype, device=x.device)
    start = 0
    for e, end in enumerate(ends):
        if end > start:
            out[start:end] = scaled_matmul(x[start:end], w[e], out_dtype=out_dtype)
        start = end
    return out


def expert_matmul(impl: MoEImpl, offs: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16) -> ExpertMatmul:
    """The expert matmul `mm(rows, w)` for `expert_mlp`, over the groups `offs`: `moe_grouped` ("grouped"),
    `moe_loop` ("loop") or `moe_loop_fp8` ("fp8", `w` a list of `FP8Tensor`, output in `out_dtype`).

    The loops read the expert boundaries here, once (one host sync on a GPU or a Mac), for all the layer's
    projections; `grouped_mm` reads none. `offs` comes from `sort_routes`, so none re-checks it.
    """
    if impl == "grouped":
        return lambda a, w: moe_grouped(a, w, offs, validate=False)
    if impl not in ("loop", "fp8"):
        raise ValueError(f"impl must be 'grouped', 'loop' or 'fp8', got {impl!r}")
    ends = offs.tolist()
    if impl == "loop":
        return lambda a, w: moe_loop(a, w, offs, validate=False, bounds=ends)
    return lambda a, w: moe_loop_fp8(a, w, offs, out_dtype=out_dtype, validate=False, bounds=ends)


def expert_mlp(x: torch.Tensor, r: Routing, mm: ExpertMatmul, w_in: Any, w_out: Any, w_up: Any = None, *,
               mix_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Each token of `x` (N, K) through its top-k experts' MLPs, mixed with the router weights.

    The routed rows `x[r.token_idx]` (grouped by expert) go through `h = silu(mm(rows, w_in))`, times
    `mm(rows, w_up)` when `w_up` is given (SwiGLU, chapters 5-6), then `y = mm(h, w_out)`; `mm` is one of
    `expert_matmul`'s. Each row of `y` is scaled by its router weight and added to its token's output in
    `mix_dtype` (default `x.dtype`), one `index_add_` for all pairs (each output rounded once).
    """
    xs = x[r.token_idx]
    h = F.silu(mm(xs, w_in))
    if w_up is not None:
        h = h * mm(xs, w_up)
    dt = x.dtype if mix_dtype is None else mix_dtype
    y = mm(h, w_out).to(dt) * r.weights[:, None].to(dt)
    return torch.zeros(x.shape, dtype=dt, device=x.device).index_add_(0, r.token_idx, y)


def expert_mlp_dense(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, w_in: torch.Tensor,
                     w_out: torch.Tensor, w_up: torch.Tensor | None = None) -> torch.Tensor:
    """`expert_mlp` with every expert on every token, the unchosen ones weighted 0 (chapter 4).

    `idx`, `weights` (N, k) as `route` returns them; `w_in`, `w_out`, `w_up` stacked `(E, N, K)` tensors. E/k
    times the FLOPs, but static shapes and no host read, which CUDA-graph capture needs.
    """
    if w_in.dim() != 3 or w_out.dim() != 3:
        raise ValueError(f"w_in and w_out must be stacked expert weights (E, N, K), got shapes "
                         f"{tuple(w_in.shape)} and {tuple(w_out.shape)}")
    gates = torch.zeros(x.shape[0], w_in.shape[0], dtype=weights.dtype, device=x.device)
    gates = gates.scatter(1, idx, weights)                                       # (N, E), zero if not chosen
    h = F.silu(torch.einsum("tk,enk->etn", x, w_in))
    if w_up is not None:
        h = h * torch.einsum("tk,enk->etn", x, w_up)
    y = torch.einsum("etk,enk->etn", h, w_out)
    return torch.einsum("etn,te->tn", y, gates.to(y.dtype))


# ---------------------------------------------------------------------------------------------- layers


class SeededMoE(nn.Module):
    """A small seeded MoE feed-forward layer: top-k router over E SwiGLU experts with stacked weights.

    `w_gate`, `w_up`: (E, I, H); `w_down`: (E, H, I). `forward(x, impl=...)` with `impl` one of "grouped"
    (bf16 `grouped_mm`), "loop" (bf16 per-expert loop) or "fp8" (per-expert `scaled_mm` with rowwise FP8
    experts from `to_fp8()`). Used by chapter 6's decode benchmark.
    """

    def __init__(self, hidden: int = 256, inter: int = 512, num_experts: int = 8, top_k: int = 2,
                 *, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        g = torch.Generator().manual_seed(seed)

        def init(*shape: int, fan_in: int) -> nn.Parameter:
            return nn.Parameter((torch.randn(*shape, generator=g) / math.sqrt(fan_in)).to(dtype))

        self.num_experts, self.top_k = num_experts, top_k
        self.router = init(num_experts, hidden, fan_in=hidden)
        self.w_gate = init(num_experts, inter, hidden, fan_in=hidden)
        self.w_up = init(num_experts, inter, hidden, fan_in=hidden)
        self.w_down = init(num_experts, hidden, inter, fan_in=inter)
        self._fp8: dict[str, list[FP8Tensor]] | None = None

    def to_fp8(self, scaling: Scaling = "rowwise") -> None:
        """Quantize the expert weights once (offline), keeping the bf16 ones for comparison."""
        self._fp8 = {n: quantize_experts(getattr(self, n).detach(), scaling=scaling)
                     for n in ("w_gate", "w_up", "w_down")}

    def forward(self, x: torch.Tensor, impl: MoEImpl = "grouped") -> torch.Tensor:
        """`x` (tokens, hidden) through the routed experts, computed by `impl`; same dtype out."""
        if impl not in ("grouped", "loop", "fp8"):
            raise ValueError(f"impl must be 'grouped', 'loop' or 'fp8', got {impl!r}")
        r = dispatch(x.float() @ self.router.float().t(), self.top_k)  # fp32 logits
        w: dict[str, Any] = {n: getattr(self, n) for n in ("w_gate", "w_up", "w_down")}
        if impl == "fp8":
            if self._fp8 is None:
                raise RuntimeError("call to_fp8() before forward(impl='fp8')")
            w = dict(self._fp8)
        y = expert_mlp(x.to(self.w_up.dtype), r, expert_matmul(impl, r.offs), w["w_gate"], w["w_down"],
                       w["w_up"], mix_dtype=torch.float32)
        return y.to(x.dtype)


class MoEVariant(nn.Module):
    """Drop-in replacement for a `pt215.model.MoE` block with a chosen expert implementation.

    Same routing as the original (softmax router, top-k, renormalised weights, stable sort by expert);
    the three expert projections run as one `grouped_mm` each ("grouped", what `pt215.model` does), a
    per-expert bf16/fp32 loop ("loop"), or per-expert FP8 `scaled_mm` ("fp8", weights quantized once here).
    """

    def __init__(self, moe: nn.Module, impl: MoEImpl, *, scaling: Scaling = "rowwise") -> None:
        super().__init__()
        if impl not in ("grouped", "loop", "fp8"):
            raise ValueError(f"impl must be 'grouped', 'loop' or 'fp8', got {impl!r}")
        for name in ("router", "w1", "w2", "w3", "top_k"):
            if not hasattr(moe, name):
                raise TypeError(f"moe must be a pt215.model.MoE (router, w1, w2, w3, top_k); missing {name!r}")
        self.impl, self.top_k, self.router = impl, moe.top_k, moe.router
        self.w1, self.w2, self.w3 = moe.w1, moe.w2, moe.w3
        self.fp8 = ({n: quantize_experts(getattr(moe, n).detach().float(), scaling=scaling)
                     for n in ("w1", "w2", "w3")} if impl == "fp8" else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        r = dispatch(self.router(x), self.top_k)
        out_dtype = x.dtype if x.dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.bfloat16
        w: dict[str, Any] = self.fp8 if self.fp8 is not None else {n: getattr(self, n) for n in ("w1", "w2", "w3")}
        mm = expert_matmul(self.impl, r.offs, out_dtype=out_dtype)
        return expert_mlp(x, r, mm, w["w1"], w["w2"], w["w3"]).view(shape)


def moe_variant(model: nn.Module, impl: MoEImpl, *, scaling: Scaling = "rowwise") -> nn.Module:
    """A deep copy of a `pt215.model` MoE model whose MoE blocks use `MoEVariant(impl)`; attention and
    `lm_head` stay as they are (bf16 when the model is bf16)."""
    layers = getattr(model, "layers", None)
    if layers is None or not any(hasattr(b.mlp, "w1") and hasattr(b.mlp, "router") for b in layers):
        raise ValueError("model must be a pt215.model.DecoderLM with MoE blocks (load_pretrained('moe'))")
    new = copy.deepcopy(model)
    for blk in new.layers:
        blk.mlp = MoEVariant(blk.mlp, impl, scaling=scaling)
    return new



# ---------------------------------------------------------------------------------------------- picture


def draw_grouping(offs: torch.Tensor | Sequence[int]):
    """Notebook 6.2's picture of one `grouped_mm` call against the per-expert loop, drawn from real `offs`.

    Top: the routed rows sorted by expert, one colour per expert, with the int32 end offsets `offs`, and the
    one `F.grouped_mm` call that covers every group. Bottom: the same rows cut into one matmul per non-empty
    expert, the loop that `moe_loop` (bf16) and `moe_loop_fp8` (FP8 experts on MPS and CPU: one `F.scaled_mm`
    each) run. Returns `(fig, ax)`; end the cell with `pt215.figures.show`.
    """
    from pt215.diagrams import box, canvas, note
    from pt215.figures import CYCLE

    ends = [int(v) for v in (offs.tolist() if isinstance(offs, torch.Tensor) else offs)]
    if not ends or any(b < a for a, b in zip([0, *ends], ends, strict=False)) or ends[0] < 0:
        raise ValueError(f"offs must be non-decreasing end offsets >= 0, one per expert, got {ends}")
    rows = ends[-1]
    if not 1 <= rows <= 24 or len(ends) > 12:
        raise ValueError(f"draw_grouping draws a small step: 1-24 routed rows and at most 12 experts, got "
                         f"{rows} rows and {len(ends)} experts")
    fig, ax = canvas(7.4, 3.6, xlim=(-2.2, rows + 0.2), ylim=(-0.2, 4.6))
    starts = [0, *ends[:-1]]
    tone = [CYCLE[e % len(CYCLE)] for e in range(len(ends))]
    note(ax, -2.1, 3.9, "grouped_mm", ha="left", fontsize=9)
    note(ax, -2.1, 1.4, "loop", ha="left", fontsize=9)
    for e, (s, t) in enumerate(zip(starts, ends, strict=True)):
        for r in range(s, t):
            box(ax, r, 3.5, 1, 0.8, f"e{e}", fill=tone[e], rounded=False, alpha=0.45, fontsize=8)
    for v in sorted(set(ends)):
        names = ",".join(str(e) for e, t in enumerate(ends) if t == v)
        note(ax, v, 3.25, f"offs[{names}]={v}", fontsize=6.5, tone="grey")
    box(ax, 0, 2.45, rows, 0.6, "one call: F.grouped_mm(x_sorted, w.transpose(-2, -1), offs=offs)\n"
        "(MPS, CUDA: one kernel; CPU: a loop of mm inside, one per expert)", fill="sky", rounded=False,
        alpha=0.35, fontsize=7.5)
    calls = 0
    for e, (s, t) in enumerate(zip(starts, ends, strict=True)):
        if t == s:
            continue
        calls += 1
        box(ax, s + 0.05, 1.0, t - s - 0.1, 0.8, f"x[{s}:{t}] @ w[{e}].T" if t - s > 1 else f"w[{e}]",
            fill=tone[e], alpha=0.45, fontsize=7)
    empty = [e for e, (s, t) in enumerate(zip(starts, ends, strict=True)) if t == s]
    note(ax, rows / 2, 0.45, f"{calls} matmuls, one per expert with rows (experts {empty} get none); FP8 experts "
         "run this loop with F.scaled_mm", fontsize=7.5)
    return fig, ax


def count_mm_calls(fn: Callable[[], Any]) -> int:
    """How many `aten::mm` kernels one call of `fn()` runs on CPU, counted by torch's profiler (notebook 6.2).

    The control for 6.2's timing of `grouped_mm` against the loop: on CPU, `grouped_mm`'s fallback runs one
    `mm` per expert, empty experts included, and the loop one per non-empty expert, so the two do the same work
    kernel for kernel. The profiler runs without Kineto (`use_kineto=False`: CPU operators only, and no
    seconds-long device probe at its first use); its C++ start/stop log lines are kept out of the cell's output.
    """
    if not callable(fn):
        raise TypeError(f"count_mm_calls: fn must be callable, got {type(fn).__name__}")
    from pt215.memory import quiet_stderr

    with quiet_stderr(), torch.autograd.profiler.profile(use_kineto=False) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::mm")
