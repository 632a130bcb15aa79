"""The CPU kernels torch runs, and how a notebook prints a value whose last digits depend on them (every chapter).

torch picks its CPU kernels at start-up by the widest vector instructions the processor has (AVX2 or AVX-512 on
x86-64), and MKL and oneDNN choose their own matrix-product kernels by processor (Intel or AMD, with or without
AMX) and width. They sum in different orders, so a seeded run gives the same result on every machine only to
about 6 significant digits, and a step that amplifies tiny differences (rounding activations to FP8, the arg-max
of a router, a bf16 training run) shows it in the 3rd or 4th decimal.

Rounding such a value to a coarser grid does not make it portable: a value near a grid edge lands on either side
depending on the CPU. So a notebook prints it with `kernel_value`, which marks it with '≈' and checks it against
an expected value and a stated tolerance. The test suite's sanitizer (`tests/sanitize.cfg`, section
`[cpu-kernel-values]`) masks every '≈<number>' before comparing outputs, so the stored digits are the reference
run's and a wrong value still fails in the cell itself. `AVX2_ONLY` restricts all three libraries to AVX2, as a
reader's older laptop runs them.
"""

from __future__ import annotations

import math

__all__ = ["AVX2_ONLY", "MARK", "active_capability", "kernel_value"]

MARK = "≈"
"""Prefix of a printed value whose last digits depend on the CPU's kernels (masked by the test sanitizer)."""

AVX2_ONLY: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's vectorized kernels (reductions, softmax, elementwise)
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL's GEMM (float32 matmul)
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (bf16, fp32 and FP8 matmul paths)
}


def active_capability() -> str:
    """The vector width torch's CPU kernels use in this process: 'AVX2', 'AVX512', 'DEFAULT', 'SVE256', ..."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"kernel_value(): {name} must be a finite number, got {value!r}")
    return float(value)


def kernel_value(value: float, fmt: str = ".4f", *, expected: float | None = None, tol: float | None = None,
                 percent: bool = False, name: str = "value") -> str:
    """`value` formatted with `fmt` and marked '≈': its last digits depend on the CPU's kernels.

    With `expected` and `tol`, first checks `|value - expected| <= tol` and raises `AssertionError` naming
    `name`, the value, the expected value and the tolerance when it does not hold, so a wrong result fails its
    cell on every machine. `percent=True` prints `100 * value` followed by ' %' (tolerance in the unit of
    `value`). `kernel_value(1.34794, expected=1.35, tol=0.02)` -> '≈1.3479'.
    """
    v = _number(value, "value")
    if (expected is None) != (tol is None):
        raise ValueError("kernel_value(): give expected and tol together, or neither")
    if expected is not None and tol is not None:
        e, t = _number(expected, "expected"), _number(tol, "tol")
        if t < 0:
            raise ValueError(f"kernel_value(): tol must be >= 0, got {tol!r}")
        if abs(v - e) > t:
            raise AssertionError(f"{name} = {v!r} is outside the expected {e!r} ± {t!r} on this CPU's kernels")
    if not isinstance(fmt, str):
        raise ValueError(f"kernel_value(): fmt must be a format spec such as '.4f', got {fmt!r}")
    try:
        text = format(v * 100.0 if percent else v, fmt)
    except ValueError as exc:
        raise ValueError(f"kernel_value(): fmt {fmt!r} is not a float format spec ({exc})") from None
    return f"{MARK}{text} %" if percent else f"{MARK}{text}"
