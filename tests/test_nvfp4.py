"""Tests for pt215.nvfp4 (chapter 5): bit-exactness with torchao, edge cases, the SWIZZLE_32_4_4 layout."""

import pytest
import torch

from pt215 import nvfp4

ao = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")


def _torchao(x, g):
    return ao.NVFP4Tensor.to_nvfp4(x.contiguous(), per_tensor_scale=g)


def _same(q, a):
    return (torch.equal(q.qdata, a.qdata.view(torch.uint8))
            and torch.equal(q.scale.view(torch.uint8), a.scale.view(torch.uint8))
            and torch.equal(q.per_tensor_scale, a.per_tensor_scale))


@pytest.mark.parametrize("shape", [(1, 16), (4, 16), (3, 64), (17, 48), (64, 128), (2, 5, 32), (4, 8, 80)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bit_exact_with_torchao(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    # rows of very different magnitude exercise the e4m3 scale range and its lower clamp
    x = (torch.randn(shape, generator=g) * 10.0 ** torch.randint(-4, 3, (*shape[:-1], 1), generator=g)).to(dtype)
    gs = ao.per_tensor_amax_to_scale(x.abs().amax())
    q, a = nvfp4.quantize(x, gs), _torchao(x, gs)
    assert _same(q, a)
    assert torch.equal(q.dequantize(torch.float32), a.dequantize(torch.float32))
    # default per-tensor scale is the same formula
    assert torch.equal(nvfp4.quantize(x).per_tensor_scale, gs)


def test_rounding_ties_and_signed_zero():
    x = torch.tensor([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.0, 0.1, -0.1, 6.0, 0.5, 1.0, 1.5, -2.0]])
    g = torch.tensor(1.0)  # block amax 6 -> block scale exactly 1 -> elements are x itself
    q, a = nvfp4.quantize(x, g), _torchao(x, g)
    assert _same(q, a)
    codes = q.codes()[0].tolist()
    assert codes[:7] == [0, 2, 2, 4, 4, 6, 6]  # ties to the even code
    assert codes[7:11] == [8, 8, 0, 8]  # -0.25 -> -0, -0.0 -> -0, 0.1 -> 0, -0.1 -> -0
    assert codes[11:] == [7, 1, 2, 3, 12]


def test_grid_roundtrip_exact():
    grid = torch.cat([nvfp4.E2M1_GRID, -nvfp4.E2M1_GRID]).repeat(1)
    assert torch.equal(nvfp4.e2m1_decode(nvfp4.e2m1_encode(grid)), grid)
    codes = torch.arange(16, dtype=torch.uint8).view(2, 8)
    assert torch.equal(nvfp4.unpack(nvfp4.pack(codes)), codes)
    assert nvfp4.pack(torch.tensor([[1, 2]], dtype=torch.uint8)).item() == 0x21  # element 0 in the low nibble


def test_zero_block_and_zero_tensor():
    x = torch.randn(2, 32)
    x[1, 16:] = 0
    q = nvfp4.quantize(x)
    assert q.scale[1, 1].float().item() == nvfp4.E4M3_TINY
    assert torch.all(q.dequantize()[1, 16:] == 0)
    z = nvfp4.quantize(torch.zeros(3, 16))
    assert z.per_tensor_scale.item() == 1.0
    assert torch.equal(z.dequantize(), torch.zeros(3, 16))


def test_out_of_range_saturates_with_given_scale():
    x = torch.full((1, 16), 1e6)
    q = nvfp4.quantize(x, torch.tensor(1.0))
    assert torch.all(q.dequantize() == 6 * 448)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_rejected(bad):
    x = torch.randn(2, 16)
    x[0, 3] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        nvfp4.quantize(x)


def test_bad_inputs():
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.quantize(torch.randn(4, 24))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        nvfp4.quantize(torch.ones(4, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="positive"):
        nvfp4.quantize(torch.randn(4, 16), torch.tensor(0.0))


@pytest.mark.parametrize("rows,cols", [(128, 4), (1, 1), (130, 6), (256, 32), (300, 9)])
def test_to_blocked_matches_references(rows, cols):
    s = torch.arange(rows * cols, dtype=torch.float32).view(rows, cols) + 1
    b = nvfp4.to_blocked(s)
    assert b.numel() == 128 * -(-rows // 128) * 4 * -(-cols // 4)
    assert torch.equal(nvfp4.from_blocked(b, rows, cols), s)
    from torchao.prototype.mx_formats.utils import to_blocked as ao_to_blocked

    assert torch.equal(b, ao_to_blocked(s).flatten())
    try:
        from torch._higher_order_ops.flex_gemm import to_blocked as hop_to_blocked
    except ImportError:
        return
    assert torch.equal(b, hop_to_blocked(s).flatten())


def test_to_blocked_tile_rule():
    s = torch.arange(512).view(128, 4)
    b = nvfp4.to_blocked(s).view(32, 16)
    for r in (0, 31, 32, 100, 127):
        for c in range(4):
            assert b[r % 32, 4 * (r // 32) + c].item() == s[r, c].item()


def test_bits_and_bytes():
    assert nvfp4.bits_per_element((256, 512)) == pytest.approx(4.5, abs=1e-3)
    q = nvfp4.quantize(torch.randn(8, 64))
    assert q.nbytes == 8 * 32 + 8 * 4 + 4 and q.shape == (8, 64)


def test_fp8_roundtrip():
    w = torch.randn(16, 64)
    for gran in ("tensorwise", "rowwise"):
        r = nvfp4.fp8_roundtrip(w, gran)
        assert (r - w).norm() / w.norm() < 0.05
    with pytest.raises(ValueError, match="granularity"):
        nvfp4.fp8_roundtrip(w, "blockwise")


def test_fp8_roundtrip_is_fp8_quantize_and_handles_stacked_experts():
    from pt215 import fp8

    w = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(0))
    rows = fp8.quantize(w.reshape(32, 32), scaling="rowwise").dequantize()
    assert torch.equal(nvfp4.fp8_roundtrip(w, "rowwise"), rows.reshape(4, 8, 32))
    assert torch.equal(nvfp4.fp8_roundtrip(w, "tensorwise"), fp8.quantize(w).dequantize())
    # fp8.quantize clamps to +-448 before the cast; torch 2.15's float32 -> e4m3fn cast saturates finite values
    # above 448 to 448 too, so the unclamped formula chapter 5 used before gives the same values
    scale = w.abs().amax(dim=-1, keepdim=True) / 448
    assert torch.equal(nvfp4.fp8_roundtrip(w, "rowwise"), (w / scale).to(torch.float8_e4m3fn).float() * scale)
    assert torch.tensor([448.00003, 479.0, 1e6]).to(torch.float8_e4m3fn).float().tolist() == [448.0] * 3


def _operands():
    g = torch.Generator().manual_seed(0)
    return nvfp4.mm_operands(nvfp4.quantize(torch.randn(16, 512, generator=g)),
                             nvfp4.quantize(torch.randn(256, 512, generator=g) * 0.02))


def test_post_grad_scale_fold_fires_only_for_the_foldable_form():
    args = _operands()
    fold = nvfp4.post_grad_scale_fold(nvfp4.scaled_mm_foldable, args)
    assert fold["before"].count("mul.Tensor") == 2 and fold["after"].count("mul.Tensor") == 1  # ga * gb stays
    assert fold["folded"] == 1 and fold["scale_result"]
    for kwargs in ({"backends": "ATEN,TRITON"}, {"max_autotune": False}):
        assert nvfp4.post_grad_scale_fold(nvfp4.scaled_mm_foldable, args, **kwargs)["folded"] == 0
    two_level = nvfp4.post_grad_scale_fold(nvfp4.scaled_mm, args)
    assert two_level["folded"] == 0 and "_scaled_mm_v2.default" in two_level["after"]
    # a pointwise op after the multiply is left to epilogue fusion; a Python float is not a 0-D tensor
    assert nvfp4.post_grad_scale_fold(lambda *a: nvfp4.scaled_mm_foldable(*a).float(), args)["folded"] == 0
    half = nvfp4.post_grad_scale_fold(
        lambda A, B, sa, sb, ga, gb: torch._scaled_mm(A, B.t(), sa, sb, out_dtype=torch.bfloat16) * 0.5, args)
    assert half["folded"] == 0
    with pytest.raises(TypeError, match="operands"):
        nvfp4.post_grad_scale_fold(nvfp4.scaled_mm, ([1, 2],))


def test_installed_inductor_has_the_fallback_and_fold_the_book_describes():
    import inspect

    from torch._inductor.fx_passes import post_grad
    from torch._inductor.kernel import mm

    v2 = inspect.getsource(mm.tuned_scaled_mm_v2)
    for needle in ("ScalingType.BlockWise1x16", "not is_single_level_scale", "any(s != 0 for s in swizzle_a)",
                   "return fallback()", "scaled_mm_v2_fallback("):
        assert needle in v2, needle
    check = inspect.getsource(post_grad._can_fold_scaled_mm_output_scale)
    for needle in ('_use_autotune_backend("NVGEMM")', "torch.float4_e2m1fn_x2", "torch.float8_e4m3fn",
                   'scale_val.device.type == "cuda"', "scale_val.dim() == 0", "_pointwise_chain_can_fuse_to_output"):
        assert needle in check, needle
    assert "aten._scaled_mm.default" in inspect.getsource(post_grad._fold_scaled_mm_output_scale)


@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_roundtrip_is_quantize_then_dequantize_bit_for_bit(scale, dtype):
    g = torch.Generator().manual_seed(3)
    for shape in [(1, 16), (33, 64), (2, 7, 48), (128, 352)]:
        x = (torch.randn(shape, generator=g) * scale).to(dtype)
        x.view(-1)[:4] = torch.tensor([0.0, -0.0, 1e-30, -1e-30]).to(dtype)  # zeros and values that round to zero
        a, b = nvfp4.quantize(x).dequantize(torch.float32), nvfp4.roundtrip(x)
        assert torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b)), shape
    zeros = torch.zeros(2, 16)
    assert torch.equal(nvfp4.roundtrip(zeros), nvfp4.quantize(zeros).dequantize(torch.float32))
    # every rounding tie and its neighbours, with blocks whose maximum is 6 (so the scaled value is x itself)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 1.9999, 2.0, 3.9999, 4.0, 4.9999, 5.0001,
                         0.2499, 0.2501])
    x = torch.stack([ties, -ties, ties.flip(0), -ties.flip(0)])
    assert torch.equal(nvfp4.roundtrip(x), nvfp4.quantize(x).dequantize(torch.float32))
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.roundtrip(torch.ones(2, 8))


def test_w4a4_quantizes_every_gemm_input_and_computes_the_dequantized_product():
    from pt215 import model as M

    torch.manual_seed(0)
    cfg = M.ModelConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=64)
    base = M.build_model(cfg).eval()
    q = nvfp4.w4a4(base)
    tokens = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        out = q(tokens)
    assert out.shape == (2, 8, 256) and q.gemms == 7 * cfg.n_layers + 1
    # the weights are NVFP4 round trips, the base model is untouched
    w = base.layers[0].attn.wq.weight
    assert torch.equal(q.inner.layers[0].attn.wq.weight, nvfp4.roundtrip(w)) and not torch.equal(
        q.inner.layers[0].attn.wq.weight, w)
    x = torch.randn(3, cfg.d_model)
    with nvfp4._QuantizeGemmInputs(q._storages) as mode:
        y = q.inner.layers[0].attn.wq(x)
    assert mode.gemms == 1 and torch.equal(y, nvfp4.roundtrip(x) @ nvfp4.roundtrip(w).T)
    # an activation feeding q, k and v is quantized once; a different one is not confused with it
    with nvfp4._QuantizeGemmInputs(q._storages) as mode:
        a, b = q.inner.layers[0].attn.wq(x), q.inner.layers[0].attn.wk(x * 2)
    wk = base.layers[0].attn.wk.weight
    assert torch.equal(a, y) and torch.equal(b, nvfp4.roundtrip(x * 2) @ nvfp4.roundtrip(wk).T)
    with pytest.raises(ValueError, match="DecoderLM"):
        nvfp4.w4a4(torch.nn.Linear(16, 16))


def test_w4a4_reaches_the_stacked_experts():
    from pt215 import model as M

    torch.manual_seed(0)
    cfg = M.ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, moe_experts=4, moe_top_k=2,
                        moe_ffn_hidden=32)
    q = nvfp4.w4a4(M.build_model(cfg).eval())
    with torch.no_grad():
        q(torch.randint(0, 256, (1, 6)))
    assert q.gemms == 4 + 3 + 1  # attention, the three grouped expert GEMMs, lm_head; the router stays


def test_layout_figure_draws_one_block():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, _ = nvfp4.layout_figure()
    plt.close(fig)
    with pytest.raises(ValueError, match="16 values"):
        nvfp4.layout_figure(torch.ones(8))


def test_mlp_gate_up_is_silu_gate_times_up():
    fn, ops = nvfp4.mlp_layer()
    assert fn is nvfp4.mlp_gate_up and len(ops) == 12
    with pytest.raises(ValueError, match="6 operands of the gate GEMM"):
        nvfp4.mlp_gate_up(*ops[:6])
    fold = nvfp4.post_grad_scale_fold(nvfp4.mlp_gate_up, ops)
    assert fold["folded"] == 0 and fold["after"].count("_scaled_mm.default") == 2  # a pointwise chain: by design


def test_the_nvfp4_gemm_gate_admits_sm120_and_nvgemm_does_not():
    from pt215.needs import describe_need, sm_admits

    assert sm_admits("100+", (12, 0)) and sm_admits("100+", (10, 3)) and not sm_admits("100+", (9, 0))
    assert not sm_admits("100", (12, 0)) and sm_admits("100", (10, 0))
    assert describe_need("sm_100+") == "a CUDA GPU of compute capability sm_100 or later (any architecture)"
