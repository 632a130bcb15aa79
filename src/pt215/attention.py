"""Paged-KV grouped-query attention: a CPU reference for ``torch.nn.attention.varlen.varlen_attn`` (chapter 5).

``varlen_attn(q, k_pages, v_pages, cu_seq_q, None, max_q, max_k, block_table=..., seqused_k=...,
enable_gqa=True)`` reads keys/values from a *pool* of fixed-size pages ``(num_pages, page_size, H_kv, D)``;
row ``i`` of ``block_table`` lists the pages of sequence ``i`` in order and ``seqused_k[i]`` says how many of
their tokens are valid. It runs only on CUDA (cuDNN on sm_90/sm_100, or Flash). :func:`paged_attention_reference`
computes the same thing anywhere: gather the pages, cut to ``seqused_k``, then
``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` per sequence.
:class:`PagePool` is a minimal page allocator showing how paging manages KV memory;
:func:`block_table_figure` draws a pool's block table and pages as the pool holds them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["gather_pages", "paged_attention_reference", "PagePool", "block_table_figure"]


def gather_pages(pages: torch.Tensor, block_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one sequence: ``pages[block_table_row]`` flattened, (length, H_kv, D)."""
    page_size = pages.shape[1]
    n = -(-length // page_size)
    if n > block_table_row.numel():
        raise ValueError(f"length {length} needs {n} pages but the block-table row has {block_table_row.numel()}")
    return pages[block_table_row[:n].long()].flatten(0, 1)[:length]


def paged_attention_reference(query: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                              cu_seq_q: torch.Tensor, block_table: torch.Tensor, seqused_k: torch.Tensor, *,
                              scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                              enable_gqa: bool = True) -> torch.Tensor:
    """Reference for paged ``varlen_attn``; returns ``(T_q, H_q, D_v)`` in ``query.dtype`` (math in float32).

    - ``query``: ``(T_q, H_q, D)``, sequences packed back to back, boundaries in ``cu_seq_q`` (N+1, int32).
    - ``k_pages``: ``(num_pages, page_size, H_kv, D)``; ``v_pages``: the same with its own head dim ``D_v``, as in
      the head-dim pairs cuDNN takes on sm_100 ((192, 128), (192, 192), (256, 128), (256, 256));
      ``block_table``: ``(N, max_pages)`` int32; ``seqused_k``: ``(N,)`` int32 valid key count per sequence.
    - ``window_size=(-1, -1)`` is full attention (varlen_attn's default); ``(-1, 0)`` is causal with the queries
      aligned to the *end* of the keys (query ``j`` of ``n_q`` sees keys ``< seqused_k - n_q + j + 1``), which is
      what a decode step with a KV cache needs. For one query per sequence both are the same.
    """
    if (query.dim() != 3 or k_pages.dim() != 4 or v_pages.dim() != 4 or v_pages.shape[:3] != k_pages.shape[:3]
            or query.shape[2] != k_pages.shape[3]):
        raise ValueError(f"expected query (T, Hq, D), k pages (P, page, Hkv, D) and v pages (P, page, Hkv, D_v), "
                         f"got {tuple(query.shape)}, {tuple(k_pages.shape)}, {tuple(v_pages.shape)}")
    hq, hkv = query.shape[1], k_pages.shape[2]
    if hq != hkv and not enable_gqa:
        raise ValueError(f"Hq={hq} != Hkv={hkv}: set enable_gqa=True for grouped-query attention")
    if hq % hkv:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={hkv}")
    if window_size not in ((-1, -1), (-1, 0)):
        raise ValueError(f"window_size must be (-1, -1) or (-1, 0) in this reference, got {window_size}")
    out = query.new_empty(query.shape[0], hq, v_pages.shape[3])
    bounds = cu_seq_q.tolist()
    for i in range(len(bounds) - 1):
        q = query[bounds[i]:bounds[i + 1]]
        nk = int(seqused_k[i])
        k = gather_pages(k_pages, block_table[i], nk)
        v = gather_pages(v_pages, block_table[i], nk)
        qt, kt, vt = (t.transpose(0, 1).float() for t in (q, k, v))  # (H, T, D)
        mask = None
        if window_size == (-1, 0):
            nq = q.shape[0]
            mask = torch.arange(nk)[None, :] <= (nk - nq + torch.arange(nq))[:, None]
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=True)
        out[bounds[i]:bounds[i + 1]] = o.transpose(0, 1).to(query.dtype)
    return out


class PagePool:
    """A KV page pool: ``k``/``v`` of shape ``(num_pages, page_size, H_kv, D)`` plus a free list.

    ``add_sequence()`` returns a sequence id; ``append(seq, k, v)`` writes new tokens, taking a page from the free
    list only when the last page is full; ``free(seq)`` returns its pages. ``block_table()`` / ``seqused_k()``
    give the int32 tensors ``varlen_attn`` wants. Memory wasted per sequence is < one page (vs. a contiguous cache,
    which reserves ``max_len`` slots per sequence up front).
    """

    def __init__(self, num_pages: int, page_size: int, n_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32) -> None:
        if page_size < 1 or num_pages < 1:
            raise ValueError(f"num_pages and page_size must be >= 1, got {num_pages}, {page_size}")
        shape = (num_pages, page_size, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.page_size = page_size
        self.free_pages = list(range(num_pages - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.pages: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self._next = 0

    def add_sequence(self) -> int:
        sid = self._next
        self._next += 1
        self.pages[sid], self.lengths[sid] = [], 0
        return sid

    def append(self, seq: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append ``k``/``v`` of shape ``(T, H_kv, D)`` to sequence ``seq``."""
        for t in range(k.shape[0]):
            pos = self.lengths[seq]
            if pos % self.page_size == 0:
                if not self.free_pages:
                    raise RuntimeError("PagePool is out of pages: free a sequence or allocate a bigger pool")
                self.pages[seq].append(self.free_pages.pop())
            page = self.pages[seq][pos // self.page_size]
            self.k[page, pos % self.page_size] = k[t]
            self.v[page, pos % self.page_size] = v[t]
            self.lengths[seq] = pos + 1

    def free(self, seq: int) -> None:
        self.free_pages.extend(reversed(self.pages.pop(seq)))
        del self.lengths[seq]

    def block_table(self, seqs: list[int]) -> torch.Tensor:
        width = max(1, max(len(self.pages[s]) for s in seqs))
        bt = torch.zeros(len(seqs), width, dtype=torch.int32)
        for i, s in enumerate(seqs):
            bt[i, :len(self.pages[s])] = torch.tensor(self.pages[s], dtype=torch.int32)
        return bt

    def seqused_k(self, seqs: list[int]) -> torch.Tensor:
        return torch.tensor([self.lengths[s] for s in seqs], dtype=torch.int32)

    def contiguous(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's keys and values as contiguous ``(T, H_kv, D)`` tensors."""
        bt = torch.tensor(self.pages[seq], dtype=torch.int32)
        n = self.lengths[seq]
        return gather_pages(self.k, bt, n), gather_pages(self.v, bt, n)


def block_table_figure(pool: PagePool, seqs: list[int]):
    """A paged KV cache drawn from ``pool``'s state (chapter 5, notebook 5.4): each sequence's block-table row
    (the page numbers it owns, in order), and the pool's pages coloured by the sequence that owns them, with
    the number of valid tokens in each. Returns ``(fig, ax)``; end the cell with ``pt215.figures.show``."""
    from pt215.diagrams import arrow, box, canvas, note

    if not isinstance(pool, PagePool) or not seqs:
        raise ValueError("block_table_figure needs a PagePool and the sequence ids to draw")
    tones = ("blue", "orange", "green", "purple", "vermillion", "sky")
    n_pages = pool.k.shape[0]
    owner = {p: i for i, s in enumerate(seqs) for p in pool.pages[s]}
    width = max(len(pool.pages[s]) for s in seqs)
    cols = max(n_pages, width + 3)
    fig, ax = canvas(7.4, 1.4 + 0.5 * len(seqs) + 1.4, xlim=(-2.6, cols + 0.2),
                     ylim=(-2.9, len(seqs) * 0.9 + 0.3))
    note(ax, -2.5, len(seqs) * 0.9 + 0.05, "block table (one row per sequence)", ha="left", fontsize=9)
    for r, s in enumerate(seqs):
        y = (len(seqs) - 1 - r) * 0.9
        note(ax, -0.2, y + 0.35, f"seq {s}: {pool.lengths[s]} tokens", ha="right", fontsize=8)
        for c in range(width):
            page = pool.pages[s][c] if c < len(pool.pages[s]) else None
            box(ax, c, y, 1, 0.7, "" if page is None else str(page), fill=tones[r % len(tones)] if page is not None
                else "#ffffff", rounded=False, alpha=0.45 if page is not None else 1.0, fontsize=9)
    note(ax, -2.5, -2.6, f"page pool ({n_pages} pages of {pool.page_size} tokens): colour = owner, "
         "number = valid tokens, white = free", ha="left", fontsize=9)
    for p in range(n_pages):
        r = owner.get(p)
        used = 0
        if r is not None:
            s = seqs[r]
            idx = pool.pages[s].index(p)
            used = min(pool.page_size, pool.lengths[s] - idx * pool.page_size)
        box(ax, p, -1.7, 1, 0.8, str(used) if r is not None else "", fill=tones[r % len(tones)] if r is not None
            else "#ffffff", rounded=False, alpha=0.45 if r is not None else 1.0, fontsize=8)
        note(ax, p + 0.5, -2.05, str(p), fontsize=6, tone="grey")
    r = max(range(len(seqs)), key=lambda i: len(pool.pages[seqs[i]]))  # the longest row's indirection
    y = (len(seqs) - 1 - r) * 0.9
    for c, page in enumerate(pool.pages[seqs[r]]):
        arrow(ax, (c + 0.5, y), (page + 0.5, -0.9), dashed=True, tone="grey")
    return fig, ax
