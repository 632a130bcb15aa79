"""Tests for pt215.moe (chapters 4-6): the router, grouping by expert, grouped vs loop, FP8 experts, the layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pt215 import fp8, moe

E4 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ----------------------------------------------------------------------------------------------- routing


def test_route_is_softmax_topk_renormalised():
    logits = torch.randn(6, 5)
    probs, idx, weights = moe.route(logits, 2)
    ref = torch.softmax(logits, -1)
    torch.testing.assert_close(probs, ref)
    assert idx.shape == (6, 2) and idx.dtype == torch.int64
    assert torch.equal(idx, torch.topk(logits, 2, dim=-1).indices)  # softmax keeps the order of the logits
    top = ref.gather(1, idx)
    torch.testing.assert_close(weights, top / top.sum(-1, keepdim=True))
    torch.testing.assert_close(weights.sum(-1), torch.ones(6))


def test_route_computes_in_fp32_whatever_the_logits_dtype():
    probs, _, weights = moe.route(torch.randn(4, 8).bfloat16(), 3)
    assert probs.dtype == torch.float32 and weights.dtype == torch.float32


@pytest.mark.parametrize(("logits", "top_k", "match"), [
    (torch.randn(4, 3), 0, "top_k must be an int in \\[1, E=3\\]"),
    (torch.randn(4, 3), 4, "top_k must be"),
    (torch.randn(4, 3), True, "top_k must be"),
    (torch.randint(0, 3, (4, 3)), 1, "floating-point"),
])
def test_route_errors(logits, top_k, match):
    with pytest.raises(ValueError, match=match):
        moe.route(logits, top_k)


def test_group_by_expert():
    ids = torch.tensor([2, 0, 2, 3, 0])
    order, offs = moe.group_by_expert(ids, 5)
    assert order.tolist() == [1, 4, 0, 2, 3]  # stable: rows of one expert keep their order
    assert offs.dtype == torch.int32 and offs.tolist() == [2, 2, 4, 5, 5]


@pytest.mark.parametrize(
    "ids,n,match",
    [
        (torch.tensor([0, 5]), 4, "must lie in \\[0, 4\\)"),
        (torch.tensor([0.0]), 4, "1-D integer tensor"),
        (torch.tensor([[0]]), 4, "1-D integer tensor"),
        (torch.tensor([0]), 0, "positive int"),
    ],
)
def test_group_by_expert_errors(ids, n, match):
    with pytest.raises(ValueError, match=match):
        moe.group_by_expert(ids, n)


def test_dispatch_is_route_then_group_by_expert():
    logits = torch.randn(7, 4)
    r = moe.dispatch(logits, 2)
    probs, idx, weights = moe.route(logits, 2)
    order, offs = moe.group_by_expert(idx.reshape(-1), 4)
    assert torch.equal(r.probs, probs) and torch.equal(r.offs, offs)
    assert torch.equal(r.token_idx, torch.arange(7).repeat_interleave(2)[order])
    assert torch.equal(r.weights, weights.reshape(-1)[order])
    assert torch.equal(r.counts, torch.bincount(idx.reshape(-1), minlength=4)) and int(r.counts.sum()) == 14


def test_sort_routes_is_dispatch_without_the_router():
    logits = torch.randn(7, 4)
    r, s = moe.dispatch(logits, 2), moe.sort_routes(*moe.route(logits, 2))
    for name in ("probs", "token_idx", "weights", "counts", "offs"):
        assert torch.equal(getattr(r, name), getattr(s, name))
    probs, idx, weights = moe.route(logits, 2)
    with pytest.raises(ValueError, match="must be route's"):
        moe.sort_routes(probs, idx, weights[:, :1])
    with pytest.raises(ValueError, match="must be route's"):
        moe.sort_routes(probs[:3], idx, weights)


def test_the_book_routers_agree():
    """Chapter 4's router, the chapter-5 model's MoE block and chapter 6's SeededMoE all route with `route`."""
    from pt215 import fsdp

    x = torch.randn(9, 16)
    router = fsdp.Router(16, 4, 2)
    for got, want in zip(router(x), moe.route(router.gate(x), 2), strict=True):
        assert torch.equal(got, want)
    layer = moe.SeededMoE(16, 32, 4, 2, seed=0, dtype=torch.float32)
    r = moe.dispatch(x @ layer.router.t(), 2)
    y = layer(x, "loop")
    ref = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for row in (r.token_idx == t).nonzero().flatten().tolist():
            e = int(torch.searchsorted(r.offs, torch.tensor(row), right=True))
            h = F.silu(x[t] @ layer.w_gate[e].t()) * (x[t] @ layer.w_up[e].t())
            ref[t] += r.weights[row] * (h @ layer.w_down[e].t())
    torch.testing.assert_close(y, ref)


# ------------------------------------------------------------------------------------------ expert matmuls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_grouped_matches_loop(dtype):
    x = torch.randn(10, 32).to(dtype)
    w = torch.randn(4, 16, 32).to(dtype)
    offs = torch.tensor([3, 3, 7, 10], dtype=torch.int32)  # expert 1 empty
    torch.testing.assert_close(moe.moe_grouped(x, w, offs), moe.moe_loop(x, w, offs))


def test_loop_is_one_matmul_per_expert():
    x, w = torch.randn(10, 16), torch.randn(3, 8, 16)
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)  # an empty group in the middle
    ref = torch.cat([x[:4] @ w[0].T, x[4:10] @ w[2].T])
    assert torch.equal(moe.moe_loop(x, w, offs), ref)
    assert torch.equal(moe.moe_loop(x, w, offs, validate=False, bounds=[4, 4, 10]), ref)
    with pytest.raises(ValueError, match="bounds must be 3 Python ints"):
        moe.moe_loop(x, w, offs, bounds=[4, 10])


def test_fp8_loop_close_to_bf16():
    x = torch.randn(10, 32)
    w = torch.randn(4, 16, 32)
    offs = torch.tensor([3, 3, 7, 10], dtype=torch.int32)
    ref = moe.moe_loop(x, w, offs)
    for scaling in ("tensorwise", "rowwise"):
        got = moe.moe_loop_fp8(x, fp8.quantize_experts(w, scaling=scaling), offs, out_dtype=torch.float32)
        assert got.dtype == torch.float32 and fp8.rel_error(ref, got) < 0.06


@pytest.mark.parametrize(
    "x,w,offs,match",
    [
        (torch.randn(4, 8), torch.randn(2, 3, 8), torch.tensor([2, 4]), "offs must be int32"),
        (torch.randn(4, 8), torch.randn(2, 3, 8), torch.tensor([4], dtype=torch.int32), "one entry per expert"),
        (torch.randn(4, 8), torch.randn(2, 3, 8), torch.tensor([3, 2], dtype=torch.int32), "non-decreasing"),
        (torch.randn(4, 8), torch.randn(2, 3, 8), torch.tensor([2, 6], dtype=torch.int32), "must equal the 4 rows"),
        (torch.randn(4, 8), torch.randn(2, 3, 8).bfloat16(), torch.tensor([2, 4], dtype=torch.int32),
         "same dtype"),
        (torch.randn(4, 8).to(E4), torch.randn(2, 3, 8).to(E4), torch.tensor([2, 4], dtype=torch.int32),
         "FP8 experts: use moe_loop_fp8"),
        (torch.randn(4, 8), torch.randn(3, 8), torch.tensor([2, 4], dtype=torch.int32), "\\(E, N, K\\)"),
        (torch.randn(4, 6), torch.randn(2, 3, 8), torch.tensor([2, 4], dtype=torch.int32), "K=6"),
    ],
)
def test_moe_grouped_errors(x, w, offs, match):
    with pytest.raises(ValueError, match=match):
        moe.moe_grouped(x, w, offs)


def test_moe_grouped_without_validation_still_checks_offs_dtype():
    x, w = torch.randn(4, 8), torch.randn(2, 3, 8)
    offs = torch.tensor([2, 4], dtype=torch.int32)
    torch.testing.assert_close(moe.moe_grouped(x, w, offs, validate=False), moe.moe_loop(x, w, offs))
    with pytest.raises(ValueError, match="offs must be int32"):
        moe.moe_grouped(x, w, torch.tensor([2, 4]), validate=False)


def test_moe_loop_fp8_needs_list():
    with pytest.raises(TypeError, match="list of FP8Tensor"):
        moe.moe_loop_fp8(torch.randn(2, 16), fp8.quantize(torch.randn(4, 16)), torch.tensor([2], dtype=torch.int32))


# -------------------------------------------------------------------------------------- the expert MLP


def _reference_mlp(x, idx, weights, w_in, w_out, w_up=None):
    """Token by token: the sum over its k experts of weight * MLP_e(x), written out."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for e, wt in zip(idx[t].tolist(), weights[t], strict=True):
            h = F.silu(x[t] @ w_in[e].t())
            if w_up is not None:
                h = h * (x[t] @ w_up[e].t())
            out[t] += wt * (h @ w_out[e].t())
    return out


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("impl", ["grouped", "loop", "dense"])
def test_expert_mlp_is_each_experts_mlp_mixed_by_the_router(impl, gated):
    x = torch.randn(9, 16)
    probs, idx, weights = moe.route(torch.randn(9, 5), 2)
    w_in, w_up, w_out = torch.randn(5, 24, 16), torch.randn(5, 24, 16), torch.randn(5, 16, 24)
    up = w_up if gated else None
    if impl == "dense":
        got = moe.expert_mlp_dense(x, idx, weights, w_in, w_out, up)
    else:
        r = moe.sort_routes(probs, idx, weights)
        got = moe.expert_mlp(x, r, moe.expert_matmul(impl, r.offs), w_in, w_out, up)
    torch.testing.assert_close(got, _reference_mlp(x, idx, weights, w_in, w_out, up), rtol=1e-4, atol=1e-4)


def test_expert_mlp_mixes_in_mix_dtype():
    x = torch.randn(6, 16).bfloat16()
    r = moe.dispatch(torch.randn(6, 4), 2)
    w_in, w_out = torch.randn(4, 8, 16).bfloat16(), torch.randn(4, 16, 8).bfloat16()
    mm = moe.expert_matmul("loop", r.offs)
    assert moe.expert_mlp(x, r, mm, w_in, w_out).dtype == torch.bfloat16
    out = moe.expert_mlp(x, r, mm, w_in, w_out, mix_dtype=torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.bfloat16(), moe.expert_mlp(x, r, mm, w_in, w_out), rtol=2e-2, atol=2e-2)


def test_expert_matmul_and_dense_errors():
    offs = torch.tensor([2, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="impl must be"):
        moe.expert_matmul("fast", offs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stacked expert weights"):
        moe.expert_mlp_dense(torch.randn(4, 8), torch.zeros(4, 1, dtype=torch.int64), torch.ones(4, 1),
                             torch.randn(8, 8), torch.randn(2, 8, 8))


# ----------------------------------------------------------------------------------------------- layers


def test_seeded_moe():
    layer = moe.SeededMoE(hidden=32, inter=64, num_experts=4, top_k=2, seed=1)
    again = moe.SeededMoE(hidden=32, inter=64, num_experts=4, top_k=2, seed=1)
    assert torch.equal(layer.w_up, again.w_up)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    a, b = layer(x, "grouped"), layer(x, "loop")
    assert a.shape == x.shape and a.dtype == torch.bfloat16
    torch.testing.assert_close(a, b)
    with pytest.raises(RuntimeError, match="to_fp8"):
        layer(x, "fp8")
    layer.to_fp8()
    assert fp8.rel_error(a.float(), layer(x, "fp8").float()) < 0.1
    with pytest.raises(ValueError, match="impl must be"):
        layer(x, "fast")
    with pytest.raises(ValueError, match="top_k must be"):
        moe.SeededMoE(num_experts=2, top_k=3)


def test_moe_variants_match_the_model(tiny_moe_model):
    tok = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = tiny_moe_model(tok)
        for impl in ("grouped", "loop"):
            torch.testing.assert_close(moe.moe_variant(tiny_moe_model, impl)(tok), ref)
        assert torch.equal(moe.moe_variant(tiny_moe_model, "grouped")(tok), ref)  # the model's own path
        assert fp8.rel_error(ref, moe.moe_variant(tiny_moe_model, "fp8")(tok)) < 0.1


def test_moe_variant_errors(tiny_moe_model):
    with pytest.raises(ValueError, match="impl must be"):
        moe.MoEVariant(tiny_moe_model.layers[0].mlp, "fast")
    with pytest.raises(TypeError, match="pt215.model.MoE"):
        moe.MoEVariant(torch.nn.Linear(2, 2), "loop")
    with pytest.raises(ValueError, match="MoE blocks"):
        moe.moe_variant(torch.nn.Linear(2, 2), "loop")


def test_moe_loop_bounds_are_checked():
    x, w = torch.randn(4, 8), torch.randn(2, 3, 8)
    offs = torch.tensor([1, 4], dtype=torch.int32)
    ref = moe.moe_loop(x, w, offs)
    assert torch.equal(moe.moe_loop(x, w, offs, validate=False, bounds=[1, 4]), ref)
    with pytest.raises(ValueError, match="bounds must be 2 Python ints"):
        moe.moe_loop(x, w, offs, bounds=[4])


def test_draw_grouping_shows_one_call_and_one_matmul_per_non_empty_expert():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = moe.draw_grouping(torch.tensor([2, 2, 3, 5], dtype=torch.int32))
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith("one call: F.grouped_mm") for t in texts)
    assert sum(t.startswith(("x[", "w[")) for t in texts) == 3  # experts 0, 2, 3; expert 1 has no rows
    plt.close(fig)
    with pytest.raises(ValueError, match="non-decreasing"):
        moe.draw_grouping([3, 2])


def test_count_mm_calls_sees_the_cpu_fallback_visit_every_expert():
    x, w = torch.randn(4, 8), torch.randn(3, 8, 8)
    offs = torch.tensor([1, 1, 4], dtype=torch.int32)  # expert 1 gets no rows
    assert moe.count_mm_calls(lambda: moe.moe_grouped(x, w, offs)) == 3  # empty experts included
    assert moe.count_mm_calls(lambda: moe.moe_loop(x, w, offs)) == 2
    with pytest.raises(TypeError, match="fn must be callable"):
        moe.count_mm_calls(3)
