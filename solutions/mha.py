"""Reference solution: multi-head attention, written from scratch in PyTorch.

A model answer to exercises/mha.py: the same functions with the same contracts,
each written as the shortest clear code, with the shape of every reshape and
matmul in a comment. Compare with your own once the grader passes, or when you
are stuck on a step.
"""

import math

import torch
from torch import nn


def project(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Apply a learned linear map: x @ weight^T + bias.

    Shapes: x (..., d_in), weight (d_out, d_in), bias (d_out,) or None
    -> (..., d_out). Any number of leading dims.

    Why: attention looks at every token three ways, each through its own
    learned projection: as a query (what it is looking for), as a key (what it
    offers to be matched against) and as a value (what it passes on when it is
    matched). A fourth projection mixes the heads' outputs at the end.

    Must not call F.linear.
    """
    y = x @ weight.T  # (..., d_in) x (d_in, d_out) -> (..., d_out)
    return y if bias is None else y + bias  # bias (d_out,) broadcasts over the leading dims


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Split the feature dim into heads: (B, T, D) -> (B, H, T, D // H).

    Head h holds features [h * D/H, (h + 1) * D/H) of every token. Must work on
    non-contiguous input.

    Why: each head attends in its own D/H-dimensional subspace, so different
    heads can match on different things (one on position, one on syntax, ...)
    for the same cost as a single full-width head. Putting the head dim before
    the token dim lets the next matmuls treat (B, H) as batch dims.
    """
    B, T, D = x.shape  # batch, tokens, model width
    H = num_heads
    # view would do too: splitting the last dim is a valid view whatever x's strides; reshape never copies here
    x = x.reshape(B, T, H, D // H)  # (B, T, D) -> (B, T, H, Dh): consecutive features per head
    return x.transpose(1, 2)  # (B, T, H, Dh) -> (B, H, T, Dh)


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Dot product of every query with every key: q @ k^T.

    Shapes: q (..., Tq, Dh), k (..., Tk, Dh) -> (..., Tq, Tk), any number of
    leading batch dims. Entry [..., i, j] is q_i . k_j.

    Why: the dot product is large when a query and a key point the same way,
    so it scores how relevant token j is to token i; one batched matmul scores
    all Tq x Tk pairs at once.
    """
    return q @ k.transpose(-2, -1)  # (..., Tq, Dh) x (..., Dh, Tk) -> (..., Tq, Tk)


def scale_scores(scores: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Divide the scores by sqrt(head_dim). Any shape in, same shape out.

    Why: q . k is a sum of Dh products, so with unit-variance entries it has
    variance Dh and grows with the head size. Dividing by sqrt(Dh) brings the
    scores back to unit scale, so the softmax does not saturate into a one-hot
    whose gradients vanish.
    """
    return scores / math.sqrt(head_dim)  # a Python float keeps the dtype of scores


def apply_mask(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Block the (query, key) pairs the mask forbids.

    mask: a bool tensor broadcastable to scores, True = may attend (the
    convention of torch.nn.functional.scaled_dot_product_attention; the
    opposite of nn.MultiheadAttention), or None, in which case the scores come
    back unchanged. Returns a tensor of the shape of scores.

    Allowed entries keep their exact value; blocked entries become -inf or any
    finite value <= -1e4. Must work for float16 and bfloat16 scores.

    Why: the softmax that follows must give blocked keys zero weight: a causal
    mask stops a token from seeing the future, a padding mask stops it from
    attending to padding.
    """
    if mask is None:
        return scores
    # -inf, not the classic -1e9: -1e9 overflows to -inf in float16 anyway, and a
    # finite value gives a fully blocked row a uniform softmax, leaking weight onto
    # keys it must not see. With -inf, exp gives exactly 0 and softmax handles the
    # all -inf row explicitly.
    return scores.masked_fill(~mask, float("-inf"))  # mask broadcasts to (..., Tq, Tk)


def softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along `dim`: exp(s_i) / sum_j exp(s_j). Same shape out.

    Must be numerically stable for large magnitudes: entries of +-1e4 in
    float32 must not give inf or NaN. A slice whose entries are all -inf gives
    all zeros, as scaled_dot_product_attention does.

    Why: it turns scores into attention weights, positive and summing to 1.
    Why it needs care: exp overflows float32 above about 88, and the softmax is
    shift-invariant: softmax(s) == softmax(s - c) for any c constant along dim.
    A query that may attend to nothing should contribute nothing, not NaN.

    Must not call torch.softmax, F.softmax, Tensor.softmax, log_softmax or
    nn.Softmax.
    """
    # Subtract the max so the largest exponent is exp(0) = 1: nothing overflows.
    # The shift changes nothing mathematically, so no gradient needs to flow through it.
    m = scores.amax(dim=dim, keepdim=True).detach()
    # An all -inf slice has max -inf, and -inf - (-inf) = NaN; shift it by 0 instead,
    # so exp gives exactly 0 everywhere in that slice.
    m = m.masked_fill(m == float("-inf"), 0.0)
    e = torch.exp(scores - m)
    s = e.sum(dim=dim, keepdim=True)  # >= 1 unless the slice is all -inf, then 0
    # Clamp the 0 sums away from zero: 0 / tiny = 0 gives the all-zero rows, no NaN.
    return e / s.clamp_min(torch.finfo(s.dtype).tiny)


def weighted_sum(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Mix the values with the attention weights: out_i = sum_j weights_ij * v_j.

    Shapes: weights (..., Tq, Tk), v (..., Tk, Dv) -> (..., Tq, Dv), any number
    of leading batch dims.

    Why: each query's output is the average of all the values, weighted by how
    much that query attends to each key.
    """
    return weights @ v  # (..., Tq, Tk) x (..., Tk, Dv) -> (..., Tq, Dv)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Concatenate the heads again: (B, H, T, Dh) -> (B, T, H * Dh).

    The inverse of split_heads: head h fills features [h * Dh, (h + 1) * Dh).
    Must work on non-contiguous input.

    Why: the heads' outputs are laid side by side into one vector per token,
    so the output projection can mix what the heads found.
    """
    B, H, T, Dh = x.shape  # batch, heads, tokens, head width
    x = x.transpose(1, 2)  # (B, H, T, Dh) -> (B, T, H, Dh), now non-contiguous
    return x.reshape(B, T, H * Dh)  # (B, T, H, Dh) -> (B, T, D); reshape copies, view would fail


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention, batch first, no dropout.

    __init__(embed_dim, num_heads, bias=True) creates four
    nn.Linear(embed_dim, embed_dim, bias=bias) layers named w_q, w_k, w_v and
    w_o (the grader loads weights by these names), and raises ValueError if
    embed_dim is not divisible by num_heads.

    forward(query, key=None, value=None, mask=None): query (B, Tq, D),
    key (B, Tk, D), value (B, Tk, D); key defaults to query and value to key
    (self-attention). mask is as in apply_mask, broadcastable to
    (B, H, Tq, Tk). Returns (B, Tq, D). Rows the mask blocks entirely are not
    graded.

    Must not call F.scaled_dot_product_attention, nn.MultiheadAttention or
    F.multi_head_attention_forward: compose the functions above.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True) -> None:
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.w_q = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w_k = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w_v = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w_o = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend from query to key/value: (B, Tq, D) -> (B, Tq, D)."""
        key = query if key is None else key
        value = key if value is None else value
        H = self.num_heads
        q = split_heads(project(query, self.w_q.weight, self.w_q.bias), H)  # (B, H, Tq, Dh)
        k = split_heads(project(key, self.w_k.weight, self.w_k.bias), H)  # (B, H, Tk, Dh)
        v = split_heads(project(value, self.w_v.weight, self.w_v.bias), H)  # (B, H, Tk, Dh)
        att = scale_scores(attention_scores(q, k), self.head_dim)  # (B, H, Tq, Tk)
        att = softmax(apply_mask(att, mask), dim=-1)  # (B, H, Tq, Tk), rows sum to 1 or are all 0
        y = weighted_sum(att, v)  # (B, H, Tq, Tk) x (B, H, Tk, Dh) -> (B, H, Tq, Dh)
        y = merge_heads(y)  # (B, H, Tq, Dh) -> (B, Tq, D)
        return project(y, self.w_o.weight, self.w_o.bias)  # (B, Tq, D): mixes the heads
