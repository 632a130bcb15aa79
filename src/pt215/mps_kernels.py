"""The Apple-GPU operations PyTorch 2.15's release material reports faster, at its sizes (chapter 6, notebook 6.3).

`release_cases(device)` builds each operation once on `device` and returns name -> (callable, samples, calls per
sample) for `pt215.timing.median_seconds`: decode-shaped `F.linear` (gemv, small projections included), softmax
over one row of 128,256 entries, a 2x bilinear upsample's backward, full-reduction norms and a 512x512 QR. Notebook
6.3 and `python -m pt215.verify` (path `ch6.mps-kernels`) time the same cases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["RELEASE_FIGURES", "release_cases"]

RELEASE_FIGURES: dict[str, str] = {
    "F.linear (gemv)": "1.23x geomean, up to 5x on small projections",
    "softmax, one row of 128,256": "8x",
    "upsample backward": "up to 21.7x",
    "norms as full reductions": "over 100x",
    "QR 512x512": "about 7 s to 1.5 ms",
}
"""What the release material reports for each operation (its Macs, its baseline), quoted, not measured here."""


def release_cases(device: torch.device | str = "mps", dtype: torch.dtype = torch.bfloat16
                  ) -> dict[str, tuple[Callable[[], Any], int, int]]:
    """name -> (callable, samples, calls per sample): the release's operations built once on `device`.

    Operations of tens of microseconds get 20 back-to-back calls per sample (a device sync costs about as much);
    QR, which took seconds before 2.15, one call per sample and 5 samples.
    """
    dev = torch.device(device)
    cases: dict[str, tuple[Callable[[], Any], int, int]] = {}
    for n, k in [(4096, 4096), (14336, 4096), (1024, 4096), (256, 2048)]:  # decode projections, small ones too
        x, w = torch.randn(1, k, device=dev, dtype=dtype), torch.randn(n, k, device=dev, dtype=dtype)
        cases[f"F.linear M=1 {k}->{n}"] = (lambda x=x, w=w: F.linear(x, w), 50, 20)
    row = torch.randn(1, 128256, device=dev, dtype=dtype)
    cases["softmax, 1 row x 128256"] = (lambda: torch.softmax(row, -1), 50, 20)
    img = torch.randn(1, 64, 128, 128, device=dev, requires_grad=True)
    up = F.interpolate(img, scale_factor=2, mode="bilinear")
    grad_up = torch.randn_like(up)
    cases["upsample 2x bilinear, backward"] = (
        lambda: torch.autograd.grad(up, img, grad_up, retain_graph=True), 50, 20)
    big = torch.randn(4096, 4096, device=dev)
    cases["vector_norm, 4096x4096 fp32"] = (lambda: torch.linalg.vector_norm(big), 50, 20)
    cases["matrix_norm (Frobenius), 4096x4096"] = (lambda: torch.linalg.matrix_norm(big), 50, 20)
    a = torch.randn(512, 512, device=dev)
    cases["QR 512x512 fp32"] = (lambda: torch.linalg.qr(a), 5, 1)
    return cases
