"""The checks of `masks`: causal and padding masks, combined, and the attention that uses them.

Masks are compared exactly. Attention's dropout is random, so in training it is graded by
properties any correct sampling has (each weight is 0 or scaled by 1/(1-p), about p of them
are 0, the output is the returned weights @ v, the generator decides the draw), never
against the reference's own draw; causality is a property too.
"""

from dataclasses import dataclass

import torch

from grader.engine import (
    ALWAYS,
    ON_META,
    RESULT_ON_CPU,
    Call,
    CheckFailed,
    Mistake,
    Raises,
    Seeded,
    Spec,
    StepSpec,
    Tolerance,
    attention,
    device,
    device_of,
    expect_close,
    prop,
    rules,
    shape,
    values,
)
from solutions import masks as ref

FLOATS = (torch.float32, torch.float64)
B, H, TQ, TK, D, DV = 3, 2, 5, 7, 4, 6  # batch, heads, query and key tokens, query/key and value widths: all different

# -- causal_mask --------------------------------------------------------------------------


def causal_inputs(gen, dtype, t_q=TQ, t_k=TK):
    return Call((t_q, t_k), names=("t_q", "t_k"))


def _tril(t_q, t_k, diagonal, dtype=torch.bool):
    return torch.ones(t_q, t_k, dtype=dtype).tril(diagonal=diagonal)




def causal_no_future(run):
    """With the candidate's mask, changing the last tokens changes no earlier query's output."""
    t, changed = 6, 2
    call = causal_inputs(run.gen, None, t, t)
    mask = run.output(run.answer(call))
    run.expect_form(mask, call)
    q, k, v = (torch.as_tensor(run.gen.randn(1, t, d)) for d in (D, D, DV))
    later = [x.clone() for x in (q, k, v)]
    for x in later:
        x[:, -changed:] = torch.as_tensor(run.gen.randn(1, changed, x.shape[-1]))
    before, after = ref.attention(q, k, v, mask)[0], ref.attention(*later, mask)[0]
    if not torch.allclose(before[:, :-changed], after[:, :-changed]):
        row = int((before[0, :-changed] - after[0, :-changed]).abs().sum(-1).argmax())
        raise CheckFailed(f"query {row} attended to the future: its output changed when only tokens "
                          f"{t - changed}..{t - 1} changed",
                          run.explain(mask, call))


def causal_on_device(run):
    """causal_mask(t_q, t_k, device) builds the mask on the device asked for."""
    where = run.ctx.device
    value = run.output(run.answer(Call((TQ, TK, where), names=("t_q", "t_k", "device")), device=where))
    got = device_of(value) if isinstance(value, torch.Tensor) else where
    if got.split(":")[0] != where.split(":")[0]:
        raise CheckFailed(f"expected the mask on {where}, the device asked for, got it on {got}", RESULT_ON_CPU)
    run.expect_right(value, causal_inputs(run.gen, None), where)


CAUSAL = StepSpec(
    "causal_mask", causal_inputs, ref.causal_mask,
    checks=(
        shape(2), values("square", 4, t_q=6, t_k=6),
        values("bottom_right", 5, t_q=3, t_k=8),  # 3 new queries after 5 cached keys
        values("single_query", 2, t_q=1), prop("no_future", 4, causal_no_future, gated=ALWAYS),
        prop("device", 3, causal_on_device, gated=ON_META),
    ),
    mistakes=(
        Mistake("causal_mask.float_mask", "returned a float 0/1 mask: return a bool mask (dtype=torch.bool), which "
                "masked_fill and ~ need", lambda t_q, t_k: _tril(t_q, t_k, t_k - t_q, torch.float32)),
        Mistake("causal_mask.top_left", "aligned to the top-left (tril with diagonal 0): with t_q < t_k query i sits "
                "at position t_k - t_q + i, so use tril(diagonal=t_k - t_q)", lambda t_q, t_k: _tril(t_q, t_k, 0)),
        Mistake("causal_mask.inverted", "mask convention inverted: True must mean 'may attend' (tril), not 'blocked' "
                "(the tutorials' triu(diagonal=1))", lambda t_q, t_k: ~ref.causal_mask(t_q, t_k)),
        Mistake("causal_mask.upper", "used triu: that lets a query see the future; the allowed keys are the lower "
                "triangle (tril)", lambda t_q, t_k: torch.ones(t_q, t_k, dtype=torch.bool).triu(diagonal=t_k - t_q)),
        Mistake("causal_mask.diagonal_sign", "tril(diagonal=t_q - t_k): the offset is t_k - t_q, positive when there "
                "are more keys than queries", lambda t_q, t_k: _tril(t_q, t_k, t_q - t_k)),
        Mistake("causal_mask.no_diagonal", "the diagonal is blocked: a token may attend to itself, so keep diagonal "
                "t_k - t_q, not one below it", lambda t_q, t_k: _tril(t_q, t_k, t_k - t_q - 1)),
    ),
)

# -- padding_mask -------------------------------------------------------------------------


def padding_inputs(gen, dtype, lengths=(4, 2, 6), t=TK, int_dtype=torch.int64):
    return Call((gen.native(torch.tensor(lengths, dtype=int_dtype)), t), names=("lengths", "t"))


PADDING = StepSpec(
    "padding_mask", padding_inputs, ref.padding_mask,
    checks=(
        shape(2), values("values", 4),
        values("empty_and_full", 4, lengths=(0, TK, 3, 1)),  # a row of no tokens, a row of no padding
        values("int32_lengths", 3, int_dtype=torch.int32), device(3),
    ),
    mistakes=(
        Mistake("padding_mask.inverted", "mask convention inverted: True must mark the real tokens "
                "(positions < length), not the padding", lambda lengths, t: torch.arange(t) >= lengths[:, None]),
        Mistake("padding_mask.off_by_one", "off by one: a sequence of length n has real tokens at positions 0 .. n - "
                "1 (position < length)", lambda lengths, t: torch.arange(t) <= lengths[:, None]),
        Mistake("padding_mask.max_length", "the mask has max(lengths) columns: it must have t, even when every "
                "sequence is shorter", lambda lengths, t: torch.arange(int(lengths.max())) < lengths[:, None]),
        Mistake("padding_mask.lengths_not_a_column", "lengths (B,) was compared with the positions as it is, lining "
                "up with the time axis: compare arange(t)[None, :] < lengths[:, None]",
                raises=Raises(message=r"must match the size|could not be broadcast",
                              source=r"<\s*lengths\b(?!\s*\[)|lengths\s*>(?!=)"),
                why="Made a column, lengths[:, None] is (B, 1); against the positions (1, t) it broadcasts to (B, t)."),
    ),
)

# -- combine_masks ------------------------------------------------------------------------


def combine_inputs(gen, dtype, t_q=TQ, t_k=TK, lengths=(TK, 3, 5), random=False):
    if random:  # masks that are no triangle and no prefix: the function combines what it is given
        padding = gen.mask(B, t_k, keep_first=False)
        return Call((padding, gen.mask(t_q, t_k, keep_first=False)), names=("padding", "causal"))
    return Call((ref.padding_mask(torch.tensor(lengths), t_k), ref.causal_mask(t_q, t_k)), names=("padding", "causal"))


COMBINE = StepSpec(
    "combine_masks", combine_inputs, ref.combine_masks,
    checks=(
        shape(2), values("values", 4),
        values("square", 4, t_q=6, t_k=6, lengths=(6, 2, 4)),  # Tq == Tk: padding on the wrong axis fits
        values("any_masks", 3, random=True), device(3),
    ),
    mistakes=(
        Mistake("combine_masks.or", "combined with OR: a key may be attended only where BOTH masks allow it "
                "(&, logical and)", lambda padding, causal: padding[:, None, None, :] | causal),
        Mistake("combine_masks.padding_on_queries", "the padding mask lined up with the query axis: it is per key, "
                "so make it (B, 1, 1, Tk)", lambda padding, causal: padding[:, None, :, None] & causal),
        Mistake("combine_masks.no_head_axis", "returned (B, Tq, Tk): keep an axis of size 1 for the heads, "
                "(B, 1, Tq, Tk), so it broadcasts over them", lambda padding, causal: padding[:, None, :] & causal),
    ),
)

# -- attention ----------------------------------------------------------------------------


def attend(q, k, v, mask=None, dropout_p=0.0, training=False, generator=None, *, scale_by="d", **wrong):
    """Attention without dropout, (output, weights); the keyword arguments after * make the named wrong variants
    (`scale_by` names the width the scores are divided by the root of; the rest go to attention.weights)."""
    width = {"d": q.shape[-1], "dv": v.shape[-1], "none": 1}[scale_by]
    weights = attention.weights(q, k, mask, width=width, **wrong)
    return weights @ v, weights


def _variant(**wrong):
    return lambda q, k, v, mask=None, *rest, **kwargs: attend(q, k, v, mask, **wrong)


def attention_inputs(gen, dtype, lead=(B, H), tq=TQ, tk=TK, mask="random", **kwargs):
    q = gen.randn(*lead, tq, D, dtype=dtype)
    k, v = gen.randn(*lead, tk, D, dtype=dtype), gen.randn(*lead, tk, DV, dtype=dtype)
    padding, causal = ref.padding_mask(torch.tensor((TK, 3, 5)), tk), ref.causal_mask(tq, tk)
    masks = {
        "random": lambda: gen.mask(*lead, tq, tk), "none": lambda: None, "per_query": lambda: gen.mask(B, 1, tq, tk),
        "causal": lambda: causal, "padding": lambda: padding[:, None, None, :],
        "combined": lambda: ref.combine_masks(padding, causal),
        "blocked_rows": lambda: _blocked_rows(gen.mask(B, 1, tq, tk)),
    }
    return Call((q, k, v, masks[mask]()), kwargs, ("q", "k", "v", "mask"))


def _blocked_rows(mask):
    mask[0, :, 2] = False  # a padded query row: it may attend to nothing
    mask[1] = False  # a sequence with no tokens at all
    return mask


def broadcast_masks(run):
    for mask in ("causal", "padding", "combined"):  # (Tq, Tk), (B, 1, 1, Tk), (B, 1, Tq, Tk)
        call = run.inputs(mask=mask)
        run.expect_right(run.output(run.answer(call)), call)


def attention_no_future(run):
    """With a causal mask, changing the last tokens changes no earlier query's output or weights."""
    t, changed = 6, 2
    call = run.inputs(tq=t, tk=t, mask="causal")
    later_args = [x.clone() for x in call.args[:3]]
    for x in later_args:
        x[..., -changed:, :] = torch.as_tensor(run.gen.randn(B, H, changed, x.shape[-1]))
    later = Call((*later_args, call.args[3]), names=call.names)
    before, after = (run.output(run.answer(c)) for c in (call, later))
    for c, value in ((call, before), (later, after)):
        run.expect_form(value, c)
    for name, x, y in zip(("output", "weights"), before, after, strict=True):
        if not torch.allclose(x[..., :-changed, :], y[..., :-changed, :], rtol=1e-4, atol=1e-5):
            raise CheckFailed(f"the {name} of queries 0..{t - changed - 1} changed when only tokens "
                              f"{t - changed}..{t - 1} changed: they attended to the future", run.explain(before, call))


def any_leading_dims(run):
    for lead in ((B,), ()):  # (B, T, D) without heads, and a single (T, D) sequence
        call = run.inputs(lead=lead, mask="causal")
        run.expect_right(run.output(run.answer(call)), call)


# Dropout: big enough that the zeroed fraction is p within a few thousandths (tolerance 0.03)
P, BIG_LEAD, BIG_TQ, BIG_TK = 0.25, (4, 4), 24, 40
RATE_TOLERANCE = 0.03
OTHER_RATES = (0.1, 0.15, 0.4, 0.45, 0.5, 0.55, 0.6)  # each far enough from P for the rates to tell them apart


@dataclass(frozen=True)
class DropoutFacts:
    """What a training-mode answer did to the live weights (those positive at eval)."""

    zero: float  # fraction that came back 0
    same: float  # fraction that came back unchanged
    scaled: float  # fraction that came back divided by 1 - p
    dead_changed: bool  # a weight that is 0 at eval came back nonzero: not a dropout of the right weights
    output_zero: float  # fraction of the output entries that are exactly 0
    output_is_eval: bool  # the output is the eval weights @ v

    @classmethod
    def of(cls, weights, eval_weights, output, v, p=P):
        w, e = weights.to(torch.float64), eval_weights.to(torch.float64)
        live = e > 0
        n = max(int(live.sum()), 1)
        fraction = lambda hit: int((hit & live).sum()) / n
        return cls(
            zero=fraction(w == 0), same=fraction(torch.isclose(w, e, rtol=1e-4, atol=1e-7)),
            scaled=fraction(torch.isclose(w, e / (1 - p), rtol=1e-4, atol=1e-7)),
            dead_changed=bool(((w != 0) & ~live).any()),
            output_zero=float((output == 0).to(torch.float64).mean()),
            output_is_eval=torch.allclose(output.to(torch.float64), e @ v.to(torch.float64), rtol=1e-4, atol=1e-5),
        )


# Dropout mistakes, each recognised by its own property checks from the facts of the answer.
DROPOUT_AT_EVAL = Mistake("attention.dropout_at_eval", "dropout applied while not training: at eval (training=False) "
                          "dropout does nothing, whatever dropout_p says")
NO_DROPOUT = Mistake("attention.no_dropout_in_training", "no weight was dropped while training: with training=True, "
                     "zero each weight with probability dropout_p")
ON_OUTPUT = Mistake("attention.dropout_on_output", "dropout applied to the output instead of the attention weights: "
                    "drop weights, then multiply by v")
UNDROPPED_RETURNED = Mistake("attention.returned_undropped_weights", "returned the weights from before dropout: "
                             "return the dropped weights, the ones multiplied with v")
NO_RESCALE = Mistake("attention.dropout_no_rescale", "the kept weights were not rescaled: divide them by 1 - "
                     "dropout_p, so the expected output stays the same")
KEEP_PROB = Mistake("attention.dropout_keep_prob", "about 1 - p of the weights were zeroed: dropout_p is the "
                    "probability to DROP a weight, not to keep it")
DROPOUT_P_IGNORED = Mistake("attention.dropout_p_ignored", "the dropout zeroed weights at one fixed rate, whatever "
                            "dropout_p was: drop each weight with probability dropout_p, the argument given")
GENERATOR_IGNORED = Mistake("attention.generator_ignored", "the dropout ignored `generator`: draw the mask with "
                            "torch.rand(..., generator=generator) or torch.bernoulli(..., generator=generator); "
                            "F.dropout cannot take one")
DROPOUT_SIGNS = (  # (mistake, what the facts show), in the order they are tried
    (NO_DROPOUT, lambda f: f.same > 0.999 and f.output_is_eval),
    (ON_OUTPUT, lambda f: f.same > 0.999 and abs(f.output_zero - P) < 0.1),
    (UNDROPPED_RETURNED, lambda f: f.same > 0.999 and not f.output_is_eval and f.output_zero < P / 2),
    (NO_RESCALE, lambda f: f.zero > 0 and f.zero + f.same > 0.999),
    (KEEP_PROB, lambda f: abs(f.zero - (1 - P)) < RATE_TOLERANCE),
)


def _dropout_mistake(weights, eval_weights, output, v, signs=DROPOUT_SIGNS, p=P):
    """The dropout mistake the weights show, if they have the shapes to show one (a transposed answer has not)."""
    expected_output = (*eval_weights.shape[:-1], v.shape[-1])
    if not (isinstance(weights, torch.Tensor) and isinstance(output, torch.Tensor)
            and weights.shape == eval_weights.shape and tuple(output.shape) == expected_output):
        return None
    facts = DropoutFacts.of(weights, eval_weights, output, v, p)
    return None if facts.dead_changed else next((m for m, shows in signs if shows(facts)), None)


def _training(run, dtype=torch.float32, seeded=True, device="cpu", p=P):
    """A big training-mode call at rate `p`; returns the candidate's (output, weights), the eval weights and v."""
    call = run.inputs(dtype=dtype, lead=BIG_LEAD, tq=BIG_TQ, tk=BIG_TK, dropout_p=p, training=True,
                      generator=Seeded(run.gen.seed()) if seeded else None)
    value = run.output(run.answer(call, device=device))
    run.expect_form(value, Call(call.args, names=call.names), device)  # the shapes of the call without dropout
    output, weights = value
    q, k, v, mask = call.args
    return output, weights, ref.attention(q, k, v, mask)[1], v


def dropout_eval_is_identity(run):
    call = run.inputs(dropout_p=0.5, training=False, generator=Seeded(run.gen.seed()))
    value = run.output(run.answer(call))
    try:
        run.expect_right(value, call)
    except CheckFailed as failure:
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise
        output, weights = value
        at_eval_sign = lambda f: f.zero > 0 and (f.zero + f.scaled > 0.999 or f.zero + f.same > 0.999)
        at_eval = _dropout_mistake(weights, ref.attention(*call.args)[1], output, call.args[2],
                                   signs=((DROPOUT_AT_EVAL, at_eval_sign),), p=0.5)
        raise CheckFailed(failure.message, failure.mistake or at_eval, failure.details) from None


def _expect_kept_weights(output, weights, eval_weights, v, tolerances=(1e-4, 1e-7)):
    """Every weight is 0 or its eval value / (1 - p), and some are 0."""
    w, e = weights.to(torch.float64), eval_weights.to(torch.float64)
    bad = (w != 0) & ~torch.isclose(w, e / (1 - P), rtol=tolerances[0], atol=tolerances[1])
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise CheckFailed(f"weight {where} is {w[where].item():.6g}; in training each weight must be 0 or its eval "
                          f"value / (1 - p) = {e[where].item() / (1 - P):.6g} (p = {P})",
                          _dropout_mistake(weights, eval_weights, output, v))
    if not ((w == 0) & (e > 0)).any():
        raise CheckFailed("no weight was dropped in training", _dropout_mistake(weights, eval_weights, output, v))


def dropout_kept_weights(run):
    _expect_kept_weights(*_training(run, torch.float64))


def dropout_rate(run):
    """About dropout_p of the live weights zeroed, at P and at a rate drawn with inputs.Gen.unknown:
    a dropout of one fixed rate, whatever dropout_p says, passes only the rate it was written for."""
    other = OTHER_RATES[int(torch.randint(len(OTHER_RATES), (), generator=run.gen.unknown))]
    for p in (P, other):
        output, weights, eval_weights, v = _training(run, p=p)
        live = eval_weights > 0
        rate = int(((weights == 0) & live).sum()) / int(live.sum())
        if abs(rate - p) > RATE_TOLERANCE:
            if p == P:  # the signs of the dropout mistakes are those at P
                mistake = _dropout_mistake(weights, eval_weights, output, v)
            else:
                mistake = DROPOUT_P_IGNORED if abs(rate - P) <= RATE_TOLERANCE else None
            raise CheckFailed(f"{rate:.3f} of the weights were zeroed in training; expected about dropout_p = {p} "
                              f"(± {RATE_TOLERANCE})", mistake)


def dropout_output_uses_returned_weights(run):
    output, weights, eval_weights, v = _training(run, seeded=False)  # no generator: torch's global RNG
    try:
        expect_close(output, weights.to(torch.float64) @ v.to(torch.float64), tolerance=Tolerance(1e-4, 1e-5))
    except CheckFailed as failure:
        raise CheckFailed(f"the output is not the returned weights @ v: {failure.message}",
                          _dropout_mistake(weights, eval_weights, output, v), failure.details) from None


def dropout_reproducible(run):
    """The same generator seed gives the same dropout; another seed another one."""
    call = run.inputs(lead=BIG_LEAD, tq=BIG_TQ, tk=BIG_TK, mask="none")
    seed = run.gen.seed()

    def weights(generator_seed):
        c = Call(call.args, {"dropout_p": P, "training": True, "generator": Seeded(generator_seed)}, call.names)
        value = run.output(run.answer(c))
        run.expect_form(value, call)
        return value[1]

    first, again, other = weights(seed), weights(seed), weights(seed + 1)
    if not torch.equal(first, again):
        raise CheckFailed("two calls with generators seeded alike gave different weights", GENERATOR_IGNORED)
    if torch.equal(first, other):
        raise CheckFailed("generators seeded differently gave the same weights: the dropout must be random")


def dropout_on_device(run):
    """Dropout in training on the device: the mask must be drawn there (with the generator made for it)."""
    found = _training(run, device=run.ctx.device)
    if run.ctx.device != "meta":  # another device sums in another order
        _expect_kept_weights(*found, tolerances=(1e-3, 1e-4))


def _has_nan(value, *args, **kwargs):
    return any(bool(torch.isnan(x.to(torch.float64)).any()) for x in value)


ATTENTION = StepSpec(
    "attention", attention_inputs, ref.attention, outputs=("output", "weights"),
    checks=(
        shape(2), values("values", 3, FLOATS), values("mask_none", 2, mask="none"),
        prop("broadcast_masks", 4, broadcast_masks),
        prop("causal_no_future", 4, attention_no_future, gated=ALWAYS),
        values("fully_masked_rows", 4, mask="blocked_rows"),
        prop("any_leading_dims", 2, any_leading_dims), prop("dropout_eval_is_identity", 3, dropout_eval_is_identity),
        prop("dropout_kept_weights", 5, dropout_kept_weights, gated=ALWAYS), prop("dropout_rate", 4, dropout_rate),
        prop("dropout_output_uses_returned_weights", 3, dropout_output_uses_returned_weights, gated=ALWAYS),
        prop("dropout_reproducible", 3, dropout_reproducible), rules(2), device(2, mask="per_query"),
        prop("dropout_device", 2, dropout_on_device, gated=ON_META),
    ),
    mistakes=(
        Mistake("attention.mask_inverted", "mask convention inverted: True means 'may attend'; fill where the mask "
                "is False", _variant(mask_mode="inverted")),
        Mistake("attention.unscaled", "scores not scaled: divide q @ kᵀ by √D, D the width of q and k",
                _variant(scale_by="none")),
        Mistake("attention.scaled_by_value_width", "scaled by √Dv (the width of v): use √D, the width of q and k",
                _variant(scale_by="dv")),
        Mistake("attention.masked_after_softmax", "masked after the softmax: fill the blocked scores with -inf "
                "before the softmax", _variant(mask_mode="zero_weights"),
                why="Masked after the softmax, the blocked keys still took their share of each row's sum."),
        Mistake("attention.softmax_query_axis", "softmax over the query axis: normalize over the keys, dim=-1",
                _variant(softmax_dim=-2)),
        Mistake("attention.finite_fill", "blocked scores filled with a finite value (-1e9): fill with -inf and turn "
                "the NaN of fully blocked rows into zeros", _variant(fill=-1e9),
                why="With a finite fill, a fully blocked row spreads its weight evenly over the keys instead of "
                    "giving zeros."),
        Mistake("attention.mask_multiplied", "the scores were multiplied by the mask: a blocked score of 0 still gets "
                "weight e^0; fill the blocked scores with -inf (masked_fill(~mask, float('-inf')))",
                _variant(fill=0.0)),
        Mistake("attention.nan_rows", "a fully blocked row gives NaN (softmax of all -inf): give it zero weights and "
                "a zero output", test=_has_nan),
        DROPOUT_AT_EVAL, NO_DROPOUT, ON_OUTPUT, UNDROPPED_RETURNED, NO_RESCALE, KEEP_PROB, DROPOUT_P_IGNORED,
        GENERATOR_IGNORED,
    ),
)

SPEC = Spec((CAUSAL, PADDING, COMBINE, ATTENTION))
