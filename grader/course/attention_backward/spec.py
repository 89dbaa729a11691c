"""The checks of `attention_backward`: the softmax's backward, attention's, FlashAttention's tiled one, and an
autograd.Function that joins a tiled forward to it.

softmax_backward is checked on real softmax outputs (batch and heads, Tq ≠ Tk), along another axis
than the last, and with masked entries and rows masked entirely (0, never NaN). attention_backward
is checked against torch's autograd through plain attention (run here, in the grader's process; the
named mistakes turn the gradients written out in grads.py): with Tq ≠ Tk, D ≠ Dv and heads, a padding mask, a
bottom-right causal mask, rows masked entirely (zero gradients) and Tq = Tk, where a product
transposed the wrong way runs and is wrong. Its softmax_backward is answered by the grader once that
step has lost points.

flash_attention_backward gets the forward's out and lse, computed here exactly, and is checked
against the same gradients, computed whole from that lse and D = rowsum(dO ∘ O): block sizes that do
not divide Tq and Tk, square tiles (where lse or D not unsqueezed runs and is wrong), causal with
Tq < Tk and Tq > Tk (rows with no key: zero gradients), and for what it materialises (`tiles_only`,
the worker's record of the shapes its torch calls create, as in flash_attention).

FlashAttentionFunction is run through the file's given flash_attention_and_grads (the worker runs
functions and nn.Modules, and an autograd.Function is neither): out, and dq, dk and dv as autograd
computes them through the Function's backward, against plain attention and torch's autograd through it, in
float32 and in float64 at float64's tolerance (what torch.autograd.gradcheck asks). Its
flash_attention_backward is answered by the grader once that step has lost points. The worker's
record sees the Function's forward and its backward (it runs .backward() with the record on), so its
rules and tiles_only see both.

No gradient step may use autograd: the `forbidden` lists of exercise.toml name `.backward()`, an autograd
graph built (the worker records one as `autograd_graph`; FlashAttentionFunction, run through .backward(),
forbids autograd inside that backward pass, `autograd_in_backward`) and the forward-mode duals, and
`no_autograd` (this spec's rule for every call) the exact name `grad`, which
torch.autograd.grad and every torch.func transform record (a forbidden name matches as a part of a
name, and `grad` is a part of `_set_grad_enabled`, which torch.no_grad() records).
"""

import ast
import functools
import inspect
import math
import re
import textwrap

import torch

from grader.engine import (
    CODE_IN_BACKWARD,
    FUNCTION_NODES,
    GRAPH,
    NODE_KIND,
    TILE_POSITIONS,
    Call,
    CandidateError,
    CheckFailed,
    Mistake,
    Probe,
    Raises,
    Spec,
    StepSpec,
    TileSizes,
    Tolerance,
    attention,
    check_calls,
    check_rules,
    device,
    diagnose,
    expect_close,
    judge_tiles,
    parse,
    prop,
    rules,
    shape,
    source_of,
    values,
)
from solutions import attention_backward as ref

from . import grads
from .grads import INF, causal_mask
from .memory import block_sizes, tiles_only_check
from .state import kept_outside_ctx

FLOATS = (torch.float32, torch.float64)
B, H = 2, 3  # batch and heads
GRADIENT_STEPS = ("softmax_backward", "attention_backward", "flash_attention_backward", "FlashAttentionFunction")


def _has_nan(value, *args, **kwargs):
    parts = value if isinstance(value, (tuple, list)) else (value,)
    return any(isinstance(p, torch.Tensor) and p.is_floating_point() and bool(torch.isnan(p).any()) for p in parts)


def _nan_in_keyless_rows(value, q, k, v, out, lse, *args, **kwargs):
    """NaN in dq, and only in rows with no key to see (lse = -inf)."""
    grad_q = value[0] if isinstance(value, (tuple, list)) and value else None
    if not isinstance(grad_q, torch.Tensor) or grad_q.shape != q.shape or not grad_q.is_floating_point():
        return _has_nan(value)
    nan = torch.isnan(grad_q).any(-1)
    return bool(nan.any()) and bool((nan <= (lse == -INF)).all())


def no_autograd(answer, step):
    """The rule beside exercise.toml's, in every call: no call named exactly `grad` (torch.autograd.grad,
    torch.func.grad, vjp, jacrev, torch.autograd.functional), which a forbidden list could not name without
    torch.no_grad()."""
    if step in GRADIENT_STEPS and "grad" in answer.called:
        raise CheckFailed("called torch.autograd.grad (or a torch.func transform, which calls it): write the "
                          "gradients by hand", diagnose.FORBIDDEN_CALL, details={"forbidden_calls": ["grad"]},
                          breach=True)


def _scaled_by_value_width(q, k, v, grad_out, mask=None):
    """Attention's gradients with 1/√Dv for 1/√D: in the scores too (the right ones of q·√(D / Dv), chained back to
    q), or in dq and dk only, the recomputed P right (blind set 52's b04)."""
    c = math.sqrt(q.shape[-1] / v.shape[-1])
    dq, dk, dv = grads.plain(q * c, k, v, grad_out, mask)
    return [(dq * c, dk, dv), grads.plain(q, k, v, grad_out, mask, ds_scale="v")]


def _scaled_by_a_length(q, k, v, grad_out, mask=None):
    """Attention's gradients with the scores scaled by 1/√Tk or 1/√Tq, a length read for the width (k.size(-2))."""
    found = []
    for length in (k.shape[-2], q.shape[-2]):
        c = math.sqrt(q.shape[-1] / length)
        dq, dk, dv = grads.plain(q * c, k, v, grad_out, mask)
        found.append((dq * c, dk, dv))
    return found


def _forward_scale_wrong(q, k, v, grad_out, mask=None):
    """The recomputed scores multiplied by √D, unscaled or divided by D (a scale of D ** -0.5 divided by, left out,
    or applied twice), the gradients' own 1/√D right: the right ones of q·c for the probabilities, dk taken from q."""
    found = []
    for c in (q.shape[-1], q.shape[-1] ** 0.5, q.shape[-1] ** -0.5):
        dq, dk, dv = grads.plain(q * c, k, v, grad_out, mask)
        found.append((dq, dk / c, dv))
    return found


def _one_side(variant, side: str):
    """One gradient's 1/√D wrong, the other right: missing (unscaled) or twice (1/D, a pre-scaled q or k reused)."""
    return lambda *a, **k: [variant(**{f"{side}_scale": wrong})(*a, **k) for wrong in ("none", "d")]


def _reordered(reference):
    """The right gradients in every other order than (dq, dk, dv): dk and dv swapped, and the rest."""
    orders = ((0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))
    return lambda *a, **k: [tuple(right[i] for i in order) for right in [reference(*a, **k)] for order in orders]


# dq = dS q or dk = dSᵀ k: a shape error raised on a line that multiplies dS by q or k
OPERAND_LINE = r"(?i)(grad_?s|\bd_?s\b|\bds_?\w*|grad_scores)\w*.*@\s*(q|k)\w*\b"
# dP = dO kᵀ for dO vᵀ: a copy of the scores' line; D ≠ Dv in every check, so it does not run
DP_FROM_KEYS = Raises(message=r"size|shape|match|multiplied",
                      line=r"(?i)(grad|\bd_?o|dout|\bg\b).*\bk\w*\s*\.\s*(transpose|T\b|mT\b|permute|swapaxes)")


# -- softmax_backward -----------------------------------------------------------------------

SB_SHAPE = (B, H, 5, 7)


def softmax_inputs(gen, dtype, dim=-1, masked=False, shape=SB_SHAPE):
    """probs = softmax(scores, dim) of random scores (masked: some entries -inf, and whole slices along dim), and a
    random grad_probs."""
    scores = gen.randn(*shape, dtype=torch.float64, scale=2.0)
    if masked:
        scores = scores.masked_fill(~torch.as_tensor(gen.mask(*SB_SHAPE)), -INF)
        index = [slice(None)] * 4
        index[3 if dim in (-1, 3) else dim - 1] = 1  # one slice across the axis: every slice along dim loses an entry
        scores[tuple(index)] = -INF
        scores[0, 1, 2, :] = -INF  # a row with no key
    probs = torch.softmax(scores, dim).nan_to_num(0.0)
    grad_probs = gen.randn(*shape, dtype=torch.float64)
    kwargs = {} if dim == -1 else {"dim": dim}
    return Call((probs.to(dtype), grad_probs.to(dtype)), kwargs, ("probs", "grad_probs"))


def _real_rows_zeroed(value, probs, grad_probs, dim=-1):
    """The answer is the reference's on some slices along dim and 0 on others, among them slices whose
    probabilities are not all 0: a test for 'a real distribution' (Σ probs == 1, exactly) that rounding fails."""
    value, probs, grad_probs = (torch.as_tensor(x).double() for x in (value, probs, grad_probs))
    if value.shape != probs.shape:
        return False
    right = probs * (grad_probs - (probs * grad_probs).sum(dim, keepdim=True))
    zero, kept = (value == 0).all(dim, keepdim=True), torch.isclose(value, right, rtol=1e-4, atol=1e-6).all(
        dim, keepdim=True)
    real = (probs != 0).any(dim, keepdim=True) & ~torch.isclose(right, torch.zeros_like(right)).all(dim, keepdim=True)
    return bool((zero | kept).all() and (zero & real).any())


def _row_sum_off(value, probs, grad_probs, dim=-1):
    """probs ∘ (grad_probs - s) with s one number per slice along dim, not Σ probs ∘ grad_probs (a term counted twice
    or left out, a sum over part of the slice): what the answer implies for s, where probs is not 0, is constant along
    dim and is not the sum."""
    value, probs, grad_probs = (torch.as_tensor(x).double() for x in (value, probs, grad_probs))
    if value.shape != probs.shape:
        return False
    seen = probs > 1e-3
    implied = torch.where(seen, grad_probs - value / probs.clamp_min(1e-3), torch.nan)
    low, high = implied.nan_to_num(torch.inf).amin(dim, keepdim=True), implied.nan_to_num(-torch.inf).amax(dim,
                                                                                                           keepdim=True)
    rows = seen.any(dim, keepdim=True)
    spread = ((high - low)[rows]).abs().max() if rows.any() else torch.tensor(torch.inf)
    right = (probs * grad_probs).sum(dim, keepdim=True)
    off = ((low - right)[rows]).abs().max() if rows.any() else torch.tensor(0.0)
    return bool(spread < 1e-6 * (1 + right.abs().max()) and off > 1e-3 * (1 + right.abs().max()))


def _last_axis_whatever_dim(probs, grad_probs, dim=-1):
    """dim_ignored's answer. At dim=0 it is `dim or -1`'s as well, which the first_dim check's situation names (0 is
    falsy): there it explains nothing."""
    if dim == 0:
        raise ValueError("at dim=0, summing along the last axis is dim_zero_mishandled's answer")
    return grads.softmax_backward(probs, grad_probs, -1)


def _sb_variant(**wrong):
    return lambda probs, grad_probs, dim=-1: grads.softmax_backward(probs, grad_probs, dim, **wrong)


# What a check's failure says when the plain case passed and no listed mistake explains it (spec.Check.situation).
SB_ONE_ROW = Mistake("softmax_backward.one_row_mishandled", "right for several rows, wrong for one (B, H, 1, Tk): "
                    "keep every axis of size 1, summing with keepdim=True rather than squeezing")
SB_DIM = Mistake("softmax_backward.dim_ignored", "right along the last axis, wrong along dim=1: every sum and "
                 "broadcast runs along `dim`, (grad_probs * probs).sum(dim=dim, keepdim=True)")
SB_NEGATIVE = Mistake("softmax_backward.negative_dim_mishandled", "right for dim=-1 and dim=1, wrong for dim=-3: a "
                      "negative dim counts from the end; sum along it as given, or normalise it (dim % probs.dim())")
SB_FIRST = Mistake("softmax_backward.dim_zero_mishandled", "right along other axes, wrong for dim=0: 0 is falsy, so "
                   "`dim or -1` or `if dim:` passes it over; use dim as given, or test `dim is None`")
SB_ZEROS = Mistake("softmax_backward.zeros_mishandled", "right for dense probabilities, wrong where some are 0 "
                   "(masked entries, rows masked entirely): use products with probs only, never divide by it or "
                   "take its log")

SOFTMAX = StepSpec(
    "softmax_backward", softmax_inputs, ref.softmax_backward,
    checks=(
        shape(2), values("values", 3, FLOATS), values("other_dim", 2, situation=SB_DIM, dim=1),
        values("first_dim", 1, situation=SB_FIRST, dim=0),  # 0 is falsy: `dim or -1` reads it as the default
        values("one_row", 1, situation=SB_ONE_ROW, shape=(B, H, 1, 7)),  # a decode's: an axis of 1 between others
        values("negative_dim", 1, situation=SB_NEGATIVE, dim=-3),
        values("masked", 2, situation=SB_ZEROS, masked=True),
        values("noncontiguous", 1, strided=(0, 1)),  # probs and grad_probs as views: no layout assumed
        rules(2), device(2),
    ),
    mistakes=(
        Mistake("softmax_backward.no_row_sum", "returned probs ∘ grad_probs: subtract the row sum first, "
                "probs ∘ (grad_probs - Σ probs ∘ grad_probs)", _sb_variant(row_sum="none"),
                why="The Jacobian is diag(p) - p pᵀ; probs ∘ grad_probs is only its diagonal's part."),
        Mistake("softmax_backward.sign", "the row sum was added: subtract it, probs ∘ (grad_probs - Σ probs ∘ "
                "grad_probs)", _sb_variant(sign=1),
                why="The off-diagonal part of the Jacobian, -p pᵀ, gives -p (pᵀ g)."),
        Mistake("softmax_backward.sum_without_probs", "the row sum is Σ grad_probs: weigh it by the probabilities, "
                "Σ probs ∘ grad_probs", _sb_variant(row_sum="dp")),
        Mistake("softmax_backward.probs_outside_dropped", "returned grad_probs - Σ probs ∘ grad_probs: multiply by "
                "probs, probs ∘ (grad_probs - Σ probs ∘ grad_probs)", _sb_variant(outer_p=False)),
        Mistake("softmax_backward.sum_not_weighted", "returned probs ∘ grad_probs - Σ probs ∘ grad_probs: the row sum "
                "is weighted by probs too, probs ∘ (grad_probs - Σ probs ∘ grad_probs)",
                _sb_variant(probs_on_first=True),
                why="-p pᵀ g gives each entry p_i times the row's sum, not the sum alone."),
        Mistake("softmax_backward.probs_twice", "probs multiplied in twice, probs ∘ (probs ∘ grad_probs − Σ probs ∘ "
                "grad_probs): inside the parentheses it is grad_probs alone", _sb_variant(probs_twice=True)),
        Mistake("softmax_backward.diagonal_only", "returned probs ∘ (1 - probs) ∘ grad_probs, the Jacobian's diagonal "
                "alone: each probability depends on every score of its slice, probs ∘ (grad_probs - Σ probs ∘ "
                "grad_probs)", _sb_variant(diagonal_only=True),
                why="∂p_i/∂s_j = p_i (δ_ij - p_j): the off-diagonal terms -p_i p_j are what the row sum gathers."),
        Mistake("softmax_backward.log_softmax_gradient", "returned grad_probs - probs ∘ Σ grad_probs, the gradient "
                "through a log-softmax: through a softmax it is probs ∘ (grad_probs - Σ probs ∘ grad_probs)",
                _sb_variant(log_softmax=True),
                why="Cross-entropy's gradient flows through log p, whose Jacobian is I - 1 pᵀ; p's own is "
                    "diag(p) - p pᵀ."),
        Mistake("softmax_backward.row_mean", "the row's Σ probs ∘ grad_probs was averaged (mean along dim): it is a "
                "sum, probs ∘ (grad_probs - Σ probs ∘ grad_probs)", _sb_variant(row_sum="mean"),
                why="LayerNorm's backward subtracts means; the softmax's Jacobian, diag(p) - p pᵀ, sums."),
        Mistake("softmax_backward.sum_over_everything", "summed probs ∘ grad_probs over every axis: sum along dim "
                "only, with keepdim=True", _sb_variant(row_sum="all")),
        Mistake("softmax_backward.sum_over_queries", "summed probs ∘ grad_probs over the axis before dim (the "
                "queries): sum along dim, the axis the softmax normalised", _sb_variant(row_sum="queries")),
        Mistake("softmax_backward.dim_ignored", "summed along the last axis whatever dim says: sum along dim",
                _last_axis_whatever_dim),
        Mistake("softmax_backward.nan_rows", "a slice whose probabilities are all 0 (scores all -inf) gave NaN: "
                "it must give 0; divide by nothing, Σ probs is 1 elsewhere", test=_has_nan),
        Mistake("softmax_backward.real_rows_zeroed", "slices that are real distributions got 0: a test such as "
                "probs.sum(dim) == 1 fails by rounding; the formula gives 0 by itself where probs is all 0",
                test=_real_rows_zeroed),
        Mistake("softmax_backward.row_sum_off", "the answer is probs ∘ (grad_probs - s) with s not Σ probs ∘ "
                "grad_probs: a term counted twice or left out; sum every entry along dim once", test=_row_sum_off,
                why="A loop that starts its sum at the first term and then adds every term counts the first twice."),
    ),
)

# -- attention_backward ---------------------------------------------------------------------

TQ, TK, D, DV = 6, 9, 8, 5  # Tq ≠ Tk, D ≠ Dv, none equal; D no square (a 1/isqrt(D) scale shows)
PEAK = 110.0  # the first query's scores this far above the others: their e^(s - the tensor's max) is 0 in float32


def attention_inputs(gen, dtype, t_q=TQ, t_k=TK, mask=None, lead=(B, H), peaked=False):
    """`lead`: the leading dims ((B, H) by default; the contract takes any). mask="blocked_high": the last three keys
    blocked for every query, and their scores PEAK above the seen ones', so a max taken before the mask underflows
    every seen key in float32. `peaked`: every key's first coordinate
    is 4 and only the first query has one, so that query's scores are all shifted by PEAK and no other's are (a
    shift changes no row's softmax), while one max for the whole tensor underflows every other row, and no max at
    all overflows the first. The first query's grad_out is small: in float32 its probabilities are only as exact as
    scores near PEAK (7.6e-6), and what any implementation loses there must stay inside the tolerance."""
    q, k = gen.randn(*lead, t_q, D, dtype=dtype), gen.randn(*lead, t_k, D, dtype=dtype)
    v, grad_out = gen.randn(*lead, t_k, DV, dtype=dtype), gen.randn(*lead, t_q, DV, dtype=dtype)
    if peaked:
        k[..., 0] = 4.0
        q[..., 0] = 0.0
        q[..., 0, 0] = PEAK * D**0.5 / 4.0
        grad_out[..., 0, :] *= 1e-3
    kwargs = {}
    if mask == "padding":
        kwargs["mask"] = torch.as_tensor(gen.mask(B, 1, t_q, t_k))
    elif mask == "causal":
        kwargs["mask"] = causal_mask(t_q, t_k)
    elif mask == "blocked_high":
        q[..., 0], k[..., 0] = PEAK * D**0.5 / 4.0, 0.0
        k[..., -3:, 0] = 4.0
        seen = torch.ones(B, 1, t_q, t_k, dtype=torch.bool)
        seen[..., -3:] = False
        kwargs["mask"] = seen
    elif mask == "rows":  # rows 1 of every batch and 3 of the first blocked entirely
        blocked = torch.as_tensor(gen.mask(B, 1, t_q, t_k)).clone()
        blocked[:, :, 1, :] = False
        blocked[0, :, 3, :] = False
        kwargs["mask"] = blocked
    return Call((q, k, v, grad_out), kwargs, ("q", "k", "v", "grad_out"))


def autograd(q, k, v, grad_out, mask=None):
    """(out, dq, dk, dv): plain attention (attention.attend: a row with no key has zero weights) and torch's autograd
    through it, here in the grader's process. grads.plain, which the named mistakes turn, equals it
    (tests/exercises/attention_backward/test_oracle.py)."""
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        out = attention.attend(*leaves, mask)
        # through the scalar <out, grad_out>: the same gradients, and no grad_outputs, whose shape check imports
        # torch.fx's symbolic shapes (0.6 s of a cold grade)
        return (out.detach(), *torch.autograd.grad((out * grad_out).sum(), leaves))


def attention_reference(q, k, v, grad_out, mask=None):
    """torch's autograd through plain attention, with its mask."""
    return autograd(q, k, v, grad_out, mask)[1:]


def _causal_when_unmasked(q, k, v, grad_out, mask=None):
    """The gradients with a bottom-right causal mask where no mask was given (none for a mask given)."""
    if mask is not None:
        raise ValueError("a mask was given: this mistake is of calls without one")
    return grads.plain(q, k, v, grad_out, causal_mask(q.shape[-2], k.shape[-2]))


def _att_variant(**wrong):
    return lambda q, k, v, grad_out, mask=None: grads.plain(q, k, v, grad_out, mask, **wrong)


AB_MASK = Mistake("attention_backward.mask_mishandled", "right without a mask, wrong with one: fill blocked scores "
                  "with -inf before the softmax (masked_fill(~mask, -inf)); True means the key is seen, and the mask "
                  "broadcasts")
AB_ROWS = Mistake("attention_backward.masked_rows_mishandled", "wrong for rows the mask blocks entirely: their "
                  "probabilities are 0, so their dq is 0 and they add nothing to dk and dv")
AB_PEAKED = Mistake("attention_backward.large_scores_mishandled", "right for ordinary scores, wrong when one row's "
                    "scores are far above the others': subtract each row's own max before exp, amax(-1, keepdim=True) "
                    "(torch.softmax does)")
AB_BLOCKED_HIGH = Mistake("attention_backward.blocked_scores_high", "right for ordinary scores, wrong when blocked "
                          "keys score far above the seen ones: fill blocked scores with -inf first, then take each "
                          "row's max")
AB_SQUARE = Mistake("attention_backward.square_mishandled", "right for Tq ≠ Tk, wrong for Tq = Tk: a product "
                    "transposed the wrong way runs only when square; check dq (Tq, D), dk (Tk, D), dv (Tk, Dv)")

def largest(call: Call) -> int:
    """The most elements a gradient step's tensor may hold: twice a score matrix as wide as the widest head for every
    batch and head (a broadcast product, q[..., :, None, :] * k[..., None, :, :], is that large), or twice the largest
    input, each with the lengths padded to whole blocks where the call has blocks (blind set 50's c04 padded its
    inputs to blocks of 64 and held one more). A gradient differentiated numerically, every direction at once, holds
    one answer per input element."""
    q, k, v = call.args[:3]
    lead, width = math.prod(q.shape[:-2]), max(q.shape[-1], v.shape[-1])
    tq, tk = (_padded(n, call.kwargs.get(block)) for n, block in ((q.shape[-2], "block_q"), (k.shape[-2], "block_k")))
    grown = max(tq / q.shape[-2], tk / k.shape[-2])
    inputs = max(x.numel() for x in call.args if isinstance(x, torch.Tensor))
    return 2 * max(lead * tq * tk * width, math.ceil(inputs * grown))


def _padded(length: int, block) -> int:
    return -(-length // block) * block if isinstance(block, int) and block > 0 else length


ATTENTION = StepSpec(
    "attention_backward", attention_inputs, attention_reference, outputs=("dq", "dk", "dv"),
    answered=("softmax_backward",), largest=largest,
    checks=(
        shape(2), values("values", 3, FLOATS), values("padding_mask", 3, situation=AB_MASK, mask="padding"),
        values("causal", 3, situation=AB_MASK, mask="causal"),
        values("fully_masked_rows", 3, situation=AB_ROWS, mask="rows"),
        # a max taken before the mask: the blocked scores' e^(s - max) is all there is, and the seen ones underflow
        values("blocked_scores_high", 2, (torch.float32,), situation=AB_BLOCKED_HIGH, mask="blocked_high"),
        values("square", 3, situation=AB_SQUARE, t_q=TK, mask="causal"),
        values("large_scores", 2, (torch.float32,), situation=AB_PEAKED, peaked=True), rules(2, mask="padding"),
        values("three_dims", 1, lead=(B * H,)),
        # heads split from (B, T, H, D) by a transpose: views, no layout assumed
        values("noncontiguous", 1, strided=((0, 1, 2), (1, 1, 2), (2, 1, 2), (3, 1, 2))),
        device(2, mask="causal"),
    ),
    mistakes=(
        Mistake("attention_backward.causal_unasked", "with mask=None a causal mask was applied: no mask means every "
                "key is seen; mask only what a given mask blocks", _causal_when_unmasked,
                why="A backward written for a decoder masks the future by habit; this contract gives the mask."),
        Mistake("attention_backward.nan_rows", "a row the mask blocks entirely gave NaN: its probabilities are 0, so "
                "its gradients are 0 (softmax(...).nan_to_num(0), or torch.where)", test=_has_nan,
                why="The softmax of a row of -inf is 0 / 0."),
        Mistake("attention_backward.dv_not_transposed", "dv = P @ dO: transpose P, dv = Pᵀ @ dO, (Tk, Tq) @ (Tq, Dv)",
                _att_variant(dv_transposed=False),
                why="out = P v sums over the keys, so v's gradient sums over the queries. With Tq ≠ Tk the product "
                    "does not even run."),
        Mistake("attention_backward.dk_not_transposed", "dk = dS @ q: transpose dS, dk = dSᵀ @ q / √D, "
                "(Tk, Tq) @ (Tq, D)", _att_variant(dk_transposed=False)),
        Mistake("attention_backward.unscaled", "dS was not multiplied by 1/√D for dq and dk: the scores are "
                "q kᵀ / √D, so dq = dS k / √D, dk = dSᵀ q / √D", _att_variant(ds_scale="none")),
        Mistake("attention_backward.scaled_by_d", "dS was scaled by 1/D (1/√D twice): scale it once, dq = dS k / √D "
                "and dk = dSᵀ q / √D", _att_variant(ds_scale="d")),
        Mistake("attention_backward.scaled_by_value_width", "scaled by 1/√Dv, the values' width: the scores are "
                "q kᵀ / √D, D the width of the queries and keys", _scaled_by_value_width,
                why="D = Dv in most models, so v.shape[-1] passes for the head width until they differ."),
        Mistake("attention_backward.scaled_by_a_length", "scaled by 1/√Tk or 1/√Tq, a sequence length: the scores "
                "are q kᵀ / √D, D = q.shape[-1], the head width", _scaled_by_a_length,
                why="k.size(-2) is the number of keys; the width is the last axis."),
        Mistake("attention_backward.forward_scale_wrong", "the recomputed scores were multiplied by √D, unscaled or "
                "divided by D: recompute P exactly as the forward, softmax(q kᵀ / √D)", _forward_scale_wrong,
                why="The backward's 1/√D can be right while the recomputed forward is not: every gradient then "
                    "follows probabilities of the wrong sharpness."),
        Mistake("attention_backward.dq_scale_wrong", "dq's 1/√D is missing or applied twice while dk's is right: dq = "
                "dS k / √D, once (a pre-scaled k reused in dq scales it again)", _one_side(_att_variant, "dq"),
                why="dq and dk both take the scores' single 1/√D; a factor kept on a pre-scaled q or k counts twice."),
        Mistake("attention_backward.dk_scale_wrong", "dk's 1/√D is missing or applied twice while dq's is right: dk = "
                "dSᵀ q / √D, once (a pre-scaled q reused in dk scales it again)", _one_side(_att_variant, "dk"),
                why="Pre-scaling q by 1/√D for the scores is fine, but then dk = dSᵀ q_scaled already holds it."),
        Mistake("attention_backward.dp_from_keys", "dP = dO kᵀ: the gradient of the weights comes through the values, "
                "dP = dO vᵀ, (Tq, Dv) @ (Dv, Tk)", raises=DP_FROM_KEYS,
                why="out = P v, so dP = dO vᵀ; with Dv ≠ D the copied line with k does not even run."),
        Mistake("attention_backward.heads_transposed_with_queries", "transpose(1, 2) swapped the heads and the "
                "queries of a (B, H, Tq, Tk) tensor: transpose its last two axes, P.transpose(-2, -1) (or P.mT)",
                raises=Raises(message=r"must match the size|size mismatch|cannot be multiplied|broadcast",
                              line=r"\.(transpose|swapaxes|swapdims)\(\s*1\s*,\s*2\s*\)"),
                why="Written for (B, Tq, Tk) tensors, transpose(1, 2) is the last two axes; with a head axis it is "
                    "not."),
        Mistake("attention_backward.operands_swapped", "dq took q or dk took k (a copied line): dq = dS k / √D "
                "and dk = dSᵀ q / √D, each through the other side's inputs",
                lambda *a, **k: [_att_variant(operands_swapped=which)(*a, **k) for which in ("q", "k", "qk")],
                raises=Raises(message=r"size|shape|match|multiplied", line=OPERAND_LINE),
                why="A query's gradient goes through the keys it scored against, and a key's through the queries; "
                    "with Tq ≠ Tk the swapped product does not run, with Tq = Tk it runs and is wrong."),
        Mistake("attention_backward.gradient_order", "returned the gradients in another order: return (dq, dk, dv), "
                "the order of the inputs q, k, v", _reordered(attention_reference),
                why="Callers unpack by position: dk and dv swapped run whenever the shapes agree."),
        Mistake("attention_backward.mask_inverted", "the mask was applied inverted (-inf where it is True): True means "
                "may attend, so fill where it is False, masked_fill(~mask, -inf)", _att_variant(invert_mask=True)),
        Mistake("attention_backward.dv_scaled", "dv was divided by √D: the scale is inside the scores, not the "
                "values; dv = Pᵀ dO", _att_variant(scale_dv=True)),
        Mistake("attention_backward.mask_added", "the bool mask was added to the scores (+1 where allowed, +0 where "
                "blocked): fill the blocked scores with -inf, masked_fill(~mask, -inf)", _att_variant(mask_added=True),
                why="A bool mask says which keys may be seen; adding it shifts scores by 1 and blocks nothing."),
        Mistake("attention_backward.max_before_mask", "each row's max was taken before the mask, over blocked keys "
                "too: where they score far higher, every seen key underflows to 0; mask first, then subtract the max",
                _att_variant(shift="before_mask"),
                why="Any shift leaves a softmax unchanged in exact arithmetic; in float32, e^(s - max) is 0 for every "
                    "s more than 104 below the max, and a blocked key's score can be that far above."),
        Mistake("attention_backward.mask_after_softmax", "the blocked probabilities were zeroed after the softmax, "
                "so each row sums to less than 1: fill the blocked scores with -inf before it",
                _att_variant(mask_after_softmax=True),
                why="Zeroing after the softmax leaves the blocked keys' share in every other key's denominator."),
        Mistake("attention_backward.mask_ignored", "the recomputed scores were not masked: mask them as the forward "
                "did, -inf where the mask is False", _att_variant(use_mask=False),
                why="Recomputing P must give the forward's P exactly, blocked keys at 0."),
        Mistake("attention_backward.finite_fill", "masked scores filled with a finite value (-1e9): fill with -inf "
                "and give rows with no key zero gradients", _att_variant(fill=-1e9),
                why="A row blocked entirely then spreads its weight evenly over every key."),
        Mistake("attention_backward.softmax_over_queries", "the recomputed softmax normalised the query axis "
                "(dim=-2): each query's weights sum to 1 over the keys, dim=-1",
                lambda *a, **k: [_att_variant(softmax_dim=-2)(*a, **k),
                                 _att_variant(softmax_dim=-2, row_sum="queries")(*a, **k)]),
        Mistake("attention_backward.row_sum_over_queries", "dS subtracts Σ P ∘ dP over the queries (dim=-2): the "
                "softmax normalised each query's row, so sum over the keys, dim=-1", _att_variant(row_sum="queries")),
        Mistake("attention_backward.max_of_all_rows", "the softmax subtracted one max for the whole tensor, so rows "
                "far below it underflow to 0: subtract each row's own, scores.amax(-1, keepdim=True)",
                _att_variant(shift="all"),
                why="Any shift of a row leaves its softmax unchanged in exact arithmetic; in float32 e^-104 is 0."),
        Mistake("attention_backward.max_not_subtracted", "the softmax exponentiated the scores as they are, and "
                "e^110 overflows float32: subtract each row's max first, scores.amax(-1, keepdim=True)",
                _att_variant(shift="none")),
        Mistake("attention_backward.no_row_sum", "dS = P ∘ dP: subtract the row sum, dS = P ∘ (dP - Σ P ∘ dP), as "
                "softmax_backward does", _att_variant(row_sum="none")),
    ),
)

# -- flash_attention_backward ----------------------------------------------------------------

FTQ, FTK, FD, FDV, BQ, BK = 13, 22, 6, 5, 5, 8  # block sizes that divide neither length


def forward(q, k, v, causal):
    """(out, lse) of plain attention, in q's dtype, computed in float64."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    lse = torch.logsumexp(attention.scores(q64, k64, mask), -1)
    return attention.attend(q64, k64, v64, mask).to(q.dtype), lse.to(q.dtype)


def flash_inputs(gen, dtype, t_q=FTQ, t_k=FTK, causal=False, block_q=BQ, block_k=BK, d=FD, dv=FDV, lead=(B, H),
                 hidden_peak=False, peak=PEAK):
    """`hidden_peak` (causal): the last key's first coordinate is 4 and every query's but the last (the one that
    sees that key) is peak·√D/4, so each of them holds a hidden score of peak, where e^(S - lse) is inf in float32,
    and no visible score changes. Not causal, every query but the last sees that score."""
    q, k = gen.randn(*lead, t_q, d, dtype=dtype), gen.randn(*lead, t_k, d, dtype=dtype)
    v, grad_out = gen.randn(*lead, t_k, dv, dtype=dtype), gen.randn(*lead, t_q, dv, dtype=dtype)
    if hidden_peak:
        k[..., 0] = 0.0
        k[..., -1, 0] = 4.0
        q[..., :-1, 0] = peak * d**0.5 / 4.0
        q[..., -1, 0] = 0.0
    out, lse = forward(q, k, v, causal)
    return Call((q, k, v, out, lse, grad_out), {"causal": causal, "block_q": block_q, "block_k": block_k},
                ("q", "k", "v", "out", "lse", "grad_out"))


def flash_remake(call: Call, rng: torch.Generator) -> Call:
    """The call on other values (StepSpec.remake): q, k, v and grad_out drawn afresh, out and lse their forward's."""
    q, k, v, _, _, grad_out = call.args
    q, k, v, grad_out = (torch.randn(t.shape, generator=rng, dtype=torch.float64).to(t.dtype)
                         for t in (q, k, v, grad_out))
    out, lse = forward(q, k, v, call.kwargs.get("causal", False))
    return Call((q, k, v, out, lse, grad_out), call.kwargs, call.names)


def flash_reference(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    """The gradients computed whole from the given lse and D = rowsum(dO ∘ O) (grads.plain), whatever the blocks:
    the model answer equals them (tests/exercises/attention_backward/test_oracle.py)."""
    mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    return grads.plain(q, k, v, grad_out, mask, out=out, lse=lse)


def _flash_variant(**wrong):
    return lambda q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32: grads.tiled(
        q, k, v, out, lse, grad_out, causal, block_q, block_k, **wrong)


FLASH_TILES = tiles_only_check("flash_attention_backward")
FB_CAUSAL = Mistake("flash_attention_backward.causal_mishandled", "right without causal, wrong with it: in every "
                    "tile mask key j > i + Tk - Tq (bottom-right), and skip only tiles wholly past that diagonal")
FB_NO_KEY = Mistake("flash_attention_backward.no_key_rows_mishandled", "wrong for rows with no key to see (causal, "
                    "Tq > Tk, lse = -inf): their P is 0, so dq is 0 and they add nothing to dk, dv")
FB_SQUARE = Mistake("flash_attention_backward.square_tiles_mishandled", "wrong with block_q = block_k: a tile's "
                    "bounds mix block_q with block_k, or lse and D lack their [..., None]; check each slice")
FB_LARGE = Mistake("flash_attention_backward.large_scores_mishandled", "right for ordinary scores, wrong for a "
                   "score of 800: take P = e^(S - lse), one exponential of a difference, never e^S / e^lse")
FB_BLOCKS = Mistake("flash_attention_backward.block_sizes_mishandled", "right with the default blocks, wrong with "
                    "others: walk queries by block_q and keys by block_k, and end each tile at min(start + block, T)")
FB_LEAD = Mistake("flash_attention_backward.leading_dims_mishandled", "right for (B, H, T, D), wrong for (B·H, T, D): "
                 "slice and index the last two axes with ..., so any leading dims pass")
FB_DECODE = Mistake("flash_attention_backward.one_query_mishandled", "wrong for one query (Tq = 1, causal): it sees "
                    "every key (its position is Tk - 1); check the causal offset and any squeeze of an axis of 1")
FB_ONE_TILE = Mistake("flash_attention_backward.tiles_mishandled", "right with one tile, wrong over several: slice q, "
                      "lse, D, dO by the query tile, k, v by the key tile, and add each tile's dk, dv in place")
FB_WIDTHS = Mistake("flash_attention_backward.widths_mishandled", "right when v is as wide as q, wrong otherwise: dv "
                    "and dO are Dv wide, dq and dk D wide; make each with its own width")
def call_tiles(call: Call) -> TileSizes:
    """The tiles a call of flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32,
    block_k=32) asks for."""
    given = {**dict(zip(("causal", "block_q", "block_k"), call.args[6:], strict=False)), **call.kwargs}
    return TileSizes.of(*call.args[:3], given.get("block_q", 32), given.get("block_k", 32))


FLASH = StepSpec(
    "flash_attention_backward", flash_inputs, flash_reference, outputs=("dq", "dk", "dv"), tiles=call_tiles,
    remake=flash_remake, largest=largest,
    probes=(Probe({"block_q": 64, "block_k": 64}, FB_ONE_TILE), Probe({"dv": FD}, FB_WIDTHS)),
    checks=(
        shape(2), values("values", 3, FLOATS), values("causal", 2, situation=FB_CAUSAL, causal=True),
        values("three_dims", 1, situation=FB_LEAD, lead=(B * H,), causal=True),
        values("large_hidden_scores", 1, (torch.float32,), causal=True, hidden_peak=True),
        # a visible score past e^S's range in float64 (in float32, a score of 110 in sight leaves too few digits for
        # the gradients' tolerance)
        values("large_scores", 1, (torch.float64,), situation=FB_LARGE, hidden_peak=True, peak=800.0),
        values("rows_with_no_key", 3, situation=FB_NO_KEY, t_q=FTK + 4, t_k=FTQ, causal=True),
        values("square_tiles", 3, situation=FB_SQUARE, t_q=12, t_k=18, causal=True, block_q=6, block_k=6),
        prop("block_sizes", 3, block_sizes, situation=FB_BLOCKS),
        values("decode", 2, situation=FB_DECODE, t_q=1, causal=True), rules(3, causal=True),
        prop("tiles_only", 6, FLASH_TILES.check), device(2, causal=True),
    ),
    mistakes=(
        Mistake("flash_attention_backward.nan_rows", "a row with no key to see (lse = -inf) gave NaN: e^(S - lse) "
                "is e^(-inf + inf) there; make such rows' P 0 (lse → +inf, or torch.where)", test=_nan_in_keyless_rows),
        Mistake("flash_attention_backward.lse_base_mixed", "P was recomputed as 2^(S·log2(e) − lse) with lse in "
                "natural log: convert it too, 2^((S − lse)·log2(e)), or use e^(S − lse)",
                lambda q, k, v, out, lse, *a, **kw: flash_reference(q, k, v, out, lse * math.log(2), *a, **kw),
                why="Triton's kernels use exp2 with S and lse both in bits; with lse left in nats P is off by "
                    "e^(lse·(ln 2 − 1)), a factor per row."),
        Mistake("flash_attention_backward.masked_after_exp", "P was masked after e^(S - lse): a hidden key's large "
                "score makes it inf, and inf · 0 is NaN; fill S with -inf before the exponential",
                _flash_variant(mask_after_exp=True)),
        Mistake("flash_attention_backward.dv_shaped_like_k", "dv was made like k (zeros_like(k)), D wide: dv has v's "
                "shape, torch.zeros_like(v), (…, Tk, Dv)",
                raises=Raises(message=r"must match the size|size mismatch|broadcast",
                              source=r"\b(d_?v|grad_v)\w*\s*=\s*torch\.(zeros|empty)_like\(\s*k\b"),
                why="D = Dv in most models, so a copy of dk's line runs until the value width differs."),
        Mistake("flash_attention_backward.delta_sign", "dS = P ∘ (dP + D): subtract D, dS = P ∘ (dP - D)",
                _flash_variant(delta_sign=1)),
        Mistake("flash_attention_backward.delta_from_the_tile", "D was summed over the tile's keys only (Σ P ∘ dP of "
                "the tile): it sums over all keys, D = rowsum(dO ∘ O), computed before the loop",
                _flash_variant(delta="tile"),
                why="Σ_j P_ij dP_ij over all j equals dO_i · O_i; one tile sees only its own keys."),
        Mistake("flash_attention_backward.delta_over_queries", "D was summed over the tile's queries (Σ P ∘ dP down "
                "a column): D is one number per query, rowsum(dO ∘ O), computed before the loop",
                _flash_variant(delta="tile_queries")),
        Mistake("flash_attention_backward.unscaled", "dS was not multiplied by 1/√D for dq and dk: dq += dS k / √D, "
                "dk += dSᵀ q / √D", _flash_variant(ds_scale="none")),
        Mistake("flash_attention_backward.scaled_by_d", "dS was scaled by 1/D (1/√D twice): scale it once, by 1/√D",
                _flash_variant(ds_scale="d")),
        Mistake("flash_attention_backward.scaled_by_value_width", "scaled by 1/√Dv, the values' width: D is the width "
                "of the queries and keys, so dq += dS k / √D and dk += dSᵀ q / √D",
                lambda *a, **k: [_flash_variant(ds_scale="v")(*a, **k),
                                 _flash_variant(ds_scale="v", scores_scale="v")(*a, **k)],
                why="D = Dv in most models, so v.shape[-1] passes for the head width until they differ."),
        Mistake("flash_attention_backward.dq_scale_wrong", "dq's 1/√D is missing or applied twice while dk's is right: "
                "dq += dS k / √D, once", _one_side(_flash_variant, "dq")),
        Mistake("flash_attention_backward.dk_scale_wrong", "dk's 1/√D is missing or applied twice while dq's is right: "
                "dk += dSᵀ q / √D, once (a pre-scaled q reused in dk scales it again)",
                _one_side(_flash_variant, "dk")),
        Mistake("flash_attention_backward.dp_from_keys", "dP = dO kᵀ: the gradient of the weights comes through the "
                "values, dP = dO vᵀ, (bq, Dv) @ (Dv, bk)", raises=DP_FROM_KEYS),
        Mistake("flash_attention_backward.dq_overwritten", "a query block's dq was overwritten by each key block: add "
                "every key block's part, dq[i] += dS k / √D", _flash_variant(accumulate_q=False),
                why="A query's gradient sums over every key it saw, across all key blocks."),
        Mistake("flash_attention_backward.gradient_order", "returned the gradients in another order: return (dq, dk, "
                "dv), the order of the inputs q, k, v", _reordered(flash_reference)),
        Mistake("flash_attention_backward.causal_off_by_one", "the causal tile mask is off by one (the diagonal key "
                "masked, or one future key seen): mask key j only when j > Tk - Tq + i",
                lambda *a, **k: [_flash_variant(causal_shift=shift)(*a, **k) for shift in (-1, 1)],
                why="Query i at position Tk - Tq + i sees itself: its own key is the one a decoder most needs."),
        Mistake("flash_attention_backward.dv_not_transposed", "a tile's dv is P @ dO: transpose P, dv += Pᵀ @ dO, "
                "(bk, bq) @ (bq, Dv)", _flash_variant(dv_transposed=False),
                why="With block_q ≠ block_k the product does not even run."),
        Mistake("flash_attention_backward.lse_not_unsqueezed", "e^(S - lse) with lse as it is, (..., bq), which "
                "broadcasts along the keys: give it an axis, lse[..., None], (..., bq, 1)",
                raises=Raises(message=r"must match the size of tensor", line=r"lse"),
                why="As it is, it lines up with the tile's last axes, (heads, bq, bk): it does not run."),
        Mistake("flash_attention_backward.mask_forgotten", "the recomputed tile's scores were not masked: mask the "
                "future keys (causal) as the forward did, or P of a future key is not 0",
                _flash_variant(use_mask=False)),
        Mistake("flash_attention_backward.tiles_skipped_from_first_row", "causal: key tiles past the block's first "
                "query were skipped: skip one only when it starts past the block's last query, Tk - Tq + i + bq - 1",
                _flash_variant(skip_from_first_row=True),
                why="The block's later queries sit further right and see some keys of those tiles."),
        Mistake("flash_attention_backward.tiles_stop_short", "causal: the key tile at the block's last "
                "query's own key was skipped (>= for >): skip only tiles starting past Tk - Tq + i + bq - 1",
                _flash_variant(stop_short=True),
                why="That query sees its own key, the tile's first: only with block sizes where some tile starts "
                    "there does it show."),
        Mistake("flash_attention_backward.scores_unscaled", "the recomputed tile's scores were not scaled by 1/√D "
                "before e^(S - lse): lse was taken of the scaled scores, so P = exp(q kᵀ / √D - lse)",
                _flash_variant(scores_scale="none")),
        Mistake("flash_attention_backward.scores_scaled_twice", "the recomputed tile's scores were scaled by 1/√D "
                "twice (q kᵀ scaled, then scaled again in the exponent): P = exp(q kᵀ / √D - lse)",
                _flash_variant(scores_scale="d"),
                why="A port of a kernel that keeps q kᵀ unscaled until the exponent must drop one of the two scales."),
        Mistake("flash_attention_backward.top_left", "causal tiles aligned to the top-left (query i at position i): "
                "mask key j when j > Tk - Tq + i", _flash_variant(top_left=True)),
        Mistake("flash_attention_backward.last_block_dropped", "the last, shorter key block was dropped: loop over "
                "range(0, Tk, block_k) and slice k[..., j:j + block_k, :]", _flash_variant(last_block=False)),
        Mistake("flash_attention_backward.positions_past_the_end", "the last, shorter tile's positions run past the "
                "sequence (arange(j, j + block_k)): take them from the tile's own bounds, arange(j, min(j + block_k, "
                "Tk))", raises=Raises(message=r"must match the size|broadcast", uses=TILE_POSITIONS),
                why="When block_k does not divide Tk (or block_q Tq), the last tile is shorter than a block: positions "
                    "counted a whole block from its start do not fit its scores."),
        Mistake("flash_attention_backward.last_query_block_dropped", "the last, shorter query block was dropped: loop "
                "over range(0, Tq, block_q) and slice q[..., i:i + block_q, :]", _flash_variant(last_q_block=False),
                why="When block_q does not divide Tq, a loop that stops at Tq - Tq % block_q never reaches the last "
                    "queries: their dq stays 0, and their parts of dk and dv are missing."),
        Mistake("flash_attention_backward.overwritten", "a key block's dk and dv were overwritten by each query block: "
                "add every query block's part, dk[j] += dSᵀ q / √D, dv[j] += Pᵀ dO", _flash_variant(accumulate=False),
                why="A key's gradient sums over every query that saw it."),
        FLASH_TILES.full, FLASH_TILES.ignored,
    ),
)

# -- FlashAttentionFunction -------------------------------------------------------------------

RUNNER = "flash_attention_and_grads"  # the file's given function that runs the Function forward and backward


def function_inputs(gen, dtype, t_q=FTQ, t_k=FTK, causal=True, block_q=BQ, block_k=BK, d=FD, dv=FDV, below=0.0):
    """`below`: every score moved about that far below 0 (a shared direction added to q, taken from k), within a
    few units of each other: e^s underflows past -745 in float64 unless the forward's running max starts at -inf."""
    q, k = gen.randn(B, H, t_q, d, dtype=dtype), gen.randn(B, H, t_k, d, dtype=dtype)
    if below:
        shift = math.sqrt(below * math.sqrt(d) / d)  # per coordinate: q·k / √D falls by `below`
        q, k = q / 4 + shift, k / 4 - shift
    v, grad_out = gen.randn(B, H, t_k, dv, dtype=dtype), gen.randn(B, H, t_q, dv, dtype=dtype)
    return Call((q, k, v, grad_out), {"causal": causal, "block_q": block_q, "block_k": block_k},
                ("q", "k", "v", "grad_out"))


def function_reference(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    """(out, dq, dk, dv): plain attention, causal bottom-right, and torch's autograd through it."""
    return autograd(q, k, v, grad_out, causal_mask(q.shape[-2], k.shape[-2]) if causal else None)


def _lse_without_max(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    """The forward saved log(l), the sum relative to the running max: lse - rowmax."""
    out, lse = forward(q, k, v, causal)
    mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    top = attention.scores(q, k, mask).amax(-1)
    wrong = torch.where(top == -INF, lse, lse - top)
    return (out, *grads.plain(q, k, v, grad_out, mask, out=out, lse=wrong))


def _lse_is_max(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    """The forward saved the running max m as lse, without log(l): the row's largest score."""
    out, _ = forward(q, k, v, causal)
    mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    top = attention.scores(q, k, mask).amax(-1)
    return (out, *grads.plain(q, k, v, grad_out, mask, out=out, lse=top))


def _lse_unscaled_max(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    """The forward kept raw scores, the scale inside the exponent, and saved m + log(l) with m the raw max."""
    out, lse = forward(q, k, v, causal)
    mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    top = attention.scores(q, k, mask).amax(-1)  # scaled
    wrong = torch.where(top == -INF, lse, lse - top + top * math.sqrt(q.shape[-1]))
    return (out, *grads.plain(q, k, v, grad_out, mask, out=out, lse=wrong))


def _causal_not_saved(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    """The backward ran without the causal mask (ctx.causal never kept, or not passed on)."""
    out, lse = forward(q, k, v, causal)
    return (out, *grads.plain(q, k, v, grad_out, None, out=out, lse=lse))


def _always_causal_backward(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    """The backward ran with the causal mask whatever the forward did (a block size passed where causal goes)."""
    out, lse = forward(q, k, v, causal)
    return (out, *grads.plain(q, k, v, grad_out, causal_mask(q.shape[-2], k.shape[-2]), out=out, lse=lse))


def _saved_scaled_q(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    """The backward given q / √D, with the forward's right out and lse: dk from the scaled q, dq as dS k / √D."""
    out, lse = forward(q, k, v, causal)
    mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    return (out, *grads.plain(q / math.sqrt(q.shape[-1]), k, v, grad_out, mask, out=out, lse=lse))


def _out_grad_swapped(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    out, lse = forward(q, k, v, causal)
    mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    return (out, *grads.plain(q, k, v, out, mask, out=grad_out, lse=lse))


def _padding_weighted(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    """The forward's zero-padded keys weighted; nothing where they take every row's weight (scores far below 0, where
    an output of 0 has other causes: a max started at 0)."""
    answer = _forward_variant(padded_keys=True)(q, k, v, grad_out, causal, block_q, block_k)
    return [answer] if answer[0].abs().amax() > 1e-3 * v.abs().amax() else []


def _forward_variant(**wrong):
    """The Function with a wrong tiled forward (grads.tiled_forward) and a right backward: out as that forward gave
    it, and the gradients flash_attention_backward computes from the out and lse it saved."""
    def answer(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
        out, lse = grads.tiled_forward(q, k, v, causal, block_k, block_q=block_q, **wrong)
        mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
        return (out, *grads.plain(q, k, v, grad_out, mask, out=out, lse=lse))
    return answer


def _query_tail_dropped(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    """The Function whose forward never computed the last, shorter block of queries (out 0, lse -inf there), its
    backward reading that lse as a row with no key, or guarding -inf to 0 (then e^S, as if nothing was seen)."""
    out, lse = grads.tiled_forward(q, k, v, causal, block_k, block_q=block_q, last_query_block=False)
    mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    return [(out, *grads.plain(q, k, v, grad_out, mask, out=out, lse=saved))
            for saved in (lse, lse.masked_fill(lse == -math.inf, 0.0))]


def _query_blocks_skipped(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
    """The Function whose forward skipped every query block whose first row sees no key (out 0, lse -inf there), its
    backward reading that lse as rows with no key."""
    out, lse = grads.tiled_forward(q, k, v, causal, block_k, block_q=block_q, unseen_blocks_skipped=True)
    mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    return (out, *grads.plain(q, k, v, grad_out, mask, out=out, lse=lse))


def own_question(call):
    """What the grader answers of flash_attention_backward for the Function run on `call`: questions of the call's own
    q, k and v, as its backward asks, with out, lse and grad_out of the shapes they imply; a backward may flatten the
    leading axes or ask per batch entry or head (review 78's F2, review 79's F2), so each entry of a question's q, k
    and v, their leading axes flattened, may be any entry of the call's own flattened (q.reshape(-1, Tq, D)[i]), each
    answered once.

    Review 65's F1 had the grader's backward compute the forward instead (q and k swapped, out 0, grad_out v: dv is
    e^(S - c) v), keeping 13 of the step's 15 points with no attention of its own. Every question is a part of the
    grader's own call, and together they are no more than it, so an answer needs no other bound (Oracle.pinned: the
    general one refused the Function's own question at tiles_only's longest lengths, blind set 60's c06)."""
    own = call.args[:3]
    total = math.prod(own[0].shape[:-2])
    flat = [x.reshape(total, *x.shape[-2:]).double() for x in own]  # (leading positions, T, width)
    taken = set()  # the leading positions answered so far

    def run_of(arguments: dict, meta: bool) -> list | None:
        """The leading positions of the call's own the question's q, k and v are, or None."""
        asked = [arguments.get(name) for name in ("q", "k", "v")]
        if not all(isinstance(x, torch.Tensor) for x in asked):
            return None
        lead = asked[0].shape[:-2]
        n = math.prod(lead)
        if not 0 < n <= total or any(x.shape != (*lead, *mine.shape[-2:]) for x, mine in zip(asked, own, strict=True)):
            return None
        rows = (*lead, own[0].shape[-2])
        implied = {"out": (*rows, own[2].shape[-1]), "lse": rows, "grad_out": (*rows, own[2].shape[-1])}
        if not all(isinstance(arguments.get(name), torch.Tensor) and tuple(arguments[name].shape) == shape
                   for name, shape in implied.items()):
            return None
        pieces = None if meta else [x.reshape(n, *x.shape[-2:]).double() for x in asked]
        positions = []
        for entry in range(n):  # each to a position of the call's own not answered yet, holding the same q, k and v
            position = next((at for at in range(total) if at not in taken and at not in positions and (meta or all(
                torch.equal(piece[entry], mine[at]) for piece, mine in zip(pieces, flat, strict=True)))), None)
            if position is None:
                return None
            positions.append(position)
        return positions

    def rule(arguments: dict, meta: bool) -> str | None:
        positions = run_of(arguments, meta)
        if positions is None:
            return ("the grader answers flash_attention_backward only for the Function's own q, k and v (or entries "
                    "of their leading axes), once each, with out, lse and grad_out of the shapes they imply")
        taken.update(positions)
        return None

    return rule


def own_backward(run, answer) -> None:
    """The gradients of one call came from FlashAttentionFunction.backward: the given runner unchanged, no graph built
    but the runner's, no node but the Function's one, and torch calls made inside the backward pass. Judged at every
    call (review 66's F2 let autograd differentiate the tiled forward at every call but the rules check's)."""
    changed = runner_changed(run.ctx.source)
    graphs = sorted(n for n in answer.called if n.startswith(f"{GRAPH}.") and n not in RUNNER_GRAPH)
    nodes = sorted(n for n in answer.called if n.startswith(f"{NODE_KIND}.") and n not in RUNNER_NODES
                   or n.startswith(f"{FUNCTION_NODES}.") and n != ONE_FUNCTION)
    why = changed or (graphs and f"its torch calls built an autograd graph ({', '.join(graphs)}): torch's autograd "
                                 "differentiated them, not FlashAttentionFunction.backward") or (
        nodes and f"the runner's backward pass differentiated more than the Function's one node ({', '.join(nodes)}):"
                  " torch's autograd did part of the backward's work") or (
        CODE_IN_BACKWARD not in answer.called and "no torch call ran in the backward pass: the gradients are not "
                                                 "FlashAttentionFunction.backward's")
    if why:
        raise CheckFailed(f"{why}; the gradients must come from the Function's own backward", FN_AUTOGRAD,
                          details={"forbidden_calls": graphs + nodes}, breach=True)


def function_answer(run, call, shapes=False, steer=True):
    """The file's flash_attention_and_grads(*call): (out, dq, dk, dv) through the candidate's Function. Every call
    keeps to tiles, forward and backward, judged at its own sizes for the step's tiles_only check, and makes the
    calls its inputs' shapes make, whatever their values (Run.steered)."""
    oracle = run.oracle()
    answers = []  # every call's, the steered ones too: each must be the Function's own backward's

    def invoke(c):
        if oracle is not None:
            oracle.rules["flash_attention_backward"] = own_question(c)
            oracle.pinned.add("flash_attention_backward")
        got = run.ctx.candidate.invoke(RUNNER, c.args, c.kwargs, answers=oracle, shapes=True)
        sizes = TileSizes.of(*c.args[:3], c.kwargs.get("block_q", 32), c.kwargs.get("block_k", 32))
        judge_tiles(run.ctx, run.step.id, sizes, sizes.describe(bool(c.kwargs.get("causal"))), got.shapes)
        answers.append(got)
        return got

    try:  # its calls those its inputs' shapes make, whatever their values
        got = run.steered(call, invoke) if steer else invoke(call)
    except CandidateError as error:
        if error.kind == "not_implemented":
            raise
        raise run.error_failure(error, call, "cpu") from None
    check_calls(got.called, run.ctx.forbidden.get(run.step.id, ()), run.ctx.allowed.get(run.step.id))
    for answer in answers:  # after the rules, whose breach names the call (autograd inside the backward pass)
        own_backward(run, answer)
    return got  # every call keeps the rules, as Run.answer's do


def function_case(**params):
    """A check: out and the three gradients against plain attention's, at the answer's dtype's tolerance."""

    def check(run):
        call = run.inputs(**params)
        run.expect_right(run.output(function_answer(run, call)), call)

    return check


# What the given runner's own Σ out ∘ grad_out records as building an autograd graph; anything else that does is
# autograd differentiating the candidate's forward, not the Function's backward
RUNNER_GRAPH = {f"{GRAPH}.{name}" for name in ("mul", "__mul__", "sum")}
# What its backward pass differentiates: torch's nodes for that sum and product, the leaves q, k and v, and one node
# of an autograd.Function, the file's. More of them (a Function's own `apply` building a graph of mul and sum between
# helper Functions: the forty-fifth review's f1) is autograd doing the backward's work.
RUNNER_NODES = {f"{NODE_KIND}.{name}" for name in ("SumBackward0", "MulBackward0", "AccumulateGrad")}
ONE_FUNCTION = f"{FUNCTION_NODES}.1"


@functools.lru_cache(maxsize=4)  # judged at every call of one file: its source parsed once
def runner_changed(source: str) -> str:
    """Why the file's flash_attention_and_grads is not the given one ('' if it is): the grader calls it by name, so a
    runner of the file's own could differentiate the forward with autograd and never use the Function's backward.
    Its definition must be the stub's (docstrings and comments aside), and nothing that runs on import may bind the
    name again or reach the module's names by a string or globals() (an `if __name__ == "__main__":` block does not
    run when the file is graded)."""
    tree = parse(source)
    given = ast.parse(textwrap.dedent(inspect.getsource(ref.flash_attention_and_grads))).body[0]
    if tree is None:
        return ""
    defined = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == RUNNER]
    if len(defined) != 1 or _body(defined[0]) != _body(given):
        return f"{RUNNER} is not the one the stub gives"
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and n.body
                  and isinstance(n.body[0], ast.Expr)}
    for node in _run_on_import(tree):
        bound = (isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)) and node.id == RUNNER
                 or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == RUNNER
                 and node is not defined[0]
                 or isinstance(node, ast.alias) and RUNNER in (node.name, node.asname)
                 or isinstance(node, ast.Global) and RUNNER in node.names
                 or isinstance(node, ast.Constant) and node.value == RUNNER and id(node) not in docstrings
                 or isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                 and node.func.id in ("globals", "vars", "setattr", "delattr", "__import__")
                 and not (node.func.id in ("setattr", "delattr") and node.args and isinstance(node.args[0], ast.Name)
                          and node.args[0].id in ("self", "ctx", "cls"))
                 or isinstance(node, ast.Attribute) and node.attr == "__dict__"
                 or isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name)
                 and node.value.id == "sys")
        if bound:
            return f"the file binds {RUNNER} again, or reaches its module's names (line {node.lineno})"
    return ""


def _run_on_import(tree: ast.Module):
    """Every node of the file but those of its `if __name__ == "__main__":` blocks."""
    for top in tree.body:
        test = top.test if isinstance(top, ast.If) else None
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
                and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)):
            yield from ast.walk(ast.Module(body=top.orelse, type_ignores=[]))
            continue
        yield from ast.walk(top)


def _body(function: ast.FunctionDef) -> str:
    """A function as the interpreter makes and runs it: its decorators, arguments, annotations and statements, its
    docstring left out."""
    body = function.body[1:] if ast.get_docstring(function) is not None else function.body
    return ast.dump(ast.Module(body=[*function.decorator_list, function.args, *body], type_ignores=[])) + (
        ast.dump(function.returns) if function.returns else "")


def function_rules(run):
    """Its torch calls, the forward's and the backward's: no softmax, no SDPA, no autograd.grad, no autograd inside
    the backward; the given runner unchanged, the Function's own backward run (torch calls made inside the backward
    pass) and no graph built but the runner's; and the answer right."""
    call = run.inputs()
    answer = function_answer(run, call)
    check_rules(answer.called, run.ctx.forbidden.get(run.step.id, ()), run.ctx.source,
                source_of(run.ctx.source, run.step.id))
    no_autograd(answer, run.step.id)
    kept = kept_outside_ctx(run.ctx.source, run.step.id)
    if kept:
        raise CheckFailed(f"FlashAttentionFunction keeps a call's state outside ctx: {kept}", FN_STATE_ON_CLASS)
    try:
        run.expect_right(run.output(answer), call)
    except CheckFailed as failure:
        raise CheckFailed(f"the rules were kept, but the answer is wrong: {failure.message}", failure.mistake,
                          failure.details) from None


def function_end_to_end(run):
    """The Function with the candidate's own flash_attention_backward, not the grader's."""
    call = run.inputs(t_q=FTK + 3, t_k=FTQ)
    try:
        run.expect_right(run.output(function_answer(run, call)), call)
    except CheckFailed as failure:
        named = re.search(r"\bflash_attention_backward\b", source_of(run.ctx.source, run.step.id))
        details = {**failure.details, "calls": ["flash_attention_backward"] if named else []}
        raise CheckFailed(failure.message, failure.mistake, details, failure.outcome) from None


FUNCTION_TILES = tiles_only_check("FlashAttentionFunction", answer=function_answer)
FN_AUTOGRAD = Mistake("FlashAttentionFunction.gradients_by_autograd", "the gradients came from torch's autograd, not "
                      "the Function's backward: keep the given runner, and compute dq, dk, dv in backward",
                      why="FlashAttentionFunction.apply runs forward without a graph; only its backward can answer the "
                          "runner's .backward(), and the grader runs the runner the stub gives.")
FN_CAUSAL = Mistake("FlashAttentionFunction.causal_mishandled", "right without causal, wrong with it: the forward "
                    "masks key j > i + Tk - Tq in each tile, saves causal in ctx and passes it to the backward")
FN_FLOAT64 = Mistake("FlashAttentionFunction.float64_blocks_mishandled", "right in float32 with the default blocks, "
                     "wrong in float64 with blocks of 7 × 5: keep q's dtype in m, l, acc and lse, and honour "
                     "block_q and block_k")
FN_BELOW_ZERO = Mistake("FlashAttentionFunction.far_below_zero_mishandled", "right for ordinary scores, wrong when "
                        "every score of a row is far below 0 (−800, in float64): start the forward's running max at "
                        "-inf, not 0",
                        why="With m = 0, e^(s − m) underflows to 0 past s = −745 in float64 (−104 in float32), and "
                            "out = 0 / 0.")
ORDINARY_SCORES = 8.0  # the largest |q·kᵀ/√D| of ordinary inputs, about: past it, the tolerance grows with it


def scaled_by_the_scores(value, expected, call, tolerance=None, outputs=()):
    """expect_close, at a tolerance that grows with the largest score past ORDINARY_SCORES: e^(S - lse) carries the
    rounding of S itself, and a right formulation's constants too (exp2 by 1.44269504, the Triton tutorial's log2(e)
    to 9 digits: review 71's F3, off by 8e-9 where 2e-9 was allowed at scores of −800)."""
    q, k = (a.double() for a in call.args[:2])
    largest = float((q @ k.transpose(-2, -1)).abs().max()) / math.sqrt(q.shape[-1]) if q.numel() and k.numel() else 0
    grown = max(1.0, largest / ORDINARY_SCORES)
    tolerance = tolerance or Tolerance(1e-4, 1e-5)
    expect_close(value, expected, call, Tolerance(tolerance.rtol * grown, tolerance.atol * grown, tolerance.slack),
                 outputs)


FN_STATE_ON_CLASS = Mistake(
    "FlashAttentionFunction.state_on_class", "forward kept causal, the block sizes or tensors on the class (or a "
    "global), not on ctx: ctx.causal = causal, ctx.save_for_backward(...)",
    why="Two layers apply the Function before one backward pass; the class is shared, so every node reads the last "
        "forward's.")
FN_SAVED = Mistake("FlashAttentionFunction.saved_mishandled", "out is right, the gradients wrong: the backward reads "
                   "what forward saved (q, k, v, out, lse = m + log l) and ctx's causal and blocks")
FUNCTION = StepSpec(
    "FlashAttentionFunction", function_inputs, function_reference, outputs=("out", "dq", "dk", "dv"),
    compare=scaled_by_the_scores,
    answered=("flash_attention_backward",), plain="non_causal", parts=((("out",), FN_SAVED),),
    checks=(
        prop("non_causal", 3, function_case(causal=False, t_q=FTK + 3, t_k=FTQ)),
        # blocks of 6 keys: the last query of the second block of 5 sees key 18, the first of a key block (blind set
        # 55's b07 ended the key loop there)
        prop("causal", 3, function_case(block_k=6), situation=FN_CAUSAL),
        prop("far_below_zero", 1, function_case(dtype=torch.float64, causal=False, below=800.0),
             situation=FN_BELOW_ZERO),
        prop("float64", 3, function_case(dtype=torch.float64, t_q=FTK + 3, t_k=FTQ, block_q=7,
                                         block_k=5), situation=FN_FLOAT64),
        prop("tiles_only", 2, FUNCTION_TILES.check), prop("rules", 1, function_rules),
        prop("end_to_end", 2, function_end_to_end, end_to_end=True),
    ),
    mistakes=(
        Mistake("FlashAttentionFunction.nan_rows", "a row with no key (causal, Tq > Tk) gave NaN in out or a "
                "gradient: give it out 0, lse -inf, and zero gradients", test=_has_nan),
        Mistake("FlashAttentionFunction.lse_without_max", "the forward saved log(l) as lse: l is summed relative to "
                "the running max m, so lse = m + log(l)", _lse_without_max,
                why="out is right either way; the backward's e^(S - lse) is not."),
        Mistake("FlashAttentionFunction.lse_is_max", "the forward saved the running max m as lse: add the log of "
                "the sum relative to it, lse = m + log(l)", _lse_is_max,
                why="m alone is the largest score, not the log of the row's sum: e^(S - m) are not probabilities."),
        Mistake("FlashAttentionFunction.lse_unscaled_max", "the forward saved the max of the unscaled scores in lse: "
                "with the scale inside the exponent, e^(scale·(s - m)), lse = scale·m + log(l)", _lse_unscaled_max,
                why="out is right either way: the max cancels in acc / l, but not in the lse the backward reads."),
        Mistake("FlashAttentionFunction.forward_not_rescaled", "the forward's online softmax did not rescale the "
                "output accumulator when the running max rose: acc = alpha * acc + p @ v, alpha = e^(m - m_new)",
                _forward_variant(rescale_acc=False),
                why="acc holds sums of e^(s - m) under the old max; the division by l (rescaled) then mixes scales."),
        Mistake("FlashAttentionFunction.forward_never_rescaled", "the forward's online softmax rescaled neither acc "
                "nor l (alpha was always 1): keep the old max apart, alpha = e^(m_old - m_new), before m is updated",
                _forward_variant(rescale_acc=False, rescale_sum=False),
                why="m_old = m, then m updated in place (torch.maximum(..., out=m)), makes m_old the new max too."),
        Mistake("FlashAttentionFunction.forward_padding_weighted", "the forward's zero-padded keys took weight "
                "(score 0) without causal: mask the keys past Tk in every tile, causal or not",
                _padding_weighted,
                why="A key of zeros scores 0, and e^(0 - m) is no 0: padding is invisible only where it is masked."),
        Mistake("FlashAttentionFunction.forward_diagonal_masked", "the forward's causal mask hid each query's own "
                "key: mask key j only when j > Tk - Tq + i (>, not >=)", _forward_variant(causal_shift=-1),
                why="Query i sits at position Tk - Tq + i and sees itself; its own key is the one a decoder most "
                    "needs."),
        Mistake("FlashAttentionFunction.forward_sum_not_rescaled", "the forward's online softmax did not rescale "
                "the running sum l when the running max rose: l = alpha * l + rowsum(p), alpha = e^(m - m_new)",
                _forward_variant(rescale_sum=False),
                why="l must sum e^(s - m) under the current max; its old terms keep the old max's scale."),
        Mistake("FlashAttentionFunction.forward_max_not_kept", "the forward's running max was never stored (m stays "
                "-inf), so each key block starts the sums afresh and only the last counts: set m = m_new every block",
                _forward_variant(max_kept=False),
                why="A new name bound inside the loop (m_blk = m_new), or a copy updated in place of the running "
                    "tensor, leaves m as it began."),
        Mistake("FlashAttentionFunction.forward_keys_stepped_by_block_q", "the forward's key loop stepped by block_q "
                "while each tile takes block_k keys, so keys were skipped or counted twice: range(0, Tk, block_k)",
                _forward_variant(step_block_q=True)),
        Mistake("FlashAttentionFunction.forward_query_tail_dropped", "the forward skipped the last, shorter block "
                "of queries: loop over range(0, Tq, block_q) and cut each block at Tq",
                _query_tail_dropped),
        Mistake("FlashAttentionFunction.forward_unseen_block_skipped", "causal, Tq > Tk: the forward skipped a "
                "whole query block whose first row sees no key; its later rows may: skip only a block whose last row "
                "sees none", _query_blocks_skipped,
                why="Where a block straddles the first visible key, its first rows have no key and its last do "
                    "(blind set 63's b19)."),
        Mistake("FlashAttentionFunction.forward_tiles_skipped_from_first_row", "the forward's causal loop stopped at "
                "the first key block past the query block's first row: stop past its last row's last key, "
                "Tk - Tq + its last query", _forward_variant(skip_from_first_row=True)),
        Mistake("FlashAttentionFunction.forward_stops_short", "the forward's causal key loop stops one key short: end "
                "it past the block's last query's own key, min(Tk, Tk - Tq + i1)", _forward_variant(stop_short=True),
                why="range's end is exclusive: ending at the last query's own key skips a key block starting there."),
        Mistake("FlashAttentionFunction.forward_scale_wrong", "the forward's scores were not scaled by 1/√D, D q's "
                "width (not scaled, scaled twice, or by v's width): s = q kᵀ / √D",
                lambda *a, **k: [_forward_variant(scale=wrong)(*a, **k) for wrong in ("none", "twice", "v")]),
        Mistake("FlashAttentionFunction.forward_top_left", "the forward's causal tiles were aligned to the top-left "
                "(query i at position i): mask key j when j > Tk - Tq + i", _forward_variant(top_left=True)),
        Mistake("FlashAttentionFunction.forward_positions_past_the_end", "the forward's last, shorter tile's "
                "positions run past the sequence (arange(j, j + block_k)): take them from the tile's own bounds",
                raises=Raises(message=r"must match the size|broadcast", uses=TILE_POSITIONS)),
        Mistake("FlashAttentionFunction.forward_last_block_dropped", "the forward dropped the last, shorter key "
                "block: loop over range(0, Tk, block_k)", _forward_variant(last_block=False)),
        Mistake("FlashAttentionFunction.forward_not_normalised", "the forward returned acc without dividing by l: "
                "out = acc / l, where l > 0", _forward_variant(normalise=False)),
        Mistake("FlashAttentionFunction.lse_in_base_two", "the forward saved lse in base 2 (an exp2 loop's m·log2(e) "
                "+ log2(l)): convert it back, multiplying by ln(2)", _forward_variant(lse_base_two=True),
                why="exp2 of scores pre-scaled by log2(e) is the same softmax; its log-sum-exp comes out in bits."),
        Mistake("FlashAttentionFunction.forward_tile_key_index", "the forward's causal mask compared the queries' "
                "positions with the tile's own key indices (0 to block_k - 1): use the keys' positions, j + the "
                "tile's start", _forward_variant(local_keys=True)),
        Mistake("FlashAttentionFunction.forward_max_not_running", "the forward's max was the tile's own: the "
                "running max is the larger of the old one and the tile's, m_new = max(m, rowmax(S))",
                _forward_variant(running_max=False),
                why="A tile whose scores are all lower (or masked, -inf) would otherwise lower m below what the sum "
                    "and acc are relative to."),
        Mistake("FlashAttentionFunction.out_shaped_like_q", "the forward's out was made like q (zeros_like(q)), D "
                "wide: out has v's width, (…, Tq, Dv)",
                raises=Raises(message=r"must match the (existing )?size|size mismatch|broadcast",
                              source=r"\bout\w*(\s*,\s*\w+)*\s*=\s*torch\.(zeros|empty)_like\(\s*q\b"),
                why="D = Dv in most models, so the line runs until the value width differs."),
        Mistake("FlashAttentionFunction.saved_scaled_q", "the forward saved q already divided by √D: save the q it was "
                "given (the backward scales again), or unscale it", _saved_scaled_q,
                why="out is right either way; the backward's recomputed scores and dk take q as given."),
        Mistake("FlashAttentionFunction.out_and_grad_swapped", "backward passed out and grad_out to "
                "flash_attention_backward in each other's places: (q, k, v, out, lse, grad_out)", _out_grad_swapped),
        Mistake("FlashAttentionFunction.causal_not_saved", "the backward ran without the causal mask: keep causal "
                "(and the block sizes) on ctx in forward and pass them to flash_attention_backward", _causal_not_saved),
        Mistake("FlashAttentionFunction.backward_always_causal", "the backward masked causally where the forward did "
                "not: a block size passed by position where causal goes is true; pass ctx.causal first, or name "
                "each argument", _always_causal_backward,
                why="flash_attention_backward(q, k, v, out, lse, grad_out, block_q, block_k) gives causal the "
                    "block_q; out is right, and so are causal calls' gradients: only causal=False shows it (blind set "
                    "59's b12)."),
        Mistake("FlashAttentionFunction.gradient_count", "backward returned fewer gradients than forward has "
                "arguments: return one per argument, (dq, dk, dv, None, None, None)",
                raises=Raises(message=r"incorrect number of gradients")),
        Mistake("FlashAttentionFunction.gradient_order", "backward returned its gradients in another order than "
                "forward's arguments: return (dq, dk, dv, None, None, None)",
                raises=Raises(message=r"invalid gradient at index")),
        Mistake("FlashAttentionFunction.forward_returns_lse", "forward returned (out, lse): return out alone, and "
                "keep lse for backward with ctx.save_for_backward",
                raises=Raises(message=r"only integer tensors of a single element can be converted to an index"),
                why="What forward returns is what the caller gets; lse is backward's business."),
        Mistake("FlashAttentionFunction.saved_non_tensors", "ctx.save_for_backward was given a bool or an int: save "
                "only tensors with it, and keep causal and the block sizes as attributes, ctx.causal = causal",
                raises=Raises(message=r"save_for_backward can only save variables")),
        FUNCTION_TILES.full, FUNCTION_TILES.ignored, FN_AUTOGRAD, FN_STATE_ON_CLASS,
    ),
)

SPEC = Spec((SOFTMAX, ATTENTION, FLASH, FUNCTION), calls=no_autograd, contract="solutions.attention_backward")
