"""Check the reference solution (solutions/mha.py) against torch's own attention.

The oracles are outside the project: F.scaled_dot_product_attention, nn.MultiheadAttention,
torch.softmax and F.linear. If the reference disagrees with them, the reference is wrong.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from solutions import mha as ref

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}
B, H, D, TQ, TK = 3, 4, 32, 5, 7  # batch, heads, model width, query tokens, key tokens


def make_mask(kind, g, tq=TQ, tk=TK):
    """Bool mask, True = may attend; some kinds contain fully blocked rows."""
    if kind is None:
        return None
    if kind == "full":  # one mask per (batch, head), a fully blocked row included
        m = torch.rand(B, H, tq, tk, generator=g) > 0.4
        m[0, 1, 2] = False
        return m
    if kind == "shared":  # (Tq, Tk), broadcast over batch and heads
        return torch.rand(tq, tk, generator=g) > 0.3
    if kind == "padding":  # (B, 1, 1, Tk): per-sequence key padding
        lengths = torch.randint(1, tk + 1, (B,), generator=g)
        return (torch.arange(tk) < lengths[:, None])[:, None, None, :]
    if kind == "causal":  # (Tq, Tk), bottom-right aligned so every row keeps a key
        return torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)
    raise ValueError(kind)


def inputs(seed, dtype, tq=TQ, tk=TK):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, t, D, generator=g, dtype=dtype) * s + o
               for t, s, o in ((tq, 1.5, 0.3), (tk, 0.7, -0.2), (tk, 2.0, 1.0)))
    return g, q, k, v


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", [None, "full", "shared", "padding", "causal"])
def test_module_matches_sdpa(seed, dtype, kind):
    g, x, k_in, v_in = inputs(seed, dtype)
    torch.manual_seed(seed)
    mod = ref.MultiHeadAttention(D, H).to(dtype)
    mask = make_mask(kind, g)
    q, k, v = (ref.split_heads(ref.project(t, lin.weight, lin.bias), H)
               for t, lin in ((x, mod.w_q), (k_in, mod.w_k), (v_in, mod.w_v)))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, Tq, Dh)
    # the functions step by step, before the output projection
    att = ref.softmax(ref.apply_mask(ref.scale_scores(ref.attention_scores(q, k), D // H), mask))
    torch.testing.assert_close(ref.weighted_sum(att, v), expected, **TOL[dtype])
    # the whole module: SDPA's fully blocked rows are zeros, so they match too
    out = mod(x, k_in, v_in, mask=mask)
    assert out.shape == (B, TQ, D) and out.dtype == dtype
    torch.testing.assert_close(out, mod.w_o(ref.merge_heads(expected)), **TOL[dtype])


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", [None, "shared", "per_head", "causal"])
def test_module_matches_nn_multihead_attention(seed, dtype, bias, kind):
    g, x, k_in, v_in = inputs(seed, dtype)
    torch.manual_seed(seed)
    mod = ref.MultiHeadAttention(D, H, bias=bias).to(dtype)
    theirs = nn.MultiheadAttention(D, H, batch_first=True, bias=bias).to(dtype)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([mod.w_q.weight, mod.w_k.weight, mod.w_v.weight]))
        theirs.out_proj.weight.copy_(mod.w_o.weight)
        if bias:
            theirs.in_proj_bias.copy_(torch.cat([mod.w_q.bias, mod.w_k.bias, mod.w_v.bias]))
            theirs.out_proj.bias.copy_(mod.w_o.bias)
    if kind == "per_head":  # (B, H, Tq, Tk) for us, (B * H, Tq, Tk) for nn.MultiheadAttention
        mask = torch.rand(B, H, TQ, TK, generator=g) > 0.5
        mask[..., 0] = True  # nn.MultiheadAttention gives NaN on fully blocked rows
        their_mask = ~mask.reshape(B * H, TQ, TK)
    else:
        mask = make_mask(kind, g)
        if mask is not None:
            mask[:, 0] = True
        their_mask = None if mask is None else ~mask  # their True = NOT allowed
    expected, _ = theirs(x, k_in, v_in, attn_mask=their_mask, need_weights=False)
    torch.testing.assert_close(mod(x, k_in, v_in, mask=mask), expected, **TOL[dtype])
    if kind is None:  # defaults: key = query, value = key
        torch.testing.assert_close(mod(x), theirs(x, x, x, need_weights=False)[0], **TOL[dtype])
        expected, _ = theirs(x, k_in, k_in, need_weights=False)
        torch.testing.assert_close(mod(x, k_in), expected, **TOL[dtype])


@pytest.mark.parametrize("seed", [5, 6, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_matches_torch_and_sdpa(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B, H, TQ, TK, generator=g, dtype=dtype) * 4 + 1
    for dim in (-1, 0, 2):
        expected = torch.softmax(s, dim=dim)
        torch.testing.assert_close(ref.softmax(s, dim=dim), expected, **TOL[dtype])
    big = s.sign() * 1e4 + s  # entries of +-1e4: a naive exp overflows
    torch.testing.assert_close(ref.softmax(big), torch.softmax(big, dim=-1), **TOL[dtype])
    # masked, with fully blocked rows. SDPA with q = scores, k = v = I and scale 1 returns
    # the masked softmax itself, and gives zeros for fully blocked rows (torch.softmax: NaN).
    mask = make_mask("full", g)
    mask[1, :, 3] = False
    eye = torch.eye(TK, dtype=dtype).expand(B, H, TK, TK)
    expected = F.scaled_dot_product_attention(s, eye, eye, attn_mask=mask, scale=1.0)
    got = ref.softmax(ref.apply_mask(s, mask))
    blocked = ~mask.any(-1)
    assert blocked.sum() > 1 and (got[blocked] == 0).all() and not got.isnan().any()
    torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_mask_and_softmax(dtype):
    g = torch.Generator().manual_seed(8)
    s = torch.randn(B, H, TQ, TK, generator=g) * 3
    mask = make_mask("full", g)
    masked = ref.apply_mask(s.to(dtype), mask)
    assert masked.dtype == dtype and (masked[mask] == s.to(dtype)[mask]).all()
    assert (masked[~mask] <= -1e4).all()
    got = ref.softmax(masked)
    assert got.dtype == dtype and not got.isnan().any()
    eye = torch.eye(TK)
    expected = F.scaled_dot_product_attention(s, eye, eye, attn_mask=mask, scale=1.0)
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("seed", [9, 10])
def test_project_split_merge(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TQ, B, D, generator=g, dtype=torch.float64).transpose(0, 1)  # non-contiguous
    w = torch.randn(2 * D, D, generator=g, dtype=torch.float64)
    b = torch.randn(2 * D, generator=g, dtype=torch.float64)
    torch.testing.assert_close(ref.project(x, w, b), F.linear(x, w, b))
    torch.testing.assert_close(ref.project(x, w), F.linear(x, w))
    heads = ref.split_heads(x, H)
    assert heads.shape == (B, H, TQ, D // H)
    for h in range(H):  # head h holds features [h * Dh, (h + 1) * Dh)
        assert torch.equal(heads[:, h], x[..., h * (D // H):(h + 1) * (D // H)])
    assert torch.equal(ref.merge_heads(heads), x)
    y = torch.randn(B, TQ, H, D // H, generator=g).transpose(1, 2)  # (B, H, T, Dh), non-contiguous
    assert torch.equal(ref.split_heads(ref.merge_heads(y), H), y)
    with pytest.raises(ValueError):
        ref.MultiHeadAttention(D, 5)
