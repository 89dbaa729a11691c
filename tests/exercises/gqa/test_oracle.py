"""Check the gqa reference (solutions/gqa.py) against torch's own grouped-query attention.

The oracle is outside the project: F.scaled_dot_product_attention(..., enable_gqa=True), which
lets query head h attend with KV head h // (Hq / Hkv), and gives zeros for fully blocked rows.
If the reference disagrees with it, the reference is wrong.
"""

import pytest
import torch
import torch.nn.functional as F

from solutions import gqa as ref

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}
B, HQ, TQ, TK, DH = 3, 8, 5, 7, 16  # batch, query heads, query and key tokens, head width


def make_mask(kind, g, hq=HQ):
    if kind is None:
        return None
    if kind == "per_head":  # one mask per (batch, query head), fully blocked rows included
        m = torch.rand(B, hq, TQ, TK, generator=g) > 0.4
        m[0, 1, 2] = False
        m[2, :, 0] = False
        return m
    if kind == "causal":  # (Tq, Tk), bottom-right aligned
        return torch.ones(TQ, TK, dtype=torch.bool).tril(diagonal=TK - TQ)
    if kind == "padding":  # (B, 1, 1, Tk)
        return (torch.arange(TK) < torch.tensor([TK, 3, 1]).view(B, 1, 1, 1))
    raise ValueError(kind)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("hkv", [1, 2, 4, HQ])  # MQA, GQA with groups of 4 and of 2, MHA
@pytest.mark.parametrize("kind", [None, "per_head", "causal", "padding"])
def test_grouped_attention_matches_sdpa_enable_gqa(seed, dtype, hkv, kind):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, TQ, DH, generator=g, dtype=dtype) * 1.5
    k = torch.randn(B, hkv, TK, DH, generator=g, dtype=dtype) + torch.arange(hkv, dtype=dtype).view(1, hkv, 1, 1)
    v = torch.randn(B, hkv, TK, DH, generator=g, dtype=dtype) * 2 - torch.arange(hkv, dtype=dtype).view(1, hkv, 1, 1)
    mask = make_mask(kind, g)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = ref.grouped_attention(q, k, v, mask)
    assert got.shape == (B, HQ, TQ, DH) and got.dtype == dtype and not got.isnan().any()
    torch.testing.assert_close(got, expected, **TOL[dtype])
    # and repeat_kv is the repeat that SDPA's enable_gqa does: the same as plain SDPA on repeated heads
    k_rep, v_rep = ref.repeat_kv(k, HQ // hkv), ref.repeat_kv(v, HQ // hkv)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask), expected, **TOL[dtype])


@pytest.mark.parametrize("hkv", [1, 2, 4, HQ])
def test_module_matches_sdpa_enable_gqa(hkv):
    torch.manual_seed(hkv)
    d = HQ * DH
    mod = ref.GroupedQueryAttention(d, HQ, hkv, bias=True).double()
    x = torch.randn(B, TQ, d, dtype=torch.float64)
    mask = torch.ones(TQ, TQ, dtype=torch.bool).tril()
    q = mod.w_q(x).view(B, TQ, HQ, DH).transpose(1, 2)
    k, v = (w(x).view(B, TQ, hkv, DH).transpose(1, 2) for w in (mod.w_k, mod.w_v))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    expected = mod.w_o(y.transpose(1, 2).reshape(B, TQ, d))
    torch.testing.assert_close(mod(x, mask), expected, **TOL[torch.float64])
    assert mod.w_k.weight.shape == mod.w_v.weight.shape == (hkv * DH, d)  # the narrow KV projections


def test_repeat_kv_is_interleaved():
    x = torch.arange(2, dtype=torch.float32).view(1, 2, 1, 1).expand(1, 2, 3, 4)
    assert ref.repeat_kv(x, 3)[0, :, 0, 0].tolist() == [0, 0, 0, 1, 1, 1]  # not tiled: 0, 1, 0, 1, 0, 1
    assert torch.equal(ref.repeat_kv(x, 1), x)


@pytest.mark.parametrize("init", [(30, 4, 1), (32, 8, 3)])
def test_module_validates_its_arguments(init):
    with pytest.raises(ValueError):
        ref.GroupedQueryAttention(*init)
