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

A measurement on a CPU only says something about memory when the bytes it reads are not in a cache:
:func:`last_level_cache_bytes` reads the machine's last-level cache size and :func:`working_set_bytes` sizes a
working set well above it; :func:`sized_config` picks a model shape whose weights fill it, :func:`flat_model`
builds that model cheaply (its weights views into one buffer, so the bandwidth can be measured on exactly
those bytes) and :func:`twin_config` gives the same shape with cache-resident weights, the control for the
per-op cost of a step. :func:`top_level_ops` counts the aten ops a step dispatches (the profiler).
:data:`LLAMA_8B` and :data:`LLAMA_70B` and :func:`decode_estimate` turn the roofline into a production
model's decode tokens/s; :func:`decode_calculator` is the same arithmetic as a widget that computes in the
reader's browser.
"""

from __future__ import annotations

import glob
import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from pt215 import model as _model
from pt215.model import DecoderLM, KVCache, ModelConfig
from pt215.timing import interleaved_samples, median_seconds, time_samples

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
    "last_level_cache_bytes",
    "working_set_bytes",
    "sized_config",
    "twin_config",
    "flat_model",
    "top_level_ops",
    "device_cache_bytes",
    "decode_sweep",
    "plot_roofline",
    "LLAMA_8B",
    "LLAMA_70B",
    "GPU_DATASHEETS",
    "decode_estimate",
    "decode_calculator",
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


def decode_step_fn(model: DecoderLM, *, batch: int = 1, context: int = 64, seed: int = 0,
                   prefill: bool = True) -> Callable[[], torch.Tensor]:
    """One decode step of ``batch`` sequences at context length ``context``, as a callable to time.

    With ``prefill`` (the default), runs the model once over ``context`` random tokens, which fills the KV
    cache (in the model's dtype); without it, the cache is filled with seeded random values instead, which
    costs nothing on a model too large to prefill in a notebook and leaves the step's work the same. Each call
    then decodes one token at position ``context`` and rewinds the cache, so every call does the same work and
    reads the bytes :func:`decode_step_bytes` counts for ``(batch, context)``.
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
    if prefill:
        with torch.no_grad():
            nxt = model(prompt, cache=cache)[:, -1:].argmax(-1)
    else:
        for t in (*cache.k, *cache.v):
            t[:, :, :context].copy_(torch.randn(t[:, :, :context].shape, generator=g).to(t.dtype))
        cache.length = context
        nxt = prompt[:, -1:]

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


_DTYPE_FORMAT = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def _model_format(name: str, model: DecoderLM) -> str:
    if not isinstance(model, DecoderLM):
        raise ValueError(f"models[{name!r}] must be a pt215.model.DecoderLM, got {type(model).__name__}")
    dtype = next(model.parameters()).dtype
    if dtype not in _DTYPE_FORMAT:
        raise ValueError(f"models[{name!r}] computes in {dtype}; the decode measurement takes float32 or bfloat16 "
                         f"models (fmt must be one of {sorted(_DTYPE_FORMAT.values())})")
    return _DTYPE_FORMAT[dtype]


def _half_copy_step(buf: torch.Tensor) -> tuple[Callable[[], object], int]:
    """Copy the first half of the flat ``buf`` onto its second half: ``(step, bytes copied)``. The book's copy
    convention counts it as ``2 * bytes copied``. On a buffer whose two halves hold the same values (a
    :func:`flat_model`'s, or a constant one) it changes nothing."""
    flat = buf.view(-1)
    half = flat.numel() // 2
    src, dst = flat[:half], flat[half:2 * half]
    return (lambda: dst.copy_(src)), half * flat.element_size()


def measure_decode_roofline(models: Mapping[str, DecoderLM], *, batches: Sequence[int] = (1, 4),
                            context: int = 64, iters: int = 15, warmup: int = 3, threads: int | None = None,
                            bandwidth_bytes: int = 256 * 2**20, gemm_n: int = 512,
                            read_buffer: torch.Tensor | None = None, cached_bytes: int | None = None,
                            prefill: bool = True, device: torch.device | str | None = None) -> dict:
    """Measure, interleaved round-robin in one run (:func:`pt215.timing.interleaved_samples`): the read
    bandwidth, a copy (the control for it), a cache-resident read (the control that the first was not), a
    ``gemm_n``-cube GEMM per dtype (the compute roof) and a decode step (:func:`decode_step_fn`) for every model
    in ``models`` (a name, e.g. ``"fp32"`` or ``"twin"``, to a float32 or bfloat16 ``DecoderLM``) and every
    batch size in ``batches``.

    ``read_buffer`` is what the read and the copy run over: pass the weights the decode reads
    (:func:`flat_model`'s ``model.flat_weights``), so that the floor's bandwidth is that of exactly those bytes;
    without it a buffer of ``bandwidth_bytes`` is allocated. The copy moves the buffer's first half onto its
    second half (the two halves of a ``flat_model``'s buffer hold the same values, so nothing changes) and is
    counted as 2 x the bytes copied, the book's convention. ``cached_bytes`` (default: an eighth of
    :func:`last_level_cache_bytes`, at most 64 MiB) is the cache-resident read. ``threads`` sets torch's intra-op
    threads for the measurement (restored afterwards; ``None`` keeps the current setting, all cores by
    default). ``prefill=False`` fills the KV caches with random values instead of running the model over the
    context (:func:`decode_step_fn`).

    Returns ``{"threads", "iters", "read_bw", "copy_bw", "cached_read_bw"`` (bytes/s, from the medians),
    ``"read_bw_best", "copy_bw_best"`` (from the best rounds), ``"read_bytes"``, ``"cached_bytes"``,
    ``"gemm_flops"`` (FLOP/s per dtype name), ``"decode"``: ``{(name, batch): {"step_s"`` (median),
    ``"best_step_s", "tokens_per_s", "step_bytes", "step_flops", "fmt"}}}``; bytes and FLOPs per step come from
    :func:`decode_step_bytes` and :func:`decode_step_flops`. The best rounds are for checks that must hold
    under load: a stall in one round moves a median far more than it moves the best round.
    """
    if not isinstance(models, Mapping) or not models:
        raise ValueError(f"models must be a non-empty mapping of a name to a model, got {models!r}")
    formats = {name: _model_format(name, m) for name, m in models.items()}
    if not batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batches):
        raise ValueError(f"batches must be a non-empty sequence of positive ints, got {batches!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    if read_buffer is None:
        _positive_int("bandwidth_bytes", bandwidth_bytes)
        read_buffer = torch.ones(bandwidth_bytes // 4, dtype=torch.float32, device=device)
    elif not isinstance(read_buffer, torch.Tensor) or not read_buffer.is_floating_point():
        raise ValueError("read_buffer must be a floating-point tensor (e.g. a flat_model's flat_weights)")
    read_bytes = read_buffer.numel() * read_buffer.element_size()
    if cached_bytes is None:
        cached_bytes = min(64 * 2**20, max(2**18, (last_level_cache_bytes() or 32 * 2**20) // 8))
    _positive_int("cached_bytes", cached_bytes)
    copy, copied = _half_copy_step(read_buffer)
    # The order of a round: the cache-resident variants first, the variants that stream memory last. The call
    # that follows a long, all-core one is slowed on a shared machine (its threads must be scheduled again), so
    # each round begins with the cache-resident read, which nothing is concluded from.
    fns: dict[str, Callable[[], object]] = {"read cached": read_step(cached_bytes, device=read_buffer.device)}
    steps = {f"{name} B={batch}": (decode_step_bytes(model.cfg, formats[name], batch=batch, context=context),
                                   decode_step_fn(model, batch=batch, context=context, prefill=prefill))
             for name, model in models.items() for batch in batches}
    fns.update({k: fn for k, (nbytes, fn) in steps.items() if nbytes <= cached_bytes})
    for fmt in sorted(set(formats.values())):
        dtype = torch.float32 if fmt == "fp32" else torch.bfloat16
        a = torch.randn(gemm_n, gemm_n, device=read_buffer.device).to(dtype)
        b = torch.randn(gemm_n, gemm_n, device=read_buffer.device).to(dtype)
        fns[f"gemm {fmt}"] = lambda a=a, b=b: a @ b
    fns.update({k: fn for k, (nbytes, fn) in steps.items() if nbytes > cached_bytes})
    fns.update({"read": read_buffer.sum, "copy": copy})
    prev = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        samples = interleaved_samples(fns, iters=iters, warmup=warmup, device=device)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(prev)
    t = {k: statistics.median(v) for k, v in samples.items()}
    best = {k: min(v) for k, v in samples.items()}
    decode = {}
    for name, model in models.items():
        fmt = formats[name]
        for batch in batches:
            step = t[f"{name} B={batch}"]
            decode[(name, batch)] = {"step_s": step, "best_step_s": best[f"{name} B={batch}"],
                                     "tokens_per_s": batch / step, "fmt": fmt,
                                     "step_bytes": decode_step_bytes(model.cfg, fmt, batch=batch, context=context),
                                     "step_flops": decode_step_flops(model.cfg, batch=batch, context=context)}
    return {"threads": used, "iters": iters, "read_bytes": read_bytes, "cached_bytes": cached_bytes,
            "read_bw": read_bytes / t["read"], "copy_bw": 2 * copied / t["copy"],
            "read_bw_best": read_bytes / best["read"], "copy_bw_best": 2 * copied / best["copy"],
            "cached_read_bw": cached_bytes / t["read cached"],
            "gemm_flops": {fmt: 2 * gemm_n**3 / t[f"gemm {fmt}"] for fmt in sorted(set(formats.values()))},
            "decode": decode}


# ------------------------------------------------------------------------------------------ sizing to the cache
ASSUMED_LLC = 128 * 2**20
"""The last-level cache assumed when the machine does not say (:func:`working_set_bytes`): larger than most."""


def last_level_cache_bytes(sysfs: str = "/sys/devices/system/cpu") -> int | None:
    """Bytes of the CPU's last-level cache, all its instances together (Linux sysfs; else glibc's sysconf).

    Every ``cpu*/cache/index*`` of the highest level counts once per distinct set of CPUs sharing it, so a
    machine with one L3 per core complex (AMD) or per socket reports their sum: the cache all threads together
    can hold. ``None`` when the machine does not say (macOS, containers without sysfs).
    """
    levels: dict[int, dict[str, int]] = {}
    for d in glob.glob(os.path.join(sysfs, "cpu[0-9]*", "cache", "index[0-9]*")):
        try:
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(d, "size")) as f:
                size = f.read().strip()
            with open(os.path.join(d, "shared_cpu_list")) as f:
                shared = f.read().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not size:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1].upper(), 1)
        levels.setdefault(level, {})[shared] = int(size.rstrip("KMGkmg")) * unit
    if levels:
        return sum(levels[max(levels)].values())
    for name in ("SC_LEVEL4_CACHE_SIZE", "SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            value = os.sysconf(name)
        except (ValueError, OSError):
            continue
        if value and value > 0:
            return int(value)
    return None


def working_set_bytes(llc: int | None = None, *, factor: int = 4, floor: int = 256 * 2**20) -> int:
    """Bytes a CPU memory measurement should stream so that caches cannot hold them: ``factor`` times the
    last-level cache (:func:`last_level_cache_bytes`, or :data:`ASSUMED_LLC` when unknown), at least ``floor``.
    """
    _positive_int("factor", factor)
    _positive_int("floor", floor)
    if llc is None:
        llc = last_level_cache_bytes() or ASSUMED_LLC
    _positive_int("llc", llc)
    return max(floor, factor * llc)


def sized_config(nbytes: int, *, fmt: str = "fp32", n_layers: int = 8, n_heads: int = 8, n_kv_heads: int = 2,
                 context: int = 64) -> ModelConfig:
    """The smallest Llama-shaped config of the family ``d_model = 128 k``, ``ffn_hidden ~ 8/3 d_model`` (a
    multiple of 128), whose weights in ``fmt`` are at least ``nbytes`` (chapter 5's decode measurement)."""
    _positive_int("nbytes", nbytes)
    _positive_int("n_layers", n_layers)
    d = 128
    while True:
        cfg = ModelConfig(d_model=d, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                          ffn_hidden=128 * max(1, round(8 * d / 3 / 128)), max_seq_len=max(2 * context, 128))
        if weight_bytes(cfg, fmt) >= nbytes:
            return cfg
        d += 128


def twin_config(cfg: ModelConfig, *, d_model: int = 64) -> ModelConfig:
    """``cfg`` with the same layers, heads, vocabulary and context but a narrow ``d_model``: the same ops per
    decode step on weights that stay in cache, the control for a step's per-op cost (chapter 5)."""
    if d_model % cfg.n_heads or (d_model // cfg.n_heads) % 2:
        raise ValueError(f"d_model={d_model} must be a multiple of 2 * n_heads={2 * cfg.n_heads}")
    return ModelConfig(vocab_size=cfg.vocab_size, d_model=d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                       n_kv_heads=cfg.n_kv_heads, ffn_hidden=16 * max(1, round(8 * d_model / 3 / 16)),
                       max_seq_len=cfg.max_seq_len, moe_experts=cfg.moe_experts, moe_top_k=cfg.moe_top_k,
                       moe_ffn_hidden=cfg.moe_ffn_hidden)


_PATTERN = 2**20  # elements of the fill pattern of flat_model's buffer


def flat_model(cfg: ModelConfig, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               seed: int = 0, std: float = 0.02) -> DecoderLM:
    """A :class:`pt215.model.DecoderLM` of ``cfg`` for timing, built without initialising each weight: every
    parameter is a view into one flat buffer, ``model.flat_weights``, filled with a seeded Gaussian pattern of
    2**20 values repeated (standard deviation ``std``; the buffer is padded so that its two halves are equal).

    The values carry no meaning; what a decode step does with them (the ops, the bytes) is the trained model's.
    Building a model of gigabytes this way takes one pass over its memory, and :func:`measure_decode_roofline`
    can read exactly the bytes the step reads (``read_buffer=model.flat_weights``).
    """
    if dtype not in _DTYPE_FORMAT:
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
    with torch.device("meta"):
        model = DecoderLM(cfg)
    params = [(mod, name, p) for mod in model.modules() for name, p in mod.named_parameters(recurse=False)]
    total = sum(p.numel() for _, _, p in params)
    n = -(-total // (2 * _PATTERN)) * 2 * _PATTERN
    g = torch.Generator().manual_seed(seed)
    pattern = (torch.randn(_PATTERN, generator=g) * std).to(dtype).to(device)
    flat = torch.empty(n, dtype=dtype, device=device)
    flat.view(-1, _PATTERN).copy_(pattern)
    offset = 0
    for mod, name, p in params:
        view = flat[offset:offset + p.numel()].view(p.shape)
        mod._parameters[name] = torch.nn.Parameter(view, requires_grad=False)
        offset += p.numel()
    model._rope = _model._rope_cache(cfg)
    model.flat_weights = flat
    return model.eval()


def top_level_ops(fn: Callable[[], object]) -> Counter:
    """The aten ops one call of ``fn`` dispatches from Python, by name, from ``torch.profiler`` (CPU): the
    events with no enclosing aten op. A decode step's count is its per-op overhead in units of calls. The
    profiler's own C++ log lines (written to file descriptor 2 while it starts and stops) are discarded."""
    from torch.profiler import ProfilerActivity, profile

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    saved = os.dup(2)  # the profiler's C++ side logs its start and stop (and, without a GPU, an error) on fd 2
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    out: Counter = Counter()
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            out[e.name] += 1
    return out


def device_cache_bytes(device: torch.device | str = "cpu") -> int | None:
    """The last-level cache of ``device``: :func:`last_level_cache_bytes` for the CPU, the L2 for a CUDA GPU."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return last_level_cache_bytes()
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).L2_cache_size)
    return None


def decode_sweep(device: torch.device | str = "cpu", *, dtype: torch.dtype = torch.float32,
                 batches: Sequence[int] = (1, 4, 16), context: int = 64, iters: int = 6, warmup: int = 1,
                 factor: int = 4, min_bytes: int | None = None, n_layers: int = 8, gemm_n: int = 1024,
                 working_set: int | None = None) -> dict:
    """Chapter 5's decode measurement on ``device``, in one call (notebook 5.3's CPU cell, its GPU cell and
    ``python -m pt215.verify --only ch5.decode-roofline-gpu``):

    1. size a working set ``factor`` times the device's last-level cache (:func:`device_cache_bytes`), at least
       ``min_bytes`` (256 MiB on a CPU, 8 GiB on a GPU, whose eager steps need gigabytes before bytes outweigh
       launches), and a model shape whose weights fill it (:func:`sized_config`);
    2. build that model and its cache-resident twin (:func:`flat_model`, :func:`twin_config`);
    3. count the aten ops of one step of each (:func:`top_level_ops`; the twin must dispatch the same ops);
    4. time, interleaved (:func:`measure_decode_roofline`): the read of exactly the model's weight bytes, the copy
       over them, a cache-resident read, a GEMM per dtype, and a decode step of both models at every batch size.

    ``working_set`` (bytes) replaces step 1's sizing, for a quick run that does not measure memory. Returns
    :func:`measure_decode_roofline`'s dict (decode keys ``("model", B)`` and ``("twin", B)``) plus ``"cfg"``,
    ``"twin_cfg"``, ``"llc"``, ``"working_set"`` and ``"ops"`` (``{"model": Counter, "twin": Counter}``).
    """
    dev = torch.device(device)
    llc = device_cache_bytes(dev)
    if min_bytes is None:
        min_bytes = 8 * 2**30 if dev.type == "cuda" else 256 * 2**20
    ws = working_set_bytes(llc, factor=factor, floor=min_bytes) if working_set is None else \
        _positive_int("working_set", working_set)
    fmt = _DTYPE_FORMAT.get(dtype)
    if fmt is None:
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
    cfg = sized_config(ws, fmt=fmt, n_layers=n_layers, context=context)
    twin_cfg = twin_config(cfg)
    models = {"model": flat_model(cfg, dtype=dtype, device=dev), "twin": flat_model(twin_cfg, dtype=dtype, device=dev)}
    ops = {name: top_level_ops(decode_step_fn(m, batch=1, context=context, prefill=False))
           for name, m in models.items()}
    cached = min(64 * 2**20, max(2**18, (llc or 32 * 2**20) // 8))
    run = measure_decode_roofline(models, batches=batches, context=context, iters=iters, warmup=warmup,
                                  read_buffer=models["model"].flat_weights, cached_bytes=cached, prefill=False,
                                  device=None if dev.type == "cpu" else dev, gemm_n=gemm_n)
    run.update(cfg=cfg, twin_cfg=twin_cfg, llc=llc, working_set=ws, ops=ops)
    return run


def plot_roofline(ax, bandwidth: float, peak_flops: float, points: Mapping[str, Sequence[tuple[float, float]]], *,
                  label: str = "", xlim: tuple[float, float] = (0.05, 1000.0)):
    """Draw a roofline on ``ax`` (log-log): arithmetic intensity (FLOP per byte read) against FLOP/s, the
    memory roof ``bandwidth * I`` up to the ridge point ``peak_flops / bandwidth`` and the compute roof above
    it, and ``points`` (a label to a list of ``(intensity, FLOP/s)``) as markers. Returns the ridge point."""
    from pt215.figures import COLORS

    for name, v in (("bandwidth", bandwidth), ("peak_flops", peak_flops)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    ridge = peak_flops / bandwidth
    lo, hi = xlim
    xs = [lo, ridge, hi] if lo < ridge < hi else [lo, hi]
    ax.loglog(xs, [min(peak_flops, bandwidth * x) for x in xs], color=COLORS["black"], lw=1.6,
              label=label or "roofline")
    ax.axvline(ridge, color=COLORS["grey"], lw=0.8, ls=":")
    ax.annotate(f"ridge {ridge:.3g} FLOP/byte", (ridge, peak_flops), textcoords="offset points", xytext=(4, -14),
                fontsize=8, color=COLORS["grey"])
    markers = "osD^vP"
    for i, (name, pts) in enumerate(points.items()):
        if pts:
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], markers[i % len(markers)], ls="--", lw=0.8,
                      label=name)
    ax.set_xlabel("arithmetic intensity (FLOP per byte read)")
    ax.set_ylabel("FLOP/s")
    ax.set_xlim(lo, hi)
    return ridge


# ------------------------------------------------------------------------------------------- toy to production
LLAMA_8B = ModelConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
                       max_seq_len=131072)
"""Llama-3-8B's shape (sizes only; nothing is built): 8.0B parameters, 8 KV heads of 128."""
LLAMA_70B = ModelConfig(vocab_size=128256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672,
                        max_seq_len=131072)
"""Llama-3-70B's shape (sizes only): 70.6B parameters, 8 KV heads of 128."""

GPU_DATASHEETS: dict[str, dict[str, float]] = {
    "H100 SXM": {"bandwidth": 3.35e12, "bf16": 989e12, "fp8-rowwise": 1979e12, "nvfp4": 1979e12},
    "H200": {"bandwidth": 4.8e12, "bf16": 989e12, "fp8-rowwise": 1979e12, "nvfp4": 1979e12},
    "B200": {"bandwidth": 8e12, "bf16": 2.25e15, "fp8-rowwise": 4.5e15, "nvfp4": 9e15},
}
"""Memory bandwidth (bytes/s) and dense tensor-core FLOP/s per format from NVIDIA's datasheets (B200: 8 TB/s
HBM3e). H100 SXM5 and H200 have no FP4 units: their ``"nvfp4"`` entry is an assumption of this book, not a
datasheet figure (a kernel that reads the 4-bit weights as stored and computes at FP8's rate); torch's own path
there (torchao's weight-only recipe) dequantizes to bf16 and calls ``F.linear``, which saves memory, not bytes
read. Defaults for :func:`decode_estimate` and :func:`decode_calculator`, never measurements of this book."""


def decode_estimate(cfg: ModelConfig, fmt: str = "bf16", *, bandwidth: float, fraction: float = 1.0,
                    peak_flops: float = math.inf, batch: int = 1, context: int = 4096, gpus: int = 1,
                    kv_bytes_per_elem: float = 2) -> dict:
    """Decode tokens/s of ``cfg`` in ``fmt`` on ``gpus`` GPUs of ``bandwidth`` bytes/s (of which a step
    achieves ``fraction``) and ``peak_flops`` each: the roofline ceiling :func:`predicted_tokens_per_s` of
    :func:`decode_step_bytes` and :func:`decode_step_flops`, split evenly over ``gpus`` (tensor parallel, its
    communication not counted).

    Returns ``{"tokens_per_s", "per_sequence", "step_ms", "weights_gb", "kv_gb", "bound"}``; ``"bound"`` is
    ``"memory"`` or ``"compute"``, whichever term sets the step.
    """
    for name, v in (("bandwidth", bandwidth), ("peak_flops", peak_flops)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    for name, v in (("batch", batch), ("gpus", gpus)):
        _positive_int(name, v)
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise ValueError(f"context must be a non-negative int, got {context!r}")
    nbytes = decode_step_bytes(cfg, fmt, batch=batch, context=context, kv_bytes_per_elem=kv_bytes_per_elem)
    flops = decode_step_flops(cfg, batch=batch, context=context)
    bw, peak = gpus * fraction * bandwidth, gpus * peak_flops
    tps = predicted_tokens_per_s(nbytes, flops, batch, bw, peak)
    weights = weight_bytes(cfg, fmt, batch=batch)
    return {"tokens_per_s": tps, "per_sequence": tps / batch, "step_ms": 1e3 * batch / tps,
            "weights_gb": weights / 1e9, "kv_gb": (nbytes - weights) / 1e9,
            "bound": "memory" if nbytes / bw >= flops / peak else "compute"}


def _calculator_models() -> dict[str, dict[str, float]]:
    """What the calculator's JavaScript needs of each model: GEMM elements and tensors per format, other
    elements, KV elements per token, FLOPs per token and per token of context."""
    out = {}
    for name, cfg in (("Llama-3 8B", LLAMA_8B), ("Llama-3 70B", LLAMA_70B)):
        shapes = gemm_param_shapes(cfg)
        out[name] = {
            "elems": float(sum(c * r * k for _, c, r, k in shapes)),
            "tensors": float(sum(c for _, c, _, _ in shapes)),
            "rows": float(sum(c * r for _, c, r, _ in shapes)),
            "other": float((2 * cfg.n_layers + 1) * cfg.d_model), "embed_row": float(cfg.d_model),
            "kv_elems": kv_bytes_per_token(cfg, 1),
            "flops_tok": decode_step_flops(cfg, batch=1, context=0),
            "flops_ctx": 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim,
        }
    return out


_CALC_JS = r"""
(function (root) {
  // pt215.roofline.decode_estimate, in the page: FORMATS' bytes per element and scales, then the roofline.
  var F = {"bf16": [2, 0, 0, 0, 0], "fp8-rowwise": [1, 0, 0, 4, 0], "nvfp4": [0.5, 16, 1, 0, 4]};
  function estimate(m, fmt, bw, frac, peak, batch, ctx, gpus, kvb) {
    var f = F[fmt], w = m.elems * f[0] + m.rows * f[3] + m.tensors * f[4];
    if (f[1]) w += Math.floor(m.elems / f[1]) * f[2];  // per-tensor floor is a few bytes: the sum is exact enough
    w += (m.other + batch * m.embed_row) * 2;
    var bytes = w + batch * ctx * m.kv_elems * kvb, flops = batch * m.flops_tok + batch * ctx * m.flops_ctx;
    var tb = bytes / (gpus * frac * bw), tf = flops / (gpus * peak), t = Math.max(tb, tf);
    return {tokens_per_s: batch / t, per_sequence: 1 / t, step_ms: 1e3 * t, weights_gb: w / 1e9,
            kv_gb: (bytes - w) / 1e9, bound: tb >= tf ? "memory" : "compute"};
  }
  root.pt215DecodeEstimate = estimate;
})(typeof window !== "undefined" ? window : globalThis);
"""


def decode_calculator(gpu: str = "B200", fraction: float = 0.7, batch: int = 1, context: int = 4096):
    """A form that turns the decode roofline into tokens/s for Llama-3 8B and 70B, computed in the reader's
    browser (no kernel needed): model, weight format, bandwidth, the fraction of it a step achieves, peak
    FLOP/s, batch, context and GPUs, each the reader's; bandwidth and peak default to :data:`GPU_DATASHEETS`, and
    ``fraction``'s default, 0.7, is a placeholder (neither measured nor a datasheet figure). The arithmetic
    is :func:`decode_estimate`'s (tests/test_roofline.py runs both on the same inputs).
    """
    from pt215.widgets import _html, _uid

    if gpu not in GPU_DATASHEETS:
        raise ValueError(f"gpu must be one of {sorted(GPU_DATASHEETS)}, got {gpu!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    _positive_int("batch", batch)
    _positive_int("context", context)
    sheet = GPU_DATASHEETS[gpu]
    data = json.dumps({"models": _calculator_models(), "gpus": GPU_DATASHEETS})
    uid = _uid("decode", data + f"{gpu},{fraction},{batch},{context}")

    def field(key: str, label: str, value: object, step: str = "any") -> str:
        return (f'<label>{label} <input type="number" id="{uid}-{key}" value="{value}" step="{step}" '
                f'min="0" style="width:7em"></label>')

    models = "".join(f'<option value="{m}">{m}</option>' for m in _calculator_models())
    fmts = "".join(f'<option value="{f}"{" selected" if f == "nvfp4" else ""}>{f}</option>'
                   for f in ("bf16", "fp8-rowwise", "nvfp4"))
    gpus = "".join(f'<option value="{g}"{" selected" if g == gpu else ""}>{g}</option>' for g in GPU_DATASHEETS)
    return _html(f"""<div class="pt215-widget" id="{uid}">
<label>model <select id="{uid}-model">{models}</select></label>
<label>weights <select id="{uid}-fmt">{fmts}</select></label>
<label>datasheet <select id="{uid}-gpu">{gpus}</select></label><br>
{field("bw", "bandwidth TB/s", sheet["bandwidth"] / 1e12)}
{field("frac", "achieved fraction", fraction)}
{field("peak", "peak TFLOP/s", sheet["nvfp4"] / 1e12)}<br>
{field("batch", "batch", batch, "1")}
{field("ctx", "context", context, "1")}
{field("n", "GPUs (tensor parallel)", 1, "1")}
<pre id="{uid}-out" aria-live="polite"></pre>
<script>{_CALC_JS}(function () {{
  var d = {data}, q = function (k) {{ return document.getElementById("{uid}-" + k); }};
  function sheet() {{  // a new datasheet or format fills bandwidth and peak with that datasheet's figures
    var s = d.gpus[q("gpu").value];
    q("bw").value = s.bandwidth / 1e12; q("peak").value = s[q("fmt").value] / 1e12; show();
  }}
  function show() {{
    var v = ["bw", "frac", "peak", "batch", "ctx", "n"].map(function (k) {{ return Number(q(k).value); }});
    if (v.some(function (x) {{ return !(x > 0); }}) || v[1] > 1) {{
      q("out").textContent = "ValueError: every field must be a positive number, the fraction at most 1"; return;
    }}
    var r = window.pt215DecodeEstimate(d.models[q("model").value], q("fmt").value, v[0] * 1e12, v[1],
                                       v[2] * 1e12, Math.round(v[3]), Math.round(v[4]), Math.round(v[5]), 2);
    q("out").textContent = "weights " + r.weights_gb.toFixed(1) + " GB, KV cache " + r.kv_gb.toFixed(1) +
      " GB per step\\n" + r.tokens_per_s.toFixed(0) + " tokens/s in all (" + r.per_sequence.toFixed(1) +
      " per sequence), a step of " + r.step_ms.toFixed(2) + " ms, " + r.bound + "-bound";
  }}
  ["model", "bw", "frac", "peak", "batch", "ctx", "n"].forEach(function (k) {{
    q(k).addEventListener("input", show); q(k).addEventListener("change", show);
  }});
  q("gpu").addEventListener("change", sheet); q("fmt").addEventListener("change", sheet);
  sheet();
}})();</script>
</div>""")
