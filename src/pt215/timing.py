"""Wall-clock timing of a callable: the one loop the chapters' benchmarks share.

Used by `pt215.transport` (chapter 3), `pt215.roofline` (chapter 5) and `pt215.fp8` (chapter 6). Timings are
never validated outputs: notebooks print them in cells tagged `nbval-ignore-output`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["interleaved_medians", "interleaved_samples", "median_seconds", "time_samples"]


def _check_counts(iters: Any, warmup: Any) -> None:
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be a positive int, got {iters!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")


def _timed(fn: Callable[[], Any], sync: Callable[[], Any] | None) -> float:
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    fn()
    if sync is not None:
        sync()
    return time.perf_counter() - t0


def time_samples(fn: Callable[[], Any], *, iters: int = 10, warmup: int = 2,
                 sync: Callable[[], Any] | None = None) -> list[float]:
    """Wall time of each of `iters` calls of `fn()` in seconds, after `warmup` untimed calls.

    `sync` (e.g. `torch.cuda.synchronize`) runs before the clock starts and before it stops, so asynchronous
    device work is inside the measurement.
    """
    _check_counts(iters, warmup)
    for _ in range(warmup):
        fn()
    return [_timed(fn, sync) for _ in range(iters)]


def interleaved_samples(fns: Mapping[str, Callable[[], Any]], *, iters: int = 10, warmup: int = 2,
                        sync: Callable[[], Any] | None = None) -> dict[str, list[float]]:
    """`time_samples` for several variants at once, round-robin: `warmup` untimed rounds, then `iters` timed
    rounds, each calling every function once in the order given.

    A slower or busier moment of the machine then falls on all variants alike instead of on whichever was
    measured last, so the variants' medians can be compared with each other.
    """
    if not isinstance(fns, Mapping) or not fns or not all(callable(f) for f in fns.values()):
        raise ValueError(f"fns must be a non-empty mapping of names to callables, got {fns!r}")
    _check_counts(iters, warmup)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            times[name].append(_timed(fn, sync))
    return times


def interleaved_medians(fns: Mapping[str, Callable[[], Any]], *, iters: int = 10, warmup: int = 2,
                        sync: Callable[[], Any] | None = None) -> dict[str, float]:
    """Median seconds of each variant from `interleaved_samples(...)`."""
    return {name: statistics.median(t) for name, t in
            interleaved_samples(fns, iters=iters, warmup=warmup, sync=sync).items()}


def median_seconds(fn: Callable[[], Any], *, iters: int = 10, warmup: int = 2,
                   sync: Callable[[], Any] | None = None) -> float:
    """Median of `time_samples(...)`, in seconds."""
    return statistics.median(time_samples(fn, iters=iters, warmup=warmup, sync=sync))
