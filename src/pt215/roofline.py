"""The decode roofline: bytes and FLOPs per decode step, and the measurements to compare them with (chapters 5, 6).

One decode step of a batch of ``B`` sequences at context length ``S`` must read every weight once and each
sequence's KV cache once::

    bytes(B, S) = W_fmt + B * S * kv_bytes_per_token            flops(B, S) ~ 2 * P * B + 4 * B * S * L * H * Dh
    tokens/s   <= B / max(bytes / BW, flops / PEAK)

``W_fmt`` depends on the weight format (:data:`FORMATS`: bytes per element and scale overhead). Decode is
*weight-bound* while ``W_fmt`` dominates ``bytes`` and ``bytes / BW`` dominates ``flops / PEAK``.
:func:`decode_floor_seconds` is the book's one decode floor: a step's bytes divided by the *read* bandwidth
(:func:`read_bandwidth`), since decode reads its weights and writes almost nothing.
:func:`copy_bandwidth` (the book's byte convention), :func:`read_bandwidth`, :func:`measure_matmul_flops` and
:func:`measure_decode` (the book's decode tokens/s) give the measured
numbers to put next to the formulas -- always measure them in the same run (rule 5 of the book);
:func:`measure_decode_roofline` measures all of them interleaved, round-robin, in one call.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from pt215.model import DecoderLM, KVCache, ModelConfig
from pt215.timing import interleaved_medians, median_seconds, time_samples

__all__ = [
    "FORMATS",
    "WeightFormat",
    "gemm_param_shapes",
    "weight_bytes",
    "kv_bytes_per_token",
    "decode_step_bytes",
    "decode_step_flops",
    "predicted_tokens_per_s",
    "decode_floor_seconds",
    "copy_bandwidth",
    "copy_step",
    "read_step",
    "read_bandwidth",
    "measure_matmul_flops",
    "measure_decode",
    "decode_step_fn",
    "measure_decode_roofline",
    "expected_active_experts",
]


@dataclass(frozen=True)
class WeightFormat:
    """Storage cost of one weight format: ``bytes_per_elem`` plus per-block, per-row and per-tensor scales."""

    name: str
    bytes_per_elem: float
    block: int = 0  # elements per block scale (0 = none)
    block_scale_bytes: int = 0
    row_scale_bytes: int = 0
    tensor_scale_bytes: int = 0

    def nbytes(self, rows: int, cols: int) -> float:
        n = rows * cols
        b = n * self.bytes_per_elem + rows * self.row_scale_bytes + self.tensor_scale_bytes
        if self.block:
            b += (n // self.block) * self.block_scale_bytes
        return b


FORMATS: dict[str, WeightFormat] = {
    "fp32": WeightFormat("fp32", 4.0),
    "bf16": WeightFormat("bf16", 2.0),
    "fp8-tensorwise": WeightFormat("fp8-tensorwise", 1.0, tensor_scale_bytes=4),
    "fp8-rowwise": WeightFormat("fp8-rowwise", 1.0, row_scale_bytes=4),
    "nvfp4": WeightFormat("nvfp4", 0.5, block=16, block_scale_bytes=1, tensor_scale_bytes=4),
}


def _fmt(fmt: str | WeightFormat) -> WeightFormat:
    if isinstance(fmt, WeightFormat):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {sorted(FORMATS)}, got {fmt!r}")
    return FORMATS[fmt]


def gemm_param_shapes(cfg: ModelConfig) -> list[tuple[str, int, int, int]]:
    """``(name, count, rows, cols)`` of the weights one decode step multiplies with (per layer x n_layers).

    For an MoE config the expert weights are listed once per expert (``count = n_layers * moe_experts``).
    """
    d, hd, L = cfg.d_model, cfg.head_dim, cfg.n_layers
    out = [("wq", L, cfg.n_heads * hd, d), ("wk", L, cfg.n_kv_heads * hd, d), ("wv", L, cfg.n_kv_heads * hd, d),
           ("wo", L, d, cfg.n_heads * hd)]
    if cfg.is_moe:
        f, e = cfg.moe_ffn_hidden, cfg.moe_experts
        out += [("expert.w1", L * e, f, d), ("expert.w3", L * e, f, d), ("expert.w2", L * e, d, f)]
    else:
        f = cfg.ffn_hidden
        out += [("w1", L, f, d), ("w3", L, f, d), ("w2", L, d, f)]
    out.append(("lm_head", 1, cfg.vocab_size, d))
    return out


def expected_active_experts(cfg: ModelConfig, batch: int) -> float:
    """Expected distinct experts per layer hit by ``batch`` tokens with uniform top-k routing:
    ``E * (1 - (1 - k/E) ** batch)`` (E when the batch is large, k when it is 1)."""
    if not cfg.is_moe:
        return 0.0
    e, k = cfg.moe_experts, cfg.moe_top_k
    return e * (1 - (1 - k / e) ** batch)


def weight_bytes(cfg: ModelConfig, fmt: str | WeightFormat = "bf16", *, batch: int = 1,
                 other_bytes_per_elem: int = 2) -> float:
    """Bytes of weights one decode step reads: GEMM weights in ``fmt`` (only the experts the batch activates,
    see :func:`expected_active_experts`), plus RMSNorm weights, the router and ``batch`` embedding rows in
    ``other_bytes_per_elem`` (bf16 by default)."""
    f = _fmt(fmt)
    total = 0.0
    for name, count, rows, cols in gemm_param_shapes(cfg):
        if name.startswith("expert."):
            count = cfg.n_layers * expected_active_experts(cfg, batch)
        total += count * f.nbytes(rows, cols)
    other = (2 * cfg.n_layers + 1) * cfg.d_model + batch * cfg.d_model
    if cfg.is_moe:
        other += cfg.n_layers * cfg.moe_experts * cfg.d_model
    return total + other * other_bytes_per_elem


def kv_bytes_per_token(cfg: ModelConfig, kv_bytes_per_elem: float = 2) -> float:
    """KV-cache bytes per token of context per sequence: ``2 * L * H_kv * Dh * bytes``."""
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * kv_bytes_per_elem


def decode_step_bytes(cfg: ModelConfig, fmt: str | WeightFormat = "bf16", *, batch: int = 1, context: int = 0,
                      kv_bytes_per_elem: float = 2) -> float:
    """Bytes one decode step moves: weights once + every sequence's KV cache (``batch * context`` tokens)."""
    return weight_bytes(cfg, fmt, batch=batch) + batch * context * kv_bytes_per_token(cfg, kv_bytes_per_elem)


def decode_step_flops(cfg: ModelConfig, *, batch: int = 1, context: int = 0) -> float:
    """FLOPs of one decode step: ``2 * active GEMM params * batch`` + attention ``4 * batch * context * L * H * Dh``."""
    p = 0.0
    for name, count, rows, cols in gemm_param_shapes(cfg):
        if name.startswith("expert."):
            count = cfg.n_layers * cfg.moe_top_k  # each token uses k experts
        p += count * rows * cols
    return 2 * p * batch + 4 * batch * context * cfg.n_layers * cfg.n_heads * cfg.head_dim


def decode_floor_seconds(nbytes: float, bandwidth: float) -> float:
    """The book's one decode floor (chapters 5, 6): ``nbytes / bandwidth`` seconds, the least time a memory-bound
    step that reads ``nbytes`` can take.

    ``bandwidth`` is the **read** bandwidth in bytes/s measured in the same run (:func:`read_bandwidth`, or the
    ``"read_bw"`` of :func:`measure_decode_roofline`): decode reads its weights and KV cache and writes only a
    few activations, so a copy's rate (:func:`copy_bandwidth`, read + write) is not its limit.
    """
    for name, v in (("nbytes", nbytes), ("bandwidth", bandwidth)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be a positive number of bytes/s, got {bandwidth!r}")
    return nbytes / bandwidth


def predicted_tokens_per_s(step_bytes: float, step_flops: float, batch: int, bandwidth: float,
                           peak_flops: float = math.inf) -> float:
    """Roofline ceiling on tokens/s: ``batch / max(bytes / bandwidth, flops / peak_flops)`` (bytes/s, FLOP/s).

    The bytes term is :func:`decode_floor_seconds`; pass the read bandwidth (:func:`read_bandwidth`)."""
    return batch / max(decode_floor_seconds(step_bytes, bandwidth), step_flops / peak_flops)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def copy_bandwidth(nbytes: int = 256 * 2**20, *, device: torch.device | str = "cpu", iters: int = 7,
                   warmup: int = 2) -> float:
    """Memory bandwidth in bytes/s from ``dst.copy_(src)`` of ``nbytes`` on ``device``: median of ``iters``
    copies after ``warmup``, the device synchronized around each (:mod:`pt215.timing`).

    **The book's one byte convention:** a copy of ``nbytes`` reads ``nbytes`` and writes ``nbytes``, so it is
    counted as ``2 * nbytes`` of memory traffic -- as STREAM's Copy and CUDA's ``bandwidthTest`` count a
    device-to-device copy. A transfer of ``n`` payload bytes is itself a copy, so its payload rate is bounded by
    ``copy_bandwidth() / 2`` (chapters 1, 3). A decode step's floor uses the read bandwidth instead
    (:func:`decode_floor_seconds`, :func:`read_bandwidth`). On CPU use a buffer well above the last-level
    cache (the default is 256 MiB).
    """
    step = copy_step(nbytes, device=device)
    return 2 * nbytes / median_seconds(step, iters=_positive_int("iters", iters), warmup=warmup, device=device)


def copy_step(nbytes: int, *, device: torch.device | str = "cpu") -> Callable[[], object]:
    """One ``dst.copy_(src)`` of ``nbytes`` as a callable to time: :func:`copy_bandwidth`'s unit of work,
    counted as ``2 * nbytes`` moved."""
    _positive_int("nbytes", nbytes)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)  # touch every page before timing
    return lambda: dst.copy_(src)


def read_step(nbytes: int, *, device: torch.device | str = "cpu") -> Callable[[], object]:
    """One ``src.sum()`` over ``nbytes`` of float32 as a callable to time: :func:`read_bandwidth`'s unit of
    work, counted as ``nbytes`` read."""
    _positive_int("nbytes", nbytes)
    return torch.ones(nbytes // 4, dtype=torch.float32, device=device).sum


def read_bandwidth(nbytes: int = 256 * 2**20, *, device: torch.device | str = "cpu", iters: int = 7,
                   warmup: int = 2) -> float:
    """Read bandwidth in bytes/s: ``src.sum()`` over ``nbytes`` of float32, counted as ``nbytes`` read --
    closest to what decode does with its weights. Same loop as :func:`copy_bandwidth`."""
    step = read_step(nbytes, device=device)
    return nbytes / median_seconds(step, iters=_positive_int("iters", iters), warmup=warmup, device=device)


def measure_matmul_flops(n: int = 1024, *, dtype: torch.dtype = torch.bfloat16, repeats: int = 5) -> float:
    """Measured dense GEMM throughput (FLOP/s) for an ``n x n x n`` matmul in ``dtype``."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    return 2 * n**3 / median_seconds(lambda: a @ b, iters=repeats)


def decode_step_fn(model: DecoderLM, *, batch: int = 1, context: int = 64,
                   seed: int = 0) -> Callable[[], torch.Tensor]:
    """One decode step of ``batch`` sequences at context length ``context``, as a callable to time.

    Prefills ``context`` random tokens once (in the model's dtype, KV cache included). Each call then decodes
    one token at position ``context`` and rewinds the cache, so every call does the same work and reads the
    bytes :func:`decode_step_bytes` counts for ``(batch, context)``.
    """
    for name, v in (("batch", batch), ("context", context)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    cfg = model.cfg
    if context + 1 > cfg.max_seq_len:
        raise ValueError(f"context must be below cfg.max_seq_len={cfg.max_seq_len}, got {context}")
    param = next(model.parameters())
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size, (batch, context), generator=g).to(param.device)
    cache = KVCache(cfg, batch, context + 1, dtype=param.dtype, device=param.device)
    with torch.no_grad():
        nxt = model(prompt, cache=cache)[:, -1:].argmax(-1)

    @torch.no_grad()
    def step() -> torch.Tensor:
        cache.length = context
        return model(nxt, cache=cache)

    return step


def measure_decode(model: DecoderLM, *, batch: int = 1, context: int = 64, steps: int = 16,
                   warmup: int = 2, seed: int = 0) -> dict:
    """The book's decode tokens/s: median time of ``steps`` single-token decode steps at context ``context``
    (:func:`decode_step_fn`, same work every step), after ``warmup`` untimed ones, with the model's device
    synchronized around each step (:mod:`pt215.timing`).

    Returns ``{"tokens_per_s", "step_s", "batch", "context"}`` where ``tokens_per_s = batch / median step time``,
    the figure to compare with :func:`predicted_tokens_per_s`. The model computes in its own dtype and on its
    own device. To compare several models or batch sizes, use :func:`measure_decode_roofline`, which
    interleaves them.
    """
    step_fn = decode_step_fn(model, batch=batch, context=context, seed=seed)
    device = next(model.parameters()).device
    step = statistics.median(time_samples(step_fn, iters=_positive_int("steps", steps), warmup=warmup,
                                          device=device))
    return {"tokens_per_s": batch / step, "step_s": step, "batch": batch, "context": context}


def measure_decode_roofline(models: Mapping[str, DecoderLM], *, batches: Sequence[int] = (1, 4),
                            context: int = 64, iters: int = 15, warmup: int = 3, threads: int | None = 1,
                            bandwidth_bytes: int = 256 * 2**20, gemm_n: int = 512) -> dict:
    """Measure, interleaved round-robin in one run (:func:`pt215.timing.interleaved_medians`): memory read and
    copy bandwidth, an ``gemm_n``-cube GEMM and a decode step (:func:`decode_step_fn`) for every model in
    ``models`` (keyed by its format name in :data:`FORMATS`, e.g. ``{"fp32": m, "bf16": m_bf16}``) and every
    batch size in ``batches``.

    ``threads`` sets torch's intra-op threads for the measurement (restored afterwards); one thread keeps a
    shared machine's timings far steadier, because several threads wait for each other whenever one of them is
    descheduled. ``None`` keeps the current setting. Returns ``{"threads", "iters", "read_bw", "copy_bw"``
    (bytes/s), ``"gemm_flops"`` (FLOP/s per format), ``"decode"``: ``{(fmt, batch): {"step_s", "tokens_per_s",
    "step_bytes", "step_flops"}}}``; bytes and FLOPs per step come from :func:`decode_step_bytes` and
    :func:`decode_step_flops`.
    """
    if not isinstance(models, Mapping) or not models:
        raise ValueError(f"models must be a non-empty mapping of format name to model, got {models!r}")
    for fmt in models:
        _fmt(fmt)
    if not batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batches):
        raise ValueError(f"batches must be a non-empty sequence of positive ints, got {batches!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    fns: dict[str, Callable[[], object]] = {"read": read_step(bandwidth_bytes), "copy": copy_step(bandwidth_bytes)}
    for fmt, model in models.items():
        dtype = next(model.parameters()).dtype
        a, b = torch.randn(gemm_n, gemm_n).to(dtype), torch.randn(gemm_n, gemm_n).to(dtype)
        fns[f"gemm {fmt}"] = lambda a=a, b=b: a @ b
        for batch in batches:
            fns[f"{fmt} B={batch}"] = decode_step_fn(model, batch=batch, context=context)
    prev = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        t = interleaved_medians(fns, iters=iters, warmup=warmup)
    finally:
        torch.set_num_threads(prev)
    decode = {}
    for fmt, model in models.items():
        for batch in batches:
            step = t[f"{fmt} B={batch}"]
            decode[(fmt, batch)] = {"step_s": step, "tokens_per_s": batch / step,
                                    "step_bytes": decode_step_bytes(model.cfg, fmt, batch=batch, context=context),
                                    "step_flops": decode_step_flops(model.cfg, batch=batch, context=context)}
    return {"threads": threads if threads is not None else prev, "iters": iters,
            "read_bw": bandwidth_bytes / t["read"], "copy_bw": 2 * bandwidth_bytes / t["copy"],
            "gemm_flops": {fmt: 2 * gemm_n**3 / t[f"gemm {fmt}"] for fmt in models}, "decode": decode}
