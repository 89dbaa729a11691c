"""Reference solution: grouped-query and multi-query attention.

A model answer to exercises/gqa.py: the same functions with the same contracts,
each written as the shortest clear code, with the shape of every reshape and
matmul in a comment. Compare with your own once the grader passes, or when you
are stuck on a step.
"""

import math

import torch
from torch import nn


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each KV head n_rep times in a row: (B, Hkv, T, Dh) -> (B, Hkv * n_rep, T, Dh).

    Output head h is KV head h // n_rep: with Hkv = 2 and n_rep = 3 the heads
    come out 0, 0, 0, 1, 1, 1 (each head repeated in place), not
    0, 1, 0, 1, 0, 1 (the whole head axis tiled). n_rep == 1 returns the same
    values.

    Why: in grouped-query attention G = Hq / Hkv consecutive query heads share
    one KV head. Repeating each KV head G times lines the KV heads up with the
    query heads, so the attention of multi-head attention can run unchanged.
    The saving is in what is stored (the KV cache holds Hkv heads, not Hq):
    the copies made here exist only for the duration of the call.
    """
    # (B, Hkv, T, Dh) -> (B, Hkv * n_rep, T, Dh): head h is x[:, h // n_rep].
    # Llama writes it x[:, :, None].expand(B, Hkv, n_rep, T, Dh).reshape(...), which is the same.
    return x.repeat_interleave(n_rep, dim=1)


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Scaled dot-product attention in which groups of query heads share a KV head.

    Shapes: q (B, Hq, Tq, Dh), k and v (B, Hkv, Tk, Dh), where Hkv divides Hq;
    returns (B, Hq, Tq, Dh). Query head h attends with KV head h // G, where
    G = Hq / Hkv. Scores are q . k / sqrt(Dh), Dh the head width.

    mask: bool, True = may attend, broadcastable to (B, Hq, Tq, Tk), or None.
    A query row the mask blocks entirely gives zeros (no NaN), as
    F.scaled_dot_product_attention gives.

    Hkv == 1 is multi-query attention (every query head shares one KV head);
    Hkv == Hq is ordinary multi-head attention. Both repeating the KV heads
    (repeat_kv) and a grouped reshape of q to (B, Hkv, G, Tq, Dh) are correct.

    Why: what GQA saves is memory and memory bandwidth at inference: the keys
    and values a decoder caches shrink by G (Llama 2 70B and Llama 3 keep 8
    KV heads for 64 or 32 query heads), and decoding is bound by reading that
    cache. What it costs is some quality, since the query heads of a group can
    no longer look for different keys; the compute of the attention itself
    does not shrink, every query head still scores every key.

    Must not call F.scaled_dot_product_attention.
    """
    Dh = q.shape[-1]  # head width
    G = q.shape[1] // k.shape[1]  # query heads per KV head
    k, v = repeat_kv(k, G), repeat_kv(v, G)  # (B, Hkv, Tk, Dh) -> (B, Hq, Tk, Dh)
    scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)  # (B, Hq, Tq, Dh) x (B, Hq, Dh, Tk) -> (B, Hq, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # mask broadcasts to (B, Hq, Tq, Tk)
    # A fully blocked row is all -inf, which softmax turns into NaN: make it zeros.
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # (B, Hq, Tq, Tk)
    return weights @ v  # (B, Hq, Tq, Tk) x (B, Hq, Tk, Dh) -> (B, Hq, Tq, Dh)


class GroupedQueryAttention(nn.Module):
    """Grouped-query self-attention, batch first, no dropout.

    __init__(embed_dim, num_heads, num_kv_heads, bias=False) creates
    w_q = nn.Linear(D, D), w_k and w_v = nn.Linear(D, num_kv_heads * Dh) and
    w_o = nn.Linear(D, D), each with bias=bias, where D = embed_dim and
    Dh = D // num_heads (the grader loads weights by these names and shapes).
    Raises ValueError unless num_heads divides D and num_kv_heads divides
    num_heads.

    forward(x, mask=None): self-attention, (B, T, D) -> (B, T, D); mask as in
    grouped_attention, broadcastable to (B, num_heads, T, T).

    num_kv_heads == 1 is multi-query attention; num_kv_heads == num_heads is
    multi-head attention.

    Why: the key and value projections are num_heads / num_kv_heads times
    narrower than in multi-head attention, and so are the keys and values a
    decoder keeps for every past token.

    Must not call F.scaled_dot_product_attention: compose the functions above.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False) -> None:
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads {num_heads} is not divisible by num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        kv_dim = num_kv_heads * self.head_dim  # the narrow projections are the whole saving
        self.w_q = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w_k = nn.Linear(embed_dim, kv_dim, bias=bias)
        self.w_v = nn.Linear(embed_dim, kv_dim, bias=bias)
        self.w_o = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Self-attention over x: (B, T, D) -> (B, T, D)."""
        B, T, D = x.shape  # batch, tokens, model width
        Hq, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.w_q(x).view(B, T, Hq, Dh).transpose(1, 2)  # (B, T, D) -> (B, Hq, T, Dh)
        k = self.w_k(x).view(B, T, Hkv, Dh).transpose(1, 2)  # (B, T, Hkv·Dh) -> (B, Hkv, T, Dh)
        v = self.w_v(x).view(B, T, Hkv, Dh).transpose(1, 2)  # (B, T, Hkv·Dh) -> (B, Hkv, T, Dh)
        y = grouped_attention(q, k, v, mask)  # (B, Hq, T, Dh)
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, Hq, T, Dh) -> (B, T, Hq·Dh)
        return self.w_o(y)  # (B, T, D): mixes the heads
