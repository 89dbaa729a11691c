"""The checks of `mha`: for each step, its inputs, the reference, its checks and its named mistakes.

Read top-down: the dimensions once, then one block per step. Every check calls exactly
one candidate function (or builds the module), with the grader's own inputs, so a broken
step costs only its own points. the engine (grader/engine/) runs them; mha_numpy reuses
these steps with NumPy inputs.
"""

import math

import torch

from grader.engine import (
    ALWAYS,
    Call,
    CheckFailed,
    Mistake,
    Raises,
    Spec,
    StepSpec,
    as_tensor_tree,
    attention,
    defaults,
    device,
    end_to_end,
    gradients,
    grid,
    linear_layers,
    matches_any,
    prop,
    raises_value_error,
    rules,
    shape,
    values,
)
from solutions import mha as ref

FLOATS = (torch.float32, torch.float64)
B, H, TQ, TK, DH, DV = 2, 3, 5, 7, 4, 6  # batch, heads, query and key tokens, head width, value width: all different
D = H * DH


# -- project ------------------------------------------------------------------------------


def project_inputs(gen, dtype, lead=(B, TQ), d_in=6, d_out=4, bias=True):
    x, w = gen.randn(*lead, d_in, dtype=dtype), gen.randn(d_out, d_in, dtype=dtype)
    return Call((x, w, gen.randn(d_out, dtype=dtype) if bias else None), names=("x", "weight", "bias"))


PROJECT = StepSpec(
    "project", project_inputs, ref.project,
    checks=(
        shape(), values("values", 2, FLOATS), values("without_bias", 1, bias=False),
        values("square_weight", 1, d_in=5, d_out=5),  # d_in == d_out: a missing transpose runs but is wrong
        values("extra_leading_dims_noncontiguous", 1, strided=(0,), lead=(2, 3, 4)), rules(), device(),
    ),
    mistakes=(
        Mistake("project.no_bias", "bias ignored: add bias (d_out,) when it is given", lambda x, w, b: x @ w.T),
        Mistake("project.weight_not_transposed", "used x @ weight: weight is stored (d_out, d_in), so multiply by "
                "weight.T", lambda x, w, b: x @ w + (0 if b is None else b),
                raises=Raises(message=r"cannot be multiplied|size of tensor|mismatch",
                              line=r"@\s*weight\b(?!\.T|\.t\(|\.transpose|\.mT)")),
    ),
)

# -- split_heads --------------------------------------------------------------------------


def split_inputs(gen, dtype, heads=H, lead=(B, TQ), width=D):
    return Call((gen.randn(*lead, width, dtype=dtype), heads), names=("x", "num_heads"))


def merge_reference_split(gen, run):
    """The candidate's split, merged back by the reference merge, gives x back."""
    call = split_inputs(gen, torch.float32, heads=4, lead=(3, 6), width=8)
    out = run.answer(call).value
    run.expect_form(out, call)
    if not torch.allclose(ref.merge_heads(torch.as_tensor(out)), torch.as_tensor(call.args[0])):
        raise CheckFailed("merging your heads back (the reference merge_heads) does not give x back",
                          run.explain(out, call))


SPLIT = StepSpec(
    "split_heads", split_inputs, ref.split_heads,
    checks=(
        shape(), values("values", 2, FLOATS), values("noncontiguous", 1, strided=(0,)),
        prop("round_trip", 2, lambda run: merge_reference_split(run.gen, run)),
        values("single_head", 1, heads=1), device(),
    ),
    mistakes=(
        Mistake("split_heads.no_transpose", "the head axis must come before the token axis: transpose(1, 2) after "
                "the view to (B, T, H, Dh)", lambda x, h: x.reshape(x.shape[0], x.shape[1], h, x.shape[2] // h)),
        Mistake("split_heads.view_no_transpose", "heads split with a view straight to (B, H, T, Dh): view "
                "(B, T, H, Dh), then transpose(1, 2)",
                lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h)),
        Mistake("split_heads.interleaved", "interleaved heads: head h took every H-th feature; it must take the "
                "contiguous block [h·Dh, (h+1)·Dh)",
                lambda x, h: x.reshape(x.shape[0], x.shape[1], x.shape[2] // h, h).permute(0, 3, 1, 2)),
        Mistake("split_heads.head_width_last", "the axes came out (B, H, Dh, T): the head width goes last, "
                "(B, H, T, Dh)",
                lambda x, h: x.reshape(x.shape[0], x.shape[1], h, x.shape[2] // h).permute(0, 2, 3, 1)),
        Mistake("split_heads.sequence_first_fold", "heads folded into the batch, reshape(T, B·H, Dh), as "
                "nn.MultiheadAttention does: view (B, T, H, Dh), then transpose(1, 2)",
                lambda x, h: x.reshape(x.shape[1], x.shape[0] * h, x.shape[2] // h).transpose(0, 1)
                .reshape(x.shape[0], h, x.shape[1], x.shape[2] // h),
                why="nn.MultiheadAttention's fold is for sequence-first (T, B, D) input; this one is batch first, "
                    "(B, T, D)."),
    ),
)

# -- attention_scores ---------------------------------------------------------------------


def qk_inputs(gen, dtype, tq=TQ, tk=TK, lead=(B, H)):
    return Call((gen.randn(*lead, tq, DH, dtype=dtype), gen.randn(*lead, tk, DH, dtype=dtype)), names=("q", "k"))


SCORES = StepSpec(
    "attention_scores", qk_inputs, ref.attention_scores,
    checks=(
        shape(), values("values", 2, FLOATS),
        values("square", 1, tq=6, tk=6),  # Tq == Tk: a transposed result has the right shape
        values("any_leading_dims", 1, lead=(B,)), device(),  # 3-D: k.transpose(2, 3) or 4-D-only code fails
    ),
    mistakes=(
        Mistake("attention_scores.transposed", "scores transposed, k @ qᵀ: compute q @ kᵀ, which is (..., Tq, Tk)",
                lambda q, k: k @ q.transpose(-2, -1)),
        Mistake("attention_scores.reshape_not_transpose", "kᵀ made with a reshape to (..., Dh, Tk): use "
                "k.transpose(-2, -1)", lambda q, k: q @ k.reshape(*k.shape[:-2], k.shape[-1], k.shape[-2]),
                why="A reshape keeps the order of the elements, so it scrambles the keys instead of transposing them."),
        Mistake("attention_scores.fixed_axes", "transposed fixed axes of k (transpose(1, 2), transpose(0, 1)): use "
                "transpose(-2, -1)", lambda q, k: q @ k.transpose(1, 2),
                raises=Raises(message=r"size|shape|mismatch|must match|aligned",
                              line=r"transpose\(\s*\d\s*,\s*\d\s*\)|permute\(|swapaxes\(\s*\w+\s*,\s*\d\s*,\s*\d\s*\)"),
                why="Fixed axes are the last two only for one number of dims."),
    ),
)

# -- scale_scores -------------------------------------------------------------------------


def scale_inputs(gen, dtype, head_dim=16, lead=(B, H, TQ, TK), scale=4.0):
    return Call((gen.randn(*lead, dtype=dtype, scale=scale), head_dim), names=("scores", "head_dim"))


SCALE = StepSpec(
    "scale_scores", scale_inputs, ref.scale_scores,
    checks=(
        shape(), values("values", 2, FLOATS),
        values("irrational_root", 1, (torch.float64,), head_dim=8),  # √8 is no whole number
        values("float16", 1, (torch.float16,)), device(),
    ),
    mistakes=(
        Mistake("scale_scores.multiplied", "multiplied by √head_dim (or divided by head_dim**-0.5): divide by "
                "√head_dim", lambda s, d: s * math.sqrt(d)),
        Mistake("scale_scores.by_head_dim", "divided by head_dim: divide by √head_dim", lambda s, d: s / d),
        Mistake("scale_scores.unscaled", "returned the scores unscaled: divide by √head_dim", lambda s, d: s),
        Mistake("scale_scores.by_last_axis", "divided by √(the scores' last axis), the number of keys: use "
                "√head_dim, the argument", lambda s, d: s / math.sqrt(s.shape[-1])),
        Mistake("scale_scores.precedence", "head_dim ** 1/2 is (head_dim ** 1) / 2: write head_dim ** 0.5 or "
                "math.sqrt(head_dim)", test=lambda out, s, d: matches_any(out, [s / (d / 2), s / d / 2])),
        Mistake("scale_scores.integer_root", "the root was rounded to a whole number (math.isqrt, int(...), or //): "
                "use math.sqrt", lambda s, d: s / math.isqrt(d) if math.isqrt(d) ** 2 != d else None),
    ),
)

# -- apply_mask ---------------------------------------------------------------------------


def mask_inputs(gen, dtype, mask="random", scale=1.0):
    scores = gen.randn(B, H, TQ, TK, dtype=dtype, scale=scale)
    masks = {
        "random": lambda: gen.mask(B, H, TQ, TK),
        "causal": lambda: gen.native(torch.ones(TQ, TK, dtype=torch.bool).tril(diagonal=TK - TQ)),  # (Tq, Tk)
        "padding": lambda: gen.native(torch.arange(TK) < torch.tensor([TK, 3]).view(B, 1, 1, 1)),  # (B, 1, 1, Tk)
        "per_query": lambda: gen.mask(1, 1, TQ, TK),
        "none": lambda: None,
    }
    return Call((scores, masks[mask]()), names=("scores", "mask"))


def expect_masked(value, expected, call, tolerance=None, outputs=()):
    """Entries the reference keeps are unchanged, exactly; those it blocks are -inf or at most -1e4."""
    value, expected = as_tensor_tree(value), as_tensor_tree(expected)
    blocked = expected.isneginf() | (expected <= -1e4)
    pattern = grid(~(value <= -1e4), ~blocked)  # which keys each query may see, returned and expected
    changed = (value.to(torch.float64) != expected.to(torch.float64)) & ~blocked
    if changed.any():
        where = tuple(int(i) for i in changed.nonzero()[0])
        raise CheckFailed(f"an allowed entry changed at {where}: expected {expected[where].item():.6g}, "
                          f"got {value[where].item():.6g}",
                          details={"where": list(where), **pattern})
    high = blocked & ~(value <= -1e4)
    if high.any():
        where = tuple(int(i) for i in high.nonzero()[0])
        raise CheckFailed(f"a blocked entry at {where} is {value[where].item():.6g}; blocked entries must be -inf or "
                          "at most -1e4",
                          details={"where": list(where), **pattern})


MASK = StepSpec(
    "apply_mask", mask_inputs, ref.apply_mask, compare=expect_masked,
    checks=(
        shape(), values("values", 2, FLOATS), values("broadcast_causal", 1, mask="causal"),
        values("broadcast_padding", 1, mask="padding"), values("none", 1, mask="none"),
        values("large_scores", 1, scale=5e3), values("float16", 1, (torch.float16,)),
        values("bfloat16", 1, (torch.bfloat16,)), device(mask="per_query"),
    ),
    mistakes=(
        Mistake("apply_mask.inverted", "mask convention inverted (True must mean attend): fill where the mask is False",
                lambda s, m: s.masked_fill(m, float("-inf"))),
        Mistake("apply_mask.zero_fill", "blocked scores set to 0 (multiplied by the mask): exp(0) still gives them "
                "weight; use -inf", lambda s, m: s * m),
        Mistake("apply_mask.added_mask", "added the mask to the scores: a bool mask is not a bias; fill the blocked "
                "entries with -inf", lambda s, m: s + m),
        Mistake("apply_mask.additive_too_small", "blocked scores are not low enough: use -inf (or finfo(dtype).min), "
                "not a small offset",
                test=lambda out, s, m: m is not None and out.shape == s.shape
                and bool(((out > -1e4) & ~m.expand(s.shape) & (out != s)).any())),
        Mistake("apply_mask.none_blocks_all", "with mask=None every score was blocked: no mask means nothing is "
                "blocked; return the scores", test=lambda out, s, m: m is None and bool((out <= -1e4).all())),
        Mistake("apply_mask.bool_arithmetic", "arithmetic on a bool mask (1 - mask): use ~mask or mask.logical_not()",
                raises=Raises(message=r"with a bool tensor is not supported")),
        Mistake("apply_mask.index_no_broadcast", "indexing the scores with a mask of another shape does not "
                "broadcast: use scores.masked_fill(~mask, float('-inf'))",
                raises=Raises(message=r"shape of the mask .* does not match the shape of the indexed tensor|"
                                      r"boolean index did not match")),
    ),
)

# -- softmax ------------------------------------------------------------------------------


def softmax_inputs(gen, dtype, lead=(B, H, TQ, TK), dim=None, scale=3.0, blocked=False):
    x = gen.randn(*lead, dtype=dtype, scale=scale)
    if blocked:
        x[0, 1] = float("-inf")  # a fully blocked query row
        x[1, :, 2] = float("-inf")  # and a blocked key column, which is fine
    return Call((x,) if dim is None else (x, dim), names=("scores", "dim"))


def _nonfinite(out, x, dim=-1, blocked_slices=False):
    """Non-finite entries: in slices that are all -inf (blocked_slices), or in others (an overflow)."""
    bad = ~torch.isfinite(out.to(torch.float64))
    all_blocked = torch.isneginf(x).all(dim, keepdim=True).expand(x.shape)
    return bool((bad & (all_blocked if blocked_slices else ~all_blocked)).any())


def _exp_over(x, dim, keepdim=True):
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=keepdim)


def _shifted_exp(x, dim):
    return torch.exp(x - x.amax(dim, keepdim=True))


UNSTABLE_MESSAGE = "not numerically stable: exp overflows for large logits; subtract the max along dim first"
NAN_ROWS = Mistake("softmax.nan_rows", "a slice that is all -inf gives NaN: give it zeros "
                   "(replace a -inf max by 0 and guard the zero sum)",
                   test=lambda out, x, dim=-1: _nonfinite(out, x, dim, blocked_slices=True))
SOFTMAX_MISTAKES = (  # the order matters: an answer that is all NaN fits several
    NAN_ROWS,
    Mistake("softmax.unstable", UNSTABLE_MESSAGE, lambda x, dim=-1: _exp_over(x, dim)),
    Mistake("softmax.identity", "returned the scores as they came: exponentiate, then divide by the sum along dim",
            lambda x, dim=-1: x),
    Mistake("softmax.ignored_dim", "softmax over the last axis whatever dim says: normalize along dim",
            lambda x, dim=-1: ref.softmax(x, -1)),
    Mistake("softmax.sum_over_last_axis", "the sum was taken over the last axis, not along dim "
            "(the shift was right): divide by the sum along dim",
            lambda x, dim=-1: _shifted_exp(x, dim) / _shifted_exp(x, dim).sum(-1, keepdim=True)),
    Mistake("softmax.dim_0", "normalized along dim 0 (the tutorials' softmax_naive on a 1-D tensor): sum along dim",
            lambda x, dim=-1: _exp_over(x, 0)),
    Mistake("softmax.whole_tensor", "normalized over the whole tensor: sum along dim with keepdim=True",
            lambda x, dim=-1: torch.exp(x) / torch.exp(x).sum()),
    Mistake("softmax.no_keepdim", "the sum lost its axis (no keepdim=True) and broadcast against the wrong axis: "
            "pass keepdim=True", lambda x, dim=-1: _exp_over(x, dim, keepdim=False)),
    Mistake("softmax.global_max", "subtracted the max of the whole tensor, not of each slice along dim: rows far "
            "below it underflow to 0/0", lambda x, dim=-1: _exp_over(x - x.max(), dim)),
    Mistake("softmax.max_no_keepdim", "the max lost its axis (no keepdim=True), so each slice had another slice's "
            "max subtracted: x.amax(dim, keepdim=True)", lambda x, dim=-1: _exp_over(x - x.amax(dim), dim)),
    Mistake("softmax.max_over_last_axis", "the max was taken over the last axis, not along dim: the shift must be "
            "constant along dim", lambda x, dim=-1: _exp_over(x - x.amax(-1, keepdim=True), dim)),
    Mistake("softmax.max_namedtuple", "Tensor.max(dim) returns (values, indices): take .values, or use amax",
            raises=Raises(message=r"return_types\.max")),
)

SOFTMAX = StepSpec(
    "softmax", softmax_inputs, ref.softmax,
    checks=(
        shape(), values("values", 2, FLOATS), values("dim_0", 1, lead=(4, 5, 6), dim=0),
        values("dim_minus_2", 1, dim=-2),
        values("large_logits", 2, lead=(B, TQ, TK), scale=1e4),  # exp overflows float32
        values("all_masked_rows", 2, lead=(B, TQ, TK), scale=1.0, blocked=True),
        values("noncontiguous_matrix", 1, strided=(0,), lead=(6, 6)),  # square: a lost keepdim broadcasts silently
        rules(), device(),
    ),
    # unstable in some other way, besides the form SOFTMAX_MISTAKES computes
    mistakes=(*SOFTMAX_MISTAKES, Mistake("softmax.unstable", UNSTABLE_MESSAGE, test=_nonfinite)),
)

# -- weighted_sum -------------------------------------------------------------------------


def weighted_inputs(gen, dtype, tq=TQ, tk=TK, lead=(B, H), dropped=False):
    weights = ref.softmax(torch.as_tensor(gen.randn(*lead, tq, tk, dtype=dtype, scale=2.0)))
    if dropped:  # as dropout leaves them: a quarter zeroed, the rest scaled by 4/3, rows no longer summing to 1
        kept = torch.as_tensor(gen.randn(*lead, tq, tk)) > -0.6745
        weights = (weights * kept / 0.75).to(weights.dtype)
    return Call((gen.native(weights), gen.randn(*lead, tk, DV, dtype=dtype)), names=("weights", "v"))


WEIGHTED = StepSpec(
    "weighted_sum", weighted_inputs, ref.weighted_sum,
    checks=(shape(), values("values", 1, FLOATS), values("square", 1, tq=TK), values("any_leading_dims", 1, lead=(3,)),
            values("dropped_weights", 2, dropped=True), device()),
    mistakes=(
        Mistake("weighted_sum.transposed_weights", "weights transposed in the weighted sum: use weights @ v, not "
                "weightsᵀ @ v", lambda w, v: w.transpose(-2, -1) @ v),
        Mistake("weighted_sum.summed_over_queries", "summed over the query axis: each output row mixes the value "
                "rows, so sum over the keys, giving (..., Tq, Dv)",
                lambda w, v: (w.unsqueeze(-1) * v.unsqueeze(-3)).sum(-3)),
        Mistake("weighted_sum.renormalized", "the weights were divided by their sum before mixing: compute weights @ "
                "v with the weights as given", lambda w, v: (w / w.sum(-1, keepdim=True)) @ v,
                why="Weights after dropout, or a fully masked row of zeros, do not sum to 1, and must not be made to."),
        Mistake("weighted_sum.broadcast_for_2d", "a broadcast written for 2-D inputs: index from the end, "
                "(w[..., :, :, None] * v[..., None, :, :]).sum(-2), or simply weights @ v",
                raises=Raises(message=r"must match the size|could not be broadcast", source=r"None\]|unsqueeze")),
    ),
)

# -- merge_heads --------------------------------------------------------------------------


def merge_inputs(gen, dtype, heads=H, width=DH):
    return Call((gen.randn(B, heads, TQ, width, dtype=dtype),), names=("x",))


def merge_reference_split_back(run):
    """The candidate's merge undoes the reference split."""
    x = run.gen.randn(3, 6, 8)
    call = Call((run.gen.native(ref.split_heads(torch.as_tensor(x), 4)),), names=("x",))
    out = run.answer(call).value
    run.expect_form(out, call)
    if not torch.allclose(torch.as_tensor(out), torch.as_tensor(x)):
        raise CheckFailed("your merge of the reference's split does not give x back", run.explain(out, call))


MERGE = StepSpec(
    "merge_heads", merge_inputs, ref.merge_heads,
    checks=(
        shape(), values("values", 2, FLOATS), values("noncontiguous", 1, strided=(0,)),
        prop("round_trip", 2, merge_reference_split_back), values("single_head", 1, heads=1, width=D), device(),
    ),
    mistakes=(
        Mistake("merge_heads.no_transpose", "merged heads without moving the head axis back: transpose(1, 2) before "
                "the reshape", lambda x: x.reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])),
        Mistake("merge_heads.interleaved", "heads interleaved: features of one head must stay together, as "
                "(B, T, H, Dh) flattened",
                lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])),
        Mistake("merge_heads.flattened_tokens", "flatten(1) merged the tokens too: flatten only the last two axes, "
                "flatten(2) or reshape(B, T, H * Dh)", lambda x: x.transpose(1, 2).flatten(1)),
    ),
)

# -- MultiHeadAttention -------------------------------------------------------------------


def attend(state, query, key=None, value=None, mask=None, *, heads=H, split=None, value_from="value", key_weight="w_k",
           layout="batch", out_proj=True, values_are_keys=False, no_bias=None, untransposed=(), scale="head", **wrong):
    """The module's forward: the reference's projections and heads around attention.attend; the keyword arguments
    after `heads` make the named wrong variants (`scale` names the width the scores are divided by the root of;
    the rest, `wrong`, go to attention.attend)."""
    key = query if key is None else key
    given = key if value is None else value
    value = {"value": given, "key": key, "query": query if value is None else value}[value_from]
    if layout == "time_first":  # read (B, T, D) as if it were (T, B, D)
        query, key, value = (x.transpose(0, 1) for x in (query, key, value))
    embed = query.shape[-1]

    def proj(x, name):
        weight = state[f"{name}.weight"]
        bias = None if name == no_bias else state.get(f"{name}.bias")
        return ref.project(x, weight.T if name in untransposed else weight, bias)

    inputs = ((query, "w_q"), (key, key_weight), (value, "w_v"))
    q, k, v = (ref.split_heads(proj(x, name), split or heads) for x, name in inputs)
    width = {"head": embed // heads, "embed": embed, "heads": heads, "none": 1, "keys": key.shape[-2]}[scale]
    out = ref.merge_heads(attention.attend(q, k, k if values_are_keys else v, mask, width=width, **wrong))
    out = proj(out, "w_o") if out_proj else out
    return out.transpose(0, 1) if layout == "time_first" else out


def _variant(**wrong):
    return lambda state, *args, **kwargs: attend(state, *args, **kwargs, **wrong)


def _bias_dropped(out, state, *args, **kwargs):
    if "w_q.bias" not in state:
        return False
    return matches_any(out, [attend(state, *args, **kwargs, no_bias=name) for name in ("w_q", "w_k", "w_v", "w_o")])


def _weights_untransposed(out, state, *args, **kwargs):
    untransposed = (("w_q", "w_k", "w_v"), ("w_q", "w_k", "w_v", "w_o"))
    return matches_any(out, [attend(state, *args, **kwargs, untransposed=names) for names in untransposed])


NO_WIDTH_CHECK = Mistake("MultiHeadAttention.no_width_check", "embed_dim not divisible by num_heads was accepted: "
                         "raise ValueError in __init__")
MODULE_MISTAKES = (
    Mistake("MultiHeadAttention.scaled_by_embed_dim", "scaled by √embed_dim: divide by √head_dim, head_dim = "
            "embed_dim // num_heads", _variant(scale="embed")),
    Mistake("MultiHeadAttention.scaled_by_num_heads", "scaled by √num_heads: divide by √head_dim",
            _variant(scale="heads")),
    Mistake("MultiHeadAttention.scaled_by_key_count", "scaled by √(number of keys): divide by √head_dim",
            _variant(scale="keys")),
    Mistake("MultiHeadAttention.unscaled", "scores not scaled: divide by √head_dim before the softmax",
            _variant(scale="none")),
    Mistake("MultiHeadAttention.scaled_after_softmax", "scaled the weights after the softmax: scale the scores "
            "before it", _variant(scale_at="weights")),
    Mistake("MultiHeadAttention.softmax_query_axis", "softmax over the query axis: normalize over keys, dim=-1",
            _variant(softmax_dim=-2)),
    Mistake("MultiHeadAttention.mask_inverted", "mask convention inverted: True must mean 'may attend'; block where "
            "the mask is False", _variant(mask_mode="inverted")),
    Mistake("MultiHeadAttention.mask_ignored", "the mask was never applied: pass it to apply_mask before the softmax",
            _variant(mask_mode="ignored")),
    Mistake("MultiHeadAttention.mask_after_softmax", "masked the weights after the softmax: mask the scores before it",
            test=lambda out, state, *a, **k: matches_any(
                out, [attend(state, *a, **k, mask_mode=mode) for mode in ("zero_weights", "fill_weights")]),
            why="Masked after the softmax, the blocked keys still took their share of each row's sum."),
    Mistake("MultiHeadAttention.key_as_value", "used the key as the value: project `value` with w_v",
            _variant(value_from="key")),
    Mistake("MultiHeadAttention.value_defaults_to_query", "value defaulted to query: it defaults to key "
            "(value = key if value is None)", _variant(value_from="query")),
    Mistake("MultiHeadAttention.keys_as_values", "multiplied the weights by the keys (weights @ k): multiply by the "
            "values v", _variant(values_are_keys=True)),
    Mistake("MultiHeadAttention.w_q_for_keys", "projected the keys with w_q: keys use w_k", _variant(key_weight="w_q")),
    Mistake("MultiHeadAttention.one_head", "attended with one head over the whole width: split into num_heads heads "
            "first", _variant(split=1)),
    Mistake("MultiHeadAttention.time_first", "read the input as (T, B, D): the contract is batch first, (B, T, D)",
            _variant(layout="time_first")),
    Mistake("MultiHeadAttention.weight_not_transposed", "projected with x @ W: use x @ W.T (or the layer itself)",
            test=_weights_untransposed,
            why="The weights are stored (out, in), as nn.Linear keeps them."),
    Mistake("MultiHeadAttention.no_output_projection", "forgot the output projection after merging the heads: apply "
            "w_o to them", _variant(out_proj=False)),
    Mistake("MultiHeadAttention.bias_dropped", "one projection's bias was dropped: each of w_q, w_k, w_v, w_o adds "
            "its own bias", test=_bias_dropped),
    NO_WIDTH_CHECK,
    Mistake("MultiHeadAttention.mask_reshaped", "the mask was unsqueezed for one layout only: pass it as it is",
            raises=Raises(message=r"must match the size|broadcast",
                          source=r"mask\s*\.\s*unsqueeze|mask\s*\[\s*:\s*,\s*None|mask\.view"),
            why="Masks come broadcastable to (B, H, Tq, Tk) already."),
)


def module_inputs(gen, dtype, tk=None, key=False, value=False, mask=None, bias=True, embed=D):
    names = ("w_q", "w_k", "w_v", "w_o")
    state = {f"{n}.weight": torch.as_tensor(gen.randn(embed, embed, dtype=dtype, scale=embed**-0.5)) for n in names}
    if bias:
        state.update({f"{n}.bias": torch.as_tensor(gen.randn(embed, dtype=dtype, scale=0.1)) for n in names})
    tk = tk or TQ
    query = gen.randn(B, TQ, embed, dtype=dtype)
    key_ = gen.randn(B, tk, embed, dtype=dtype) if key else None
    value_ = gen.randn(B, tk, embed, dtype=dtype) if value else None
    m = None
    if mask is not None:
        m = gen.mask(*{"batch": (B, 1, TQ, tk), "plain": (TQ, tk)}[mask])
        m[..., 1] = False  # the mask and its inverse block no row entirely (such rows are graded in softmax)
    return Call((query, key_, value_), {"mask": m}, ("query", "key", "value"), init=(embed, H),
                init_kwargs={"bias": bias}, state=state)


MODULE = StepSpec(
    "MultiHeadAttention", module_inputs, attend, module=True, prefix="module",
    answered=("project", "split_heads", "attention_scores", "scale_scores", "apply_mask", "softmax", "weighted_sum",
              "merge_heads"),
    checks=(
        prop("structure", 1, linear_layers(("w_q", "w_k", "w_v", "w_o"), (D, H), "an nn.Linear(embed_dim, embed_dim)")),
        prop("validates_width", 1, raises_value_error((10, 3), "10 is not divisible by 3", NO_WIDTH_CHECK),
             gated=ALWAYS),
        values("self_attention", 2, FLOATS), values("cross_attention", 2, tk=TK, key=True, value=True),
        values("value_defaults_to_key", 1, key=True),  # Tk == Tq: value = query would run, and be wrong
        values("mask_per_batch", 1, tk=TK, key=True, mask="batch"),
        values("mask_plain", 1, tk=TK, key=True, mask="plain"), values("without_bias", 1, bias=False),
        prop("defaults", 1, defaults(tk=TK, key=True, value=True)),  # bias=True, the contract's default
        prop("gradients", 2, gradients(tk=TK, key=True, value=True, mask="batch")),
        rules(2, tk=TK, key=True, mask="plain"),
        device(1, tk=TK, key=True, mask="plain"),
        prop("end_to_end", 2, end_to_end(tk=TK, key=True, value=True, mask="batch"), end_to_end=True),
    ),
    mistakes=MODULE_MISTAKES,
)

SPEC = Spec((PROJECT, SPLIT, SCORES, SCALE, MASK, SOFTMAX, WEIGHTED, MERGE, MODULE))
