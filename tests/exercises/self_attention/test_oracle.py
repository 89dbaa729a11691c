"""Check the self_attention reference (solutions/self_attention.py) against torch's own functions.

The oracles are outside the project: F.linear, torch.einsum, torch.softmax (values and
gradients), F.scaled_dot_product_attention, nn.MultiheadAttention with one head and an
identity output projection, and the worked example's printed values in the exercise. If the
reference disagrees with them, the reference is wrong.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from solutions import self_attention as ref

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
LEADS = pytest.mark.parametrize("lead", [(), (3,), (2, 3)])  # the steps take any leading dims, none included
D_IN, D_OUT, T = 5, 4, 6  # d_out != d_in: the scale is the key width


def same(got, expected, dtype):
    assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, **TOL[dtype])


@DTYPES
@LEADS
@pytest.mark.parametrize("bias", [True, False])
def test_project_qkv_is_f_linear(dtype, lead, bias):
    g = torch.Generator().manual_seed(len(lead))
    x = torch.randn(*lead, T, D_IN, generator=g, dtype=dtype)
    weights = [torch.randn(D_OUT, D_IN, generator=g, dtype=dtype) for _ in range(3)]
    biases = [torch.randn(D_OUT, generator=g, dtype=dtype) if bias else None for _ in range(3)]
    got = ref.project_qkv(x, *weights, *biases)
    assert len(got) == 3
    for answer, w, b in zip(got, weights, biases, strict=True):  # in the order queries, keys, values
        same(answer, F.linear(x, w, b), dtype)
    if not bias:
        for answer, w in zip(ref.project_qkv(x, *weights), weights, strict=True):
            same(answer, F.linear(x, w), dtype)


@DTYPES
@LEADS
@pytest.mark.parametrize("t_q, t_k", [(T, T), (3, 8)])
def test_scores_scale_and_weighted_sum_are_einsums(dtype, lead, t_q, t_k):
    g = torch.Generator().manual_seed(t_q)
    queries, keys = (torch.randn(*lead, t, D_OUT, generator=g, dtype=dtype) for t in (t_q, t_k))
    scores = ref.attention_scores(queries, keys)
    same(scores, torch.einsum("...qd,...kd->...qk", queries, keys), dtype)
    for d_out in (1, D_OUT, 64):
        same(ref.scale_scores(scores, d_out), scores / d_out ** 0.5, dtype)
    weights = torch.rand(*lead, t_q, t_k, generator=g, dtype=dtype)
    values = torch.randn(*lead, t_k, 7, generator=g, dtype=dtype)
    same(ref.weighted_sum(weights, values), torch.einsum("...qk,...kd->...qd", weights, values), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scale_keeps_low_precision(dtype):
    scores = torch.randn(2, T, T).to(dtype)
    scaled = ref.scale_scores(scores, D_OUT)
    assert scaled.dtype == dtype
    torch.testing.assert_close(scaled.float(), scores.float() / D_OUT ** 0.5, atol=1e-2, rtol=1e-2)


@DTYPES
def test_softmax_values_and_gradients_are_torch_softmax(dtype):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, T, 8, generator=g, dtype=dtype) * 4 + 1
    for dim in (-1, -2, 0, 1):
        same(ref.softmax(scores, dim=dim), torch.softmax(scores, dim=dim), dtype)
    big = torch.randn(3, T, 8, generator=g, dtype=dtype).sign() * 1e4 + scores[0]  # a naive exp overflows
    got = ref.softmax(big)
    assert got.isfinite().all()
    same(got, torch.softmax(big, dim=-1), dtype)
    # the gradients too: the max subtracted for stability must not change them
    upstream = torch.randn(2, 3, T, 8, generator=g, dtype=dtype)
    ours = scores.clone().requires_grad_()
    theirs = scores.clone().requires_grad_()
    (ref.softmax(ours) * upstream).sum().backward()
    (torch.softmax(theirs, dim=-1) * upstream).sum().backward()
    same(ours.grad, theirs.grad, dtype)


def projections(module, x):
    return (F.linear(x, layer.weight, layer.bias) for layer in (module.W_query, module.W_key, module.W_value))


@pytest.mark.parametrize("seed", [0, 1, 2])
@DTYPES
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(), (3,)])  # unbatched (T, d_in) as in the demo, and batched
def test_module_matches_sdpa(seed, dtype, bias, lead):
    torch.manual_seed(seed)
    module = ref.SelfAttention(D_IN, D_OUT, qkv_bias=bias).to(dtype)
    for name in ("W_query", "W_key", "W_value"):
        layer = getattr(module, name)
        assert isinstance(layer, nn.Linear) and layer.weight.shape == (D_OUT, D_IN)
        assert (layer.bias is not None) == bias
    x = torch.randn(*lead, T, D_IN, dtype=dtype) * 2
    expected = F.scaled_dot_product_attention(*projections(module, x))  # its default scale is 1 / sqrt(d_out)
    same(module(x), expected, dtype)
    # the steps composed by hand give the same
    q, k, v = ref.project_qkv(x, *(layer.weight for layer in (module.W_query, module.W_key, module.W_value)),
                              *(layer.bias for layer in (module.W_query, module.W_key, module.W_value)))
    steps = ref.weighted_sum(ref.softmax(ref.scale_scores(ref.attention_scores(q, k), D_OUT)), v)
    same(steps, expected, dtype)


@DTYPES
@pytest.mark.parametrize("bias", [True, False])
def test_module_is_single_head_nn_multihead_attention(dtype, bias):
    """With d_in == d_out, one head and an identity output projection, nn.MultiheadAttention is SelfAttention."""
    d = 8
    torch.manual_seed(3)
    module = ref.SelfAttention(d, d, qkv_bias=bias).to(dtype)
    theirs = nn.MultiheadAttention(d, 1, bias=bias, batch_first=True).to(dtype)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([module.W_query.weight, module.W_key.weight, module.W_value.weight]))
        theirs.out_proj.weight.copy_(torch.eye(d, dtype=dtype))
        if bias:
            theirs.in_proj_bias.copy_(torch.cat([module.W_query.bias, module.W_key.bias, module.W_value.bias]))
            theirs.out_proj.bias.zero_()
    x = torch.randn(4, T, d, dtype=dtype)
    with torch.no_grad():
        expected, weights = theirs(x, x, x)
        same(module(x), expected, dtype)
        scores = ref.scale_scores(ref.attention_scores(*list(projections(module, x))[:2]), d)
        same(ref.softmax(scores), weights, dtype)  # the weights nn.MultiheadAttention returns


def test_worked_example_prints_the_exercises_numbers():
    inputs = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                           [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])
    torch.manual_seed(123)  # nn.Linear's initialization, W_query first, then W_key and W_value
    module = ref.SelfAttention(d_in=3, d_out=2)
    printed = torch.tensor([[-0.5337, -0.1051], [-0.5323, -0.1080], [-0.5323, -0.1079],
                            [-0.5297, -0.1076], [-0.5311, -0.1066], [-0.5299, -0.1081]])
    with torch.no_grad():
        torch.testing.assert_close(module(inputs), printed, atol=1e-4, rtol=0)
        batched = module(torch.stack((inputs, inputs)))
    assert batched.shape == (2, 6, 2)
    torch.testing.assert_close(batched, printed.expand(2, 6, 2), atol=1e-4, rtol=0)
