"""mha_numpy candidates made from solutions/mha_numpy.py by redefining one thing (the last definition wins).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find (None where the mistake has no name and a plain failure is right).
RULES_ONLY: correct values, but a rule broken: each must lose its rule points and nothing else.
CORRECT: unusual but right ways to write the steps; each must score 100.
"""

from tests.variants_mha import Variant

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
        "project", "kept_float64",
    ),
    Variant("project_list", "def project(x, weight, bias=None):\n    return (x @ weight.T + bias).tolist()", "project"),
    # -- split_heads
    Variant(
        "split_heads_reshape_no_transpose",
        "def split_heads(x, num_heads):\n    B, T, D = x.shape\n    return x.reshape(B, num_heads, T, D // num_heads)",
        "split_heads", "split_heads.reshape_no_transpose",
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
    # -- attention_scores
    Variant(
        "attention_scores_transposed",
        "def attention_scores(q, k):\n    return k @ np.swapaxes(q, -1, -2)",
        "attention_scores", "attention_scores.transposed",
    ),
    Variant(
        "attention_scores_full_transpose",  # k.T on a 4-D array reverses all four axes
        "def attention_scores(q, k):\n    return q @ k.T",
        "attention_scores", "attention_scores.full_transpose",
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
        "scale_scores", "kept_float64",
    ),
    # -- apply_mask
    Variant(
        "apply_mask_none_unhandled",  # np.where(None, ...) is np.where(False, ...): everything blocked
        "def apply_mask(scores, mask):\n    return np.where(mask, scores, -np.inf)",
        "apply_mask",
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
        "apply_mask", "kept_float64",
    ),
    # -- softmax
    Variant(
        "softmax_ignored_axis",
        "def softmax(scores, axis=-1):\n    m = np.max(scores, axis=-1, keepdims=True)\n"
        "    e = np.exp(scores - np.where(np.isneginf(m), 0, m))\n"
        "    return e / np.maximum(e.sum(axis=-1, keepdims=True), 1e-30)",
        "softmax", "softmax.ignored_axis",
    ),
    Variant(
        "softmax_whole_tensor",
        "def softmax(scores, axis=-1):\n    e = np.exp(scores)\n    return e / e.sum()",
        "softmax", "softmax.whole_tensor",
    ),
    Variant(
        "softmax_no_keepdims",
        "def softmax(scores, axis=-1):\n    e = np.exp(scores)\n    return e / e.sum(axis=axis)",
        "softmax", "softmax.no_keepdims",
    ),
    Variant(
        "softmax_max_no_keepdims",  # the reference, but the max loses its axis
        "def softmax(scores, axis=-1):\n    m = np.max(scores, axis=axis)\n"
        "    e = np.exp(scores - np.where(np.isneginf(m), 0, m))\n"
        "    s = e.sum(axis=axis, keepdims=True)\n    return e / np.maximum(s, np.finfo(s.dtype).tiny)",
        "softmax", "softmax.max_no_keepdims",
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
    # -- weighted_sum
    Variant(
        "weighted_sum_transposed",
        "def weighted_sum(weights, v):\n    return np.swapaxes(weights, -1, -2) @ v",
        "weighted_sum", "weighted_sum.transposed_weights",
    ),
    Variant(
        "weighted_sum_wrong_axis",  # broadcast product summed over the query axis: right shape only when Tq == Tk
        "def weighted_sum(weights, v):\n    return (weights[..., :, :, None] * v[..., None, :, :]).sum(axis=-3)",
        "weighted_sum", "weighted_sum.wrong_axis",
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
        "merge_heads",
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
        MHA,
    ),
    Variant(
        "mha_num_heads_fixed",  # head_dim from a hard-coded head count
        mha_with(REFERENCE_MIDDLE).replace("H = num_heads", "H = 3"),
        MHA,
    ),
]

# Right values, but a rule broken. Each loses the rule checks named, and nothing else.
RULES_ONLY = [
    Variant("imports_torch", "import torch  # never used: importing it is enough"),
    Variant("imports_torch_in_a_function", "def _unused():\n    from torch import nn\n    return nn"),
    Variant(
        "softmax_through_torch",  # no import statement, so only the run-time record catches it
        "def softmax(scores, axis=-1):\n    torch = __import__('torch')\n"
        "    return torch.softmax(torch.from_numpy(scores), dim=axis).nan_to_num(0.0).numpy()",
        "softmax",
    ),
    Variant(
        "softmax_scipy",  # scipy is not installed here: the import is what the rule sees
        "try:\n    from scipy.special import softmax as _scipy_softmax\nexcept ImportError:\n    _scipy_softmax = None",
        "softmax",
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
]
