"""Hidden checks for the `masks` exercise: one group per step, each graded with the grader's own inputs.

Every check calls exactly one candidate function, so a broken step costs only its own
points. The reference runs here, in the grader's process. Points per step add up to the
step's points in grader/manifest.toml. Masks are compared exactly; attention's dropout is
random, so in training it is graded by properties any correct sampling has (each weight is
0 or scaled by 1/(1-p), about p of them are 0, the output is the returned weights @ v),
never against the reference's own draw.
"""

import math
from dataclasses import dataclass

import pytest
import torch

from grader.candidate import Seeded
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
    step,
)
from grader.wire import Opaque, device_of
from solutions import masks as ref

FLOATS = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
B, H, TQ, TK, D, DV = 3, 2, 5, 7, 4, 6  # batch, heads, query and key tokens, query/key width, value width: all different


def expect_bool_mask(value, shape, device: str = "cpu") -> torch.Tensor:
    """A bool tensor of this shape on this device."""
    expect_tensor(value, device=device)
    if value.dtype != torch.bool:
        raise CheckFailed(f"expected a bool mask (True = may attend), got dtype {str(value.dtype).removeprefix('torch.')}")
    return expect_tensor(value, shape, device=device)


def expect_mask(value, expected: torch.Tensor, mistakes=(), args: tuple = (), device: str = "cpu") -> torch.Tensor:
    """A bool tensor equal to `expected` entry for entry; if not, name the first mistake that explains it."""
    expect_tensor(value, device=device)  # a tensor on the right device first: no mistake explains a wrong device
    try:
        expect_bool_mask(value, expected.shape, device)
        if device != "meta" and not torch.equal(value, expected):
            wrong = value != expected
            where = tuple(int(i) for i in wrong.nonzero()[0])
            raise CheckFailed(
                f"{int(wrong.sum())} of {wrong.numel()} entries differ from the reference: "
                f"expected {bool(expected[where])} at {where}, got {bool(value[where])}"
            )
    except CheckFailed as failure:
        mistake = next((m for m in mistakes if m.explains(value, args)), None)
        raise CheckFailed(failure.message, mistake) from None
    return value


def _seed(rng) -> Seeded:
    """A generator for the candidate, seeded from the check's own generator (so --seed changes it)."""
    return Seeded(int(torch.randint(2**31 - 1, (1,), generator=rng)))


# -- causal_mask --------------------------------------------------------------------------


def _tril(t_q, t_k, diagonal, dtype=torch.bool):
    return torch.ones(t_q, t_k, dtype=dtype).tril(diagonal=diagonal)


CAUSAL_MISTAKES = (
    Mistake(
        "causal_mask.float_mask",
        "returned a float 0/1 mask: return a bool mask (dtype=torch.bool), which masked_fill and ~ need",
        lambda t_q, t_k: _tril(t_q, t_k, t_k - t_q, torch.float32),
    ),
    Mistake(
        "causal_mask.top_left",
        "aligned to the top-left (tril with diagonal 0): with t_q < t_k query i sits at position t_k - t_q + i, "
        "so use tril(diagonal=t_k - t_q)",
        lambda t_q, t_k: _tril(t_q, t_k, 0),
    ),
    Mistake(
        "causal_mask.inverted",
        "mask convention inverted: True must mean 'may attend' (tril), not 'blocked' (the tutorials' triu(diagonal=1))",
        lambda t_q, t_k: ~ref.causal_mask(t_q, t_k),
    ),
    Mistake(
        "causal_mask.upper",
        "used triu: that lets a query see the future; the allowed keys are the lower triangle (tril)",
        lambda t_q, t_k: torch.ones(t_q, t_k, dtype=torch.bool).triu(diagonal=t_k - t_q),
    ),
    Mistake(
        "causal_mask.no_diagonal",
        "the diagonal is blocked: a token may attend to itself, so keep diagonal t_k - t_q, not one below it",
        lambda t_q, t_k: _tril(t_q, t_k, t_k - t_q - 1),
    ),
)

FLOAT_MASK = CAUSAL_MISTAKES[0]  # first: a float mask of the right values matches no bool variant


def _causal(candidate, t_q, t_k, device=None):
    """Check causal_mask(t_q, t_k) (or causal_mask(t_q, t_k, device) on that device) against the reference."""
    if device is None:
        value, device = candidate.call("causal_mask", t_q, t_k).value, "cpu"
    else:
        value = call_on_device(candidate, device, "causal_mask", t_q, t_k, device)
        where = device_of(value) if isinstance(value, torch.Tensor) else device
        if where.split(":")[0] != device.split(":")[0]:
            raise CheckFailed(f"expected the mask on {device}, the device asked for, got it on {where}: build it with device=device")
    return expect_mask(value, ref.causal_mask(t_q, t_k), CAUSAL_MISTAKES, (t_q, t_k), device)


def _bool_mask(value, t_q, t_k):
    """A bool (t_q, t_k) tensor, whatever its values; a float mask is named."""
    try:
        return expect_bool_mask(value, (t_q, t_k))
    except CheckFailed as failure:
        raise CheckFailed(failure.message, FLOAT_MASK if FLOAT_MASK.explains(value, (t_q, t_k)) else None) from None


@step("causal_mask", points=2)
def test_causal_mask_shape(candidate):
    _bool_mask(candidate.call("causal_mask", TQ, TK).value, TQ, TK)


@step("causal_mask", points=4)
def test_causal_mask_square(candidate):
    _causal(candidate, 6, 6)  # the usual lower triangle


@step("causal_mask", points=5)
def test_causal_mask_bottom_right(candidate):
    _causal(candidate, 3, 8)  # 3 new queries after 5 cached keys: query 0 is at position 5


@step("causal_mask", points=2)
def test_causal_mask_single_query(candidate):
    _causal(candidate, 1, TK)  # the next token while generating: it sees the whole cache


@step("causal_mask", points=4)
def test_causal_mask_no_future(candidate, rng):
    """A property: with the candidate's mask, changing the last tokens changes no earlier query's output."""
    t, changed = 6, 2
    mask = _bool_mask(candidate.call("causal_mask", t, t).value, t, t)
    q, k, v = (randn(rng, 1, t, d) for d in (D, D, DV))
    later = [x.clone() for x in (q, k, v)]
    for x in later:
        x[:, -changed:] = randn(rng, 1, changed, x.shape[-1])
    before, after = ref.attention(q, k, v, mask)[0], ref.attention(*later, mask)[0]
    if not torch.allclose(before[:, :-changed], after[:, :-changed]):
        row = int((before[0, :-changed] - after[0, :-changed]).abs().sum(-1).argmax())
        mistake = next((m for m in CAUSAL_MISTAKES if m.explains(mask, (t, t))), None)
        raise CheckFailed(
            f"query {row} attended to the future: its output changed when only tokens {t - changed}..{t - 1} changed",
            mistake,
        )


@step("causal_mask", points=3)
def test_causal_mask_device(candidate, device):
    _causal(candidate, TQ, TK, device)  # built on the device it is asked for


# -- padding_mask -------------------------------------------------------------------------

PADDING_MISTAKES = (
    Mistake(
        "padding_mask.inverted",
        "mask convention inverted: True must mark the real tokens (positions < length), not the padding",
        lambda lengths, t: torch.arange(t) >= lengths[:, None],
    ),
    Mistake(
        "padding_mask.off_by_one",
        "off by one: a sequence of length n has real tokens at positions 0 .. n - 1 (position < length)",
        lambda lengths, t: torch.arange(t) <= lengths[:, None],
    ),
    Mistake(
        "padding_mask.max_length",
        "the mask has max(lengths) columns: it must have t, even when every sequence is shorter",
        lambda lengths, t: torch.arange(int(lengths.max())) < lengths[:, None],
    ),
)


def _padding(candidate, lengths, t, device="cpu"):
    value = call_on_device(candidate, device, "padding_mask", lengths, t)
    return expect_mask(value, ref.padding_mask(lengths, t), PADDING_MISTAKES, (lengths, t), device)


@step("padding_mask", points=2)
def test_padding_mask_shape(candidate):
    expect_bool_mask(candidate.call("padding_mask", torch.tensor([4, 2, 6]), TK).value, (B, TK))


@step("padding_mask", points=4)
def test_padding_mask_values(candidate):
    _padding(candidate, torch.tensor([4, 2, 6]), TK)  # every sequence shorter than t


@step("padding_mask", points=4)
def test_padding_mask_empty_and_full(candidate):
    _padding(candidate, torch.tensor([0, TK, 3, 1]), TK)  # a row of no tokens and a row of no padding


@step("padding_mask", points=3)
def test_padding_mask_int32_lengths(candidate):
    _padding(candidate, torch.tensor([4, 2, 6], dtype=torch.int32), TK)


@step("padding_mask", points=3)
def test_padding_mask_device(candidate, device):
    _padding(candidate, torch.tensor([4, 2, 6]), TK, device)


# -- combine_masks ------------------------------------------------------------------------

COMBINE_MISTAKES = (
    Mistake(
        "combine_masks.or",
        "combined with OR: a key may be attended only where BOTH masks allow it (&, logical and)",
        lambda padding, causal: padding[:, None, None, :] | causal,
    ),
    Mistake(
        "combine_masks.padding_on_queries",
        "the padding mask lined up with the query axis: it is per key, so make it (B, 1, 1, Tk)",
        lambda padding, causal: padding[:, None, :, None] & causal,
    ),
    Mistake(
        "combine_masks.no_head_axis",
        "returned (B, Tq, Tk): keep an axis of size 1 for the heads, (B, 1, Tq, Tk), so it broadcasts over them",
        lambda padding, causal: padding[:, None, :] & causal,
    ),
)


def _combine(candidate, padding, causal, device="cpu"):
    args = (padding, causal)
    value = call_on_device(candidate, device, "combine_masks", *args)
    return expect_mask(value, ref.combine_masks(*args), COMBINE_MISTAKES, args, device)


def _decoder_masks(t_q=TQ, t_k=TK, lengths=(TK, 3, 5)):
    return ref.padding_mask(torch.tensor(lengths), t_k), ref.causal_mask(t_q, t_k)


@step("combine_masks", points=2)
def test_combine_masks_shape(candidate):
    expect_bool_mask(candidate.call("combine_masks", *_decoder_masks()).value, (B, 1, TQ, TK))


@step("combine_masks", points=4)
def test_combine_masks_values(candidate):
    _combine(candidate, *_decoder_masks())


@step("combine_masks", points=4)
def test_combine_masks_square(candidate):
    _combine(candidate, *_decoder_masks(6, 6, (6, 2, 4)))  # Tq == Tk: padding on the wrong axis has the right shape


@step("combine_masks", points=3)
def test_combine_masks_any_masks(candidate, rng):
    # masks that are no triangle and no prefix: the function combines what it is given
    _combine(candidate, random_mask(rng, B, TK, keep_first=False), random_mask(rng, TQ, TK, keep_first=False))


@step("combine_masks", points=3)
def test_combine_masks_device(candidate, device):
    _combine(candidate, *_decoder_masks(), device)


# -- attention ----------------------------------------------------------------------------


def attend(q, k, v, mask=None, *, scale_by="d", invert=False, after_softmax=False, dim=-1):
    """Attention without dropout; the keyword arguments make the named wrong variants."""
    width = {"d": q.shape[-1], "dv": v.shape[-1], "none": 1}[scale_by]
    scores = q @ k.transpose(-2, -1) / math.sqrt(width)
    if mask is not None and not after_softmax:
        scores = scores.masked_fill(mask if invert else ~mask, float("-inf"))
    weights = torch.softmax(scores, dim).nan_to_num(0.0)
    if mask is not None and after_softmax:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights


def _has_nan(x, *args):
    return bool(torch.isnan(x.to(torch.float64)).any())


EVAL_MISTAKES = (
    Mistake("attention.mask_inverted", "mask convention inverted: True means 'may attend'; fill where the mask is False",
            lambda q, k, v, mask=None: attend(q, k, v, mask, invert=True)),
    Mistake("attention.unscaled", "scores not scaled: divide q @ kᵀ by √D, D the width of q and k",
            lambda q, k, v, mask=None: attend(q, k, v, mask, scale_by="none")),
    Mistake("attention.scaled_by_value_width", "scaled by √Dv (the width of v): use √D, the width of q and k",
            lambda q, k, v, mask=None: attend(q, k, v, mask, scale_by="dv")),
    Mistake("attention.masked_after_softmax",
            "masked after the softmax: the blocked keys still took their share of the sum; "
            "fill the blocked scores with -inf before the softmax",
            lambda q, k, v, mask=None: attend(q, k, v, mask, after_softmax=True)),
    Mistake("attention.softmax_query_axis", "softmax over the query axis: normalize over the keys, dim=-1",
            lambda q, k, v, mask=None: attend(q, k, v, mask, dim=-2)),
    Mistake("attention.nan_rows",
            "a fully blocked row gives NaN (softmax of all -inf): give it zero weights and a zero output",
            test=_has_nan),
)


def _qkv(rng, dtype=torch.float32, lead=(B, H), tq=TQ, tk=TK):
    return randn(rng, *lead, tq, D, dtype=dtype), randn(rng, *lead, tk, D, dtype=dtype), randn(rng, *lead, tk, DV, dtype=dtype)


def _pair(value, q, v, tk, device="cpu"):
    """The candidate's (output, weights), each a tensor of the right shape, dtype and device."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        got = f"a {type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list)) else (
            value.type_name if isinstance(value, Opaque) else type(value).__name__)
        raise CheckFailed(f"expected a tuple (output, weights), got {got}")
    shapes = (q.shape[:-1] + v.shape[-1:], q.shape[:-1] + (tk,))
    for name, x, shape in zip(("output", "weights"), value, shapes):
        try:
            expect_tensor(x, shape, q.dtype, device)
        except CheckFailed as failure:
            raise CheckFailed(f"{name}: {failure.message}") from None
    return value


def _explains(mistake, value, args) -> bool:
    """Does a mistake explain the whole (output, weights) pair?"""
    if mistake.test is not None:
        return any(mistake.explains(x, args) for x in value)
    parts = [Mistake(mistake.id, mistake.message, lambda *a, i=i: mistake.variant(*a)[i]) for i in range(2)]
    return all(part.explains(x, args) for part, x in zip(parts, value))


def _expect_attention(value, args, kwargs=None, mistakes=EVAL_MISTAKES, device="cpu"):
    """(output, weights) match the reference's; the weights are checked first."""
    q, k, v = args[:3]
    expected = ref.attention(*args, **(kwargs or {}))
    try:
        _pair(value, q, v, k.shape[-2], device)
        for name, i in (("weights", 1), ("output", 0)):
            try:
                if device == "cpu":
                    expect_close(value[i], expected[i])
                else:
                    expect_on_device(value[i], expected[i], device)
            except CheckFailed as failure:
                raise CheckFailed(f"{name}: {failure.message}") from None
    except CheckFailed as failure:
        if isinstance(value, (tuple, list)) and len(value) == 2:
            mistake = next((m for m in mistakes if _explains(m, value, args)), None)
            raise CheckFailed(failure.message, mistake) from None
        raise


def _check_attention(candidate, q, k, v, mask=None, **kwargs):
    _expect_attention(candidate.call("attention", q, k, v, mask, **kwargs).value, (q, k, v, mask), kwargs)


@step("attention", points=2)
def test_attention_shape(candidate, rng):
    q, k, v = _qkv(rng)
    _pair(candidate.call("attention", q, k, v, random_mask(rng, B, H, TQ, TK)).value, q, v, TK)


@step("attention", points=3)
@FLOATS
def test_attention_values(candidate, rng, dtype):
    _check_attention(candidate, *_qkv(rng, dtype), random_mask(rng, B, H, TQ, TK))


@step("attention", points=2)
def test_attention_mask_none(candidate, rng):
    _check_attention(candidate, *_qkv(rng))


@step("attention", points=4)
def test_attention_broadcast_masks(candidate, rng):
    q, k, v = _qkv(rng)
    padding, causal = _decoder_masks()
    for mask in (causal, padding[:, None, None, :], ref.combine_masks(padding, causal)):  # (Tq, Tk), (B, 1, 1, Tk), (B, 1, Tq, Tk)
        _check_attention(candidate, q, k, v, mask)


@step("attention", points=4)
def test_attention_causal_no_future(candidate, rng):
    """A property: with a causal mask, changing the last tokens changes no earlier query's output or weights."""
    t, changed = 6, 2
    mask = ref.causal_mask(t, t)
    first = _qkv(rng, tq=t, tk=t)
    later = [x.clone() for x in first]
    for x in later:
        x[..., -changed:, :] = randn(rng, B, H, changed, x.shape[-1])
    before = _pair(candidate.call("attention", *first, mask).value, first[0], first[2], t)
    after = _pair(candidate.call("attention", *later, mask).value, later[0], later[2], t)
    for name, x, y in zip(("output", "weights"), before, after):
        if not torch.allclose(x[..., :-changed, :], y[..., :-changed, :], rtol=1e-4, atol=1e-5):
            mistake = next((m for m in EVAL_MISTAKES if _explains(m, before, (*first, mask))), None)
            raise CheckFailed(
                f"the {name} of queries 0..{t - changed - 1} changed when only tokens {t - changed}..{t - 1} changed: "
                "they attended to the future", mistake)


@step("attention", points=4)
def test_attention_fully_masked_rows(candidate, rng):
    mask = random_mask(rng, B, 1, TQ, TK)
    mask[0, :, 2] = False  # a padded query row: it may attend to nothing
    mask[1] = False  # a sequence with no tokens at all
    _check_attention(candidate, *_qkv(rng), mask)  # the reference gives those rows zero weights and a zero output


@step("attention", points=2)
def test_attention_any_leading_dims(candidate, rng):
    mask = ref.causal_mask(TQ, TK)
    for lead in [(B,), ()]:  # (B, T, D) without heads, and a single (T, D) sequence
        _check_attention(candidate, *_qkv(rng, lead=lead), mask)


# Dropout: big enough that the zeroed fraction is p within a few thousandths (tolerance 0.03)
P, BIG_LEAD, BIG_TQ, BIG_TK = 0.25, (4, 4), 24, 40
RATE_TOLERANCE = 0.03


@dataclass(frozen=True)
class DropoutFacts:
    """What a training-mode answer did to the live weights (those positive at eval)."""

    zero: float  # fraction that came back 0
    same: float  # fraction that came back unchanged
    scaled: float  # fraction that came back divided by 1 - p
    dead_changed: bool  # a weight that is 0 at eval came back nonzero: not a dropout of the right weights
    output_zero: float  # fraction of the output entries that are exactly 0
    output_is_eval: bool  # the output is the eval weights @ v


def _dropout_facts(weights, eval_weights, output, v, p=P) -> DropoutFacts:
    w, e = weights.to(torch.float64), eval_weights.to(torch.float64)
    live = e > 0
    n = max(int(live.sum()), 1)

    def fraction(hit):
        return int((hit & live).sum()) / n

    return DropoutFacts(
        zero=fraction(w == 0),
        same=fraction(torch.isclose(w, e, rtol=1e-4, atol=1e-7)),
        scaled=fraction(torch.isclose(w, e / (1 - p), rtol=1e-4, atol=1e-7)),
        dead_changed=bool(((w != 0) & ~live).any()),
        output_zero=float((output == 0).to(torch.float64).mean()),
        output_is_eval=torch.allclose(output.to(torch.float64), e @ v.to(torch.float64), rtol=1e-4, atol=1e-5),
    )


def _dropout_mistake(id_, message, when):
    """A named dropout mistake: `when` reads the facts of the answer (weights, eval weights, output, v, p)."""
    return Mistake(id_, message, test=lambda w, e, out, v, p=P: (lambda f: not f.dead_changed and when(f))(
        _dropout_facts(w, e, out, v, p)))


DROPOUT_AT_EVAL = _dropout_mistake(
    "attention.dropout_at_eval",
    "dropout applied while not training: at eval (training=False) dropout does nothing, whatever dropout_p says",
    lambda f: f.zero > 0 and (f.zero + f.scaled > 0.999 or f.zero + f.same > 0.999),
)
NO_DROPOUT = _dropout_mistake(
    "attention.no_dropout_in_training",
    "no weight was dropped while training: with training=True, zero each weight with probability dropout_p",
    lambda f: f.same > 0.999 and f.output_is_eval,
)
ON_OUTPUT = _dropout_mistake(
    "attention.dropout_on_output",
    "dropout applied to the output instead of the attention weights: drop weights, then multiply by v",
    lambda f: f.same > 0.999 and abs(f.output_zero - P) < 0.1,
)
UNDROPPED_RETURNED = _dropout_mistake(
    "attention.returned_undropped_weights",
    "returned the weights from before dropout: return the dropped weights, the ones multiplied with v",
    lambda f: f.same > 0.999 and not f.output_is_eval and f.output_zero < P / 2,
)
NO_RESCALE = _dropout_mistake(
    "attention.dropout_no_rescale",
    "the kept weights were not rescaled: divide them by 1 - dropout_p, so the expected output stays the same",
    lambda f: f.zero > 0 and f.zero + f.same > 0.999,
)
KEEP_PROB = _dropout_mistake(
    "attention.dropout_keep_prob",
    "about 1 - p of the weights were zeroed: dropout_p is the probability to DROP a weight, not to keep it",
    lambda f: abs(f.zero - (1 - P)) < RATE_TOLERANCE,
)
DROPOUT_MISTAKES = (NO_DROPOUT, ON_OUTPUT, UNDROPPED_RETURNED, NO_RESCALE, KEEP_PROB)
GENERATOR_IGNORED = Mistake(
    "attention.generator_ignored",
    "the dropout ignored `generator`: draw the mask with torch.rand(..., generator=generator) or "
    "torch.bernoulli(..., generator=generator); F.dropout cannot take one",
)


def _training(candidate, rng, dtype=torch.float32, generator="seeded", device="cpu"):
    """A big training-mode call; returns the candidate's (output, weights), the eval weights and v."""
    q, k, v = _qkv(rng, dtype, BIG_LEAD, BIG_TQ, BIG_TK)
    mask = random_mask(rng, *BIG_LEAD, BIG_TQ, BIG_TK)
    gen = _seed(rng) if generator == "seeded" else None
    kwargs = {"dropout_p": P, "training": True, "generator": gen}
    value = call_on_device(candidate, device, "attention", q, k, v, mask, **kwargs)
    output, weights = _pair(value, q, v, BIG_TK, device)
    return output, weights, ref.attention(q, k, v, mask)[1], v


def _fail(message, weights, eval_weights, output, v, mistakes=DROPOUT_MISTAKES):
    """A failed dropout property, with the first dropout mistake the answer's facts show."""
    mistake = next((m for m in mistakes if m.explains(weights, (eval_weights, output, v))), None)
    raise CheckFailed(message, mistake)


@step("attention", points=3)
def test_attention_dropout_eval_is_identity(candidate, rng):
    q, k, v = _qkv(rng)
    mask = random_mask(rng, B, H, TQ, TK)
    value = candidate.call("attention", q, k, v, mask, dropout_p=0.5, training=False, generator=_seed(rng)).value
    expected = ref.attention(q, k, v, mask)  # no dropout at all
    try:
        _expect_attention(value, (q, k, v, mask))
    except CheckFailed as failure:
        try:
            output, weights = _pair(value, q, v, TK)
        except CheckFailed:
            raise failure from None
        at_eval = DROPOUT_AT_EVAL.explains(weights, (expected[1], output, v, 0.5))
        raise CheckFailed(failure.message, failure.mistake or (DROPOUT_AT_EVAL if at_eval else None)) from None


def _expect_kept_weights(output, weights, eval_weights, v, tolerances=(1e-4, 1e-7)):
    """Every weight is 0 or its eval value / (1 - p), and some are 0."""
    w, e = weights.to(torch.float64), eval_weights.to(torch.float64)
    rtol, atol = tolerances
    bad = (w != 0) & ~torch.isclose(w, e / (1 - P), rtol=rtol, atol=atol)
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        _fail(f"weight {where} is {w[where].item():.6g}; in training each weight must be 0 or its eval value / (1 - p) = "
              f"{e[where].item() / (1 - P):.6g} (p = {P})", weights, eval_weights, output, v)
    if not ((w == 0) & (e > 0)).any():
        _fail("no weight was dropped in training", weights, eval_weights, output, v)


@step("attention", points=5)
def test_attention_dropout_kept_weights(candidate, rng):
    _expect_kept_weights(*_training(candidate, rng, torch.float64))


@step("attention", points=4)
def test_attention_dropout_rate(candidate, rng):
    output, weights, eval_weights, v = _training(candidate, rng)
    live = eval_weights > 0
    rate = int(((weights == 0) & live).sum()) / int(live.sum())
    if abs(rate - P) > RATE_TOLERANCE:
        _fail(f"{rate:.3f} of the weights were zeroed in training; expected about dropout_p = {P} (± {RATE_TOLERANCE})",
              weights, eval_weights, output, v)


@step("attention", points=3)
def test_attention_dropout_output_uses_returned_weights(candidate, rng):
    output, weights, eval_weights, v = _training(candidate, rng, generator=None)  # no generator: torch's global RNG
    expected = weights.to(torch.float64) @ v.to(torch.float64)
    error = (output.to(torch.float64) - expected).abs().nan_to_num(nan=float("inf"))
    if not (error <= 1e-5 + 1e-4 * expected.abs()).all():  # float32 tolerances
        where = tuple(int(i) for i in torch.unravel_index(error.argmax(), error.shape))
        _fail(f"the output is not the returned weights @ v: max abs error {error.max().item():.3g} at {where} "
              f"(weights @ v gives {expected[where].item():.6g}, the output is {output[where].item() + 0.0:.6g})",
              weights, eval_weights, output, v)


@step("attention", points=3)
def test_attention_dropout_reproducible(candidate, rng):
    """The same generator seed gives the same dropout; another seed another one."""
    q, k, v = _qkv(rng, lead=BIG_LEAD, tq=BIG_TQ, tk=BIG_TK)
    seed = _seed(rng)

    def weights(generator):
        value = candidate.call("attention", q, k, v, None, dropout_p=P, training=True, generator=generator).value
        return _pair(value, q, v, BIG_TK)[1]

    first, again, other = weights(seed), weights(seed), weights(Seeded(seed.seed + 1))
    if not torch.equal(first, again):
        raise CheckFailed("two calls with generators seeded alike gave different weights", GENERATOR_IGNORED)
    if torch.equal(first, other):
        raise CheckFailed("generators seeded differently gave the same weights: the dropout must be random")


@step("attention", points=2)
def test_attention_rules(candidate, rng, forbidden):
    q, k, v = _qkv(rng)
    mask = random_mask(rng, B, H, TQ, TK)
    answer = candidate.call("attention", q, k, v, mask)
    expect_allowed(answer, forbidden)
    _expect_attention(answer.value, (q, k, v, mask))  # no points for a rule kept by garbage


@step("attention", points=2)
def test_attention_device(candidate, rng, device):
    q, k, v = _qkv(rng)
    mask = random_mask(rng, B, 1, TQ, TK)
    _expect_attention(call_on_device(candidate, device, "attention", q, k, v, mask), (q, k, v, mask), device=device)


@step("attention", points=2)
def test_attention_dropout_device(candidate, rng, device):
    """Dropout in training on the device: the mask must be drawn there (with the generator made for it)."""
    output, weights, eval_weights, v = _training(candidate, rng, device=device)
    if device != "meta":  # another device sums in another order
        _expect_kept_weights(output, weights, eval_weights, v, tolerances=(1e-3, 1e-4))
