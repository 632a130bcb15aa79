"""Wall-clock timing of a callable: the one loop the chapters' benchmarks share.

Used by `pt215.transport` (chapter 3), `pt215.roofline` (chapter 5) and `pt215.fp8` (chapter 6). Timings are
never validated outputs: notebooks print them in cells tagged `nbval-ignore-output`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["median_seconds", "time_samples"]


def time_samples(fn: Callable[[], Any], *, iters: int = 10, warmup: int = 2,
                 sync: Callable[[], Any] | None = None) -> list[float]:
    """Wall time of each of `iters` calls of `fn()` in seconds, after `warmup` untimed calls.

    `sync` (e.g. `torch.cuda.synchronize`) runs before the clock starts and before it stops, so asynchronous
    device work is inside the measurement.
    """
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be a positive int, got {iters!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - t0)
    return times


def median_seconds(fn: Callable[[], Any], *, iters: int = 10, warmup: int = 2,
                   sync: Callable[[], Any] | None = None) -> float:
    """Median of `time_samples(...)`, in seconds."""
    return statistics.median(time_samples(fn, iters=iters, warmup=warmup, sync=sync))
