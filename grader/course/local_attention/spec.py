"""The checks of `local_attention`: the sliding-window mask, ALiBi's slopes and bias, and attention with both.

Masks are compared exactly. The slopes are checked against their definition (`slopes`, written
here from the paper's text, independent of the reference) for every head count from 1 to 16 and 40.
ALiBi's bias is graded only at or before each query (the entries after it are masked
away in attention, so any value there is right): its step compares through
`_causal_part`, since the engine's closeness compare has no notion of entries that do not
count. Attention with ALiBi is also checked as a property: its output must equal the
attention computed here, independently, with the bias shifted by a constant per row
(BLOOM's slope·j plus a random constant), which a softmax cannot tell apart. The slopes
given to attention are those of 4 heads (powers of two), so the bias is exact in every
dtype.
"""

import math

import torch

from grader.engine import (
    ALWAYS,
    ON_META,
    RESULT_ON_CPU,
    Call,
    CheckFailed,
    Mistake,
    Spec,
    StepSpec,
    Tolerance,
    as_tensor_tree,
    attention,
    device,
    device_of,
    expect_close,
    prop,
    rules,
    shape,
    values,
)
from solutions import local_attention as ref

FLOATS = (torch.float32, torch.float64)
HALF = (torch.float16, torch.bfloat16)
B, H, TQ, TK, D = 2, 4, 5, 9, 8  # batch, heads, query and key tokens (a KV cache of 4 before the queries), head width
WINDOW = 3


def _positions(t_q, t_k, top_left=False):
    """(p, j): each query's position (t_q, 1) and each key's (1, t_k); bottom-right unless top_left."""
    start = 0 if top_left else t_k - t_q
    return torch.arange(start, start + t_q)[:, None], torch.arange(t_k)[None, :]


# -- sliding_window_mask ------------------------------------------------------------------


def mask_inputs(gen, dtype, t_q=TQ, t_k=TK, window=WINDOW):
    return Call((t_q, t_k, window), names=("t_q", "t_k", "window"))


def window_mask(t_q, t_k, window, device=None, *, extra=0, top_left=False, two_sided=False, causal=True,
                forward=False):
    """The sliding-window mask; the keyword arguments after * make the named wrong variants."""
    p, j = _positions(t_q, t_k, top_left)
    if forward:  # p <= j < p + window: the query and the keys after it
        return (j >= p) & (j < p + window)
    if two_sided:  # |p - j| <= window: 2·window + 1 keys, the future included
        return (p - j).abs() <= window
    keep = j > p - window - extra
    return keep & (j <= p) if causal else keep


def _mask_variant(**wrong):
    return lambda t_q, t_k, window, device=None: window_mask(t_q, t_k, window, **wrong)


def keys_per_row(run):
    """Each row sees min(p + 1, window) keys, p the query's position."""
    for t_q, t_k, window in ((6, 10, 3), (4, 4, 6), (7, 7, 2)):
        call = mask_inputs(run.gen, None, t_q, t_k, window)
        mask = run.output(run.answer(call))
        run.expect_form(mask, call)
        got = mask.to(torch.int64).sum(-1)
        want = torch.clamp(torch.arange(t_k - t_q, t_k) + 1, max=window)
        if not torch.equal(got, want):
            row = int((got != want).nonzero()[0])
            raise CheckFailed(f"sliding_window_mask({t_q}, {t_k}, window={window}): query {row} (position "
                              f"{t_k - t_q + row}) sees {int(got[row])} keys; it must see min(p + 1, window) = "
                              f"{int(want[row])}", run.explain(mask, call))


def wide_window_is_causal(run):
    """A window of t_k keys or more is the plain causal mask, bottom-right aligned."""
    t_q, t_k = 4, 7
    causal = torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q)
    for window in (t_k, t_k + 1, 10 * t_k):
        call = mask_inputs(run.gen, None, t_q, t_k, window)
        mask = run.output(run.answer(call))
        run.expect_form(mask, call)
        if not torch.equal(mask, causal):
            raise CheckFailed(f"sliding_window_mask({t_q}, {t_k}, window={window}) is not the causal mask: a window of "
                              "t_k keys or more leaves only causality", run.explain(mask, call))


def mask_on_device(run):
    """sliding_window_mask(t_q, t_k, window, device) builds the mask on the device asked for."""
    where = run.ctx.device
    call = Call((TQ, TK, WINDOW, where), names=("t_q", "t_k", "window", "device"))
    value = run.output(run.answer(call, device=where))
    got = device_of(value) if isinstance(value, torch.Tensor) else where
    if got.split(":")[0] != where.split(":")[0]:
        raise CheckFailed(f"expected the mask on {where}, the device asked for, got it on {got}", RESULT_ON_CPU)
    run.expect_right(value, mask_inputs(run.gen, None), where)


def mask_reference(t_q, t_k, window, device=None):
    """The reference, made on the CPU (a device asked for is where the worker puts the mask when it answers
    local_attention's call to sliding_window_mask; the checks compare on the CPU)."""
    return ref.sliding_window_mask(t_q, t_k, window)


WINDOW_PLUS_ONE = ("window + 1 keys per row (j >= p - window, or triu(diagonal=offset - window)): keep the keys "
                   "p - window < j <= p")
WINDOW_PLUS_ONE_WHY = "The window counts the query itself: a row sees at most `window` keys."
BIDIRECTIONAL = ("a two-sided window |p - j| <= window, the future included: keep the `window` most recent keys up to "
                 "the query, p - window < j <= p")
BIDIRECTIONAL_WHY = "A two-sided window sees 2·window + 1 keys; the sliding window is causal."
TOP_LEFT = "aligned to the top-left (query i at position i): place query i at p = t_k - t_q + i"
TOP_LEFT_WHY = "With t_q < t_k the queries are the last t_q positions."

MASK = StepSpec(
    "sliding_window_mask", mask_inputs, mask_reference,
    checks=(
        shape(2), values("square", 4, t_q=8, t_k=8), values("bottom_right", 5, t_q=3, t_k=9, window=4),
        prop("keys_per_row", 4, keys_per_row), prop("wide_window_is_causal", 4, wide_window_is_causal),
        values("window_one", 2, window=1), values("single_query", 2, t_q=1, window=4),
        prop("device", 2, mask_on_device, gated=ON_META),
    ),
    mistakes=(
        Mistake("sliding_window_mask.window_plus_one", WINDOW_PLUS_ONE, _mask_variant(extra=1),
                why=WINDOW_PLUS_ONE_WHY),
        Mistake("sliding_window_mask.window_minus_one", "window - 1 keys per row (j > p - window + 1): keep the keys "
                "p - window < j <= p", _mask_variant(extra=-1),
                why="The window counts the query itself: a row far enough in sees exactly `window` keys."),
        Mistake("sliding_window_mask.bidirectional", BIDIRECTIONAL, _mask_variant(two_sided=True),
                why=BIDIRECTIONAL_WHY),
        Mistake("sliding_window_mask.not_causal", "only the window's far edge was applied: keys after the query are "
                "allowed; keep j <= p too (the causal part)", _mask_variant(causal=False)),
        Mistake("sliding_window_mask.top_left", TOP_LEFT, _mask_variant(top_left=True), why=TOP_LEFT_WHY),
        Mistake("sliding_window_mask.points_forward", "the window points forward (p <= j < p + window, the query and "
                "future keys): keep the `window` most recent keys, p - window < j <= p",
                _mask_variant(forward=True)),
        Mistake("sliding_window_mask.inverted", "mask convention inverted: True must mean 'may attend'",
                lambda t_q, t_k, window, device=None: ~ref.sliding_window_mask(t_q, t_k, window)),
    ),
)

# -- alibi_slopes -------------------------------------------------------------------------


def slopes_inputs(gen, dtype, h=8):
    return Call((h,), names=("num_heads",))


def _powers(n, first=1):
    return [2 ** (-8 * h / n) for h in range(first, first + n)]


def slopes(n, *, extra="every_other", first=1, extra_first=False):
    """The slopes of n heads, from their definition: for n a power of two, 2^(-8h/n) for h = 1 .. n; otherwise those
    of p, the largest power of two below n, then every other slope of 2p, the first n - p of them. The keyword
    arguments after * make the named wrong variants."""
    if extra == "direct":  # 2^(-8h/n) whatever n is
        return torch.tensor(_powers(n, first), dtype=torch.float32)
    p = 2 ** math.floor(math.log2(n))
    more = _powers(2 * p, first)
    pick = {"every_other": more[0::2], "consecutive": more, "odd": more[1::2]}[extra][: n - p]
    return torch.tensor(pick + _powers(p, first) if extra_first else _powers(p, first) + pick, dtype=torch.float32)


def every_head_count(run):
    """Every head count from 1 to 16, 40, and one from 17 to 200 but 40 drawn with inputs.Gen.unknown: a
    table of the slopes of the counts a check once asked passes no count it has not seen."""
    drawn = int(torch.randint(17, 200, (), generator=run.gen.unknown))
    drawn += drawn >= 40  # 40 is asked anyway
    for h in dict.fromkeys((*range(1, 17), 40, drawn)):
        call = slopes_inputs(run.gen, None, h)
        value = run.output(run.answer(call))
        run.expect_form(value, call)
        try:
            expect_close(value, slopes(h), call, Tolerance(1e-6, 1e-9))
        except CheckFailed as failure:
            raise CheckFailed(f"alibi_slopes({h}) is not the paper's get_slopes({h}): {failure.message}",
                              run.explain(value, call), failure.details) from None


def _next_power_of_two(n):
    """The slopes with p rounded up to a power of two (math.ceil for floor), in the forms such code returns them: all
    p, the first n, or with the extra slopes' slice [: n - p] gone negative."""
    p = 2 ** math.ceil(math.log2(n))
    if p == n:
        return None
    forms = (_powers(p) + _powers(2 * p)[0::2][: n - p], _powers(p)[:n], _powers(p))
    return [torch.tensor(f, dtype=torch.float32) for f in forms]


NON_POWER_OF_TWO = ("slopes 2^(-8h/H) for an H that is no power of two: take those of p, the largest power of two "
                    "below H, then get_slopes(2p)[0::2][:H - p]")

SLOPES = StepSpec(
    "alibi_slopes", slopes_inputs, ref.alibi_slopes,
    checks=(
        shape(2), values("power_of_two", 3), values("non_power_of_two", 4, h=12), values("forty_heads", 3, h=40),
        prop("every_head_count", 8, every_head_count),
    ),
    mistakes=(
        Mistake("alibi_slopes.non_power_of_two_formula", NON_POWER_OF_TWO, lambda n: slopes(n, extra="direct"),
                why="The paper's get_slopes: the slopes of p, then the first H - p of every other slope of 2p."),
        Mistake("alibi_slopes.from_zero", "the exponents start at h = 0 (a first slope of 1): the slopes are "
                "2^(-8h/H) for h = 1 .. H, the first 2^(-8/H)", lambda n: slopes(n, first=0)),
        Mistake("alibi_slopes.consecutive_extra", "the extra slopes for an H that is no power of two were the first "
                "H - p slopes of 2p: take every other one, get_slopes(2p)[0::2][:H - p]",
                lambda n: slopes(n, extra="consecutive"), why="Every other slope of 2p falls between the slopes of p."),
        Mistake("alibi_slopes.repeated_extra", "the extra slopes were get_slopes(2p)[1::2]: those repeat the slopes "
                "of p (2^(-8·2k/2p) = 2^(-8k/p)); take get_slopes(2p)[0::2][:H - p]", lambda n: slopes(n, extra="odd")),
        Mistake("alibi_slopes.next_power_of_two", "p was rounded up to the next power of two (math.ceil): p is the "
                "largest power of two at most H, 2 ** floor(log2(H))", _next_power_of_two),
        Mistake("alibi_slopes.extra_first", "the extra slopes for a non-power-of-two H came first: head h must get "
                "the h-th slope of get_slopes(p) + get_slopes(2p)[0::2][:H - p], the extra ones after those of p",
                lambda n: slopes(n, extra_first=True)),
    ),
)

# -- alibi_bias ---------------------------------------------------------------------------


def bias_inputs(gen, dtype, h=H, t_q=TQ, t_k=TK, paper=False):
    s = ref.alibi_slopes(h) if paper else gen.randn(h).abs().to(torch.float32) + 0.05
    return Call((s, t_q, t_k), names=("slopes", "t_q", "t_k"))


def bias(slopes, t_q, t_k, *, sign=-1, top_left=False, row_shift=False):
    """alibi_bias; the keyword arguments after * make the named wrong variants."""
    p, j = _positions(t_q, t_k, top_left)
    slopes = slopes.to(torch.float32)[:, None, None]
    if row_shift:  # BLOOM's slope·j, or -slope·(t_k - 1 - j): the right bias plus a constant in every row
        key_only = j.to(torch.float32) if row_shift != "last_key" else -(t_k - 1 - j).to(torch.float32)
        return (slopes * key_only).expand(-1, t_q, -1).contiguous()
    return sign * slopes * (p - j).to(torch.float32)


def _bias_variant(**wrong):
    return lambda slopes, t_q, t_k: bias(slopes, t_q, t_k, **wrong)


def _causal_part(value, expected, call=None, tolerance=None, outputs=()):
    """Compares the bias at or before each query only (j <= p): the entries after it are not graded."""
    got = as_tensor_tree(value)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise CheckFailed(f"expected shape {tuple(expected.shape)}, got {shape}")
    t_q, t_k = expected.shape[-2:]
    graded = torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q)
    expect_close(torch.where(graded, got.to(expected.dtype), 0.0), torch.where(graded, expected, 0.0), call, tolerance)


BIAS_SIGN = ("the bias has the wrong sign: it is -slope·(p - j), a penalty that grows with the distance back, so "
             "nearer keys score higher")

BIAS = StepSpec(
    "alibi_bias", bias_inputs, ref.alibi_bias, compare=_causal_part,
    checks=(
        shape(2), values("square", 4, t_q=6, t_k=6), values("bottom_right", 5), values("single_query", 3, t_q=1),
        values("paper_slopes", 4, h=12, paper=True), device(2),
    ),
    mistakes=(
        Mistake("alibi_bias.wrong_sign", BIAS_SIGN, _bias_variant(sign=1)),
        Mistake("alibi_bias.top_left", TOP_LEFT, _bias_variant(top_left=True), why=TOP_LEFT_WHY),
        Mistake("alibi_bias.shifted_per_row", "the bias depends on the key alone "
                "(BLOOM's slope·j, or -slope·(t_k - 1 - j)): use -slope·(p - j), 0 at the query's own position",
                lambda *a: [bias(*a, row_shift=form) for form in (True, "last_key")],
                why="The softmax cannot tell it from the right one, but the contract asks for -slope·(p - j)."),
    ),
)

# -- local_attention ----------------------------------------------------------------------


def local_inputs(gen, dtype, t_q=TQ, t_k=TK, window=None, alibi=False):
    q, k, v = (gen.randn(B, H, t, D, dtype=dtype) for t in (t_q, t_k, t_k))
    kwargs = {"window": window, "slopes": ref.alibi_slopes(H) if alibi else None}
    return Call((q, k, v), kwargs, ("q", "k", "v"))


def attend(q, k, v, window=None, slopes=None, *, extra=0, top_left=False, two_sided=False, causal=True, sign=-1,
           none_as_tq=False, bias_masked=False, twice=False, **wrong):
    """local_attention: the window's mask and ALiBi's bias, then attention.attend; the keyword arguments after * make
    the named wrong variants (those not named here go to attention.attend)."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    if none_as_tq and window is None:  # "no window" read as a window of Tq keys
        window = t_q
    if window is not None:
        mask = window_mask(t_q, t_k, window, extra=extra, top_left=top_left, two_sided=two_sided)
    else:
        mask = window_mask(t_q, t_k, t_k, top_left=top_left) if causal else None
    b = None if slopes is None else bias(slopes, t_q, t_k, sign=sign).to(q.dtype)
    if b is not None and mask is not None and bias_masked:  # the bias zeroed where the mask (or causality) blocks
        b = b.masked_fill(~(window_mask(t_q, t_k, t_k) if bias_masked == "causal" else mask), 0.0)
    if twice and b is not None:  # the whole bias on the scores, and `b` on the weights as well
        whole = bias(slopes, t_q, t_k).to(q.dtype)
        return (attention.weights(q, k, mask, bias=whole) + b) @ v
    return attention.attend(q, k, v, mask, bias=b, **wrong)


def _variant(**wrong):
    return lambda q, k, v, window=None, slopes=None: attend(q, k, v, window, slopes, **wrong)


def either_bias_precision(value, expected, call, tolerance=None, outputs=()):
    """The answer, against the reference (its bias alibi_bias's, float32) or, for float64 inputs with slopes, the same
    attention with the bias computed in float64: both are right (a bias of one's own in q's dtype is as good as
    alibi_bias's), and a softmax in float32 is neither. A failure says what the reference comparison said."""
    try:
        expect_close(value, expected, call, tolerance, outputs)
        return
    except CheckFailed as failure:
        first = failure
    q, k, v = call.args
    slopes, window = call.kwargs.get("slopes"), call.kwargs.get("window")
    if slopes is None or q.dtype != torch.float64:
        raise first
    t_q, t_k = q.shape[-2], k.shape[-2]
    p, j = _positions(t_q, t_k, False)
    exact = -slopes.to(torch.float64)[:, None, None] * (p - j).to(torch.float64)  # (H, Tq, Tk), in q's dtype
    mask = window_mask(t_q, t_k, t_k if window is None else window)
    try:
        expect_close(value, attention.attend(q, k, v, mask, bias=exact), call, tolerance, outputs)
    except CheckFailed:
        raise first from None


def shifted_bias(run):
    """The output with ALiBi equals attention computed here with the bias shifted by a constant per row."""
    call = run.inputs(window=WINDOW, alibi=True)
    value = run.output(run.answer(call))
    run.expect_form(value, call)
    q, k, v = (x.to(torch.float64) for x in call.args)
    slopes = call.kwargs["slopes"].to(torch.float64)[:, None, None]
    p, j = _positions(TQ, TK)
    shift = torch.as_tensor(run.gen.randn(H, TQ, 1, dtype=torch.float64, scale=5.0))  # any constant per row
    scores = q @ k.transpose(-2, -1) / math.sqrt(D) + slopes * j + shift  # BLOOM's slope·j = -slope·(p - j) + slope·p
    scores = scores.masked_fill(~((j <= p) & (j > p - WINDOW)), float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v
    try:
        expect_close(value, expected, call, Tolerance(1e-4, 1e-5))
    except CheckFailed as failure:
        raise CheckFailed(f"with the ALiBi bias shifted by a constant per row (which a softmax cannot see) the output "
                          f"differs: {failure.message}", run.explain(value, call), failure.details) from None


def decode_matches_prefill(run):
    """The last queries alone, after a cache of keys, get the outputs the same queries get in the full sequence."""
    full = run.inputs(t_q=TK, t_k=TK, window=WINDOW, alibi=True)
    q, k, v = full.args
    last = Call((q[:, :, -2:].contiguous(), k, v), full.kwargs, full.names)
    whole, tail = (run.output(run.answer(c)) for c in (full, last))
    run.expect_form(whole, full)
    run.expect_form(tail, last)
    try:
        expect_close(tail, whole[:, :, -2:], last, Tolerance(1e-4, 1e-5))
    except CheckFailed as failure:
        raise CheckFailed("the last 2 queries after 7 cached keys (t_q = 2, t_k = 9) did not get the outputs they get "
                          f"in the full sequence (t_q = t_k = 9): {failure.message}", run.explain(tail, last),
                          failure.details) from None


LOCAL = StepSpec(
    "local_attention", local_inputs, ref.local_attention, answered=("sliding_window_mask", "alibi_bias"),
    compare=either_bias_precision,
    checks=(
        shape(2, window=WINDOW, alibi=True), values("values", 3, FLOATS, window=WINDOW, alibi=True),
        values("causal", 3), values("window", 4, window=WINDOW), values("alibi", 4, alibi=True),
        values("wide_window", 2, window=TK + 3, alibi=True),
        prop("shifted_bias", 4, shifted_bias), prop("decode_matches_prefill", 4, decode_matches_prefill, gated=ALWAYS),
        values("half", 1, HALF, window=WINDOW, alibi=True), rules(2, window=WINDOW, alibi=True),
        device(2, window=WINDOW, alibi=True),
    ),
    mistakes=(
        Mistake("local_attention.window_plus_one", WINDOW_PLUS_ONE, _variant(extra=1), why=WINDOW_PLUS_ONE_WHY),
        Mistake("local_attention.bidirectional", BIDIRECTIONAL, _variant(two_sided=True), why=BIDIRECTIONAL_WHY),
        Mistake("local_attention.top_left", TOP_LEFT, _variant(top_left=True), why=TOP_LEFT_WHY),
        Mistake("local_attention.not_causal", "with window=None no mask was applied: the attention is still causal; "
                "use the causal mask (sliding_window_mask with a window of Tk)", _variant(causal=False)),
        Mistake("local_attention.bias_sign", BIAS_SIGN, _variant(sign=1)),
        Mistake("local_attention.bias_after_softmax", "the ALiBi bias was added to the weights after the softmax "
                "(whole, or zeroed where the mask blocks): add it to the scores before the softmax "
                "(and before the mask)", lambda *a, **k: [attend(*a, **k, bias_at="weights", bias_masked=masked)
                                                          for masked in (False, True, "causal")]),
        Mistake("local_attention.bias_added_twice", "the ALiBi bias was added to the weights after the softmax as "
                "well as to the scores: add it once, to the scores before the softmax",
                lambda *a, **k: [attend(*a, **k, twice=True, bias_masked=masked)
                                 for masked in (False, True, "causal")]),
        Mistake("local_attention.unscaled", "scores not scaled: divide q @ kᵀ by √D", _variant(width=1)),
        Mistake("local_attention.window_defaults_to_tq", "with window=None the window was Tq: None means no window, "
                "plain causal attention over all the keys; with Tq < Tk the queries lost the earliest keys",
                _variant(none_as_tq=True)),
        Mistake("local_attention.bias_scaled", "the ALiBi bias was divided by √D with the scores "
                "(added before the scaling): scale q @ kᵀ first, then add the bias at full strength",
                _variant(bias_at="unscaled_scores")),
    ),
)

SPEC = Spec((MASK, SLOPES, BIAS, LOCAL))
