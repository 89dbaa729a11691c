"""Hidden checks for the `mha` exercise: one group per step, each graded with the grader's own inputs.

Every check calls exactly one candidate function (or builds the module), so a broken
step costs only its own points. The reference runs here, in the grader's process.
Points per step add up to the step's points in grader/manifest.toml.
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
    random_mask,
    skip_if_meta_unsupported,
    step,
)
from solutions import mha as ref

FLOATS = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
B, H, TQ, TK, DH = 2, 3, 5, 7, 4  # batch, heads, query and key tokens, head width: all different
D = H * DH

# -- project ------------------------------------------------------------------------------

PROJECT_MISTAKES = (
    Mistake("project.no_bias", "bias ignored: add bias (d_out,) when it is given", lambda x, w, b: x @ w.T),
    Mistake(
        "project.weight_not_transposed",
        "used x @ weight: weight is stored (d_out, d_in), so multiply by weight.T",
        lambda x, w, b: x @ w + (0 if b is None else b),
    ),
)


def _project_inputs(rng, dtype=torch.float32, d_in=6, d_out=4, bias=True):
    return randn(rng, B, TQ, d_in, dtype=dtype), randn(rng, d_out, d_in, dtype=dtype), randn(rng, d_out, dtype=dtype) if bias else None


@step("project", points=1)
def test_project_shape(candidate, rng):
    x, w, b = _project_inputs(rng)
    expect_tensor(candidate.call("project", x, w, b).value, (B, TQ, 4), torch.float32)


@step("project", points=2)
@FLOATS
def test_project_values(candidate, rng, dtype):
    args = _project_inputs(rng, dtype)
    expect_close(candidate.call("project", *args).value, ref.project(*args), PROJECT_MISTAKES, args)


@step("project", points=1)
def test_project_without_bias(candidate, rng):
    args = _project_inputs(rng, bias=False)
    expect_close(candidate.call("project", *args).value, ref.project(*args), PROJECT_MISTAKES, args)


@step("project", points=1)
def test_project_square_weight(candidate, rng):
    args = _project_inputs(rng, d_in=5, d_out=5)  # d_in == d_out: a missing transpose runs but is wrong
    expect_close(candidate.call("project", *args).value, ref.project(*args), PROJECT_MISTAKES, args)


@step("project", points=1)
def test_project_extra_leading_dims_noncontiguous(candidate, rng):
    x, w, b = randn(rng, 2, 3, 4, 6), randn(rng, 5, 6), randn(rng, 5)
    out = candidate.call("project", Strided(x), w, b).value
    expect_close(out, ref.project(x, w, b), PROJECT_MISTAKES, (x, w, b))


@step("project", points=1)
def test_project_rules(candidate, rng, forbidden):
    args = _project_inputs(rng)
    answer = candidate.call("project", *args)
    expect_allowed(answer, forbidden)
    expect_close(answer.value, ref.project(*args), PROJECT_MISTAKES, args)  # no points for a rule kept by garbage


@step("project", points=1)
def test_project_device(candidate, rng, device):
    args = _project_inputs(rng)
    expect_on_device(call_on_device(candidate, device, "project", *args), ref.project(*args), device, args, PROJECT_MISTAKES)


# -- split_heads --------------------------------------------------------------------------

SPLIT_MISTAKES = (
    Mistake(
        "split_heads.no_transpose",
        "the head axis must come before the token axis: transpose(1, 2) after the view to (B, T, H, Dh)",
        lambda x, h: x.reshape(x.shape[0], x.shape[1], h, x.shape[2] // h),
    ),
    Mistake(
        "split_heads.view_no_transpose",
        "heads split with view and no transpose: view (B, T, H, Dh), then transpose(1, 2)",
        lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h),
    ),
    Mistake(
        "split_heads.interleaved",
        "interleaved heads: head h took every H-th feature; it must take the contiguous block [h·Dh, (h+1)·Dh)",
        lambda x, h: x.reshape(x.shape[0], x.shape[1], x.shape[2] // h, h).permute(0, 3, 1, 2),
    ),
)


@step("split_heads", points=1)
def test_split_heads_shape(candidate, rng):
    expect_tensor(candidate.call("split_heads", randn(rng, B, TQ, D), H).value, (B, H, TQ, DH), torch.float32)


@step("split_heads", points=2)
@FLOATS
def test_split_heads_values(candidate, rng, dtype):
    x = randn(rng, B, TQ, D, dtype=dtype)
    expect_close(candidate.call("split_heads", x, H).value, ref.split_heads(x, H), SPLIT_MISTAKES, (x, H))


@step("split_heads", points=1)
def test_split_heads_noncontiguous(candidate, rng):
    x = randn(rng, B, TQ, D)
    expect_close(candidate.call("split_heads", Strided(x), H).value, ref.split_heads(x, H), SPLIT_MISTAKES, (x, H))


@step("split_heads", points=2)
def test_split_heads_round_trip(candidate, rng):
    x = randn(rng, 3, 6, 8)  # merging the candidate's split with the reference merge gives x back
    out = expect_tensor(candidate.call("split_heads", x, 4).value, (3, 4, 6, 2), torch.float32)
    expect_close(ref.merge_heads(out), x)


@step("split_heads", points=1)
def test_split_heads_single_head(candidate, rng):
    x = randn(rng, B, TQ, D)
    expect_close(candidate.call("split_heads", x, 1).value, ref.split_heads(x, 1), SPLIT_MISTAKES, (x, 1))


@step("split_heads", points=1)
def test_split_heads_device(candidate, rng, device):
    x = randn(rng, B, TQ, D)
    expect_on_device(call_on_device(candidate, device, "split_heads", x, H), ref.split_heads(x, H), device, (x, H), SPLIT_MISTAKES)


# -- attention_scores ---------------------------------------------------------------------

SCORES_MISTAKES = (
    Mistake(
        "attention_scores.transposed",
        "scores transposed: you computed k @ qᵀ; the result is (..., Tq, Tk) = q @ kᵀ",
        lambda q, k: k @ q.transpose(-2, -1),
    ),
)


def _qk(rng, dtype=torch.float32, tq=TQ, tk=TK, lead=(B, H)):
    return randn(rng, *lead, tq, DH, dtype=dtype), randn(rng, *lead, tk, DH, dtype=dtype)


@step("attention_scores", points=1)
def test_attention_scores_shape(candidate, rng):
    expect_tensor(candidate.call("attention_scores", *_qk(rng)).value, (B, H, TQ, TK), torch.float32)


@step("attention_scores", points=2)
@FLOATS
def test_attention_scores_values(candidate, rng, dtype):
    args = _qk(rng, dtype)
    expect_close(candidate.call("attention_scores", *args).value, ref.attention_scores(*args), SCORES_MISTAKES, args)


@step("attention_scores", points=1)
def test_attention_scores_square(candidate, rng):
    args = _qk(rng, tq=6, tk=6)  # Tq == Tk: a transposed result has the right shape
    expect_close(candidate.call("attention_scores", *args).value, ref.attention_scores(*args), SCORES_MISTAKES, args)


@step("attention_scores", points=1)
def test_attention_scores_any_leading_dims(candidate, rng):
    for lead in [(B,), (2, 2, 3)]:
        args = _qk(rng, lead=lead)
        expect_close(candidate.call("attention_scores", *args).value, ref.attention_scores(*args), SCORES_MISTAKES, args)


@step("attention_scores", points=1)
def test_attention_scores_device(candidate, rng, device):
    args = _qk(rng)
    expect_on_device(call_on_device(candidate, device, "attention_scores", *args), ref.attention_scores(*args), device, args, SCORES_MISTAKES)


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
    expect_tensor(candidate.call("scale_scores", randn(rng, B, H, TQ, TK), 16).value, (B, H, TQ, TK), torch.float32)


@step("scale_scores", points=2)
@FLOATS
def test_scale_scores_values(candidate, rng, dtype):
    args = (randn(rng, B, H, TQ, TK, dtype=dtype, scale=4.0), 16)
    expect_close(candidate.call("scale_scores", *args).value, ref.scale_scores(*args), SCALE_MISTAKES, args)


@step("scale_scores", points=1)
def test_scale_scores_irrational_root(candidate, rng):
    args = (randn(rng, B, TQ, TK, dtype=torch.float64), 8)  # √8 is not a whole number
    expect_close(candidate.call("scale_scores", *args).value, ref.scale_scores(*args), SCALE_MISTAKES, args)


@step("scale_scores", points=1)
def test_scale_scores_float16(candidate, rng):
    args = (randn(rng, B, H, TQ, TK, dtype=torch.float16), 16)
    expect_close(candidate.call("scale_scores", *args).value, ref.scale_scores(*args), SCALE_MISTAKES, args)


@step("scale_scores", points=1)
def test_scale_scores_device(candidate, rng, device):
    args = (randn(rng, B, H, TQ, TK), 16)
    expect_on_device(call_on_device(candidate, device, "scale_scores", *args), ref.scale_scores(*args), device, args, SCALE_MISTAKES)


# -- apply_mask ---------------------------------------------------------------------------

MASK_MISTAKES = (
    Mistake(
        "apply_mask.inverted",
        "mask convention inverted (True must mean attend): fill where the mask is False",
        lambda s, m: s.masked_fill(m, float("-inf")),
    ),
    Mistake(
        "apply_mask.zero_fill",
        "blocked scores set to 0 (multiplied by the mask): exp(0) still gives them weight; use -inf",
        lambda s, m: s * m,
    ),
    Mistake(
        "apply_mask.additive_too_small",
        "blocked scores are not low enough: use -inf (or finfo(dtype).min), not a small offset",
        test=lambda out, s, m: bool(((out > -1e4) & ~m & (out != s)).any()),
    ),
)


def expect_masked(value, scores: torch.Tensor, mask: torch.Tensor | None, device: str = "cpu") -> None:
    """Allowed entries keep their exact value; blocked entries are -inf or at most -1e4."""
    expect_tensor(value, scores.shape, scores.dtype, device)
    if device == "meta":
        return
    allowed = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask.expand(scores.shape)
    changed = (value != scores) & allowed
    if changed.any():
        where = tuple(int(i) for i in changed.nonzero()[0])
        raise CheckFailed(f"an allowed entry changed at {where}: expected {scores[where].item():.6g}, got {value[where].item():.6g}")
    high = ~allowed & ~(value <= -1e4)
    if high.any():
        where = tuple(int(i) for i in high.nonzero()[0])
        raise CheckFailed(f"a blocked entry at {where} is {value[where].item():.6g}; blocked entries must be -inf or at most -1e4")


def _check_mask(candidate, scores, mask, device="cpu"):
    value = candidate.call("apply_mask", scores, mask, device=device).value
    try:
        expect_masked(value, scores, mask if mask is None else mask.expand(scores.shape), device)
    except CheckFailed as failure:
        full = None if mask is None else mask.expand(scores.shape)
        for mistake in MASK_MISTAKES:
            if full is not None and isinstance(value, torch.Tensor) and value.shape == scores.shape and mistake.explains(value, (scores, full)):
                raise CheckFailed(failure.message, mistake) from None
        raise


@step("apply_mask", points=1)
def test_apply_mask_shape(candidate, rng):
    scores = randn(rng, B, H, TQ, TK)
    expect_tensor(candidate.call("apply_mask", scores, random_mask(rng, B, H, TQ, TK)).value, scores.shape, torch.float32)


@step("apply_mask", points=2)
@FLOATS
def test_apply_mask_values(candidate, rng, dtype):
    _check_mask(candidate, randn(rng, B, H, TQ, TK, dtype=dtype), random_mask(rng, B, H, TQ, TK))


@step("apply_mask", points=1)
def test_apply_mask_broadcast_causal(candidate, rng):
    causal = torch.ones(TQ, TK, dtype=torch.bool).tril(diagonal=TK - TQ)  # (Tq, Tk) for every batch and head
    _check_mask(candidate, randn(rng, B, H, TQ, TK), causal)


@step("apply_mask", points=1)
def test_apply_mask_broadcast_padding(candidate, rng):
    padding = torch.arange(TK) < torch.tensor([TK, 3]).view(B, 1, 1, 1)  # (B, 1, 1, Tk)
    _check_mask(candidate, randn(rng, B, H, TQ, TK), padding)


@step("apply_mask", points=1)
def test_apply_mask_none(candidate, rng):
    _check_mask(candidate, randn(rng, B, H, TQ, TK), None)


@step("apply_mask", points=1)
def test_apply_mask_large_scores(candidate, rng):
    _check_mask(candidate, randn(rng, B, H, TQ, TK, scale=5e3), random_mask(rng, B, H, TQ, TK))


@step("apply_mask", points=1)
def test_apply_mask_float16(candidate, rng):
    _check_mask(candidate, randn(rng, B, H, TQ, TK, dtype=torch.float16), random_mask(rng, B, H, TQ, TK))


@step("apply_mask", points=1)
def test_apply_mask_bfloat16(candidate, rng):
    _check_mask(candidate, randn(rng, B, H, TQ, TK, dtype=torch.bfloat16), random_mask(rng, B, H, TQ, TK))


@step("apply_mask", points=1)
def test_apply_mask_device(candidate, rng, device):
    try:
        _check_mask(candidate, randn(rng, B, H, TQ, TK), random_mask(rng, 1, 1, TQ, TK), device)
    except CandidateError as error:
        skip_if_meta_unsupported(device, error)
        raise


# -- softmax ------------------------------------------------------------------------------


def _has_nan_or_inf(out, *args):
    return bool((~torch.isfinite(out.to(torch.float64))).any())


SOFTMAX_MISTAKES = (
    Mistake(
        "softmax.ignored_dim",
        "softmax over the last axis whatever dim says: normalize along dim",
        lambda x, dim=-1: ref.softmax(x, -1),
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
    test=_has_nan_or_inf,
)
NAN_ROWS = Mistake(
    "softmax.nan_rows",
    "a slice that is all -inf gives NaN: give it zeros (replace a -inf max by 0 and guard the zero sum)",
    test=_has_nan_or_inf,
)


@step("softmax", points=1)
def test_softmax_shape(candidate, rng):
    expect_tensor(candidate.call("softmax", randn(rng, B, H, TQ, TK)).value, (B, H, TQ, TK), torch.float32)


@step("softmax", points=2)
@FLOATS
def test_softmax_values(candidate, rng, dtype):
    x = randn(rng, B, H, TQ, TK, dtype=dtype, scale=3.0)
    expect_close(candidate.call("softmax", x).value, ref.softmax(x), SOFTMAX_MISTAKES, (x,))


@step("softmax", points=1)
def test_softmax_dim_0(candidate, rng):
    x = randn(rng, 4, 5, 6, scale=3.0)
    expect_close(candidate.call("softmax", x, dim=0).value, ref.softmax(x, dim=0), SOFTMAX_MISTAKES, (x, 0))


@step("softmax", points=1)
def test_softmax_dim_minus_2(candidate, rng):
    x = randn(rng, B, H, TQ, TK, scale=3.0)
    expect_close(candidate.call("softmax", x, dim=-2).value, ref.softmax(x, dim=-2), SOFTMAX_MISTAKES, (x, -2))


@step("softmax", points=2)
def test_softmax_large_logits(candidate, rng):
    x = randn(rng, B, TQ, TK) * 1e4  # entries of ±1e4: exp overflows float32 without the max subtraction
    expect_close(candidate.call("softmax", x).value, ref.softmax(x), (UNSTABLE, *SOFTMAX_MISTAKES), (x,))


@step("softmax", points=2)
def test_softmax_all_masked_rows(candidate, rng):
    x = randn(rng, B, TQ, TK)
    x[0, 1] = float("-inf")  # a fully blocked query row
    x[1, :, 2] = float("-inf")  # and a blocked key column, which is fine
    expect_close(candidate.call("softmax", x).value, ref.softmax(x), (NAN_ROWS,), (x,))


@step("softmax", points=1)
def test_softmax_noncontiguous_matrix(candidate, rng):
    x = randn(rng, 6, 6, scale=3.0)  # a plain square matrix: a sum without keepdim broadcasts silently
    expect_close(candidate.call("softmax", Strided(x)).value, ref.softmax(x), SOFTMAX_MISTAKES, (x,))


@step("softmax", points=1)
def test_softmax_rules(candidate, rng, forbidden):
    x = randn(rng, B, TQ, TK)
    answer = candidate.call("softmax", x)
    expect_allowed(answer, forbidden)
    expect_close(answer.value, ref.softmax(x), SOFTMAX_MISTAKES, (x,))  # no points for a rule kept by garbage


@step("softmax", points=1)
def test_softmax_device(candidate, rng, device):
    x = randn(rng, B, H, TQ, TK)
    expect_on_device(call_on_device(candidate, device, "softmax", x), ref.softmax(x), device, (x,), SOFTMAX_MISTAKES)


# -- weighted_sum -------------------------------------------------------------------------

WEIGHTED_MISTAKES = (
    Mistake(
        "weighted_sum.transposed_weights",
        "weights transposed in the weighted sum: use weights @ v, not weightsᵀ @ v",
        lambda w, v: w.transpose(-2, -1) @ v,
    ),
)


def _weights_v(rng, dtype=torch.float32, tq=TQ, tk=TK, lead=(B, H)):
    return ref.softmax(randn(rng, *lead, tq, tk, dtype=dtype, scale=2.0)), randn(rng, *lead, tk, 6, dtype=dtype)


@step("weighted_sum", points=1)
def test_weighted_sum_shape(candidate, rng):
    expect_tensor(candidate.call("weighted_sum", *_weights_v(rng)).value, (B, H, TQ, 6), torch.float32)


@step("weighted_sum", points=2)
@FLOATS
def test_weighted_sum_values(candidate, rng, dtype):
    args = _weights_v(rng, dtype)
    expect_close(candidate.call("weighted_sum", *args).value, ref.weighted_sum(*args), WEIGHTED_MISTAKES, args)


@step("weighted_sum", points=1)
def test_weighted_sum_square(candidate, rng):
    args = _weights_v(rng, tq=TK)  # Tq == Tk: transposed weights have the right shape
    expect_close(candidate.call("weighted_sum", *args).value, ref.weighted_sum(*args), WEIGHTED_MISTAKES, args)


@step("weighted_sum", points=1)
def test_weighted_sum_any_leading_dims(candidate, rng):
    args = _weights_v(rng, lead=(3,))
    expect_close(candidate.call("weighted_sum", *args).value, ref.weighted_sum(*args), WEIGHTED_MISTAKES, args)


@step("weighted_sum", points=1)
def test_weighted_sum_device(candidate, rng, device):
    args = _weights_v(rng)
    expect_on_device(call_on_device(candidate, device, "weighted_sum", *args), ref.weighted_sum(*args), device, args, WEIGHTED_MISTAKES)


# -- merge_heads --------------------------------------------------------------------------

MERGE_MISTAKES = (
    Mistake(
        "merge_heads.no_transpose",
        "merged heads without moving the head axis back: transpose(1, 2) before the reshape",
        lambda x: x.reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3]),
    ),
    Mistake(
        "merge_heads.interleaved",
        "heads interleaved: features of one head must stay together, as (B, T, H, Dh) flattened",
        lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3]),
    ),
)


@step("merge_heads", points=1)
def test_merge_heads_shape(candidate, rng):
    expect_tensor(candidate.call("merge_heads", randn(rng, B, H, TQ, DH)).value, (B, TQ, D), torch.float32)


@step("merge_heads", points=2)
@FLOATS
def test_merge_heads_values(candidate, rng, dtype):
    x = randn(rng, B, H, TQ, DH, dtype=dtype)
    expect_close(candidate.call("merge_heads", x).value, ref.merge_heads(x), MERGE_MISTAKES, (x,))


@step("merge_heads", points=1)
def test_merge_heads_noncontiguous(candidate, rng):
    x = randn(rng, B, H, TQ, DH)
    expect_close(candidate.call("merge_heads", Strided(x)).value, ref.merge_heads(x), MERGE_MISTAKES, (x,))


@step("merge_heads", points=2)
def test_merge_heads_round_trip(candidate, rng):
    x = randn(rng, 3, 6, 8)  # the candidate's merge undoes the reference split
    split = ref.split_heads(x, 4)
    expect_close(candidate.call("merge_heads", split).value, x, MERGE_MISTAKES, (split,))


@step("merge_heads", points=1)
def test_merge_heads_single_head(candidate, rng):
    x = randn(rng, B, 1, TQ, D)
    expect_close(candidate.call("merge_heads", x).value, ref.merge_heads(x), MERGE_MISTAKES, (x,))


@step("merge_heads", points=1)
def test_merge_heads_device(candidate, rng, device):
    x = randn(rng, B, H, TQ, DH)
    expect_on_device(call_on_device(candidate, device, "merge_heads", x), ref.merge_heads(x), device, (x,), MERGE_MISTAKES)


# -- MultiHeadAttention -------------------------------------------------------------------

LINEAR = "torch.nn.modules.linear.Linear"


def attend(state, query, key=None, value=None, mask=None, *, heads=H, scale_by="head", softmax_dim=-1,
           invert_mask=False, value_from="value", out_proj=True):
    """The module's forward from reference steps; the keyword arguments make the named wrong variants."""
    key = query if key is None else key
    value = key if value is None else value
    value = {"value": value, "key": key}[value_from]
    embed = query.shape[-1]
    q, k, v = (
        ref.split_heads(ref.project(x, state[f"{n}.weight"], state.get(f"{n}.bias")), heads)
        for x, n in ((query, "w_q"), (key, "w_k"), (value, "w_v"))
    )
    scores = ref.attention_scores(q, k)
    scores = {"head": scores / math.sqrt(embed // heads), "embed": scores / math.sqrt(embed), "none": scores}[scale_by]
    if mask is not None:
        scores = ref.apply_mask(scores, ~mask if invert_mask else mask)
    out = ref.merge_heads(ref.weighted_sum(ref.softmax(scores, softmax_dim), v))
    return ref.project(out, state["w_o.weight"], state.get("w_o.bias")) if out_proj else out


MODULE_MISTAKES = (
    Mistake("MultiHeadAttention.scaled_by_embed_dim", "scaled by √embed_dim instead of √head_dim",
            lambda s, *a, **k: attend(s, *a, **k, scale_by="embed")),
    Mistake("MultiHeadAttention.unscaled", "scores not scaled: divide by √head_dim before the softmax",
            lambda s, *a, **k: attend(s, *a, **k, scale_by="none")),
    Mistake("MultiHeadAttention.softmax_query_axis", "softmax over the query axis: normalize over keys, dim=-1",
            lambda s, *a, **k: attend(s, *a, **k, softmax_dim=-2)),
    Mistake("MultiHeadAttention.mask_inverted", "mask convention inverted (True must mean attend)",
            lambda s, *a, **k: attend(s, *a, **k, invert_mask=True)),
    Mistake("MultiHeadAttention.key_as_value", "used the key as the value: project `value` with w_v",
            lambda s, *a, **k: attend(s, *a, **k, value_from="key")),
    Mistake("MultiHeadAttention.no_output_projection", "forgot the output projection w_o after merging heads",
            lambda s, *a, **k: attend(s, *a, **k, out_proj=False)),
)


def _state(rng, bias=True, dtype=torch.float32, embed=D):
    names = ("w_q", "w_k", "w_v", "w_o")
    state = {f"{n}.weight": randn(rng, embed, embed, dtype=dtype, scale=embed**-0.5) for n in names}
    if bias:
        state.update({f"{n}.bias": randn(rng, embed, dtype=dtype, scale=0.1) for n in names})
    return state


def _mask(rng, *shape):
    """A mask that, and whose inverse, blocks no row entirely (such rows are graded in softmax)."""
    mask = random_mask(rng, *shape)
    mask[..., 1] = False
    return mask


def _run_module(candidate, state, query, key=None, value=None, mask=None, bias=True, device="cpu", **extra):
    answer = candidate.module(
        "MultiHeadAttention", init=(query.shape[-1], H), init_kwargs={"bias": bias}, state=state,
        args=(query,), kwargs={"key": key, "value": value, "mask": mask}, device=device, **extra,
    )
    return answer


def _check_module(candidate, state, query, key=None, value=None, mask=None, bias=True):
    result = _run_module(candidate, state, query, key, value, mask, bias).value
    args = (state, query, key, value, mask)
    expect_close(result["output"], attend(*args), MODULE_MISTAKES, args)


@step("MultiHeadAttention", points=2)
def test_module_structure(candidate, rng):
    children = _run_module(candidate, _state(rng), randn(rng, B, TQ, D)).value["children"]
    for name in ("w_q", "w_k", "w_v", "w_o"):
        if children.get(name) != LINEAR:
            raise CheckFailed(f"expected {name} to be an nn.Linear(embed_dim, embed_dim), got {children.get(name, 'nothing')}")


@step("MultiHeadAttention", points=2)
@FLOATS
def test_module_self_attention(candidate, rng, dtype):
    _check_module(candidate, _state(rng, dtype=dtype), randn(rng, B, TQ, D, dtype=dtype))


@step("MultiHeadAttention", points=2)
def test_module_cross_attention(candidate, rng):
    query, key, value = randn(rng, B, TQ, D), randn(rng, B, TK, D), randn(rng, B, TK, D)
    _check_module(candidate, _state(rng), query, key, value)


@step("MultiHeadAttention", points=1)
def test_module_value_defaults_to_key(candidate, rng):
    _check_module(candidate, _state(rng), randn(rng, B, TQ, D), randn(rng, B, TK, D))


@step("MultiHeadAttention", points=2)
def test_module_masks(candidate, rng):
    query, key = randn(rng, B, TQ, D), randn(rng, B, TK, D)
    state = _state(rng)
    _check_module(candidate, state, query, key, mask=_mask(rng, B, 1, TQ, TK))
    _check_module(candidate, state, query, key, mask=_mask(rng, TQ, TK))


@step("MultiHeadAttention", points=2)
def test_module_without_bias(candidate, rng):
    _check_module(candidate, _state(rng, bias=False), randn(rng, B, TQ, D), bias=False)


@step("MultiHeadAttention", points=3)
def test_module_gradients(candidate, rng):
    state = _state(rng)
    query, key, value = randn(rng, B, TQ, D), randn(rng, B, TK, D), randn(rng, B, TK, D)
    mask, grad_output = _mask(rng, B, 1, TQ, TK), randn(rng, B, TQ, D)
    result = candidate.module(
        "MultiHeadAttention", init=(D, H), state=state, args=(query, key, value), kwargs={"mask": mask},
        grad_output=grad_output, grad_args=(0, 1, 2),
    ).value
    expect_close(result["output"], attend(state, query, key, value, mask))
    inputs = [x.detach().requires_grad_(True) for x in (query, key, value)]
    params = {k: v.detach().requires_grad_(True) for k, v in state.items()}
    (attend(params, *inputs, mask=mask) * grad_output).sum().backward()  # = backward(grad_output), cheaper
    for name, x, got in zip(("query", "key", "value"), inputs, result["arg_grads"]):
        _expect_gradient(got, x.grad, f"the gradient of {name}")
    for name, p in params.items():
        _expect_gradient(result["param_grads"].get(name), p.grad, f"the gradient of {name}")


def _expect_gradient(got, expected, what):
    try:
        expect_close(got, expected)
    except CheckFailed as failure:
        raise CheckFailed(f"{what}: {failure.message}") from None


@step("MultiHeadAttention", points=2)
def test_module_rules(candidate, rng, forbidden):
    state, query, key, mask = _state(rng), randn(rng, B, TQ, D), randn(rng, B, TK, D), _mask(rng, TQ, TK)
    answer = _run_module(candidate, state, query, key, mask=mask)
    expect_allowed(answer, forbidden)
    args = (state, query, key, None, mask)
    expect_close(answer.value["output"], attend(*args), MODULE_MISTAKES, args)  # no points for a rule kept by garbage


@step("MultiHeadAttention", points=2)
def test_module_device(candidate, rng, device):
    state, query, key = _state(rng), randn(rng, B, TQ, D), randn(rng, B, TK, D)
    mask = _mask(rng, TQ, TK)
    try:
        output = _run_module(candidate, state, query, key, mask=mask, device=device).value["output"]
    except CandidateError as error:
        skip_if_meta_unsupported(device, error)
        raise
    args = (state, query, key, None, mask)
    expect_on_device(output, attend(*args), device, args, MODULE_MISTAKES)
