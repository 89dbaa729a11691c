"""mha_numpy candidates made from solutions/mha_numpy.py by redefining one thing (the last definition wins).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find (None where the mistake has no name and a plain failure is right).
RULES_ONLY: correct values, but a rule broken: each must lose its rule points and nothing else.
CORRECT: unusual but right ways to write the steps; each must score 100.
"""

from tests.exercises.mha.variants import Variant

MHA = "multi_head_attention"


def mha_with(body: str) -> str:
    """A multi_head_attention that projects and splits like the reference, with `body` after that."""
    return f"""
def multi_head_attention(query, key, value, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, num_heads, mask=None):
    H = num_heads
    Dh = query.shape[-1] // H
    q = split_heads(project(query, w_q, b_q), H)
    k = split_heads(project(key, w_k, b_k), H)
    v = split_heads(project(value, w_v, b_v), H)
{body}
"""


REFERENCE_MIDDLE = """\
    att = softmax(apply_mask(scale_scores(attention_scores(q, k), Dh), mask))
    y = merge_heads(weighted_sum(att, v))
    return project(y, w_o, b_o)"""

BUGGY = [
    Variant("split_heads_sequence_first_fold",
            "def split_heads(x, num_heads):\n    B, T, D = x.shape\n"
            "    return np.swapaxes(x.reshape(T, B * num_heads, D // num_heads), 0, 1).reshape(B, num_heads, T, D // num_heads)",
            "split_heads", "split_heads.sequence_first_fold"),
    Variant("attention_scores_reshape_not_transpose",
            "def attention_scores(q, k):\n    return q @ k.reshape(*k.shape[:-2], k.shape[-1], k.shape[-2])",
            "attention_scores", "attention_scores.reshape_not_transpose"),
    Variant("apply_mask_in_place",  # right values, but the caller's scores are filled too
            "def apply_mask(scores, mask):\n    if mask is not None:\n        scores[~np.broadcast_to(mask, scores.shape)] = -np.inf\n"
            "    return scores",
            "apply_mask", "input_changed_in_place"),
    # -- project
    Variant("project_no_bias", "def project(x, weight, bias=None):\n    return x @ weight.T", "project", "project.no_bias"),
    Variant(
        "project_weight_not_transposed",
        "def project(x, weight, bias=None):\n    y = x @ weight\n    return y if bias is None else y + bias",
        "project", "project.weight_not_transposed",
    ),
    Variant(
        "project_zero_bias_float64",  # np.zeros is float64: float32 x comes back float64 when bias is None
        "def project(x, weight, bias=None):\n"
        "    bias = np.zeros(weight.shape[0]) if bias is None else bias\n    return x @ weight.T + bias",
        "project", "dtype_promoted",
    ),
    Variant("project_list", "def project(x, weight, bias=None):\n    return (x @ weight.T + bias).tolist()", "project"),
    # -- split_heads
    Variant(
        "split_heads_reshape_no_transpose",
        "def split_heads(x, num_heads):\n    B, T, D = x.shape\n    return x.reshape(B, num_heads, T, D // num_heads)",
        "split_heads", "split_heads.view_no_transpose",
    ),
    Variant(
        "split_heads_no_transpose",
        "def split_heads(x, num_heads):\n    B, T, D = x.shape\n    return x.reshape(B, T, num_heads, D // num_heads)",
        "split_heads", "split_heads.no_transpose",
    ),
    Variant(
        "split_heads_interleaved",
        "def split_heads(x, num_heads):\n    B, T, D = x.shape\n"
        "    return x.reshape(B, T, D // num_heads, num_heads).transpose(0, 3, 1, 2)",
        "split_heads", "split_heads.interleaved",
    ),
    Variant(
        "split_heads_true_division",  # D / num_heads is a float, which no reshape takes
        "def split_heads(x, num_heads):\n    B, T, D = x.shape\n"
        "    return np.swapaxes(x.reshape(B, T, num_heads, D / num_heads), 1, 2)",
        "split_heads", "float_shape",
    ),
    Variant(
        "split_heads_head_width_last",  # meant (B, H, T, Dh), permuted to (B, H, Dh, T)
        "def split_heads(x, num_heads):\n    B, T, D = x.shape\n"
        "    return x.reshape(B, T, num_heads, D // num_heads).transpose(0, 2, 3, 1)",
        "split_heads", "split_heads.head_width_last",
    ),
    Variant(
        "split_heads_heads_first",  # the (H, B, T, Dh) layout of some codebases: same sizes, wrong places
        "def split_heads(x, num_heads):\n    B, T, D = x.shape\n"
        "    return x.reshape(B, T, num_heads, D // num_heads).transpose(2, 0, 1, 3)",
        "split_heads", "axes_swapped",
    ),
    # -- attention_scores
    Variant(
        "attention_scores_transposed",
        "def attention_scores(q, k):\n    return k @ np.swapaxes(q, -1, -2)",
        "attention_scores", "attention_scores.transposed",
    ),
    Variant(
        "attention_scores_full_transpose",  # k.T on a 4-D array reverses all four axes
        "def attention_scores(q, k):\n    return q @ k.T",
        "attention_scores", "transpose_all_axes",
    ),
    Variant(
        "attention_scores_fixed_axes",  # (B, T, Dh) in mind: swaps axes 1 and 2, the last two only for 3-D input
        "def attention_scores(q, k):\n    return q @ np.swapaxes(k, 1, 2)",
        "attention_scores", "attention_scores.fixed_axes",
    ),
    Variant(
        "attention_scores_dot",  # the 2-D textbook np.dot(q, k.T): np.dot does not batch
        "def attention_scores(q, k):\n    return np.dot(q, np.transpose(k))",
        "attention_scores", "dot_on_batched",
    ),
    # -- scale_scores
    Variant(
        "scale_scores_multiplied",
        "def scale_scores(scores, head_dim):\n    return scores / head_dim ** -0.5",
        "scale_scores", "scale_scores.multiplied",
    ),
    Variant(
        "scale_scores_by_head_dim",
        "def scale_scores(scores, head_dim):\n    return scores / head_dim",
        "scale_scores", "scale_scores.by_head_dim",
    ),
    Variant(
        "scale_scores_unscaled", "def scale_scores(scores, head_dim):\n    return scores", "scale_scores",
        "scale_scores.unscaled",
    ),
    Variant(
        "scale_scores_np_sqrt",  # np.sqrt(16) is a NumPy float64 scalar: NumPy 2 returns float64
        "def scale_scores(scores, head_dim):\n    return scores / np.sqrt(head_dim)",
        "scale_scores", "dtype_promoted",
    ),
    Variant(
        "scale_scores_precedence",  # ** binds tighter than /: this is (head_dim ** 1) / 2
        "def scale_scores(scores, head_dim):\n    return scores / head_dim ** 1/2",
        "scale_scores", "scale_scores.precedence",
    ),
    Variant(
        "scale_scores_by_last_axis",  # the width taken from the scores, whose last axis is the keys
        "def scale_scores(scores, head_dim):\n    return scores / math.sqrt(scores.shape[-1])",
        "scale_scores", "scale_scores.by_last_axis",
    ),
    Variant(
        "scale_scores_integer_root",  # right for perfect squares only
        "def scale_scores(scores, head_dim):\n    return scores / int(head_dim ** 0.5)",
        "scale_scores", "scale_scores.integer_root",
    ),
    # -- apply_mask
    Variant(
        "apply_mask_none_unhandled",  # np.where(None, ...) is np.where(False, ...): everything blocked
        "def apply_mask(scores, mask):\n    return np.where(mask, scores, -np.inf)",
        "apply_mask", "apply_mask.none_blocks_all",
    ),
    Variant(
        "apply_mask_inverted",
        "def apply_mask(scores, mask):\n    return scores if mask is None else np.where(mask, -np.inf, scores)",
        "apply_mask", "apply_mask.inverted",
    ),
    Variant(
        "apply_mask_zero_fill",
        "def apply_mask(scores, mask):\n    return scores if mask is None else scores * mask",
        "apply_mask", "apply_mask.zero_fill",
    ),
    Variant(
        "apply_mask_additive_too_small",
        "def apply_mask(scores, mask):\n    return scores if mask is None else scores - 1000.0 * ~mask",
        "apply_mask", "apply_mask.additive_too_small",
    ),
    Variant(
        "apply_mask_full_float64",  # np.full without dtype= is float64
        "def apply_mask(scores, mask):\n"
        "    return scores if mask is None else np.where(mask, scores, np.full(scores.shape, -np.inf))",
        "apply_mask", "dtype_promoted",
    ),
    Variant(
        "apply_mask_added",  # the mask taken for an additive one (0 / -inf): a bool mask is not
        "def apply_mask(scores, mask):\n    return scores if mask is None else scores + mask",
        "apply_mask", "apply_mask.added_mask",
    ),
    Variant(
        "apply_mask_boolean_index",  # indexing with a mask of another shape does not broadcast
        "def apply_mask(scores, mask):\n    out = scores.copy()\n"
        "    if mask is not None:\n        out[~mask] = -np.inf\n    return out",
        "apply_mask", "apply_mask.index_no_broadcast",
    ),
    # -- softmax
    Variant(
        "softmax_ignored_axis",
        "def softmax(scores, axis=-1):\n    m = np.max(scores, axis=-1, keepdims=True)\n"
        "    e = np.exp(scores - np.where(np.isneginf(m), 0, m))\n"
        "    return e / np.maximum(e.sum(axis=-1, keepdims=True), 1e-30)",
        "softmax", "softmax.ignored_dim",
    ),
    Variant(
        "softmax_whole_tensor",
        "def softmax(scores, axis=-1):\n    e = np.exp(scores)\n    return e / e.sum()",
        "softmax", "softmax.whole_tensor",
    ),
    Variant("softmax_identity", "def softmax(scores, axis=-1):\n    return scores", "softmax", "softmax.identity"),
    Variant(
        "softmax_no_keepdims",
        "def softmax(scores, axis=-1):\n    e = np.exp(scores)\n    return e / e.sum(axis=axis)",
        "softmax", "softmax.no_keepdim",
    ),
    Variant(
        "softmax_max_no_keepdims",  # the reference, but the max loses its axis
        "def softmax(scores, axis=-1):\n    m = np.max(scores, axis=axis)\n"
        "    e = np.exp(scores - np.where(np.isneginf(m), 0, m))\n"
        "    s = e.sum(axis=axis, keepdims=True)\n    return e / np.maximum(s, np.finfo(s.dtype).tiny)",
        "softmax", "softmax.max_no_keepdim",
    ),
    Variant(
        "softmax_unstable",
        "def softmax(scores, axis=-1):\n    e = np.exp(scores)\n    return e / e.sum(axis=axis, keepdims=True)",
        "softmax", "softmax.unstable",
    ),
    Variant(
        "softmax_nan_rows",
        "def softmax(scores, axis=-1):\n    e = np.exp(scores - scores.max(axis=axis, keepdims=True))\n"
        "    return e / e.sum(axis=axis, keepdims=True)",
        "softmax", "softmax.nan_rows",
    ),
    Variant(
        "softmax_naive_axis_0",  # the tutorials' softmax_naive, written for a 1-D array
        "def softmax(scores, axis=-1):\n    return np.exp(scores) / np.exp(scores).sum(axis=0)",
        "softmax", "softmax.dim_0",
    ),
    Variant(
        "softmax_global_max",  # one max for the whole array: far rows underflow to 0 / 0
        "def softmax(scores, axis=-1):\n    e = np.exp(scores - np.max(scores))\n"
        "    return e / e.sum(axis=axis, keepdims=True)",
        "softmax", "softmax.global_max",
    ),
    Variant(
        "softmax_sum_over_last_axis",  # the shift along axis, the sum from the usual last axis
        "def softmax(scores, axis=-1):\n    e = np.exp(scores - scores.max(axis=axis, keepdims=True))\n"
        "    return e / e.sum(axis=-1, keepdims=True)",
        "softmax", "softmax.sum_over_last_axis",
    ),
    Variant(
        "softmax_max_over_last_axis",  # the shift from the usual last axis, the sum along axis
        "def softmax(scores, axis=-1):\n    e = np.exp(scores - scores.max(axis=-1, keepdims=True))\n"
        "    return e / e.sum(axis=axis, keepdims=True)",
        "softmax", "softmax.max_over_last_axis",
    ),
    # -- weighted_sum
    Variant("weighted_sum_renormalized", "def weighted_sum(weights, v):\n    return (weights / weights.sum(axis=-1, keepdims=True)) @ v", "weighted_sum", "weighted_sum.renormalized"),
    Variant(
        "weighted_sum_transposed",
        "def weighted_sum(weights, v):\n    return np.swapaxes(weights, -1, -2) @ v",
        "weighted_sum", "weighted_sum.transposed_weights",
    ),
    Variant(
        "weighted_sum_summed_over_queries",  # broadcast product summed over the query axis: right shape only when Tq == Tk
        "def weighted_sum(weights, v):\n    return (weights[..., :, :, None] * v[..., None, :, :]).sum(axis=-3)",
        "weighted_sum", "weighted_sum.summed_over_queries",
    ),
    Variant(
        "weighted_sum_broadcast_2d",  # written for (Tq, Tk) weights and (Tk, Dv) values only
        "def weighted_sum(weights, v):\n    return (weights[:, :, None] * v[None, :, :]).sum(axis=1)",
        "weighted_sum", "weighted_sum.broadcast_for_2d",
    ),
    Variant(
        "weighted_sum_dot",  # np.dot pairs every batch with every other: (B, H, Tq, B, H, Dv)
        "def weighted_sum(weights, v):\n    return np.dot(weights, v)",
        "weighted_sum", "axis_extra",
    ),
    # -- merge_heads
    Variant(
        "merge_heads_no_transpose",
        "def merge_heads(x):\n    B, H, T, Dh = x.shape\n    return x.reshape(B, T, H * Dh)",
        "merge_heads", "merge_heads.no_transpose",
    ),
    Variant(
        "merge_heads_interleaved",
        "def merge_heads(x):\n    B, H, T, Dh = x.shape\n    return x.transpose(0, 2, 3, 1).reshape(B, T, H * Dh)",
        "merge_heads", "merge_heads.interleaved",
    ),
    Variant(
        "merge_heads_full_transpose",  # x.T reverses all four axes; the reshape runs anyway
        "def merge_heads(x):\n    B, H, T, Dh = x.shape\n    return x.T.reshape(B, T, H * Dh)",
        "merge_heads", "merge_heads.full_transpose",
    ),
    Variant(
        "merge_heads_flatten_from_1",
        "def merge_heads(x):\n    return np.swapaxes(x, 1, 2).reshape(x.shape[0], -1)",
        "merge_heads", "merge_heads.flattened_tokens",
    ),
    Variant(
        "merge_heads_unpacked_as_split",  # unpacks (B, H, T, Dh) as if it were split_heads' input order (B, T, H, Dh)
        "def merge_heads(x):\n    B, T, H, Dh = x.shape\n    return np.swapaxes(x, 1, 2).reshape(B, T, H * Dh)",
        "merge_heads", "wrong_axis_size",
    ),
    # -- multi_head_attention
    Variant(
        "mha_scaled_by_embed_dim",
        mha_with(REFERENCE_MIDDLE.replace("attention_scores(q, k), Dh)", "attention_scores(q, k), query.shape[-1])")),
        MHA, "multi_head_attention.scaled_by_embed_dim",
    ),
    Variant(
        "mha_unscaled",
        mha_with(REFERENCE_MIDDLE.replace("scale_scores(attention_scores(q, k), Dh)", "attention_scores(q, k)")),
        MHA, "multi_head_attention.unscaled",
    ),
    Variant(
        "mha_softmax_query_axis",
        mha_with(REFERENCE_MIDDLE.replace("mask))", "mask), axis=-2)")),
        MHA, "multi_head_attention.softmax_query_axis",
    ),
    Variant(
        "mha_mask_inverted",
        mha_with(REFERENCE_MIDDLE.replace(", mask))", ", None if mask is None else ~mask))")),
        MHA, "multi_head_attention.mask_inverted",
    ),
    Variant(
        "mha_key_as_value",
        mha_with("    v = split_heads(project(key, w_v, b_v), H)\n" + REFERENCE_MIDDLE),
        MHA, "multi_head_attention.key_as_value",
    ),
    Variant(
        "mha_no_output_projection",
        mha_with(REFERENCE_MIDDLE.replace("return project(y, w_o, b_o)", "return y")),
        MHA, "multi_head_attention.no_output_projection",
    ),
    Variant(
        "mha_mask_ignored",
        mha_with(REFERENCE_MIDDLE.replace(", mask))", ", None))")),
        MHA, "multi_head_attention.mask_ignored",
    ),
    Variant(
        "mha_num_heads_fixed",  # head_dim from a hard-coded head count
        mha_with(REFERENCE_MIDDLE).replace("H = num_heads", "H = 3"),
        MHA,
    ),
    Variant(
        "mha_scaled_by_num_heads",  # num_heads passed where scale_scores wants head_dim
        mha_with(REFERENCE_MIDDLE.replace("attention_scores(q, k), Dh)", "attention_scores(q, k), num_heads)")),
        MHA, "multi_head_attention.scaled_by_num_heads",
    ),
    Variant(
        "mha_scaled_by_key_count",  # k.shape[-2] is the number of keys, not their width
        mha_with(REFERENCE_MIDDLE.replace("attention_scores(q, k), Dh)", "attention_scores(q, k), k.shape[-2])")),
        MHA, "multi_head_attention.scaled_by_key_count",
    ),
    Variant(
        "mha_scaled_after_softmax",
        mha_with("""\
    att = scale_scores(softmax(apply_mask(attention_scores(q, k), mask)), Dh)
    y = merge_heads(weighted_sum(att, v))
    return project(y, w_o, b_o)"""),
        MHA, "multi_head_attention.scaled_after_softmax",
    ),
    Variant(
        "mha_mask_after_softmax",  # the blocked weights zeroed after the softmax: the rest no longer sum to 1
        mha_with("""\
    att = softmax(scale_scores(attention_scores(q, k), Dh))
    if mask is not None:
        att = att * mask
    y = merge_heads(weighted_sum(att, v))
    return project(y, w_o, b_o)"""),
        MHA, "multi_head_attention.mask_after_softmax",
    ),
    Variant(
        "mha_keys_as_values",
        mha_with(REFERENCE_MIDDLE.replace("weighted_sum(att, v)", "weighted_sum(att, k)")),
        MHA, "multi_head_attention.keys_as_values",
    ),
    Variant(
        "mha_w_q_for_keys",  # a copy-paste slip
        mha_with("    k = split_heads(project(key, w_q, b_q), H)\n" + REFERENCE_MIDDLE),
        MHA, "multi_head_attention.w_q_for_keys",
    ),
    Variant(
        "mha_heads_never_split",  # a head axis of 1 added for the shapes, the width never split
        mha_with("    q, k, v = (project(x, w, b)[:, None] for x, w, b in ((query, w_q, b_q), (key, w_k, b_k), (value, w_v, b_v)))\n"
                 + REFERENCE_MIDDLE),
        MHA, "multi_head_attention.one_head",
    ),
    Variant(
        "mha_time_first",  # nn.MultiheadAttention's default layout assumed: (T, B, D) in, (T, B, D) out
        """
def multi_head_attention(query, key, value, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, num_heads, mask=None):
    query, key, value = (np.swapaxes(x, 0, 1) for x in (query, key, value))  # (T, B, D) -> (B, T, D)
    H = num_heads
    Dh = query.shape[-1] // H
    q = split_heads(project(query, w_q, b_q), H)
    k = split_heads(project(key, w_k, b_k), H)
    v = split_heads(project(value, w_v, b_v), H)
    att = softmax(apply_mask(scale_scores(attention_scores(q, k), Dh), mask))
    y = project(merge_heads(weighted_sum(att, v)), w_o, b_o)
    return np.swapaxes(y, 0, 1)  # back to (T, B, D)
""",
        MHA, "multi_head_attention.time_first",
    ),
    Variant(
        "mha_own_projections_untransposed",  # x @ W, as if W were (d_in, d_out)
        """
def multi_head_attention(query, key, value, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, num_heads, mask=None):
    H = num_heads
    Dh = query.shape[-1] // H
    bias = lambda b: 0 if b is None else b
    q = split_heads(query @ w_q + bias(b_q), H)
    k = split_heads(key @ w_k + bias(b_k), H)
    v = split_heads(value @ w_v + bias(b_v), H)
    att = softmax(apply_mask(scale_scores(attention_scores(q, k), Dh), mask))
    return merge_heads(weighted_sum(att, v)) @ w_o + bias(b_o)
""",
        MHA, "multi_head_attention.weight_not_transposed",
    ),
    Variant(
        "mha_np_sqrt_scale",  # scaled inline by np.sqrt(Dh), a NumPy float64 scalar: float32 input comes back float64
        mha_with(REFERENCE_MIDDLE.replace("scale_scores(attention_scores(q, k), Dh)", "attention_scores(q, k) / np.sqrt(Dh)")),
        MHA, "dtype_promoted",
    ),
    Variant(
        "mha_output_bias_dropped",
        mha_with(REFERENCE_MIDDLE.replace("project(y, w_o, b_o)", "project(y, w_o)")),
        MHA, "multi_head_attention.bias_dropped",
    ),
    Variant(  # a copy-paste inside the composite, found by the search once the weights are named arguments
        "mha_query_projected_with_key_bias",
        mha_with(REFERENCE_MIDDLE).replace("project(query, w_q, b_q)", "project(query, w_q, b_k)"),
        MHA, "argument_duplicated",
    ),
]

# Right values, but a rule broken. A file-level rule (an import; step None) costs only the rules checks;
# a torch call while a step runs costs that whole step.
RULES_ONLY = [
    Variant("imports_torch", "import torch  # never used: importing it is enough"),
    Variant("imports_torch_in_a_function", "def _unused():\n    from torch import nn\n    return nn"),
    Variant(
        "softmax_through_torch",  # no import statement, so only the run-time record catches it
        "def softmax(scores, axis=-1):\n    torch = __import__('torch')\n"
        "    return torch.softmax(torch.from_numpy(scores), dim=axis).nan_to_num(0.0).numpy()",
        "softmax", "forbidden_call",
    ),
    Variant(
        "project_in_torch",  # the import is project's: it costs project (a breach), not every step's rules
        "import torch\n\ndef project(x, weight, bias=None):\n"
        "    y = torch.from_numpy(x) @ torch.from_numpy(weight).T\n"
        "    return (y if bias is None else y + torch.from_numpy(bias)).numpy()",
        "project", "forbidden_call",
    ),
    Variant(
        "softmax_scipy",  # scipy is not installed here: the import is what the rule sees (a file-level rule)
        "try:\n    from scipy.special import softmax as _scipy_softmax\nexcept ImportError:\n    _scipy_softmax = None",
    ),
]

CORRECT = [
    Variant(
        "einsum",
        """
        def project(x, weight, bias=None):
            y = np.einsum("...i,oi->...o", x, weight)
            return y if bias is None else y + bias

        def attention_scores(q, k):
            return np.einsum("...qd,...kd->...qk", q, k)

        def weighted_sum(weights, v):
            return np.einsum("...qk,...kd->...qd", weights, v)
        """,
    ),
    Variant(
        "matmul_and_transpose",
        """
        def project(x, weight, bias=None):
            return np.matmul(x, np.transpose(weight)) + (0 if bias is None else bias)

        def attention_scores(q, k):
            return np.matmul(q, k.transpose(*range(k.ndim - 2), k.ndim - 1, k.ndim - 2))

        def weighted_sum(weights, v):
            return np.matmul(weights, v)

        def split_heads(x, num_heads):
            B, T, D = x.shape
            return np.ascontiguousarray(x.reshape(B, T, num_heads, -1).transpose(0, 2, 1, 3))

        def merge_heads(x):
            B, H, T, Dh = x.shape
            return np.moveaxis(x, 1, 2).reshape(B, T, -1)
        """,
    ),
    Variant(
        "broadcast_sum_weighted_sum",
        """
        def weighted_sum(weights, v):
            return (weights[..., :, :, None] * v[..., None, :, :]).sum(axis=-2)  # over the key axis
        """,
    ),
    Variant(
        "loop_over_heads",
        mha_with("""\
    outs = []
    for h in range(H):  # one head at a time, as (B, T, Dh) slices
        s = q[:, h] @ np.swapaxes(k[:, h], -1, -2) * Dh ** -0.5
        if mask is not None:
            m = np.broadcast_to(mask, (q.shape[0], H, q.shape[2], k.shape[2]))[:, h]
            s = np.where(m, s, -np.inf)
        outs.append(softmax(s) @ v[:, h])
    return project(np.concatenate(outs, axis=-1), w_o, b_o)"""),
    ),
    Variant(
        "logsumexp_softmax",
        """
        def softmax(scores, axis=-1):
            m = np.max(scores, axis=axis, keepdims=True)
            m = np.where(np.isfinite(m), m, 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                lse = m + np.log(np.sum(np.exp(scores - m), axis=axis, keepdims=True))
                out = np.exp(scores - lse)
            # an all -inf slice has lse = -inf and gives NaN: those slices are all zeros
            return np.where(np.isneginf(lse), 0, out)
        """,
    ),
    Variant(
        "finfo_min_mask",
        """
        def apply_mask(scores, mask):
            if mask is None:
                return scores
            return np.where(mask, scores, np.finfo(scores.dtype).min)
        """,
    ),
    Variant(
        "in_place_mask_and_scale",
        """
        def apply_mask(scores, mask):
            out = scores.copy()
            if mask is not None:
                out[~np.broadcast_to(mask, scores.shape)] = -np.inf
            return out

        def scale_scores(scores, head_dim):
            return scores * np.asarray(head_dim ** -0.5, dtype=scores.dtype)
        """,
    ),
    Variant(
        "split_stack_and_concatenate",  # heads as a list of slices
        """
        def split_heads(x, num_heads):
            return np.stack(np.split(x, num_heads, axis=-1), axis=1)  # H x (B, T, Dh) -> (B, H, T, Dh)

        def merge_heads(x):
            return np.concatenate([x[:, h] for h in range(x.shape[1])], axis=-1)  # H x (B, T, Dh) -> (B, T, D)
        """,
    ),
    Variant(
        "guarded_divide_softmax",
        """
        def softmax(scores, axis=-1):
            finite_max = np.max(np.where(np.isneginf(scores), np.finfo(scores.dtype).min, scores), axis=axis, keepdims=True)
            e = np.exp(scores - finite_max)
            s = np.sum(e, axis=axis, keepdims=True)
            return np.divide(e, s, out=np.zeros_like(e), where=s > 0)
        """,
    ),
    Variant(
        "one_einsum_pipeline",  # the function written without the step functions, in float32-safe arithmetic
        """
        def multi_head_attention(query, key, value, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, num_heads, mask=None):
            B, Tq, D = query.shape
            H, Dh = num_heads, D // num_heads

            def heads(x, w, b):
                y = np.einsum("btd,ed->bte", x, w) + (0 if b is None else b)
                return y.reshape(B, x.shape[1], H, Dh)  # (B, T, H, Dh)

            q, k, v = heads(query, w_q, b_q), heads(key, w_k, b_k), heads(value, w_v, b_v)
            s = np.einsum("bqhd,bkhd->bhqk", q, k) / Dh ** 0.5
            if mask is not None:
                s = np.where(mask, s, -np.inf)
            m = s.max(axis=-1, keepdims=True)
            e = np.exp(s - np.where(np.isneginf(m), 0, m))
            w = e / np.maximum(e.sum(axis=-1, keepdims=True), np.finfo(e.dtype).tiny)
            y = np.einsum("bhqk,bkhd->bqhd", w, v).reshape(B, Tq, D)
            return y @ w_o.T + (0 if b_o is None else b_o)
        """,
    ),
]
