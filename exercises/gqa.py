"""Exercise: grouped-query and multi-query attention, written from scratch in PyTorch.

Large language models served today (Llama 2 70B, Llama 3, Mistral) let groups of
query heads share one key/value head: grouped-query attention (GQA). With one
KV head for all query heads it is multi-query attention (MQA); with one per
query head it is ordinary multi-head attention. Write the three pieces: repeat
the KV heads to line them up with the query heads, attend with the groups, and
the module with its narrow key and value projections.

Fill in each function below in order; each TODO comment marks the one place to
write. Each step is graded on its own, with the grader's inputs, so a bug in one
step does not hide your work on the others. Grade your work with:

    attn-grade exercises/gqa.py

Hints come from the grader, not from this file. Shapes are batch first with the
heads on axis 1: Hq query heads, Hkv KV heads, G = Hq / Hkv query heads per KV
head, Dh the head width. Masks are bool, True = may attend. Every function keeps
the dtype and device of its inputs and returns a plain torch.Tensor.
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
    # TODO
    raise NotImplementedError("repeat_kv: not implemented yet")


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
    # TODO
    raise NotImplementedError("grouped_attention: not implemented yet")


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
        # TODO
        raise NotImplementedError("GroupedQueryAttention.__init__: not implemented yet")

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Self-attention over x: (B, T, D) -> (B, T, D)."""
        # TODO
        raise NotImplementedError("GroupedQueryAttention.forward: not implemented yet")
