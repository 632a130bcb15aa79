"""FP8 helpers for chapter 6, "FP8 decoding on Apple Silicon".

What is here:

- `fp8_grid`, `quantize`, `FP8Tensor.dequantize`: FP8 (`float8_e4m3fn`, `float8_e5m2`) quantization with
  tensorwise (one fp32 scale) or rowwise (one fp32 scale per row) scaling.
- `scaled_matmul`: `y = x @ w.T` with an FP8 weight, through `torch.nn.functional.scaled_mm` (the v2 API that
  CPU, CUDA and MPS all implement; `torch._scaled_mm` has no MPS kernel). `scaled_mm_path` says which path a
  device gets, and `cuda_layout_problems` lists what the CUDA kernels would reject.
- `group_by_expert`, `moe_grouped`, `moe_loop`, `moe_loop_fp8`: a mixture-of-experts projection computed with
  `torch.nn.functional.grouped_mm` (bf16/fp16/fp32, int32 cumulative offsets) or with a per-expert loop, the
  latter also with FP8 experts through per-expert `scaled_mm`.
- `MoEVariant`, `moe_variant`: the chapter-5 MoE model (`pt215.model`) with its experts computed by
  `grouped_mm`, a bf16 loop, or FP8 per-expert `scaled_mm`; `decode_tokens_per_s` times its decode phase.
- `FP8Linear`, `fp8_model`: W8A8 FP8 (every GEMM through `scaled_mm`) versions of `pt215.model` models.
- `SeededMoE`: a small seeded MoE feed-forward layer (router + SwiGLU experts) whose expert count and batch
  size the reader chooses.
- `gemv_bytes`, `median_ms`, `copy_bandwidth`: the byte model, the timer and the memory limit (measured in
  the same run) of the chapter's decode comparisons.

On CPU the FP8 matmul is a slow reference path (10-100x slower than bf16): use it for accuracy and API shape,
never as a speed-up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from pt215.model import route
from pt215.timing import median_seconds

__all__ = [
    "FP8_DTYPES",
    "FP8Linear",
    "FP8Tensor",
    "Scaling",
    "MoEVariant",
    "SeededMoE",
    "copy_bandwidth",
    "cuda_layout_problems",
    "decode_tokens_per_s",
    "fp8_grid",
    "fp8_model",
    "gemv_bytes",
    "group_by_expert",
    "median_ms",
    "moe_grouped",
    "moe_loop",
    "moe_loop_fp8",
    "moe_variant",
    "quantize",
    "quantize_experts",
    "rel_error",
    "scaled_matmul",
    "scaled_mm_path",
]

FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)
GROUPED_MM_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
Scaling = Literal["tensorwise", "rowwise"]
_SCALINGS = ("tensorwise", "rowwise")


def _check_fp8_dtype(dtype: torch.dtype, name: str = "dtype") -> None:
    if dtype not in FP8_DTYPES:
        raise ValueError(f"{name} must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")


def _check_scaling(scaling: str) -> None:
    if scaling not in _SCALINGS:
        raise ValueError(f"scaling must be 'tensorwise' or 'rowwise', got {scaling!r}")


def fp8_grid(dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """Every finite, non-negative value of an FP8 format, sorted (float32).

    Built by viewing all 256 bit patterns as `dtype`, so it is the format's real grid (subnormals included).
    """
    _check_fp8_dtype(dtype)
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    values = values[torch.isfinite(values) & (values >= 0)]
    return torch.unique(values)  # sorted; +0 and -0 collapse


@dataclass(frozen=True)
class FP8Tensor:
    """FP8 data plus its fp32 decode scale: `x ~= data.float() * scale`.

    `scale` is 0-dim for tensorwise scaling and `(rows, 1)` for rowwise scaling.
    """

    data: torch.Tensor
    scale: torch.Tensor
    scaling: Scaling

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Back to a high-precision tensor (the FP8 value times its scale)."""
        return (self.data.float() * self.scale).to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of data plus scales."""
        return self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()


def quantize(
    x: torch.Tensor, *, dtype: torch.dtype = torch.float8_e4m3fn, scaling: Scaling = "tensorwise",
    check_finite: bool | None = None,
) -> FP8Tensor:
    """Quantize a floating-point tensor to FP8 with amax scaling.

    tensorwise: one scale `amax(|x|) / fmax` (0-dim fp32). rowwise: one scale per row of a 2-D `x`, shape
    `(rows, 1)`. Values are divided by the scale, clamped to +-fmax (FP8 `fn` formats have no inf), then cast
    (round to nearest even). An all-zero tensor or row gets scale 1.

    `check_finite` rejects inf/nan inputs with a ValueError. Reading that verdict is a device-to-host sync on
    a GPU or a Mac, so the default (`None`) checks only CPU tensors: on CUDA/MPS nothing in `quantize` waits for
    the device (a non-finite input there gives a non-finite scale). Pass `True` to check anyway.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.dtype in FP8_DTYPES:
        raise ValueError(f"x must be a float32/bfloat16/float16 tensor, got {x.dtype}")
    _check_fp8_dtype(dtype)
    _check_scaling(scaling)
    if check_finite is None:
        check_finite = x.device.type == "cpu"
    if check_finite and x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError("x contains inf or nan; FP8 amax scaling needs finite values")
    fmax = torch.finfo(dtype).max
    xf = x.float()
    if scaling == "tensorwise":
        amax = xf.abs().amax() if x.numel() else torch.zeros((), device=x.device)
    else:
        if x.dim() != 2:
            raise ValueError(f"rowwise scaling needs a 2-D tensor (rows, K), got shape {tuple(x.shape)}")
        amax = xf.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax)).float()
    data = (xf / scale).clamp(-fmax, fmax).to(dtype)
    return FP8Tensor(data, scale, scaling)


def quantize_experts(
    w: torch.Tensor, *, dtype: torch.dtype = torch.float8_e4m3fn, scaling: Scaling = "rowwise"
) -> list[FP8Tensor]:
    """Quantize stacked expert weights `(E, N, K)` one expert at a time (rowwise = one scale per output row)."""
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        shape = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"w must be stacked expert weights of shape (E, N, K), got {shape}")
    return [quantize(w[e], dtype=dtype, scaling=scaling) for e in range(w.shape[0])]


def rel_error(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Relative Frobenius error `||approx - ref|| / ||ref||` in float64."""
    if ref.shape != approx.shape:
        raise ValueError(f"ref and approx must have the same shape, got {tuple(ref.shape)} and {tuple(approx.shape)}")
    r = ref.double()
    denom = r.norm().item()
    if denom == 0:
        raise ValueError("ref is all zeros; relative error is undefined")
    return (approx.double() - r).norm().item() / denom


def scaled_mm_path(device: torch.device | str) -> str:
    """Which FP8 matmul path a device gets in this chapter.

    - `"scaled_mm"`: `torch.nn.functional.scaled_mm` runs natively (MPS; CUDA sm_89+; CPU, where it is a slow
      reference implementation).
    - `"dequantize"`: a CUDA GPU older than sm_89 has no FP8 GEMM; dequantize to bf16 and use a bf16 matmul.
    """
    dev = torch.device(device)
    if dev.type in ("cpu", "mps"):
        return "scaled_mm"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device is cuda but torch.cuda.is_available() is False")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return "scaled_mm" if torch.cuda.get_device_capability(index) >= (8, 9) else "dequantize"
    raise ValueError(f"device must be cpu, cuda or mps for FP8 matmul, got {dev.type!r}")


def cuda_layout_problems(mat_a: torch.Tensor, mat_b: torch.Tensor) -> list[str]:
    """The CUDA FP8 GEMM layout rules that `mat_a @ mat_b` breaks (empty list: none).

    Rules (what `torch._scaled_mm`'s CUDA meta check enforces): `mat_a` row-major, `mat_b` column-major,
    K = `mat_a.size(1)` divisible by 16, both dims of `mat_b` divisible by 16. The same multiples of 16 are
    what MPS's decode (gemv) kernel wants for K and the leading strides.
    """
    problems = []
    sa, sb = mat_a.stride(), mat_b.stride()
    if not (sa[1] == 1 and sa[0] >= mat_a.size(1)):
        problems.append(f"mat_a must be row-major, got stride {sa}")
    if not (sb[0] == 1 and sb[1] >= mat_b.size(0)):
        problems.append(f"mat_b must be column-major (pass w.t() of a row-major (N, K) weight), got stride {sb}")
    if mat_a.size(1) % 16:
        problems.append(f"K = mat_a.size(1) must be divisible by 16, got {mat_a.size(1)}")
    if mat_b.size(0) % 16 or mat_b.size(1) % 16:
        problems.append(f"both dims of mat_b must be divisible by 16, got {tuple(mat_b.shape)}")
    return problems


_RECIPE = {"tensorwise": F.ScalingType.TensorWise, "rowwise": F.ScalingType.RowWise}


def scaled_matmul(
    x: torch.Tensor,
    w: FP8Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x @ dequant(w).T` with an FP8 weight `w` of shape (N, K); `x` (M, K) is quantized on the fly.

    The activation gets the weight's scaling kind (tensorwise: one scale; rowwise: one per token row) and is
    always e4m3 (MPS accepts only e4m3 x e4m3). The call is
    `F.scaled_mm(x8, w8.t(), sx, recipe, sw, recipe, output_dtype=out_dtype)` with rowwise scales shaped
    `(M, 1)` and `(1, N)`, contiguous, as CPU, CUDA and MPS all require. On CUDA, rowwise results are computed
    in bf16 (the only output its rowwise kernels support in general) and cast to `out_dtype`. On a CUDA GPU
    older than sm_89 it dequantizes instead (see `scaled_mm_path`).
    """
    if not isinstance(w, FP8Tensor):
        raise TypeError(f"w must be an FP8Tensor from pt215.fp8.quantize, got {type(w).__name__}")
    if x.dim() != 2 or w.data.dim() != 2:
        raise ValueError(f"x must be (M, K) and w (N, K), got {tuple(x.shape)} and {tuple(w.data.shape)}")
    if x.shape[1] != w.data.shape[1]:
        raise ValueError(f"x has K={x.shape[1]} but w has K={w.data.shape[1]} (w must be (N, K))")
    if x.device != w.data.device:
        raise ValueError(f"x is on {x.device} but w is on {w.data.device}")
    allowed = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)
    if out_dtype not in allowed:
        raise ValueError(f"out_dtype must be one of float32, bfloat16, float16, float8_e4m3fn; got {out_dtype}")
    if scaled_mm_path(x.device) == "dequantize":
        y = x.to(torch.bfloat16) @ w.dequantize(torch.bfloat16).t()
        return (y + bias if bias is not None else y).to(out_dtype)
    xq = quantize(x, dtype=torch.float8_e4m3fn, scaling=w.scaling)
    sw = w.scale if w.scaling == "tensorwise" else w.scale.reshape(1, -1).contiguous()
    recipe = _RECIPE[w.scaling]
    if x.device.type == "cuda" and w.scaling == "rowwise" and out_dtype != torch.bfloat16:
        # CUDA's rowwise kernels produce bf16 only (cuBLAS on sm_90 aside): compute bf16, then cast.
        y = F.scaled_mm(xq.data, w.data.t(), xq.scale, recipe, sw, recipe, bias=bias, output_dtype=torch.bfloat16)
        return y.to(out_dtype)
    return F.scaled_mm(xq.data, w.data.t(), xq.scale, recipe, sw, recipe, bias=bias, output_dtype=out_dtype)


# --------------------------------------------------------------------------------------------------- MoE


def group_by_expert(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort routed rows by expert: returns `(order, offs)`.

    `order` permutes rows so that each expert's rows are contiguous; `offs` (int32, length `num_experts`) are
    the cumulative END offsets `grouped_mm` wants (expert e owns rows `offs[e-1]:offs[e]`; empty groups allowed).
    """
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if expert_ids.dtype not in (torch.int32, torch.int64) or expert_ids.dim() != 1:
        raise ValueError(f"expert_ids must be a 1-D integer tensor, got {expert_ids.dtype} of shape "
                         f"{tuple(expert_ids.shape)}")
    if expert_ids.numel() and (int(expert_ids.min()) < 0 or int(expert_ids.max()) >= num_experts):
        raise ValueError(f"expert_ids must lie in [0, {num_experts}), got range "
                         f"[{int(expert_ids.min())}, {int(expert_ids.max())}]")
    order = torch.argsort(expert_ids, stable=True)
    counts = torch.bincount(expert_ids, minlength=num_experts)
    return order, torch.cumsum(counts, 0).to(torch.int32)


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

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Top-k routing: returns (expert id per routed row, weight per routed row, token per routed row)."""
        logits = x.float() @ self.router.float().t()
        weights, ids = torch.topk(logits.softmax(-1), self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        token = torch.arange(x.shape[0], device=x.device).repeat_interleave(self.top_k)
        return ids.reshape(-1), weights.reshape(-1), token

    def forward(self, x: torch.Tensor, impl: Literal["grouped", "loop", "fp8"] = "grouped") -> torch.Tensor:
        if impl not in ("grouped", "loop", "fp8"):
            raise ValueError(f"impl must be 'grouped', 'loop' or 'fp8', got {impl!r}")
        ids, weights, token = self.route(x)
        order, offs = group_by_expert(ids, self.num_experts)
        xs = x[token[order]].to(self.w_up.dtype)
        if impl == "fp8":
            if self._fp8 is None:
                raise RuntimeError("call to_fp8() before forward(impl='fp8')")
            q = self._fp8
            ends = offs.tolist()  # one host read per layer, shared by the three projections (as in "loop")
            h = (F.silu(moe_loop_fp8(xs, q["w_gate"], offs, validate=False, bounds=ends))
                 * moe_loop_fp8(xs, q["w_up"], offs, validate=False, bounds=ends))
            y = moe_loop_fp8(h, q["w_down"], offs, validate=False, bounds=ends)
        else:
            ends = offs.tolist() if impl == "loop" else None

            def mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
                if impl == "grouped":
                    return moe_grouped(a, w, offs, validate=False)
                return moe_loop(a, w, offs, validate=False, bounds=ends)

            h = F.silu(mm(xs, self.w_gate)) * mm(xs, self.w_up)
            y = mm(h, self.w_down)
        y = y.float() * weights[order, None]
        out = torch.zeros(x.shape[0], x.shape[1], device=x.device)
        out.index_add_(0, token[order], y)
        return out.to(x.dtype)


MoEImpl = Literal["grouped", "loop", "fp8"]


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

    def _mm(self, x: torch.Tensor, name: str, offs: torch.Tensor, ends: list[int] | None) -> torch.Tensor:
        if self.fp8 is not None:
            out_dtype = x.dtype if x.dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.bfloat16
            return moe_loop_fp8(x, self.fp8[name], offs, out_dtype=out_dtype, validate=False, bounds=ends)
        w = getattr(self, name)
        if self.impl == "grouped":
            return moe_grouped(x, w, offs, validate=False)  # no host sync: what pt215.model.MoE does
        return moe_loop(x, w, offs, validate=False, bounds=ends)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        r = route(self.router, x, self.top_k, self.w1.shape[0])
        xs = x[r.token_idx]
        # The loops read the expert boundaries once per layer (one host sync, the same for bf16 and FP8);
        # grouped_mm reads none.
        ends = None if self.impl == "grouped" else r.offs.tolist()
        h = F.silu(self._mm(xs, "w1", r.offs, ends)) * self._mm(xs, "w3", r.offs, ends)
        y = self._mm(h, "w2", r.offs, ends) * r.weights[:, None].to(x.dtype)
        return torch.zeros_like(x).index_add_(0, r.token_idx, y.to(x.dtype)).view(shape)


def moe_variant(model: nn.Module, impl: MoEImpl, *, scaling: Scaling = "rowwise") -> nn.Module:
    """A deep copy of a `pt215.model` MoE model whose MoE blocks use `MoEVariant(impl)`; attention and
    `lm_head` stay as they are (bf16 when the model is bf16)."""
    import copy

    layers = getattr(model, "layers", None)
    if layers is None or not any(hasattr(b.mlp, "w1") and hasattr(b.mlp, "router") for b in layers):
        raise ValueError("model must be a pt215.model.DecoderLM with MoE blocks (load_pretrained('moe'))")
    new = copy.deepcopy(model)
    for blk in new.layers:
        blk.mlp = MoEVariant(blk.mlp, impl, scaling=scaling)
    return new


class FP8Linear(nn.Module):
    """An `nn.Linear` (no bias) whose weight is stored in FP8 and whose matmul is `scaled_matmul` (W8A8)."""

    def __init__(self, linear: nn.Linear, *, scaling: Scaling = "rowwise") -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear) or linear.bias is not None:
            raise TypeError("linear must be an nn.Linear without bias")
        self.weight = quantize(linear.weight.detach().float(), scaling=scaling)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = x.dtype if x.dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.bfloat16
        y = scaled_matmul(x.reshape(-1, x.shape[-1]), self.weight, out_dtype=out_dtype)
        return y.view(*x.shape[:-1], self.out_features)


def fp8_model(model: nn.Module, *, scaling: Scaling = "rowwise", experts: bool = True,
              lm_head: bool = True) -> nn.Module:
    """A deep copy of a `pt215.model.DecoderLM` with every GEMM in FP8 (W8A8 through `scaled_mm`).

    Attention and dense-MLP linears become `FP8Linear`; MoE blocks become `MoEVariant("fp8")` when
    `experts`; `lm_head` is converted when `lm_head`. The embedding, norms and router stay as they are.
    """
    import copy

    if not hasattr(model, "layers") or not hasattr(model, "lm_head"):
        raise ValueError("model must be a pt215.model.DecoderLM")
    new = copy.deepcopy(model)
    for blk in new.layers:
        for name in ("wq", "wk", "wv", "wo"):
            setattr(blk.attn, name, FP8Linear(getattr(blk.attn, name), scaling=scaling))
        if hasattr(blk.mlp, "router"):
            if experts:
                blk.mlp = MoEVariant(blk.mlp, "fp8", scaling=scaling)
        else:
            for name in ("w1", "w2", "w3"):
                setattr(blk.mlp, name, FP8Linear(getattr(blk.mlp, name), scaling=scaling))
    if lm_head:
        new.lm_head = FP8Linear(new.lm_head, scaling=scaling)
    return new


@torch.no_grad()
def decode_tokens_per_s(model: nn.Module, *, batch: int, prompt_len: int = 16, new_tokens: int = 16,
                        warmup: int = 2, device: torch.device | str = "cpu", seed: int = 0) -> float:
    """Decode throughput in tokens/s: `batch * new_tokens / seconds` of the decode phase only.

    A seeded random prompt `(batch, prompt_len)` is prefilled (untimed), `warmup` single-token steps run
    untimed, then `new_tokens` greedy single-token steps (each reads the KV cache) are timed with the device
    synchronized before and after. Uses `pt215.model.KVCache`.
    """
    from pt215.model import KVCache

    if batch < 1 or prompt_len < 1 or new_tokens < 1 or warmup < 0:
        raise ValueError(f"batch, prompt_len, new_tokens must be >= 1 and warmup >= 0, got {batch}, "
                         f"{prompt_len}, {new_tokens}, {warmup}")
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=g).to(device)
    dtype = next(model.parameters()).dtype
    cache = KVCache(cfg, batch, prompt_len + warmup + new_tokens, dtype=dtype, device=device)
    nxt = model(prompt, cache=cache)[:, -1:].argmax(-1)
    for _ in range(warmup):
        nxt = model(nxt, cache=cache)[:, -1:].argmax(-1)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        nxt = model(nxt, cache=cache)[:, -1:].argmax(-1)
    _sync(device)
    return batch * new_tokens / (time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------ measuring


def gemv_bytes(m: int, k: int, n: int, kind: Literal["bf16", "fp8_tensorwise", "fp8_rowwise"]) -> int:
    """Bytes a decode matmul `(m, k) @ (k, n)` must move at least: weight + activation + output + scales.

    bf16: 2 bytes per weight and activation. FP8: 1 byte per weight and activation, fp32 scales (1 + 1
    tensorwise, m + n rowwise), bf16 output in all cases.
    """
    for name, v in (("m", m), ("k", k), ("n", n)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    out = 2 * m * n
    if kind == "bf16":
        return 2 * n * k + 2 * m * k + out
    if kind == "fp8_tensorwise":
        return n * k + m * k + out + 8
    if kind == "fp8_rowwise":
        return n * k + m * k + out + 4 * (m + n)
    raise ValueError(f"kind must be 'bf16', 'fp8_tensorwise' or 'fp8_rowwise', got {kind!r}")


def _sync(device: torch.device | str | None) -> None:
    if device is None:
        return
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def median_ms(fn: Callable[[], object], *, reps: int = 5, warmup: int = 1,
              device: torch.device | str | None = None) -> float:
    """Median wall time of `fn()` in milliseconds, synchronizing `device` (cuda/mps) around each call."""
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps must be >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")
    return 1e3 * median_seconds(fn, iters=reps, warmup=warmup, sync=lambda: _sync(device))


def copy_bandwidth(nbytes: int = 64 * 2**20, *, device: torch.device | str = "cpu", reps: int = 5) -> float:
    """Memory bandwidth in GB/s (10**9 B/s) from a `copy_` of `nbytes`: each copy reads and writes `nbytes`,
    so the figure counts `2 * nbytes` moved per copy. Synchronizes cuda and mps.

    The memory-bound floor of a decode matmul is then `gemv_bytes(...) / copy_bandwidth()` (chapter 6).
    """
    if not isinstance(nbytes, int) or nbytes < 1:
        raise ValueError(f"nbytes must be a positive int, got {nbytes!r}")
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=reps, warmup=2, device=device)
    return 2 * nbytes / (ms / 1e3) / 1e9
