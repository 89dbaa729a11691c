"""The checks of `mha_numpy`: mha's steps, with NumPy arrays in and out.

The steps are mha's (grader/course/mha/spec.py): the same inputs, references and mistakes,
run with the NumPy backend (the grader hands over arrays and compares the arrays that
come back with the torch reference's answer). What differs is said here: the checks (no
device checks, no non-contiguous inputs: arrays reach the worker C-contiguous, and no
bfloat16), the wording of mistakes that name a torch call, and `multi_head_attention`, a
function of the weights where mha has a module. Rules, in every step: the file imports no
torch, and the call runs no torch function.
"""

from dataclasses import replace

import numpy as np
import torch

from grader.course.mha import spec as mha
from grader.engine import (
    Call,
    Mistake,
    Spec,
    StepSpec,
    end_to_end,
    expect_no_import,
    no_torch,
    numpy_only,
    prop,
    rules,
    shape,
    values,
)

FLOATS = (np.float32, np.float64)
B, H, TQ, TK, D = mha.B, mha.H, mha.TQ, mha.TK, mha.D

NUMPY_WORDING = {
    "split_heads.no_transpose": "the head axis must come before the token axis: np.swapaxes(x, 1, 2) after the "
                                "reshape to (B, T, H, Dh)",
    "split_heads.view_no_transpose": "heads split with a reshape straight to (B, H, T, Dh): reshape to "
                                     "(B, T, H, Dh), then np.swapaxes(x, 1, 2)",
    "attention_scores.fixed_axes": "swapped axes 1 and 2 of k: use np.swapaxes(k, -1, -2)",
    "apply_mask.additive_too_small": "blocked scores are not low enough: use -np.inf (or np.finfo(dtype).min), not a "
                                     "small offset",
    "apply_mask.inverted": "mask convention inverted (True must mean attend): block where the mask is False "
                           "(np.where(mask, scores, -np.inf))",
    "softmax.ignored_dim": "softmax over the last axis whatever axis says: normalize along axis",
    "softmax.whole_tensor": "normalized over the whole array: sum along axis with keepdims=True",
    "softmax.no_keepdim": "the sum lost its axis (no keepdims=True) and broadcast against the wrong axis: pass "
                          "keepdims=True",
    "softmax.max_over_last_axis": "the max was taken over the last axis, not along axis: the shift must be constant "
                                  "along axis",
    "merge_heads.no_transpose": "merged heads without moving the head axis back: np.swapaxes(x, 1, 2) before the "
                                "reshape",
    "merge_heads.flattened_tokens": "the reshape merged the tokens too: reshape to (B, T, H * Dh)",
    "MultiHeadAttention.softmax_query_axis": "softmax over the query axis: normalize over keys, axis=-1",
}
NUMPY_MISTAKES = {
    "merge_heads": (
        Mistake("merge_heads.full_transpose", "x.T reversed every axis: np.swapaxes(x, 1, 2) swaps just the head and "
                "token axes", lambda x: x.permute(3, 2, 1, 0).reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])),
    ),
}


TORCH_ONLY = {"softmax.max_namedtuple", "apply_mask.bool_arithmetic"}  # NumPy has no such trap


def numpy_step(step: StepSpec, *checks) -> StepSpec:
    """An mha step with NumPy checks and NumPy wording."""
    mistakes = tuple(replace(m, message=NUMPY_WORDING.get(m.id, m.message)) for m in step.mistakes
                     if m.id not in TORCH_ONLY)
    return replace(step, checks=checks, mistakes=mistakes + NUMPY_MISTAKES.get(step.id, ()))


STEPS = (
    numpy_step(mha.PROJECT, shape(), values("values", 2, FLOATS), values("without_bias", 1, bias=False),
               values("square_weight", 1, d_in=5, d_out=5), values("extra_leading_dims", 1, lead=(2, 3, 4)), rules(2)),
    numpy_step(mha.SPLIT, shape(), values("values", 2, FLOATS), mha.SPLIT.checks[3], values("single_head", 1, heads=1),
               rules(2)),
    numpy_step(mha.SCORES, shape(), values("values", 2, FLOATS), values("square", 1, tq=6, tk=6),
               values("any_leading_dims", 1, lead=(B,)), rules()),
    numpy_step(mha.SCALE, shape(), values("values", 2, FLOATS), values("irrational_root", 1, (np.float64,), head_dim=8),
               values("any_shape", 1, lead=(B, TQ, TK)), rules()),
    numpy_step(mha.MASK, shape(), values("values", 2, FLOATS), values("broadcast_causal", 1, mask="causal"),
               values("broadcast_padding", 1, mask="padding"), values("none", 1, mask="none"),
               values("large_scores", 1, scale=5e3), values("float16", 1, (np.float16,)), rules(2)),
    numpy_step(mha.SOFTMAX, shape(), values("values", 2, FLOATS), values("axis_0", 1, lead=(4, 5, 6), dim=0),
               values("axis_minus_2", 1, dim=-2), values("large_logits", 2, lead=(B, TQ, TK), scale=1e4),
               values("all_masked_rows", 2, lead=(B, TQ, TK), scale=1.0, blocked=True),
               values("square_matrix", 1, lead=(6, 6)), rules(2)),
    numpy_step(mha.WEIGHTED, shape(), values("values", 1, FLOATS), values("square", 1, tq=TK),
               values("any_leading_dims", 1, lead=(3,)), values("dropped_weights", 2, dropped=True), rules()),
    numpy_step(mha.MERGE, shape(), values("values", 2, FLOATS), mha.MERGE.checks[3],
               values("single_head", 1, heads=1, width=D), rules(2)),
)

# -- multi_head_attention -----------------------------------------------------------------

WEIGHTS = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")  # the candidate's argument order


def _state(args) -> dict:
    """The weights among a call's arguments, as mha.attend takes them."""
    named = dict(zip(WEIGHTS, args[3:11], strict=True))
    return {f"w_{n[-1]}.{'weight' if n[0] == 'w' else 'bias'}": named[n] for n in WEIGHTS if named[n] is not None}


def multi_head_attention(query, key, value, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, num_heads, mask=None, **wrong):
    """The reference, from mha's: the weights as arguments instead of a module's layers (each named, as in the
    contract, so the search can swap or copy them: b_k for b_q)."""
    args = (query, key, value, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, num_heads)
    return mha.attend(_state(args), query, key, value, mask, heads=num_heads, **wrong)


def function_inputs(gen, dtype, tk=TK, mask=None, bias=True, heads=H, self_attention=False, causal=False):
    weights = []
    for _ in "qkvo":
        weights += [gen.randn(D, D, dtype=dtype, scale=D**-0.5), gen.randn(D, dtype=dtype, scale=0.1) if bias else None]
    query = gen.randn(B, TQ, D, dtype=dtype)
    if self_attention:
        key = value = query
    else:
        key, value = gen.randn(B, tk, D, dtype=dtype), gen.randn(B, tk, D, dtype=dtype)
    kwargs = {}
    if mask is not None:
        m = gen.mask(*{"batch": (B, 1, TQ, tk), "plain": (TQ, tk)}[mask])
        m[..., 1] = False  # the mask and its inverse block no row entirely (such rows are graded in softmax)
        kwargs["mask"] = m
    if causal:
        kwargs["mask"] = np.tril(np.ones((TQ, TQ), dtype=bool))  # (T, T): token i sees tokens 0..i
    return Call((query, key, value, *weights, heads), kwargs, ("query", "key", "value", *WEIGHTS, "num_heads"))


def _as_function(mistake: Mistake) -> Mistake:
    """A mistake of mha's module, for the function: its weights come as arguments."""
    def variant(*args, mask=None):
        return mistake.variant(_state(args), *args[:3], mask, heads=args[11])

    def test(out, *args, mask=None):
        return mistake.test(out, _state(args), *args[:3], mask, heads=args[11])

    found = {"variant": variant} if mistake.variant else {"test": test} if mistake.test else {}
    return Mistake(mistake.id.replace("MultiHeadAttention", "multi_head_attention"),
                   NUMPY_WORDING.get(mistake.id, mistake.message), raises=mistake.raises, why=mistake.why, **found)


FUNCTION = StepSpec(
    "multi_head_attention", function_inputs, multi_head_attention, prefix="mha", answered=mha.MODULE.answered,
    checks=(
        shape(2, self_attention=True), values("self_attention", 2, FLOATS, self_attention=True),
        values("cross_attention", 2),
        values("mask_per_batch", 1, mask="batch"), values("mask_plain", 1, mask="plain"),
        values("causal_self_attention", 2, (np.float64,), self_attention=True, causal=True),
        values("without_bias", 2, bias=False),
        values("one_head", 1, heads=1), values("six_heads", 1, heads=6),  # head_dim 12, 2
        rules(2, mask="plain"), prop("end_to_end", 2, end_to_end(mask="batch"), end_to_end=True),
    ),
    # a function has no __init__ to check, and is always given its value
    mistakes=tuple(_as_function(m) for m in mha.MODULE_MISTAKES
                   if (m.variant or m.test) and m.id != "MultiHeadAttention.value_defaults_to_query"),
)

def numpy_rules(answer, source: str, step: str) -> None:
    """No torch in the file or the call, and no scipy in softmax (scipy.special.softmax is the one-line shortcut)."""
    numpy_only(answer, source, step, tuple(s.id for s in (*STEPS, FUNCTION)))
    if step == "softmax":
        expect_no_import(source, "scipy")


SPEC = Spec((*STEPS, FUNCTION), backend="numpy", rules=numpy_rules, calls=no_torch, contract="solutions.mha_numpy")
assert torch  # the reference runs in torch; only the candidate's side is NumPy
