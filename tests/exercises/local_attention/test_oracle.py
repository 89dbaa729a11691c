"""Check the local_attention reference (solutions/local_attention.py) against torch's own attention.

The oracle is outside the project: F.scaled_dot_product_attention with an explicit bool mask
(the sliding window, built here from its definition p - window < j <= p, not from the
reference) and with a float bias (ALiBi, its slopes computed here from their definition,
plus the window as -inf). If the reference disagrees with it, the reference is wrong. The
grader's own slopes (the spec's `slopes`, what every_head_count holds answers to) are
checked against the same definition.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from grader.course.local_attention.spec import slopes as graders_slopes
from solutions import local_attention as ref

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}
B, H, D = 2, 6, 16  # 6 heads: not a power of two


def window_by_loops(t_q, t_k, window):
    """The mask written out entry by entry: query i at p = t_k - t_q + i sees p - window < j <= p."""
    mask = torch.zeros(t_q, t_k, dtype=torch.bool)
    for i in range(t_q):
        p = t_k - t_q + i
        for j in range(t_k):
            mask[i, j] = p - window < j <= p
    return mask


@pytest.mark.parametrize("t_q, t_k", [(7, 7), (3, 10), (1, 12)])
@pytest.mark.parametrize("window", [1, 2, 4, 12, 50])
def test_mask_is_the_definition(t_q, t_k, window):
    mask = ref.sliding_window_mask(t_q, t_k, window)
    assert mask.dtype == torch.bool and torch.equal(mask, window_by_loops(t_q, t_k, window))
    assert mask.sum(-1).tolist() == [min(t_k - t_q + i + 1, window) for i in range(t_q)]
    if window >= t_k:
        assert torch.equal(mask, torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q))


def slopes_by_definition(n: int) -> list[float]:
    """ALiBi's slopes as the paper defines them: for n a power of two, 2^(-8h/n) for h = 1 .. n; otherwise the slopes
    of the largest power of two p below n, then every other slope of 2p, the first n - p of them."""
    if n & (n - 1) == 0:
        return [2.0 ** (-8 * h / n) for h in range(1, n + 1)]
    p = 1 << (n.bit_length() - 1)
    return slopes_by_definition(p) + slopes_by_definition(2 * p)[0::2][: n - p]


def test_the_definition_gives_the_papers_examples():
    """The paper's own numbers: 8 heads get 1/2, 1/4, ..., 1/256; 16 heads those and one more between each two,
    2^-0.5, 2^-1.5, ...; 12 heads the 8 of 8 heads, then the first 4 of those in between."""
    assert slopes_by_definition(8) == [2.0**-h for h in range(1, 9)]
    assert slopes_by_definition(16)[1::2] == slopes_by_definition(8)
    assert slopes_by_definition(16)[0::2] == [2.0 ** -(h + 0.5) for h in range(8)]
    assert slopes_by_definition(12) == slopes_by_definition(8) + [2.0 ** -(h + 0.5) for h in range(4)]


@pytest.mark.parametrize("heads", [*range(1, 17), 40])
def test_slopes_are_the_definitions(heads):
    want = torch.tensor(slopes_by_definition(heads), dtype=torch.float32)
    torch.testing.assert_close(ref.alibi_slopes(heads), want)
    torch.testing.assert_close(graders_slopes(heads), want)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("t_q, t_k", [(8, 8), (3, 11)])
@pytest.mark.parametrize("window", [None, 1, 3, 11])
@pytest.mark.parametrize("alibi", [False, True])
def test_attention_matches_sdpa(seed, dtype, t_q, t_k, window, alibi):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, t, D, generator=g, dtype=dtype) for t in (t_q, t_k, t_k))
    mask = window_by_loops(t_q, t_k, t_k if window is None else window)
    slopes = torch.tensor(slopes_by_definition(H), dtype=torch.float32) if alibi else None
    if alibi:  # a float bias: -slope·(p - j), the window as -inf
        p, j = torch.arange(t_k - t_q, t_k)[:, None], torch.arange(t_k)
        bias = -slopes.to(dtype)[:, None, None] * (p - j).to(dtype)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~mask, -math.inf))
    else:  # an explicit bool mask
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = ref.local_attention(q, k, v, window=window, slopes=slopes)
    assert got.shape == (B, H, t_q, D) and got.dtype == dtype
    float32_bias = alibi and dtype == torch.float64  # the reference's bias is float32
    tol = dict(atol=1e-6, rtol=1e-6) if float32_bias else TOL[dtype]
    torch.testing.assert_close(got, expected, **tol)
