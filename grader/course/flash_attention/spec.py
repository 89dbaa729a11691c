"""The checks of `flash_attention`: the online-softmax update, the merge of two partial results, and tiled attention.

The update is checked on states that are real (the running max, sum and output of keys
seen before), on a block that raises every row's max (where a missing or inverted rescale
shows), on rows masked so far (which must stay 0, never NaN), on scores of ±1e3 and as a
chain: three blocks through the candidate's own update must give the softmax of all three.
The merge is checked on real partials (attention over two disjoint sets of keys, computed
here), with a part that has no keys, with both empty, and with log-sum-exps far apart.

flash_attention is checked against the plain reference for several block sizes (the tails
of Tq and Tk never a multiple of them), its lse against torch.logsumexp of the whole scaled,
masked score matrix computed here, causal with Tq < Tk and Tq > Tk (rows with no key: out 0,
lse -inf), in the half types under the engine's low-precision rule, and for what it
materialises: the worker records the shapes of every tensor its torch calls create
(grader/sandbox/recorder.py, `Shapes`), and no tensor may hold more elements per batch and head than
a block_q × block_k tile or the inputs and outputs themselves (`tiles_only`). The update
and the merge are answered by the grader while flash_attention's checks run, once they have
lost points, so a bug in the update is charged to the update.

flash_attention's reference here is plain attention (scores, softmax, weighted sum, by
grader/engine/attention.py; the lse by torch.logsumexp), which the model answer equals
(tests/exercises/flash_attention/test_oracle.py): exact when upcast to float64, and, in a
half type, the plain same-dtype implementation the engine's low-precision rule measures by.
"""

import math

import torch

from grader.engine import (
    ALWAYS,
    HALF_TYPES,
    TILE_POSITIONS,
    Call,
    CheckFailed,
    Mistake,
    Raises,
    Spec,
    StepSpec,
    TileSizes,
    Tolerance,
    attention,
    device,
    end_to_end,
    expect_close,
    prop,
    rules,
    shape,
    tiles_only,
    values,
)
from solutions import flash_attention as ref

FLOATS = (torch.float32, torch.float64)
HALF = (torch.float16, torch.bfloat16)
B, H = 2, 3  # batch and heads: the leading dims
TQ, TK, D, DV = 45, 70, 8, 12  # query and key tokens (no multiple of any block size used), head width, value width
BK = 6  # keys in one block of the update's checks
INF = math.inf


def _work(dtype):
    """The dtype the running state is kept in: float32 for the half types, float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


# -- online_softmax_update ----------------------------------------------------------------


def update_inputs(gen, dtype, state="running", raise_max=False, masked=None, scale=1.0, leading=(B, H)):
    """m, l, acc from keys seen before (`state` "running"), or the initial state; then the next block of scores and
    values.

    raise_max: the block's scores sit above every row's running max. masked: "rows" blocks rows 1 and 3 of the
    block entirely (and, running, rows 1 also before: a row with nothing seen yet); "entries" blocks random entries.
    """
    tq = 5
    before = gen.randn(*leading, tq, 7, dtype=torch.float64, scale=scale)
    scores = gen.randn(*leading, tq, BK, dtype=torch.float64, scale=scale)
    v_before = gen.randn(*leading, 7, DV, dtype=torch.float64)
    v = gen.randn(*leading, BK, DV, dtype=torch.float64)
    if raise_max:
        scores = scores + (before.amax(-1, keepdim=True) - scores.amin(-1, keepdim=True)) + 0.5
    if masked == "rows":
        scores[..., 1, :] = -INF
        scores[..., 3, :] = -INF
        before[..., 1, :] = -INF
    elif masked == "entries":
        scores = scores.masked_fill(~torch.as_tensor(gen.mask(*scores.shape)), -INF)
    if state == "initial":
        m = torch.full((*leading, tq), -INF, dtype=torch.float64)
        l, acc = torch.zeros(*leading, tq, dtype=torch.float64), torch.zeros(*leading, tq, DV, dtype=torch.float64)
    else:  # the state after the 7 keys before: their max, and their sum and output relative to it
        m = before.amax(-1)
        p = torch.exp(before - torch.where(m == -INF, 0.0, m)[..., None])
        l, acc = p.sum(-1), p @ v_before
    args = tuple(torch.as_tensor(x).to(dtype) for x in (m, l, acc, scores, v))
    return Call(args, names=("m", "l", "acc", "scores", "v"))


def update(m, l, acc, scores, v, *, rescale="both", sign=1, old_max=False, normalise=False, subtract_max=True,
           block_max=False):
    """online_softmax_update; the keyword arguments after * make the named wrong variants."""
    m_new = scores.amax(-1) if block_max else torch.maximum(m, scores.amax(-1))
    shift = torch.where(m_new == -INF, 0.0, m_new)  # a row with nothing seen yet subtracts 0
    alpha = torch.exp(m - shift) if sign == 1 else torch.exp(shift - m)
    p = torch.exp(scores - (m if old_max else shift)[..., None]) if subtract_max else torch.exp(scores)
    if not subtract_max:  # sums of e^score: nothing to rescale
        alpha = torch.ones_like(m)
    a_l = alpha if rescale in ("both", "l") else torch.ones_like(alpha)  # rescale: which of l and acc are rescaled
    a_l = alpha * alpha if rescale == "l_twice" else a_l
    rescale = "both" if rescale == "l_twice" else rescale
    a_acc = alpha if rescale in ("both", "acc") else torch.ones_like(alpha)
    l_new = a_l * l + p.sum(-1)
    acc_new = a_acc[..., None] * acc + p @ v
    if normalise:
        acc_new = acc_new / l_new[..., None]
    return m_new, l_new, acc_new


def _update_variant(**wrong):
    return lambda m, l, acc, scores, v: update(m, l, acc, scores, v, **wrong)


def _has_nan(value, *args, **kwargs):
    parts = value if isinstance(value, (tuple, list)) else (value,)
    return any(isinstance(p, torch.Tensor) and p.is_floating_point() and bool(torch.isnan(p).any()) for p in parts)


def chain(run):
    """Three key blocks through the candidate's own update, from the initial state: acc / l is the softmax of all
    their scores @ their values, m + log(l) their log-sum-exp (row 1 is masked in the first block)."""
    blocks = [update_inputs(run.gen, torch.float32, masked="rows" if n == 0 else None).args[3:] for n in range(3)]
    m = torch.full((B, H, 5), -INF)
    l, acc = torch.zeros(B, H, 5), torch.zeros(B, H, 5, DV)
    for scores, v in blocks:
        call = Call((m, l, acc, scores, v), names=("m", "l", "acc", "scores", "v"))
        value = run.output(run.answer(call))
        run.expect_form(value, call)
        m, l, acc = value
    scores = torch.cat([b[0] for b in blocks], -1).double()
    v = torch.cat([b[1] for b in blocks], -2).double()
    want = (torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1))
    got = (acc.double() / l.double()[..., None], m.double() + l.double().log())
    try:
        expect_close(got, want, call, Tolerance(1e-4, 1e-5), ("acc / l", "m + log(l)"))
    except CheckFailed as failure:
        raise CheckFailed(f"after three blocks from the initial state: {failure.message}", run.explain(value, call),
                          failure.details) from None


NO_RESCALE = ("l and acc were not rescaled when the max rose: multiply them by e^(m - m') before adding the new "
              "block's terms")
NO_RESCALE_WHY = "What was summed so far was summed relative to the old max m."
UPDATE = StepSpec(
    "online_softmax_update", update_inputs, ref.online_softmax_update, outputs=("m", "l", "acc"),
    checks=(
        shape(2), values("values", 3, FLOATS), values("first_block", 3, state="initial"),
        values("raises_max", 4, raise_max=True), values("masked_rows", 3, state="initial", masked="rows"),
        values("masked_rows_running", 2, masked="rows"), values("large_scores", 3, scale=1e3, masked="entries"),
        values("no_leading_dims", 1, leading=()), prop("chain", 3, chain), rules(1), device(2),
    ),
    mistakes=(
        Mistake("online_softmax_update.no_rescale", NO_RESCALE, _update_variant(rescale="none"), why=NO_RESCALE_WHY),
        Mistake("online_softmax_update.l_not_rescaled", "l was not rescaled when the max rose (acc was): multiply l by "
                "e^(m - m') too, l' = e^(m - m')·l + Σ e^(scores - m')", _update_variant(rescale="acc")),
        Mistake("online_softmax_update.acc_not_rescaled", "acc was not rescaled when the max rose (l was): multiply "
                "acc by e^(m - m') too, acc' = e^(m - m')·acc + e^(scores - m') @ v", _update_variant(rescale="l")),
        Mistake("online_softmax_update.l_rescaled_twice", "l was multiplied by e^(m - m') twice "
                "(rescaled in place, then again in the update): rescale it once, l' = e^(m - m')·l + Σ "
                "e^(scores - m')", _update_variant(rescale="l_twice")),
        Mistake("online_softmax_update.rescale_sign", "the rescale has its sign flipped, e^(m' - m): the new max m' is "
                "at least the old m, so the factor is e^(m - m') <= 1", _update_variant(sign=-1)),
        Mistake("online_softmax_update.old_max", "the block's terms were taken relative to the old max, "
                "e^(scores - m): the new state is relative to the new max m', so use e^(scores - m')",
                _update_variant(old_max=True)),
        Mistake("online_softmax_update.block_max_only", "the new max is the block's own max, the running max m "
                "forgotten: take m' = max(m, the block's max)", _update_variant(block_max=True),
                why="Otherwise the max can fall, e^(m - m') exceeds 1, and the terms kept so far are no longer "
                    "relative to the largest score seen."),
        Mistake("online_softmax_update.normalised", "acc was divided by l: the state keeps acc unnormalised "
                "(the sum of e^(score - m)·v); divide once, after the last block", _update_variant(normalise=True)),
        Mistake("online_softmax_update.no_max", "e^scores without subtracting the running max: l and acc are kept "
                "relative to m (l = Σ e^(score - m)), and e^1000 overflows", _update_variant(subtract_max=False)),
        Mistake("online_softmax_update.nan_rows", "a row whose scores so far are all -inf gave NaN: subtract 0 where "
                "the new max is -inf (torch.where), so it stays at l = 0, acc = 0", test=_has_nan,
                why="Its max is -inf, and e^(-inf - (-inf)) is NaN."),
    ),
)

# -- merge_partials -----------------------------------------------------------------------


MERGE_TQ = 5  # queries in the merge's checks: not DV, so weights broadcast against the wrong axis fail


def merge_inputs(gen, dtype, empty=None, far=False, leading=(B, H)):
    """(o1, lse1, o2, lse2): attention over two disjoint sets of keys (4 and 6 of them), computed here in float64.

    empty: "one" leaves part 1 without keys in row 1 and part 2 in row 3; "both" leaves both without keys in rows
    1 and 3. far: part 2's scores sit 200 above part 1's (which sit at 100): e^lse overflows.
    """
    tq = MERGE_TQ
    parts = []
    for n, keys in enumerate((4, 6)):
        scores = gen.randn(*leading, tq, keys, dtype=torch.float64) + (100.0 + 200.0 * n if far else 0.0)
        v = gen.randn(*leading, keys, DV, dtype=torch.float64)
        rows = {"one": [(1,), (3,)][n], "both": (1, 3)}.get(empty, ())
        for row in rows:
            scores[..., row, :] = -INF
        lse = torch.logsumexp(scores, -1)
        o = (torch.softmax(scores, -1) @ v).nan_to_num(0.0)
        parts += [o.to(dtype), lse.to(_work(dtype))]
    return Call(tuple(parts), names=("o1", "lse1", "o2", "lse2"))


def merge(o1, lse1, o2, lse2, *, lse_of="logaddexp", normalise=True, weighted=True, stable=True, swapped=False):
    """merge_partials; the keyword arguments after * make the named wrong variants."""
    work = torch.promote_types(o1.dtype, torch.promote_types(lse1.dtype, torch.float32))
    if not stable:  # e^lse directly
        e1, e2 = torch.exp(lse1), torch.exp(lse2)
        o = (e1[..., None] * o1.to(work) + e2[..., None] * o2.to(work)) / (e1 + e2)[..., None]
        return o.to(o1.dtype), torch.log(e1 + e2)
    true_lse = torch.logaddexp(lse1, lse2)
    top = torch.maximum(lse1, lse2) if not normalise else true_lse
    safe = torch.where(top == -INF, 0.0, top)
    w1, w2 = torch.exp(lse1 - safe)[..., None].to(work), torch.exp(lse2 - safe)[..., None].to(work)
    if swapped:
        w1, w2 = w2, w1
    o = w1 * o1.to(work) + w2 * o2.to(work) if weighted else (o1.to(work) + o2.to(work)) / 2
    lse = torch.maximum(lse1, lse2) if lse_of == "max" else true_lse
    return o.to(o1.dtype), lse


def _merge_variant(**wrong):
    return lambda o1, lse1, o2, lse2: merge(o1, lse1, o2, lse2, **wrong)


def _nan_where_both_empty(value, o1, lse1, o2, lse2):
    """NaN in the output exactly where both parts are empty (and nowhere else): an unguarded e^(lse - lse)."""
    o = value[0] if isinstance(value, (tuple, list)) and value else value
    if not isinstance(o, torch.Tensor) or not o.is_floating_point() or o.shape != o1.shape:
        return False
    nan_rows = torch.isnan(o).any(-1)
    empty = (lse1 == -INF) & (lse2 == -INF)
    return bool(nan_rows.any()) and bool((nan_rows == empty).all())


MERGE = StepSpec(
    "merge_partials", merge_inputs, ref.merge_partials, outputs=("o", "lse"),
    checks=(
        shape(2), values("values", 2, FLOATS), values("one_empty", 4, empty="one"),
        values("both_empty", 3, empty="both"),
        values("far_apart", 3, far=True), values("half", 1, HALF), device(2),
    ),
    mistakes=(
        Mistake("merge_partials.nan_rows", "rows where both parts have no keys (lse1 = lse2 = -inf) gave NaN: "
                "subtract 0 where the merged lse is -inf (torch.where)", test=_nan_where_both_empty,
                why="e^(-inf - (-inf)) is NaN; subtracting 0 gives o = 0 and lse = -inf."),
        Mistake("merge_partials.max_lse", "the merged lse is max(lse1, lse2): use logaddexp(lse1, lse2), and take "
                "the weights e^(lse_i - lse) from it",
                lambda *a: [merge(*a, lse_of="max"), merge(*a, lse_of="max", normalise=False)],
                why="The union's sum is e^lse1 + e^lse2, so its log is logaddexp(lse1, lse2) = max + "
                    "log(1 + e^(min - max))."),
        Mistake("merge_partials.unnormalised", "the weights e^(lse_i - max) were not normalised: they must sum to 1, "
                "so take e^(lse_i - lse) with lse = logaddexp(lse1, lse2)", _merge_variant(normalise=False)),
        Mistake("merge_partials.unweighted", "the two outputs were averaged: each part counts as much as its share "
                "of the union's sum, e^(lse_i - lse)", _merge_variant(weighted=False)),
        Mistake("merge_partials.weights_swapped", "each output was weighted by the other part's share "
                "(o1 by e^(lse2 - lse), o2 by e^(lse1 - lse)): o = e^(lse1 - lse)·o1 + e^(lse2 - lse)·o2",
                _merge_variant(swapped=True)),
        Mistake("merge_partials.weights_not_unsqueezed", "the (..., Tq) weights were multiplied into the "
                "(..., Tq, Dv) outputs as they are: unsqueeze them, w[..., None]",
                raises=Raises(message=rf"tensor a \(({MERGE_TQ}|{DV})\) must match the size of tensor b "
                                      rf"\(({DV}|{MERGE_TQ})\)",
                              line=r"\*"),
                why="As they are they broadcast along Dv: an error, or a wrong answer where Tq == Dv."),
        Mistake("merge_partials.unstable", "e^lse computed directly: work with differences, e^(lse_i - lse), lse = "
                "logaddexp(lse1, lse2)", _merge_variant(stable=False),
                why="An lse of a few hundred overflows (e^89 is inf in float32), and inf / inf is NaN."),
    ),
)

# -- flash_attention ----------------------------------------------------------------------


def flash_inputs(gen, dtype, t_q=TQ, t_k=TK, causal=False, block_q=None, block_k=None, d=D, dv=DV, leading=(B, H)):
    q, k = gen.randn(*leading, t_q, d, dtype=dtype), gen.randn(*leading, t_k, d, dtype=dtype)
    v = gen.randn(*leading, t_k, dv, dtype=dtype)
    kwargs = {"causal": causal}
    kwargs.update({name: n for name, n in (("block_q", block_q), ("block_k", block_k)) if n is not None})
    return Call((q, k, v), kwargs, ("q", "k", "v"))


def plain(q, k, v, causal=False):
    """Plain attention in q's own dtype (scores, softmax, weighted sum: attention.attend), with its lse in float32 at
    least."""
    mask = attention.causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    lse = torch.logsumexp(attention.scores(q, k, mask).to(_work(q.dtype)), -1)
    return attention.attend(q, k, v, mask), lse


def flash_reference(q, k, v, causal=False, block_q=32, block_k=32):
    """The right answer, whatever the block sizes: plain attention (tests/exercises/flash_attention/test_oracle.py
    holds the model answer to it). In float64 it is exact; in a half type it is the plain same-dtype implementation,
    which the low-precision rule measures by; and one matmul is cheaper here than the model answer's Python loop."""
    return plain(q, k, v, causal)


def tiled(q, k, v, causal=False, block_q=32, block_k=32, *, scale="sqrt", top_left=False, k_step=None, last_block=True,
          slice_short=0, rescale=True, normalise_in_loop=False, lse_max=True, log2=False, strict=False, fill=-INF,
          tile_local=False, stop_short=False):
    """flash_attention written out here (its own loop, not the model answer's); the keyword arguments after * make the
    named wrong variants."""
    t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    work = _work(q.dtype)
    factor = {"sqrt": d**-0.5, "d": 1.0 / d, "none": 1.0, "dv": v.shape[-1] ** -0.5}[scale]
    offset = 0 if top_left else t_k - t_q
    stop = t_k if last_block else t_k - t_k % block_k
    outs, lses = [], []
    for i in range(0, t_q, block_q):
        qb = q[..., i:i + block_q, :].to(work) * factor
        bq = qb.shape[-2]
        m = torch.full(qb.shape[:-1], -INF, dtype=work)
        l = torch.zeros(qb.shape[:-1], dtype=work)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=work)
        end = min(stop, offset + i + bq - 1) if causal and stop_short else stop  # stop_short: the last query's own key
        for j in range(0, end, k_step or block_k):
            kb, vb = (x[..., j:j + block_k - slice_short, :].to(work) for x in (k, v))
            scores = qb @ kb.transpose(-2, -1)
            if causal:
                rows = torch.arange(offset + i, offset + i + bq)[:, None] - (i if tile_local else 0)
                cols = torch.arange(j, j + kb.shape[-2])[None, :] - (j if tile_local else 0)
                scores = scores.masked_fill(cols >= rows if strict else cols > rows, fill)
            m, l, acc = update(m, l, acc, scores, vb, rescale="both" if rescale else "none")
            if normalise_in_loop:
                acc = acc / l[..., None]
        if normalise_in_loop:
            outs.append(acc)
        else:
            outs.append(torch.where((l > 0)[..., None], acc / torch.where(l > 0, l, 1.0)[..., None], 0.0))
        lse = (m + torch.log(l)) if lse_max else torch.log(l)
        lses.append(lse / math.log(2) if log2 else lse)
    return torch.cat(outs, -2).to(q.dtype), torch.cat(lses, -1)


def _flash_variant(**wrong):
    return lambda q, k, v, causal=False, block_q=32, block_k=32: tiled(q, k, v, causal, block_q, block_k, **wrong)


def _lse_in_half(value, q, *args, **kwargs):
    return (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], torch.Tensor)
            and q.dtype in HALF_TYPES and value[1].dtype == q.dtype)


BLOCK_SIZES = ((16, 16), (8, 24), (24, 8), (7, 5), (128, 128))


def block_sizes(run):
    """Causal, Tq < Tk, for block sizes square and not, larger than the sequence, and odd: always the reference's
    answer."""
    for bq, bk in BLOCK_SIZES:
        call = run.inputs(causal=True, block_q=bq, block_k=bk)
        try:
            run.expect_right(run.output(run.answer(call)), call)
        except CheckFailed as failure:
            raise CheckFailed(f"with block_q={bq}, block_k={bk}: {failure.message}", failure.mistake,
                              failure.details) from None


def block_independence(run):
    """In float64, the answers for three pairs of block sizes agree with each other to float64's tolerance."""
    answers = []
    inputs = run.inputs(dtype=torch.float64, causal=True)
    for bq, bk in ((32, 32), (5, 11), (11, 5)):
        call = Call(inputs.args, {**inputs.kwargs, "block_q": bq, "block_k": bk}, inputs.names)
        value = run.output(run.answer(call))
        run.expect_form(value, call)
        if answers:
            try:
                expect_close(value, answers[0][0], call, Tolerance(1e-7, 1e-9), ("out", "lse"))
            except CheckFailed as failure:
                raise CheckFailed(f"block_q={bq}, block_k={bk} gave another answer than block_q=32, block_k=32: the "
                                  f"result must not depend on the block sizes: {failure.message}",
                                  run.explain(value, call), failure.details) from None
        answers.append((value, call))


def lse_matches_logsumexp(run):
    """lse is torch.logsumexp of each row of the whole scaled, causally masked score matrix, computed here in
    float64."""
    call = run.inputs(causal=True, block_q=16, block_k=24)
    value = run.output(run.answer(call))
    run.expect_form(value, call)
    q, k, _ = (x.double() for x in call.args)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~attention.causal_mask(TQ, TK), -INF)
    try:
        expect_close(value[1], torch.logsumexp(scores, -1), call, Tolerance(1e-4, 1e-5))
    except CheckFailed as failure:
        raise CheckFailed(f"lse is not logsumexp(q @ kᵀ / √D, masked) of each row: {failure.message}",
                          run.explain(value, call),
                          failure.details) from None


# The memory check's sizes: tiles, score rows, score columns, the full matrix and the inputs all of different sizes.
MEM = TileSizes(b=B, h=H, t_q=45, t_k=107, d=8, dv=12, block_q=16, block_k=24)


def _unless_unmasked(forms, q, k, v, causal=False, block_q=32, block_k=32):
    """The forms that differ from attention with no mask at all: where tile-local positions mask nothing, the answer
    is that of a causal flag ignored, which the search names as such."""
    plain = tiled(q, k, v, False, block_q, block_k)
    return [f for f in forms if not all(torch.allclose(a.double(), b.double(), equal_nan=True)
                                        for a, b in zip(f, plain, strict=True))]


FULL_SCORES = Mistake("flash_attention.full_score_matrix", "materialises the full score matrix "
                      "(or a whole row or column of tiles, or a (Tq, Tk) mask): hold one block_q × block_k tile of "
                      "scores at a time",
                      why="Mask each tile from the positions of its own rows and columns, and carry the running max, "
                          "sum and output from tile to tile.")
BLOCK_SIZES_IGNORED = Mistake("flash_attention.block_sizes_ignored", "tiles larger than block_q × block_k "
                              "(block sizes of its own, or the arguments not used): use block_q queries and block_k "
                              "keys per tile", why="The caller picks the tile to fit its fast memory.")


def call_tiles(call: Call) -> TileSizes:
    """The tiles a call of flash_attention(q, k, v, causal=False, block_q=32, block_k=32) asks for."""
    given = {**dict(zip(("causal", "block_q", "block_k"), call.args[3:], strict=False)), **call.kwargs}
    return TileSizes.of(*call.args[:3], given.get("block_q", 32), given.get("block_k", 32))


FLASH = StepSpec(
    "flash_attention", flash_inputs, flash_reference, outputs=("out", "lse"),
    answered=("online_softmax_update", "merge_partials"), tiles=call_tiles,
    checks=(
        shape(2, causal=True), values("values", 3, FLOATS), values("causal", 4, causal=True, block_q=16, block_k=24),
        values("causal_square", 2, t_q=TK, causal=True), prop("block_sizes", 6, block_sizes),
        prop("block_independence", 3, block_independence, gated=ALWAYS), prop("lse", 5, lse_matches_logsumexp),
        values("fully_masked", 4, t_q=TK + 9, t_k=TQ, causal=True, block_q=16, block_k=16),
        values("decode", 2, t_q=1, causal=True, block_k=16),
        values("half", 2, HALF, causal=True), rules(2, causal=True),
        prop("tiles_only", 6, tiles_only(MEM, FULL_SCORES, BLOCK_SIZES_IGNORED)), device(2, causal=True),
        prop("end_to_end", 2, end_to_end(causal=True, block_q=16, block_k=24), end_to_end=True),
    ),
    mistakes=(
        Mistake("flash_attention.lse_dtype", "lse came back in q's half dtype: keep it in float32", test=_lse_in_half,
                why="The backward pass and merge_partials read it, and a half type holds it to 3 digits."),
        Mistake("flash_attention.nan_rows", "a row with no key to see (causal with Tq > Tk) gave NaN: give such rows "
                "out 0 (torch.where(l > 0, ...)) and lse -inf", test=_has_nan, why="acc / l is 0 / 0 there."),
        Mistake("flash_attention.unscaled", "scores not scaled: multiply q · k by 1/√D", _flash_variant(scale="none")),
        Mistake("flash_attention.scaled_by_d", "scores scaled by 1/D: the scale is 1/√D (D = q.shape[-1])",
                _flash_variant(scale="d")),
        Mistake("flash_attention.scaled_by_value_width", "scores scaled by 1/√Dv (the width of v): the scale is "
                "1/√D, the width of q and k (q.shape[-1])", _flash_variant(scale="dv")),
        Mistake("flash_attention.top_left", "causal tiles aligned to the top-left (query i at position i): mask the "
                "tile's key j when j > Tk - Tq + i", _flash_variant(top_left=True),
                why="The queries are the last Tq of the Tk positions: query i sits at Tk - Tq + i."),
        Mistake("flash_attention.no_diagonal", "a query cannot see the key at its own position (>= where > belongs): "
                "mask key j only when j > Tk - Tq + i", _flash_variant(strict=True),
                why="Query i sits at Tk - Tq + i and sees keys 0 … Tk - Tq + i."),
        Mistake("flash_attention.tile_local_mask", "the causal mask came from positions within the tile: compare "
                "absolute positions, query Tk - Tq + i0 + r with key j0 + c",
                lambda *a, **kw: _unless_unmasked([tiled(*a, **kw, tile_local=True),
                                                   tiled(*a, **kw, tile_local=True, top_left=True)], *a, **kw),
                why="Positions 0 … block_q and 0 … block_k give every tile the same pattern."),
        Mistake("flash_attention.skip_stops_short", "the causal key loop stops one key short: end it at "
                "min(Tk, Tk - Tq + i1)", _flash_variant(stop_short=True),
                why="The last query of a block sits at Tk - Tq + i1 - 1 and sees its own key; when that key starts a "
                    "new key block, the block is skipped."),
        Mistake("flash_attention.finite_fill", "masked scores filled with a finite value (-1e9): fill with -inf and "
                "give rows with no key to see out 0, lse -inf", _flash_variant(fill=-1e9),
                why="With a finite fill such a row averages every value (out ≠ 0) and its lse is about -1e9."),
        Mistake("flash_attention.last_block_dropped", "the last, shorter key block was dropped: loop j over "
                "range(0, Tk, block_k) and slice k[..., j:j + block_k, :]", _flash_variant(last_block=False),
                why="range(0, Tk - block_k + 1, block_k), or Tk // block_k blocks, leave it out; the slice is "
                    "shorter at the end, as it should be."),
        Mistake("flash_attention.positions_past_the_end", "the last, shorter tile's positions run past the sequence "
                "(arange(j, j + block_k)): take them from the tile's own bounds, arange(j, min(j + block_k, Tk))",
                raises=Raises(message=r"must match the size|broadcast", uses=TILE_POSITIONS),
                why="When block_k does not divide Tk (or block_q Tq), the last tile is shorter than a block: positions "
                    "counted a whole block from its start do not fit its scores."),
        Mistake("flash_attention.slice_off_by_one", "each key block's slice ends one key short (j:j + block_k - 1): "
                "slices exclude their end, so j:j + block_k holds block_k keys", _flash_variant(slice_short=1)),
        Mistake("flash_attention.k_step_block_q", "the key loop steps by block_q while its slices hold block_k keys: "
                "keys are skipped or counted twice; step the key loop by block_k",
                lambda q, k, v, causal=False, block_q=32, block_k=32:
                tiled(q, k, v, causal, block_q, block_k, k_step=block_q)),
        Mistake("flash_attention.no_rescale", NO_RESCALE, _flash_variant(rescale=False), why=NO_RESCALE_WHY),
        Mistake("flash_attention.normalised_in_loop", "acc was divided by l inside the loop: keep acc unnormalised "
                "and divide once, after the last key block", _flash_variant(normalise_in_loop=True),
                why="What later blocks add is then mixed with an output already divided, and earlier blocks are "
                    "divided again."),
        Mistake("flash_attention.lse_without_max", "lse is log(l) alone: l is summed relative to the running max m, so "
                "lse = m + log(l)", _flash_variant(lse_max=False)),
        Mistake("flash_attention.lse_log2", "lse is in base 2 (log2 of the sum, as exp2-based kernels keep it): the "
                "contract's lse is the natural log; multiply by ln 2", _flash_variant(log2=True)),
        FULL_SCORES, BLOCK_SIZES_IGNORED,
    ),
)

SPEC = Spec((UPDATE, MERGE, FLASH))
