"""The book's gated CUDA calls, checked on a machine without a GPU (chapters 5-6, `python -m pt215.verify`).

`torch._subclasses.fake_tensor.FakeTensorMode` makes tensors with `device="cuda"` on a CUDA build of torch even
when no GPU is present. Every ATen op then runs its *meta* function: the real shape, dtype and layout checks
(a row-major `mat2` of `torch._scaled_mm` is rejected with "mat2 must be col_major"), but no kernel. Any read
of a tensor's values (`bool(t)`, `.item()`, `.tolist()`) raises `DataDependentOutputException`, which makes a
fake run a test that a code path never waits for the device.

`simulated_gpu(capability, cudnn)` also answers torch's Python-side device questions (is CUDA available, which
compute capability, which cuDNN) so that dispatch code such as `pt215.fp8.scaled_mm_path` and
`torch.nn.attention.varlen`'s backend choice runs as it would on that GPU. Nothing here measures anything: a
passed check means "shapes and dtypes checked, no kernel ran".

Each `check_*` function returns a dict of figures (JSON-serialisable) and raises `AssertionError` when a
call does not behave as the chapter says.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from unittest import mock

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

__all__ = ["CHECKS", "MODE", "expect_error", "simulated_gpu"]

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


def _cuda(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="cuda")


def _meta(t: torch.Tensor) -> tuple[list[int], str]:
    return list(t.shape), str(t.dtype).removeprefix("torch.")


# ------------------------------------------------------------------------------------------ chapter 6: FP8


def check_fp8_scaled_mm() -> dict:
    """`pt215.fp8.scaled_matmul` (F.scaled_mm v2), tensorwise and rowwise, on a simulated sm_90 (chapter 6)."""
    from pt215 import fp8

    out = {}
    with simulated_gpu((9, 0)):
        x = _cuda(16, 256)
        for scaling in ("tensorwise", "rowwise"):
            w = fp8.quantize(_cuda(128, 256), scaling=scaling)
            assert w.data.dtype == torch.float8_e4m3fn and w.scale.dtype == torch.float32
            assert tuple(w.scale.shape) == (() if scaling == "tensorwise" else (128, 1))
            for out_dtype in (torch.bfloat16, torch.float32):
                y = fp8.scaled_matmul(x, w, out_dtype=out_dtype)
                assert y.device.type == "cuda" and tuple(y.shape) == (16, 128) and y.dtype == out_dtype
            out[scaling] = _meta(y)
        assert fp8.scaled_mm_path("cuda") == "scaled_mm"
    with simulated_gpu((8, 0)):
        out["sm_80 path"] = fp8.scaled_mm_path("cuda")
        assert out["sm_80 path"] == "dequantize"
    return out


def check_torch_scaled_mm_layout() -> dict:
    """`torch._scaled_mm` (v1) on cuda: column-major mat2 accepted, row-major rejected (chapter 6)."""
    from pt215 import fp8

    with simulated_gpu((9, 0)):
        a = _cuda(64, 128, dtype=torch.float8_e4m3fn)
        b_rows = _cuda(128, 32, dtype=torch.float8_e4m3fn)   # row-major (K, N)
        b_cols = b_rows.t().contiguous().t()                # the same shape, column-major
        s = torch.ones((), device="cuda")
        y = torch._scaled_mm(a, b_cols, s, s, out_dtype=torch.bfloat16)
        assert tuple(y.shape) == (64, 32) and y.dtype == torch.bfloat16
        rejected = expect_error(lambda: torch._scaled_mm(a, b_rows, s, s, out_dtype=torch.bfloat16),
                                "mat2 must be col_major")
        problems = fp8.cuda_layout_problems(a, b_rows)
        assert any("column-major" in p for p in problems), problems
        assert fp8.cuda_layout_problems(a, b_cols) == []
    return {"col_major": _meta(y), "row_major": rejected}


def check_grouped_mm() -> dict:
    """`pt215.moe.moe_grouped` (F.grouped_mm, int32 offsets) and the int64-offsets rejection (chapter 6)."""
    from pt215 import moe

    with simulated_gpu((9, 0)):
        x, w = _cuda(48, 64), _cuda(4, 128, 64)
        offs = torch.empty(4, dtype=torch.int32, device="cuda")
        y = moe.moe_grouped(x, w, offs, validate=False)  # the timed path: no read of offs
        assert tuple(y.shape) == (48, 128) and y.dtype == torch.bfloat16
        rejected = expect_error(lambda: F.grouped_mm(x, w.transpose(-2, -1), offs=offs.long()), "int32")
    return {"grouped_mm": _meta(y), "int64 offs": rejected}


def check_no_host_sync() -> dict:
    """The FP8 decode path never reads device values per call: quantize, scaled_matmul, and the FP8 expert
    loop given its boundaries once per layer (chapter 6's timing compares kernels, not syncs)."""
    from pt215 import fp8, moe

    with simulated_gpu((9, 0)):
        x = _cuda(16, 64)
        # the detector works: a value read on a fake tensor raises
        expect_error(lambda: bool(torch.isfinite(x).all()), "", kinds=(DataDependentOutputException,))
        q = fp8.quantize(x, scaling="rowwise")
        experts = [fp8.quantize(_cuda(32, 64), scaling="rowwise") for _ in range(4)]
        y = fp8.scaled_matmul(x, experts[0])
        offs = torch.empty(4, dtype=torch.int32, device="cuda")
        z = moe.moe_loop_fp8(_cuda(16, 64), experts, offs, validate=False, bounds=[4, 8, 12, 16])
        assert tuple(z.shape) == (16, 32)
    return {"quantize": _meta(q.data), "scaled_matmul": _meta(y), "moe_loop_fp8": _meta(z), "host reads": 0}


# --------------------------------------------------------------------------------------- chapter 5: NVFP4


def check_nvfp4_scaled_mm() -> dict:
    """The NVFP4 GEMM of chapter 5 (`pt215.nvfp4.scaled_mm`, swizzled BlockWise1x16 + TensorWise scales)."""
    from pt215 import nvfp4

    g = torch.Generator().manual_seed(0)
    qa = nvfp4.quantize(torch.randn(16, 512, generator=g))
    qw = nvfp4.quantize(torch.randn(256, 512, generator=g) * 0.02)
    args = nvfp4.mm_operands(qa, qw)
    with simulated_gpu((10, 0)):
        fake = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in args]
        y = nvfp4.scaled_mm(*fake)
        assert tuple(y.shape) == (16, 256) and y.dtype == torch.bfloat16 and y.device.type == "cuda"
        # K of A (2 values per byte) must match B's: the meta check rejects a mismatch
        rejected = expect_error(lambda: nvfp4.scaled_mm(fake[0][:, :128], *fake[1:]), "")
    return {"operands": [_meta(t) for t in args], "out": _meta(y), "K mismatch": rejected}


def varlen_cases() -> dict[str, dict]:
    """Which varlen_attn backend each simulated GPU picks for chapter 5's paged GQA decode call, and why."""
    import torch.nn.attention.varlen as varlen

    names = {varlen._FLASH_ATTENTION_BACKEND: "flash", varlen._CUDNN_ATTENTION_BACKEND: "cudnn"}
    cases = {
        "sm_90, cuDNN 9.26, decode enabled": ((9, 0), 92600, False),
        "sm_90, cuDNN 9.26, decode disabled": ((9, 0), 92600, True),
        "sm_100, cuDNN 9.23": ((10, 0), 92300, False),
        "sm_120, cuDNN 9.26": ((12, 0), 92600, False),
    }
    out = {}
    for label, (cap, cudnn, off) in cases.items():
        with simulated_gpu(cap, cudnn, off):
            q, kp = _cuda(3, 8, 64), _cuda(8, 256, 2, 64)
            cu = torch.empty(4, dtype=torch.int32, device="cuda")
            su = torch.empty(3, dtype=torch.int32, device="cuda")
            bt = torch.empty(3, 4, dtype=torch.int32, device="cuda")
            reasons = varlen._cudnn_rejection_reasons(q, kp, kp, cu, None, 1, [-1, 0], su, bt)
            backend = names.get(varlen._select_backend(q, kp, kp, cu, None, 1, [-1, 0], su, bt), "?")
        out[label] = {"backend": backend, "cudnn rejects": reasons}
    return out


def check_varlen_paged_gqa() -> dict:
    """`varlen_attn` on a paged bf16 GQA cache, causal decode (max_q == 1): its own argument checks, backend
    selection and output shape on simulated sm_90/sm_100 GPUs; the rules chapter 5 states (chapter 5)."""
    import torch.nn.attention.varlen as varlen
    from torch.nn.attention.varlen import varlen_attn

    with simulated_gpu((9, 0), 92600):
        q, kp = _cuda(3, 8, 64), _cuda(8, 256, 2, 64)  # 8 query heads over 2 KV heads, pages of 256
        cu = torch.empty(4, dtype=torch.int32, device="cuda")
        su = torch.empty(3, dtype=torch.int32, device="cuda")
        bt = torch.empty(3, 4, dtype=torch.int32, device="cuda")
        o = varlen_attn(q, kp, kp, cu, None, 1, 700, window_size=(-1, 0), enable_gqa=True, seqused_k=su,
                        block_table=bt)
        assert tuple(o.shape) == (3, 8, 64) and o.dtype == torch.bfloat16
        kp3 = _cuda(8, 256, 3, 64)
        gqa = expect_error(lambda: varlen_attn(q, kp3, kp3, cu, None, 1, 700, enable_gqa=True,
                                               seqused_k=su, block_table=bt), "multiple of kv heads")
        no_used = varlen._cudnn_rejection_reasons(q, kp, kp, cu, None, 1, [-1, 0], None, bt)
        assert "block_table requires seqused_k" in no_used, no_used
        odd_page = varlen._cudnn_rejection_reasons(q, _cuda(8, 96, 2, 64), _cuda(8, 96, 2, 64), cu, None, 1,
                                                   [-1, 0], su, bt)
        assert "paged KV requires a power-of-two page size" in odd_page, odd_page
        big_head = varlen._cudnn_rejection_reasons(_cuda(3, 8, 192), _cuda(8, 256, 2, 192),
                                                   _cuda(8, 256, 2, 128), cu, None, 2, [-1, 0], su, bt)
        assert any("head dimensions" in r for r in big_head), big_head  # sm_90: <= 128 only
    with simulated_gpu((10, 0), 92400):
        ok = varlen._cudnn_rejection_reasons(_cuda(3, 8, 192), _cuda(8, 256, 2, 192), _cuda(8, 256, 2, 128),
                                             cu, None, 2, [-1, 0], su, bt)
        assert not any("head dimensions" in r for r in ok), ok  # sm_100 + cuDNN 9.24: (192, 128) accepted
    cases = varlen_cases()
    assert cases["sm_90, cuDNN 9.26, decode disabled"]["backend"] == "flash"
    assert cases["sm_120, cuDNN 9.26"]["cudnn rejects"] == ["cuDNN >= 9.18 on SM90 or SM100 is required"]
    return {"out": _meta(o), "GQA 8 over 3 heads": gqa, "backend by GPU": cases}


CHECKS: dict[str, Callable[[], dict]] = {
    "fake-cuda.fp8-scaled-mm": check_fp8_scaled_mm,
    "fake-cuda.torch-scaled-mm-layout": check_torch_scaled_mm_layout,
    "fake-cuda.grouped-mm": check_grouped_mm,
    "fake-cuda.fp8-no-host-sync": check_no_host_sync,
    "fake-cuda.nvfp4-scaled-mm": check_nvfp4_scaled_mm,
    "fake-cuda.varlen-paged-gqa": check_varlen_paged_gqa,
}
