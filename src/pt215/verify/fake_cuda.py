"""CUDA calls checked on a machine without a GPU: the fake-CUDA mechanism (chapters 4-6, `python -m pt215.verify`).

`torch._subclasses.fake_tensor.FakeTensorMode` makes tensors with `device="cuda"` on a CUDA build of torch even
when no GPU is present. Every ATen op then runs its *meta* function: the real shape, dtype and layout checks
(a row-major `mat2` of `torch._scaled_mm` is rejected with "mat2 must be col_major"), but no kernel. Any read
of a tensor's values (`bool(t)`, `.item()`, `.tolist()`) raises `DataDependentOutputException`, which makes a
fake run a test that a code path never waits for the device.

`simulated_gpu(capability, cudnn)` also answers torch's Python-side device questions (is CUDA available, which
compute capability, which cuDNN) so that dispatch code such as `pt215.fp8.scaled_mm_path` and
`torch.nn.attention.varlen`'s backend choice runs as it would on that GPU. Nothing here measures anything: a
passed check means "shapes and dtypes checked, no kernel ran" (`MODE`, the wording a record carries).

The checks that use it are the fake paths of `pt215.verify.checks`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

__all__ = ["MODE", "cuda_tensor", "expect_error", "shape_dtype", "simulated_gpu"]

MODE = "fake CUDA: shapes and dtypes checked, no kernel ran"


@contextlib.contextmanager
def simulated_gpu(capability: tuple[int, int] = (9, 0), cudnn: int | None = None,
                  cudnn_decode_disabled: bool = False) -> Iterator[FakeTensorMode]:
    """FakeTensorMode plus a simulated GPU of `capability` (and cuDNN version `cudnn`, e.g. 92600 for 9.26).

    Only torch's *Python* questions are answered (`torch.cuda.is_available`, `get_device_capability`,
    `current_device`, varlen_attn's cached cuDNN lookups); the ATen meta checks are the installed ones.
    """
    import torch.nn.attention.varlen as varlen

    version = torch.backends.cudnn.version() if cudnn is None else cudnn
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)  # expected meta failures are logged at ERROR before they propagate
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch("torch.cuda.is_available", return_value=True))
        # FakeTensorMode itself must still avoid touching a device (it asks torch.cuda.is_available)
        stack.enter_context(mock.patch.object(FakeTensorMode, "avoid_device_init", new_callable=mock.PropertyMock,
                                              return_value=True))
        for cached in (varlen._should_use_cudnn, varlen._cudnn_version, varlen._cudnn_supports_head_dims):
            if hasattr(cached, "cache_clear"):  # lru_cache'd per device index: forget earlier simulated GPUs
                cached.cache_clear()
            stack.callback(getattr(cached, "cache_clear", lambda: None))
        stack.enter_context(mock.patch("torch.cuda.get_device_capability", return_value=capability))
        stack.enter_context(mock.patch("torch.cuda.current_device", return_value=0))
        stack.enter_context(mock.patch.object(varlen, "_cudnn_version_and_major_capability",
                                              lambda index: (version, capability[0])))
        stack.enter_context(mock.patch.object(varlen, "_cudnn_decode_disabled",
                                              lambda index: cudnn_decode_disabled))
        try:
            yield stack.enter_context(FakeTensorMode())
        finally:
            fake_log.setLevel(level)


def expect_error(fn: Callable[[], object], contains: str,
                 kinds: tuple[type[BaseException], ...] = (RuntimeError, ValueError)) -> str:
    """Run `fn`, assert that it raises one of `kinds` whose message contains `contains`; return line 1."""
    try:
        fn()
    except kinds as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        assert contains in str(e), f"expected an error containing {contains!r}, got {type(e).__name__}: {first}"
        return f"{type(e).__name__}: {first}"
    raise AssertionError(f"expected an error containing {contains!r}; the call was accepted")


def cuda_tensor(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """An uninitialised tensor on `cuda` (a FakeTensor inside `simulated_gpu`)."""
    return torch.empty(*shape, dtype=dtype, device="cuda")


def shape_dtype(t: torch.Tensor) -> tuple[list[int], str]:
    """`([16, 128], "bfloat16")`: what a fake check records of a result."""
    return list(t.shape), str(t.dtype).removeprefix("torch.")
