"""The Apple-GPU operations PyTorch 2.15's release material reports faster, at its sizes (chapter 6, notebook 6.3).

`release_cases(device)` builds each operation once on `device` and returns name -> `Case(fn, iters, calls,
nbytes)` for `pt215.timing.median_seconds`: decode-shaped `F.linear` (gemv, small projections included), softmax
over one row of 128,256 entries, a 2x bilinear upsample's backward, full-reduction norms and a 512x512 QR.
Notebook 6.3 and `python -m pt215.verify` (path `ch6.mps-kernels`) time the same cases.

A decode step reads each weight once, and a model's weights are far larger than any cache. Timing one weight
over and over measures a cache instead: a 32 MiB matrix read 20 times in a row can stay in a large last-level or
system-level cache. So each gemv and norm case cycles through enough distinct copies of its operand
(`copies_for`) that every call reads data the previous calls of the last `rotate_bytes` did not; `nbytes` is
what one call must read, for the read-bandwidth floor.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["LINEAR_SHAPES", "RELEASE_FIGURES", "ROTATE_BYTES", "Case", "copies_for", "release_cases"]

RELEASE_FIGURES: dict[str, str] = {
    "F.linear (gemv)": "1.23x geomean, up to 5x on small projections",
    "softmax, one row of 128,256": "8x",
    "upsample backward": "up to 21.7x",
    "norms as full reductions": "over 100x",
    "QR 512x512": "about 7 s to 1.5 ms",
}
"""What the release material reports for each operation (its Macs, its baseline), quoted, not measured here."""

LINEAR_SHAPES: tuple[tuple[int, int], ...] = ((4096, 4096), (14336, 4096), (1024, 4096), (256, 2048))
"""(N, K) of the decode projections timed: a 4096-wide model's attention and MLP, and two small ones."""

ROTATE_BYTES = 256 * 2**20
"""Distinct bytes a gemv or norm case reads before it reads one copy again (several times any cache)."""


class Case(NamedTuple):
    """One timed operation: `fn()` one call; `iters` samples of `calls` back-to-back calls; `nbytes` the bytes
    one call must read (its weight or input, for the floor `nbytes / read bandwidth`), None where the floor is
    not what the operation is about."""

    fn: Callable[[], Any]
    iters: int
    calls: int
    nbytes: int | None


def copies_for(nbytes: int, rotate_bytes: int = ROTATE_BYTES) -> int:
    """Copies of an operand of `nbytes` to cycle through so that `rotate_bytes` pass before one is read again
    (at least 2: the call just before never read the same copy)."""
    for name, v in (("nbytes", nbytes), ("rotate_bytes", rotate_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return max(2, math.ceil(rotate_bytes / nbytes))


def _cycling(fn: Callable[[Any], Any], items: Sequence[Any]) -> Callable[[], Any]:
    nxt = itertools.cycle(items).__next__
    return lambda: fn(nxt())


def release_cases(device: torch.device | str = "mps", dtype: torch.dtype = torch.bfloat16, *,
                  linear_shapes: Sequence[tuple[int, int]] = LINEAR_SHAPES, rotate_bytes: int = ROTATE_BYTES,
                  norm_size: int = 4096) -> dict[str, Case]:
    """name -> `Case`: the release's operations built once on `device`.

    Operations of tens of microseconds get 20 back-to-back calls per sample (a device sync costs about as much);
    QR, which took seconds before 2.15, one call per sample and 5 samples. gemv weights and norm inputs are
    cycled through `copies_for(bytes, rotate_bytes)` copies. `linear_shapes` and `norm_size` shrink the cases
    for a quick check on a small machine.
    """
    dev = torch.device(device)
    if not linear_shapes or any(len(s) != 2 or min(s) < 1 for s in linear_shapes):
        raise ValueError(f"linear_shapes must be (N, K) pairs of positive ints, got {linear_shapes!r}")
    cases: dict[str, Case] = {}
    elem = torch.empty((), dtype=dtype).element_size()
    for n, k in linear_shapes:  # decode projections, small ones too
        x = torch.randn(1, k, device=dev, dtype=dtype)
        ws = [torch.randn(n, k, device=dev, dtype=dtype) for _ in range(copies_for(n * k * elem, rotate_bytes))]
        cases[f"F.linear M=1 {k}->{n}"] = Case(_cycling(lambda w, x=x: F.linear(x, w), ws), 50, 20, n * k * elem)
    row = torch.randn(1, 128256, device=dev, dtype=dtype)
    cases["softmax, 1 row x 128256"] = Case(lambda: torch.softmax(row, -1), 50, 20, None)
    img = torch.randn(1, 64, 128, 128, device=dev, requires_grad=True)
    up = F.interpolate(img, scale_factor=2, mode="bilinear")
    grad_up = torch.randn_like(up)
    cases["upsample 2x bilinear, backward"] = Case(
        lambda: torch.autograd.grad(up, img, grad_up, retain_graph=True), 50, 20, None)
    big_bytes = norm_size * norm_size * 4
    bigs = [torch.randn(norm_size, norm_size, device=dev) for _ in range(copies_for(big_bytes, rotate_bytes))]
    cases[f"vector_norm, {norm_size}x{norm_size} fp32"] = Case(_cycling(torch.linalg.vector_norm, bigs), 50, 20,
                                                                big_bytes)
    cases[f"matrix_norm (Frobenius), {norm_size}x{norm_size}"] = Case(_cycling(torch.linalg.matrix_norm, bigs),
                                                                       50, 20, big_bytes)
    a = torch.randn(512, 512, device=dev)
    cases["QR 512x512 fp32"] = Case(lambda: torch.linalg.qr(a), 5, 1, None)
    return cases
