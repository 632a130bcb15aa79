"""A small decoder-only language model with real trained weights, and its decode loop (chapters 5 and 6).

The model is a byte-level (vocabulary 256) Llama-style decoder: RMSNorm, rotary position embeddings (RoPE),
grouped-query attention (GQA), and a SwiGLU MLP. With ``moe_experts > 0`` every MLP becomes a top-k routed
mixture of experts whose expert weights are single stacked tensors of shape ``(E, N, K)``, so that one
``torch.nn.functional.grouped_mm`` call computes all experts at once. Routing and the expert matmul are
:mod:`pt215.moe`'s (the book's one MoE); :class:`MoE` is the model's block built on them.

Public API (stable; chapter 6 builds on it):

- :class:`ModelConfig` -- the hyper-parameters (a dataclass; ``asdict`` round-trips through checkpoints).
- :func:`build_model` -- a randomly initialised :class:`DecoderLM` for a config (seeded by the caller).
- :func:`load_pretrained` -- ``"dense"`` or ``"moe"``: the checkpoints trained by
  ``chapters/05-nvfp4-decoding/train_lm.py`` and shipped in ``data/05-nvfp4-decoding/``.
- :class:`KVCache` and :func:`generate` -- greedy/temperature decoding with a contiguous KV cache.
- :func:`perplexity` and :func:`next_token_agreement` -- quality metrics on held-out bytes.
- :func:`gemm_weights` and :func:`with_weights` -- the weights a GEMM reads (the ones a low-precision
  format replaces), and a copy of a model with a function applied to each of them (e.g. quantize-dequantize).
- :func:`load_corpus`, :func:`encode`, :func:`decode` -- the byte-level text the models were trained on.

Calling convention: ``model(tokens)`` with ``tokens`` an int64 tensor ``(B, T)`` returns logits ``(B, T, 256)``
(float32 when the model is float32, otherwise the model's dtype). ``model(tokens, cache=cache)`` appends the new
keys/values to ``cache`` at position ``cache.length`` and advances it, which is how :func:`generate` decodes one
token at a time.
"""

from __future__ import annotations

import copy
import gzip
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pt215.book_files import book_root
from pt215.moe import dispatch, expert_matmul, expert_mlp

__all__ = [
    "ModelConfig",
    "DecoderLM",
    "KVCache",
    "build_model",
    "load_pretrained",
    "save_checkpoint",
    "generate",
    "perplexity",
    "next_token_agreement",
    "gemm_weights",
    "with_weights",
    "load_corpus",
    "encode",
    "decode",
    "DATA_DIR",
]

DATA_DIR = book_root() / "data" / "05-nvfp4-decoding"  # a checkout's data/ or the wheel's copy (pt215.book_files)
"""Where the chapter-5 checkpoints and the training corpus live (repo checkout, editable install)."""

PRETRAINED = {"dense": "lm-dense.pt", "moe": "lm-moe.pt"}


@dataclass
class ModelConfig:
    """Hyper-parameters of :class:`DecoderLM`.

    ``n_heads`` query heads share ``n_kv_heads`` key/value heads (GQA; ``n_heads % n_kv_heads == 0``).
    ``head_dim = d_model // n_heads``. The dense MLP has hidden size ``ffn_hidden``. With ``moe_experts > 0``
    each MLP is a router plus ``moe_experts`` SwiGLU experts of hidden size ``moe_ffn_hidden``, each token
    using its ``moe_top_k`` best experts (weights renormalised over the chosen k).
    Keep ``d_model``, ``ffn_hidden`` and ``moe_ffn_hidden`` multiples of 16 (NVFP4/FP8 block scaling).
    """

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_hidden: int = 352
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_ffn_hidden: int = 128

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads} (GQA)")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"head_dim={self.d_model // self.n_heads} must be even for RoPE")
        if self.moe_experts and not 1 <= self.moe_top_k <= self.moe_experts:
            raise ValueError(f"moe_top_k={self.moe_top_k} must be in [1, moe_experts={self.moe_experts}]")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def is_moe(self) -> bool:
        return self.moe_experts > 0


# --------------------------------------------------------------------------------------------------- tokenizer
def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as an int64 tensor (the byte-level tokenizer: token id = byte value)."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(tokens: torch.Tensor) -> str:
    """Inverse of :func:`encode` (invalid UTF-8 sequences are replaced)."""
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


def load_corpus(split: str = "all") -> torch.Tensor:
    """The training text as int64 byte tokens: ``"train"`` (first 90%), ``"heldout"`` (last 10%) or ``"all"``.

    The text is Python 3.11.7's ``pydoc_data.topics`` (the language-reference help topics), shipped as
    ``data/05-nvfp4-decoding/corpus.txt.gz`` so that every install sees the same bytes.
    """
    path = DATA_DIR / "corpus.txt.gz"
    raw = gzip.decompress(path.read_bytes())
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    cut = int(len(t) * 0.9)
    if split == "all":
        return t
    if split == "train":
        return t[:cut]
    if split == "heldout":
        return t[cut:]
    raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")


# --------------------------------------------------------------------------------------------------- layers
def _rope_cache(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    ang = torch.arange(cfg.max_seq_len, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, Dh); cos/sin: (T, Dh/2). Rotates the pairs (x[..., i], x[..., i + Dh/2])."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype)


class KVCache:
    """Contiguous per-layer key/value cache for :func:`generate`.

    ``k[layer]`` and ``v[layer]`` have shape ``(B, n_kv_heads, max_len, head_dim)``; positions
    ``[0, length)`` are filled. ``nbytes`` is the memory it holds; ``bytes_per_token`` is what one more
    position costs (``2 * n_layers * n_kv_heads * head_dim * itemsize`` per sequence).
    """

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        if max_len > cfg.max_seq_len:
            raise ValueError(f"max_len={max_len} exceeds cfg.max_seq_len={cfg.max_seq_len}")
        shape = (batch, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.length = 0
        self.max_len = max_len

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def bytes_per_token(self) -> int:
        b, h, _, d = self.k[0].shape
        return 2 * len(self.k) * h * d * self.k[0].element_size()


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.d_model, cfg.head_dim
        self.wq = nn.Linear(d, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int,
                cache: KVCache | None) -> torch.Tensor:
        cfg = self.cfg
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        start = 0
        if cache is not None:
            start = cache.length
            cache.k[layer][:, :, start:start + t] = k.to(cache.k[layer].dtype)
            cache.v[layer][:, :, start:start + t] = v.to(cache.v[layer].dtype)
            k = cache.k[layer][:, :, :start + t].to(q.dtype)
            v = cache.v[layer][:, :, :start + t].to(q.dtype)
        if start == 0:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        elif t == 1:
            o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        else:
            allowed = torch.arange(start + t)[None, :] <= (start + torch.arange(t))[:, None]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
        return self.wo(o.transpose(1, 2).reshape(b, t, cfg.n_heads * cfg.head_dim))


class SwiGLU(nn.Module):
    """Dense MLP: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """Top-k routed SwiGLU experts with stacked weights.

    Parameters: ``router`` (nn.Linear d -> E), ``w1``/``w3`` of shape (E, F, d) and ``w2`` of shape (E, d, F).
    ``forward`` routes and sorts the (token, expert) pairs by expert (:func:`pt215.moe.dispatch`) and runs the
    book's one expert MLP, :func:`pt215.moe.expert_mlp`, with one ``grouped_mm`` per projection: the results
    are scattered back weighted by the renormalised router probabilities. After each forward, ``aux_loss`` holds
    the Switch-Transformer load-balancing loss and ``last_counts`` the tokens per expert.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e, d, f = cfg.moe_experts, cfg.d_model, cfg.moe_ffn_hidden
        self.top_k = cfg.moe_top_k
        self.router = nn.Linear(d, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, f, d))
        self.w3 = nn.Parameter(torch.empty(e, f, d))
        self.w2 = nn.Parameter(torch.empty(e, d, f))
        for w in (self.w1, self.w3):
            nn.init.normal_(w, std=d ** -0.5)
        nn.init.normal_(self.w2, std=f ** -0.5)
        self.aux_loss = torch.zeros(())
        self.last_counts = torch.zeros(e, dtype=torch.long)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        n, e = x.shape[0], self.w1.shape[0]
        r = dispatch(self.router(x), self.top_k)
        # one grouped_mm per projection, no host read of the offsets, so a GPU step keeps running ahead
        out = expert_mlp(x, r, expert_matmul("grouped", r.offs), self.w1, self.w2, self.w3)
        frac = r.counts.float() / max(n * self.top_k, 1)
        self.aux_loss = e * (frac * r.probs.mean(0)).sum()
        self.last_counts = r.counts.detach()
        return out.view(shape)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp: nn.Module = MoE(cfg) if cfg.is_moe else SwiGLU(cfg.d_model, cfg.ffn_hidden)

    def forward(self, x, cos, sin, layer, cache):
        x = x + self.attn(self.attn_norm(x), cos, sin, layer, cache)
        return x + self.mlp(self.mlp_norm(x))


class DecoderLM(nn.Module):
    """The decoder: ``embed`` -> ``n_layers`` x :class:`Block` -> ``norm`` -> ``lm_head`` (untied)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        # float32 RoPE tables, deliberately not buffers: ``model.to(torch.bfloat16)`` must not round them.
        self._rope = _rope_cache(cfg)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        if tokens.dtype != torch.long or tokens.dim() != 2:
            raise ValueError(f"tokens must be an int64 tensor (B, T), got {tokens.dtype} {tuple(tokens.shape)}")
        b, t = tokens.shape
        start = cache.length if cache is not None else 0
        if start + t > self.cfg.max_seq_len:
            raise ValueError(f"position {start + t} exceeds max_seq_len={self.cfg.max_seq_len}")
        if cache is not None and start + t > cache.max_len:
            raise ValueError(f"KV cache full: length {start} + {t} new > max_len={cache.max_len}")
        if self._rope[0].device != tokens.device:
            self._rope = tuple(r.to(tokens.device) for r in self._rope)
        cos = self._rope[0][start:start + t]
        sin = self._rope[1][start:start + t]
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, i, cache)
        if cache is not None:
            cache.length = start + t
        return self.lm_head(self.norm(x))

    def aux_loss(self) -> torch.Tensor:
        """Sum of the MoE load-balancing losses of the last forward (0 for a dense model)."""
        losses = [blk.mlp.aux_loss for blk in self.layers if isinstance(blk.mlp, MoE)]
        return torch.stack(losses).sum() if losses else torch.zeros(())

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def build_model(cfg: ModelConfig) -> DecoderLM:
    """A freshly initialised :class:`DecoderLM` (float32; seed with ``torch.manual_seed`` first)."""
    model = DecoderLM(cfg)
    for name, p in model.named_parameters():
        if p.dim() == 2 and "norm" not in name:
            nn.init.normal_(p, std=p.shape[1] ** -0.5 if "embed" not in name else 1.0)
    # Scale the residual-stream writers down (GPT-2 style) so deep stacks start stable.
    for blk in model.layers:
        blk.attn.wo.weight.data.mul_((2 * cfg.n_layers) ** -0.5)
        w2 = blk.mlp.w2 if isinstance(blk.mlp, MoE) else blk.mlp.w2.weight
        w2.data.mul_((2 * cfg.n_layers) ** -0.5)
    return model


# --------------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(model: DecoderLM, path: str | Path, *, dtype: torch.dtype = torch.bfloat16,
                    meta: dict | None = None) -> None:
    """Save ``{"config": asdict(cfg), "state_dict": ..., "meta": ...}`` (plain types, weights_only-loadable)."""
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    torch.save({"config": asdict(model.cfg), "state_dict": sd, "meta": meta or {}}, path)


def load_pretrained(name: str = "dense", *, dtype: torch.dtype = torch.float32,
                    path: str | Path | None = None) -> DecoderLM:
    """Load a shipped checkpoint: ``"dense"`` (``lm-dense.pt``) or ``"moe"`` (``lm-moe.pt``), in eval mode.

    Weights are stored in bfloat16; ``dtype`` is what the returned model computes in (float32 by default, which
    makes bf16 the exact baseline for the quantization experiments). ``model.meta`` holds the training record
    (command, seed, steps, losses). Pass ``path`` to load another checkpoint written by :func:`save_checkpoint`.
    """
    if path is None:
        if name not in PRETRAINED:
            raise ValueError(f"name must be one of {sorted(PRETRAINED)}, got {name!r}")
        path = DATA_DIR / PRETRAINED[name]
    ckpt = torch.load(path, weights_only=True, map_location="cpu")
    model = DecoderLM(ModelConfig(**ckpt["config"]))
    model.load_state_dict({k: v.float() for k, v in ckpt["state_dict"].items()})
    model.meta = ckpt.get("meta", {})
    return model.to(dtype).eval()


# --------------------------------------------------------------------------------------------------- weights
def gemm_weights(model: DecoderLM) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, weight)`` for every weight a GEMM reads: attention/MLP linears, stacked experts, ``lm_head``.

    Excluded (kept in high precision by every recipe in the book): the embedding (a gather, not a GEMM),
    the RMSNorm weights and the MoE router. Stacked expert weights are 3-D (E, N, K); all others (N, K).
    """
    for name, p in model.named_parameters():
        if "norm" in name or "router" in name or name.startswith("embed"):
            continue
        yield name, p


def with_weights(model: DecoderLM, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> DecoderLM:
    """A deep copy of ``model`` whose GEMM weights (see :func:`gemm_weights`) are replaced by ``fn(name, w)``.

    ``fn`` must return a tensor of the same shape; it is cast to the weight's dtype. Typical use: a
    quantize-dequantize round trip, ``with_weights(m, lambda n, w: nvfp4.quantize(w).dequantize())``.
    """
    new = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in gemm_weights(new):
            q = fn(name, p.detach())
            if q.shape != p.shape:
                raise ValueError(f"fn returned shape {tuple(q.shape)} for {name}, expected {tuple(p.shape)}")
            p.copy_(q.to(p.dtype))
    return new


# --------------------------------------------------------------------------------------------------- decoding
@torch.no_grad()
def generate(model: DecoderLM, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
             generator: torch.Generator | None = None, cache_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Decode ``max_new_tokens`` after ``prompt`` (int64, (T,) or (B, T)) with a KV cache.

    One prefill forward over the prompt, then one forward per new token (T=1) that reads the whole cache.
    ``temperature=0`` is greedy (deterministic); otherwise sample from ``softmax(logits / temperature)``
    with ``generator``. Returns the new tokens only, shape (B, max_new_tokens) (or (max_new_tokens,) for 1-D).
    """
    squeeze = prompt.dim() == 1
    tokens = prompt[None] if squeeze else prompt
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    dtype = cache_dtype or next(model.parameters()).dtype
    cache = KVCache(model.cfg, tokens.shape[0], tokens.shape[1] + max_new_tokens, dtype=dtype,
                    device=tokens.device)
    logits = model(tokens, cache=cache)[:, -1]
    out = []
    for i in range(max_new_tokens):
        if temperature > 0:
            nxt = torch.multinomial(F.softmax(logits.float() / temperature, -1), 1, generator=generator)
        else:
            nxt = logits.argmax(-1, keepdim=True)
        out.append(nxt)
        if i + 1 < max_new_tokens:
            logits = model(nxt, cache=cache)[:, -1]
    res = torch.cat(out, dim=1)
    return res[0] if squeeze else res


def _windows(tokens: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = (len(tokens) - 1) // seq_len
    if n < 1:
        raise ValueError(f"need more than seq_len={seq_len} tokens, got {len(tokens)}")
    return tokens[: n * seq_len + 1]


@torch.no_grad()
def perplexity(model: DecoderLM, tokens: torch.Tensor, *, seq_len: int = 256, batch: int = 16) -> float:
    """exp(mean next-token cross-entropy) over non-overlapping windows of ``seq_len`` (bytes -> per-byte ppl)."""
    t = _windows(tokens, seq_len)
    n = (len(t) - 1) // seq_len
    x = t[:-1].view(n, seq_len)
    y = t[1:].view(n, seq_len)
    total = 0.0
    for i in range(0, n, batch):
        logits = model(x[i:i + batch]).float()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i:i + batch].reshape(-1),
                                 reduction="sum").item()
    return math.exp(total / (n * seq_len))


@torch.no_grad()
def next_token_agreement(model: DecoderLM, reference: DecoderLM, tokens: torch.Tensor, *, seq_len: int = 256,
                         batch: int = 16) -> float:
    """Fraction of positions where ``model`` and ``reference`` predict the same greedy next token."""
    t = _windows(tokens, seq_len)
    n = (len(t) - 1) // seq_len
    x = t[:-1].view(n, seq_len)
    same = 0
    for i in range(0, n, batch):
        same += (model(x[i:i + batch]).argmax(-1) == reference(x[i:i + batch]).argmax(-1)).sum().item()
    return same / (n * seq_len)
