"""W8A8 FP8 versions of the chapter-5 models (chapter 6, "FP8 decoding on Apple Silicon").

`fp8_model` converts a `pt215.model.DecoderLM`: every GEMM through `scaled_mm` with FP8 weights and
activations, from the parts `pt215.fp8` (`FP8Linear`) and `pt215.moe` (`MoEVariant("fp8")`) provide.
"""

from __future__ import annotations

import copy

from torch import nn

from pt215.fp8 import FP8Linear, Scaling
from pt215.moe import MoEVariant

__all__ = ["fp8_model"]


def fp8_model(model: nn.Module, *, scaling: Scaling = "rowwise", experts: bool = True,
              lm_head: bool = True) -> nn.Module:
    """A deep copy of a `pt215.model.DecoderLM` with every GEMM in FP8 (W8A8 through `scaled_mm`).

    Attention and dense-MLP linears become `FP8Linear`; MoE blocks become `MoEVariant("fp8")` when
    `experts`; `lm_head` is converted when `lm_head`. The embedding, norms and router stay as they are.
    """
    if not hasattr(model, "layers") or not hasattr(model, "lm_head"):
        raise ValueError("model must be a pt215.model.DecoderLM")
    new = copy.deepcopy(model)
    for blk in new.layers:
        for name in ("wq", "wk", "wv", "wo"):
            setattr(blk.attn, name, FP8Linear(getattr(blk.attn, name), scaling=scaling))
        if hasattr(blk.mlp, "router"):
            if experts:
                blk.mlp = MoEVariant(blk.mlp, "fp8", scaling=scaling)
        else:
            for name in ("w1", "w2", "w3"):
                setattr(blk.mlp, name, FP8Linear(getattr(blk.mlp, name), scaling=scaling))
    if lm_head:
        new.lm_head = FP8Linear(new.lm_head, scaling=scaling)
    return new
