"""The book's one clock: device sync, a stopwatch, and the timing loops every benchmark uses.

`time.perf_counter` appears in this module only. Chapters 1-6 time through it: `bench.time_collective`
(chapter 1's back-to-back loop), `roofline.copy_bandwidth` and `roofline.measure_decode` (chapters 1, 3, 5, 6),
and the interleaved comparisons of chapters 5 and 6. Timings are never validated outputs: notebooks print
them in cells tagged `nbval-ignore-output`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["Stopwatch", "interleaved_medians", "interleaved_samples", "median_seconds", "sync", "time_samples"]

Device = torch.device | str | None


def sync(device: Device = None) -> None:
    """Wait until the work queued on `device` has finished (`torch.accelerator.synchronize`).

    CPU work is synchronous, so `None` and `"cpu"` return at once; `"cuda"`, `"cuda:1"`, `"mps"` and other
    accelerators wait for their queue. Call it before starting and before stopping a clock around device work.
    """
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be a torch.device, a device string or None, got {device!r}") from e
    if dev.type != "cpu":
        torch.accelerator.synchronize(dev)


class Stopwatch:
    """Elapsed wall time in seconds, with `device` synchronized when it starts and when it is read.

        with Stopwatch("cuda") as sw:      # frozen at the end of the block
            step()
        sw.seconds

        sw = Stopwatch()                   # or running: each read gives the time so far
        ...; print(f"{sw.seconds:.0f} s")
    """

    def __init__(self, device: Device = None) -> None:
        self.device = device
        sync(device)
        self._start = time.perf_counter()
        self._stop: float | None = None

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self._start, self._stop = time.perf_counter(), None
        return self

    def __exit__(self, *exc: object) -> None:
        sync(self.device)
        self._stop = time.perf_counter()

    @property
    def seconds(self) -> float:
        """Seconds since the start: up to the end of the `with` block, or up to now while running."""
        if self._stop is not None:
            return self._stop - self._start
        sync(self.device)
        return time.perf_counter() - self._start


def _check_counts(iters: Any, warmup: Any) -> None:
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be a positive int, got {iters!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")


def _timed(fn: Callable[[], Any], device: Device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def time_samples(fn: Callable[[], Any], *, iters: int = 10, warmup: int = 2, device: Device = None) -> list[float]:
    """Wall time of each of `iters` calls of `fn()` in seconds, after `warmup` untimed calls.

    `device` is synchronized before the clock starts and before it stops (`sync`), so asynchronous device
    work is inside each sample.
    """
    _check_counts(iters, warmup)
    sync(device)
    for _ in range(warmup):
        fn()
    return [_timed(fn, device) for _ in range(iters)]


def interleaved_samples(fns: Mapping[str, Callable[[], Any]], *, iters: int = 10, warmup: int = 2,
                        device: Device = None) -> dict[str, list[float]]:
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
            times[name].append(_timed(fn, device))
    return times


def interleaved_medians(fns: Mapping[str, Callable[[], Any]], *, iters: int = 10, warmup: int = 2,
                        device: Device = None) -> dict[str, float]:
    """Median seconds of each variant from `interleaved_samples(...)`."""
    return {name: statistics.median(t) for name, t in
            interleaved_samples(fns, iters=iters, warmup=warmup, device=device).items()}


def median_seconds(fn: Callable[[], Any], *, iters: int = 10, warmup: int = 2, device: Device = None) -> float:
    """Median of `time_samples(...)`, in seconds."""
    return statistics.median(time_samples(fn, iters=iters, warmup=warmup, device=device))
