"""Check the masks reference (solutions/masks.py) against oracles outside it.

- The masks are compared with their definitions written out entry by entry, and the combined
  mask with nn.MultiheadAttention given the same rules as its own attn_mask and key_padding_mask.
- attention's output is F.scaled_dot_product_attention's, and its weights are SDPA's with the
  identity as values (SDPA gives zeros for fully blocked rows, as the contract asks).
- Dropout is random, so it is checked by statistics of seeded draws, with F.dropout as the
  oracle for the scale of the kept weights and the rate of the dropped ones.
If the reference disagrees with them, the reference is wrong.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from solutions import masks as ref

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}
B, H, D, DV = 3, 4, 8, 6  # batch, heads, query/key width, value width


def causal_by_loops(t_q, t_k):
    """Query i sits at position t_k - t_q + i and sees every key at or before it."""
    mask = torch.zeros(t_q, t_k, dtype=torch.bool)
    for i in range(t_q):
        for j in range(t_k):
            mask[i, j] = j <= t_k - t_q + i
    return mask


def padding_by_loops(lengths, t):
    return torch.tensor([[j < length for j in range(t)] for length in lengths.tolist()], dtype=torch.bool)


def weights_oracle(q, k, mask):
    """The attention weights: SDPA with the identity as values returns the masked softmax itself."""
    eye = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-1], k.shape[-2])
    return F.scaled_dot_product_attention(q, k, eye, attn_mask=mask)


@pytest.mark.parametrize("t_q, t_k", [(1, 1), (6, 6), (3, 8), (1, 9), (9, 10)])
def test_causal_mask_is_the_definition(t_q, t_k):
    mask = ref.causal_mask(t_q, t_k)
    assert mask.dtype == torch.bool and torch.equal(mask, causal_by_loops(t_q, t_k))
    assert mask.sum(-1).tolist() == [t_k - t_q + i + 1 for i in range(t_q)]  # every query sees itself
    if t_q == t_k:  # torch's own causal mask: -inf above the diagonal, 0 elsewhere
        assert torch.equal(mask, nn.Transformer.generate_square_subsequent_mask(t_q) == 0)
    for device in ("cpu", torch.device("cpu")):  # the meta device would say more, but costs seconds to set up
        assert torch.equal(ref.causal_mask(t_q, t_k, device=device), mask)


@pytest.mark.parametrize("lengths, t", [([3, 0, 5], 5), ([1, 2], 7), ([0], 3), ([4, 4, 4, 4], 4)])
@pytest.mark.parametrize("int_dtype", [torch.int64, torch.int32])
def test_padding_mask_is_the_definition(lengths, t, int_dtype):
    lengths = torch.tensor(lengths, dtype=int_dtype)
    mask = ref.padding_mask(lengths, t)
    assert mask.dtype == torch.bool and mask.shape == (len(lengths), t)  # t columns, even if every row is shorter
    assert torch.equal(mask, padding_by_loops(lengths, t))
    assert mask.sum(-1).tolist() == lengths.tolist()


@pytest.mark.parametrize("t_q, t_k", [(5, 5), (2, 7)])
def test_combine_masks_is_the_definition(t_q, t_k):
    lengths = torch.tensor([t_k, 3, 0])
    padding, causal = padding_by_loops(lengths, t_k), causal_by_loops(t_q, t_k)
    both = ref.combine_masks(padding, causal)
    assert both.dtype == torch.bool and both.shape == (len(lengths), 1, t_q, t_k)
    for b in range(len(lengths)):
        for i in range(t_q):
            for j in range(t_k):
                assert both[b, 0, i, j] == (padding[b, j] and causal[i, j]), (b, i, j)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("t_q, t_k", [(5, 5), (3, 8)])
def test_combined_mask_is_what_nn_multihead_attention_does_with_both_rules(dtype, t_q, t_k):
    g = torch.Generator().manual_seed(t_q * 10 + t_k)
    torch.manual_seed(t_k)
    e = H * D
    theirs = nn.MultiheadAttention(e, H, batch_first=True).to(dtype)
    query = torch.randn(B, t_q, e, generator=g, dtype=dtype)
    key = torch.randn(B, t_k, e, generator=g, dtype=dtype)
    lengths = torch.tensor([t_k, 3, 1])  # >= 1: key 0 stays visible, nn.MultiheadAttention gives NaN otherwise
    padding, causal = ref.padding_mask(lengths, t_k), ref.causal_mask(t_q, t_k)
    expected, _ = theirs(query, key, key, key_padding_mask=~padding, attn_mask=~causal, need_weights=False)
    combined = ref.combine_masks(padding, causal).expand(B, H, t_q, t_k).reshape(B * H, t_q, t_k)
    got, _ = theirs(query, key, key, attn_mask=~combined, need_weights=False)  # their True = NOT allowed
    torch.testing.assert_close(got, expected, **TOL[dtype])


def mask_cases(g, lead, t_q, t_k):
    yield None
    yield ref.causal_mask(t_q, t_k)  # (Tq, Tk)
    yield torch.rand(t_k, generator=g) > 0.3  # (Tk,), broadcast over the queries
    m = torch.rand(*lead, t_q, t_k, generator=g) > 0.4  # one mask per leading index, fully blocked rows included
    if lead:
        m[(0,) * len(lead)][0] = False
    else:
        m[0] = False
    yield m
    if len(lead) == 2:  # a padded decoder batch: a sequence of length 0 blocks all its rows
        lengths = torch.tensor([t_k, 2, 0])[: lead[0]]
        yield ref.combine_masks(ref.padding_mask(lengths, t_k), ref.causal_mask(t_q, t_k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lead", [(), (B,), (B, H)])
@pytest.mark.parametrize("t_q, t_k", [(6, 6), (3, 7)])
def test_attention_matches_sdpa(dtype, lead, t_q, t_k):
    g = torch.Generator().manual_seed(len(lead) * 10 + t_q)
    q = torch.randn(*lead, t_q, D, generator=g, dtype=dtype) * 1.5
    k = torch.randn(*lead, t_k, D, generator=g, dtype=dtype) - 0.3
    v = torch.randn(*lead, t_k, DV, generator=g, dtype=dtype) * 2 + 1
    for mask in mask_cases(g, lead, t_q, t_k):
        out, weights = ref.attention(q, k, v, mask)
        assert out.shape == (*lead, t_q, DV) and weights.shape == (*lead, t_q, t_k)
        assert out.dtype == weights.dtype == dtype and not out.isnan().any() and not weights.isnan().any()
        sdpa_mask = mask[None] if mask is not None and mask.dim() == 1 else mask  # SDPA wants a 2-D mask at least
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask), **TOL[dtype])
        torch.testing.assert_close(weights, weights_oracle(q, k, sdpa_mask), **TOL[dtype])
        if mask is not None:
            blocked = ~mask.expand(*lead, t_q, t_k).any(-1)  # fully blocked rows: zero weights, zero output
            assert (weights[blocked] == 0).all() and (out[blocked] == 0).all()


def dropout_inputs(dtype, seed=0, n=64, t_q=16, t_k=32):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(n, t, D, generator=g, dtype=dtype) for t in (t_q, t_k))
    v = torch.randn(n, t_k, DV, generator=g, dtype=dtype)
    mask = ref.causal_mask(t_q, t_k)
    return q, k, v, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_statistics_match_f_dropout(dtype, p):
    q, k, v, mask = dropout_inputs(dtype)
    _, eval_weights = ref.attention(q, k, v, mask)
    out, weights = ref.attention(q, k, v, mask, dropout_p=p, training=True, generator=torch.Generator().manual_seed(1))
    assert weights.dtype == dtype and not weights.isnan().any()
    # the output is the weights returned, times v
    torch.testing.assert_close(out, weights @ v, **TOL[dtype])
    # blocked weights stay 0; every kept weight is its eval value times F.dropout's scale
    assert (weights[..., ~mask] == 0).all()
    live = eval_weights != 0
    kept = weights != 0
    scale = F.dropout(torch.ones(1000, dtype=dtype), p, training=True).max().item()  # 1 / (1 - p)
    torch.testing.assert_close(weights[kept], eval_weights[kept] * scale, **TOL[dtype])
    # the rate of dropped weights is p, the rate F.dropout drops at: with 25,088 live weights
    # the binomial's standard deviation is below 0.0032, so 0.02 is over 6 of them
    rate = 1 - kept[live].double().mean().item()
    torch.manual_seed(2)
    torch_rate = (F.dropout(eval_weights[live], p, training=True) == 0).double().mean().item()
    assert abs(torch_rate - p) < 0.02 and abs(rate - p) < 0.02, (rate, torch_rate, p)
    # each weight is dropped on its own: two batch items share a drop pattern no more than chance says
    agree = (kept[0::2] == kept[1::2])[live[0::2] & live[1::2]].double().mean().item()
    assert abs(agree - (p * p + (1 - p) * (1 - p))) < 0.03, agree
    # the expected weights are unchanged: the mean of many draws (one call on copies of the same inputs)
    # is the eval weights, within 6 standard deviations of that mean (one draw's is w * sqrt(p / (1 - p)))
    draws = 200
    copies = (x[:4].expand(draws, *x[:4].shape) for x in (q, k, v))
    mean = ref.attention(*copies, mask, p, True, torch.Generator().manual_seed(3))[1].mean(0)
    sigma = eval_weights[:4] * math.sqrt(p / (1 - p) / draws)
    assert ((mean - eval_weights[:4]).abs() <= 6 * sigma + 1e-12).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropout_follows_the_generator_and_training(dtype):
    q, k, v, mask = dropout_inputs(dtype, n=8)
    eval_out, eval_weights = ref.attention(q, k, v, mask)

    def drawn(seed, p=0.5, training=True, global_seed=0):
        torch.manual_seed(global_seed)  # torch's global RNG must not matter when a generator is given
        generator = torch.Generator().manual_seed(seed)
        return ref.attention(q, k, v, mask, dropout_p=p, training=training, generator=generator)

    for a, b in zip(drawn(7, global_seed=1), drawn(7, global_seed=2), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(drawn(7)[1], drawn(8)[1])
    for p, training in ((0.5, False), (0.0, True), (0.0, False)):  # no dropout: the eval result, exactly
        out, weights = drawn(7, p, training)
        assert torch.equal(out, eval_out) and torch.equal(weights, eval_weights)
    # without a generator the draw comes from torch's global RNG
    torch.manual_seed(5)
    first = ref.attention(q, k, v, mask, 0.5, True)
    torch.manual_seed(5)
    second = ref.attention(q, k, v, mask, 0.5, True)
    assert torch.equal(first[1], second[1])
    # fully blocked rows stay zero, not NaN, in training too
    lengths = torch.tensor([5, 0] * 4)
    blocked = ref.combine_masks(ref.padding_mask(lengths, k.shape[-2]), mask)[:, 0]
    out, weights = ref.attention(q, k, v, blocked, 0.5, True, torch.Generator().manual_seed(0))
    assert not out.isnan().any() and (out[1::2] == 0).all() and (weights[1::2] == 0).all()
