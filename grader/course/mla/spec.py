"""The checks of `mla`: the compression, the up-projection, the scores, the absorbed attention, the latent
cache, the module that decodes with it, and the cache's size per token.

Every width differs from every other (kv_lora_rank 8, qk_nope_head_dim 4, qk_rope_head_dim 6,
v_head_dim 5, 3 heads, batch 2, model width 16), so a weight used untransposed, a head split
the wrong way or a width taken for another shows as an error or a wrong answer, never by luck
as the right one; the queries and keys differ in number (Tq ≠ Tk), and positions have gaps.

The function steps are declared here; the cache and the module keep state between calls, so
their checks are scripts, in latent.py beside this file (as kv_cache's are in its cache.py).
"""

import math

import torch

from grader.engine import (
    ALWAYS,
    EXACT_FLOAT64,
    Call,
    CandidateError,
    CheckFailed,
    Mistake,
    Probe,
    Raises,
    Run,
    Spec,
    StepSpec,
    device,
    expect_close,
    expect_count,
    expect_seen,
    prop,
    search,
    shape,
    values,
)
from solutions import mla as ref

from .latent import CACHE, DN, DR, DV, FLOATS, MODULE, B, D, H, R, bottom_right, spread_model

# -- compress_kv --------------------------------------------------------------------------


def rotated_again(k_rope: torch.Tensor) -> torch.Tensor:
    """The shared key rotated once more, by 0 … Tk − 1: what a step does that takes the k_rope it is given (rotated
    already, by compress_kv) for an unrotated one."""
    return ref.apply_rope(k_rope, torch.arange(k_rope.shape[1], device=k_rope.device))



def positions_with_gaps(gen, t: int) -> torch.Tensor:
    """t sorted distinct positions in 1 … 40, never 0, 1, 2, …: code that ignores them is caught."""
    return (torch.randperm(40, generator=gen.rng)[:t] + 1).sort().values


def compress_inputs(gen, dtype, t=5, past=0):
    """`past`: the positions start past it (a decode deep in a sequence)."""
    x = gen.randn(B, t, D, dtype=dtype)
    w_dkv, w_kr = gen.randn(R, D, dtype=dtype, scale=D**-0.5), gen.randn(DR, D, dtype=dtype, scale=D**-0.5)
    return Call((x, w_dkv, w_kr, positions_with_gaps(gen, t) + past), names=("x", "w_dkv", "w_kr", "positions"))


def _compress(x, w_dkv, w_kr, positions, *, rope_latent=False, rope_key=True, from_zero=False, interleaved=False,
              rotated_first=False):
    """interleaved: the (B, T) rows flattened batch-major, rotated by positions.repeat_interleave(B); rotated_first:
    x rotated (at its own width) before w_kr, the projection of the rotation and no rotation after it."""
    if from_zero:
        positions = torch.arange(len(positions))
    c_kv, k_rope = x @ w_dkv.T, x @ w_kr.T
    if rotated_first:
        return c_kv, ref.apply_rope(x, positions) @ w_kr.T
    if interleaved:
        b, t = x.shape[:2]
        return c_kv, ref.apply_rope(k_rope.reshape(b * t, -1), positions.repeat_interleave(b)).view(b, t, -1)
    return (ref.apply_rope(c_kv, positions) if rope_latent else c_kv,
            ref.apply_rope(k_rope, positions) if rope_key else k_rope)


def fused_split_reversed(x, w_dkv, w_kr, positions):
    """One product by the two weights stacked in one order, split as if stacked in the other: x @ [w_dkv; w_kr]ᵀ
    split as [qk_rope_head_dim, kv_lora_rank] (the key taken first), or x @ [w_kr; w_dkv]ᵀ split as [kv_lora_rank,
    qk_rope_head_dim] (the latent taken first)."""
    rank, rope_width = w_dkv.shape[0], w_kr.shape[0]
    latent_first = x @ torch.cat([w_dkv, w_kr]).T
    key_first = x @ torch.cat([w_kr, w_dkv]).T
    return [(latent_first[..., rope_width:], ref.apply_rope(latent_first[..., :rope_width], positions)),
            (key_first[..., :rank], ref.apply_rope(key_first[..., rank:], positions))]


def _unless_one_token(**knobs):
    """A mistake's answer, but none for a single token: at position p alone, rotating by 0 (positions ignored) and
    not rotating at all give the same numbers, so that check names neither."""
    return lambda x, *a: [] if x.shape[1] == 1 else _compress(x, *a, **knobs)


UNTRANSPOSED = r"cannot be multiplied|size mismatch|shape mismatch|must match the size"

ONE_TOKEN = Mistake("compress_kv.one_token_mishandled", "right for several tokens, wrong for one: an axis of size "
                    "1 was squeezed or indexed away; keep (B, 1, kv_lora_rank) and (B, 1, qk_rope_head_dim)")

# Positions past 1000: bfloat16 holds whole numbers only up to 256, and past 1024 only multiples of 8
COMPRESS_FAR_HALF = Mistake("compress_kv.positions_rounded", "right in float32, wrong in bfloat16 past position 256: "
                            "the positions were cast to x's dtype (positions.to(x)); move them with .to(x.device)",
                            why="apply_rope turns them into angles in float32; bfloat16 rounds a position past 256 "
                                "first, and the key turns by the wrong angle (blind set 56's b09).")

COMPRESS = StepSpec(
    "compress_kv", compress_inputs, ref.compress_kv, outputs=("c_kv", "k_rope"),
    checks=(shape(1), values("values", 3, FLOATS), values("one_token", 1, situation=ONE_TOKEN, t=1),
            values("far_bfloat16", 1, (torch.bfloat16,), situation=COMPRESS_FAR_HALF, past=1000), device(1)),
    mistakes=(
        Mistake("compress_kv.rope_on_latent", "RoPE was applied to c_kv: the latent carries no position; rotate only "
                "k_rope = RoPE(x @ w_krᵀ)", lambda *a: _compress(*a, rope_latent=True),
                why="A rotation between the latent and w_uk would keep w_uk from being folded into the query, so the "
                    "position lives in the separate, shared RoPE key."),
        Mistake("compress_kv.rope_not_applied", "k_rope was not rotated: k_rope = apply_rope(x @ w_krᵀ, positions)",
                _unless_one_token(rope_key=False)),
        Mistake("compress_kv.positions_ignored", "rotated with positions 0 … T − 1, not the positions given: decoding "
                "token p must turn by p; pass positions to apply_rope", _unless_one_token(from_zero=True)),
        Mistake("compress_kv.positions_repeated_per_row", "rows flattened batch-major were rotated by "
                "positions.repeat_interleave(B): use positions.repeat(B), or rotate (B, T, Dr) by positions as given",
                _unless_one_token(interleaved=True),
                why="repeat_interleave repeats each position B times in a row; the rows run through one sequence's "
                    "tokens before the next sequence's."),
        Mistake("compress_kv.weight_not_transposed", "x @ w multiplied by the weight as stored, (out, in): use x @ "
                "w.T, as nn.Linear does", raises=Raises(message=UNTRANSPOSED, line=r"@\s*w_(dkv|kr)\b(?!\s*\.)")),
        Mistake("compress_kv.fused_split_reversed", "one projection by the two weights stacked was split in the "
                "other order: split it in the order they were stacked, [w_dkv; w_kr] into kv_lora_rank, then "
                "qk_rope_head_dim",
                fused_split_reversed,
                why="Fusing the two weights into one matmul is what DeepSeek's code does (wkv_a); the split must "
                    "follow the order they were stacked in."),
        Mistake("compress_kv.rope_before_projection", "x was rotated before w_kr projected it: a rotation does not "
                "pass through a projection; rotate the projected key, apply_rope(x @ w_krᵀ, positions)",
                _unless_one_token(rotated_first=True),
                why="DeepSeek rotates the small key w_kr makes: the positions then live in qk_rope_head_dim features, "
                    "each pair turning at its own frequency."),
    ),
)

# -- expand_kv ----------------------------------------------------------------------------


def expand_inputs(gen, dtype, t=5):
    c_kv = gen.randn(B, t, R, dtype=dtype)
    w_uk, w_uv = gen.randn(H * DN, R, dtype=dtype, scale=R**-0.5), gen.randn(H * DV, R, dtype=dtype, scale=R**-0.5)
    return Call((c_kv, w_uk, w_uv, H), names=("c_kv", "w_uk", "w_uv", "num_heads"))


def _expand(c_kv, w_uk, w_uv, num_heads, *, split="right", only=""):
    """The keys and values, both split into heads the `split` way, or only the one `only` names ("k" or "v")."""
    b, t, _ = c_kv.shape

    def heads(y, part):
        way = split if only in ("", part) else "right"
        if way == "no_transpose":
            return y.reshape(b, num_heads, t, -1)
        if way == "heads_inner":
            return y.view(b, t, -1, num_heads).permute(0, 3, 1, 2)
        return y.view(b, t, num_heads, -1).transpose(1, 2)

    if split == "weight_viewed":  # each weight's (H·width, R) storage read as (H, R, width), one matrix per head
        right = heads(c_kv @ w_uk.T, "k"), heads(c_kv @ w_uv.T, "v")
        viewed = [c_kv[:, None] @ w.reshape(num_heads, c_kv.shape[-1], -1) for w in (w_uk, w_uv)]
        return tuple(v if only in ("", part) else r for v, r, part in zip(viewed, right, "kv", strict=True))
    if split == "product_transposed":  # w @ c_kvᵀ, (B, H·width, T), reshaped straight to (B, H, T, width)
        right = heads(c_kv @ w_uk.T, "k"), heads(c_kv @ w_uv.T, "v")
        flipped = [(w @ c_kv.transpose(1, 2)).reshape(b, num_heads, t, -1) for w in (w_uk, w_uv)]
        return tuple(f if only in ("", part) else r for f, r, part in zip(flipped, right, "kv", strict=True))
    if split == "stacked":  # [w_uk; w_uv] as one kv_b_proj, each head's row cut [Dn, Dv] as DeepSeek's interleaved
        dn, dv = w_uk.shape[0] // num_heads, w_uv.shape[0] // num_heads
        both = (c_kv @ torch.cat([w_uk, w_uv]).T).view(b, t, num_heads, dn + dv).transpose(1, 2)
        return both[..., :dn], both[..., dn:]
    return heads(c_kv @ w_uk.T, "k"), heads(c_kv @ w_uv.T, "v")


def _split_wrong(split: str):
    """A split of `split`'s for the keys and the values, or for one of them (a line written twice, fixed once)."""
    return lambda *a: [_expand(*a, split=split, only=only) for only in ("", "k", "v")]


EXPAND = StepSpec(
    "expand_kv", expand_inputs, ref.expand_kv, outputs=("k_nope", "v"),
    checks=(shape(1), values("values", 3, FLOATS), values("noncontiguous", 1, strided=(0,)),  # a cache's slice
            device(1)),
    mistakes=(
        Mistake("expand_kv.split_no_transpose", "(B, T, H·width) reshaped straight to (B, H, T, width) mixes "
                "tokens and heads: view(B, T, H, width), then transpose(1, 2)",
                _split_wrong("no_transpose")),
        Mistake("expand_kv.weights_stacked_not_interleaved", "w_uk and w_uv stacked as one kv_b_proj, then each "
                "head's row cut [Dn, Dv]: DeepSeek's kv_b_proj alternates head by head; expand each by its own "
                "weight", lambda *a: _expand(*a, split="stacked"),
                why="With one head the two layouts agree; with more, head h gets rows of other heads' keys and "
                    "values."),
        Mistake("expand_kv.weight_viewed_per_head", "the weight (H·width, R) was viewed as (H, R, width), reading its "
                "numbers in another order: view it (H, width, R) and transpose, or split c_kv @ w.T into heads",
                _split_wrong("weight_viewed"),
                why="view keeps the memory's order: the rows of head h are its width rows of R numbers each."),
        Mistake("expand_kv.product_transposed", "w @ c_kvᵀ is (B, H·width, T), features before tokens; reshaped "
                "to (B, H, T, width) it mixes them: use c_kv @ wᵀ, view(B, T, H, width), transpose(1, 2)",
                _split_wrong("product_transposed")),
        Mistake("expand_kv.heads_inner", "split the features as (width, H), heads inner: head h owns rows "
                "h·width … (h + 1)·width − 1, so view(B, T, H, width)", _split_wrong("heads_inner")),
        Mistake("expand_kv.weight_not_transposed", "c_kv @ w multiplied by the weight as stored, (out, in): use "
                "c_kv @ w.T", raises=Raises(message=UNTRANSPOSED, line=r"@\s*w_u[kv]\b(?!\s*\.)")),
        Mistake("expand_kv.value_from_key_weight", "v was up-projected with w_uk (a copied line): "
                "v = heads(c_kv @ w_uvᵀ), with the value weight", lambda c_kv, w_uk, w_uv, num_heads: (
                    _expand(c_kv, w_uk, w_uv, num_heads)[0], _expand(c_kv, w_uk, w_uk, num_heads)[1]),
                why="w_uk and w_uv both take the latent in; only w_uv's rows are the values (Dv wide, not Dn)."),
        Mistake("expand_kv.outputs_swapped", "returned (v, k_nope), or expanded each with the other's weight: "
                "k_nope = heads(c_kv @ w_ukᵀ) first, v = heads(c_kv @ w_uvᵀ) second",
                lambda c_kv, w_uk, w_uv, num_heads: [_expand(c_kv, w_uk, w_uv, num_heads)[::-1],
                                                     _expand(c_kv, w_uv, w_uk, num_heads)]),
    ),
)

# -- mla_scores ---------------------------------------------------------------------------


def scores_inputs(gen, dtype, tq=3, tk=5, b=B):
    q_nope, q_rope = gen.randn(b, H, tq, DN, dtype=dtype), gen.randn(b, H, tq, DR, dtype=dtype)
    k_nope, k_rope = gen.randn(b, H, tk, DN, dtype=dtype), gen.randn(b, tk, DR, dtype=dtype)
    return Call((q_nope, q_rope, k_nope, k_rope), names=("q_nope", "q_rope", "k_nope", "k_rope"))


def _scores(q_nope, q_rope, k_nope, k_rope, *, width=None, rope_scaled=True, nope_scaled=True, rope=True,
            per_part=False):
    scale = math.sqrt(width or (q_nope.shape[-1] + q_rope.shape[-1]))
    nope = q_nope @ k_nope.transpose(-2, -1)
    part = q_rope @ k_rope.unsqueeze(1).transpose(-2, -1) if rope else 0
    if per_part:  # each part by the square root of its own width
        return nope / math.sqrt(q_nope.shape[-1]) + part / math.sqrt(q_rope.shape[-1])
    if not nope_scaled:  # nope + rope / scale: the division bound tighter than the sum
        return nope + part / scale
    return (nope + part) / scale if rope_scaled else nope / scale + part


def _rope_summed_over_heads(q_nope, q_rope, k_nope, k_rope):
    """Every head's RoPE part the sum of all heads' (an einsum that drops h), the no-position part its own."""
    rope = (q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)).sum(1, keepdim=True)
    return _scores(q_nope, q_rope, k_nope, k_rope, rope=False) + rope / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])


def _parts_misaligned(q_nope, q_rope, k_nope, k_rope):
    """The scores of one product over [nope, rope] queries and [rope, nope] keys, and the other way round."""
    k_rope = k_rope.unsqueeze(1).expand(*k_nope.shape[:-1], k_rope.shape[-1])  # (B, H, Tk, Dr)
    scale = math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    orders = (((q_nope, q_rope), (k_rope, k_nope)), ((q_rope, q_nope), (k_nope, k_rope)))
    return [torch.cat(q, -1) @ torch.cat(k, -1).transpose(-2, -1) / scale for q, k in orders]


def _scaled_by_a_size(q_nope, q_rope, k_nope, k_rope):
    """The scale's width read from an axis that is no width, in place of Dn or of Dr (k_rope.size(1) is Tk)."""
    dn, dr, h, t_q, t_k = q_nope.shape[-1], q_rope.shape[-1], q_nope.shape[1], q_nope.shape[-2], k_nope.shape[-2]
    return [_scores(q_nope, q_rope, k_nope, k_rope, width=w)
            for w in (dn + t_k, dn + t_q, dn + h, t_k + dr, t_q + dr, h + dr, t_k, t_q)]


def _rope_key_interleaved(q_nope, q_rope, k_nope, k_rope):
    """The shared key made per head by repeating each token H times in a row, then viewed (B, H, Tk, Dr)."""
    b, t_k, dr = k_rope.shape
    keys = k_rope.repeat_interleave(q_nope.shape[1], dim=1).view(b, -1, t_k, dr)
    nope, rope = q_nope @ k_nope.transpose(-2, -1), q_rope @ keys.transpose(-2, -1)
    return (nope + rope) / math.sqrt(q_nope.shape[-1] + dr)


def _off_by_a_factor(value, *args, **kwargs) -> bool:
    """The answer is the right scores times one number other than 1 (the least-squares one)."""
    right = ref.mla_scores(*args, **kwargs).double()
    if not isinstance(value, torch.Tensor) or value.shape != right.shape or not value.is_floating_point():
        return False
    factor = float((value.double() * right).sum() / (right * right).sum().clamp(min=1e-300))
    return abs(factor - 1) > 1e-2 and bool(torch.allclose(value.double(), factor * right, rtol=1e-3, atol=1e-5))


SCORES_ONE = Mistake("mla_scores.one_query_mishandled", "right for several queries, wrong for one: keep the query "
                     "axis of size 1 (no squeeze), and broadcast k_rope over the heads with k_rope.unsqueeze(1)")
SCORES_SIZES = Mistake("mla_scores.sizes_mishandled", "wrong for 2 queries and 11 keys: a size was taken from the "
                       "wrong tensor or fixed; the scores are (B, H, Tq, Tk), Tq from queries, Tk from keys")

SCORES_BATCH = Mistake("mla_scores.batch_mishandled", "right for one sequence, wrong for a batch: an axis was lined "
                       "up with the batch; k_rope is (B, Tk, Dr), its head axis added at 1: k_rope.unsqueeze(1)")


def exact_in_float64(value, expected, call, tolerance=None, outputs=()):
    """The scores are products and sums, no exponent: a float64 answer is held to float64's own precision
    (EXACT_FLOAT64), so a scale rounded to float32 (torch.rsqrt(torch.tensor(d)), 3e-8 of each value) costs this step,
    named, rather than by chance the module that amplifies it (blind sets 50 and 53, their b11)."""
    expect_close(value, expected, call, tolerance, outputs)
    if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
        try:
            expect_close(value, expected, call, EXACT_FLOAT64, outputs)
        except CheckFailed as failure:  # right to float32's precision and no better
            raise CheckFailed(failure.message, search.COMPUTED_IN_FLOAT32, failure.details) from None


SCORES = StepSpec(
    "mla_scores", scores_inputs, ref.mla_scores, compare=exact_in_float64,
    probes=(Probe({"b": 1}, SCORES_BATCH),),
    checks=(shape(1), values("values", 3, FLOATS), values("one_query", 2, situation=SCORES_ONE, tq=1),
            values("many_keys", 1, situation=SCORES_SIZES, tq=2, tk=11), device(1)),
    mistakes=(
        Mistake("mla_scores.parts_misaligned", "the queries were concatenated as [nope, rope] and the keys as "
                "[rope, nope] (or the other way): put both parts in the same order, or add q_nope·k_nopeᵀ and "
                "q_rope·k_ropeᵀ", _parts_misaligned,
                why="With the two widths different, no error: nope features are dotted with rope features."),
        Mistake("mla_scores.scaled_by_nope", "scaled by √qk_nope_head_dim: each head's query and key are [nope, rope], "
                "so scale by √(qk_nope_head_dim + qk_rope_head_dim)", lambda qn, *a: _scores(qn, *a, width=DN)),
        Mistake("mla_scores.scaled_by_a_size", "the scale's width was read from an axis that is no width (a length "
                "or the heads: k_rope.size(1) is Tk): scale by √(q_nope.shape[-1] + q_rope.shape[-1])",
                _scaled_by_a_size,
                why="k_rope (B, Tk, Dr) has no head axis, so its axis 1 is the keys, not the width."),
        Mistake("mla_scores.rope_part_summed_over_heads", "the RoPE part was summed over the heads: each head dots "
                "its own q_rope with the shared key, q_rope @ k_ropeᵀ per head", _rope_summed_over_heads,
                why="An einsum whose output drops h ('bhqr,bkr->bqk') sums over it."),
        Mistake("mla_scores.scale_precedence", "the power or root bound tighter than the sum: Dn + Dr ** -0.5 is "
                "Dn + 1/√Dr; write (Dn + Dr) ** -0.5", lambda qn, qr, *a: [
                    _scores(qn, qr, *a, width=1) * (qn.shape[-1] + qr.shape[-1] ** -0.5),
                    _scores(qn, qr, *a, width=1) / (qn.shape[-1] + qr.shape[-1] ** 0.5)]),
        Mistake("mla_scores.unscaled", "scores not scaled: divide the sum by √(qk_nope_head_dim + qk_rope_head_dim)",
                lambda *a: _scores(*a, width=1)),
        Mistake("mla_scores.rope_part_unscaled", "only the no-position part was scaled: divide the sum of both parts "
                "by √(qk_nope_head_dim + qk_rope_head_dim)", lambda *a: _scores(*a, rope_scaled=False)),
        Mistake("mla_scores.nope_part_unscaled", "only the RoPE part was scaled, nope + rope / √(Dn + Dr): divide "
                "the sum of both parts, (nope + rope) / √(Dn + Dr)", lambda *a: _scores(*a, nope_scaled=False),
                why="The division binds tighter than the sum: without brackets only the RoPE part is scaled."),
        Mistake("mla_scores.scaled_per_part", "each part was scaled by the square root of its own width: the query "
                "and key are one [nope, rope] vector, so divide their sum by √(qk_nope_head_dim + qk_rope_head_dim)",
                lambda *a: _scores(*a, per_part=True)),
        Mistake("mla_scores.rope_part_dropped", "the RoPE part is missing: add q_rope @ k_ropeᵀ, the shared key "
                "broadcast over the heads", lambda *a: [_scores(*a, rope=False), _scores(*a, rope=False, width=DN)],
                why="Without it the scores carry no position at all."),
        Mistake("mla_scores.key_rotated_again", "k_rope was rotated again: it comes rotated by compress_kv, at its "
                "tokens' positions; use it as given",
                lambda q_n, q_r, k_n, k_r: _scores(q_n, q_r, k_n, rotated_again(k_r))),
        Mistake("mla_scores.rope_key_heads_interleaved", "the shared key was repeated with repeat_interleave over "
                "the tokens and viewed (B, H, Tk, Dr), so head h reads other tokens' keys: broadcast it, "
                "k_rope.unsqueeze(1)",
                _rope_key_interleaved,
                why="repeat_interleave repeats each token H times in a row; viewed as (H, Tk), the rows are mixed."),
        Mistake("mla_scores.scaled_by_a_constant", "every score is the right one times one constant: the scale is "
                "(qk_nope_head_dim + qk_rope_head_dim) ** -0.5, with no other factor (no YaRN mscale here)",
                test=_off_by_a_factor,
                why="DeepSeek-V3's long-context softmax_scale multiplies by YaRN's mscale²; this model has no YaRN."),
        Mistake("mla_scores.rope_key_not_shared", "k_rope (B, Tk, Dr) was used as if it had a head axis: it is one key "
                "per token, shared by the heads; k_rope.unsqueeze(1) broadcasts it",
                raises=Raises(message=r"must match the size|broadcast|Expected size", line=r"k_rope"),
                why="Without the head axis, matmul lines the batch axis of k_rope up with the heads of q_rope."),
    ),
)

# -- absorbed_attention -------------------------------------------------------------------

ABSORBED_NAMES = ("q_nope", "q_rope", "c_kv", "k_rope", "w_uk", "w_uv", "w_o")


def absorbed_inputs(gen, dtype, tq=3, tk=5, masked=True, widths=None, padded=False, batched=False, loud=False):
    """`loud`: the RoPE queries 200 times larger, so that scores reach hundreds and e^s overflows float32 unless the
    row's max is subtracted first. `widths` (a dict of h, dn, dr, dv, d, r) replaces the exercise's sizes; `padded`: the
    mask blocks the first two
    keys too (left padding), so that it blocks some key even for one query; `batched`: a (B, H, Tq, Tk) mask, the
    second sequence's first key blocked (its padding), and every head but the first its second key too: a mask of
    its own per sequence and head, as the contract allows (the fortieth blind set cut it to head 0)."""
    h, dn, dr, dv, d, r = (dict(h=H, dn=DN, dr=DR, dv=DV, d=D, r=R) | (widths or {})).values()
    q_nope = gen.randn(B, h, tq, dn, dtype=dtype)
    q_rope = gen.randn(B, h, tq, dr, dtype=dtype, scale=200.0 if loud else 1.0)
    c_kv, k_rope = gen.randn(B, tk, r, dtype=dtype), gen.randn(B, tk, dr, dtype=dtype)
    w_uk, w_uv = gen.randn(h * dn, r, dtype=dtype, scale=r**-0.5), gen.randn(h * dv, r, dtype=dtype, scale=r**-0.5)
    w_o = gen.randn(d, h * dv, dtype=dtype, scale=(h * dv) ** -0.5)
    mask = bottom_right(tq, tk)
    if padded:
        mask[:, :2] = False
    if batched:
        mask = mask.expand(B, h, tq, tk).clone()
        mask[1:, :, :, 0] = False
        mask[:, 1:, :, 1] = False
    kwargs = {"mask": mask} if masked else {}
    return Call((q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o), kwargs, ABSORBED_NAMES)


def _absorbed(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None, *, width=None, uk="right", uv="right",
              mask_ignored=False, mask_inverted=False, merge_heads_inner=False, softmax_dim=-1, wo_untransposed=False,
              fill=float("-inf"), rope=True, merge_untransposed=False, scaled="both", heads_summed=False,
              stacked=False, mask_after_softmax=False, mask_added=False, batch_heads_mixed=""):
    """The absorbed path, per head, with the knobs of its mistakes: how w_uk and w_uv are cut into heads, which part
    of the scores is scaled ("both", "nope", "rope" or "per_part", each by the square root of its own width;
    "nope_twice" or "rope_twice": that part once more, a pre-scaled query's); `batch_heads_mixed` ("query" or
    "latents"): that product made with the heads as the batch, (H, B·Tq, ·), and viewed straight as (B, H, Tq, ·)."""
    mixed = lambda t: t.transpose(0, 1).reshape(t.shape)  # noqa: E731  (H, B, ·) in memory, read as (B, H, ·)
    h, dn, dr, r = q_nope.shape[1], q_nope.shape[-1], q_rope.shape[-1], c_kv.shape[-1]
    dv = w_uv.shape[0] // h
    cut = {  # each head's (width, R) matrix: right, or the weight's numbers scrambled into that shape
        "right": lambda w, n: w.reshape(h, n, r), "viewed": lambda w, n: w.reshape(h, r, n).transpose(1, 2),
        "transposed": lambda w, n: w.T.reshape(h, n, r), "transposed_viewed": lambda w, n: w.T.reshape(h, r, n).mT,
        "heads_inner": lambda w, n: w.reshape(n, h, r).transpose(0, 1)}
    key_weight, value_weight = cut[uk](w_uk, dn), cut[uv](w_uv, dv)
    if stacked:  # [all heads' keys; all heads' values] viewed as DeepSeek's wkv_b, interleaved per head
        both = torch.cat([w_uk, w_uv]).reshape(h, dn + dv, r)
        key_weight, value_weight = both[:, :dn], both[:, dn:]
    q_latent = q_nope @ key_weight
    nope = (mixed(q_latent) if batch_heads_mixed == "query" else q_latent) @ c_kv.unsqueeze(1).transpose(-2, -1)
    part = q_rope @ k_rope.unsqueeze(1).transpose(-2, -1) if rope else 0
    scale = math.sqrt(width or dn + dr)
    scores = {"both": lambda: (nope + part) / scale, "nope": lambda: nope / scale + part,
              "rope": lambda: nope + part / scale,
              "per_part": lambda: nope / math.sqrt(dn) + part / math.sqrt(dr),
              "nope_twice": lambda: (nope / scale + part) / scale, "rope_twice": lambda: (nope + part / scale) / scale,
              }[scaled]()
    if mask is not None and mask_added:  # a bool mask added to the scores: 1 where allowed, 0 where blocked
        scores = scores + mask
    elif mask is not None and not mask_ignored and not mask_after_softmax:
        scores = scores.masked_fill(mask if mask_inverted else ~mask, fill)
    weights = torch.softmax(scores, dim=softmax_dim)
    if mask is not None and mask_after_softmax:  # the blocked weights zeroed, the rest not renormalised
        weights = weights.masked_fill(~mask, 0.0)
    if heads_summed:  # w_o @ w_uv, (D, R): every head's output matrix times every head's value matrix, summed
        return (weights @ c_kv.unsqueeze(1)).sum(1) @ (w_o @ w_uv).T
    latents = weights @ c_kv.unsqueeze(1)  # (B, H, Tq, R)
    y = (mixed(latents) if batch_heads_mixed == "latents" else latents) @ value_weight.transpose(-2, -1)  # (…, Dv)
    if wo_untransposed:  # w_o (D, H·Dv) reshaped straight to (H, Dv, D): its numbers scrambled into that shape
        return torch.einsum("bhqv,hvd->bqd", y, w_o.reshape(h, dv, -1))
    merged = y.permute(0, 2, 3, 1) if merge_heads_inner else y.transpose(1, 2)  # (B, Tq, Dv, H) or (B, Tq, H, Dv)
    merged = y if merge_untransposed else merged  # (B, H, Tq, Dv) read straight as (B, Tq, H·Dv)
    return merged.reshape(*y.shape[:1], y.shape[2], h * dv) @ w_o.T


def _absorbed_variant(**knobs):
    return lambda *a, **k: _absorbed(*a, **k, **knobs)


def _cut_wrong(weight: str):
    """A mistake of `weight` ("uk" or "uv") cut into heads: viewed in the wrong order, or its transpose reshaped."""
    forms = ("viewed", "transposed", "transposed_viewed", "heads_inner")
    return lambda *a, **k: [_absorbed(*a, **k, **{weight: form}) for form in forms]


ABSORBED_NO_MASK = Mistake("absorbed_attention.no_mask_mishandled", "right with a mask, wrong without one: "
                           "mask=None means every key is seen; apply the mask only when it is given")
ABSORBED_LARGE = Mistake("absorbed_attention.large_scores_mishandled", "right for small scores, wrong for scores "
                         "in the hundreds: subtract each row's max before exp (torch.softmax does), so e^s never "
                         "overflows")
ABSORBED_ONE = Mistake("absorbed_attention.one_query_mishandled", "right for several queries, wrong for one: keep the "
                       "query axis of size 1 (no squeeze) through the folded query, the softmax and the output")
ABSORBED_SIZES = Mistake("absorbed_attention.sizes_mishandled", "wrong for 4 queries and 11 keys: a size was taken "
                         "from the wrong tensor or fixed; Tq comes from the queries, Tk from c_kv and k_rope")

ABSORBED_MASK_AXES = Mistake("absorbed_attention.batched_mask_mishandled", "right with a (Tq, Tk) mask, wrong "
                             "with one per sequence and head, (B, H, Tq, Tk): apply the mask as given to scores kept "
                             "(B, H, Tq, Tk)")
ABSORBED_QUERIES = Mistake("absorbed_attention.queries_mishandled", "right for one query, wrong for several: the "
                           "query axis was lined up with another; a (Tq, Tk) mask broadcasts as is, and the heads stay "
                           "at axis 1")

EXPANDED = Mistake("absorbed_attention.latents_expanded", "expanded the latents into per-head keys or values: fold "
                   "w_uk into the query and w_uv into the output, and attend over c_kv itself",
                   why="What absorbing saves is exactly that expansion: H·(Dn + Dv) numbers per cached token read "
                       "at every decoded token, where the latent holds kv_lora_rank.")
# latent_only's sizes: Tq 7 and, drawn under the draw key (review 71's F1 took the absorbed path at fixed widths only),
# Tk and the per-head widths distinct primes past B·H·Tq's factors (2, 3, 7), R and Dr's (2): a key or value of every
# token for each head shows in a tensor's element count, however its axes were flattened, and nothing else's does
LATENT_TQ = 7
LATENT_PRIMES = (11, 13, 17, 19, 23, 29)


def latent_sizes(run: Run) -> tuple[int, dict]:
    """latent_only's Tk and widths, drawn with Gen.unknown."""
    tk, dn, dv, d = (LATENT_PRIMES[int(i)] for i in torch.randperm(len(LATENT_PRIMES), generator=run.gen.unknown)[:4])
    return tk, {"h": 3, "dn": dn, "dr": 6, "dv": dv, "d": d, "r": 4}


def _per_head_per_key(size, tk: int, widths: dict) -> bool:
    """A tensor holding a per-head width (Dn, Dv, or the model's D, which values folded through w_o have) for every
    key, in any layout (an axis of Tk, Tk flattened with the batch, everything flattened into one axis, queries
    beside them): keys or values expanded from the latents. c_kv (Tk, R), k_rope (Tk, Dr), their views and
    broadcasts over the heads, and the scores (Tq, Tk) are not: only Tk has its factor, and only those widths
    theirs."""
    elements = math.prod(size)
    return any(elements % (tk * widths[w]) == 0 for w in ("dn", "dv", "d"))


def _model(tk: int, w: dict, tq: int) -> str:
    return f"Tq={tq}, Tk={tk} and H={w['h']}, Dn={w['dn']}, Dr={w['dr']}, Dv={w['dv']}, D={w['d']}, R={w['r']}"


def _listed(record) -> list:
    """The shapes a call created, all of them listed: a call that made more than the record lists (review 58's F2
    made 299 first, to hide the expanded keys past the list) fails."""
    record = record or {"created": [], "more": 0}
    if record.get("more"):
        raise CheckFailed(f"the call created tensors of more than {len(record['created'])} different shapes: too many "
                          "to check what it expands", EXPANDED)
    return record["created"]


def latent_only(run: Run) -> None:
    """Nothing the call's torch functions create is a per-head key or value of every cached token; and the answer is
    right. Keys expanded head by head, or all at once, or values through the folded output matrix, are. Every size
    is drawn for the file (latent_sizes, spread_model), so no width tells this check from the others."""
    tk, widths = latent_sizes(run)
    call = run.inputs(tq=LATENT_TQ, tk=tk, widths=widths)
    got = run.answer(call, shapes=True)
    expect_seen(got, EXPANDED)
    record = got.shapes or {"created": [], "more": 0, "scores": []}
    if record["more"]:
        raise CheckFailed(f"the call created tensors of more than {len(record['created'])} different shapes: too many "
                          "to check what it expands", EXPANDED)
    for size in record["created"]:
        if _per_head_per_key(size, tk, widths):
            raise CheckFailed(f"with {_model(tk, widths, LATENT_TQ)}: a tensor of shape {tuple(size)} was created, a "
                              "per-head key or value for every cached token; the absorbed path reads only c_kv and "
                              "k_rope per token", EXPANDED, {"shape": list(size)})
    run.expect_right(run.output(got), call)
    # Keys or values of one token more (a padded latent, the thirty-third review's f02), of half the tokens (the
    # thirty-fourth's F2), through weights padded to another width (the thirty-fifth's f04), or padded to a constant
    # 256 tokens (review 60's F3) lose the factors above. Judged by size instead, at absorbed_latents' drawn model:
    # with one query, a tensor past min(Dn, Dv) - 1 numbers per cached token (but the size of an input: the weights
    # and their views) is keys or values expanded, whatever its widths, padded or not, or in pieces; nothing of the
    # absorbed path holds more than B·H·(R + Dr).
    spread, total = spread_model(run)
    bound = min(spread["dn"], spread["dv"]) - 1
    call = run.inputs(tq=1, tk=total, widths=spread)
    given = {math.prod(t.shape) for t in call.args}
    got = run.answer(call, shapes=True)
    expect_seen(got, EXPANDED)
    for size in _listed(got.shapes):
        elements = math.prod(size)
        if elements not in given and elements > bound * total:
            held = B * spread["h"] * (spread["r"] + spread["dr"])
            raise CheckFailed(f"with {_model(total, spread, 1)}: a tensor of shape {tuple(size)} was created, "
                              f"{elements / total:.0f} numbers per cached token (the latent and the RoPE key hold "
                              f"{held} over every head): keys or values expanded, padded or in pieces; the absorbed "
                              "path reads only c_kv and k_rope", EXPANDED, {"shape": list(size)})
    # A loop over the cached tokens makes no tensor of them all, but as many of their keys or values (the
    # thirty-second review's f02): its calls grow with Tk, where the absorbed path's are as many for any Tk.
    got = run.answer(run.inputs(tq=LATENT_TQ, tk=2 * tk, widths=widths), shapes=True)
    expect_seen(got, EXPANDED)
    longer = got.shapes
    calls = (record.get("calls", 0), (longer or {}).get("calls", 0))
    if calls[1] > calls[0]:
        raise CheckFailed(f"with Tk={tk} the call made {calls[0]} torch calls, with Tk={2 * tk} "
                          f"{calls[1]}: it works token by token over the cache; the absorbed path reads c_kv and "
                          "k_rope whole, as many calls for any Tk", EXPANDED, {"calls": list(calls)})


ABSORBED = StepSpec(
    "absorbed_attention", absorbed_inputs, ref.absorbed_attention,
    probes=(Probe({"tq": 1}, ABSORBED_QUERIES),),
    checks=(shape(1), values("values", 2, FLOATS), values("unmasked", 2, situation=ABSORBED_NO_MASK, masked=False),
            values("one_query", 1, situation=ABSORBED_ONE, tq=1, padded=True),
            values("large_scores", 1, (torch.float32,), situation=ABSORBED_LARGE, loud=True),
            values("many_keys", 1, situation=ABSORBED_SIZES, tq=4, tk=11),
            values("batched_mask", 1, situation=ABSORBED_MASK_AXES, batched=True), prop("latent_only", 3, latent_only),
            device(1)),
    mistakes=(
        Mistake("absorbed_attention.scaled_by_latent_width", "scaled by √kv_lora_rank (or √(kv_lora_rank + Dr)), the "
                "absorbed query's width: the scores are still the keys' [nope, rope] dot products; scale by √(Dn + Dr)",
                lambda *a, **k: [_absorbed(*a, **k, width=w) for w in (R, R + DR)]),
        Mistake("absorbed_attention.scaled_by_nope", "scaled by √qk_nope_head_dim: scale by √(qk_nope_head_dim + "
                "qk_rope_head_dim)", _absorbed_variant(width=DN)),
        Mistake("absorbed_attention.scaled_by_v_head_dim", "scaled by √v_head_dim: the scores are the keys' "
                "[nope, rope] dot products; scale by √(qk_nope_head_dim + qk_rope_head_dim)",
                _absorbed_variant(width=DV)),
        Mistake("absorbed_attention.rope_part_unscaled", "only the absorbed (no-position) part was scaled: divide the "
                "sum of both parts, (q_latent c_kvᵀ + q_rope k_ropeᵀ) / √(Dn + Dr)", _absorbed_variant(scaled="nope"),
                why="Both parts are pieces of one dot product of [nope, rope] vectors; the RoPE part unscaled "
                    "outweighs the other by √(Dn + Dr)."),
        Mistake("absorbed_attention.nope_part_unscaled", "only the RoPE part was scaled, nope + rope / √(Dn + Dr): "
                "divide the sum of both parts", _absorbed_variant(scaled="rope")),
        Mistake("absorbed_attention.scaled_by_a_size", "the scale's width was read from an axis that is no width "
                "(k_rope.shape[1] is Tk): scale by √(q_nope.shape[-1] + q_rope.shape[-1])",
                lambda qn, qr, c, kr, *a, **k: _absorbed(qn, qr, c, kr, *a, **k, width=qn.shape[-1] + kr.shape[1])),
        Mistake("absorbed_attention.part_scaled_twice", "one part of the scores was scaled twice (its query "
                "pre-scaled, then the sum scaled): scale once, (q_latent c_kvᵀ + q_rope k_ropeᵀ) / √(Dn + Dr)",
                lambda *a, **k: [_absorbed(*a, **k, scaled=twice) for twice in ("nope_twice", "rope_twice")]),
        Mistake("absorbed_attention.scaled_per_part", "each part was scaled by the square root of its own width: "
                "divide their sum by √(qk_nope_head_dim + qk_rope_head_dim)", _absorbed_variant(scaled="per_part")),
        Mistake("absorbed_attention.batch_and_heads_mixed", "a product made with the heads as the batch, (H, B·Tq, "
                "·), was viewed straight as (B, H, Tq, ·): view it (H, B, Tq, ·), then transpose(0, 1)",
                lambda *a, **k: [_absorbed(*a, **k, batch_heads_mixed=m) for m in ("query", "latents")],
                why="Right for a batch of one, where the two orders agree (blind set 60's b14, vLLM's head-batched "
                    "bmm)."),
        Mistake("absorbed_attention.key_weight_cut_wrong", "w_uk was cut into heads in the wrong order: head h's "
                "key up-projection is w_uk.view(H, Dn, R)[h], so q_nope @ w_uk.view(H, Dn, R)", _cut_wrong("uk"),
                why="w_uk is (H·Dn, R), heads outer: viewing it as (H, R, Dn), or reshaping its transpose, keeps the "
                    "shapes and scrambles the numbers."),
        Mistake("absorbed_attention.value_weight_cut_wrong", "w_uv was cut into heads in the wrong order: head h's "
                "value up-projection is w_uv.view(H, Dv, R)[h], applied as its transpose", _cut_wrong("uv")),
        Mistake("absorbed_attention.weights_stacked_not_interleaved", "w_uk and w_uv stacked, then cut as "
                "DeepSeek's wkv_b (H, Dn + Dv, R): cut each by its own view, w_uk.view(H, Dn, R) and "
                "w_uv.view(H, Dv, R)", _absorbed_variant(stacked=True),
                why="DeepSeek's wkv_b alternates head by head, each head's key rows then its value rows; [every "
                    "head's keys; every head's values] agrees with it for one head only."),
        Mistake("absorbed_attention.bool_mask_added", "the bool mask was added to the scores (True adds 1, a "
                "blocked key nothing): fill the blocked scores with -inf, masked_fill(~mask, -inf)",
                _absorbed_variant(mask_added=True),
                why="DeepSeek's reference adds a float mask of 0 and -inf; this contract's mask is bool, True = may "
                    "attend."),
        Mistake("absorbed_attention.mask_after_softmax", "the blocked weights were zeroed after the softmax, so the "
                "rest no longer sum to 1: fill the blocked scores with -inf before it",
                _absorbed_variant(mask_after_softmax=True)),
        Mistake("absorbed_attention.key_absorbed_transposed", "w_uk folded into the query with the wrong transpose: "
                "q_nope (…, Dn) times head h's w_uk (Dn, R) gives the latent-space query (…, R)",
                raises=Raises(message=r"must match the size|Expected size|cannot be multiplied|shape", line=r"w_uk")),
        Mistake("absorbed_attention.rope_part_dropped", "the scores lack the RoPE part: add q_rope @ k_ropeᵀ (the "
                "shared key, broadcast over the heads) to the absorbed part before scaling",
                lambda *a, **k: [_absorbed(*a, **k, rope=False, width=w) for w in (None, DN, R)]),
        Mistake("absorbed_attention.key_rotated_again", "k_rope was rotated again: the cache holds it rotated by "
                "compress_kv, at its tokens' positions; use it as given",
                lambda q_n, q_r, c, k_r, *a, **k: _absorbed(q_n, q_r, c, rotated_again(k_r), *a, **k)),
        Mistake("absorbed_attention.mask_ignored", "the mask was not applied (or skipped for one query: decode may be "
                "masked too, padding): fill the scores with -inf where it is False, whenever it is given",
                _absorbed_variant(mask_ignored=True)),
        Mistake("absorbed_attention.masked_with_a_number", "the blocked scores were set to a number (0, or a "
                "finite negative): fill them with -inf, so that the softmax gives them no weight",
                lambda *a, **k: [_absorbed(*a, **k, fill=f) for f in (0.0, -1e4, -1e9)],
                why="A score of 0 still weighs e^0 in the softmax: a blocked key keeps a share of the attention."),
        Mistake("absorbed_attention.mask_inverted", "the mask was applied inverted (-inf where it is True): True "
                "means may attend, so fill where it is False, masked_fill(~mask, -inf)",
                _absorbed_variant(mask_inverted=True),
                why="Inverted, a query sees only the keys it must not, and a row with every key allowed becomes NaN."),
        Mistake("absorbed_attention.softmax_over_queries", "the softmax normalised the query axis (dim=-2): each "
                "query's weights over its keys sum to 1, softmax(scores, dim=-1)", _absorbed_variant(softmax_dim=-2)),
        Mistake("absorbed_attention.output_weight_not_transposed", "w_o (D, H·Dv) was reshaped to (H, Dv, D) "
                "without a transpose: head h's output matrix is w_o.T.view(H, Dv, D)[h], or w_o.view(D, H, Dv)",
                _absorbed_variant(wo_untransposed=True),
                why="nn.Linear stores w_o as (out, in) = (D, H·Dv); reshaping it to (H, Dv, D) keeps the shape and "
                    "scrambles which number meets which head's output."),
        Mistake("absorbed_attention.heads_folded_together", "w_uv folded into w_o as w_o @ w_uv over the heads' "
                "summed latents: fold head by head, w_o.view(D, H, Dv) with w_uv.view(H, Dv, R) into (D, H, R)",
                _absorbed_variant(heads_summed=True),
                why="w_o @ w_uv pairs every head's output columns with every head's value rows: right only for one "
                    "head."),
        Mistake("absorbed_attention.heads_merged_inner", "heads merged in (Dv, H) order, heads inner: w_o's columns "
                "are (H, Dv), heads outer; merge (B, Tq, H, Dv) into H·Dv", _absorbed_variant(merge_heads_inner=True),
                why="An einsum output written btvh, or a permute that puts H last, keeps the shapes and pairs each "
                    "number with another head's column of w_o."),
        Mistake("absorbed_attention.heads_merged_untransposed", "(B, H, Tq, Dv) reshaped straight to (B, Tq, H·Dv): "
                "move the heads next to Dv first, y.transpose(1, 2), then reshape", _absorbed_variant(
                    merge_untransposed=True), why="The reshape keeps the shape for any Tq and is right only for one "
                                                  "query, where no token sits between the heads."),
        EXPANDED,
    ),
)

# -- cache_bytes_per_token ----------------------------------------------------------------

BYTES_NAMES = ("attention", "num_layers", "num_heads", "head_dim", "num_kv_heads", "kv_lora_rank", "qk_rope_head_dim",
               "dtype")


def bytes_inputs(gen, dtype, attention="mla", layers=60, heads=128, head_dim=128, kv_heads=8, rank=512, rope=64,
                 of=torch.bfloat16, drawn=False):
    """DeepSeek-V2 by default: 60 layers, 128 heads of 128, kv_lora_rank 512, qk_rope_head_dim 64, bfloat16 (and a GQA
    variant's 8 KV heads). `drawn`: every size drawn with inputs.Gen.unknown (the file's text
    under the draw key), so that no table of counts passes: one learned from earlier grades changes the file."""
    if drawn:
        layers, kv_heads, group = (int(torch.randint(1, top, (), generator=gen.unknown)) for top in (81, 9, 17))
        head_dim, rank, rope = (16 * int(torch.randint(1, top, (), generator=gen.unknown)) for top in (17, 49, 9))
        heads = kv_heads * group
    return Call((attention, layers, heads, head_dim, kv_heads, rank, rope, of), names=BYTES_NAMES)


def _bytes(attention, layers, heads, head_dim, kv_heads, rank, rope, dtype, *, itemsize=None, unit=1, kv_factor=2,
           mla_per_head=False, mla_factor=1, rope_per_head=False, gqa_query_heads=False, gqa_group=False,
           by_family=False, rope_once=False, one_layer=False, rope_as_head_dim=False, mha_kv_heads=False,
           latent_as_head_dim=False, heads_left_out=False):
    """The count, from the formula; the keyword arguments make the named wrong counts."""
    item = itemsize or torch.empty((), dtype=dtype).element_size()
    rope = head_dim if rope_as_head_dim else rope
    rank = head_dim if latent_as_head_dim else rank
    if by_family:  # 2 bytes for the half types, 4 for every other
        item = 2 if dtype in (torch.float16, torch.bfloat16) else 4
    cached_heads = heads if gqa_query_heads else heads // kv_heads if gqa_group else kv_heads
    if heads_left_out:
        heads = cached_heads = 1
    per_layer = {"mha": kv_factor * (kv_heads if mha_kv_heads else heads) * head_dim,
                 "gqa": kv_factor * cached_heads * head_dim,
                 "mla": mla_factor * (heads if mla_per_head else 1) * (rank + (heads if rope_per_head else 1) * rope)}
    if rope_once and attention == "mla":  # L·R + Dr: the product taken before the sum
        return (layers * rank + rope) * item * unit
    return (1 if one_layer else layers) * per_layer[attention] * item * unit


def _count(**knobs):
    return lambda *a: _bytes(*a, **knobs) if a[0] in ("mha", "gqa", "mla") else None


def _same_count(value, expected, *_) -> None:
    """A count of bytes is right only exactly, as an int."""
    if type(value) is not int or value != expected:
        raise CheckFailed(f"expected {expected:,}, got {value!r}")


def bytes_check(**params):
    """A check: cache_bytes_per_token gives the exact count, as an int, for the sizes given and for sizes drawn."""

    def check(run: Run) -> None:
        for drawn in (False, True):
            expect_count(run, run.inputs(**params, drawn=drawn), NOT_INT)

    return check


# not known, pieces of the known names (a test `in "mha"` takes a substring), and the known ones spelled otherwise
# (a name normalised with .strip().lower(): blind set 56's b16)
UNKNOWN = ("mqa", "m", "ml", "", "MLA", " gqa")


def unknown_refused(run: Run) -> None:
    """An attention the contract does not know ("mqa", or a piece of a known name) raises ValueError."""
    for name in UNKNOWN:
        call = run.inputs(attention=name)
        what = f"cache_bytes_per_token({', '.join(map(repr, call.args))})"
        try:
            value = run.ctx.candidate.invoke(run.step.id, call.args, call.kwargs).value
        except CandidateError as error:
            if error.type == "ValueError":
                continue
            if error.kind != "raised":  # not implemented, not importable, hung: said as it is
                raise
            raise CheckFailed(f"{what} raised {error.message}; the contract says ValueError",
                              UNKNOWN_NOT_REFUSED) from None
        raise CheckFailed(f"{what} returned {value!r}; the contract says ValueError", UNKNOWN_NOT_REFUSED)


UNKNOWN_NOT_REFUSED = Mistake(
    "cache_bytes_per_token.unknown_not_refused", "an attention other than mha, gqa and mla was not refused with "
    "ValueError: check the name and raise ValueError",
    why="A KeyError from a dict lookup, or a silent 0, hides a typo in the caller's code.")
NOT_INT = Mistake("cache_bytes_per_token.not_int", "returned a float or a tensor: a count of bytes is an int (// not "
                  "/, and int(...) around a tensor)")
SMALL = dict(layers=3, heads=4, head_dim=16, kv_heads=2, rank=24, rope=8, of=torch.float32)
OTHER_DTYPES = (torch.float64, torch.int8)  # 8 bytes, and the 1 byte of a quantised cache

BYTES = StepSpec(
    "cache_bytes_per_token", bytes_inputs, _bytes, compare=_same_count,
    checks=(
        prop("deepseek_v2_mla", 3, bytes_check()), prop("deepseek_v2_mha", 2, bytes_check(attention="mha")),
        prop("deepseek_v2_gqa", 2, bytes_check(attention="gqa")),
        prop("small_float32", 1, lambda run: [bytes_check(attention=a, **SMALL)(run) for a in ("mla", "gqa", "mha")]),
        prop("other_dtypes", 1, lambda run: [bytes_check(attention=a, **{**SMALL, "of": of})(run)
                                             for of in OTHER_DTYPES for a in ("mla", "mha")]),
        prop("unknown_refused", 1, unknown_refused, gated=ALWAYS),
    ),
    mistakes=(
        NOT_INT, UNKNOWN_NOT_REFUSED,
        Mistake("cache_bytes_per_token.mla_per_head", "counted the MLA cache once per head: the latent and the RoPE "
                "key are shared by every head, L·(kv_lora_rank + qk_rope_head_dim) elements", _count(mla_per_head=True),
                why="The keys and values of each head are made from the latent when attention runs; only the latent "
                    "is kept."),
        Mistake("cache_bytes_per_token.mla_rope_per_head", "counted a RoPE key per head: MLA keeps one, shared by "
                "every head, L·(kv_lora_rank + qk_rope_head_dim)", _count(rope_per_head=True)),
        Mistake("cache_bytes_per_token.mla_rope_once", "counted the RoPE key once for the whole model, L·R + Dr: each "
                "layer keeps its own, L·(kv_lora_rank + qk_rope_head_dim) (parentheses)", _count(rope_once=True)),
        Mistake("cache_bytes_per_token.mla_factor_two", "counted the latent twice, for keys and values: both come from "
                "the one latent, L·(kv_lora_rank + qk_rope_head_dim)", _count(mla_factor=2)),
        Mistake("cache_bytes_per_token.gqa_group_size", "GQA counted with the group size, num_heads // num_kv_heads: "
                "its cache holds num_kv_heads heads, 2·L·num_kv_heads·head_dim", _count(gqa_group=True)),
        Mistake("cache_bytes_per_token.gqa_query_heads", "GQA counted with the query heads: its cache holds "
                "num_kv_heads heads, 2·L·num_kv_heads·head_dim", _count(gqa_query_heads=True)),
        Mistake("cache_bytes_per_token.mha_kv_heads", "MHA counted with num_kv_heads: MHA caches a key and a value for "
                "every head, 2·L·num_heads·head_dim", _count(mha_kv_heads=True),
                why="One branch for MHA and GQA reads num_kv_heads for both; MHA is GQA with num_kv_heads = num_heads, "
                    "whatever num_kv_heads the call passes."),
        Mistake("cache_bytes_per_token.no_factor_two", "counted the keys only for MHA or GQA: the cache holds keys and "
                "values, a factor 2", _count(kv_factor=1)),
        Mistake("cache_bytes_per_token.in_bits", "counted bits (itemsize · 8): the answer is in bytes", _count(unit=8)),
        Mistake("cache_bytes_per_token.itemsize_by_family", "the element size was guessed from the dtype (2 bytes "
                "for a half type, 4 for any other): float64 takes 8, an int8 cache 1; use dtype.itemsize",
                _count(by_family=True)),
        Mistake("cache_bytes_per_token.finfo_for_integers", "the element size came from torch.finfo, which takes "
                "floating dtypes only, so an int8 cache raised: use dtype.itemsize, or "
                "torch.empty((), dtype=dtype).element_size()", raises=Raises(types=("TypeError",), message=r"finfo")),
        Mistake("cache_bytes_per_token.layers_left_out", "counted one layer's cache: every layer keeps its own, so "
                "multiply by num_layers", _count(one_layer=True)),
        Mistake("cache_bytes_per_token.rope_width_from_head_dim", "the RoPE key was counted head_dim wide: it is "
                "qk_rope_head_dim wide, one per token, so MLA caches kv_lora_rank + qk_rope_head_dim per layer",
                lambda *a: _bytes(*a, rope_as_head_dim=True) if a[0] == "mla" else None),
        Mistake("cache_bytes_per_token.latent_as_head_dim", "the latent was counted head_dim wide: it is "
                "kv_lora_rank wide, so MLA caches L·(kv_lora_rank + qk_rope_head_dim)",
                lambda *a: _bytes(*a, latent_as_head_dim=True) if a[0] == "mla" else None),
        Mistake("cache_bytes_per_token.heads_left_out", "MHA or GQA counted one head's keys and values: multiply by "
                "the heads cached, num_heads for MHA and num_kv_heads for GQA",
                lambda *a: _bytes(*a, heads_left_out=True) if a[0] in ("mha", "gqa") else None),
        Mistake("cache_bytes_per_token.itemsize_left_out", "counted elements, not bytes: multiply by the bytes of "
                "one element, torch.empty((), dtype=dtype).element_size()", _count(itemsize=1)),
        Mistake("cache_bytes_per_token.fixed_itemsize", "assumed 2 bytes per element whatever the dtype: use "
                "torch.empty((), dtype=dtype).element_size(), or dtype.itemsize", _count(itemsize=2)),
    ),
)

SPEC = Spec((COMPRESS, EXPAND, SCORES, ABSORBED, CACHE, MODULE, BYTES))
