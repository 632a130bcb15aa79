"""Tests for pt215.model (chapters 5 and 6): shapes, KV-cache decode == full forward, MoE, checkpoints."""

import math

import pytest
import torch

from pt215 import model as M

SMALL = dict(vocab_size=256, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=64)


def _model(moe: bool, seed: int = 0) -> M.DecoderLM:
    torch.manual_seed(seed)
    cfg = M.ModelConfig(**SMALL, moe_experts=4 if moe else 0, moe_top_k=2, moe_ffn_hidden=32)
    return M.build_model(cfg).eval()


@pytest.mark.parametrize("moe", [False, True])
def test_forward_shapes(moe):
    m = _model(moe)
    x = torch.randint(0, 256, (3, 10))
    assert m(x).shape == (3, 10, 256)


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_kv_cache_decode_matches_full_forward(moe, seed):
    m = _model(moe, seed)
    x = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full = m(x)
        cache = M.KVCache(m.cfg, 2, 12)
        parts = [m(x[:, :5], cache=cache), m(x[:, 5:9], cache=cache)]
        parts += [m(x[:, i:i + 1], cache=cache) for i in range(9, 12)]
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-4, atol=1e-4)


def test_generate_greedy_is_deterministic_and_matches_no_cache():
    m = _model(False)
    prompt = torch.randint(0, 256, (6,), generator=torch.Generator().manual_seed(3))
    out = M.generate(m, prompt, 5)
    assert out.shape == (5,) and torch.equal(out, M.generate(m, prompt, 5))
    seq = prompt.clone()
    with torch.no_grad():
        for _ in range(5):
            seq = torch.cat([seq, m(seq[None])[0, -1].argmax()[None]])
    assert torch.equal(seq[6:], out)


def test_moe_routing_counts_and_aux():
    m = _model(True)
    with torch.no_grad():
        m(torch.randint(0, 256, (2, 8)))
    moe = m.layers[0].mlp
    assert moe.last_counts.sum().item() == 2 * 8 * 2 and moe.w1.shape == (4, 32, 32)
    assert m.aux_loss().item() > 0


def test_perplexity_and_agreement():
    m = _model(False)
    toks = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(0))
    ppl = M.perplexity(m, toks, seq_len=32)
    assert 50 < ppl < 2000 and math.isfinite(ppl)
    assert M.next_token_agreement(m, m, toks, seq_len=32) == 1.0
    with pytest.raises(ValueError, match="seq_len"):
        M.perplexity(m, toks[:10], seq_len=32)


def test_with_weights_and_gemm_weights():
    m = _model(True)
    names = [n for n, _ in M.gemm_weights(m)]
    assert "lm_head.weight" in names and "layers.0.mlp.w1" in names
    assert not any("norm" in n or "router" in n or "embed" in n for n in names)
    z = M.with_weights(m, lambda n, w: torch.zeros_like(w))
    assert z.lm_head.weight.abs().sum() == 0 and m.lm_head.weight.abs().sum() > 0
    with pytest.raises(ValueError, match="shape"):
        M.with_weights(m, lambda n, w: w.flatten())


def test_config_and_input_errors():
    with pytest.raises(ValueError, match="n_kv_heads"):
        M.ModelConfig(n_heads=4, n_kv_heads=3)
    m = _model(False)
    with pytest.raises(ValueError, match="int64"):
        m(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="name"):
        M.load_pretrained("gpt5")


def test_save_load_roundtrip(tmp_path):
    m = _model(True)
    M.save_checkpoint(m, tmp_path / "m.pt", dtype=torch.float32)
    m2 = M.load_pretrained(path=tmp_path / "m.pt")
    x = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(m(x), m2(x))


def test_tokenizer_and_corpus():
    assert M.decode(M.encode("héllo")) == "héllo"
    train, held = M.load_corpus("train"), M.load_corpus("heldout")
    assert len(train) + len(held) == len(M.load_corpus()) and len(held) > 40_000


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_pretrained_checkpoints_are_trained(name):
    m = M.load_pretrained(name)
    assert m.cfg.is_moe == (name == "moe")
    held = M.load_corpus("heldout")[:2049]
    assert M.perplexity(m, held, seq_len=256) < 8.0  # an untrained byte model is ~256
    ckpt = torch.load(M.DATA_DIR / M.PRETRAINED[name], weights_only=True)
    assert all(v.dtype == torch.bfloat16 for v in ckpt["state_dict"].values())
