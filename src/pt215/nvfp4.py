"""NVFP4 from first principles: a vectorized torch reference quantizer (chapter 5).

NVFP4 stores each element as a 4-bit E2M1 float (two per byte, element ``2i`` in the low nibble), one
``float8_e4m3fn`` scale per 16 consecutive elements along the last dimension, and one float32 scale for the
whole tensor. A value is ``e2m1 * float(e4m3_scale) * per_tensor_scale``.

:func:`quantize` is bit-exact with ``torchao.prototype.mx_formats.NVFP4Tensor.to_nvfp4(x,
per_tensor_scale=g)`` (same ``qdata``, ``scale`` and ``per_tensor_scale``; tested in tests/test_nvfp4.py).
:func:`to_blocked` / :func:`from_blocked` implement the ``SWIZZLE_32_4_4`` scale layout (128x4 tiles) that
cuBLAS / NVGEMM expect for ``torch.nn.functional.scaled_mm`` with ``ScalingType.BlockWise1x16``.
:func:`fp8_roundtrip` is the FP8 (e4m3, tensorwise or rowwise) comparison used in the error analysis, through
:func:`pt215.fp8.quantize`. :func:`scaled_mm` is the two-level NVFP4 GEMM call; :func:`scaled_mm_foldable` is the
same product written as the pattern 2.15's Inductor folds into NVGEMM's output scale, and
:func:`post_grad_scale_fold` shows that fold on fake CUDA tensors, without a GPU.
:func:`w4a4` simulates what the NVFP4 GEMM computes on a whole model: weights *and* the activations entering
each GEMM quantized (W4A4), every product then taken in float32 (chapter 5, notebook 5.2).
:func:`layout_figure` draws the format: the E2M1 and E4M3 bit fields and one block of 16 with its scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pt215 import fp8

__all__ = [
    "BLOCK",
    "E2M1_GRID",
    "E2M1_MAX",
    "E4M3_MAX",
    "E4M3_TINY",
    "NVFP4Tensor",
    "quantize",
    "roundtrip",
    "per_tensor_scale",
    "e2m1_encode",
    "e2m1_decode",
    "pack",
    "unpack",
    "to_blocked",
    "from_blocked",
    "bits_per_element",
    "fp8_roundtrip",
    "mm_operands",
    "scaled_mm",
    "scaled_mm_foldable",
    "post_grad_scale_fold",
    "W4A4",
    "w4a4",
    "layout_figure",
    "DECODE_LAYER",
    "mlp_gate_up",
    "mlp_layer",
    "decode_layer_gemms",
    "decode_layer_operands",
    "decode_layer",
    "layer_kernels",
]

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_TINY = 2.0 ** -6  # smallest normal e4m3 value; block scales are clamped to [E4M3_TINY, E4M3_MAX]
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
"""Magnitudes of the 8 non-negative E2M1 codes 0..7; codes 8..15 are the same with the sign bit set."""

# Round-to-nearest-even thresholds between neighbouring grid points. At an exact midpoint the tie goes to
# the even code (0, 2, 4, 6 = 0.0, 1.0, 2.0, 4.0): ties at 0.25, 1.25, 2.5, 5 round down; 0.75, 1.75, 3.5 up.
_DOWN = (0.25, 1.25, 2.5, 5.0)
_UP = (0.75, 1.75, 3.5)
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """4-bit E2M1 codes (uint8, one per element) of float32 ``x``, rounding to nearest even.

    Magnitudes above 6 saturate to code 7 (6.0). The sign bit (bit 3) follows ``signbit(x)``, so ``-0.0`` and
    small negatives that round to zero give code 8 (negative zero), as torchao does. NaN maps to code 7 with its
    sign bit (torchao: also saturates), but :func:`quantize` rejects NaN before it gets here.
    """
    a = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for t in _DOWN:
        code += a > t
    for t in _UP:
        code += a >= t
    code = torch.where(torch.isnan(a), torch.full_like(code, 7), code)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of 4-bit codes (uint8 0..15)."""
    grid = E2M1_GRID.to(codes.device)
    mag = grid[(codes & 7).long()]
    return torch.where((codes & 8).bool(), -mag, mag)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dim: element ``2i`` in the low nibble, ``2i+1`` in the high."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack needs an even last dimension, got {codes.shape[-1]}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack`: (..., K/2) uint8 -> (..., K) codes."""
    lo, hi = packed & 0x0F, packed >> 4
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def per_tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """The global scale ``amax(|x|) / (448 * 6)`` (float32, 0-dim): the largest block then uses the top of
    both the e4m3 scale range and the e2m1 element range. Same formula as torchao's ``per_tensor_amax_to_scale``.
    """
    return x.abs().amax().float() / (E4M3_MAX * E2M1_MAX)


@dataclass
class NVFP4Tensor:
    """An NVFP4-quantized tensor of logical shape ``shape`` (last dim K, a multiple of 16).

    - ``qdata``: uint8 ``(*shape[:-1], K/2)``, two E2M1 codes per byte, low nibble first.
    - ``scale``: float8_e4m3fn ``(*shape[:-1], K/16)``, row-major (not swizzled; see :func:`to_blocked`).
    - ``per_tensor_scale``: float32 0-dim.
    """

    qdata: torch.Tensor
    scale: torch.Tensor
    per_tensor_scale: torch.Tensor
    orig_dtype: torch.dtype = torch.float32

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.qdata.shape[:-1], self.qdata.shape[-1] * 2))

    @property
    def nbytes(self) -> int:
        """Bytes stored: packed data + e4m3 scales + the fp32 per-tensor scale."""
        return self.qdata.numel() + self.scale.numel() + 4

    def codes(self) -> torch.Tensor:
        """Unpacked 4-bit codes, shape ``self.shape``."""
        return unpack(self.qdata)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``e2m1 * (per_tensor_scale * float(scale))`` in float32, then cast to ``dtype`` (default: the input's).

        Same operation order as torchao (``data_f32 * (g * s)``), so results are bit-identical too.
        """
        vals = e2m1_decode(self.codes())
        k = vals.shape[-1]
        s = self.per_tensor_scale * self.scale.float()
        out = (vals.view(*vals.shape[:-1], k // BLOCK, BLOCK) * s[..., None]).view(vals.shape)
        return out.to(dtype or self.orig_dtype)


def _check(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16 to quantize to NVFP4, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] % BLOCK:
        raise ValueError(f"{name}.shape[-1] must be a multiple of {BLOCK} (one e4m3 scale per {BLOCK} elements), "
                         f"got shape {tuple(x.shape)}; pad the last dimension first")


def quantize(x: torch.Tensor, per_tensor_scale: torch.Tensor | float | None = None, *,
             check_finite: bool = True) -> NVFP4Tensor:
    """Quantize ``x`` (float32/bf16/fp16, last dim a multiple of 16) to NVFP4 with two-level scaling.

    Algorithm (torchao's ``nvfp4_quantize``, step by step, all float32):

    1. ``g = per_tensor_scale`` or, if None, ``amax(|x|) / (448*6)``; a tensor that is all zeros gets ``g = 1``.
    2. per block of 16: ``s = e4m3(clamp(amax_block / 6 / g, 2**-6, 448))`` (round to nearest even).
    3. ``y = clamp(x * ((1/g) / float(s)), -6, 6)``, rounded to the nearest E2M1 value (ties to even).

    Edge cases: an all-zero block gets ``s = 2**-6`` and codes 0, and dequantizes to exact zeros. Values beyond
    what ``g`` allows (only possible when ``per_tensor_scale`` is passed in) saturate at ``+-6 * 448 * g``.
    NaN/inf raise ``ValueError`` when ``check_finite`` (the default); with ``check_finite=False`` they poison
    ``g`` and the result is meaningless (torchao does not check either).
    """
    _check(x)
    xf = x.float().contiguous()
    if check_finite and not torch.isfinite(xf).all():
        raise ValueError("x contains NaN or inf; NVFP4 has no encoding for them (pass check_finite=False to skip)")
    if per_tensor_scale is None:
        g = xf.abs().amax() / (E4M3_MAX * E2M1_MAX)
        if g == 0:
            g = torch.ones((), dtype=torch.float32)
    else:
        g = torch.as_tensor(per_tensor_scale, dtype=torch.float32)
        if g.numel() != 1 or not (g > 0):
            raise ValueError(f"per_tensor_scale must be one positive number, got {g}")
        g = g.reshape(())
    blocks = xf.view(*xf.shape[:-1], xf.shape[-1] // BLOCK, BLOCK)
    block_scale = blocks.abs().amax(dim=-1) / E2M1_MAX
    s8 = torch.clamp(block_scale / g, min=E4M3_TINY, max=E4M3_MAX).to(torch.float8_e4m3fn)
    recip = (1.0 / g) / s8.float()
    y = torch.clamp(blocks * recip[..., None], -E2M1_MAX, E2M1_MAX).view(xf.shape)
    return NVFP4Tensor(pack(e2m1_encode(y)), s8, g.clone(), x.dtype)


def roundtrip(x: torch.Tensor) -> torch.Tensor:
    """``quantize(x).dequantize(torch.float32)``, bit for bit, without packing the codes: the fast path for
    simulating NVFP4 on tensors that change every call (activations, :func:`w4a4`). The same float32 steps as
    :func:`quantize` (same ``g``, same e4m3 block scales, same rounding, ties to even) and as
    :meth:`NVFP4Tensor.dequantize`; NaN and inf are not checked (tests/test_nvfp4.py compares the two)."""
    _check(x)
    xf = x.float()
    g = xf.abs().amax() / (E4M3_MAX * E2M1_MAX)
    g = torch.where(g == 0, torch.ones_like(g), g)
    blocks = xf.reshape(*xf.shape[:-1], xf.shape[-1] // BLOCK, BLOCK)
    s8 = torch.clamp(blocks.abs().amax(dim=-1) / E2M1_MAX / g, min=E4M3_TINY, max=E4M3_MAX).to(torch.float8_e4m3fn)
    y = torch.clamp(blocks * ((1.0 / g) / s8.float())[..., None], -E2M1_MAX, E2M1_MAX)
    # E2M1's grid has steps 0.5 below 2, 1 below 4 and 2 up to 6: round to nearest even on each (exact in fp32)
    a = y.abs()
    mag = torch.where(a < 2, torch.round(a * 2) * 0.5, torch.where(a < 4, torch.round(a), torch.round(a * 0.5) * 2))
    vals = torch.copysign(mag, y)
    return (vals * (g * s8.float())[..., None]).reshape(xf.shape)


# --------------------------------------------------------------------------------------------- scale swizzle
def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Rearrange a ``(rows, cols)`` scale matrix into the ``SWIZZLE_32_4_4`` layout, flattened (1-D).

    Pads to ``(128*ceil(rows/128), 4*ceil(cols/4))`` with zeros, cuts it into 128x4 tiles (row-block-major,
    then column blocks), and stores each tile as 32x16: tile row ``r`` goes to ``(r % 32, 4*(r // 32) + c)``.
    Equals ``torch._higher_order_ops.flex_gemm.to_blocked`` and torchao's ``to_blocked``.
    """
    if scales.dim() != 2:
        raise ValueError(f"scales must be 2-D (rows, K/16), got shape {tuple(scales.shape)}")
    rows, cols = scales.shape
    rb, cb = -(-rows // 128), -(-cols // 4)
    padded = scales
    if (rows, cols) != (rb * 128, cb * 4):
        padded = torch.zeros((rb * 128, cb * 4), dtype=scales.dtype, device=scales.device)
        padded[:rows, :cols] = scales
    tiles = padded.view(rb, 128, cb, 4).permute(0, 2, 1, 3)
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1)


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`to_blocked`: the ``(rows, cols)`` scales (padding dropped)."""
    rb, cb = -(-rows // 128), -(-cols // 4)
    if blocked.numel() != rb * cb * 512:
        raise ValueError(f"expected {rb * cb * 512} blocked scales for ({rows}, {cols}), got {blocked.numel()}")
    tiles = blocked.reshape(rb * cb, 32, 4, 4).transpose(1, 2).reshape(rb, cb, 128, 4)
    return tiles.permute(0, 2, 1, 3).reshape(rb * 128, cb * 4)[:rows, :cols]


def bits_per_element(shape: tuple[int, ...]) -> float:
    """Storage bits per element of an NVFP4 tensor: 4 (data) + 8/16 (e4m3 scale) + 32/numel (global scale)."""
    n = 1
    for d in shape:
        n *= d
    return (n * 4 + (n // BLOCK) * 8 + 32) / n


def fp8_roundtrip(w: torch.Tensor, granularity: str = "tensorwise") -> torch.Tensor:
    """Quantize-dequantize ``w`` through float8_e4m3fn with :func:`pt215.fp8.quantize` (float32 out): the FP8
    side of chapter 5's error analysis, from the same code chapter 6 uses.

    ``"tensorwise"``: one scale ``amax / 448`` for the whole tensor. ``"rowwise"``: one scale per row of the last
    dim; a tensor with more than two dims (stacked experts ``(E, N, K)``) is viewed as ``(E*N, K)`` rows. This is
    the weight side of ``scaled_mm`` with ``ScalingType.TensorWise``/``RowWise``.
    """
    if granularity not in ("tensorwise", "rowwise"):
        raise ValueError(f"granularity must be 'tensorwise' or 'rowwise', got {granularity!r}")
    wf = w.float()
    rows = wf.reshape(-1, wf.shape[-1]) if granularity == "rowwise" else wf
    return fp8.quantize(rows, scaling=granularity).dequantize(torch.float32).reshape(wf.shape)


# ------------------------------------------------------------------------------------------------ W4A4
def _is_gemm(func: object) -> bool:
    return func in (torch.ops.aten.mm.default, torch.ops.aten._grouped_mm.default)


class _QuantizeGemmInputs(TorchDispatchMode):
    """While active: the activation operand of every ``aten.mm`` / ``aten._grouped_mm`` whose weight operand
    lives in one of ``storages`` goes through an NVFP4 round trip first (a block of 16 along K, the per-tensor
    scale from that activation's own amax, as a dynamic W4A4 recipe computes it). Counts them in ``gemms``."""

    def __init__(self, storages: set[int]) -> None:
        super().__init__()
        self.storages = storages
        self.gemms = 0
        self._last: tuple[tuple, torch.Tensor, torch.Tensor] | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        kwargs = kwargs or {}
        if _is_gemm(func) and args[1].untyped_storage().data_ptr() in self.storages:
            a = args[0]
            # q, k and v (and gate and up) read one activation: quantize it once, as a W4A4 kernel would
            # (the entry holds `a` itself, so its memory cannot be freed and reused by another tensor meanwhile)
            key = (a.untyped_storage().data_ptr(), a.storage_offset(), tuple(a.shape), tuple(a.stride()), a._version)
            if self._last is None or self._last[0] != key:
                self._last = (key, roundtrip(a).to(a.dtype), a)
            args = (self._last[1], *args[1:])
            self.gemms += 1
        return func(*args, **kwargs)


class W4A4(torch.nn.Module):
    """A model whose GEMM weights are NVFP4 round trips and whose GEMM activations are quantized to NVFP4 on the
    way in, each product then computed in float32: what an NVFP4 x NVFP4 GEMM computes, up to the order of its
    fp32 accumulation. Built by :func:`w4a4`. ``gemms`` counts the GEMMs whose inputs were quantized so far."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        from pt215.model import gemm_weights, with_weights

        self.inner = with_weights(model, lambda name, w: roundtrip(w))
        self.cfg = getattr(model, "cfg", None)
        self._storages = {w.untyped_storage().data_ptr() for _, w in gemm_weights(self.inner)}
        self.gemms = 0

    def forward(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - the wrapped model's signature
        with _QuantizeGemmInputs(self._storages) as mode:
            out = self.inner(*args, **kwargs)
        self.gemms += mode.gemms
        return out


def w4a4(model: torch.nn.Module) -> W4A4:
    """A copy of a :class:`pt215.model.DecoderLM` computing W4A4 NVFP4 (chapter 5, notebook 5.2): every GEMM
    weight (:func:`pt215.model.gemm_weights`: the attention and MLP linears, stacked experts, ``lm_head``)
    rounded through :func:`quantize`, and every activation entering one of those GEMMs rounded the same way,
    with its own per-tensor scale. The embedding, norms, router and attention's own products stay as they are,
    as in the NVFP4 recipes that quantize linear layers. It runs on any CPU; the GPU kernel computes the same
    products from the packed codes."""
    if not hasattr(model, "layers") or not hasattr(model, "lm_head"):
        raise ValueError("model must be a pt215.model.DecoderLM")
    return W4A4(model)


# ------------------------------------------------------------------------------------------- the picture
def layout_figure(block: torch.Tensor | None = None):
    """The NVFP4 format drawn (chapter 5, notebook 5.1): an E2M1 code's bits, an E4M3 block scale's bits, and
    one block of 16 values as :func:`quantize` stores it (its codes, its e4m3 scale, the fp32 tensor scale).
    Returns ``(fig, ax)`` in the book's style; end the cell with ``pt215.figures.show``."""
    from pt215.diagrams import box, canvas, note

    x = (torch.randn(16, generator=torch.Generator().manual_seed(1)) if block is None
         else torch.as_tensor(block, dtype=torch.float32))
    if x.numel() != BLOCK:
        raise ValueError(f"block must hold {BLOCK} values (one NVFP4 block), got {x.numel()}")
    q = quantize(x.reshape(1, BLOCK))
    codes = q.codes()[0].tolist()
    fig, ax = canvas(7.4, 4.4, xlim=(0, 17), ylim=(0, 10.2))

    def fields(y: float, title: str, parts: list[tuple[str, int, str]], bits: str, value: str) -> None:
        note(ax, 0.1, y + 1.25, title, ha="left", fontsize=9)
        pos = 0.1
        for name, n, tone in parts:
            for b in range(n):
                box(ax, pos + b * 0.9, y, 0.9, 0.8, bits[0], fill=tone, rounded=False, alpha=0.4, fontsize=10)
                bits = bits[1:]
            note(ax, pos + n * 0.45, y - 0.35, name, fontsize=8)
            pos += n * 0.9
        note(ax, pos + 0.3, y + 0.4, value, ha="left", fontsize=9)

    c = codes[int(torch.argmax(x.abs()))]
    fields(8.3, "E2M1 element (4 bits): sign, 2 exponent bits (bias 1), 1 mantissa bit",
           [("s", 1, "vermillion"), ("exp", 2, "blue"), ("m", 1, "green")], f"{c:04b}",
           f"code {c} = {e2m1_decode(torch.tensor(c, dtype=torch.uint8)).item():+g}")
    sbits = f"{int(q.scale.view(torch.uint8).item()):08b}"
    fields(5.6, "E4M3 block scale (8 bits): sign, 4 exponent bits (bias 7), 3 mantissa bits",
           [("s", 1, "vermillion"), ("exponent", 4, "blue"), ("mantissa", 3, "green")], sbits,
           f"= {q.scale.float().item():g}: one scale s per 16 elements")
    note(ax, 0.1, 3.5, f"One block: 16 codes (8 bytes), its scale s = {q.scale.float().item():g} (e4m3) and the "
         f"tensor's g = {q.per_tensor_scale.item():.3g} (fp32):  x = e2m1 * s * g", ha="left", fontsize=9)
    for i, code in enumerate(codes):
        value = e2m1_decode(torch.tensor(code, dtype=torch.uint8)).item()
        box(ax, 0.1 + i * 1.05, 1.9, 1.05, 0.9, f"{code}", fill="sky" if code < 8 else "orange", rounded=False,
            alpha=0.5, fontsize=9)
        note(ax, 0.1 + i * 1.05 + 0.52, 1.5, f"{value:+g}", fontsize=7)
        if i % 2 == 0:
            note(ax, 0.1 + i * 1.05 + 1.05, 3.0, f"byte {i // 2}", fontsize=6, tone="grey")
    note(ax, 0.1, 0.7, "top: the 4-bit codes (blue positive, orange negative); below: their e2m1 values. "
         "Element 2i is the low nibble of byte i.", ha="left", fontsize=8, tone="grey")
    return fig, ax


# ------------------------------------------------------------------------------------ the NVFP4 GEMM call
def mm_operands(a: NVFP4Tensor, w: NVFP4Tensor) -> tuple[torch.Tensor, ...]:
    """The six operands of :func:`scaled_mm` for ``a @ w.T``: packed data viewed as ``float4_e2m1fn_x2``,
    swizzled (``to_blocked``) e4m3 block scales, and the two fp32 per-tensor scales (chapter 5, notebook 3)."""
    return (a.qdata.view(torch.float4_e2m1fn_x2), w.qdata.view(torch.float4_e2m1fn_x2),
            to_blocked(a.scale), to_blocked(w.scale), a.per_tensor_scale, w.per_tensor_scale)


def scaled_mm(A: torch.Tensor, B: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, ga: torch.Tensor,
              gb: torch.Tensor) -> torch.Tensor:
    """``A @ B.T`` in NVFP4 through ``torch.nn.functional.scaled_mm`` (bf16 out): two-level scaling
    (``BlockWise1x16`` swizzled ``SWIZZLE_32_4_4`` e4m3 scales, then the ``TensorWise`` fp32 scale).

    The call chapter 5's roofline notebook and ``python -m pt215.verify`` make on a Blackwell GPU; on CPU it
    raises ValueError, on ``meta``/FakeTensor ``cuda`` tensors it runs the shape and dtype checks."""
    import torch.nn.functional as F
    from torch.nn.functional import ScalingType, SwizzleType

    two_level = [ScalingType.BlockWise1x16, ScalingType.TensorWise]
    swz = [SwizzleType.SWIZZLE_32_4_4, SwizzleType.NO_SWIZZLE]
    return F.scaled_mm(A, B.t(), scale_a=[sa, ga], scale_recipe_a=two_level, scale_b=[sb, gb],
                       scale_recipe_b=two_level, swizzle_a=swz, swizzle_b=swz, output_dtype=torch.bfloat16)


def scaled_mm_foldable(A: torch.Tensor, B: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, ga: torch.Tensor,
                       gb: torch.Tensor) -> torch.Tensor:
    """The product of :func:`scaled_mm`, written as the pattern 2.15's Inductor can hand to NVGEMM: the
    single-level ``torch._scaled_mm`` (e4m3 block scales only, bf16 out) times the 0-D fp32 ``ga * gb``.

    Under ``max_autotune`` with ``NVGEMM`` among ``max_autotune_gemm_backends``, the post-grad pass
    ``_fold_scaled_mm_output_scale`` (``torch/_inductor/fx_passes/post_grad.py``) moves that multiply into the
    ``_scaled_mm`` node, whose lowering then offers NVGEMM's block-scaled kernel with the scale as its alpha
    (chapter 5, notebook 3; :func:`post_grad_scale_fold` shows the rewrite on fake CUDA tensors).
    """
    return torch._scaled_mm(A, B.t(), sa, sb, out_dtype=torch.bfloat16) * (ga * gb)


def post_grad_scale_fold(fn, operands: tuple[torch.Tensor, ...], *, max_autotune: bool = True,
                         backends: str = "ATEN,TRITON,NVGEMM") -> dict:
    """Trace ``fn(*operands)`` on fake CUDA tensors and apply the post-grad pattern pass that holds 2.15's
    scaled-mm output-scale fold, under the given Inductor settings; no GPU needed (chapter 5, notebook 3).

    Returns ``{"before": [...], "after": [...], "folded": n, "scale_result": bool}``: the aten ops of the
    graph before and after the pass, how many multiplies were folded, and whether a ``_scaled_mm`` node now
    carries ``scale_result``. This runs Inductor's own pattern and its checks (``_can_fold_scaled_mm_output_scale``:
    max-autotune, NVGEMM enabled, fp4 operands with e4m3 scales, a 0-D fp32 CUDA scale, no bias, no
    ``scale_result``, no fast accumulation, and no pointwise chain to the output that epilogue fusion would take);
    it uses Inductor internals (``pass_patterns[1]``), which may move in later releases.
    """
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.fx_passes import post_grad
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.operator_schemas import normalize_function

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not all(isinstance(t, torch.Tensor) for t in operands):
        raise TypeError("operands must be a tuple of tensors (e.g. mm_operands(a, w))")

    def ops(gm: torch.fx.GraphModule) -> list[str]:
        return [str(n.target).removeprefix("aten.") for n in gm.graph.nodes if n.op == "call_function"]

    with FakeTensorMode():
        fake = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in operands]
        gm = make_fx(fn, decomposition_table=select_decomp_table())(*fake)  # as Inductor decomposes
        before = ops(gm)
        counters["inductor"]["scaled_mm_output_scale_fused"] = 0
        with inductor_config.patch(max_autotune=max_autotune, max_autotune_gemm_backends=backends):
            post_grad.pass_patterns[1].apply(gm.graph)
        gm.graph.lint()
        folded = counters["inductor"]["scaled_mm_output_scale_fused"]
    carries = False
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten._scaled_mm.default:
            kw = normalize_function(n.target, n.args, n.kwargs, normalize_to_only_use_kwargs=True).kwargs
            carries |= kw["scale_result"] is not None
    return {"before": before, "after": ops(gm), "folded": folded, "scale_result": carries}


# ------------------------------------------------------------------------------------------ a decode layer

DECODE_LAYER = {"q": 128, "k": 32, "v": 32, "o": 128, "gate": 256, "up": 256, "down": 128}
"""Output width N of each of a decode layer's seven GEMMs, all over K = 128 (chapter 5, notebook 5): a small
Llama-style layer, since the graph and the generated code per GEMM do not depend on the sizes."""


def decode_layer_gemms(*t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The seven NVFP4 products of one decode layer, each :func:`scaled_mm_foldable` (6 operands per GEMM)."""
    if not t or len(t) % 6:
        raise ValueError(f"decode_layer_gemms takes 6 operands per GEMM, got {len(t)}")
    return tuple(scaled_mm_foldable(*t[i:i + 6]) for i in range(0, len(t), 6))


def decode_layer_operands(rows: int = 16, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """The operands of :func:`decode_layer_gemms`: one activation of `rows` tokens quantized once, and one
    quantized weight per GEMM of :data:`DECODE_LAYER` (seeded; :func:`mm_operands` per GEMM)."""
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive int, got {rows!r}")
    torch.manual_seed(seed)
    a = quantize(torch.randn(rows, 128))
    operands: list[torch.Tensor] = []
    for n in DECODE_LAYER.values():
        operands.extend(mm_operands(a, quantize(torch.randn(n, 128))))
    return tuple(operands)


def mlp_gate_up(*t: torch.Tensor) -> torch.Tensor:
    """The first half of a real decode MLP in NVFP4: ``silu(gate) * up``, each a :func:`scaled_mm_foldable`
    (12 operands: the gate GEMM's six, then the up GEMM's). Its output feeds the down projection, so the scale
    multiplies reach it through pointwise ops only (chapter 5, notebook 5.5)."""
    if len(t) != 12:
        raise ValueError(f"mlp_gate_up takes the 6 operands of the gate GEMM and the 6 of the up GEMM, got {len(t)}")
    return torch.nn.functional.silu(scaled_mm_foldable(*t[:6])) * scaled_mm_foldable(*t[6:])


def mlp_layer() -> tuple[object, tuple[torch.Tensor, ...]]:
    """`(mlp_gate_up, operands)`: the gate and up GEMMs of :data:`DECODE_LAYER` on one activation, the target
    `pt215.inductor_code.generated_code` compiles beside :func:`decode_layer`."""
    ops = decode_layer_operands()
    names = list(DECODE_LAYER)
    gate, up = names.index("gate"), names.index("up")
    return mlp_gate_up, (*ops[6 * gate:6 * gate + 6], *ops[6 * up:6 * up + 6])


def decode_layer() -> tuple[object, tuple[torch.Tensor, ...]]:
    """`(decode_layer_gemms, decode_layer_operands())`: the target `pt215.inductor_code.generated_code` compiles."""
    return decode_layer_gemms, decode_layer_operands()


def layer_kernels(pdl: str, backends: str = "ATEN,TRITON,NVGEMM") -> list[str]:
    """The CUDA kernels one call of the compiled decode layer launches on this GPU, from the profiler, with
    ``nvgemm_pdl=pdl`` ("0", "1" or "auto"); needs a CUDA GPU (chapter 5, notebook 5, and ``pt215.verify``)."""
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    if pdl not in ("0", "1", "auto"):
        raise ValueError(f"pdl must be '0', '1' or 'auto', got {pdl!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("layer_kernels needs a CUDA GPU (the kernels are counted by the profiler)")
    operands = [t.cuda() for t in decode_layer_operands()]
    torch._dynamo.reset()
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends=backends, nvgemm_pdl=pdl):
        compiled = torch.compile(decode_layer_gemms)
        compiled(*operands)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            compiled(*operands)
            torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]

