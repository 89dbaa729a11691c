"""Hidden checks for the `mha_numpy` exercise: the `mha` steps in NumPy, np.ndarray in and out.

Every check calls exactly one candidate function, so a broken step costs only its own
points (and multi_head_attention's, which composes them). Values are graded against the
same torch reference as `mha` (solutions/mha.py): the grader makes NumPy inputs, runs the
reference on torch.from_numpy of them and takes its result back with .numpy(), so the two
exercises can never disagree. Every function keeps its input's dtype, float32 or float64.

Rules, in every step: the file imports no torch, and the call runs no torch function.
There are no device checks (the manifest says device_checks = false), and no
non-contiguous inputs: the worker rebuilds every ndarray C-contiguous from its bytes, and
only makes torch tensors non-contiguous (Strided).
Points per step add up to the step's points in grader/manifest.toml.
"""

import math

import numpy as np
import pytest
import torch

from grader.checks.expect import (
    CheckFailed,
    Mistake,
    as_tensor,
    expect_array,
    expect_array_close,
    expect_no_import,
    expect_numpy_only,
    explains_array,
    randn,
    random_mask,
    step,
)
from solutions import mha as ref

FLOATS = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
B, H, TQ, TK, DH = 2, 3, 5, 7, 4  # batch, heads, query and key tokens, head width: all different
D = H * DH


def _randn(rng, *shape, dtype=np.float32, scale=1.0) -> np.ndarray:
    """Seeded normal inputs, drawn like expect.randn (float64, then cast), as an ndarray."""
    return randn(rng, *shape, dtype=torch.float64, scale=scale).numpy().astype(dtype)


def _random_mask(rng, *shape) -> np.ndarray:
    return random_mask(rng, *shape).numpy()


def _ref(name, *args, **kwargs) -> np.ndarray:
    """The torch reference's step on NumPy inputs: arrays in as tensors, its tensor out as an array."""
    convert = lambda a: as_tensor(a) if isinstance(a, np.ndarray) else a  # noqa: E731
    return getattr(ref, name)(*map(convert, args), **{k: convert(v) for k, v in kwargs.items()}).numpy()


# -- project ------------------------------------------------------------------------------

PROJECT_MISTAKES = (
    Mistake("project.no_bias", "bias ignored: add bias (d_out,) when it is given", lambda x, w, b: x @ w.T),
    Mistake(
        "project.weight_not_transposed",
        "used x @ weight: weight is stored (d_out, d_in), so multiply by weight.T",
        lambda x, w, b: x @ w + (0 if b is None else b),
    ),
)


def _project_inputs(rng, dtype=np.float32, d_in=6, d_out=4, bias=True):
    x, w = _randn(rng, B, TQ, d_in, dtype=dtype), _randn(rng, d_out, d_in, dtype=dtype)
    return x, w, _randn(rng, d_out, dtype=dtype) if bias else None


@step("project", points=1)
def test_project_shape(candidate, rng):
    x, w, b = _project_inputs(rng)
    expect_array(candidate.call("project", x, w, b).value, (B, TQ, 4), np.float32)


@step("project", points=2)
@FLOATS
def test_project_values(candidate, rng, dtype):
    args = _project_inputs(rng, dtype)
    expect_array_close(candidate.call("project", *args).value, _ref("project", *args), PROJECT_MISTAKES, args)


@step("project", points=1)
def test_project_without_bias(candidate, rng):
    args = _project_inputs(rng, bias=False)
    expect_array_close(candidate.call("project", *args).value, _ref("project", *args), PROJECT_MISTAKES, args)


@step("project", points=1)
def test_project_square_weight(candidate, rng):
    args = _project_inputs(rng, d_in=5, d_out=5)  # d_in == d_out: a missing transpose runs but is wrong
    expect_array_close(candidate.call("project", *args).value, _ref("project", *args), PROJECT_MISTAKES, args)


@step("project", points=1)
def test_project_extra_leading_dims(candidate, rng):
    args = (_randn(rng, 2, 3, 4, 6), _randn(rng, 5, 6), _randn(rng, 5))
    expect_array_close(candidate.call("project", *args).value, _ref("project", *args), PROJECT_MISTAKES, args)



def _expect_rules(candidate, source, name, args, mistakes):
    """NumPy only, and the right values too: no rule points for garbage that keeps the rule."""
    answer = candidate.call(name, *args)
    expect_numpy_only(answer, source)
    expect_array_close(answer.value, _ref(name, *args), mistakes, args)

@step("project", points=2)
def test_project_rules(candidate, rng, source):
    args = _project_inputs(rng)
    _expect_rules(candidate, source, "project", args, PROJECT_MISTAKES)


# -- split_heads --------------------------------------------------------------------------

SPLIT_MISTAKES = (
    Mistake(
        "split_heads.no_transpose",
        "the head axis must come before the token axis: np.swapaxes(x, 1, 2) after the reshape to (B, T, H, Dh)",
        lambda x, h: x.reshape(x.shape[0], x.shape[1], h, x.shape[2] // h),
    ),
    Mistake(
        "split_heads.reshape_no_transpose",
        "heads split with a reshape straight to (B, H, T, Dh): reshape to (B, T, H, Dh), then np.swapaxes(x, 1, 2)",
        lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h),
    ),
    Mistake(
        "split_heads.interleaved",
        "interleaved heads: head h took every H-th feature; it must take the contiguous block [h·Dh, (h+1)·Dh)",
        lambda x, h: x.reshape(x.shape[0], x.shape[1], x.shape[2] // h, h).transpose(0, 3, 1, 2),
    ),
)


@step("split_heads", points=1)
def test_split_heads_shape(candidate, rng):
    expect_array(candidate.call("split_heads", _randn(rng, B, TQ, D), H).value, (B, H, TQ, DH), np.float32)


@step("split_heads", points=2)
@FLOATS
def test_split_heads_values(candidate, rng, dtype):
    x = _randn(rng, B, TQ, D, dtype=dtype)
    expect_array_close(candidate.call("split_heads", x, H).value, _ref("split_heads", x, H), SPLIT_MISTAKES, (x, H))


@step("split_heads", points=2)
def test_split_heads_round_trip(candidate, rng):
    x = _randn(rng, 3, 6, 8)  # merging the candidate's split with the reference merge gives x back
    out = expect_array(candidate.call("split_heads", x, 4).value, (3, 4, 6, 2), np.float32)
    expect_array_close(_ref("merge_heads", out), x)


@step("split_heads", points=1)
def test_split_heads_single_head(candidate, rng):
    x = _randn(rng, B, TQ, D)
    expect_array_close(candidate.call("split_heads", x, 1).value, _ref("split_heads", x, 1), SPLIT_MISTAKES, (x, 1))


@step("split_heads", points=2)
def test_split_heads_rules(candidate, rng, source):
    x = _randn(rng, B, TQ, D)
    _expect_rules(candidate, source, "split_heads", (x, H), SPLIT_MISTAKES)


# -- attention_scores ---------------------------------------------------------------------

SCORES_MISTAKES = (
    Mistake(
        "attention_scores.transposed",
        "scores transposed: you computed k @ qᵀ; the result is (..., Tq, Tk) = q @ kᵀ",
        lambda q, k: k @ np.swapaxes(q, -1, -2),
    ),
    Mistake(
        "attention_scores.full_transpose",
        "k.T reversed every axis of the batched k, not just the last two: use np.swapaxes(k, -1, -2)",
        lambda q, k: q @ k.T,
    ),
)


def _qk(rng, dtype=np.float32, tq=TQ, tk=TK, dh=DH, lead=(B, H)):
    return _randn(rng, *lead, tq, dh, dtype=dtype), _randn(rng, *lead, tk, dh, dtype=dtype)


@step("attention_scores", points=1)
def test_attention_scores_shape(candidate, rng):
    expect_array(candidate.call("attention_scores", *_qk(rng)).value, (B, H, TQ, TK), np.float32)


@step("attention_scores", points=2)
@FLOATS
def test_attention_scores_values(candidate, rng, dtype):
    args = _qk(rng, dtype)
    expect_array_close(candidate.call("attention_scores", *args).value, _ref("attention_scores", *args), SCORES_MISTAKES, args)


@step("attention_scores", points=1)
def test_attention_scores_square(candidate, rng):
    # Every axis the same size: k @ qᵀ, and q @ k.T (all axes reversed), run and have the right shape.
    args = _qk(rng, tq=3, tk=3, dh=3, lead=(3, 3))
    expect_array_close(candidate.call("attention_scores", *args).value, _ref("attention_scores", *args), SCORES_MISTAKES, args)


@step("attention_scores", points=1)
def test_attention_scores_any_leading_dims(candidate, rng):
    for lead in [(B,), (2, 2, 3)]:
        args = _qk(rng, lead=lead)
        expect_array_close(candidate.call("attention_scores", *args).value, _ref("attention_scores", *args), SCORES_MISTAKES, args)


@step("attention_scores", points=1)
def test_attention_scores_rules(candidate, rng, source):
    args = _qk(rng)
    _expect_rules(candidate, source, "attention_scores", args, SCORES_MISTAKES)


# -- scale_scores -------------------------------------------------------------------------

SCALE_MISTAKES = (
    Mistake(
        "scale_scores.multiplied",
        "divided by head_dim**-0.5: you multiplied by √d instead of dividing",
        lambda s, d: s * math.sqrt(d),
    ),
    Mistake("scale_scores.by_head_dim", "divided by head_dim instead of √head_dim", lambda s, d: s / d),
    Mistake("scale_scores.unscaled", "returned the scores unscaled: divide by √head_dim", lambda s, d: s),
)


@step("scale_scores", points=1)
def test_scale_scores_shape(candidate, rng):
    expect_array(candidate.call("scale_scores", _randn(rng, B, H, TQ, TK), 16).value, (B, H, TQ, TK), np.float32)


@step("scale_scores", points=2)
@FLOATS
def test_scale_scores_values(candidate, rng, dtype):
    args = (_randn(rng, B, H, TQ, TK, dtype=dtype, scale=4.0), 16)
    expect_array_close(candidate.call("scale_scores", *args).value, _ref("scale_scores", *args), SCALE_MISTAKES, args)


@step("scale_scores", points=1)
def test_scale_scores_irrational_root(candidate, rng):
    args = (_randn(rng, B, TQ, TK, dtype=np.float64), 8)  # √8 is not a whole number
    expect_array_close(candidate.call("scale_scores", *args).value, _ref("scale_scores", *args), SCALE_MISTAKES, args)


@step("scale_scores", points=1)
def test_scale_scores_any_shape(candidate, rng):
    for shape in [(TQ, TK), (2, 2, 3, TQ, TK)]:
        args = (_randn(rng, *shape, scale=4.0), 4)
        expect_array_close(candidate.call("scale_scores", *args).value, _ref("scale_scores", *args), SCALE_MISTAKES, args)


@step("scale_scores", points=1)
def test_scale_scores_rules(candidate, rng, source):
    args = (_randn(rng, B, H, TQ, TK, scale=4.0), 16)
    _expect_rules(candidate, source, "scale_scores", args, SCALE_MISTAKES)


# -- apply_mask ---------------------------------------------------------------------------

MASK_MISTAKES = (
    Mistake(
        "apply_mask.inverted",
        "mask convention inverted (True must mean attend): fill where the mask is False",
        lambda s, m: np.where(m, -np.inf, s),
    ),
    Mistake(
        "apply_mask.zero_fill",
        "blocked scores set to 0 (multiplied by the mask): exp(0) still gives them weight; use -inf",
        lambda s, m: s * m,
    ),
    Mistake(
        "apply_mask.additive_too_small",
        "blocked scores are not low enough: use -inf (or np.finfo(dtype).min), not a small offset",
        test=lambda out, s, m: bool(((out > -1e4) & ~m & (out != s)).any()),
    ),
)


def expect_masked(value, scores: np.ndarray, mask: np.ndarray | None) -> None:
    """Allowed entries keep their exact value; blocked entries are -inf or at most -1e4."""
    expect_array(value, scores.shape, scores.dtype)
    allowed = np.ones(scores.shape, dtype=bool) if mask is None else np.broadcast_to(mask, scores.shape)
    changed = (value != scores) & allowed
    if changed.any():
        where = tuple(int(i) for i in np.argwhere(changed)[0])
        raise CheckFailed(f"an allowed entry changed at {where}: expected {scores[where]:.6g}, got {value[where]:.6g}")
    high = ~allowed & ~(value <= -1e4)
    if high.any():
        where = tuple(int(i) for i in np.argwhere(high)[0])
        raise CheckFailed(f"a blocked entry at {where} is {value[where]:.6g}; blocked entries must be -inf or at most -1e4")


def _expect_masked_named(value, scores, mask):
    try:
        expect_masked(value, scores, mask)
    except CheckFailed as failure:
        if failure.mistake is None and mask is not None and isinstance(value, np.ndarray) and value.shape == scores.shape:
            full = np.broadcast_to(mask, scores.shape)
            for mistake in MASK_MISTAKES:
                if explains_array(mistake, value, (scores, full)):
                    raise CheckFailed(failure.message, mistake) from None
        raise


def _check_mask(candidate, scores, mask):
    _expect_masked_named(candidate.call("apply_mask", scores, mask).value, scores, mask)


@step("apply_mask", points=1)
def test_apply_mask_shape(candidate, rng):
    scores = _randn(rng, B, H, TQ, TK)
    expect_array(candidate.call("apply_mask", scores, _random_mask(rng, B, H, TQ, TK)).value, scores.shape, np.float32)


@step("apply_mask", points=2)
@FLOATS
def test_apply_mask_values(candidate, rng, dtype):
    _check_mask(candidate, _randn(rng, B, H, TQ, TK, dtype=dtype), _random_mask(rng, B, H, TQ, TK))


@step("apply_mask", points=1)
def test_apply_mask_broadcast_causal(candidate, rng):
    causal = np.tril(np.ones((TQ, TK), dtype=bool), k=TK - TQ)  # (Tq, Tk) for every batch and head
    _check_mask(candidate, _randn(rng, B, H, TQ, TK), causal)


@step("apply_mask", points=1)
def test_apply_mask_broadcast_padding(candidate, rng):
    padding = np.arange(TK) < np.array([TK, 3]).reshape(B, 1, 1, 1)  # (B, 1, 1, Tk)
    _check_mask(candidate, _randn(rng, B, H, TQ, TK), padding)


@step("apply_mask", points=1)
def test_apply_mask_none(candidate, rng):
    _check_mask(candidate, _randn(rng, B, H, TQ, TK), None)


@step("apply_mask", points=1)
def test_apply_mask_large_scores(candidate, rng):
    _check_mask(candidate, _randn(rng, B, H, TQ, TK, scale=5e3), _random_mask(rng, B, H, TQ, TK))


@step("apply_mask", points=1)
def test_apply_mask_fully_blocked_rows(candidate, rng):
    mask = _random_mask(rng, B, H, TQ, TK)
    mask[0, 1, 2] = False  # a query that may attend to nothing
    mask[1, :, :, 3] = False  # a key nobody may attend to
    _check_mask(candidate, _randn(rng, B, H, TQ, TK), mask)


@step("apply_mask", points=2)
def test_apply_mask_rules(candidate, rng, source):
    scores, mask = _randn(rng, B, H, TQ, TK), _random_mask(rng, B, H, TQ, TK)
    answer = candidate.call("apply_mask", scores, mask)
    expect_numpy_only(answer, source)
    _expect_masked_named(answer.value, scores, mask)


# -- softmax ------------------------------------------------------------------------------


def _has_nan_or_inf(out, *args):
    return bool((~np.isfinite(out.astype(np.float64))).any())


def _normalize(e, axis):
    return e / e.sum(axis=axis, keepdims=True)


SOFTMAX_MISTAKES = (
    Mistake(
        "softmax.ignored_axis",
        "softmax over the last axis whatever axis says: normalize along axis",
        lambda x, axis=-1: _ref("softmax", x, dim=-1),
    ),
    Mistake(
        "softmax.whole_tensor",
        "normalized over the whole array: sum along axis with keepdims=True",
        lambda x, axis=-1: np.exp(x) / np.exp(x).sum(),
    ),
    Mistake(
        "softmax.no_keepdims",
        "the sum lost its axis (no keepdims=True), so it broadcast against the wrong axis",
        lambda x, axis=-1: np.exp(x) / np.exp(x).sum(axis),
    ),
    Mistake(
        "softmax.max_no_keepdims",
        "the max lost its axis (np.max without keepdims=True), so each row had another row's max subtracted: "
        "use np.max(x, axis=axis, keepdims=True)",
        lambda x, axis=-1: _normalize(np.exp(x - x.max(axis)), axis),
    ),
)
UNSTABLE = Mistake(
    "softmax.unstable",
    "not numerically stable: exp overflows for large logits; subtract the max along axis first",
    test=_has_nan_or_inf,
)
NAN_ROWS = Mistake(
    "softmax.nan_rows",
    "a slice that is all -inf gives NaN: give it zeros (replace a -inf max by 0 and guard the zero sum)",
    test=_has_nan_or_inf,
)


@step("softmax", points=1)
def test_softmax_shape(candidate, rng):
    expect_array(candidate.call("softmax", _randn(rng, B, H, TQ, TK)).value, (B, H, TQ, TK), np.float32)


@step("softmax", points=2)
@FLOATS
def test_softmax_values(candidate, rng, dtype):
    x = _randn(rng, B, H, TQ, TK, dtype=dtype, scale=3.0)
    expect_array_close(candidate.call("softmax", x).value, _ref("softmax", x), SOFTMAX_MISTAKES, (x,))


@step("softmax", points=1)
def test_softmax_axis_0(candidate, rng):
    x = _randn(rng, 4, 5, 6, scale=3.0)
    expect_array_close(candidate.call("softmax", x, axis=0).value, _ref("softmax", x, dim=0), SOFTMAX_MISTAKES, (x, 0))


@step("softmax", points=1)
def test_softmax_axis_minus_2(candidate, rng):
    x = _randn(rng, B, H, TQ, TK, scale=3.0)
    expect_array_close(candidate.call("softmax", x, axis=-2).value, _ref("softmax", x, dim=-2), SOFTMAX_MISTAKES, (x, -2))


@step("softmax", points=2)
def test_softmax_large_logits(candidate, rng):
    x = _randn(rng, B, TQ, TK) * 1e4  # entries of ±1e4: exp overflows float32 without the max subtraction
    expect_array_close(candidate.call("softmax", x).value, _ref("softmax", x), (UNSTABLE, *SOFTMAX_MISTAKES), (x,))


@step("softmax", points=2)
def test_softmax_all_masked_rows(candidate, rng):
    x = _randn(rng, B, TQ, TK)
    x[0, 1] = -np.inf  # a fully blocked query row
    x[1, :, 2] = -np.inf  # and a blocked key column, which is fine
    expect_array_close(candidate.call("softmax", x).value, _ref("softmax", x), (NAN_ROWS,), (x,))


@step("softmax", points=1)
def test_softmax_square_matrix(candidate, rng):
    x = _randn(rng, 6, 6, scale=3.0)  # a plain square matrix: a max or sum without keepdims broadcasts silently
    expect_array_close(candidate.call("softmax", x).value, _ref("softmax", x), SOFTMAX_MISTAKES, (x,))


@step("softmax", points=2)
def test_softmax_rules(candidate, rng, source):
    x = _randn(rng, B, TQ, TK)
    answer = candidate.call("softmax", x)
    expect_numpy_only(answer, source)
    expect_no_import(source, "scipy")  # scipy.special.softmax is the one-line shortcut
    expect_array_close(answer.value, _ref("softmax", x), SOFTMAX_MISTAKES, (x,))


# -- weighted_sum -------------------------------------------------------------------------

WEIGHTED_MISTAKES = (
    Mistake(
        "weighted_sum.transposed_weights",
        "weights transposed in the weighted sum: use weights @ v, not weightsᵀ @ v",
        lambda w, v: np.swapaxes(w, -1, -2) @ v,
    ),
    Mistake(
        "weighted_sum.wrong_axis",
        "weighted sum over the wrong axis: the broadcast product was summed over the query axis; "
        "out[..., i, :] = Σ_j weights[..., i, j] · v[..., j, :] sums over the key axis (or use weights @ v)",
        lambda w, v: (w[..., :, :, None] * v[..., None, :, :]).sum(axis=-3),
    ),
)


def _weights_v(rng, dtype=np.float32, tq=TQ, tk=TK, lead=(B, H)):
    weights = _ref("softmax", _randn(rng, *lead, tq, tk, dtype=dtype, scale=2.0))
    return weights, _randn(rng, *lead, tk, 6, dtype=dtype)


@step("weighted_sum", points=1)
def test_weighted_sum_shape(candidate, rng):
    expect_array(candidate.call("weighted_sum", *_weights_v(rng)).value, (B, H, TQ, 6), np.float32)


@step("weighted_sum", points=2)
@FLOATS
def test_weighted_sum_values(candidate, rng, dtype):
    args = _weights_v(rng, dtype)
    expect_array_close(candidate.call("weighted_sum", *args).value, _ref("weighted_sum", *args), WEIGHTED_MISTAKES, args)


@step("weighted_sum", points=1)
def test_weighted_sum_square(candidate, rng):
    args = _weights_v(rng, tq=TK)  # Tq == Tk: transposed weights, or a sum over the query axis, have the right shape
    expect_array_close(candidate.call("weighted_sum", *args).value, _ref("weighted_sum", *args), WEIGHTED_MISTAKES, args)


@step("weighted_sum", points=1)
def test_weighted_sum_any_leading_dims(candidate, rng):
    args = _weights_v(rng, lead=(3,))
    expect_array_close(candidate.call("weighted_sum", *args).value, _ref("weighted_sum", *args), WEIGHTED_MISTAKES, args)


@step("weighted_sum", points=1)
def test_weighted_sum_rules(candidate, rng, source):
    args = _weights_v(rng)
    _expect_rules(candidate, source, "weighted_sum", args, WEIGHTED_MISTAKES)


# -- merge_heads --------------------------------------------------------------------------

MERGE_MISTAKES = (
    Mistake(
        "merge_heads.no_transpose",
        "merged heads without moving the head axis back: np.swapaxes(x, 1, 2) before the reshape",
        lambda x: x.reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3]),
    ),
    Mistake(
        "merge_heads.interleaved",
        "heads interleaved: features of one head must stay together, as (B, T, H, Dh) flattened",
        lambda x: x.transpose(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3]),
    ),
    Mistake(
        "merge_heads.full_transpose",
        "x.T reversed every axis, to (Dh, T, H, B), and the reshape hid it: swap only axes 1 and 2 (np.swapaxes(x, 1, 2))",
        lambda x: x.T.reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3]),
    ),
)


@step("merge_heads", points=1)
def test_merge_heads_shape(candidate, rng):
    expect_array(candidate.call("merge_heads", _randn(rng, B, H, TQ, DH)).value, (B, TQ, D), np.float32)


@step("merge_heads", points=2)
@FLOATS
def test_merge_heads_values(candidate, rng, dtype):
    x = _randn(rng, B, H, TQ, DH, dtype=dtype)
    expect_array_close(candidate.call("merge_heads", x).value, _ref("merge_heads", x), MERGE_MISTAKES, (x,))


@step("merge_heads", points=2)
def test_merge_heads_round_trip(candidate, rng):
    x = _randn(rng, 3, 6, 8)  # the candidate's merge undoes the reference split
    split = _ref("split_heads", x, 4)
    expect_array_close(candidate.call("merge_heads", split).value, x, MERGE_MISTAKES, (split,))


@step("merge_heads", points=1)
def test_merge_heads_single_head(candidate, rng):
    x = _randn(rng, B, 1, TQ, D)
    expect_array_close(candidate.call("merge_heads", x).value, _ref("merge_heads", x), MERGE_MISTAKES, (x,))


@step("merge_heads", points=2)
def test_merge_heads_rules(candidate, rng, source):
    x = _randn(rng, B, H, TQ, DH)
    _expect_rules(candidate, source, "merge_heads", (x,), MERGE_MISTAKES)


# -- multi_head_attention -----------------------------------------------------------------

PARAMS = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")  # the candidate's argument order


def attend(params, query, key, value, heads=H, mask=None, *, scale_by="head", softmax_axis=-1,
           invert_mask=False, value_from="value", out_proj=True) -> np.ndarray:
    """The function from torch reference steps on NumPy inputs; the keyword arguments make the named wrong variants."""
    p = {name: None if a is None else as_tensor(a) for name, a in params.items()}
    query, key, value = as_tensor(query), as_tensor(key), as_tensor(value)
    value = {"value": value, "key": key}[value_from]
    embed = query.shape[-1]
    q, k, v = (
        ref.split_heads(ref.project(x, p[f"w_{n}"], p[f"b_{n}"]), heads)
        for x, n in ((query, "q"), (key, "k"), (value, "v"))
    )
    scores = ref.attention_scores(q, k)
    scores = {"head": scores / math.sqrt(embed // heads), "embed": scores / math.sqrt(embed), "none": scores}[scale_by]
    if mask is not None:
        scores = ref.apply_mask(scores, as_tensor(~mask if invert_mask else mask))
    out = ref.merge_heads(ref.weighted_sum(ref.softmax(scores, softmax_axis), v))
    return (ref.project(out, p["w_o"], p["b_o"]) if out_proj else out).numpy()


MHA_MISTAKES = (
    Mistake("multi_head_attention.scaled_by_embed_dim", "scaled by √embed_dim instead of √head_dim",
            lambda p, *a, **k: attend(p, *a, **k, scale_by="embed")),
    Mistake("multi_head_attention.unscaled", "scores not scaled: divide by √head_dim before the softmax",
            lambda p, *a, **k: attend(p, *a, **k, scale_by="none")),
    Mistake("multi_head_attention.softmax_query_axis", "softmax over the query axis: normalize over keys, axis=-1",
            lambda p, *a, **k: attend(p, *a, **k, softmax_axis=-2)),
    Mistake("multi_head_attention.mask_inverted", "mask convention inverted (True must mean attend)",
            lambda p, *a, **k: attend(p, *a, **k, invert_mask=True)),
    Mistake("multi_head_attention.key_as_value", "used the key as the value: project `value` with w_v",
            lambda p, *a, **k: attend(p, *a, **k, value_from="key")),
    Mistake("multi_head_attention.no_output_projection", "forgot the output projection w_o after merging heads",
            lambda p, *a, **k: attend(p, *a, **k, out_proj=False)),
)


def _params(rng, bias=True, dtype=np.float32, embed=D):
    params = {}
    for n in "qkvo":
        params[f"w_{n}"] = _randn(rng, embed, embed, dtype=dtype, scale=embed**-0.5)
        params[f"b_{n}"] = _randn(rng, embed, dtype=dtype, scale=0.1) if bias else None
    return params


def _mask(rng, *shape):
    """A mask that, and whose inverse, blocks no row entirely (such rows are graded in softmax)."""
    mask = _random_mask(rng, *shape)
    mask[..., 1] = False
    return mask


def _call_mha(candidate, params, query, key, value, heads=H, mask=None):
    kwargs = {} if mask is None else {"mask": mask}  # without a mask, the default mask=None is used
    return candidate.call("multi_head_attention", query, key, value, *(params[n] for n in PARAMS), heads, **kwargs)


def _check_mha(candidate, params, query, key, value, heads=H, mask=None):
    args = (params, query, key, value, heads, mask)
    expect_array_close(_call_mha(candidate, *args).value, attend(*args), MHA_MISTAKES, args)


@step("multi_head_attention", points=2)
def test_mha_shape(candidate, rng):
    x = _randn(rng, B, TQ, D)
    expect_array(_call_mha(candidate, _params(rng), x, x, x).value, (B, TQ, D), np.float32)


@step("multi_head_attention", points=2)
@FLOATS
def test_mha_self_attention(candidate, rng, dtype):
    x = _randn(rng, B, TQ, D, dtype=dtype)
    _check_mha(candidate, _params(rng, dtype=dtype), x, x, x)


@step("multi_head_attention", points=3)
def test_mha_cross_attention(candidate, rng):
    query, key, value = _randn(rng, B, TQ, D), _randn(rng, B, TK, D), _randn(rng, B, TK, D)  # key != value
    _check_mha(candidate, _params(rng), query, key, value)


@step("multi_head_attention", points=3)
def test_mha_masks(candidate, rng):
    query, key, value = _randn(rng, B, TQ, D), _randn(rng, B, TK, D), _randn(rng, B, TK, D)
    params = _params(rng)
    _check_mha(candidate, params, query, key, value, mask=_mask(rng, B, 1, TQ, TK))
    _check_mha(candidate, params, query, key, value, mask=_mask(rng, TQ, TK))


@step("multi_head_attention", points=2)
def test_mha_causal_self_attention(candidate, rng):
    x = _randn(rng, B, TQ, D, dtype=np.float64)
    causal = np.tril(np.ones((TQ, TQ), dtype=bool))  # (T, T): token i sees tokens 0..i
    _check_mha(candidate, _params(rng, dtype=np.float64), x, x, x, mask=causal)


@step("multi_head_attention", points=2)
def test_mha_without_bias(candidate, rng):
    x, key = _randn(rng, B, TQ, D), _randn(rng, B, TK, D)
    _check_mha(candidate, _params(rng, bias=False), x, key, key)


@step("multi_head_attention", points=2)
def test_mha_other_head_counts(candidate, rng):
    query, key, value = _randn(rng, B, TQ, D), _randn(rng, B, TK, D), _randn(rng, B, TK, D)
    params = _params(rng)
    for heads in (1, 6):  # head_dim 12 and 2
        _check_mha(candidate, params, query, key, value, heads=heads)


@step("multi_head_attention", points=2)
def test_mha_rules(candidate, rng, source):
    params, query, key, value = _params(rng), _randn(rng, B, TQ, D), _randn(rng, B, TK, D), _randn(rng, B, TK, D)
    args = (params, query, key, value, H, _mask(rng, TQ, TK))
    answer = _call_mha(candidate, *args)
    expect_numpy_only(answer, source)
    expect_array_close(answer.value, attend(*args), MHA_MISTAKES, args)  # no points for a rule kept by garbage
