"""Reference solution: multi-head attention, written from scratch in NumPy.

A model answer to exercises/mha_numpy.py: the same functions with the same
contracts, each written as the shortest clear code, with the shape of every
reshape and matmul in a comment. Compare with your own once the grader passes,
or when you are stuck on a step.

The one NumPy trap that runs through every step: NumPy 2 keeps float32 only
while it meets float32 arrays and Python numbers. A float64 array
(np.zeros(shape), np.full(shape, -np.inf)) or a NumPy float64 scalar
(np.sqrt(d)) silently makes the result float64. Python floats never do.
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
    y = x @ weight.T  # (..., d_in) x (d_in, d_out) -> (..., d_out); weight is 2-D, so .T is a plain transpose
    return y if bias is None else y + bias  # bias (d_out,) broadcasts over the leading dims


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """Split the feature dim into heads: (B, T, D) -> (B, H, T, D // H).

    Head h holds features [h * D/H, (h + 1) * D/H) of every token.

    Why: each head attends in its own D/H-dimensional subspace, so different
    heads can match on different things (one on position, one on syntax, ...)
    for the same cost as a single full-width head. Putting the head dim before
    the token dim lets the next matmuls treat (B, H) as batch dims.
    """
    B, T, D = x.shape  # batch, tokens, model width
    H = num_heads
    x = x.reshape(B, T, H, D // H)  # (B, T, D) -> (B, T, H, Dh): consecutive features per head
    return np.swapaxes(x, 1, 2)  # (B, T, H, Dh) -> (B, H, T, Dh), a view


def attention_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Dot product of every query with every key: q @ k^T.

    Shapes: q (..., Tq, Dh), k (..., Tk, Dh) -> (..., Tq, Tk), any number of
    leading batch dims. Entry [..., i, j] is q_i . k_j.

    Why: the dot product is large when a query and a key point the same way,
    so it scores how relevant token j is to token i; one batched matmul scores
    all Tq x Tk pairs at once.
    """
    # Swap only the last two axes: on a 4-D array k.T would reverse all four.
    return q @ np.swapaxes(k, -1, -2)  # (..., Tq, Dh) x (..., Dh, Tk) -> (..., Tq, Tk)


def scale_scores(scores: np.ndarray, head_dim: int) -> np.ndarray:
    """Divide the scores by sqrt(head_dim). Any shape in, same shape and dtype out.

    Why: q . k is a sum of Dh products, so with unit-variance entries it has
    variance Dh and grows with the head size. Dividing by sqrt(Dh) brings the
    scores back to unit scale, so the softmax does not saturate into a one-hot
    whose gradients vanish.
    """
    # math.sqrt gives a Python float, which keeps float32; np.sqrt(head_dim) is a
    # NumPy float64 scalar and would make the result float64.
    return scores / math.sqrt(head_dim)


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
    if mask is None:
        return scores
    # -np.inf is a Python float: the result keeps the dtype of scores. With -inf, exp
    # gives exactly 0, and softmax handles a row that is all -inf explicitly.
    return np.where(mask, scores, -np.inf)  # mask broadcasts to (..., Tq, Tk)


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
    # Subtract the max so the largest exponent is exp(0) = 1: nothing overflows.
    # keepdims=True keeps the reduced axis (size 1), so m broadcasts along `axis` only.
    m = np.max(scores, axis=axis, keepdims=True)
    # An all -inf slice has max -inf, and -inf - (-inf) = NaN; shift it by 0 instead,
    # so exp gives exactly 0 everywhere in that slice.
    m = np.where(np.isneginf(m), 0, m)
    e = np.exp(scores - m)
    s = np.sum(e, axis=axis, keepdims=True)  # >= 1 unless the slice is all -inf, then 0
    # Keep the 0 sums away from zero: 0 / tiny = 0 gives the all-zero rows, no NaN.
    return e / np.maximum(s, np.finfo(s.dtype).tiny)


def weighted_sum(weights: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Mix the values with the attention weights, a weighted sum over the keys.

    Shapes: weights (..., Tq, Tk), v (..., Tk, Dv) -> (..., Tq, Dv), any number
    of leading batch dims. out[..., i, :] = sum_j weights[..., i, j] * v[..., j, :]:
    the sum runs over the key axis.

    Why: each query's output is the average of all the values, weighted by how
    much that query attends to each key.
    """
    return weights @ v  # (..., Tq, Tk) x (..., Tk, Dv) -> (..., Tq, Dv)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """Concatenate the heads again: (B, H, T, Dh) -> (B, T, H * Dh).

    The inverse of split_heads: head h fills features [h * Dh, (h + 1) * Dh).

    Why: the heads' outputs are laid side by side into one vector per token,
    so the output projection can mix what the heads found.
    """
    B, H, T, Dh = x.shape  # batch, heads, tokens, head width
    x = np.swapaxes(x, 1, 2)  # (B, H, T, Dh) -> (B, T, H, Dh)
    return x.reshape(B, T, H * Dh)  # (B, T, H, Dh) -> (B, T, D); reshape copies where it must


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
    H = num_heads
    head_dim = query.shape[-1] // H
    q = split_heads(project(query, w_q, b_q), H)  # (B, H, Tq, Dh)
    k = split_heads(project(key, w_k, b_k), H)  # (B, H, Tk, Dh)
    v = split_heads(project(value, w_v, b_v), H)  # (B, H, Tk, Dh)
    att = scale_scores(attention_scores(q, k), head_dim)  # (B, H, Tq, Tk)
    att = softmax(apply_mask(att, mask), axis=-1)  # (B, H, Tq, Tk), rows sum to 1 or are all 0
    y = weighted_sum(att, v)  # (B, H, Tq, Tk) x (B, H, Tk, Dh) -> (B, H, Tq, Dh)
    y = merge_heads(y)  # (B, H, Tq, Dh) -> (B, Tq, D)
    return project(y, w_o, b_o)  # (B, Tq, D): mixes the heads
