"""Exercise: multi-head attention, written from scratch in NumPy.

The steps of exercises/mha.py with np.ndarray in and out. Fill in each function
below in order, from `project` down to `multi_head_attention`, which composes
them. Each TODO comment marks the one place to write. Each step is graded on its
own, so a bug in one step does not hide your work on the others.

Grade your work with:

    attn-grade exercises/mha_numpy.py

Hints come from the grader, not from this file. Every function takes and
returns np.ndarray and keeps the dtype of its floating-point inputs (float32 or
float64): NumPy 2 makes a float32 result float64 as soon as it meets a float64
array or NumPy scalar (np.sqrt(d), np.zeros(shape)), while Python floats keep it.
NumPy only: importing torch in this file costs every step its rule points.
"""

import math

import numpy as np


def project(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None
) -> np.ndarray:
    """Apply a learned linear map: x @ weight^T + bias.

    Shapes: x (..., d_in), weight (d_out, d_in), bias (d_out,) or None
    -> (..., d_out). Any number of leading dims. Keeps the dtype of x
    (float32 or float64).

    Why: attention looks at every token three ways, each through its own
    learned projection: as a query (what it is looking for), as a key (what it
    offers to be matched against) and as a value (what it passes on when it is
    matched). A fourth projection mixes the heads' outputs at the end.
    """
    # TODO
    raise NotImplementedError("project: not implemented yet")


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """Split the feature dim into heads: (B, T, D) -> (B, H, T, D // H).

    Head h holds features [h * D/H, (h + 1) * D/H) of every token.

    Why: each head attends in its own D/H-dimensional subspace, so different
    heads can match on different things (one on position, one on syntax, ...)
    for the same cost as a single full-width head. Putting the head dim before
    the token dim lets the next matmuls treat (B, H) as batch dims.
    """
    # TODO
    raise NotImplementedError("split_heads: not implemented yet")


def attention_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Dot product of every query with every key: q @ k^T.

    Shapes: q (..., Tq, Dh), k (..., Tk, Dh) -> (..., Tq, Tk), any number of
    leading batch dims. Entry [..., i, j] is q_i . k_j.

    Why: the dot product is large when a query and a key point the same way,
    so it scores how relevant token j is to token i; one batched matmul scores
    all Tq x Tk pairs at once.
    """
    # TODO
    raise NotImplementedError("attention_scores: not implemented yet")


def scale_scores(scores: np.ndarray, head_dim: int) -> np.ndarray:
    """Divide the scores by sqrt(head_dim). Any shape in, same shape and dtype out.

    Why: q . k is a sum of Dh products, so with unit-variance entries it has
    variance Dh and grows with the head size. Dividing by sqrt(Dh) brings the
    scores back to unit scale, so the softmax does not saturate into a one-hot
    whose gradients vanish.
    """
    # TODO
    raise NotImplementedError("scale_scores: not implemented yet")


def apply_mask(scores: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Block the (query, key) pairs the mask forbids.

    mask: a bool array broadcastable to scores, True = may attend (the
    convention of torch's scaled_dot_product_attention; the opposite of
    nn.MultiheadAttention), or None, in which case the scores come back
    unchanged. Returns an array of the shape and dtype of scores.

    Allowed entries keep their exact value; blocked entries become -inf or any
    finite value <= -1e4.

    Why: the softmax that follows must give blocked keys zero weight: a causal
    mask stops a token from seeing the future, a padding mask stops it from
    attending to padding.
    """
    # TODO
    raise NotImplementedError("apply_mask: not implemented yet")


def softmax(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along `axis`: exp(s_i) / sum_j exp(s_j). Same shape and dtype out.

    Must be numerically stable for large magnitudes: entries of +-1e4 in
    float32 must not give inf or NaN. A slice whose entries are all -inf gives
    all zeros, as torch's scaled_dot_product_attention does.

    Why: it turns scores into attention weights, positive and summing to 1.
    Why it needs care: exp overflows float32 above about 88, and the softmax is
    shift-invariant: softmax(s) == softmax(s - c) for any c constant along axis.
    A query that may attend to nothing should contribute nothing, not NaN.

    Write it with NumPy ops: not scipy.special.softmax.
    """
    # TODO
    raise NotImplementedError("softmax: not implemented yet")


def weighted_sum(weights: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Mix the values with the attention weights, a weighted sum over the keys.

    Shapes: weights (..., Tq, Tk), v (..., Tk, Dv) -> (..., Tq, Dv), any number
    of leading batch dims. out[..., i, :] = sum_j weights[..., i, j] * v[..., j, :]:
    the sum runs over the key axis.

    Why: each query's output is the average of all the values, weighted by how
    much that query attends to each key.
    """
    # TODO
    raise NotImplementedError("weighted_sum: not implemented yet")


def merge_heads(x: np.ndarray) -> np.ndarray:
    """Concatenate the heads again: (B, H, T, Dh) -> (B, T, H * Dh).

    The inverse of split_heads: head h fills features [h * Dh, (h + 1) * Dh).

    Why: the heads' outputs are laid side by side into one vector per token,
    so the output projection can mix what the heads found.
    """
    # TODO
    raise NotImplementedError("merge_heads: not implemented yet")


def multi_head_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    w_q: np.ndarray,
    b_q: np.ndarray | None,
    w_k: np.ndarray,
    b_k: np.ndarray | None,
    w_v: np.ndarray,
    b_v: np.ndarray | None,
    w_o: np.ndarray,
    b_o: np.ndarray | None,
    num_heads: int,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Multi-head scaled dot-product attention, batch first, no dropout.

    query (B, Tq, D), key (B, Tk, D), value (B, Tk, D); pass the same array
    three times for self-attention. w_q, w_k, w_v, w_o are (D, D) in the
    nn.Linear layout (d_out, d_in); each bias is (D,) or None. D is divisible
    by num_heads; head_dim = D // num_heads. mask is as in apply_mask,
    broadcastable to (B, H, Tq, Tk). Returns (B, Tq, D) in the dtype of query.
    Rows the mask blocks entirely are not graded.

    Compose the functions above.
    """
    # TODO
    raise NotImplementedError("multi_head_attention: not implemented yet")
