"""FP8 helpers for chapter 6, "FP8 decoding on Apple Silicon".

What is here:

- `fp8_grid`, `quantize`, `FP8Tensor.dequantize`: FP8 (`float8_e4m3fn`, `float8_e5m2`) quantization with
  tensorwise (one fp32 scale) or rowwise (one fp32 scale per row) scaling.
- `scaled_matmul`: `y = x @ w.T` with an FP8 weight, through `torch.nn.functional.scaled_mm` (the v2 API that
  CPU, CUDA and MPS all implement; `torch._scaled_mm` has no MPS kernel). `scaled_mm_path` says which path a
  device gets, and `cuda_layout_problems` lists what the CUDA kernels would reject.
- `reference_scaled_mm`: the reference path (dequantize both operands, multiply in fp32), what torch's CPU
  kernel computes; `scaled_matmul` takes it on a CPU whose kernels cannot build the FP8 matmul
  (`cpu_fp8_matmul_problem`).
- `quantize_experts`: stacked expert weights `(E, N, K)` quantized one expert at a time, for the FP8 experts
  of `pt215.moe` (routing, grouping and the expert matmuls live there).
- `FP8Linear`: an `nn.Linear` whose GEMM is W8A8 FP8 (through `scaled_mm`); `pt215.w8a8.fp8_model` converts a
  whole `pt215.model` model with it (its MoE blocks through `pt215.moe.MoEVariant("fp8")`).
- `gemv_bytes`: the bytes a decode matmul moves at least, the byte model of the chapter's decode comparisons
  (timed with `pt215.timing`, against `pt215.roofline.decode_floor_seconds`).
- `draw_scales`: notebook 6.1's picture of `scaled_mm`'s operands and their tensorwise / rowwise scales, drawn
  from `quantize`'s output.

On CPU the FP8 matmul is a slow reference path (notebook 6.1 measures how much slower than bf16): use it for
accuracy and API shape, never as a speed-up.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "FP8_DTYPES",
    "FP8Linear",
    "FP8Tensor",
    "Scaling",
    "cpu_fp8_matmul_problem",
    "draw_scales",
    "cuda_layout_problems",
    "fp8_grid",
    "gemv_bytes",
    "quantize",
    "quantize_experts",
    "reference_scaled_mm",
    "rel_error",
    "scaled_matmul",
    "scaled_mm_path",
]

FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)
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


@functools.lru_cache(maxsize=1)
def cpu_fp8_matmul_problem() -> str | None:
    """Why this CPU cannot run an FP8 matmul (None: it can). Chapter 6; `pt215.doctor` warns with it.

    On CPU, `F.scaled_mm` (v2) dequantizes both operands and multiplies in fp32 (`reference_scaled_mm`), bit
    for bit, on every CPU the book has run (upstream `_scaled_mm_cpu_v2_out` never calls oneDNN).
    `torch._scaled_mm` (v1) takes that path too, except with tensorwise (one-element) scales where torch sees
    AMX-int8 on the processor (cpuinfo's flag, with oneDNN enabled): there it hands the product to oneDNN, whose
    result differs from the reference in the last bits, and which builds its FP8 matmul only for AMX: restricted
    below it (`ONEDNN_MAX_CPU_ISA=AVX2`) the tensorwise call fails with "could not create a primitive descriptor
    for the matmul primitive". Tries `torch._scaled_mm` and `F.scaled_mm` (tensorwise and
    rowwise) once on 16 x 32 operands and names every call that fails, in one line; the answer is cached for
    the process (`cpu_fp8_matmul_problem.cache_clear()` forgets it).
    """
    e4 = torch.float8_e4m3fn
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=g).to(e4)
    b = torch.randn(16, 32, generator=g).to(e4)
    one = torch.tensor(1.0)
    tw, rw = F.ScalingType.TensorWise, F.ScalingType.RowWise
    calls = {
        "torch._scaled_mm": lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16),
        "F.scaled_mm tensorwise": lambda: F.scaled_mm(a, b.t(), one, tw, one, tw, output_dtype=torch.bfloat16),
        "F.scaled_mm rowwise": lambda: F.scaled_mm(a, b.t(), torch.ones(16, 1), rw, torch.ones(1, 16), rw,
                                                   output_dtype=torch.bfloat16),
    }
    failed: dict[str, str] = {}
    for name, call in calls.items():
        try:
            call()
        except RuntimeError as exc:
            failed[name] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not failed:
        return None
    isa = str(torch.backends.cpu.get_cpu_capability())
    verb = "fails" if len(failed) == 1 else "fail"
    return f"{', '.join(failed)} {verb} on this CPU's kernels ({isa}): {next(iter(failed.values()))}"


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


def reference_scaled_mm(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The FP8 matmul's reference path: dequantize both operands and multiply in fp32 (chapter 6).

    Takes `F.scaled_mm`'s operands (`mat_a` (M, K) and `mat_b` (K, N) in FP8, fp32 scales: 1 element each, or
    `(M, 1)` and `(1, N)`) and computes `(mat_a.float() * scale_a) @ (mat_b.float() * scale_b)`, plus `bias`,
    cast to `out_dtype`: what torch's CPU kernel computes when it does not call oneDNN (upstream
    `_scaled_mm_out_cpu_emulated`): `F.scaled_mm` on CPU, and rowwise `torch._scaled_mm`, agree with it bit for
    bit on AVX2, AVX-512 and AMX machines alike (notebook 6.1 and `tests/test_fp8.py` check it).
    """
    for name, t in (("mat_a", mat_a), ("mat_b", mat_b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype not in FP8_DTYPES:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 2-D float8_e4m3fn or float8_e5m2 tensor, got {got}")
    if mat_a.shape[1] != mat_b.shape[0]:
        raise ValueError(f"mat_a and mat_b shapes cannot be multiplied: {tuple(mat_a.shape)} and {tuple(mat_b.shape)}")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
            raise ValueError(f"{name} must be a float32 tensor, got {getattr(s, 'dtype', type(s).__name__)}")
    y = (mat_a.contiguous().float() * scale_a) @ (mat_b.contiguous().float() * scale_b)
    if bias is not None:
        y = y + bias
    return y.to(out_dtype)


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
    `(M, 1)` and `(1, N)`, contiguous, as CPU, CUDA and MPS all require; `out_dtype` goes to the kernel as it
    is (2.15's CUDA rowwise check accepts bf16, fp16 and fp32 outputs). On a CUDA GPU older than sm_89 it
    dequantizes instead (see `scaled_mm_path`). On a CPU whose kernels cannot build the FP8 matmul
    (`cpu_fp8_matmul_problem` is not None) a failing call gives the reference path's result
    (`reference_scaled_mm`, what the CPU kernel computes elsewhere) instead of an error.
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
    try:
        return F.scaled_mm(xq.data, w.data.t(), xq.scale, recipe, sw, recipe, bias=bias, output_dtype=out_dtype)
    except RuntimeError:
        if x.device.type != "cpu" or cpu_fp8_matmul_problem() is None:
            raise  # not this CPU's missing kernel: a real error
    return reference_scaled_mm(xq.data, w.data.t(), xq.scale, sw, bias=bias, out_dtype=out_dtype)


# ------------------------------------------------------------------------------------------ FP8 layer


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


# ------------------------------------------------------------------------------------------ decode bytes


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


# ------------------------------------------------------------------------------------------ the picture


def draw_scales(x: torch.Tensor, w: torch.Tensor):
    """Notebook 6.1's picture of `F.scaled_mm`'s operands and scales, drawn from `quantize`'s real output.

    Two panels, tensorwise above rowwise. Each shows the activation `x` (M, K) and the weight `w` (N, K) as
    grids coloured by how much of e4m3's range each FP8 code uses (`|code| / 448`), with their fp32 scales
    beside them: one per operand (tensorwise), or one per row of `x` (`scale_a`, (M, 1)) and one per row of
    `w` (`scale_b`, passed as (1, N) because `mat_b` is `w.t()`). Returns `(fig, axes)`; end the cell with
    `pt215.figures.show`.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.patches import Rectangle

    from pt215.figures import COLORS, use_style

    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.is_floating_point():
            raise ValueError(f"{name} must be a 2-D floating-point tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x is (M, K) and w is (N, K): K differs ({x.shape[1]} vs {w.shape[1]})")
    if max(x.shape[0], w.shape[0]) > 16 or x.shape[1] > 32:
        raise ValueError("draw_scales draws a small example: at most 16 rows and K <= 32")
    use_style()
    fmax = torch.finfo(torch.float8_e4m3fn).max
    cmap = LinearSegmentedColormap.from_list("fp8_range", ["#ffffff", COLORS["blue"]])
    (m, k), n = x.shape, w.shape[0]
    fig, axes = plt.subplots(2, 1, figsize=(7.2, 5.0))
    for ax, scaling in zip(axes, ("tensorwise", "rowwise"), strict=True):
        ax.set_axis_off()
        ax.set_aspect("equal")
        left = 0.0
        for label, t, scale_name in (("activation x (M, K)", x, "scale_a"), ("weight w (N, K)", w, "scale_b")):
            q = quantize(t.float(), scaling=scaling)
            use = (q.data.float().abs() / fmax).clamp(0, 1)
            rows = t.shape[0]
            for i in range(rows):
                for j in range(k):
                    ax.add_patch(Rectangle((left + j, rows - 1 - i), 1, 1, facecolor=cmap(float(use[i, j])),
                                           edgecolor="#bbbbbb", linewidth=0.4))
            ax.text(left + k / 2, rows + 0.35, label, ha="center", va="bottom", fontsize=9)
            sx = left + k + 0.4
            scales = q.scale.reshape(-1)
            if scaling == "tensorwise":
                ax.add_patch(Rectangle((sx, 0), 3.4, rows, facecolor=COLORS["orange"], alpha=0.35,
                                       edgecolor="black", linewidth=0.6))
                ax.text(sx + 1.7, rows / 2, f"{float(scales[0]):.2g}", ha="center", va="center", fontsize=8)
                shape = "1 value"
            else:
                for i in range(rows):
                    ax.add_patch(Rectangle((sx, rows - 1 - i), 3.4, 1, facecolor=COLORS["orange"], alpha=0.35,
                                           edgecolor="black", linewidth=0.6))
                    ax.text(sx + 1.7, rows - 0.5 - i, f"{float(scales[i]):.2g}", ha="center", va="center",
                            fontsize=7)
                shape = "(M, 1)" if scale_name == "scale_a" else "(1, N) as mat_b = w.t()"
            ax.text(sx + 1.7, -0.3, f"{scale_name}: {shape}", ha="center", va="top", fontsize=7.5)
            left = sx + 5.6
        ax.set_xlim(-0.3, left)
        ax.set_ylim(-1.3, max(m, n) + 1.3)
        title = ("tensorwise: one fp32 scale per operand; the quiet rows use little of e4m3's range"
                 if scaling == "tensorwise" else
                 "rowwise: one scale per token row of x and per output row of w; every row fills the range\n"
                 "y[i, j] = scale_a[i] * scale_b[j] * sum over k of x8[i, k] * w8[j, k]")
        ax.set_title(title, fontsize=9.5)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, 1))
    cbar = fig.colorbar(sm, ax=axes, orientation="horizontal", fraction=0.04, pad=0.04)
    cbar.set_label("|FP8 code| / 448: share of e4m3's range a value uses")
    return fig, axes
