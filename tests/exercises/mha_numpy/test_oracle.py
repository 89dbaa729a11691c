"""Check the NumPy reference (solutions/mha_numpy.py) against torch's own functions.

The oracles are outside the project: F.linear, torch.einsum, torch.softmax,
F.scaled_dot_product_attention and nn.MultiheadAttention, fed the same arrays through
torch.from_numpy, and plain loops for the head layout. (test_mha_numpy.py compares with
solutions/mha.py; this file does not use it.) If the reference disagrees with them, the
reference is wrong. Every answer must also keep the dtype of its inputs: NumPy 2 turns
float32 into float64 silently.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from solutions import mha_numpy as ref

TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}
DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
B, TQ, TK, D = 2, 5, 7, 16  # batch, query tokens, key tokens, model width


def same(got, expected, dtype):
    """got is an ndarray of dtype, equal to expected (an ndarray or a tensor) within the tolerance."""
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    assert isinstance(got, np.ndarray) and got.dtype == dtype, (type(got), getattr(got, "dtype", None))
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got, expected, **TOL[dtype])


def rand(g, dtype, *shape, scale=1.0, shift=0.0):
    return (g.standard_normal(shape) * scale + shift).astype(dtype)


def t(a):
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a))


@DTYPES
@pytest.mark.parametrize("lead", [(), (3,), (B, 3, 4)])
@pytest.mark.parametrize("bias", [True, False])
def test_project_is_f_linear(dtype, lead, bias):
    g = np.random.default_rng(len(lead))
    x, w = rand(g, dtype, *lead, 6), rand(g, dtype, 10, 6)  # d_out != d_in
    b = rand(g, dtype, 10) if bias else None
    same(ref.project(x, w, b), F.linear(t(x), t(w), t(b)), dtype)
    if not bias:
        same(ref.project(x, w), F.linear(t(x), t(w)), dtype)


@DTYPES
@pytest.mark.parametrize("heads", [1, 2, 4, 16])
def test_split_and_merge_heads_are_the_layout(dtype, heads):
    g = np.random.default_rng(heads)
    x = rand(g, dtype, B, TQ, D)
    split = ref.split_heads(x, heads)
    dh = D // heads
    assert split.shape == (B, heads, TQ, dh) and split.dtype == dtype
    for b in range(B):
        for h in range(heads):
            for i in range(TQ):  # head h holds features [h * Dh, (h + 1) * Dh) of every token
                assert np.array_equal(split[b, h, i], x[b, i, h * dh:(h + 1) * dh])
    assert np.array_equal(ref.merge_heads(split), x)
    y = np.swapaxes(rand(g, dtype, B, TQ, heads, dh), 1, 2)  # (B, H, T, Dh), not contiguous
    merged = ref.merge_heads(y)
    assert merged.shape == (B, TQ, D) and merged.dtype == dtype
    same(merged, t(y).transpose(1, 2).reshape(B, TQ, D), dtype)
    assert np.array_equal(ref.split_heads(merged, heads), y)


@DTYPES
@pytest.mark.parametrize("lead", [(), (B,), (B, 4)])
def test_scores_scale_and_weighted_sum_are_einsums(dtype, lead):
    g = np.random.default_rng(7)
    q, k = rand(g, dtype, *lead, TQ, 8), rand(g, dtype, *lead, TK, 8)  # Tq != Tk
    scores = ref.attention_scores(q, k)
    same(scores, torch.einsum("...qd,...kd->...qk", t(q), t(k)), dtype)
    for head_dim in (1, 8, 64):
        same(ref.scale_scores(scores, head_dim), t(scores) / head_dim ** 0.5, dtype)
    weights, v = rand(g, dtype, *lead, TQ, TK), rand(g, dtype, *lead, TK, 3)
    same(ref.weighted_sum(weights, v), torch.einsum("...qk,...kd->...qd", t(weights), t(v)), dtype)


def mask_cases(g, heads):
    yield None
    yield np.tril(np.ones((TQ, TK), dtype=bool), k=TK - TQ)  # causal, bottom-right aligned: (Tq, Tk)
    yield (np.arange(TK) < np.array([TK, 3])[:, None])[:, None, None, :]  # padding: (B, 1, 1, Tk)
    per_head = g.random((B, heads, TQ, TK)) < 0.6
    per_head[0, -1, 1] = per_head[1, 0, 3] = False  # fully blocked rows
    yield per_head


@DTYPES
@pytest.mark.parametrize("heads", [1, 4])
def test_mask_and_softmax_match_torch(dtype, heads):
    g = np.random.default_rng(heads)
    scores = rand(g, dtype, B, heads, TQ, TK, scale=3.0, shift=0.5)
    for axis in (-1, -2, 0, 1):
        same(ref.softmax(scores, axis=axis), torch.softmax(t(scores), dim=axis), dtype)
    big = rand(g, dtype, B, TQ, TK) * 1e4  # a naive exp overflows float32
    got = ref.softmax(big)
    assert np.isfinite(got).all()
    same(got, torch.softmax(t(big), dim=-1), dtype)
    eye = torch.eye(TK, dtype=t(scores).dtype)
    for mask in mask_cases(g, heads):
        masked = ref.apply_mask(scores, mask)
        assert masked.shape == scores.shape and masked.dtype == dtype
        if mask is None:
            assert np.array_equal(masked, scores)
            continue
        allowed = np.broadcast_to(mask, scores.shape)
        assert np.array_equal(masked[allowed], scores[allowed]) and (masked[~allowed] <= -1e4).all()
        # SDPA with q = scores, k = v = I and scale 1 is the masked softmax, zeros on fully blocked rows
        expected = F.scaled_dot_product_attention(t(scores), eye, eye, attn_mask=t(mask), scale=1.0)
        weights = ref.softmax(masked)
        assert not np.isnan(weights).any() and (weights[~allowed.any(-1)] == 0).all()
        same(weights, expected, dtype)


def weights_of(module):
    params = []
    for name in ("w_q", "w_k", "w_v", "w_o"):
        w, b = module[name]
        params += [w, b]
    return params


def random_module(g, dtype, bias):
    return {name: (rand(g, dtype, D, D, scale=D ** -0.5), rand(g, dtype, D) if bias else None)
            for name in ("w_q", "w_k", "w_v", "w_o")}


def row_keeping(mask, heads):
    """The mask over (B, H, Tq, Tk) with key 0 always allowed: blocked rows are outside the contract."""
    if mask is None:
        return None
    full = np.broadcast_to(mask, (B, heads, TQ, TK)).copy()
    full[..., 0] = True
    return full


@pytest.mark.parametrize("seed", [0, 1])
@DTYPES
@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_multi_head_attention_matches_sdpa(seed, dtype, heads, bias):
    g = np.random.default_rng(seed)
    module = random_module(g, dtype, bias)
    query, key, value = rand(g, dtype, B, TQ, D), rand(g, dtype, B, TK, D, shift=0.3), rand(g, dtype, B, TK, D)
    q, k, v = (F.linear(t(x), t(w), t(b)).view(B, -1, heads, D // heads).transpose(1, 2)
               for x, (w, b) in zip((query, key, value), (module["w_q"], module["w_k"], module["w_v"]), strict=True))
    for mask in mask_cases(g, heads):
        mask = row_keeping(mask, heads)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=t(mask))  # (B, H, Tq, Dh)
        expected = F.linear(y.transpose(1, 2).reshape(B, TQ, D), *(t(a) for a in module["w_o"]))
        same(ref.multi_head_attention(query, key, value, *weights_of(module), heads, mask=mask), expected, dtype)


@pytest.mark.parametrize("seed", [2, 3])
@DTYPES
@pytest.mark.parametrize("bias", [True, False])
def test_multi_head_attention_matches_nn_multihead_attention(seed, dtype, bias):
    heads = 4
    g = np.random.default_rng(seed)
    module = random_module(g, dtype, bias)
    theirs = nn.MultiheadAttention(D, heads, bias=bias, batch_first=True).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([t(module[n][0]) for n in ("w_q", "w_k", "w_v")]))
        theirs.out_proj.weight.copy_(t(module["w_o"][0]))
        if bias:
            theirs.in_proj_bias.copy_(torch.cat([t(module[n][1]) for n in ("w_q", "w_k", "w_v")]))
            theirs.out_proj.bias.copy_(t(module["w_o"][1]))
    query, key, value = rand(g, dtype, B, TQ, D), rand(g, dtype, B, TK, D), rand(g, dtype, B, TK, D, scale=2.0)
    for mask in mask_cases(g, heads):
        mask = row_keeping(mask, heads)
        their_mask = None if mask is None else ~t(mask).reshape(B * heads, TQ, TK)  # their True = NOT allowed
        with torch.no_grad():
            expected, _ = theirs(t(query), t(key), t(value), attn_mask=their_mask, need_weights=False)
        same(ref.multi_head_attention(query, key, value, *weights_of(module), heads, mask=mask), expected, dtype)
    with torch.no_grad():  # self-attention: the same array three times
        expected, _ = theirs(t(query), t(query), t(query), need_weights=False)
    same(ref.multi_head_attention(query, query, query, *weights_of(module), heads), expected, dtype)
