"""Hidden checks for the `self_attention` exercise: one group per step, each graded with the grader's own inputs.

Every check calls exactly one candidate function (or builds the module), so a broken
step costs only its own points. The reference runs here, in the grader's process.
Points per step add up to the step's points in grader/manifest.toml. d_in != d_out
everywhere but where a square case is the point: a √d_in or a missing transpose must show.
"""

import math

import pytest
import torch

from grader.candidate import CandidateError, Strided
from grader.checks.expect import (
    CheckFailed,
    Mistake,
    call_on_device,
    expect_allowed,
    expect_close,
    expect_on_device,
    expect_tensor,
    randn,
    skip_if_meta_unsupported,
    step,
)
from grader.wire import Opaque
from solutions import self_attention as ref

FLOATS = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
B, T, D_IN, D_OUT = 2, 5, 6, 4  # batch, tokens, input width, key/value width: all different
TQ, TK = 5, 7  # query and key tokens for the functions that allow them to differ


# -- project_qkv --------------------------------------------------------------------------


def _linear(x, w, b):
    return x @ w.T + (0 if b is None else b)


QKV_MISTAKES = (
    Mistake(
        "project_qkv.weight_not_transposed",
        "used x @ W: nn.Linear stores its weight (d_out, d_in), so multiply by W.T",
        lambda x, wq, wk, wv, bq=None, bk=None, bv=None: tuple(
            x @ w + (0 if b is None else b) for w, b in ((wq, bq), (wk, bk), (wv, bv))),
    ),
    Mistake(
        "project_qkv.no_bias",
        "biases ignored: add each bias (d_out,) when it is given",
        lambda x, wq, wk, wv, *biases: (x @ wq.T, x @ wk.T, x @ wv.T),
    ),
    Mistake(
        "project_qkv.swapped",
        "queries and keys swapped: return (queries, keys, values), each from its own weight",
        lambda *args: (lambda q, k, v: (k, q, v))(*ref.project_qkv(*args)),
    ),
    Mistake(
        "project_qkv.one_weight",
        "one weight used for all three: queries use w_query, keys w_key, values w_value",
        lambda x, wq, wk, wv, bq=None, bk=None, bv=None: (_linear(x, wq, bq),) * 3,
    ),
)


def _qkv_inputs(rng, dtype=torch.float32, lead=(B, T), d_in=D_IN, d_out=D_OUT, bias=True):
    x = randn(rng, *lead, d_in, dtype=dtype)
    weights = [randn(rng, d_out, d_in, dtype=dtype, scale=d_in**-0.5) for _ in range(3)]
    biases = [randn(rng, d_out, dtype=dtype) if bias else None for _ in range(3)]
    return (x, *weights, *biases)


def _qkv_tuple(value):
    """Three of something, as a tuple (or list); anything else is named by its type."""
    if isinstance(value, (tuple, list)) and len(value) == 3:
        return value
    got = f"a {type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list)) else (
        value.type_name if isinstance(value, Opaque) else type(value).__name__)
    raise CheckFailed(f"expected a tuple (queries, keys, values), got {got}")


def _expect_qkv(value, args, device="cpu"):
    """A (queries, keys, values) tuple matching the reference; a mistake must explain all three at once."""
    _qkv_tuple(value)
    expected = ref.project_qkv(*args)
    for i, name in enumerate(("queries", "keys", "values")):
        try:
            if device == "cpu":
                expect_close(value[i], expected[i])
            else:
                expect_on_device(value[i], expected[i], device)
        except CheckFailed as failure:
            mistake = next((m for m in QKV_MISTAKES if _explains_all(m, value, args)), None)
            raise CheckFailed(f"{name}: {failure.message}", mistake) from None


def _explains_all(mistake, value, args):
    parts = [Mistake(mistake.id, mistake.message, lambda *a, i=i: mistake.variant(*a)[i]) for i in range(3)]
    return all(part.explains(value[i], args) for i, part in enumerate(parts))


@step("project_qkv", points=2)
def test_project_qkv_shape(candidate, rng):
    value = _qkv_tuple(candidate.call("project_qkv", *_qkv_inputs(rng)).value)
    for name, tensor in zip(("queries", "keys", "values"), value):
        try:
            expect_tensor(tensor, (B, T, D_OUT), torch.float32)
        except CheckFailed as failure:
            raise CheckFailed(f"{name}: {failure.message}") from None


@step("project_qkv", points=2)
@FLOATS
def test_project_qkv_values(candidate, rng, dtype):
    args = _qkv_inputs(rng, dtype)
    _expect_qkv(candidate.call("project_qkv", *args).value, args)


@step("project_qkv", points=2)
def test_project_qkv_without_bias(candidate, rng):
    args = _qkv_inputs(rng, bias=False)  # qkv_bias=False, the tutorials' default: biases are None
    _expect_qkv(candidate.call("project_qkv", *args[:4]).value, args)


@step("project_qkv", points=2)
def test_project_qkv_square_weight(candidate, rng):
    args = _qkv_inputs(rng, d_in=5, d_out=5)  # d_in == d_out: a missing transpose runs but is wrong
    _expect_qkv(candidate.call("project_qkv", *args).value, args)


@step("project_qkv", points=2)
def test_project_qkv_unbatched_noncontiguous(candidate, rng):
    x, *rest = _qkv_inputs(rng, lead=(T,))  # (T, d_in), as in the worked example
    _expect_qkv(candidate.call("project_qkv", Strided(x), *rest).value, (x, *rest))


@step("project_qkv", points=2)
def test_project_qkv_rules(candidate, rng, forbidden):
    args = _qkv_inputs(rng)
    answer = candidate.call("project_qkv", *args)
    expect_allowed(answer, forbidden)
    _expect_qkv(answer.value, args)  # no points for a rule kept by garbage


@step("project_qkv", points=2)
def test_project_qkv_device(candidate, rng, device):
    args = _qkv_inputs(rng)
    _expect_qkv(call_on_device(candidate, device, "project_qkv", *args), args, device)


# -- attention_scores ---------------------------------------------------------------------

SCORES_MISTAKES = (
    Mistake(
        "attention_scores.transposed",
        "scores transposed: you computed keys @ queriesᵀ; the result is (..., Tq, Tk) = queries @ keysᵀ",
        lambda q, k: k @ q.transpose(-2, -1),
    ),
)


def _qk(rng, dtype=torch.float32, tq=TQ, tk=TK, lead=(B,)):
    return randn(rng, *lead, tq, D_OUT, dtype=dtype), randn(rng, *lead, tk, D_OUT, dtype=dtype)


def _check_scores(candidate, args):
    expect_close(candidate.call("attention_scores", *args).value, ref.attention_scores(*args), SCORES_MISTAKES, args)


@step("attention_scores", points=2)
def test_attention_scores_shape(candidate, rng):
    expect_tensor(candidate.call("attention_scores", *_qk(rng)).value, (B, TQ, TK), torch.float32)


@step("attention_scores", points=2)
@FLOATS
def test_attention_scores_values(candidate, rng, dtype):
    _check_scores(candidate, _qk(rng, dtype))


@step("attention_scores", points=2)
def test_attention_scores_square(candidate, rng):
    _check_scores(candidate, _qk(rng, tq=T, tk=T))  # self-attention, Tq == Tk: a transposed result has the right shape


@step("attention_scores", points=1)
def test_attention_scores_unbatched(candidate, rng):
    _check_scores(candidate, _qk(rng, lead=()))  # (T, d_out): no batch dim, as in the worked example


@step("attention_scores", points=1)
def test_attention_scores_extra_leading_dims(candidate, rng):
    _check_scores(candidate, _qk(rng, lead=(2, 3)))  # keys.T would reverse the leading dims too


@step("attention_scores", points=2)
def test_attention_scores_device(candidate, rng, device):
    args = _qk(rng)
    expect_on_device(call_on_device(candidate, device, "attention_scores", *args), ref.attention_scores(*args), device, args, SCORES_MISTAKES)


# -- scale_scores -------------------------------------------------------------------------

SCALE_MISTAKES = (
    Mistake(
        "scale_scores.multiplied",
        "multiplied by √d_out instead of dividing (or divided by d_out**-0.5)",
        lambda s, d: s * math.sqrt(d),
    ),
    Mistake("scale_scores.by_d_out", "divided by d_out instead of √d_out", lambda s, d: s / d),
    Mistake("scale_scores.unscaled", "returned the scores unscaled: divide by √d_out", lambda s, d: s),
)


def _check_scale(candidate, args):
    expect_close(candidate.call("scale_scores", *args).value, ref.scale_scores(*args), SCALE_MISTAKES, args)


@step("scale_scores", points=2)
def test_scale_scores_shape(candidate, rng):
    expect_tensor(candidate.call("scale_scores", randn(rng, B, T, T), 16).value, (B, T, T), torch.float32)


@step("scale_scores", points=2)
@FLOATS
def test_scale_scores_values(candidate, rng, dtype):
    _check_scale(candidate, (randn(rng, B, T, T, dtype=dtype, scale=4.0), 16))


@step("scale_scores", points=2)
def test_scale_scores_irrational_root(candidate, rng):
    _check_scale(candidate, (randn(rng, B, T, T, dtype=torch.float64), 2))  # √2, as in the d_out = 2 example


@step("scale_scores", points=2)
def test_scale_scores_float16(candidate, rng):
    _check_scale(candidate, (randn(rng, B, T, T, dtype=torch.float16), 16))


@step("scale_scores", points=2)
def test_scale_scores_device(candidate, rng, device):
    args = (randn(rng, B, T, T), 16)
    expect_on_device(call_on_device(candidate, device, "scale_scores", *args), ref.scale_scores(*args), device, args, SCALE_MISTAKES)


# -- softmax ------------------------------------------------------------------------------


def _exp_over(x, dim):
    return torch.exp(x) / torch.exp(x).sum(dim, keepdim=True)


SOFTMAX_MISTAKES = (
    Mistake(
        "softmax.ignored_dim",
        "softmax over the last axis whatever dim says: normalize along dim",
        lambda x, dim=-1: ref.softmax(x, -1),
    ),
    Mistake(
        "softmax.dim_0",
        "normalized along dim 0 (the tutorials' softmax_naive on a 1-D tensor): sum along dim",
        lambda x, dim=-1: _exp_over(x, 0),
    ),
    Mistake(
        "softmax.whole_tensor",
        "normalized over the whole tensor: sum along dim with keepdim=True",
        lambda x, dim=-1: torch.exp(x) / torch.exp(x).sum(),
    ),
    Mistake(
        "softmax.no_keepdim",
        "the sum lost its axis (no keepdim=True), so it broadcast against the wrong axis",
        lambda x, dim=-1: torch.exp(x) / torch.exp(x).sum(dim),
    ),
)
UNSTABLE = Mistake(
    "softmax.unstable",
    "not numerically stable: exp overflows for large logits; subtract the max along dim first",
    test=lambda out, *args: bool((~torch.isfinite(out.to(torch.float64))).any()),
)


def _check_softmax(candidate, x, *dim, mistakes=SOFTMAX_MISTAKES, strided=False):
    value = candidate.call("softmax", Strided(x) if strided else x, *dim).value
    expect_close(value, ref.softmax(x, *dim), mistakes, (x, *dim))


@step("softmax", points=2)
def test_softmax_shape(candidate, rng):
    expect_tensor(candidate.call("softmax", randn(rng, B, TQ, TK)).value, (B, TQ, TK), torch.float32)


@step("softmax", points=2)
@FLOATS
def test_softmax_values(candidate, rng, dtype):
    _check_softmax(candidate, randn(rng, B, TQ, TK, dtype=dtype, scale=3.0))


@step("softmax", points=2)
def test_softmax_dim_0(candidate, rng):
    _check_softmax(candidate, randn(rng, 4, 5, 6, scale=3.0), 0)


@step("softmax", points=2)
def test_softmax_dim_minus_2(candidate, rng):
    _check_softmax(candidate, randn(rng, B, TQ, TK, scale=3.0), -2)


@step("softmax", points=3)
def test_softmax_large_logits(candidate, rng):
    x = randn(rng, B, TQ, TK) * 1e4  # entries of ±1e4: exp overflows float32 without the max subtraction
    _check_softmax(candidate, x, mistakes=(UNSTABLE, *SOFTMAX_MISTAKES))


@step("softmax", points=2)
def test_softmax_noncontiguous_matrix(candidate, rng):
    # a plain square matrix: a sum without keepdim, or along dim 0, broadcasts silently
    _check_softmax(candidate, randn(rng, 6, 6, scale=3.0), strided=True)


@step("softmax", points=2)
def test_softmax_rules(candidate, rng, forbidden):
    x = randn(rng, B, TQ, TK)
    answer = candidate.call("softmax", x)
    expect_allowed(answer, forbidden)
    expect_close(answer.value, ref.softmax(x), SOFTMAX_MISTAKES, (x,))  # no points for a rule kept by garbage


@step("softmax", points=1)
def test_softmax_device(candidate, rng, device):
    x = randn(rng, B, TQ, TK)
    expect_on_device(call_on_device(candidate, device, "softmax", x), ref.softmax(x), device, (x,), SOFTMAX_MISTAKES)


# -- weighted_sum -------------------------------------------------------------------------

WEIGHTED_MISTAKES = (
    Mistake(
        "weighted_sum.transposed_weights",
        "weights transposed in the weighted sum: use weights @ values, not weightsᵀ @ values",
        lambda w, v: w.transpose(-2, -1) @ v,
    ),
)


def _weights_values(rng, dtype=torch.float32, tq=TQ, tk=TK, lead=(B,)):
    return ref.softmax(randn(rng, *lead, tq, tk, dtype=dtype, scale=2.0)), randn(rng, *lead, tk, D_OUT, dtype=dtype)


def _check_weighted(candidate, args):
    expect_close(candidate.call("weighted_sum", *args).value, ref.weighted_sum(*args), WEIGHTED_MISTAKES, args)


@step("weighted_sum", points=2)
def test_weighted_sum_shape(candidate, rng):
    expect_tensor(candidate.call("weighted_sum", *_weights_values(rng)).value, (B, TQ, D_OUT), torch.float32)


@step("weighted_sum", points=2)
@FLOATS
def test_weighted_sum_values(candidate, rng, dtype):
    _check_weighted(candidate, _weights_values(rng, dtype))


@step("weighted_sum", points=2)
def test_weighted_sum_square(candidate, rng):
    _check_weighted(candidate, _weights_values(rng, tq=T, tk=T))  # Tq == Tk: transposed weights have the right shape


@step("weighted_sum", points=2)
def test_weighted_sum_unbatched(candidate, rng):
    _check_weighted(candidate, _weights_values(rng, tq=T, tk=T, lead=()))  # (T, T) and (T, d_out)


@step("weighted_sum", points=2)
def test_weighted_sum_device(candidate, rng, device):
    args = _weights_values(rng)
    expect_on_device(call_on_device(candidate, device, "weighted_sum", *args), ref.weighted_sum(*args), device, args, WEIGHTED_MISTAKES)


# -- SelfAttention ------------------------------------------------------------------------

LINEAR = "torch.nn.modules.linear.Linear"
NAMES = ("W_query", "W_key", "W_value")


def attend(state, x, *, scale_by="d_out", softmax_dim=-1, transposed=False, value_from="W_value"):
    """The module's forward from reference steps; the keyword arguments make the named wrong variants."""
    names = ("W_query", "W_key", value_from)
    q, k, v = ref.project_qkv(x, *(state[f"{n}.weight"] for n in names), *(state.get(f"{n}.bias") for n in names))
    scores = ref.attention_scores(k, q) if transposed else ref.attention_scores(q, k)
    width = {"d_out": q.shape[-1], "d_in": x.shape[-1], "none": 1}[scale_by]
    return ref.weighted_sum(ref.softmax(ref.scale_scores(scores, width), softmax_dim), v)


MODULE_MISTAKES = (
    Mistake("SelfAttention.scaled_by_d_in", "scaled by √d_in instead of √d_out, the width of the keys",
            lambda s, x: attend(s, x, scale_by="d_in")),
    Mistake("SelfAttention.unscaled", "scores not scaled: divide by √d_out (keys.shape[-1] ** 0.5) before the softmax",
            lambda s, x: attend(s, x, scale_by="none")),
    Mistake("SelfAttention.softmax_query_axis", "softmax over the query axis: normalize over the keys, dim=-1",
            lambda s, x: attend(s, x, softmax_dim=-2)),
    Mistake("SelfAttention.scores_transposed", "scores transposed: use queries @ keysᵀ, not keys @ queriesᵀ",
            lambda s, x: attend(s, x, transposed=True)),
    Mistake("SelfAttention.key_as_value", "used the keys as the values: project the values with W_value",
            lambda s, x: attend(s, x, value_from="W_key")),
)


def _state(rng, bias=False, dtype=torch.float32, d_in=D_IN, d_out=D_OUT):
    state = {f"{n}.weight": randn(rng, d_out, d_in, dtype=dtype, scale=d_in**-0.5) for n in NAMES}
    if bias:
        state.update({f"{n}.bias": randn(rng, d_out, dtype=dtype, scale=0.5) for n in NAMES})
    return state


def _run_module(candidate, state, x, device="cpu", **extra):
    d_out, d_in = state["W_query.weight"].shape
    bias = "W_query.bias" in state
    return candidate.module("SelfAttention", init=(d_in, d_out), init_kwargs={"qkv_bias": bias}, state=state,
                            args=(x,), device=device, **extra)


def _check_module(candidate, state, x):
    answer = _run_module(candidate, state, x)
    expect_close(answer.value["output"], attend(state, x), MODULE_MISTAKES, (state, x))
    return answer


@step("SelfAttention", points=3)
def test_module_structure(candidate, rng):
    answer = candidate.module("SelfAttention", init=(D_IN, D_OUT), args=(randn(rng, B, T, D_IN),))  # its own weights
    children = answer.value["children"]
    for name in NAMES:
        if children.get(name) != LINEAR:
            raise CheckFailed(f"expected {name} to be an nn.Linear(d_in, d_out, bias=qkv_bias), got {children.get(name, 'nothing')}")


@step("SelfAttention", points=3)
@FLOATS
def test_module_values(candidate, rng, dtype):
    _check_module(candidate, _state(rng, dtype=dtype), randn(rng, B, T, D_IN, dtype=dtype))


@step("SelfAttention", points=3)
def test_module_qkv_bias(candidate, rng):
    _check_module(candidate, _state(rng, bias=True), randn(rng, B, T, D_IN))


@step("SelfAttention", points=3)
def test_module_unbatched(candidate, rng):
    _check_module(candidate, _state(rng), randn(rng, T, D_IN))  # (T, d_in), as in the worked example


@step("SelfAttention", points=3)
def test_module_widening(candidate, rng):
    _check_module(candidate, _state(rng, bias=True, d_in=3, d_out=5), randn(rng, B, 4, 3))  # d_out > d_in


@step("SelfAttention", points=6)
def test_module_gradients(candidate, rng):
    state, x, grad_output = _state(rng, bias=True), randn(rng, B, T, D_IN), randn(rng, B, T, D_OUT)
    result = _run_module(candidate, state, x, grad_output=grad_output, grad_args=(0,)).value
    expect_close(result["output"], attend(state, x), MODULE_MISTAKES, (state, x))
    x_ = x.detach().requires_grad_(True)
    params = {k: v.detach().requires_grad_(True) for k, v in state.items()}
    (attend(params, x_) * grad_output).sum().backward()  # = backward(grad_output)
    for name, got, expected in [("x", result["arg_grads"][0], x_.grad)] + [
        (n, result["param_grads"].get(n), p.grad) for n, p in params.items()
    ]:
        try:
            expect_close(got, expected)
        except CheckFailed as failure:
            raise CheckFailed(f"the gradient of {name}: {failure.message}") from None


@step("SelfAttention", points=3)
def test_module_rules(candidate, rng, forbidden):
    state, x = _state(rng), randn(rng, B, T, D_IN)
    answer = _run_module(candidate, state, x)
    expect_allowed(answer, forbidden)
    expect_close(answer.value["output"], attend(state, x), MODULE_MISTAKES, (state, x))  # no points for garbage


@step("SelfAttention", points=3)
def test_module_device(candidate, rng, device):
    state, x = _state(rng, bias=True), randn(rng, B, T, D_IN)
    try:
        output = _run_module(candidate, state, x, device=device).value["output"]
    except CandidateError as error:
        skip_if_meta_unsupported(device, error)
        raise
    expect_on_device(output, attend(state, x), device, (state, x), MODULE_MISTAKES)
