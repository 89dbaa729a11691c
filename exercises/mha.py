"""Exercise: multi-head attention, written from scratch in PyTorch.

Fill in each function below in order, from `project` down to the
`MultiHeadAttention` module, which composes them. Each TODO comment marks the
one place to write. Each step is graded on its own, so a bug in one step does not
hide your work on the others.

Grade your work with:

    attn-grade exercises/mha.py

Hints come from the grader, not from this file. Every function keeps the dtype
and device of its floating-point inputs and returns a plain torch.Tensor.
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
    # TODO
    raise NotImplementedError("project: not implemented yet")


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Split the feature dim into heads: (B, T, D) -> (B, H, T, D // H).

    Head h holds features [h * D/H, (h + 1) * D/H) of every token. Must work on
    non-contiguous input.

    Why: each head attends in its own D/H-dimensional subspace, so different
    heads can match on different things (one on position, one on syntax, ...)
    for the same cost as a single full-width head. Putting the head dim before
    the token dim lets the next matmuls treat (B, H) as batch dims.
    """
    # TODO
    raise NotImplementedError("split_heads: not implemented yet")


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Dot product of every query with every key: q @ k^T.

    Shapes: q (..., Tq, Dh), k (..., Tk, Dh) -> (..., Tq, Tk), any number of
    leading batch dims. Entry [..., i, j] is q_i . k_j.

    Why: the dot product is large when a query and a key point the same way,
    so it scores how relevant token j is to token i; one batched matmul scores
    all Tq x Tk pairs at once.
    """
    # TODO
    raise NotImplementedError("attention_scores: not implemented yet")


def scale_scores(scores: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Divide the scores by sqrt(head_dim). Any shape in, same shape out.

    Why: q . k is a sum of Dh products, so with unit-variance entries it has
    variance Dh and grows with the head size. Dividing by sqrt(Dh) brings the
    scores back to unit scale, so the softmax does not saturate into a one-hot
    whose gradients vanish.
    """
    # TODO
    raise NotImplementedError("scale_scores: not implemented yet")


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
    # TODO
    raise NotImplementedError("apply_mask: not implemented yet")


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
    # TODO
    raise NotImplementedError("softmax: not implemented yet")


def weighted_sum(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Mix the values with the attention weights: out_i = sum_j weights_ij * v_j.

    Shapes: weights (..., Tq, Tk), v (..., Tk, Dv) -> (..., Tq, Dv), any number
    of leading batch dims.

    Why: each query's output is the average of all the values, weighted by how
    much that query attends to each key.
    """
    # TODO
    raise NotImplementedError("weighted_sum: not implemented yet")


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Concatenate the heads again: (B, H, T, Dh) -> (B, T, H * Dh).

    The inverse of split_heads: head h fills features [h * Dh, (h + 1) * Dh).
    Must work on non-contiguous input.

    Why: the heads' outputs are laid side by side into one vector per token,
    so the output projection can mix what the heads found.
    """
    # TODO
    raise NotImplementedError("merge_heads: not implemented yet")


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
        # TODO
        raise NotImplementedError("MultiHeadAttention.__init__: not implemented yet")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend from query to key/value: (B, Tq, D) -> (B, Tq, D)."""
        # TODO
        raise NotImplementedError("MultiHeadAttention.forward: not implemented yet")
