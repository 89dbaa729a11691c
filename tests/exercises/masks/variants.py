"""Candidates for `masks` made from the reference by redefining one thing (Python keeps the last definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find (None where the mistake has no name and a plain failure is right).
RULES_ONLY: a step that calls a function its contract forbids: it loses the whole step, and nothing else.
CORRECT: unusual but right ways to write the steps; each must score 100.
"""

from tests.exercises.mha.variants import Variant

REFERENCE_DROPOUT = """\
        keep = torch.rand(w.shape, generator=generator, device=w.device) >= dropout_p
        w = w * keep / (1 - dropout_p)"""


def causal(body: str) -> str:
    return f"def causal_mask(t_q, t_k, device=None):\n    return {body}"


def attention_with(middle: str = "", dropout: str = REFERENCE_DROPOUT, end: str = "return w @ v, w") -> str:
    """An attention whose scores, softmax and dropout are the reference's but for what is replaced."""
    return f"""
def attention(q, k, v, mask=None, dropout_p=0.0, training=False, generator=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1).nan_to_num(0.0)
{middle}    if training and dropout_p > 0:
{dropout}
    {end}
"""


BUGGY = [
    # -- causal_mask
    Variant("causal_top_left", causal("torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril()"),
            "causal_mask", "causal_mask.top_left"),
    Variant("causal_inverted_triu",  # the tutorials' mask of the blocked positions
            causal("torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(diagonal=t_k - t_q + 1)"),
            "causal_mask", "causal_mask.inverted"),
    Variant("causal_upper", causal("torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(diagonal=t_k - t_q)"),
            "causal_mask", "causal_mask.upper"),
    Variant("causal_no_diagonal",
            causal("torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q - 1)"),
            "causal_mask", "causal_mask.no_diagonal"),
    Variant("causal_float", causal("torch.tril(torch.ones(t_q, t_k, device=device), diagonal=t_k - t_q)"),
            "causal_mask", "causal_mask.float_mask"),
    Variant("causal_diagonal_sign", causal("torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_q - t_k)"),
            "causal_mask", "causal_mask.diagonal_sign"),
    Variant("causal_keys_first",  # the sizes in the other order: a (t_k, t_q) mask
            causal("torch.ones(t_k, t_q, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)"),
            "causal_mask", "axes_swapped"),
    # -- padding_mask
    Variant("padding_inverted",
            "def padding_mask(lengths, t):\n    return torch.arange(t, device=lengths.device) >= lengths[:, None]",
            "padding_mask", "padding_mask.inverted"),
    Variant("padding_off_by_one",
            "def padding_mask(lengths, t):\n    return torch.arange(t, device=lengths.device) <= lengths[:, None]",
            "padding_mask", "padding_mask.off_by_one"),
    Variant("padding_max_length",
            "def padding_mask(lengths, t):\n"
            "    return torch.arange(int(lengths.max()), device=lengths.device) < lengths[:, None]",
            "padding_mask", "padding_mask.max_length"),
    Variant("padding_lengths_not_a_column",  # right only when the batch has one sequence
            "def padding_mask(lengths, t):\n"
            "    return torch.arange(t, device=lengths.device)[None, :] < lengths",
            "padding_mask", "padding_mask.lengths_not_a_column"),
    Variant("padding_clamped_difference",  # 1 where position < length, as integers: no bool mask
            "def padding_mask(lengths, t):\n"
            "    return (lengths[:, None] - torch.arange(t, device=lengths.device)).clamp(0, 1)",
            "padding_mask", "mask_not_bool"),
    Variant("padding_one_hot",  # one_hot wants int64 lengths: int32 fails
            "import torch.nn.functional as F\n"
            "def padding_mask(lengths, t):\n"
            "    ends = F.one_hot(lengths, t + 1)  # (B, t + 1): a 1 at each sequence's end\n"
            "    return ends.cumsum(-1)[:, :t] == 0",
            "padding_mask"),
    # -- combine_masks
    Variant("combine_or", "def combine_masks(padding, causal):\n    return padding[:, None, None, :] | causal",
            "combine_masks", "combine_masks.or"),
    Variant("combine_padding_on_queries",
            "def combine_masks(padding, causal):\n    return padding[:, None, :, None] & causal",
            "combine_masks", "combine_masks.padding_on_queries"),
    Variant("combine_no_head_axis", "def combine_masks(padding, causal):\n    return padding[:, None, :] & causal",
            "combine_masks", "combine_masks.no_head_axis"),
    Variant("combine_rebuilds_causal",  # ignores the causal mask it is given
            "def combine_masks(padding, causal):\n"
            "    t_q, t_k = causal.shape\n"
            "    return padding[:, None, None, :] & causal_mask(t_q, t_k, padding.device)",
            "combine_masks"),
    # -- attention
    Variant("attention_weights_transposed",  # once crashed the dropout diagnosis: the grader's fault, exit 3
            attention_with(end="return w @ v, w.transpose(-2, -1)"), "attention", "axes_swapped"),
    Variant("attention_mask_inverted",
            attention_with().replace("masked_fill(~mask,", "masked_fill(mask,"),
            "attention", "attention.mask_inverted"),
    Variant("attention_unscaled", attention_with().replace(" / math.sqrt(q.shape[-1])", ""),
            "attention", "attention.unscaled"),
    Variant("attention_scaled_by_value_width", attention_with().replace("q.shape[-1]", "v.shape[-1]"),
            "attention", "attention.scaled_by_value_width"),
    Variant("attention_masked_after_softmax",
            attention_with("    w = w if mask is None else w.masked_fill(~mask, 0.0)\n").replace(
                "scores = scores.masked_fill(~mask, float(\"-inf\"))", "pass"),
            "attention", "attention.masked_after_softmax"),
    Variant("attention_softmax_query_axis", attention_with().replace("dim=-1", "dim=-2"),
            "attention", "attention.softmax_query_axis"),
    Variant("attention_nan_rows", attention_with().replace(".nan_to_num(0.0)", ""),
            "attention", "attention.nan_rows"),
    Variant("attention_output_only", attention_with(end="return w @ v"), "attention"),
    Variant("attention_mask_none_unhandled",
            attention_with().replace("    if mask is not None:\n        scores", "    if True:\n        scores"),
            "attention", "none_unhandled"),
    Variant("attention_if_mask",  # `if mask:` asks a whole tensor for one truth value
            attention_with().replace("    if mask is not None:\n        scores", "    if mask:\n        scores"),
            "attention", "tensor_truthiness"),
    Variant("attention_mask_view",  # the mask must broadcast, not have the scores' shape
            attention_with().replace("masked_fill(~mask,", "masked_fill(~mask.view(scores.shape),"),
            "attention"),
    Variant("attention_four_dims_only", attention_with().replace("k.transpose(-2, -1)", "k.transpose(2, 3)"),
            "attention", "fixed_rank"),
    Variant("attention_finite_fill",  # the Annotated Transformer's -1e9: a fully blocked row comes out uniform, not zero
            attention_with().replace('float("-inf")', "-1e9").replace(".nan_to_num(0.0)", ""),
            "attention", "attention.finite_fill"),
    Variant("attention_softmax_in_float32",  # the softmax upcast "for stability", never cast back
            attention_with().replace("torch.softmax(scores, dim=-1)", "torch.softmax(scores.float(), dim=-1)"),
            "attention", "dtype_mismatch"),
    Variant("attention_own_softmax_no_keepdim",  # the sum lost its axis: it broadcasts against the queries
            attention_with().replace("torch.softmax(scores, dim=-1).nan_to_num(0.0)",
                                     "scores.exp() / scores.exp().sum(dim=-1)"),
            "attention", "keepdim_lost"),
    Variant("attention_dropout_at_eval", attention_with().replace("if training and dropout_p > 0", "if dropout_p > 0"),
            "attention", "attention.dropout_at_eval"),
    Variant("attention_dropout_no_rescale", attention_with().replace(" / (1 - dropout_p)", ""),
            "attention", "attention.dropout_no_rescale"),
    Variant("attention_dropout_rate_fixed", attention_with(dropout="""\
        keep = torch.rand(w.shape, generator=generator, device=w.device) >= 0.25  # the rate the config had
        w = w * keep / (1 - dropout_p)"""), "attention", "attention.dropout_p_ignored"),
    Variant("attention_dropout_keep_prob", attention_with().replace(">= dropout_p", "< dropout_p"),
            "attention", "attention.dropout_keep_prob"),
    Variant("attention_no_dropout_in_training", attention_with(dropout="        pass"),
            "attention", "attention.no_dropout_in_training"),
    Variant("attention_dropout_on_output",
            attention_with(dropout="        pass", end="""out = w @ v
    if training and dropout_p > 0:
        keep = torch.rand(out.shape, generator=generator, device=out.device) >= dropout_p
        out = out * keep / (1 - dropout_p)
    return out, w"""),
            "attention", "attention.dropout_on_output"),
    Variant("attention_returned_undropped_weights",
            attention_with(dropout="        pass", end="""out = w @ v
    if training and dropout_p > 0:
        keep = torch.rand(w.shape, generator=generator, device=w.device) >= dropout_p
        out = (w * keep / (1 - dropout_p)) @ v
    return out, w"""),
            "attention", "attention.returned_undropped_weights"),
    Variant("attention_f_dropout",  # right in distribution, but F.dropout cannot take the generator
            "import torch.nn.functional as F\n"
            + attention_with(dropout="        w = F.dropout(w, dropout_p, training=True)"),
            "attention", "attention.generator_ignored"),
    # -- found by the search (grader/engine/search.py) -------------------------------------
    Variant("attention_weights_first", """
_attention_reference = attention


def attention(q, k, v, mask=None, dropout_p=0.0, training=False, generator=None):
    out, weights = _attention_reference(q, k, v, mask, dropout_p, training, generator)
    return weights, out
""", "attention", "outputs_reordered"),
    Variant("padding_one_short", """
def padding_mask(lengths, t):
    return torch.arange(t, device=lengths.device) < lengths[:, None] - 1
""", "padding_mask", "mask_edge_off_by_one"),
    Variant("combine_causal_transposed", """
def combine_masks(padding, causal):
    return padding[:, None, None, :] & causal.transpose(-2, -1)
""", "combine_masks", "input_transposed"),
    Variant("attention_mask_multiplied", """
def attention(q, k, v, mask=None, dropout_p=0.0, training=False, generator=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores * mask
    weights = torch.softmax(scores, dim=-1)
    if training and dropout_p > 0:
        keep = torch.rand(weights.shape, generator=generator, device=weights.device) >= dropout_p
        weights = weights * keep / (1 - dropout_p)
    return weights @ v, weights
""", "attention", "attention.mask_multiplied"),
]

# A forbidden call: the step earns nothing, whatever its values.
RULES_ONLY = [
    Variant("attention_sdpa",
            "import torch.nn.functional as F\n"
            + attention_with(end="return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), w"),
            "attention", "forbidden_call"),
]

CORRECT = [
    Variant(
        "index_comparisons",
        """
        def causal_mask(t_q, t_k, device=None):
            rows = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)  # absolute position of each query
            return rows >= torch.arange(t_k, device=device)

        def padding_mask(lengths, t):
            return lengths.unsqueeze(-1) > torch.arange(t, device=lengths.device)

        def combine_masks(padding, causal):
            B, Tk = padding.shape
            return torch.logical_and(padding.view(B, 1, 1, Tk), causal.view(1, 1, *causal.shape))
        """,
    ),
    Variant(
        "bernoulli_dropout_and_finfo_min",
        """
        def attention(q, k, v, mask=None, dropout_p=0.0, training=False, generator=None):
            scores = torch.einsum("...qd,...kd->...qk", q, k) * q.shape[-1] ** -0.5
            if mask is not None:
                scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
            w = torch.softmax(scores, dim=-1)
            if mask is not None:
                w = w.masked_fill(~mask.any(-1, keepdim=True), 0.0)  # a row with nothing to attend to
            if training and dropout_p > 0:
                keep = torch.bernoulli(torch.full_like(w, 1 - dropout_p), generator=generator)
                w = w * keep / (1 - dropout_p)
            return torch.einsum("...qk,...kd->...qd", w, v), w
        """,
    ),
    Variant(
        "own_softmax_uniform_dropout",
        """
        def attention(q, k, v, mask=None, dropout_p=0.0, training=False, generator=None):
            scores = torch.matmul(q, k.mT) / q.size(-1) ** 0.5
            if mask is not None:
                scores = scores.masked_fill(mask.logical_not(), float("-inf"))
            m = scores.amax(-1, keepdim=True)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            e = (scores - m).exp()
            w = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
            if training and dropout_p > 0:
                u = torch.empty_like(w).uniform_(0, 1, generator=generator)
                w = w.masked_fill(u < dropout_p, 0.0) / (1 - dropout_p)
            return torch.matmul(w, v), w
        """,
    ),
    Variant(
        "where_everywhere",  # masks and fills with torch.where, dropout drawn with bernoulli_ from the generator
        """
        def causal_mask(t_q, t_k, device=None):
            i = torch.arange(t_q, device=device).unsqueeze(-1)
            j = torch.arange(t_k, device=device)
            return torch.where(j <= i + (t_k - t_q), True, False)

        def combine_masks(padding, causal):
            return torch.where(padding.unsqueeze(1).unsqueeze(1), causal, False)

        def attention(q, k, v, mask=None, dropout_p=0.0, training=False, generator=None):
            scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
            if mask is not None:
                scores = torch.where(mask, scores, float("-inf"))
            w = torch.softmax(scores, dim=-1)
            w = torch.where(torch.isnan(w), torch.zeros_like(w), w)
            if training and dropout_p > 0:
                keep = torch.empty_like(w).bernoulli_(1 - dropout_p, generator=generator)
                w = w * keep / (1 - dropout_p)
            return w @ v, w
        """,
    ),
    Variant(
        "triu_inverted_and_cumsum_padding",  # the tutorials' blocked-positions triu, inverted back; lengths by a running count
        """
        def causal_mask(t_q, t_k, device=None):
            return ~torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(diagonal=t_k - t_q + 1)

        def padding_mask(lengths, t):
            ones = torch.ones(lengths.shape[0], t, dtype=lengths.dtype, device=lengths.device)
            return ones.cumsum(-1) <= lengths.unsqueeze(-1)  # position + 1 <= length
        """,
    ),
]

# Graded with the device checks on: the meta device cannot run data-dependent code, so it is skipped there.
DEVICE_CORRECT = [
    Variant(
        "padding_from_tolist",  # built from Python lists on the lengths' device: right on the CPU and on a GPU
        """
        def padding_mask(lengths, t):
            rows = [[i < n for i in range(t)] for n in lengths.tolist()]
            return torch.tensor(rows, dtype=torch.bool, device=lengths.device).reshape(len(rows), t)
        """,
    ),
]

# Graded with the device checks on (the meta device here, CUDA where there is one).
DEVICE_BUGGY = [
    Variant("causal_mask_on_cpu",  # device= forgotten: built on the CPU whatever was asked
            causal("torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q)"), "causal_mask",
            "result_on_cpu"),
    Variant("padding_positions_on_cpu",
            "def padding_mask(lengths, t):\n    return torch.arange(t) < lengths[:, None]", "padding_mask", "tensor_on_cpu"),
    Variant("attention_dropout_mask_on_cpu",
            attention_with().replace(", device=w.device", ""), "attention", "tensor_on_cpu"),
]
