"""Tests for pt215.fp8 (chapter 6). Small shapes: the CPU FP8 matmul is a slow reference path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pt215 import fp8
from pt215.fp8 import FP8Tensor, quantize

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ------------------------------------------------------------------------------------------ formats


@pytest.mark.parametrize("dtype,count,top", [(E4, 127, 448.0), (E5, 124, 57344.0)])
def test_fp8_grid(dtype, count, top):
    g = fp8.fp8_grid(dtype)
    assert g.numel() == count
    assert g[0].item() == 0.0 and g[-1].item() == top == torch.finfo(dtype).max
    assert bool((g[1:] > g[:-1]).all())
    assert g[1].item() == (2.0**-9 if dtype == E4 else 2.0**-16)  # smallest subnormal


@pytest.mark.parametrize("dtype", [E4, E5])
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_quantize_roundtrip(dtype, scaling):
    x = torch.randn(32, 64) * 3
    q = quantize(x, dtype=dtype, scaling=scaling)
    assert q.data.dtype == dtype and q.scale.dtype == torch.float32
    assert q.scale.shape == (() if scaling == "tensorwise" else (32, 1))
    # amax maps to fmax exactly
    assert q.dequantize().abs().max().item() == pytest.approx(x.abs().max().item(), rel=1e-6)
    bound = 0.04 if dtype == E4 else 0.08
    assert fp8.rel_error(x, q.dequantize()) < bound
    assert q.nbytes == 32 * 64 + q.scale.numel() * 4


def test_rowwise_beats_tensorwise_on_outlier_rows():
    x = torch.randn(16, 64)
    x[0] *= 1e5  # a row 1e5x louder pushes the others into e4m3 subnormals under one scale
    tw = fp8.rel_error(x[1:], quantize(x).dequantize()[1:])
    rw = fp8.rel_error(x[1:], quantize(x, scaling="rowwise").dequantize()[1:])
    assert rw < tw / 5


def test_quantize_zero_rows_get_scale_one():
    x = torch.zeros(3, 16)
    x[1] = 1.0
    q = quantize(x, scaling="rowwise")
    assert q.scale[0].item() == 1.0 and q.scale[2].item() == 1.0
    assert torch.equal(q.dequantize(), x)


@pytest.mark.parametrize(
    "kwargs,x,err,match",
    [
        ({"dtype": torch.bfloat16}, torch.randn(2, 16), ValueError, "dtype must be torch.float8"),
        ({"scaling": "blockwise"}, torch.randn(2, 16), ValueError, "scaling must be 'tensorwise' or 'rowwise'"),
        ({"scaling": "rowwise"}, torch.randn(16), ValueError, "rowwise scaling needs a 2-D"),
        ({}, torch.arange(4), ValueError, "x must be a float32/bfloat16/float16"),
        ({}, torch.tensor([1.0, float("inf")]), ValueError, "inf or nan"),
        ({}, [1.0, 2.0], TypeError, "x must be a torch.Tensor"),
    ],
)
def test_quantize_errors(kwargs, x, err, match):
    with pytest.raises(err, match=match):
        quantize(x, **kwargs)


def test_rel_error_errors():
    with pytest.raises(ValueError, match="same shape"):
        fp8.rel_error(torch.ones(2), torch.ones(3))
    with pytest.raises(ValueError, match="all zeros"):
        fp8.rel_error(torch.zeros(2), torch.ones(2))


# ----------------------------------------------------------------------------------------- scaled_mm


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("m", [1, 4])
def test_scaled_matmul_matches_dequantized_reference(scaling, m):
    w = quantize(torch.randn(32, 64), scaling=scaling)
    x = torch.randn(m, 64)
    y = fp8.scaled_matmul(x, w, out_dtype=torch.float32)
    xq = quantize(x, scaling=scaling)
    ref = xq.dequantize() @ w.dequantize().t()
    assert y.shape == (m, 32) and y.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    assert fp8.rel_error(x @ w.dequantize().t(), y) < 0.06


def test_scaled_matmul_is_the_v2_call():
    w = quantize(torch.randn(32, 64), scaling="rowwise")
    x = torch.randn(2, 64)
    xq = quantize(x, scaling="rowwise")
    direct = F.scaled_mm(xq.data, w.data.t(), xq.scale, F.ScalingType.RowWise, w.scale.reshape(1, -1),
                         F.ScalingType.RowWise, output_dtype=torch.bfloat16)
    assert torch.equal(fp8.scaled_matmul(x, w), direct)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16, E4])
def test_scaled_matmul_out_dtypes(out_dtype):
    w = quantize(torch.randn(16, 32))
    assert fp8.scaled_matmul(torch.randn(2, 32), w, out_dtype=out_dtype).dtype == out_dtype


@pytest.mark.parametrize(
    "x,w,kwargs,err,match",
    [
        (torch.randn(2, 32), torch.randn(16, 32), {}, TypeError, "w must be an FP8Tensor"),
        (torch.randn(32), None, {}, ValueError, "x must be \\(M, K\\)"),
        (torch.randn(2, 16), None, {}, ValueError, "x has K=16 but w has K=32"),
        (torch.randn(2, 32), None, {"out_dtype": torch.int8}, ValueError, "out_dtype must be one of"),
    ],
)
def test_scaled_matmul_errors(x, w, kwargs, err, match):
    w = quantize(torch.randn(16, 32)) if w is None else w
    with pytest.raises(err, match=match):
        fp8.scaled_matmul(x, w, **kwargs)


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, E4])
def test_reference_scaled_mm_is_what_the_cpu_kernel_computes(scaling, out_dtype):
    """Dequantize + fp32 matmul: bit for bit the CPU kernel's result where that kernel runs."""
    x, w = torch.randn(3, 48), torch.randn(16, 48)
    xq, wq = quantize(x, scaling=scaling), quantize(w, scaling=scaling)
    sw = wq.scale if scaling == "tensorwise" else wq.scale.reshape(1, -1).contiguous()
    ref = fp8.reference_scaled_mm(xq.data, wq.data.t(), xq.scale, sw, out_dtype=out_dtype)
    assert ref.dtype == out_dtype and ref.shape == (3, 16)
    if fp8.cpu_fp8_matmul_problem() is None:
        recipe = F.ScalingType.TensorWise if scaling == "tensorwise" else F.ScalingType.RowWise
        real = F.scaled_mm(xq.data, wq.data.t(), xq.scale, recipe, sw, recipe, output_dtype=out_dtype)
        assert torch.equal(real.float(), ref.float())


def test_reference_scaled_mm_errors():
    a8 = torch.randn(2, 16).to(E4)
    one = torch.tensor(1.0)
    with pytest.raises(ValueError, match="mat_a must be a 2-D float8"):
        fp8.reference_scaled_mm(a8.float(), a8.t(), one, one)
    with pytest.raises(ValueError, match="shapes cannot be multiplied"):
        fp8.reference_scaled_mm(a8, a8, one, one)
    with pytest.raises(ValueError, match="scale_b must be a float32"):
        fp8.reference_scaled_mm(a8, a8.t(), one, one.bfloat16())


@pytest.fixture
def cpu_without_fp8_kernels(monkeypatch):
    """A CPU on which every scaled matmul call raises: a stand-in for `scaled_matmul`'s fallback. (Where oneDNN is held
    below AMX only tensorwise `torch._scaled_mm` raises; `F.scaled_mm` never calls oneDNN on a CPU.)"""

    def no_kernel(*args, **kwargs):
        raise RuntimeError("could not create a primitive descriptor for the matmul primitive")

    monkeypatch.setattr(torch, "_scaled_mm", no_kernel)
    monkeypatch.setattr(F, "scaled_mm", no_kernel)
    fp8.cpu_fp8_matmul_problem.cache_clear()
    yield
    fp8.cpu_fp8_matmul_problem.cache_clear()  # the real answer again for the tests that follow


def test_probe_names_every_failing_call_in_one_line(cpu_without_fp8_kernels):
    problem = fp8.cpu_fp8_matmul_problem()
    assert problem is not None and "\n" not in problem
    assert problem.startswith("torch._scaled_mm, F.scaled_mm tensorwise, F.scaled_mm rowwise fail on this CPU's")
    assert problem.endswith("could not create a primitive descriptor for the matmul primitive")
    assert fp8.cpu_fp8_matmul_problem() is problem  # cached


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_scaled_matmul_gives_the_reference_result_where_the_kernel_is_missing(scaling, cpu_without_fp8_kernels):
    x, wq = torch.randn(4, 32), quantize(torch.randn(8, 32), scaling=scaling)
    xq = quantize(x, scaling=scaling)
    sw = wq.scale if scaling == "tensorwise" else wq.scale.reshape(1, -1).contiguous()
    for out_dtype in (torch.float32, torch.bfloat16):
        y = fp8.scaled_matmul(x, wq, out_dtype=out_dtype)
        assert torch.equal(y, fp8.reference_scaled_mm(xq.data, wq.data.t(), xq.scale, sw, out_dtype=out_dtype))
    # the W8A8 model layer on top of it runs too
    layer = fp8.FP8Linear(torch.nn.Linear(32, 8, bias=False), scaling=scaling)
    assert layer(torch.randn(2, 3, 32)).shape == (2, 3, 8)


def test_scaled_matmul_reraises_a_real_error_on_a_cpu_with_kernels(monkeypatch):
    """A failing call on a CPU whose probe passes is a real error, not a missing kernel: it is raised."""
    fp8.cpu_fp8_matmul_problem.cache_clear()
    if fp8.cpu_fp8_matmul_problem() is not None:
        pytest.skip("this CPU's kernels cannot build the FP8 matmul")

    def broken(*args, **kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr(F, "scaled_mm", broken)
    with pytest.raises(RuntimeError, match="something else"):
        fp8.scaled_matmul(torch.randn(2, 32), quantize(torch.randn(8, 32)))


def test_scaled_mm_path():
    assert fp8.scaled_mm_path("cpu") == "scaled_mm"
    assert fp8.scaled_mm_path("mps") == "scaled_mm"
    with pytest.raises(ValueError, match="device must be cpu, cuda or mps"):
        fp8.scaled_mm_path("meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda.is_available"):
            fp8.scaled_mm_path("cuda")


def test_cuda_layout_problems():
    a = torch.empty(4, 64, dtype=E4)
    w = torch.empty(32, 64, dtype=E4)
    assert fp8.cuda_layout_problems(a, w.t()) == []
    probs = fp8.cuda_layout_problems(a, w.t().contiguous())
    assert len(probs) == 1 and "column-major" in probs[0]
    probs = fp8.cuda_layout_problems(torch.empty(4, 20, dtype=E4), torch.empty(32, 20, dtype=E4).t())
    assert any("divisible by 16, got 20" in p for p in probs)


def test_cuda_layout_rules_agree_with_fake_cuda_scaled_mm():
    """The rules above are the ones torch._scaled_mm's CUDA meta check enforces (FakeTensor, device cuda)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        s = torch.tensor(1.0, device="cuda")
        a = torch.empty(4, 64, dtype=E4, device="cuda")
        w = torch.empty(32, 64, dtype=E4, device="cuda")
        assert torch._scaled_mm(a, w.t(), s, s, out_dtype=torch.bfloat16).shape == (4, 32)
        with pytest.raises(RuntimeError, match="mat2 must be col_major"):
            torch._scaled_mm(a, w.t().contiguous(), s, s, out_dtype=torch.bfloat16)


# ------------------------------------------------------------------------------------------ decode bytes


def test_gemv_bytes():
    assert fp8.gemv_bytes(1, 16, 32, "bf16") == 2 * 32 * 16 + 2 * 16 + 2 * 32
    assert fp8.gemv_bytes(1, 16, 32, "fp8_tensorwise") == 32 * 16 + 16 + 2 * 32 + 8
    assert fp8.gemv_bytes(2, 16, 32, "fp8_rowwise") == 32 * 16 + 32 + 2 * 64 + 4 * 34
    with pytest.raises(ValueError, match="kind must be"):
        fp8.gemv_bytes(1, 16, 32, "fp4")
    with pytest.raises(ValueError, match="k must be a positive int"):
        fp8.gemv_bytes(1, 0, 32, "bf16")


def test_fp8tensor_is_frozen():
    q = quantize(torch.randn(2, 16))
    assert isinstance(q, FP8Tensor)
    with pytest.raises(AttributeError):
        q.scale = torch.tensor(2.0)  # type: ignore[misc]


def test_fp8_linear_errors():
    with pytest.raises(TypeError, match="nn.Linear without bias"):
        fp8.FP8Linear(torch.nn.Linear(2, 2))


def test_quantize_checks_finite_on_cpu_and_only_on_request_elsewhere():
    x = torch.tensor([[1.0, float("inf")]])
    with pytest.raises(ValueError, match="inf or nan"):
        fp8.quantize(x)
    assert fp8.quantize(x, check_finite=False).data.shape == (1, 2)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_rowwise_output_dtype_goes_to_the_kernel_as_asked(out_dtype, monkeypatch):
    """2.15's CUDA rowwise check accepts bf16, fp16 and fp32 outputs: no bf16 detour for an fp32 result."""
    from pt215.verify.fake_cuda import cuda_tensor, simulated_gpu

    asked = []
    real = F.scaled_mm

    def spy(*args, **kwargs):
        asked.append(kwargs["output_dtype"])
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_mm", spy)
    with simulated_gpu((9, 0)):
        w = quantize(cuda_tensor(32, 64), scaling="rowwise")
        y = fp8.scaled_matmul(cuda_tensor(4, 64), w, out_dtype=out_dtype)
    assert asked == [out_dtype] and y.dtype == out_dtype and tuple(y.shape) == (4, 32)


def test_the_cuda_rowwise_output_rule_quoted_is_the_installed_one():
    """The string the chapter quotes is in the installed libtorch_cuda.so (where a CUDA build is installed)."""
    from pathlib import Path

    lib = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    if not lib.is_file():
        pytest.skip("not a CUDA build of torch")
    import mmap

    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as text:
        assert text.find(b"Only bf16, fp16, and fp32 high precision output types are supported for row-wise "
                         b"scaling.") >= 0
        assert text.find(b"Only bf16 high precision output types are supported for row-wise scaling") < 0


def test_draw_scales_draws_both_scalings_from_quantize():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, w = torch.randn(4, 16), torch.randn(6, 16)
    fig, axes = fp8.draw_scales(x, w)
    titles = [ax.get_title() for ax in axes]
    assert titles[0].startswith("tensorwise") and titles[1].startswith("rowwise")
    plt.close(fig)
    with pytest.raises(ValueError, match="K differs"):
        fp8.draw_scales(x, torch.randn(6, 8))
    with pytest.raises(ValueError, match="small example"):
        fp8.draw_scales(torch.randn(40, 16), w)


def test_scaled_mm_v1_on_cpu_is_the_reference_path_without_onednn_and_close_to_it_with_it():
    """`torch._scaled_mm` on CPU: tensorwise goes to oneDNN where the processor has AMX (other last bits), rowwise
    and every call elsewhere take the reference path. The bounds the chapter states, on its five shapes and three
    seeds: fp32 relative difference below 1e-6; in bf16 under 0.1 % of the elements differ, by at most 16 steps
    of their own (near-zero results), and never by more than one bf16 step of the output's largest value."""
    import warnings

    shapes = [(1, 256, 128), (4, 256, 128), (16, 512, 256), (33, 1024, 64), (64, 1024, 256)]
    tw, rw = F.ScalingType.TensorWise, F.ScalingType.RowWise
    for seed in range(3):
        for m, k, n in shapes:
            g = torch.Generator().manual_seed(seed)
            x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / 16
            qx, qw = quantize(x), quantize(w)
            rx, rw_ = quantize(x, scaling="rowwise"), quantize(w, scaling="rowwise")
            sbr = rw_.scale.reshape(1, n).contiguous()
            for od in (torch.float32, torch.bfloat16):
                ref = fp8.reference_scaled_mm(qx.data, qw.data.t(), qx.scale, qw.scale, out_dtype=od)
                v2 = F.scaled_mm(qx.data, qw.data.t(), qx.scale, tw, qw.scale, tw, output_dtype=od)
                assert torch.equal(v2, ref)
                # rowwise: the reference path on every CPU, oneDNN enabled or not
                ref_r = fp8.reference_scaled_mm(rx.data, rw_.data.t(), rx.scale, sbr, out_dtype=od)
                assert torch.equal(torch._scaled_mm(rx.data, rw_.data.t(), rx.scale, sbr, out_dtype=od), ref_r)
                assert torch.equal(F.scaled_mm(rx.data, rw_.data.t(), rx.scale, rw, sbr, rw, output_dtype=od), ref_r)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with torch.backends.mkldnn.flags(enabled=False):
                        off = torch._scaled_mm(qx.data, qw.data.t(), qx.scale, qw.scale, out_dtype=od)
                assert torch.equal(off, ref)
                try:
                    on = torch._scaled_mm(qx.data, qw.data.t(), qx.scale, qw.scale, out_dtype=od)
                except RuntimeError as e:  # oneDNN held below AMX on an AMX machine
                    assert "primitive descriptor" in str(e)
                    continue
                if od == torch.float32:
                    assert fp8.rel_error(ref, on) < 1e-6
                else:
                    d = (on.float() - ref.float()).abs()
                    own_step = torch.exp2(torch.floor(torch.log2(ref.float().abs().clamp_min(2.0**-126))) - 7)
                    assert (d > 0).float().mean() < 1e-3
                    assert (d / own_step).max() <= 16
                    assert d.max() <= 2.0 ** (torch.floor(torch.log2(ref.float().abs().max())) - 7)
