"""Check the flash_attention reference (solutions/flash_attention.py) against torch's own attention.

The oracle is outside the project: F.scaled_dot_product_attention with an explicit bool mask,
aligned to the bottom-right and built here entry by entry from its definition (query i at
position Tk - Tq + i sees key j <= Tk - Tq + i), and torch.logsumexp of the whole scaled,
masked score matrix for the lse. Rows with no key to see (causal with Tq > Tk) are 0 with
lse -inf by the contract (SDPA gives NaN there). merge_partials is checked by splitting the
keys in two and merging the two halves' attention, and online_softmax_update by running it
over blocks. If the reference disagrees with them, the reference is wrong.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from solutions import flash_attention as ref

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}
B, H, D, DV = 2, 3, 16, 12


def bottom_right(t_q, t_k):
    mask = torch.zeros(t_q, t_k, dtype=torch.bool)
    for i in range(t_q):
        for j in range(t_k):
            mask[i, j] = j <= t_k - t_q + i
    return mask


def oracle(q, k, v, causal):
    """(out, lse) from SDPA and torch.logsumexp; rows with no key: 0 and -inf."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    mask = bottom_right(t_q, t_k) if causal else torch.ones(t_q, t_k, dtype=torch.bool)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(scores.double(), -1)
    empty = ~mask.any(-1)
    return out.masked_fill(empty[:, None], 0.0), lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("t_q, t_k", [(1, 1), (7, 7), (45, 70), (70, 45), (1, 50), (33, 33)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_q, block_k", [(32, 32), (16, 24), (7, 5), (128, 128)])
def test_attention_matches_sdpa(dtype, t_q, t_k, causal, block_q, block_k):
    g = torch.Generator().manual_seed(t_q * 1000 + t_k)
    q, k = (torch.randn(B, H, t, D, generator=g, dtype=dtype) for t in (t_q, t_k))
    v = torch.randn(B, H, t_k, DV, generator=g, dtype=dtype)
    out, lse = ref.flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    want_out, want_lse = oracle(q, k, v, causal)
    assert out.shape == (B, H, t_q, DV) and out.dtype == dtype
    assert lse.shape == (B, H, t_q) and lse.dtype == torch.promote_types(dtype, torch.float32)
    torch.testing.assert_close(out, want_out, **TOL[dtype])
    torch.testing.assert_close(lse.double(), want_lse, **TOL[dtype])
    if causal and t_q > t_k:  # rows with no key to see
        assert torch.equal(lse[..., : t_q - t_k], torch.full_like(lse[..., : t_q - t_k], -math.inf))
        assert not out.isnan().any() and not out[..., : t_q - t_k, :].any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_compute_in_float32(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, 40, D, generator=g).to(dtype) for _ in range(3))
    out, lse = ref.flash_attention(q, k, v, causal=True, block_q=16, block_k=16)
    want_out, want_lse = oracle(q.float(), k.float(), v.float(), causal=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out.float(), want_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("split", [1, 13, 29])
@pytest.mark.parametrize("causal", [False, True])
def test_merging_two_halves_of_the_keys_is_attention_over_all(split, causal):
    g = torch.Generator().manual_seed(split)
    t_q, t_k = 9, 30
    q = torch.randn(B, H, t_q, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, t_k, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, t_k, DV, generator=g, dtype=torch.float64)
    mask = bottom_right(t_q, t_k) if causal else torch.ones(t_q, t_k, dtype=torch.bool)
    parts = []
    for keys in (slice(0, split), slice(split, t_k)):  # the second part of an early causal row may see nothing
        scores = (q @ k[..., keys, :].transpose(-2, -1) / math.sqrt(D)).masked_fill(~mask[:, keys], -math.inf)
        parts += [torch.softmax(scores, -1).nan_to_num(0.0) @ v[..., keys, :], torch.logsumexp(scores, -1)]
    o, lse = ref.merge_partials(*parts)
    want_out, want_lse = oracle(q, k, v, causal)
    torch.testing.assert_close(o, want_out, **TOL[torch.float64])
    torch.testing.assert_close(lse, want_lse, **TOL[torch.float64])


def test_merging_empty_parts():
    o = torch.randn(2, 4, 3, dtype=torch.float64)
    lse = torch.randn(2, 4, dtype=torch.float64)
    none = torch.full_like(lse, -math.inf)
    merged, merged_lse = ref.merge_partials(o, lse, torch.zeros_like(o), none)
    assert torch.equal(merged, o) and torch.equal(merged_lse, lse)
    merged, merged_lse = ref.merge_partials(torch.zeros_like(o), none, torch.zeros_like(o), none)
    assert torch.equal(merged, torch.zeros_like(o)) and torch.equal(merged_lse, none)


@pytest.mark.parametrize("block", [1, 4, 25])
def test_the_update_over_blocks_is_the_softmax(block):
    g = torch.Generator().manual_seed(block)
    scores = torch.randn(B, H, 6, 25, generator=g, dtype=torch.float64) * 5
    scores[..., 2, :] = -math.inf  # a row with no key: stays 0, never NaN
    scores[..., 4, :20] = -math.inf  # a row masked in its first blocks
    v = torch.randn(B, H, 25, DV, generator=g, dtype=torch.float64)
    m = torch.full((B, H, 6), -math.inf, dtype=torch.float64)
    l, acc = torch.zeros(B, H, 6, dtype=torch.float64), torch.zeros(B, H, 6, DV, dtype=torch.float64)
    for j in range(0, 25, block):
        m, l, acc = ref.online_softmax_update(m, l, acc, scores[..., j:j + block], v[..., j:j + block, :])
        assert not (m.isnan().any() or l.isnan().any() or acc.isnan().any())
    assert torch.equal(l[..., 2], torch.zeros_like(l[..., 2])) and not acc[..., 2, :].any()
    seen = [0, 1, 3, 4, 5]
    torch.testing.assert_close(acc[..., seen, :] / l[..., seen, None], (torch.softmax(scores, -1) @ v)[..., seen, :])
    torch.testing.assert_close(m[..., seen] + l[..., seen].log(), torch.logsumexp(scores, -1)[..., seen])
    torch.testing.assert_close(m, scores.amax(-1))
