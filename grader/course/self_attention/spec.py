"""The checks of `self_attention`: the tutorials' single-head module, step by step.

The steps the module shares with `mha` (scores, softmax, weighted sum) use mha's inputs and
mistakes; d_in != d_out everywhere but where a square case is the point, so a √d_in or a
missing transpose shows.
"""

import math

import torch

from grader.course.mha import spec as mha
from grader.engine import (
    Call,
    Mistake,
    Raises,
    Spec,
    StepSpec,
    attention,
    defaults,
    device,
    end_to_end,
    gradients,
    linear_layers,
    matches_any,
    prop,
    rules,
    shape,
    values,
)
from solutions import self_attention as ref

FLOATS = (torch.float32, torch.float64)
B, T, D_IN, D_OUT = 2, 5, 6, 4  # batch, tokens, input width, key/value width: all different
TQ, TK = 5, 7  # query and key tokens for the functions that allow them to differ
NAMES = ("W_query", "W_key", "W_value")

# -- project_qkv --------------------------------------------------------------------------


def qkv_inputs(gen, dtype, lead=(B, T), d_in=D_IN, d_out=D_OUT, bias=True):
    x = gen.randn(*lead, d_in, dtype=dtype)
    weights = tuple(gen.randn(d_out, d_in, dtype=dtype, scale=d_in**-0.5) for _ in range(3))
    biases = tuple(gen.randn(d_out, dtype=dtype) for _ in range(3)) if bias else ()  # qkv_bias=False: biases omitted
    return Call((x, *weights, *biases), names=("x", "w_query", "w_key", "w_value", "b_query", "b_key", "b_value"))


def _linear(x, w, b=None):
    return x @ w.T + (0 if b is None else b)


def _three(x, wq, wk, wv, bq=None, bk=None, bv=None):
    return ((wq, bq), (wk, bk), (wv, bv))


def _crossed(out, x, *a):
    """Each output is the right one, or one of them took another's weight or bias."""
    pairs = _three(x, *a)
    for i in range(3):
        for j in range(3):
            for weight, bias in ((pairs[j][0], pairs[i][1]), (pairs[i][0], pairs[j][1])):
                if i != j and (bias is not None or weight is not pairs[i][0]):
                    wrong = list(ref.project_qkv(x, *a))
                    wrong[i] = _linear(x, weight, bias)
                    if matches_any(out, [tuple(wrong)]):
                        return True
    return False


def _not_transposed(x, *a):
    """x @ W (the weight as stored) for all three projections, or for one of them."""
    pairs = _three(x, *a)
    untransposed = tuple(x @ w + (0 if b is None else b) for w, b in pairs)
    right = ref.project_qkv(x, *a)
    return [untransposed] + [tuple(untransposed[j] if j == i else right[j] for j in range(3)) for i in range(3)]


PROJECT_QKV = StepSpec(
    "project_qkv", qkv_inputs, ref.project_qkv, outputs=("queries", "keys", "values"),
    checks=(
        shape(2), values("values", 2, FLOATS), values("without_bias", 2, bias=False),
        values("square_weight", 2, d_in=5, d_out=5),  # d_in == d_out: a missing transpose runs but is wrong
        values("unbatched_noncontiguous", 2, strided=(0,), lead=(T,)), rules(2), device(2),
    ),
    mistakes=(
        Mistake("project_qkv.weight_not_transposed", "used x @ W for one weight or all three: nn.Linear stores its "
                "weight (d_out, d_in), so multiply by W.T", _not_transposed,
                raises=Raises(message=r"cannot be multiplied|size mismatch|shapes",
                              line=r"@\s*w_\w+\b(?!\s*\.T|\.mT)")),
        Mistake("project_qkv.no_bias", "biases ignored: add each bias (d_out,) when it is given",
                lambda x, *a: tuple(x @ w.T for w, _ in _three(x, *a))),
        Mistake("project_qkv.swapped", "queries and keys swapped: return (queries, keys, values), each from its own "
                "weight", lambda *a: (lambda q, k, v: (k, q, v))(*ref.project_qkv(*a))),
        Mistake("project_qkv.wrong_weight", "one projection used another's weight or bias (copy-paste): queries use "
                "w_query and b_query, keys w_key and b_key, values w_value and b_value", test=_crossed),
        Mistake("project_qkv.one_weight", "one weight used for all three: queries use w_query, keys w_key, values "
                "w_value", lambda x, *a: (_linear(x, *_three(x, *a)[0]),) * 3),
    ),
)

# -- attention_scores, scale_scores, softmax, weighted_sum: mha's, on unbatched and batched inputs ---


def qk_inputs(gen, dtype, tq=TQ, tk=TK, lead=(B,)):
    return mha.qk_inputs(gen, dtype, tq, tk, lead)


SCORES = StepSpec(
    "attention_scores", qk_inputs, ref.attention_scores, mistakes=mha.SCORES.mistakes,
    checks=(
        shape(2), values("values", 2, FLOATS),
        values("square", 2, tq=T, tk=T),  # Tq == Tk: a transposed result has the right shape
        values("unbatched", 1, lead=()),
        values("extra_leading_dims", 1, lead=(2, 3)), device(2),  # keys.T works only unbatched
    ),
)


def scale_inputs(gen, dtype, d_out=16):
    return mha.scale_inputs(gen, dtype, d_out, lead=(B, T, T))


SCALE = StepSpec(
    "scale_scores", scale_inputs, ref.scale_scores,
    checks=(
        shape(2), values("values", 2, FLOATS),
        values("irrational_root", 2, (torch.float64,), d_out=8),  # √8 is no whole number (isqrt gives 2)
        values("float16", 2, (torch.float16,)), device(2),
    ),
    mistakes=(
        Mistake("scale_scores.multiplied", "multiplied by √d_out (or divided by d_out**-0.5): divide by √d_out",
                lambda s, d: s * math.sqrt(d)),
        Mistake("scale_scores.by_d_out", "divided by d_out: divide by √d_out", lambda s, d: s / d),
        Mistake("scale_scores.unscaled", "returned the scores unscaled: divide by √d_out", lambda s, d: s),
        Mistake("scale_scores.by_last_axis", "divided by √(the scores' last axis), the number of keys: use √d_out, "
                "the argument", lambda s, d: s / math.sqrt(s.shape[-1])),
        Mistake("scale_scores.integer_root", "the root was rounded to a whole number (math.isqrt, int(...), or //): "
                "use math.sqrt", lambda s, d: s / math.isqrt(d) if math.isqrt(d) ** 2 != d else None),
        Mistake("scale_scores.precedence", "d_out ** 1/2 is (d_out ** 1) / 2: write d_out ** 0.5 or math.sqrt(d_out)",
                test=lambda out, s, d: matches_any(out, [s / (d / 2), s / d / 2])),
    ),
)


def softmax_inputs(gen, dtype, lead=(B, TQ, TK), dim=None, scale=3.0):
    return mha.softmax_inputs(gen, dtype, lead, dim, scale)


SOFTMAX = StepSpec(
    "softmax", softmax_inputs, ref.softmax,
    checks=(
        shape(2), values("values", 2, FLOATS), values("dim_0", 2, lead=(4, 5, 6), dim=0),
        values("dim_minus_2", 2, dim=-2), values("large_logits", 3, scale=1e4),
        values("noncontiguous_matrix", 2, strided=(0,), lead=(6, 6)), rules(2), device(1),
    ),
    mistakes=tuple(m for m in mha.SOFTMAX.mistakes if m.id != "softmax.nan_rows"),  # no all -inf rows here
)


def weighted_inputs(gen, dtype, tq=TQ, tk=TK, lead=(B,), dropped=False):
    return mha.weighted_inputs(gen, dtype, tq, tk, lead, dropped)


WEIGHTED = StepSpec(
    "weighted_sum", weighted_inputs, ref.weighted_sum, mistakes=mha.WEIGHTED.mistakes,
    checks=(shape(2), values("values", 1, FLOATS), values("square", 2, tq=T, tk=T),
            values("unbatched", 2, tq=T, tk=T, lead=()),
            values("dropped_weights", 2, dropped=True), device(2)),
)

# -- SelfAttention ------------------------------------------------------------------------


def attend(state, x, *, scale_by="d_out", value_from="W_value", causal=False, **wrong):
    """The module's forward: the reference's projections, then attention.attend; the keyword arguments make the named
    wrong variants (`scale_by` names the width the scores are divided by the root of; the rest go to
    attention.attend)."""
    names = ("W_query", "W_key", value_from)
    q, k, v = ref.project_qkv(x, *(state[f"{n}.weight"] for n in names), *(state.get(f"{n}.bias") for n in names))
    width = {"d_out": q.shape[-1], "d_in": x.shape[-1], "none": 1, "tokens": x.shape[-2]}[scale_by]
    mask = attention.causal_mask(x.shape[-2], x.shape[-2]) if causal else None  # CausalAttention, a section too early
    return attention.attend(q, k, v, mask, width=width, **wrong)


def module_inputs(gen, dtype, bias=False, d_in=D_IN, d_out=D_OUT, lead=(B, T)):
    state = {f"{n}.weight": torch.as_tensor(gen.randn(d_out, d_in, dtype=dtype, scale=d_in**-0.5)) for n in NAMES}
    if bias:
        state.update({f"{n}.bias": torch.as_tensor(gen.randn(d_out, dtype=dtype, scale=0.5)) for n in NAMES})
    return Call((gen.randn(*lead, d_in, dtype=dtype),), names=("x",), init=(d_in, d_out),
                init_kwargs={"qkv_bias": bias}, state=state)


def _variant(**wrong):
    return lambda state, x: attend(state, x, **wrong)


MODULE = StepSpec(
    "SelfAttention", module_inputs, attend, module=True, prefix="module",
    answered=("project_qkv", "attention_scores", "scale_scores", "softmax", "weighted_sum"),
    checks=(
        prop("structure", 2, linear_layers(NAMES, (D_IN, D_OUT), "an nn.Linear(d_in, d_out, bias=qkv_bias)")),
        prop("defaults", 1, defaults()),  # qkv_bias=False, the contract's default
        values("values", 3, FLOATS), values("qkv_bias", 3, bias=True),
        values("unbatched", 3, lead=(T,)),  # as in the worked example
        values("widening", 3, bias=True, d_in=3, d_out=5, lead=(B, 4)),  # d_out > d_in
        prop("gradients", 4, gradients(bias=True)), rules(3), device(3, bias=True),
        prop("end_to_end", 2, end_to_end(bias=True), end_to_end=True),
    ),
    mistakes=(
        Mistake("SelfAttention.scaled_by_d_in", "scaled by √d_in: divide by √d_out, the width of the keys",
                _variant(scale_by="d_in")),
        Mistake("SelfAttention.unscaled", "scores not scaled: divide by √d_out (keys.shape[-1] ** 0.5) before the "
                "softmax", _variant(scale_by="none")),
        Mistake("SelfAttention.softmax_query_axis", "softmax over the query axis: normalize over the keys, dim=-1",
                _variant(softmax_dim=-2)),
        Mistake("SelfAttention.scores_transposed", "scores transposed: use queries @ keysᵀ, not keys @ queriesᵀ",
                _variant(transposed=True)),
        Mistake("SelfAttention.key_as_value", "used the keys as the values: project the values with W_value",
                _variant(value_from="W_key")),
        Mistake("SelfAttention.scaled_by_token_count", "scaled by √(number of tokens): divide by √d_out, the width "
                "of the keys", _variant(scale_by="tokens")),
        Mistake("SelfAttention.scaled_after_softmax", "scaled the weights after the softmax: scale the scores before "
                "it", _variant(scale_at="weights")),
        Mistake("SelfAttention.causal", "applied a causal mask: this module attends to every token "
                "(the mask comes with CausalAttention)", _variant(causal=True)),
    ),
)

SPEC = Spec((PROJECT_QKV, SCORES, SCALE, SOFTMAX, WEIGHTED, MODULE))
