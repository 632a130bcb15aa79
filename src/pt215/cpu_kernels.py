"""The CPU kernels torch runs, and how the book keeps printed digits the same on every CPU.

torch picks its CPU kernels at start-up by the widest vector instructions the processor has (AVX2 or AVX-512 on
x86-64), and MKL and oneDNN choose their own matrix-product kernels by processor (Intel or AMD) and width. They
sum in different orders, so a seeded run gives the same result on every machine only to about 6 significant
digits, and a step that amplifies tiny differences (rounding activations to FP8, the arg-max of a router, a bf16
training run) shows it in the 3rd or 4th decimal. Notebooks therefore print such values with `approx`, at the
resolution that holds on any CPU, and assert the rest with a stated tolerance. The test suite runs the sensitive
notebooks twice: with the machine's own kernels and restricted to AVX2 (`AVX2_ONLY`).
"""

from __future__ import annotations

import math

__all__ = ["AVX2_ONLY", "active_capability", "approx"]

AVX2_ONLY: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's vectorized kernels (reductions, softmax, elementwise)
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL's GEMM (float32 matmul)
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (bf16 and fp32 linear paths)
}


def active_capability() -> str:
    """The vector width torch's CPU kernels use in this process: 'AVX2', 'AVX512', 'DEFAULT', 'SVE256', ..."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def approx(value: float, step: float, *, percent: bool = False) -> str:
    """`value` rounded to the nearest multiple of `step` and shown with '≈': the digits that hold on any CPU.

    `approx(0.9658, 0.02, percent=True)` -> '≈96 %'; `approx(1.5512, 0.25)` -> '≈1.5'. Choose `step` several
    times larger than the spread between machines, so no machine lands on the other side of a rounding edge.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"approx(): value must be a finite number, got {value!r}")
    if isinstance(step, bool) or not isinstance(step, int | float) or not step > 0:
        raise ValueError(f"approx(): step must be a positive number, got {step!r}")
    scale = 100.0 if percent else 1.0
    s = step * scale
    q = round(value * scale / s) * s
    decimals = max(0, -math.floor(math.log10(s) + 1e-9)) if s < 1 else 0
    text = f"{q:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".") if decimals else text
    return f"≈{text} %" if percent else f"≈{text}"
