"""Tests for pt215.attention (chapter 5): paged-KV GQA reference vs. contiguous SDPA, and the page pool."""

import pytest
import torch
import torch.nn.functional as F

from pt215.attention import PagePool, gather_pages, paged_attention_reference


def _contiguous_ref(q, ks, vs, cu, causal):
    outs = []
    for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
        qi = q[cu[i]:cu[i + 1]].transpose(0, 1)
        nq, nk = qi.shape[1], k.shape[0]
        mask = (torch.arange(nk)[None] <= (nk - nq + torch.arange(nq))[:, None]) if causal else None
        rep = qi.shape[0] // k.shape[1]
        kk = k.transpose(0, 1).repeat_interleave(rep, 0)
        vv = v.transpose(0, 1).repeat_interleave(rep, 0)
        outs.append(F.scaled_dot_product_attention(qi, kk, vv, attn_mask=mask).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("q_lens", [(1, 1, 1), (3, 1, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_paged_reference_matches_contiguous(page_size, q_lens, causal):
    g = torch.Generator().manual_seed(page_size + sum(q_lens))
    hq, hkv, d = 8, 2, 16
    k_lens = [5, 17, 9]
    pool = PagePool(num_pages=32, page_size=page_size, n_kv_heads=hkv, head_dim=d)
    seqs, ks, vs = [], [], []
    for n in k_lens:
        s = pool.add_sequence()
        k, v = torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g)
        seqs.append(s)
        ks.append(k)
        vs.append(v)
    # interleave appends so pages of different sequences are mixed in the pool
    for t in range(max(k_lens)):
        for s, k, v in zip(seqs, ks, vs, strict=True):
            if t < k.shape[0]:
                pool.append(s, k[t:t + 1], v[t:t + 1])
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, generator=g)
    out = paged_attention_reference(q, pool.k, pool.v, cu, pool.block_table(seqs), pool.seqused_k(seqs),
                                    window_size=(-1, 0) if causal else (-1, -1))
    torch.testing.assert_close(out, _contiguous_ref(q, ks, vs, cu.tolist(), causal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dv", [256, 128])
def test_causal_paged_gqa_head_dim_256(dv):
    # the shape the gated cuDNN call of notebook 5.4 uses on sm_100: head dim 256 (v 256 or 128), GQA, causal, bf16
    g = torch.Generator().manual_seed(dv)
    hq, hkv, d, page = 8, 2, 256, 16
    k_lens = [40, 17]  # 3 and 1 queries (cu below)
    n_pages = sum(-(-n // page) for n in k_lens)
    k_pages = torch.randn(n_pages, page, hkv, d, generator=g).bfloat16()
    v_pages = torch.randn(n_pages, page, hkv, dv, generator=g).bfloat16()
    perm = torch.randperm(n_pages, generator=g).to(torch.int32)  # pages scattered through the pool
    block_table = torch.zeros(2, 3, dtype=torch.int32)
    block_table[0, :3], block_table[1, :2] = perm[:3], perm[3:5]
    seqused_k = torch.tensor(k_lens, dtype=torch.int32)
    cu = [0, 3, 4]
    q = torch.randn(4, hq, d, generator=g).bfloat16()
    out = paged_attention_reference(q, k_pages, v_pages, torch.tensor(cu, dtype=torch.int32), block_table,
                                    seqused_k, window_size=(-1, 0))
    assert out.shape == (4, hq, dv) and out.dtype == torch.bfloat16
    ks = [gather_pages(k_pages, block_table[i], k_lens[i]).float() for i in range(2)]
    vs = [gather_pages(v_pages, block_table[i], k_lens[i]).float() for i in range(2)]
    ref = _contiguous_ref(q.float(), ks, vs, cu, causal=True)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


def test_pool_memory_management():
    pool = PagePool(num_pages=4, page_size=4, n_kv_heads=1, head_dim=2)
    a, b = pool.add_sequence(), pool.add_sequence()
    pool.append(a, torch.ones(5, 1, 2), torch.ones(5, 1, 2))
    assert pool.pages[a] == [0, 1] and pool.seqused_k([a]).tolist() == [5]
    pool.append(b, torch.ones(8, 1, 2), torch.ones(8, 1, 2))
    with pytest.raises(RuntimeError, match="out of pages"):
        pool.append(a, torch.ones(4, 1, 2), torch.ones(4, 1, 2))
    pool.free(b)
    assert sorted(pool.free_pages) == [2, 3]
    k, _ = pool.contiguous(a)
    assert k.shape == (8, 1, 2)  # 5 + 3 written before the pool ran out
    assert pool.block_table([a]).dtype == torch.int32


def test_errors():
    q, kp = torch.randn(2, 8, 16), torch.randn(4, 4, 2, 16)
    cu, bt, su = torch.tensor([0, 2], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32), torch.tensor([3])
    with pytest.raises(ValueError, match="enable_gqa"):
        paged_attention_reference(q, kp, kp, cu, bt, su, enable_gqa=False)
    with pytest.raises(ValueError, match="pages"):
        gather_pages(kp, bt[0], 9)


def test_block_table_figure_draws_the_pool():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pt215.attention import block_table_figure

    pool = PagePool(num_pages=6, page_size=2, n_kv_heads=1, head_dim=4)
    seqs = [pool.add_sequence() for _ in range(2)]
    pool.append(seqs[0], torch.zeros(3, 1, 4), torch.zeros(3, 1, 4))
    pool.append(seqs[1], torch.zeros(1, 1, 4), torch.zeros(1, 1, 4))
    fig, _ = block_table_figure(pool, seqs)
    plt.close(fig)
    with pytest.raises(ValueError, match="PagePool"):
        block_table_figure(pool, [])
