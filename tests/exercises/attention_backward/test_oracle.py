"""Check the attention_backward reference (solutions/attention_backward.py) against torch's own autograd.

The oracle is outside the project: torch.autograd.grad through torch.softmax, and through plain
attention, softmax(q kᵀ / √D + mask) v, with its mask built here entry by entry (bottom-right causal:
query i at position Tk - Tq + i sees key j <= Tk - Tq + i). A row the mask blocks entirely has zero
weights (as F.scaled_dot_product_attention gives it) and so zero gradients. The tiled backward gets
out and lse from torch (plain attention and torch.logsumexp), and the autograd.Function is checked by
torch.autograd.gradcheck in float64. If the reference disagrees with them, the reference is wrong.
"""

import math

import pytest
import torch

from solutions import attention_backward as ref

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-9)}
B, H, D, DV = 2, 3, 6, 5


def bottom_right(t_q, t_k):
    mask = torch.zeros(t_q, t_k, dtype=torch.bool)
    for i in range(t_q):
        for j in range(t_k):
            mask[i, j] = j <= t_k - t_q + i
    return mask


def plain(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    probs = torch.softmax(scores, -1)
    if mask is not None:  # a row with no key: zero weights, and no NaN for autograd to carry back
        probs = torch.where(mask.any(-1, keepdim=True), probs, torch.zeros((), dtype=probs.dtype))
    return probs @ v


def autograd_grads(q, k, v, grad_out, mask):
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    out = plain(q, k, v, mask)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), grad_out))


def draw(t_q, t_k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, t, D, generator=g, dtype=dtype) for t in (t_q, t_k))
    v = torch.randn(B, H, t_k, DV, generator=g, dtype=dtype)
    return q, k, v, torch.randn(B, H, t_q, DV, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dim", [-1, -2, 1])
def test_softmax_backward_is_autograds(dtype, dim):
    g = torch.Generator().manual_seed(dim + 10)
    scores = torch.randn(B, H, 5, 7, generator=g, dtype=dtype, requires_grad=True)
    grad = torch.randn(B, H, 5, 7, generator=g, dtype=dtype)
    probs = torch.softmax(scores, dim)
    (want,) = torch.autograd.grad(probs, scores, grad)
    torch.testing.assert_close(ref.softmax_backward(probs.detach(), grad, dim), want, **TOL[dtype])


def test_softmax_backward_of_an_empty_slice_is_zero():
    probs = torch.zeros(3, 4, dtype=torch.float64)
    assert torch.equal(ref.softmax_backward(probs, torch.randn(3, 4, dtype=torch.float64)), torch.zeros(3, 4,
                       dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("t_q, t_k", [(1, 1), (6, 9), (9, 6), (7, 7)])
@pytest.mark.parametrize("mask_kind", [None, "causal", "padding", "rows"])
def test_attention_backward_is_autograds(dtype, t_q, t_k, mask_kind):
    q, k, v, grad_out = draw(t_q, t_k, dtype, t_q * 100 + t_k)
    mask = None
    if mask_kind == "causal":
        mask = bottom_right(t_q, t_k)  # rows with no key when t_q > t_k
    elif mask_kind == "padding":
        mask = torch.rand(B, 1, 1, t_k, generator=torch.Generator().manual_seed(1)) < 0.7
        mask[..., 0] = True
    elif mask_kind == "rows":
        mask = torch.ones(B, 1, t_q, t_k, dtype=torch.bool)
        mask[1, :, 0, :] = False
    _, *want = autograd_grads(q, k, v, grad_out, mask)
    got = ref.attention_backward(q, k, v, grad_out, mask)
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert a.shape == b.shape and a.dtype == dtype, name
        assert not a.isnan().any(), name
        torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("t_q, t_k", [(1, 1), (13, 22), (22, 13), (1, 30), (16, 16)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_q, block_k", [(32, 32), (5, 8), (8, 5), (4, 4)])
def test_flash_attention_backward_is_autograds(dtype, t_q, t_k, causal, block_q, block_k):
    q, k, v, grad_out = draw(t_q, t_k, dtype, t_q * 1000 + t_k)
    mask = bottom_right(t_q, t_k) if causal else None
    out, *want = autograd_grads(q, k, v, grad_out, mask)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    lse = torch.logsumexp(scores if mask is None else scores.masked_fill(~mask, -math.inf), -1)
    got = ref.flash_attention_backward(q, k, v, out, lse, grad_out, causal, block_q, block_k)
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert a.shape == b.shape and a.dtype == dtype, name
        torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("t_q, t_k, causal", [(9, 14, True), (14, 9, True), (9, 14, False)])
def test_the_function_passes_gradcheck(t_q, t_k, causal):
    q, k, v, _ = draw(t_q, t_k, torch.float64, 7)
    inputs = tuple(x[:1, :2].clone().requires_grad_(True) for x in (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: ref.FlashAttentionFunction.apply(a, b, c, causal, 4, 5), inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_function_and_its_runner_are_autograds(dtype):
    q, k, v, grad_out = draw(13, 22, dtype, 3)
    want = autograd_grads(q, k, v, grad_out, bottom_right(13, 22))
    got = ref.flash_attention_and_grads(q, k, v, grad_out, causal=True, block_q=5, block_k=8)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("t_q, t_k, causal", [(13, 22, True), (22, 13, True), (13, 22, False)])
def test_the_specs_written_out_gradients_are_autograds(t_q, t_k, causal):
    """The spec turns grads.plain and grads.tiled into the named mistakes, and holds flash_attention_backward to
    grads.plain from out and lse: untouched, both are torch's gradients."""
    from grader.course.attention_backward import grads

    q, k, v, grad_out = draw(t_q, t_k, torch.float64, 11)
    mask = bottom_right(t_q, t_k) if causal else None
    out, *want = autograd_grads(q, k, v, grad_out, mask)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    lse = torch.logsumexp(scores if mask is None else scores.masked_fill(~mask, -math.inf), -1)
    for got in (grads.plain(q, k, v, grad_out, mask), grads.plain(q, k, v, grad_out, mask, out=out, lse=lse),
                grads.tiled(q, k, v, out, lse, grad_out, causal, 5, 8)):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, **TOL[torch.float64])
