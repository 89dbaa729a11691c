"""The checks of `rope`: frequencies, cos/sin tables, rotate_half, both layouts, and the module.

Positions have gaps (never 0, 1, 2, ... alone), so code that ignores them is caught even
though RoPE is invariant to a shift of every position. Long checks go up to position 8192
in bfloat16: the angles must be float32 there. Two correct float32 ways of computing θ
(1 / base**x and exp(-log(base)·x)) differ by about 5e-4 in cos at 8192, so every
comparison that involves angles allows an extra error that grows with the largest
position (`ANGLE_ERROR` per unit of position, times the size of what is rotated): a
half-precision angle is wrong by far more. Each layout's step is also compared against the
other layout, so the wrong layout is named as exactly that.

The engine has no tolerance that depends on the inputs, so the steps that take positions
have their own `compare`, which widens the engine's tolerance and then compares as it does.
"""

import torch

from grader.engine import (
    ALWAYS,
    Call,
    CheckFailed,
    Mistake,
    Spec,
    StepSpec,
    Tolerance,
    attention,
    defaults,
    device,
    end_to_end,
    expect_close,
    gradients,
    linear_layers,
    matches_any,
    prop,
    raises_value_error,
    shape,
    values,
)
from solutions import rope as ref

B, H, T, DH = 2, 2, 6, 8  # batch, heads, tokens, head width
D = H * DH  # model width
LOW = (torch.float32, torch.bfloat16)  # the rotation is computed in float32: a float64 answer is not graded
ANGLE_ERROR = 4e-7  # allowed error per unit of the largest position, per unit of the rotated values' size
SHIFT = 1000  # the shift of every position in the shift-invariance check


def positions_with_gaps(gen, long=False, zero=False):
    """T sorted distinct positions with gaps (0 and 8192 among them when long), never arange(T)."""
    if zero:
        return torch.zeros(T, dtype=torch.int64)
    top = 8193 if long else 40
    picked = torch.randperm(top, generator=gen.rng)[:T].sort().values
    if long:
        picked[0], picked[-1] = 0, 8192
    if torch.equal(picked, torch.arange(T)):
        picked = picked * 3
    return picked


def _positions(call: Call):
    found = [a for a in (*call.args, *call.kwargs.values()) if isinstance(a, torch.Tensor) and not a.is_floating_point()
             and a.dtype != torch.bool]
    return found[0] if found else torch.arange(T)


def angle_compare(value, expected, call, tolerance=None, outputs=()):
    """expect_close, with an extra absolute error of ANGLE_ERROR · max position · max |expected|."""
    tolerance = tolerance or Tolerance(1e-4, 1e-5)
    parts = expected if isinstance(expected, tuple) else (expected,)
    size = max(float(p.abs().max()) for p in parts if p.numel())
    extra = ANGLE_ERROR * float(_positions(call).abs().max()) * max(size, 1.0)
    expect_close(value, expected, call, Tolerance(tolerance.rtol, tolerance.atol + extra, tolerance.slack), outputs)


def _in_dtype(fn):
    """A wrong variant computed in float32 and returned in x's dtype (its first argument's)."""
    def wrapped(x, *args, **kwargs):
        return fn(x.float(), *args, **kwargs).to(x.dtype)
    return wrapped


# -- rope_frequencies ---------------------------------------------------------------------


def frequency_inputs(gen, dtype, head_dim=DH, base=None):
    return Call((head_dim,), {} if base is None else {"base": base}, ("head_dim",))


def frequencies(head_dim, base=10000.0, *, exponent="2i/d"):
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    powers = {"2i/d": 2 * i / head_dim, "i/d": i / head_dim, "-2i/d": -2 * i / head_dim, "2i//d": 2 * i // head_dim,
              "(2i+2)/d": (2 * i + 2) / head_dim, "linspace": torch.linspace(0, 1, head_dim // 2, dtype=torch.float64)}
    power = powers[exponent]
    return (base ** -power).to(torch.float32)


def drawn_sizes(run):
    """A head_dim and a base drawn with inputs.Gen.unknown: a table of the frequencies of the sizes
    a check once asked passes no size it has not seen."""
    head_dim = 2 * int(torch.randint(9, 257, (), generator=run.gen.unknown))
    base = float(torch.randint(1_000, 1_000_001, (), generator=run.gen.unknown))
    call = frequency_inputs(run.gen, None, head_dim, base)
    value = run.output(run.answer(call))
    try:
        run.expect_right(value, call)
    except CheckFailed as failure:
        raise CheckFailed(f"rope_frequencies({head_dim}, base={base:g}): {failure.message}", failure.mistake,
                          failure.details) from None


FREQUENCIES = StepSpec(
    "rope_frequencies", frequency_inputs, frequencies,
    checks=(shape(2), values("values", 2), values("head_dim_128", 2, head_dim=128),
            values("base_500000", 1, base=500000.0), prop("drawn_sizes", 3, drawn_sizes)),
    mistakes=(
        Mistake("rope_frequencies.i_over_d", "θᵢ = base^(−i/d): the exponent is 2i/d, i over the pairs "
                "(or arange(0, d, 2) / d), so the slowest pair turns at about 1/base",
                lambda d, base=10000.0: frequencies(d, base, exponent="i/d")),
        Mistake("rope_frequencies.exponent_sign", "θᵢ = base^(+2i/d): the frequencies fall, θᵢ = base^(−2i/d) = 1 / "
                "base^(2i/d)", lambda d, base=10000.0: frequencies(d, base, exponent="-2i/d")),
        Mistake("rope_frequencies.pair_index_from_one", "the pairs were counted from 1 (arange(2, d + 1, 2)): pair i "
                "counts from 0, θ₀ = 1 and θᵢ = base^(−2i/d)", lambda d, base=10000.0: frequencies(d, base,
                                                                                     exponent="(2i+2)/d")),
        Mistake("rope_frequencies.linspace_endpoint", "the exponents came from linspace(0, 1, d/2), which ends at 1: "
                "use arange(0, d, 2) / d, ending at 1 − 2/d",
                lambda d, base=10000.0: frequencies(d, base, exponent="linspace"),
                why="The exponents are 2i/d for the pairs i = 0 … d/2 − 1: evenly spaced, but short of 1."),
        Mistake("rope_frequencies.integer_division", "every θᵢ is 1: the exponent 2i/d was an integer division (//), "
                "which is 0 for every pair; divide as floats, torch.arange(0, d, 2).float() / d",
                lambda d, base=10000.0: frequencies(d, base, exponent="2i//d")),
    ),
)

# -- rope_cos_sin -------------------------------------------------------------------------


def cos_sin_inputs(gen, dtype, head_dim=DH, long=False, base=None):
    kwargs = {} if base is None else {"base": base}
    return Call((positions_with_gaps(gen, long), head_dim), kwargs, ("positions", "head_dim"))


def cos_sin(positions, head_dim, base=10000.0, *, layout="half", phases=torch.float64, ignore=False, swap=False,
            low_cos=False, low_positions=None):
    """The tables, angles in float64 (the truth); the keyword arguments after * make the named wrong variants."""
    if ignore:
        positions = torch.arange(len(positions))
    if low_positions is not None:  # the positions rounded to a half type, the rest right
        positions = positions.to(low_positions)
    theta = frequencies(head_dim, base).to(phases)
    angles = positions.to(phases)[:, None] * theta[None, :]
    angles = torch.cat((angles, angles), -1) if layout == "half" else angles.repeat_interleave(2, dim=-1)
    angles = angles if low_cos else angles.double()  # cos and sin of low-precision angles, in their dtype or not
    cos, sin = angles.cos().float(), angles.sin().float()
    return (sin, cos) if swap else (cos, sin)


def _cos_sin_variant(**wrong):
    return lambda positions, head_dim, base=10000.0: cos_sin(positions, head_dim, base, **wrong)


def _not_duplicated(value, positions, head_dim, base=10000.0):
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, torch.Tensor) and v.shape[-1] == head_dim // 2 for v in value)


def _low_precision_phases(value, positions, head_dim, base=10000.0):
    halves = (torch.bfloat16, torch.float16)
    low = [cos_sin(positions, head_dim, base, phases=t, low_cos=c) for t in halves for c in (0, 1)]
    low += [cos_sin(positions, head_dim, base, low_positions=t) for t in halves]
    return matches_any(value, low)


COS_SIN = StepSpec(
    "rope_cos_sin", cos_sin_inputs, cos_sin, compare=angle_compare, outputs=("cos", "sin"),
    answered=("rope_frequencies",),
    checks=(shape(2), values("values", 3), values("head_dim_64", 2, head_dim=64),
            values("base_500000", 2, base=500000.0), values("positions_to_8192", 4, long=True), device(2)),
    mistakes=(
        Mistake("rope_cos_sin.interleaved_layout", "the angles were repeated pairwise "
                "(repeat_interleave(2), the interleaved layout's order): concatenate them with themselves, "
                "cat((angles, angles), dim=-1)", _cos_sin_variant(layout="interleaved"),
                why="In the half layout feature j pairs with j + head_dim/2."),
        Mistake("rope_cos_sin.not_duplicated", "cos and sin are (T, head_dim/2): concatenate the angles with "
                "themselves along the last axis so both are (T, head_dim)", test=_not_duplicated),
        Mistake("rope_cos_sin.positions_ignored", "the positions were ignored (arange(T) used instead): the angles are "
                "positions[:, None] · θ[None, :]", _cos_sin_variant(ignore=True)),
        Mistake("rope_cos_sin.low_precision_phases", "the angles (or the positions) were in bfloat16 or float16: "
                "compute positions · θ in float32", test=_low_precision_phases,
                why="At position 8192 those types space their numbers 32 or 4 apart "
                    "(bfloat16 holds integers exactly only to 256), so the angle is noise."),
        Mistake("rope_cos_sin.swapped", "returned (sin, cos): the contract is (cos, sin)", _cos_sin_variant(swap=True)),
    ),
)

# -- rotate_half --------------------------------------------------------------------------


def rotate_inputs(gen, dtype, rank=4):
    shape_ = (B, H, T, DH) if rank == 4 else (T, DH)
    return Call((gen.randn(*shape_, dtype=dtype),), names=("x",))


def rotate(x, *, kind="half"):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    if kind == "half":
        return torch.cat((-x2, x1), -1)
    if kind == "sign":
        return torch.cat((x2, -x1), -1)
    if kind == "swap":
        return torch.cat((x2, x1), -1)
    return torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)  # GPT-J's rotate_every_two


ROTATE = StepSpec(
    "rotate_half", rotate_inputs, rotate,
    checks=(shape(2), values("values", 2, (torch.float32, torch.float64)), values("two_dims", 1, rank=2),
            values("noncontiguous", 1, strided=(0,)), values("half", 1, (torch.float16, torch.bfloat16))),
    mistakes=(
        Mistake("rotate_half.sign_flipped", "the sign is on the wrong half: rotate_half(x) = cat(−x2, x1), x1 and x2 "
                "the first and second halves", lambda x: rotate(x, kind="sign"),
                why="That is a turn by +90 degrees; cat(x2, −x1) turns the other way."),
        Mistake("rotate_half.no_negation", "the halves were swapped but not negated: cat(−x2, x1)",
                lambda x: rotate(x, kind="swap")),
        Mistake("rotate_half.interleaved_layout", "rotated neighbouring pairs (GPT-J's rotate_every_two, (x[2i], "
                "x[2i+1]) -> (−x[2i+1], x[2i])): rotate_half pairs feature j with j + Dh/2",
                lambda x: rotate(x, kind="pairs")),
    ),
)

# -- apply_rope ---------------------------------------------------------------------------


def apply_inputs(gen, dtype, long=False, zero=False):
    x = gen.randn(B, H, T, DH, dtype=dtype)
    cos, sin = ref.rope_cos_sin(positions_with_gaps(gen, long, zero), DH)
    return Call((x, cos, sin), names=("x", "cos", "sin"))


def apply(x, cos, sin, *, kind="half", swap=False, sign=1.0):
    dtype = torch.promote_types(x.dtype, torch.float32)
    xf, c, s = x.to(dtype), cos.to(dtype), sin.to(dtype)
    if swap:
        c, s = s, c
    return (xf * c + sign * rotate(xf, kind=kind) * s).to(x.dtype)


def _apply_variant(**wrong):
    return lambda x, cos, sin: apply(x, cos, sin, **wrong)


def pair_norms(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    x = x.double()
    return (x[..., :h] ** 2 + x[..., h:] ** 2).sqrt()


def keeps_pair_norms(run) -> None:
    call = run.inputs(dtype=torch.float32)
    got = run.output(run.answer(call))
    run.expect_form(got, call)
    try:
        expect_close(pair_norms(got), pair_norms(call.args[0]), call, Tolerance(1e-4, 1e-5))
    except CheckFailed as failure:
        raise run.diagnosed(CheckFailed(f"a rotated pair (x[j], x[j + Dh/2]) changed its length: {failure.message}"),
                            got, call) from None


def position_zero_identity(run) -> None:
    call = run.inputs(dtype=torch.float32, zero=True)
    got = run.output(run.answer(call))
    run.expect_form(got, call)
    try:
        expect_close(got, call.args[0], call, Tolerance(1e-6, 1e-6))
    except CheckFailed as failure:
        raise run.diagnosed(CheckFailed(f"at position 0 (cos = 1, sin = 0) the rotation must leave x as it is: "
                                        f"{failure.message}"), got, call) from None


def float32_math(run) -> None:
    """A bfloat16 x: the rotation is computed in float32 and rounded to bfloat16 once, so each entry is within one
    bfloat16 step of the float32 answer. Computed in bfloat16 (cos and sin cast down, two products and a sum each
    rounded), a quarter of the entries are further off: the values check's low-precision rule, which allows twice
    the error of plain same-dtype code, cannot tell that apart, so this check asks for what the contract says."""
    call = run.inputs(dtype=torch.bfloat16, long=True)
    got = run.output(run.answer(call))
    run.expect_form(got, call)
    x, cos, sin = call.args
    exact = apply(x.float(), cos, sin)  # float32 math, not yet rounded
    bfloat16 = torch.finfo(torch.bfloat16)
    step = bfloat16.eps * exact.abs().clamp_min(bfloat16.tiny)  # one step at |exact|
    off = (got.float() - exact).abs() > step
    if off.any():
        where = tuple(int(i) for i in off.nonzero()[0])
        raise run.diagnosed(CheckFailed(
            f"bfloat16 x: {int(off.sum())} of {off.numel()} entries are more than one bfloat16 step from the rotation "
            f"computed in float32 (at {where}: expected {exact[where]:.6g}, got {got.float()[where]:.6g}); compute "
            f"x.float() · cos + rotate_half(x.float()) · sin, then .to(x.dtype) once"), got, call) from None


def _bfloat16_math(x, cos, sin):
    """The rotation computed in x's own dtype: cos and sin cast down, every product and sum rounded."""
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return x * c + rotate(x, kind="half") * s


APPLY = StepSpec(
    "apply_rope", apply_inputs, apply, answered=("rotate_half",),
    checks=(shape(2), values("values", 3, LOW), values("float16", 1, (torch.float16,)),
            values("positions_to_8192", 3, (torch.bfloat16,), long=True), values("noncontiguous", 1, strided=(0,)),
            prop("position_zero_identity", 3, position_zero_identity, gated=ALWAYS),
            prop("keeps_pair_norms", 2, keeps_pair_norms, gated=ALWAYS),
            prop("float32_math", 2, float32_math)),
    mistakes=(
        Mistake("apply_rope.low_precision_math", "computed in x's low-precision dtype (cos and sin cast down to it): "
                "compute x.float() · cos + rotate_half(x.float()) · sin in float32, then round once with .to(x.dtype)",
                lambda x, cos, sin: _bfloat16_math(x, cos, sin) if x.dtype in (torch.bfloat16, torch.float16)
                else None),
        Mistake("apply_rope.interleaved_layout", "rotated neighbouring pairs (x[2i], x[2i+1]), the interleaved "
                "layout: with rope_cos_sin's tables (half layout) feature j pairs with j + Dh/2, x·cos + "
                "rotate_half(x)·sin", _apply_variant(kind="pairs")),
        Mistake("apply_rope.sign_flipped", "x·cos − rotate_half(x)·sin turns every pair the wrong way: x·cos + "
                "rotate_half(x)·sin", _apply_variant(sign=-1.0)),
        Mistake("apply_rope.cos_sin_swapped", "cos and sin swapped: x·cos + rotate_half(x)·sin",
                _apply_variant(swap=True)),
    ),
)

# -- apply_rope_interleaved ---------------------------------------------------------------


def interleaved_inputs(gen, dtype, long=False, base=None):
    x = gen.randn(B, H, T, DH, dtype=dtype)
    return Call((x, positions_with_gaps(gen, long)), {} if base is None else {"base": base}, ("x", "positions"))


def interleaved(x, positions, base=10000.0, *, layout="pairs", sign=1.0, ignore=False, phases=None, exponent="2i/d"):
    """The interleaved layout, angles in float64 (the truth); the keyword arguments after * make the wrong variants."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    if ignore:
        positions = torch.arange(len(positions))
    if layout == "half":
        return apply(x, *cos_sin(positions, x.shape[-1], base))
    work = phases or torch.float64
    theta = frequencies(x.shape[-1], base, exponent=exponent).to(work)
    angles = (positions.to(work)[:, None] * theta[None, :]).double()
    cos, sin = angles.cos(), sign * angles.sin()
    xf = x.double()
    a, b = xf[..., 0::2], xf[..., 1::2]
    join = torch.cat if layout == "cat" else lambda parts, axis: torch.stack(parts, axis).flatten(-2)
    return join((a * cos - b * sin, a * sin + b * cos), -1).to(dtype).to(x.dtype)


def _interleaved_variant(**wrong):
    return lambda x, positions, base=10000.0: interleaved(x, positions, base, **wrong)


def _interleaved_low_precision(value, x, positions, base=10000.0):
    low = [interleaved(x, positions, base, phases=t) for t in (torch.bfloat16, torch.float16)]
    return matches_any(value, low)


def interleaved_pair_norms(run) -> None:
    call = run.inputs(dtype=torch.float32)
    got = run.output(run.answer(call))
    run.expect_form(got, call)
    norms = lambda y: (y.double()[..., 0::2] ** 2 + y.double()[..., 1::2] ** 2).sqrt()  # noqa: E731
    try:
        expect_close(norms(got), norms(call.args[0]), call, Tolerance(1e-4, 1e-5))
    except CheckFailed as failure:
        raise run.diagnosed(CheckFailed(f"a rotated pair (x[2i], x[2i+1]) changed its length: {failure.message}"),
                            got, call) from None


INTERLEAVED = StepSpec(
    "apply_rope_interleaved", interleaved_inputs, interleaved, compare=angle_compare, answered=("rope_frequencies",),
    checks=(shape(1), values("values", 3, LOW), values("base_500000", 1, base=500000.0),
            values("positions_to_8192", 3, (torch.bfloat16,), long=True), values("noncontiguous", 1, strided=(0,)),
            prop("keeps_pair_norms", 1, interleaved_pair_norms, gated=ALWAYS), device(2)),
    mistakes=(
        Mistake("apply_rope_interleaved.half_layout", "rotated the half layout's pairs (x[j], x[j + Dh/2]), as "
                "rotate_half does: in the interleaved layout pair i is (x[2i], x[2i+1]), as view_as_complex on "
                "(..., Dh/2, 2) sees it", _interleaved_variant(layout="half")),
        Mistake("apply_rope_interleaved.pairs_not_interleaved", "the rotated pairs were put back with cat (every "
                "first element, then every second): put pair i back at 2i and 2i+1, stack on a new last axis and "
                "flatten", _interleaved_variant(layout="cat")),
        Mistake("apply_rope_interleaved.sign_flipped", "each pair turned the wrong way: (a, b) -> "
                "(a·cos − b·sin, a·sin + b·cos)", _interleaved_variant(sign=-1.0)),
        Mistake("apply_rope_interleaved.positions_ignored", "the positions were ignored (arange(T) used instead): "
                "pair i of token t turns by positions[t] · θᵢ", _interleaved_variant(ignore=True)),
        Mistake("apply_rope_interleaved.i_over_d", "θᵢ = base^(−i/d): the exponent is 2i/d, i over the pairs",
                _interleaved_variant(exponent="i/d")),
        Mistake("apply_rope_interleaved.low_precision_phases", "the angles were computed in x's low-precision dtype: "
                "compute positions · θ, cos and sin in float32, then round once", test=_interleaved_low_precision,
                why="At position 8192 bfloat16 spaces its numbers 32 apart."),
    ),
)

# -- RotarySelfAttention ------------------------------------------------------------------


def module_inputs(gen, dtype, positions="gaps", mask=None, bias=False, base=None):
    names = ("w_q", "w_k", "w_v", "w_o")
    state = {f"{n}.weight": gen.randn(D, D, dtype=dtype, scale=D**-0.5) for n in names}
    if bias:
        state.update({f"{n}.bias": gen.randn(D, dtype=dtype, scale=0.1) for n in names})
    x = gen.randn(B, T, D, dtype=dtype)
    pos = {"gaps": lambda: positions_with_gaps(gen), "long": lambda: positions_with_gaps(gen, long=True),
           None: lambda: None}[positions]()
    masks = {None: None, "causal": torch.ones(T, T, dtype=torch.bool).tril()}
    init_kwargs = {"bias": bias} if base is None else {"base": base, "bias": bias}
    return Call((x,), {"positions": pos, "mask": masks[mask]}, ("x",), init=(D, H), init_kwargs=init_kwargs,
                state=state)


def attend(state, x, positions=None, mask=None, *, layout="half", rope_v=False, before_split=False, ignore=False,
           q_only=False, base=10000.0):
    """The module's forward from reference steps (the float32 tables of the contract); the keyword arguments after *
    make the named wrong variants."""
    b, t, d = x.shape
    if positions is None or ignore:
        positions = torch.arange(t)

    def proj(y, name):
        return y @ state[f"{name}.weight"].T + state.get(f"{name}.bias", 0)

    def heads(y):
        return y.view(b, t, H, DH).transpose(1, 2)

    def rope(y, width=DH):
        if layout == "pairs":
            return ref.apply_rope_interleaved(y, positions, base)
        return ref.apply_rope(y, *ref.rope_cos_sin(positions, width, base))

    q, k, v = proj(x, "w_q"), proj(x, "w_k"), proj(x, "w_v")
    if before_split:  # rotated over the whole width D, then split
        q, k = heads(rope(q, d)), heads(rope(k, d))
    else:
        q, k = heads(q), heads(k)
        q = rope(q)
        k = k if q_only else rope(k)
    v = heads(v)
    if rope_v:
        v = rope(v)
    y = attention.attend(q, k, v, mask).transpose(1, 2).reshape(b, t, d)
    return proj(y, "w_o")


def _module_variant(**wrong):
    return lambda state, x, positions=None, mask=None: attend(state, x, positions, mask, **wrong)


NO_WIDTH_CHECK = Mistake("RotarySelfAttention.no_width_check", "embed_dim not divisible by num_heads was accepted: "
                         "raise ValueError in __init__")


def shift_invariant(run) -> None:
    """Shifting every position by SHIFT leaves the output unchanged (q(m)·k(n) depends only on m − n)."""
    call = run.inputs(dtype=torch.float32, mask="causal")
    shifted = Call(call.args, {**call.kwargs, "positions": call.kwargs["positions"] + SHIFT}, call.names, call.init,
                   call.init_kwargs, call.state)
    first, second = run.output(run.answer(call)), run.output(run.answer(shifted))
    run.expect_form(first, call)
    try:
        expect_close(second, first, shifted, Tolerance(1e-3, 1e-3))
    except CheckFailed as failure:
        raise run.diagnosed(CheckFailed(f"adding {SHIFT} to every position changed the output (only the distances "
                                        f"between tokens may matter): {failure.message}"), second, shifted) from None


LLAMA3_BASE = 500000.0
BASE_IGNORED = Mistake("RotarySelfAttention.base_ignored", "the module's base had no effect (the answer is the one "
                       "for base=10000): pass self.base on to rope_cos_sin", why="Llama 3 builds its rotary "
                       "embedding with base 500000; a module that hard-codes 10000 loads its weights and runs, wrong.")


def base_used(run) -> None:
    """Built with base=500000 (Llama 3's), the module answers as the reference does with that base."""
    call = run.inputs(dtype=torch.float32, mask="causal", base=LLAMA3_BASE)
    got = run.output(run.answer(call))
    run.expect_form(got, call)
    x, positions, mask = call.args[0], call.kwargs["positions"], call.kwargs["mask"]
    native = attend(call.state, x, positions, mask, base=LLAMA3_BASE)
    exact = attend({k: v.double() for k, v in call.state.items()}, x.double(), positions, mask, base=LLAMA3_BASE)
    try:
        angle_compare(got, exact, call, Tolerance.of(native, exact, "cpu"))
    except CheckFailed as failure:
        ignored = attend(call.state, x, positions, mask)
        mistake = BASE_IGNORED if matches_any(got, [ignored]) else None
        raise CheckFailed(f"built with base={LLAMA3_BASE:g}: {failure.message}", mistake) from None


MODULE = StepSpec(
    "RotarySelfAttention", module_inputs, attend, module=True, prefix="module", compare=angle_compare,
    answered=("rope_frequencies", "rope_cos_sin", "rotate_half", "apply_rope"),
    checks=(
        prop("structure", 1, linear_layers(("w_q", "w_k", "w_v", "w_o"), (D, H), "an nn.Linear")),
        prop("defaults", 1, defaults(mask="causal")),  # bias=False, the contract's default
        prop("validates_width", 1, raises_value_error((10, 3), "10 is not divisible by 3 heads", NO_WIDTH_CHECK),
             gated=ALWAYS),
        values("values", 3, LOW), values("default_positions", 3, positions=None),
        values("mask_causal", 2, mask="causal"), values("bias", 2, bias=True, mask="causal"),
        values("positions_to_8192", 3, (torch.bfloat16,), positions="long"),
        prop("shift_invariant", 3, shift_invariant, gated=ALWAYS),
        prop("gradients", 2, gradients(bias=True, mask="causal")),
        prop("base_500000", 2, base_used),
        prop("end_to_end", 2, end_to_end(bias=True, mask="causal"), end_to_end=True), device(2, positions=None),
    ),
    mistakes=(
        Mistake("RotarySelfAttention.interleaved_layout", "RoPE in the interleaved layout (pairs (x[2i], x[2i+1])): "
                "the module uses the half layout, apply_rope(q, cos, sin) with rope_cos_sin's tables",
                _module_variant(layout="pairs")),
        Mistake("RotarySelfAttention.rope_on_v", "RoPE was applied to v too: rotate q and k only",
                _module_variant(rope_v=True),
                why="The values carry content, and rotated values make the output depend on absolute positions."),
        Mistake("RotarySelfAttention.rope_before_head_split", "RoPE was applied over the whole width D before the "
                "heads were split: split q and k into (B, H, T, Dh) first, then rotate with tables for Dh",
                _module_variant(before_split=True)),
        Mistake("RotarySelfAttention.positions_ignored", "the positions argument was ignored "
                "(arange(T) used always): use it when given, arange(T) only when it is None",
                _module_variant(ignore=True)),
        Mistake("RotarySelfAttention.rope_on_q_only", "only q was rotated: rotate k too, so that q(m)·k(n) depends "
                "on m − n", _module_variant(q_only=True)),
        NO_WIDTH_CHECK, BASE_IGNORED,
    ),
)

SPEC = Spec((FREQUENCIES, COS_SIN, ROTATE, APPLY, INTERLEAVED, MODULE))
