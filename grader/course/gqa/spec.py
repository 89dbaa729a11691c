"""The checks of `gqa`: repeat the KV heads, attend in groups, and the module with narrow KV projections.

Each KV head holds its own values (in `distinct_heads`, KV head j is offset by j), so a
query head that reads the wrong KV head shows, and the tiled mapping h % Hkv is told
apart from the interleaved h // G. Hq = 6 and Hkv = 2 (G = 3) make the two mappings
differ; MQA (Hkv = 1) and MHA (Hkv = Hq) are checked too. The module's weights are
loaded with the contract's shapes, so full-width KV projections cannot load.
"""

import torch

from grader.engine import (
    ALWAYS,
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
    prop,
    raises_value_error,
    rules,
    shape,
    values,
)
from solutions import gqa as ref

FLOATS = (torch.float32, torch.float64)
HALF = (torch.float16, torch.bfloat16)
B, HQ, HKV, TQ, TK, DH = 2, 6, 2, 5, 7, 4  # batch, query heads, KV heads, query and key tokens, head width
G = HQ // HKV  # query heads per KV head
D = HQ * DH  # model width

# -- repeat_kv ----------------------------------------------------------------------------


def repeat_inputs(gen, dtype, hkv=HKV, n_rep=G, t=TK, distinct=False):
    x = gen.randn(B, hkv, t, DH, dtype=dtype)
    if distinct:  # KV head j is about j: a wrong head order is plain to see
        x = x * 0.1 + torch.arange(hkv, dtype=dtype).view(1, hkv, 1, 1)
    return Call((x, n_rep), names=("x", "n_rep"))


REPEAT = StepSpec(
    "repeat_kv", repeat_inputs, ref.repeat_kv,
    checks=(
        shape(2), values("values", 2, FLOATS), values("distinct_heads", 4, distinct=True),
        values("n_rep_1", 2, n_rep=1), values("mqa", 2, hkv=1, n_rep=HQ),
        values("noncontiguous", 2, strided=(0,)), values("half", 1, HALF), device(2),
    ),
    mistakes=(
        Mistake("repeat_kv.tiled", "tiled the KV heads (x.repeat, or expand on a new axis before the heads): repeat "
                "each head n_rep times in a row, repeat_interleave(n_rep, dim=1)", lambda x, n: x.repeat(1, n, 1, 1),
                why="Output head h must be KV head h // n_rep."),
        Mistake("repeat_kv.token_axis", "repeated along the token axis: the heads are axis 1, (B, Hkv, T, Dh) -> "
                "(B, Hkv·n_rep, T, Dh)", lambda x, n: x.repeat_interleave(n, dim=2)),
        Mistake("repeat_kv.batch_axis", "repeated along the batch axis: the heads are axis 1, (B, Hkv, T, Dh) -> "
                "(B, Hkv·n_rep, T, Dh)", lambda x, n: x.repeat_interleave(n, dim=0)),
        Mistake("repeat_kv.flattened", "repeat_interleave without dim flattens the tensor first: pass dim=1",
                lambda x, n: x.repeat_interleave(n)),
        Mistake("repeat_kv.copies_after_tokens", "the axis of the copies went after the token axis "
                "(or after the head width): add it right after the heads, x[:, :, None].expand(B, Hkv, n_rep, T, Dh)",
                lambda x, n: [x.repeat_interleave(n, dim=axis).reshape(x.shape[0], x.shape[1] * n, *x.shape[2:])
                              for axis in (2, 3)],
                why="Added later, x[:, :, :, None].expand(B, Hkv, T, n_rep, Dh), the reshape to "
                    "(B, Hkv·n_rep, T, Dh) folds tokens into heads."),
    ),
)

# -- grouped_attention --------------------------------------------------------------------


def grouped_inputs(gen, dtype, hkv=HKV, mask="none", distinct=False):
    q = gen.randn(B, HQ, TQ, DH, dtype=dtype)
    k, v = gen.randn(B, hkv, TK, DH, dtype=dtype), gen.randn(B, hkv, TK, DH, dtype=dtype)
    if distinct:  # each KV head its own keys and values, far apart
        offset = torch.arange(hkv, dtype=dtype).view(1, hkv, 1, 1)
        k, v = k + offset, v + 3 * offset
    masks = {
        "none": lambda: None,
        "random": lambda: gen.mask(B, HQ, TQ, TK),  # one per query head: must line up with the query heads
        "causal": lambda: torch.ones(TQ, TK, dtype=torch.bool).tril(diagonal=TK - TQ),  # (Tq, Tk)
        "padding": lambda: (torch.arange(TK) < torch.tensor([TK, 3]).view(B, 1, 1, 1)),  # (B, 1, 1, Tk)
        "blocked_rows": lambda: _blocked_rows(gen.mask(B, 1, TQ, TK)),
    }
    return Call((q, k, v, masks[mask]()), names=("q", "k", "v", "mask"))


def _blocked_rows(mask):
    mask[0, :, 2] = False  # a query that may attend to nothing
    mask[1, :, 0] = False
    return mask


def grouped(q, k, v, mask=None, *, mapping="interleave", scale="head", mask_grouped=False, mask_order=None, **wrong):
    """grouped_attention: the KV heads lined up with the query heads, then attention.attend; the keyword arguments
    after * make the named wrong variants (`scale` names the width the scores are divided by the root of; the rest
    go to attention.attend)."""
    b, hq, tq, dh = q.shape
    hkv, tk = k.shape[1], k.shape[-2]
    g = hq // hkv
    if mapping == "interleave":
        k, v = ref.repeat_kv(k, g), ref.repeat_kv(v, g)
    else:  # tiled: query head h reads KV head h % Hkv
        k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
    width = {"head": dh, "query_width": hq * dh, "kv_width": hkv * dh, "none": 1}[scale]
    if mask is not None and mask_order is not None:  # the mask's heads grouped (G, Hkv) for (Hkv, G), or the reverse
        split = {"groups_first": (g, hkv), "kv_first": (hkv, g)}[mask_order]
        mask = mask.expand(b, hq, tq, tk).reshape(b, *split, tq, tk).transpose(1, 2).reshape(b, hq, tq, tk)
    if mask is not None and mask_grouped:  # scores kept as (B, Hkv, G, Tq, Tk), the mask broadcast to them from the end
        mask = mask.broadcast_to((b, hkv, g, tq, tk)).reshape(b, hq, tq, tk)
    return attention.attend(q, k, v, mask, width=width, **wrong)


def _variant(**wrong):
    return lambda q, k, v, mask=None: grouped(q, k, v, mask, **wrong)


def _has_nan(value, *args, **kwargs):
    return bool(torch.isnan(value.to(torch.float64)).any())


VALUES_NOT_REPEATED = Mistake(
    "grouped_attention.values_not_repeated", "the keys were lined up with the query heads but the values were not: "
    "repeat v as you repeat k, repeat_kv(v, G)",
    raises=Raises(message=r"must match the size of tensor b", line=r"@\s*v\b|\(\s*\w+\s*,\s*v\s*\)"),
    why="The weights of query head h multiply the values of KV head h // G.")
HEAD_MAPPING = ("query head h read KV head h % Hkv (k.repeat / tile, or q viewed as (B, G, Hkv, ...)): query head h "
                "attends with KV head h // G")
HEAD_MAPPING_WHY = "Each KV head is shared by G consecutive query heads, as repeat_interleave(G, dim=1) lines them up."

GROUPED = StepSpec(
    "grouped_attention", grouped_inputs, ref.grouped_attention, answered=("repeat_kv",),
    checks=(
        shape(2), values("values", 3, FLOATS), values("distinct_heads", 4, distinct=True),
        values("mqa", 4, hkv=1, mask="causal"), values("mha", 4, hkv=HQ, mask="causal"),
        values("mask_per_head", 3, mask="random"), values("mask_causal", 2, mask="causal"),
        values("mask_padding", 3, mask="padding", distinct=True), values("fully_masked_rows", 4, mask="blocked_rows"),
        values("half", 2, HALF, mask="causal"), rules(2, mask="causal"), device(2, mask="padding"),
    ),
    mistakes=(
        Mistake("grouped_attention.head_mapping", HEAD_MAPPING, _variant(mapping="tile"), why=HEAD_MAPPING_WHY),
        Mistake("grouped_attention.scaled_by_query_width", "scaled by √(Hq·Dh), the width of all query heads: scale "
                "by √Dh, one head's width (q.shape[-1])", _variant(scale="query_width")),
        Mistake("grouped_attention.scaled_by_kv_width", "scaled by √(Hkv·Dh), the width of all KV heads: scale by "
                "√Dh, one head's width", _variant(scale="kv_width")),
        Mistake("grouped_attention.unscaled", "scores not scaled: divide q @ kᵀ by √Dh", _variant(scale="none")),
        Mistake("grouped_attention.mask_inverted", "mask convention inverted: True means 'may attend'; fill where "
                "the mask is False", _variant(mask_mode="inverted")),
        Mistake("grouped_attention.mask_misaligned", "the mask was applied to scores grouped as (B, Hkv, G, Tq, Tk): "
                "apply it to the scores as (B, Hq, Tq, Tk)", _variant(mask_grouped=True),
                raises=Raises(message=r"must match the size|broadcast|shape mismatch",
                              source=r"(view|reshape|unflatten|expand)\([^)]*\b(G|n_rep|groups?)\s*[,)]"),
                why="A mask broadcastable to (B, Hq, Tq, Tk) does not line up with grouped scores: broadcast from "
                    "the right, its batch axis falls on the KV heads."),
        Mistake("grouped_attention.mask_head_order", "a per-head mask's heads went to the wrong query heads: group "
                "them exactly as q's, mask.expand(B, Hq, Tq, Tk).reshape(B, Hkv, G, Tq, Tk)",
                lambda *a, **k: [grouped(*a, **k, mask_order=order) for order in ("groups_first", "kv_first")],
                why="Its head axis was grouped as (G, Hkv) (then transposed) where the query heads are grouped as "
                    "(Hkv, G), or the other way round; query head h = j·G + g is group g of KV head j."),
        VALUES_NOT_REPEATED,
        Mistake("grouped_attention.kv_heads_not_lined_up", "the KV heads do not line up with the query heads: repeat "
                "each KV head G = Hq // Hkv times (repeat_kv(k, Hq // Hkv)) before the scores",
                raises=Raises(message=r"size of tensor a \(\d+\) must match the size of tensor b \(\d+\) at "
                                      r"non-singleton dimension 1"),
                why="Left unrepeated, k and v broadcast against q only for one KV head; repeated Hkv times, or by a "
                    "group size of the wrong heads, they have another number of heads than q."),
        Mistake("grouped_attention.softmax_query_axis", "softmax over the query axis: normalize over the keys, dim=-1",
                _variant(softmax_dim=-2)),
        Mistake("grouped_attention.finite_fill", "blocked scores filled with a finite value (-1e9): fill with -inf "
                "and turn the NaN of fully blocked rows into zeros", _variant(fill=-1e9),
                why="With a finite fill, a fully blocked row spreads its weight evenly over the keys instead of "
                    "giving zeros."),
        Mistake("grouped_attention.mask_multiplied", "the scores were multiplied by the mask: a blocked score of 0 "
                "still gets weight e^0; fill the blocked scores with -inf", _variant(fill=0.0)),
        Mistake("grouped_attention.nan_rows", "a fully blocked row gives NaN (softmax of all -inf): give it zero "
                "weights and a zero output", test=_has_nan),
    ),
)

# -- GroupedQueryAttention ----------------------------------------------------------------


def attend(state, x, mask=None, *, mapping="interleave", scale="head", out_proj=True, use_mask=True, bare_split=(),
           merge_transposed=True):
    """The module's forward from reference steps, heads read off the weights (Dh = 4 in every check);
    the keyword arguments after * make the named wrong variants (bare_split: the projections split with a bare reshape
    to (B, H, T, Dh), no transpose)."""
    b, t, d = x.shape
    hq, hkv = d // DH, state["w_k.weight"].shape[0] // DH

    def proj(y, name):
        return y @ state[f"{name}.weight"].T + state.get(f"{name}.bias", 0)

    def split(name, heads):
        y = proj(x, name)
        return y.reshape(b, heads, t, DH) if name in bare_split else y.view(b, t, heads, DH).transpose(1, 2)

    q = split("w_q", hq)  # (B, Hq, T, Dh)
    k, v = split("w_k", hkv), split("w_v", hkv)  # (B, Hkv, T, Dh)
    root = {"head": "head", "embed": "query_width"}[scale]
    y = grouped(q, k, v, mask if use_mask else None, mapping=mapping, scale=root)
    y = y.transpose(1, 2).reshape(b, t, d) if merge_transposed else y.reshape(b, t, d)
    return proj(y, "w_o") if out_proj else y


def _module_variant(**wrong):
    return lambda state, x, mask=None: attend(state, x, mask, **wrong)


NO_WIDTH_CHECK = Mistake("GroupedQueryAttention.no_width_check", "embed_dim not divisible by num_heads was accepted: "
                         "raise ValueError in __init__")
NO_KV_HEADS_CHECK = Mistake("GroupedQueryAttention.no_kv_heads_check", "num_heads not divisible by num_kv_heads was "
                            "accepted: raise ValueError in __init__ (the groups must be equal)")


def module_inputs(gen, dtype, hkv=HKV, mask=None, bias=False):
    kv = hkv * DH
    shapes = {"w_q": (D, D), "w_k": (kv, D), "w_v": (kv, D), "w_o": (D, D)}
    state = {f"{n}.weight": torch.as_tensor(gen.randn(*s, dtype=dtype, scale=D**-0.5)) for n, s in shapes.items()}
    if bias:
        state.update({f"{n}.bias": torch.as_tensor(gen.randn(s[0], dtype=dtype, scale=0.1)) for n, s in shapes.items()})
    x = gen.randn(B, TQ, D, dtype=dtype)
    masks = {
        None: lambda: None,
        "causal": lambda: torch.ones(TQ, TQ, dtype=torch.bool).tril(),  # (T, T)
        "padding": lambda: (torch.arange(TQ) < torch.tensor([TQ, 3]).view(B, 1, 1, 1)),  # (B, 1, 1, T)
    }
    return Call((x,), {"mask": masks[mask]()}, ("x",), init=(D, HQ, hkv), init_kwargs={"bias": bias}, state=state)


MODULE = StepSpec(
    "GroupedQueryAttention", module_inputs, attend, module=True, prefix="module",
    answered=("repeat_kv", "grouped_attention"),
    checks=(
        prop("structure", 1, linear_layers(("w_q", "w_k", "w_v", "w_o"), (D, HQ, HKV), "an nn.Linear")),
        prop("defaults", 1, defaults(mask="causal")),  # bias=False, the contract's default
        prop("validates_width", 1, raises_value_error((10, 3, 1), "10 is not divisible by 3 heads", NO_WIDTH_CHECK),
             gated=ALWAYS),
        prop("validates_kv_heads", 2,
             raises_value_error((D, HQ, 4), f"{HQ} query heads do not split into 4 equal groups", NO_KV_HEADS_CHECK),
             gated=ALWAYS),
        values("values", 3, FLOATS), values("mqa", 4, hkv=1, mask="causal"), values("mha", 4, hkv=HQ, mask="causal"),
        values("mask_causal", 3, mask="causal"), values("mask_padding", 2, mask="padding"),
        values("bias", 4, bias=True, mask="causal"), values("bfloat16", 1, (torch.bfloat16,), mask="causal"),
        prop("gradients", 4, gradients(bias=True, mask="padding")), rules(2, mask="causal"), device(2, mask="causal"),
        prop("end_to_end", 3, end_to_end(bias=True, mask="causal"), end_to_end=True),
    ),
    mistakes=(
        Mistake("GroupedQueryAttention.kv_full_width", "w_k or w_v has the wrong width "
                "(embed_dim, as in multi-head attention?): project to num_kv_heads·head_dim features, "
                "nn.Linear(embed_dim, num_kv_heads * head_dim)",
                raises=Raises(message=r"size mismatch for w_[kv]\.(weight|bias)"),
                why="That narrowness is GQA's whole saving."),
        Mistake("GroupedQueryAttention.scaled_by_embed_dim", "scaled by √embed_dim: divide by √head_dim",
                _module_variant(scale="embed")),
        Mistake("GroupedQueryAttention.head_mapping", HEAD_MAPPING, _module_variant(mapping="tile"),
                why=HEAD_MAPPING_WHY),
        Mistake("GroupedQueryAttention.mask_ignored", "the mask was never applied: pass it to grouped_attention",
                _module_variant(use_mask=False)),
        Mistake("GroupedQueryAttention.no_output_projection", "forgot the output projection after merging the heads: "
                "apply w_o to them", _module_variant(out_proj=False)),
        Mistake("GroupedQueryAttention.split_no_transpose", "heads split with a bare reshape straight to "
                "(B, H, T, Dh): view the projection as (B, T, H, Dh), then transpose(1, 2)",
                lambda *a, **k: [attend(*a, **k, bare_split=names)
                                 for names in (("w_q", "w_k", "w_v"), ("w_q",), ("w_k", "w_v"), ("w_k",), ("w_v",))],
                why="A bare reshape mixes tokens and heads. Split q into num_heads heads, k and v into num_kv_heads."),
        Mistake("GroupedQueryAttention.merge_no_transpose", "merged the heads without moving the head axis back: "
                "transpose(1, 2) before the reshape", _module_variant(merge_transposed=False),
                why="(B, Hq, T, Dh) reshaped to (B, T, D) mixes tokens and heads."),
        Mistake("GroupedQueryAttention.kv_split_into_query_heads", "split the keys or values into num_heads heads: "
                "they have num_kv_heads heads of head_dim each, (B, T, Hkv·Dh) -> (B, Hkv, T, Dh)",
                raises=Raises(message=r"invalid for input of size", line=r"num_heads|\bH(q)?\b|n_heads|\.h\b")),
        VALUES_NOT_REPEATED,
        NO_WIDTH_CHECK, NO_KV_HEADS_CHECK,
    ),
)

SPEC = Spec((REPEAT, GROUPED, MODULE))
